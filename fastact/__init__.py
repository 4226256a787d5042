"""fastact: fast softmax, log_softmax, GELU, fused bias+GELU and sigmoid for PyTorch.

Drop-in for the torch functions of the same names (same arguments, results within floating-point
tolerance, same errors), forward and backward, on CUDA GPUs and CPUs, in float32, float64, float16
and bfloat16, under autograd, torch.compile and CUDA graphs.
"""

import sys

import torch
from torch.compiler import is_dynamo_compiling as _dynamo_tracing

from . import _functorch
from ._ops import _C
from ._ops import ops as _ops

__all__ = ["softmax", "log_softmax", "gelu", "bias_gelu", "sigmoid", "explain", "nn"]
from ._version import __version__

# Each function first tries _C's eager entry point (csrc/eager.cpp: one unboxed dispatcher call for a
# plain tensor), which returns NotImplemented for anything else (tensor subclasses, torch function
# modes, unusual arguments); then the OpOverload, looked up once here, handles the call. While dynamo
# traces, _dynamo_tracing() is True (a constant to it; a 20 ns call in eager) and the OpOverload is
# what it sees: it cannot trace a C function. Under torch.func transforms (grad, vmap, jvp, ...) _C
# returns NotImplemented too, and the op runs through _functorch's Python autograd.Functions: torch
# refuses the C++ ones there.
_softmax = _ops.softmax.default
_log_softmax = _ops.log_softmax.default
_gelu = _ops.gelu.default
_bias_gelu = _ops.bias_gelu.default
_sigmoid = _ops.sigmoid.default


def _type_name(obj):
    """The name torch's argument errors give a Python object's type: `int`, `numpy.float32`, `Tensor`."""
    t = type(obj)
    if isinstance(obj, torch.Tensor):
        return "Tensor"
    return t.__qualname__ if t.__module__ in ("builtins", None) else f"{t.__module__}.{t.__qualname__}"


def _int_arg(fn, name, pos, value):
    """`value` as torch's argument parser takes an `int` argument, or its TypeError: a Python int (not bool), a
    numpy integer, a 0-d integer tensor or a SymInt; never a float, bool, string or a tensor of other shape or dtype
    (which the schema's own parsing would truncate or reject with a RuntimeError)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, torch.SymInt):
        return value
    if isinstance(value, torch.Tensor):
        if value.dim() == 0 and not value.dtype.is_floating_point and not value.dtype.is_complex and value.dtype != torch.bool:
            return int(value)
    elif _is_numpy_int(value):
        return int(value)
    raise TypeError(f"{fn}(): argument '{name}' (position {pos}) must be int, not {_type_name(value)}")


def _is_numpy_int(value):
    np = sys.modules.get("numpy")  # never imported for this: a numpy integer implies numpy is loaded
    return np is not None and isinstance(value, np.integer)


def _check_dtype_arg(fn, dtype):
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TypeError(f"{fn}(): argument 'dtype' must be torch.dtype, not {_type_name(dtype)}")


def _str_arg(fn, name, value):
    """`value` as torch's argument parser takes a `str` argument (bytes included), or its TypeError."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode()
    raise TypeError(f"{fn}(): argument '{name}' must be str, not {_type_name(value)}")


def softmax(input, dim=None, _stacklevel=3, dtype=None):
    """Softmax over `dim`; matches ``torch.nn.functional.softmax(input, dim, _stacklevel, dtype)`` (and so
    ``torch.softmax`` and ``Tensor.softmax``).

    ``dim=None`` takes torch's deprecated implicit dim (0 for 0-, 1- and 3-d inputs, else 1) with its warning.
    ``dtype`` casts before the op, as in torch; a float16/bfloat16 input with ``dtype=torch.float32`` is converted
    inside the kernel (no extra pass over memory)."""
    if not _dynamo_tracing():
        y = _C.softmax(input, dim, dtype)
        if y is not NotImplemented:
            return y
    return _softmax_slow(False, input, dim, _stacklevel + 1, dtype)


def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    """Log-softmax over `dim`; matches ``torch.nn.functional.log_softmax(input, dim, _stacklevel, dtype)`` (and
    ``torch.log_softmax``, ``Tensor.log_softmax``), the implicit ``dim=None`` included."""
    if not _dynamo_tracing():
        y = _C.log_softmax(input, dim, dtype)
        if y is not NotImplemented:
            return y
    return _softmax_slow(True, input, dim, _stacklevel + 1, dtype)


def _softmax_slow(log, input, dim, stacklevel, dtype):
    """The calls _C's entry point leaves to Python (any dim but a plain int, tensor subclasses, modes, transforms,
    dynamo tracing): torch's argument rules, then the functorch Function or the OpOverload. `stacklevel` counts
    from here, as the public function's `_stacklevel` counts from it."""
    name = "log_softmax" if log else "softmax"
    if dim is None:
        dim = _implicit_dim(name, input.dim(), stacklevel)
    else:
        dim = _int_arg(name, "dim", 2, dim)
    _check_dtype_arg(name, dtype)
    if not _dynamo_tracing() and _functorch.active():
        return _functorch.softmax(input, dim, dtype, log)
    return (_log_softmax if log else _softmax)(input, dim, dtype)


def gelu(input, approximate="none"):
    """GELU; matches ``torch.nn.functional.gelu(input, approximate=approximate)`` ("none" or "tanh")."""
    if not _dynamo_tracing():
        y = _C.gelu(input, approximate)
        if y is not NotImplemented:
            return y
    approximate = _str_arg("gelu", "approximate", approximate)
    if not _dynamo_tracing():
        if _functorch.active():
            return _functorch.gelu(input, approximate)
    return _gelu(input, approximate)


def bias_gelu(input, bias, approximate="tanh"):
    """``F.gelu(input + bias, approximate=approximate)`` in one pass; ``bias`` is 1-d over the last dim.

    The backward returns the gradients of ``input`` and ``bias``, also fused (no materialised
    ``input + bias``)."""
    if not _dynamo_tracing():
        y = _C.bias_gelu(input, bias, approximate)
        if y is not NotImplemented:
            return y
    approximate = _str_arg("bias_gelu", "approximate", approximate)
    if not _dynamo_tracing():
        if _functorch.active():
            return _functorch.bias_gelu(input, bias, approximate)
    return _bias_gelu(input, bias, approximate)


def sigmoid(input):
    """Sigmoid; matches ``torch.sigmoid`` (computed without overflow for large ``|input|``)."""
    if not _dynamo_tracing():
        y = _C.sigmoid(input)
        if y is not NotImplemented:
            return y
        if _functorch.active():
            return _functorch.sigmoid(input)
    return _sigmoid(input)


def explain(op, input, dim=-1, *, dtype=None):
    """Which kernel ``op`` runs on ``input`` and why: e.g. ``explain("softmax", x)``.

    ``op`` is one of softmax, log_softmax, softmax_backward, log_softmax_backward, gelu, bias_gelu,
    sigmoid. Reports the dispatcher's choice of softmax variant on CUDA tensors, the CPU path on CPU.
    For the backwards ``input`` stands for the forward's output. ``dtype`` (the softmax family only) is
    the op's own: the forward's ``dtype=`` (``explain("log_softmax", logits, dtype=torch.float32)``: a
    16-bit input widened to float in the kernel), the backward's ``input_dtype`` (grad_input's: the
    forward input's dtype)."""
    return _ops.explain.default(input, op, dim, dtype=dtype)


from . import nn  # noqa: E402
from . import onnx  # noqa: E402,F401  (registers the ops with torch's ONNX exporters when torch imports them)
from .nn import _implicit_dim  # noqa: E402  (F.softmax's dim=None rule and warning, silent while dynamo traces)

# fastact in an existing model: `with fastact.patch():` (torch's functions) and fastact.apply(model)
# (activation modules, and the mode around its forward). The names shadow the fastact.patch
# submodule as an attribute; `from fastact.patch import FastActMode, OpCounter` still reaches it.
from .patch import apply, patch  # noqa: E402

__all__ += ["patch", "apply"]
