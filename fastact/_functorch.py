"""fastact's ops under torch.func transforms (grad, vjp, jacrev, jacfwd, hessian, jvp, vmap) and
forward-mode AD (torch.autograd.forward_ad).

The ops' autograd is C++ (csrc/autograd.cpp: torch::autograd::Function, for torch's own per-call
overhead), and torch refuses C++ autograd Functions under functorch transforms ("cannot use C++
torch::autograd::Function with functorch transforms"), and they have no jvp for forward-mode AD. So
while a transform is active, or a forward-AD dual level is open, the public functions
(fastact/__init__.py) call the Python autograd.Functions below instead, which torch.func and forward AD
support at every order:

- forward: fastact's kernel, called below autograd (the Function records the graph);
- backward and forward-mode derivative (jvp): torch's own derivative ops (each op table row's
  torch_backward: aten._softmax_backward_data, gelu_backward, sigmoid_backward, ...), which functorch differentiates and batches again, so hessians and
  per-sample gradients (vmap over grad) work;
- vmap: the batch dim moved to the front and the op called once on the whole batch (for a bias op with
  a batched bias, its pointwise op of the sum).

One Function per kind of the op table (fastact/_optable.py): softmax, pointwise, bias.

Outside those, nothing here runs. Results: forwards as fastact's kernels give them, derivatives as
torch's ops give them, in each tensor's dtype as torch's autograd does (16-bit math in float).
"""

import torch
import torch._C._functorch as _functorch_C
import torch.autograd.forward_ad as _fwad

from ._ops import _check_floating
from ._ops import ops as _ops
from ._optable import BY_NAME

aten = torch.ops.aten


def active():
    """True while a torch.func transform (grad, vmap, jvp, ...) is active in this thread, or a
    torch.autograd.forward_ad dual level is open (tangents need the jvps below). functionalize alone
    does not count: torch has no functionalize rule for Python autograd Functions, and the ops run
    under it as they are."""
    if _fwad._current_level >= 0:
        return True
    if not torch._C._are_functorch_transforms_active():
        return False
    stack = _functorch_C.get_interpreter_stack() or ()
    return any(i.key() != _functorch_C.TransformType.Functionalize for i in stack)


def _below_autograd(op, *args):
    with torch._C._AutoDispatchBelowAutograd():
        return op(*args)


def _wrap_dim(dim, rank, op):
    """dim in [0, max(rank, 1)) as torch's softmax wraps it (a 0-d tensor takes 0 and -1); out of range:
    the IndexError the op raises (csrc/common.h wrap_dim), for a sample's rank under vmap too."""
    r = max(rank, 1)
    if not -r <= dim < r:
        raise IndexError(f"{op}: dim {dim} out of range for a tensor of {rank} dims "
                         f"(expected to be in range of [{-r}, {r - 1}])")
    return dim + r if dim < 0 else dim


# softmax / log_softmax ------------------------------------------------------------------------------
# y = softmax(x): dx = y (g - sum(g y)) = aten._softmax_backward_data(g, y); the Jacobian is symmetric,
# so the tangent of y is the same map of the input's tangent. log_softmax: dx = g - exp(y) sum(g),
# aten._log_softmax_backward_data; the tangent of y is t - sum(exp(y) t).


def _name(log):
    return "log_softmax" if log else "softmax"


def _softmax_grad(g, y, dim, log):
    f = aten._log_softmax_backward_data if log else aten._softmax_backward_data
    return f(g, y, dim, y.dtype)


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(x, dim, dtype, log):
        return _below_autograd(_ops.log_softmax if log else _ops.softmax, x, dim, dtype)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, dim, _, log = inputs
        ctx.save_for_backward(output)
        ctx.save_for_forward(output)
        ctx.dim, ctx.log, ctx.input_dtype = _wrap_dim(dim, x.dim(), _name(log)), log, x.dtype

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return _softmax_grad(g, y, ctx.dim, ctx.log).to(ctx.input_dtype), None, None, None

    @staticmethod
    def jvp(ctx, t, *_):
        (y,) = ctx.saved_tensors
        t = t.to(y.dtype)
        if ctx.log:
            return t - (torch.exp(y) * t).sum(ctx.dim, keepdim=True)
        return _softmax_grad(t, y, ctx.dim, False)

    @staticmethod
    def vmap(info, in_dims, x, dim, dtype, log):
        x = x.movedim(in_dims[0], 0)
        dim = _wrap_dim(dim, x.dim() - 1, _name(log))  # the sample's dim
        if x.dim() == 1:  # 0-d samples: each a softmax over one element
            return _Softmax.apply(x.unsqueeze(1), 1, dtype, log).squeeze(1), 0
        return _Softmax.apply(x, dim + 1, dtype, log), 0


def softmax(x, dim, dtype, log):
    return _Softmax.apply(x, dim, dtype, log)


# pointwise ops ---------------------------------------------------------------------------------------
# y = f(x; params): dx = torch_backward(g, saved, params) with saved the input or the output (the row's saves);
# the Jacobian is diagonal, so the tangent of y is the same map of the input's tangent; vmap is the op on
# the whole batch.


def _pointwise_grad(row, g, saved, params):
    backward = row.differentiable_backward or row.torch_backward
    return backward(g, saved, **dict(zip(row.param_names, params)))


class _Pointwise(torch.autograd.Function):
    @staticmethod
    def forward(x, row, *params):
        return _below_autograd(getattr(_ops, row.name), x, *params)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, ctx.row, *ctx.params = inputs
        saved = output if ctx.row.saves == "output" else x
        ctx.save_for_backward(saved)
        ctx.save_for_forward(saved)

    @staticmethod
    def backward(ctx, g):
        (saved,) = ctx.saved_tensors
        return (_pointwise_grad(ctx.row, g, saved, ctx.params), None) + (None,) * len(ctx.params)

    @staticmethod
    def jvp(ctx, t, *_):
        (saved,) = ctx.saved_tensors
        return _pointwise_grad(ctx.row, t, saved, ctx.params)

    @staticmethod
    def vmap(info, in_dims, x, row, *params):
        return _Pointwise.apply(x, row, *params), in_dims[0]


def call(row, tensors, params):
    """The op of table row `row` on its tensor and string arguments, under torch.func and forward AD."""
    if row.kind == "bias":
        return _Bias.apply(*tensors, row, *params)
    return _Pointwise.apply(*tensors, row, *params)


# bias ops: f(x + bias) -------------------------------------------------------------------------------


class _Bias(torch.autograd.Function):
    @staticmethod
    def forward(x, bias, row, *params):
        return _below_autograd(getattr(_ops, row.name), x, bias, *params)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, bias, ctx.row, *ctx.params = inputs
        ctx.pointwise = BY_NAME[ctx.row.pointwise]
        ctx.save_for_backward(x, bias)
        ctx.save_for_forward(x, bias)

    @staticmethod
    def backward(ctx, g):
        x, bias = ctx.saved_tensors
        dx = _pointwise_grad(ctx.pointwise, g, x + bias, ctx.params)
        rows = tuple(range(dx.dim() - 1))
        return (dx, (dx.sum(rows) if rows else dx).to(bias.dtype), None) + (None,) * len(ctx.params)

    @staticmethod
    def jvp(ctx, tx, tb, *_):
        x, bias = ctx.saved_tensors
        t = tx if tb is None else (tb if tx is None else tx + tb)
        return _pointwise_grad(ctx.pointwise, t.expand_as(x).to(x.dtype), x + bias, ctx.params)

    @staticmethod
    def vmap(info, in_dims, x, bias, row, *params):
        x_bdim, b_bdim = in_dims[:2]
        if b_bdim is None:  # the bias is shared: one call over the whole batch (its last dim is still x's)
            return _Bias.apply(x.movedim(x_bdim, 0) if x_bdim is not None else x, bias, row, *params), (
                0 if x_bdim is not None else None)
        # a bias per batch element: f(x + bias), the batch dim in front of both, after the checks the
        # kernel makes on each sample (csrc/common.h check_bias_gelu): with torch ops alone x + bias
        # would broadcast and promote where the op raises
        bias = bias.movedim(b_bdim, 0)
        if x_bdim is None:
            x = x.expand(bias.shape[0], *x.shape)
        else:
            x = x.movedim(x_bdim, 0)
        _check_bias(row.name, x, bias)
        bias = bias.reshape(bias.shape[0], *([1] * (x.dim() - 2)), bias.shape[-1])
        return _Pointwise.apply(x + bias, BY_NAME[row.pointwise], *params), 0


_DTYPE_NAMES = {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16"}


def _check_bias(op, x, bias):
    """csrc/common.h check_bias_gelu on one sample of batched x [B, ...] and bias [B, ...], with its
    messages (RuntimeError)."""
    _check_floating(op, x, "input")
    _check_floating(op, bias, "bias")
    if x.dim() < 2:
        raise RuntimeError(f"{op}: expected input of at least 1 dim (bias is added over the last), got a 0-d tensor")
    if bias.dim() != 2 or bias.shape[1] != x.shape[-1]:
        raise RuntimeError(f"{op}: expected bias of shape [{x.shape[-1]}], got {list(bias.shape[1:])}")
    if x.dtype != bias.dtype:
        raise RuntimeError(f"{op}: expected input and bias of the same dtype, got "
                           f"{_DTYPE_NAMES[x.dtype]} and {_DTYPE_NAMES[bias.dtype]}")
    if x.device != bias.device:
        raise RuntimeError(f"{op}: expected input and bias on the same device, got {x.device} and {bias.device}")


