"""torch.nn modules over the fastact functions, drop-in for torch.nn.Softmax, LogSoftmax, GELU and
Sigmoid; BiasGELU owns its bias (a Linear without bias followed by BiasGELU is the fused
``gelu(x @ W.T + b)``)."""

import torch

from . import bias_gelu, gelu, log_softmax, sigmoid, softmax


class Softmax(torch.nn.Module):
    def __init__(self, dim=-1):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        return softmax(input, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class LogSoftmax(torch.nn.Module):
    def __init__(self, dim=-1):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        return log_softmax(input, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class GELU(torch.nn.Module):
    def __init__(self, approximate="none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, input):
        return gelu(input, self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class BiasGELU(torch.nn.Module):
    """``gelu(input + bias)`` with a learnable ``bias`` of shape ``[features]`` (initialised to zero)."""

    def __init__(self, features, approximate="tanh", device=None, dtype=None):
        super().__init__()
        self.approximate = approximate
        self.bias = torch.nn.Parameter(torch.zeros(features, device=device, dtype=dtype))

    def forward(self, input):
        return bias_gelu(input, self.bias, self.approximate)

    def extra_repr(self):
        return f"features={self.bias.shape[0]}, approximate={self.approximate!r}"


class Sigmoid(torch.nn.Module):
    def forward(self, input):
        return sigmoid(input)
