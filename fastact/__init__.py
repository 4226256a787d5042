"""fastact: fast activation kernels for PyTorch (softmax, log_softmax, GELU, fused bias+GELU, sigmoid, SiLU, ...:
the rows of fastact/_optable.py).

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

from ._optable import OPS as _OPS
from ._optable import define as _define

__all__ = [op.name for op in _OPS] + ["explain", "nn"]
from ._version import __version__

# Each function (generated below from the op table) first tries _C's eager entry point (csrc/eager.cpp: one
# unboxed dispatcher call for a plain tensor), which returns NotImplemented for anything else (tensor subclasses,
# torch function modes, unusual arguments); then its slow path (argument parsing with torch's TypeErrors, then the
# OpOverload) handles the call. While dynamo traces, _dynamo_tracing() is True (a constant to it; a 20 ns call in
# eager) and the OpOverload is what it sees: it cannot trace a C function. Under torch.func transforms (grad, vmap,
# jvp, ...) _C returns NotImplemented too, and the op runs through _functorch's Python autograd.Functions: torch
# refuses the C++ ones there.


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
    if isinstance(value, torch.SymInt):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        out = value
    elif (isinstance(value, torch.Tensor) and value.dim() == 0 and not value.dtype.is_floating_point
          and not value.dtype.is_complex and value.dtype != torch.bool) or _is_numpy_int(value):
        out = int(value)
    else:
        raise TypeError(f"{fn}(): argument '{name}' (position {pos}) must be int, not {_type_name(value)}")
    if not -2**63 <= out < 2**63:
        raise ValueError("Overflow when unpacking long long")  # torch's parser's error
    return out


def _is_numpy_int(value):
    np = sys.modules.get("numpy")  # never imported for this: a numpy integer implies numpy is loaded
    return np is not None and isinstance(value, np.integer)


def _tensor_args(fn, names, values):
    """torch's TypeError for an argument that is neither a tensor nor a tensor-like (an instance with
    __torch_function__, which the op's dispatch hands its call; a class is neither)."""
    for pos, (name, value) in enumerate(zip(names, values), 1):
        tensor_like = hasattr(value, "__torch_function__") and not isinstance(value, type)
        if not isinstance(value, torch.Tensor) and not tensor_like:
            raise TypeError(f"{fn}(): argument '{name}' (position {pos}) must be Tensor, not {_type_name(value)}")


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


# Each op's OpOverload, looked up once.
_OVERLOADS = {op.name: getattr(_ops, op.name).default for op in _OPS}
_ROWS = {op.name: op for op in _OPS}


def _softmax_slow(name, input, dim, stacklevel, dtype):
    """The calls _C's entry point leaves to Python (any dim but a plain int, tensor subclasses, modes, transforms,
    dynamo tracing): torch's argument rules, then the functorch Function or the OpOverload. `stacklevel` counts
    from here, as the public function's `_stacklevel` counts from it."""
    _tensor_args(name, ("input",), (input,))
    if dim is None:
        dim = _implicit_dim(name, input.dim(), stacklevel)
    else:
        dim = _int_arg(name, "dim", 2, dim)
    _check_dtype_arg(name, dtype)
    if not _dynamo_tracing() and _functorch.active():
        return _functorch.softmax(input, dim, dtype, _ROWS[name].log)
    return _OVERLOADS[name](input, dim, dtype)


def _pointwise_slow(name, tensors, params):
    """The slow path of a pointwise or bias op (`tensors`: its tensor arguments, `params`: its string ones):
    torch's argument rules for the strings, then the functorch Function or the OpOverload."""
    row = _ROWS[name]
    _tensor_args(name, row.tensors, tensors)
    params = tuple(_str_arg(name, p.name, v) for p, v in zip(row.params, params))
    if not _dynamo_tracing() and _functorch.active():
        return _functorch.call(row, tensors, params)
    return _OVERLOADS[name](*tensors, *params)


def _inplace(name, input):
    """``inplace=True``: torch's own in-place function (fastact's kernels write a new tensor)."""
    return _ROWS[name].torch_fn(input, inplace=True)


_SOFTMAX_TEMPLATE = """
def {name}(input, dim=None, _stacklevel=3, dtype=None):
    if not _dynamo_tracing():
        y = _C.{name}(input, dim, dtype)
        if y is not NotImplemented:
            return y
    return _softmax_slow("{name}", input, dim, _stacklevel + 1, dtype)
"""

_POINTWISE_TEMPLATE = """
def {name}({signature}):{inplace}
    if not _dynamo_tracing():
        y = _C.{name}({args})
        if y is not NotImplemented:
            return y
    return _pointwise_slow("{name}", ({tensors}), ({params}))
"""


def _source(op):
    """The public function of `op` (a table row): its C fast path, then its slow path."""
    if op.kind == "softmax":
        return _SOFTMAX_TEMPLATE.format(name=op.name)
    signature = list(op.tensors) + [f"{p.name}={p.default!r}" for p in op.params]
    if op.inplace:
        signature.append("inplace=False")
    args = ", ".join(op.tensors + op.param_names)
    return _POINTWISE_TEMPLATE.format(
        name=op.name, signature=", ".join(signature), args=args, tensors="".join(t + ", " for t in op.tensors),
        params="".join(p + ", " for p in op.param_names),
        inplace=f'\n    if inplace:\n        return _inplace("{op.name}", input)' if op.inplace else "")


for _op in _OPS:
    _define(_source(_op), globals(), f"fastact.{_op.name}")
    globals()[_op.name].__doc__ = _op.doc
del _op


def explain(op, input, dim=-1, *, dtype=None):
    """Which kernel ``op`` runs on ``input`` and why: e.g. ``explain("softmax", x)``.

    ``op`` is one of {ops}.
    Reports the dispatcher's choice of softmax variant on CUDA tensors, the CPU path on CPU.
    For the backwards ``input`` stands for the forward's output. ``dtype`` (the softmax family only) is
    the op's own: the forward's ``dtype=`` (``explain("log_softmax", logits, dtype=torch.float32)``: a
    16-bit input widened to float in the kernel), the backward's ``input_dtype`` (grad_input's: the
    forward input's dtype)."""
    return _ops.explain.default(input, op, dim, dtype=dtype)


# the op list: every row, the softmax family's backwards after its forwards
_softmax_rows = [op for op in _OPS if op.kind == "softmax"]
explain.__doc__ = explain.__doc__.format(ops=", ".join(
    [op.name for op in _softmax_rows] + [op.backward for op in _softmax_rows]
    + [op.name for op in _OPS if op.kind != "softmax"]))
del _softmax_rows


from . import nn  # noqa: E402
from . import onnx  # noqa: E402,F401  (registers the ops with torch's ONNX exporters when torch imports them)
from .nn import _implicit_dim  # noqa: E402  (F.softmax's dim=None rule and warning, silent while dynamo traces)

# fastact in an existing model: `with fastact.patch():` (torch's functions) and fastact.apply(model)
# (activation modules, and the mode around its forward). The names shadow the fastact.patch
# submodule as an attribute; `from fastact.patch import FastActMode, OpCounter` still reaches it.
from .patch import apply, patch  # noqa: E402

__all__ += ["patch", "apply"]
