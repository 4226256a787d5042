"""torch.nn modules over the fastact functions, drop-in for torch.nn.Softmax, LogSoftmax, GELU and
Sigmoid: the same constructor arguments, defaults, repr, state dict and pickling as their torch twins;
BiasGELU owns its bias (a Linear without bias followed by BiasGELU is the fused
``gelu(x @ W.T + b)``).

Every module is scriptable: under ``torch.jit.script`` the forward calls the registered op
(``torch.ops.fastact.*``), which TorchScript compiles; in eager it calls the fastact function, whose C
fast path TorchScript cannot see. ``torch.jit.is_scripting()`` (here ``_scripting()``) is a constant
to the TorchScript compiler, which compiles only the branch it takes, so the eager branch may call
anything. The check costs eager ~30 ns a call (one Python call), ~1% of a module call on a small
tensor."""

import warnings

import torch
from torch import Tensor
from torch.compiler import is_dynamo_compiling as _dynamo_tracing
from torch.jit import is_scripting as _scripting  # bound here: 20 ns a call less than torch.jit.is_scripting

from . import bias_gelu, gelu, log_softmax, sigmoid, softmax

__all__ = ["Softmax", "LogSoftmax", "GELU", "BiasGELU", "Sigmoid"]


def _implicit_dim(name: str, ndim: int, stacklevel: int) -> int:
    """The dim torch.nn.functional.softmax/log_softmax pick when called with ``dim=None``, with the
    deprecation warning torch gives (the same text, a UserWarning), attributed ``stacklevel`` frames
    up from here as torch.nn.functional._get_softmax_dim does (so a function calling it directly
    passes its own ``_stacklevel``, 3 by default, as F.softmax does).

    Not while dynamo traces: it cannot trace warnings.warn (a graph break, an error under
    fullgraph=True), so a torch.compile'd call gives no warning where torch's, whose F.softmax runs
    at run time, gives one per call."""
    if not _dynamo_tracing():
        warnings.warn(
            "Implicit dimension choice for " + name + " has been deprecated. "
            "Change the call to include dim=X as an argument.",
            stacklevel=stacklevel,
        )
    if ndim == 0 or ndim == 1 or ndim == 3:
        return 0
    return 1


class Softmax(torch.nn.Module):
    """Drop-in for ``torch.nn.Softmax``: softmax over ``dim``; ``dim=None`` picks torch's implicit dim
    (0 for 0-, 1- and 3-d inputs, else 1) with torch's deprecation warning."""

    __constants__ = ["dim"]
    dim: int | None

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def __setstate__(self, state):
        super().__setstate__(state)
        if not hasattr(self, "dim"):  # pickled by a version without the attribute, as torch does
            self.dim = None

    def forward(self, input: Tensor) -> Tensor:
        dim = self.dim
        if dim is None:
            # stacklevel 4 counts 1 _implicit_dim, 2 forward, 3 Module._call_impl, 4
            # Module._wrapped_call_impl: where torch.nn.Softmax's warning points (F.softmax called with
            # _stacklevel=5, one frame deeper), so both have the same file and line and a warnings
            # filter treats them alike. (A literal: TorchScript cannot read a global int.)
            dim = _implicit_dim("softmax", input.dim(), 4)
        if _scripting():
            return torch.ops.fastact.softmax(input, dim, None)
        return softmax(input, dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(torch.nn.Module):
    """Drop-in for ``torch.nn.LogSoftmax``; ``dim=None`` as in :class:`Softmax`."""

    __constants__ = ["dim"]
    dim: int | None

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def __setstate__(self, state):
        super().__setstate__(state)
        if not hasattr(self, "dim"):
            self.dim = None

    def forward(self, input: Tensor) -> Tensor:
        dim = self.dim
        if dim is None:
            dim = _implicit_dim("log_softmax", input.dim(), 4)  # 4: as in Softmax.forward
        if _scripting():
            return torch.ops.fastact.log_softmax(input, dim, None)
        return log_softmax(input, dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class GELU(torch.nn.Module):
    """Drop-in for ``torch.nn.GELU``: ``approximate`` is ``"none"`` (erf) or ``"tanh"``."""

    __constants__ = ["approximate"]
    approximate: str

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, input: Tensor) -> Tensor:
        if _scripting():
            return torch.ops.fastact.gelu(input, self.approximate)
        return gelu(input, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={repr(self.approximate)}"


class BiasGELU(torch.nn.Module):
    """``gelu(input + bias)`` with a learnable ``bias`` of shape ``[features]``, initialised to zero
    (``reset_parameters``), so that ``Linear(in, features, bias=False)`` followed by ``BiasGELU``
    computes ``gelu(linear(x))`` with a bias, in one pass after the matmul. No torch twin; built like
    ``torch.nn.Linear``: ``device``/``dtype`` factory arguments, ``reset_parameters()`` (a meta-device
    module becomes usable through ``to_empty(device=...)`` then ``reset_parameters()``)."""

    __constants__ = ["features", "approximate"]
    features: int
    approximate: str

    def __init__(self, features: int, approximate: str = "tanh", device=None, dtype=None) -> None:
        super().__init__()
        self.features = features
        self.approximate = approximate
        self.bias = torch.nn.Parameter(torch.empty(features, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        torch.nn.init.zeros_(self.bias)

    def __setstate__(self, state):
        super().__setstate__(state)
        if not hasattr(self, "features"):  # pickled by a version that kept no features attribute
            self.features = self.bias.shape[0]

    def forward(self, input: Tensor) -> Tensor:
        if _scripting():
            return torch.ops.fastact.bias_gelu(input, self.bias, self.approximate)
        return bias_gelu(input, self.bias, self.approximate)

    def extra_repr(self) -> str:
        return f"features={self.features}, approximate={repr(self.approximate)}"


class Sigmoid(torch.nn.Module):
    """Drop-in for ``torch.nn.Sigmoid``."""

    def forward(self, input: Tensor) -> Tensor:
        if _scripting():
            return torch.ops.fastact.sigmoid(input)
        return sigmoid(input)


# TorchScript code that calls the fastact functions (``fastact.softmax(x, -1)`` in a scripted forward)
# compiles to the registered ops: TorchScript looks a called Python function up in its table of
# builtins before it tries to compile its source (which it cannot: the C fast path). The ops' schemas
# decide the arguments there: positional or by the schema's names (``self`` for the input), ``dim``
# required.
for _fn in (softmax, log_softmax, gelu, bias_gelu, sigmoid):
    torch.jit._builtins._register_builtin(_fn, f"fastact::{_fn.__name__}")
del _fn
