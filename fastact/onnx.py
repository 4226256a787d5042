"""ONNX export of the fastact ops: ``torch.onnx.export`` of a model that uses fastact writes the
standard ONNX nodes, with no argument from the user, under both of torch's exporters.

=============================  ==============================================================
fastact op                     ONNX
=============================  ==============================================================
softmax / log_softmax          Softmax / LogSoftmax (``dtype=``: a Cast first, as torch casts
                               before the op)
gelu                           Gelu from opset 20; below, its Erf or Tanh formula
bias_gelu                      Add, then gelu as above
sigmoid                        Sigmoid
any other pointwise op         its row's formula (fastact/_optable.py ``onnx``) in ONNX nodes
=============================  ==============================================================

- The TorchScript-based exporter (``dynamo=False``) traces the model, which records
  ``fastact::*`` nodes; a symbolic function per op (``torch.onnx.register_custom_op_symbolic``)
  hands each to torch's own symbolic for the aten op (``aten::softmax`` etc.) at the export's
  opset, so the nodes are those torch writes for ``torch.softmax`` or ``F.gelu``, two cases apart:
  ``dtype=`` casts before the op (torch's symbolic casts the result), and a 0-d input goes through
  Unsqueeze/Squeeze (torch's symbolic writes a Softmax of rank 0, which ONNX refuses).
- The ``torch.export``-based exporter (``dynamo=True``, torch's default) keeps the ``fastact::*``
  ops in the exported program (they have fake kernels) and looks each op up in its registry of
  translation functions, which it builds from torch's torchlib list on every export; the onnxscript
  translations below are added to that list.

Neither registration is done at ``import fastact``: importing ``torch.onnx`` costs tens of
milliseconds and onnxscript seconds. An import hook waits for ``torch.onnx`` (the TorchScript
exporter's symbolics) and for ``torch.onnx._internal.exporter._core`` (which the dynamo exporter
imports, together with its registry and onnxscript, before it builds the registry) and registers
then; when either is already imported, registration is immediate. Why not a decomposition in
``torch._decomp.decomposition_table``, which the dynamo exporter also reads: fake tensors prefer
that table to an op's fake kernel under symbolic shapes (``torch.compile(dynamic=True)`` would run
it at every trace), and DTensor decomposes through it, so it would change more than ONNX.
"""

import importlib
import importlib.abc
import sys
import threading
import warnings

import torch

from ._optable import OPS as _OPS
from ._optable import define

_TORCHSCRIPT_EXPORTER = "torch.onnx"
_DYNAMO_EXPORTER = "torch.onnx._internal.exporter._core"

# Opsets at which torch's TorchScript exporter changes its aten symbolic for these ops:
# 13 (Softmax/LogSoftmax take any axis, before that a 2-d coercion), 20 (Gelu).
_SOFTMAX_OPSETS = (9, 13)
_GELU_OPSETS = (9, 20)


def _torchscript_symbolics():
    """Registers one symbolic per fastact op and opset with the TorchScript-based exporter."""
    import torch.onnx
    from torch.onnx import symbolic_helper
    from torch.onnx._internal.torchscript_exporter import _type_utils

    def aten_symbolic(name, opset):
        # torch.onnx.symbolic_opsetN holds the symbolics that change at opset N
        return getattr(importlib.import_module(f"torch.onnx.symbolic_opset{opset}"), name)

    def cast(g, x, dtype):
        """torch's ``dtype=``: the input cast to dtype before the op (a constant ScalarType or None)."""
        if symbolic_helper._is_none(dtype):
            return x
        scalar_type = _type_utils.JitScalarType(symbolic_helper._get_const(dtype, "i", "dtype"))
        y = g.op("Cast", x, to_i=scalar_type.onnx_type())
        # x's shape with the new dtype: torch's symbolics read the rank (below opset 13 Softmax
        # needs it to pick its axis; without it torch writes Exp/ReduceSum/Div instead of Softmax)
        y.setType(x.type().with_dtype(scalar_type.dtype()))
        return y

    def softmax_like(name, opset):
        aten = aten_symbolic(name, opset)

        def symbolic(g, x, dim, dtype, variant):
            if symbolic_helper._get_tensor_rank(x) == 0:  # ONNX's Softmax wants rank >= 1
                y = aten(g, symbolic_helper._unsqueeze_helper(g, cast(g, x, dtype), [0]), 0, None)
                return symbolic_helper._squeeze_helper(g, y, [0])
            return aten(g, cast(g, x, dtype), dim, None)

        return symbolic

    def gelu(opset):
        aten = aten_symbolic("gelu", opset)

        def symbolic(g, x, approximate):
            return aten(g, x, approximate)

        return symbolic

    def bias_gelu(opset):
        aten = aten_symbolic("gelu", opset)

        def symbolic(g, x, bias, approximate):
            return aten(g, g.op("Add", x, bias), approximate)

        return symbolic

    def formula(op):
        """A row's ONNX formula (op.onnx) over g.op; its string params as the constants the trace holds."""
        names = op.param_names

        def symbolic(g, x, *params):
            values = {n: symbolic_helper._get_const(v, "s", n) for n, v in zip(names, params)}
            return op.onnx(_GraphOps(g), x, **values)

        return symbolic

    for opset in _SOFTMAX_OPSETS:
        torch.onnx.register_custom_op_symbolic("fastact::softmax", softmax_like("softmax", opset), opset)
        torch.onnx.register_custom_op_symbolic("fastact::log_softmax", softmax_like("log_softmax", opset), opset)
    for opset in _GELU_OPSETS:
        torch.onnx.register_custom_op_symbolic("fastact::gelu", gelu(opset), opset)
        torch.onnx.register_custom_op_symbolic("fastact::bias_gelu", bias_gelu(opset), opset)
    for op in _OPS:
        if op.onnx is not None:
            torch.onnx.register_custom_op_symbolic(f"fastact::{op.name}", formula(op), _SOFTMAX_OPSETS[0])


class _GraphOps:
    """``ops.Sigmoid(x)`` -> ``g.op("Sigmoid", x)``: the op namespace a row's ONNX formula is written against,
    for the TorchScript-based exporter's graph."""

    def __init__(self, g):
        self._g = g

    def __getattr__(self, name):
        return lambda *inputs: self._g.op(name, *inputs)


def _dynamo_translations():
    """Adds onnxscript translations of the fastact ops to the list torch's dynamo exporter builds
    its registry from (``ONNXRegistry.from_torchlib``, on every export). The functions are traced
    (``trace_only``): plain Python over the ONNX values, run once per node at export time. Their
    annotations are what the exporter reads their signatures from."""
    from onnx_ir import DataType, tensor
    from onnxscript.onnx_opset import opset18 as op18
    from onnxscript.onnx_opset import opset20 as op20
    from torch.onnx._internal.exporter._torchlib._tensor_typing import TFloat
    from torch.onnx._internal.exporter._torchlib._torchlib_registry import onnx_impl

    ops = torch.ops.fastact

    def softmax_like(onnx_op):
        def translation(self: TFloat, dim: int, dtype: int = -1, variant: str = "auto") -> TFloat:
            scalar = len(self.shape) == 0  # read before the Cast, whose output has no shape yet
            # dtype is an ONNX data type here (the exporter converts torch dtypes); torch casts first
            if dtype is not None and dtype != -1:
                self = op18.Cast(self, to=dtype)
            if scalar:  # ONNX's Softmax wants rank >= 1
                return op18.Squeeze(onnx_op(op18.Unsqueeze(self, [0]), axis=0), [0])
            return onnx_op(self, axis=dim)

        return translation

    def gelu_formula(x, approximate, out_dtype):
        """GELU for opsets without the Gelu op: x/2 (1 + erf(x/sqrt 2)), or with "tanh"
        x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); float16 and bfloat16 in float, as torch and
        fastact compute them, rounded once at the end. ``out_dtype`` is x's (a traced node's output,
        such as an Add's, has none yet)."""
        dtype = DataType.FLOAT if out_dtype in (DataType.FLOAT16, DataType.BFLOAT16) else out_dtype
        if dtype != out_dtype:
            x = op18.Cast(x, to=dtype)

        def c(value):
            return tensor(value, dtype=dtype)

        if approximate == "tanh":
            inner = op18.Mul(c(0.7978845608028654), op18.Add(x, op18.Mul(c(0.044715), op18.Mul(x, op18.Mul(x, x)))))
            y = op18.Mul(op18.Mul(c(0.5), x), op18.Add(c(1.0), op18.Tanh(inner)))
        else:
            y = op18.Mul(op18.Mul(c(0.5), x), op18.Add(c(1.0), op18.Erf(op18.Mul(x, c(0.7071067811865476)))))
        return y if dtype == out_dtype else op18.Cast(y, to=out_dtype)

    def gelu18(self: TFloat, approximate: str = "none") -> TFloat:
        return gelu_formula(self, approximate, self.dtype)

    def gelu20(self: TFloat, approximate: str = "none") -> TFloat:
        return op20.Gelu(self, approximate=approximate)

    def bias_gelu18(self: TFloat, bias: TFloat, approximate: str = "tanh") -> TFloat:
        return gelu_formula(op18.Add(self, bias), approximate, self.dtype)  # the Add in x's dtype, as F.gelu(x + b)

    def bias_gelu20(self: TFloat, bias: TFloat, approximate: str = "tanh") -> TFloat:
        return op20.Gelu(op18.Add(self, bias), approximate=approximate)

    def formula(op):
        """A row's ONNX formula (op.onnx) over opset 18, as a translation with the op's signature (the exporter
        reads it from the annotations)."""
        params = "".join(f", {p.name}: str = {p.default!r}" for p in op.params)
        values = "".join(f"{n}={n}, " for n in op.param_names)
        namespace = {"TFloat": TFloat, "op18": op18, "onnx": op.onnx}
        define(f"def translation(self: TFloat{params}) -> TFloat:\n    return onnx(op18, self, {values})\n",
               namespace, f"fastact.onnx translation of {op.name}")
        return namespace["translation"]

    onnx_impl(ops.softmax.default, trace_only=True)(softmax_like(op18.Softmax))
    onnx_impl(ops.log_softmax.default, trace_only=True)(softmax_like(op18.LogSoftmax))
    onnx_impl(ops.gelu.default, trace_only=True)(gelu18)
    onnx_impl(ops.gelu.default, trace_only=True, opset_introduced=20)(gelu20)
    onnx_impl(ops.bias_gelu.default, trace_only=True)(bias_gelu18)
    onnx_impl(ops.bias_gelu.default, trace_only=True, opset_introduced=20)(bias_gelu20)
    for op in _OPS:
        if op.onnx is not None:
            onnx_impl(getattr(ops, op.name).default, trace_only=True)(formula(op))


class _RunAfter(importlib.abc.Loader):
    """Wraps a module's loader to call ``callback`` once the module has run."""

    def __init__(self, loader, callback):
        self._loader = loader
        self._callback = callback

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._callback()

    def __getattr__(self, name):  # get_source, get_resource_reader, ...: the real loader's
        return getattr(self._loader, name)


class _ImportHook(importlib.abc.MetaPathFinder):
    """A finder ahead of the others that, for the modules it waits for, finds the spec the usual
    way and wraps its loader; it leaves sys.meta_path once nothing is left to wait for."""

    def __init__(self):
        self._pending = {}
        self._lock = threading.Lock()

    def add(self, name, callback):
        with self._lock:
            self._pending[name] = callback
            if self not in sys.meta_path:
                sys.meta_path.insert(0, self)

    def find_spec(self, fullname, path, target=None):
        if fullname not in self._pending:
            return None
        with self._lock:
            callback = self._pending.pop(fullname, None)
            if not self._pending and self in sys.meta_path:
                sys.meta_path.remove(self)
        if callback is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _RunAfter(spec.loader, callback)
                return spec
        return None


_hook = _ImportHook()
_registered = set()


def _register(name, register):
    """Runs register() once; a failure becomes a warning, never a failed import of torch.onnx."""
    if name in _registered:
        return
    _registered.add(name)
    try:
        register()
    except Exception as e:  # noqa: BLE001 (torch's exporter must stay importable whatever happens)
        warnings.warn(f"fastact: could not register the fastact ops with {name}: {e!r}; "
                      "torch.onnx.export of models using fastact will fail", RuntimeWarning, stacklevel=2)


def _when_imported(name, register):
    if name in sys.modules:
        _register(name, register)
    else:
        _hook.add(name, lambda: _register(name, register))


def install():
    """Registers the fastact ops with torch's ONNX exporters now or as soon as each is imported
    (``import fastact`` calls it; calling it again does nothing)."""
    _when_imported(_TORCHSCRIPT_EXPORTER, _torchscript_symbolics)
    # without onnxscript _core's import fails before the hook's callback runs, as the export would
    _when_imported(_DYNAMO_EXPORTER, _dynamo_translations)


install()
