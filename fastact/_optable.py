"""The op table: every fastact op declared once, with what the Python side needs to know of it.

Everything Python is generated or generic from the rows below: the public functions
(fastact/__init__.py), the fake kernels (_ops.py), the torch.func rules (_functorch.py), the nn
modules (nn.py), the routes and module swaps of fastact.patch, the ONNX translations (onnx.py), the
op lists of fastact.bench and scripts/sanitize_cases.py, explain's op list, and the tests' op list
(tests/fastact_testing.py holds a float64 reference per row). A pointwise op is one row here; the
C++ side (csrc/, include/) registers its schema and kernels.

Kinds:

* ``"softmax"``: ``op(input, dim=None, _stacklevel=3, dtype=None)`` like ``F.softmax``; the backward
  op takes ``(grad_output, output, dim, input_dtype)``.
* ``"pointwise"``: ``op(input, *params)`` with string params (``approximate``), each with a default
  and the values it accepts; the backward op takes ``(grad_output, saved, *params)`` where ``saved``
  is the forward's input or output (``saves``).
* ``"bias"``: ``op(input, bias, *params)``, the pointwise row ``pointwise`` applied to
  ``input + bias`` (bias over the last dim); the backward op takes ``(grad_output, input, bias,
  *params)`` and returns the gradients of both.
"""

import linecache
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

aten = torch.ops.aten


@dataclass(frozen=True)
class Param:
    """A string argument of an op (passed to its kernel): name, default, the values the kernel takes."""

    name: str
    default: str
    choices: tuple


@dataclass(frozen=True)
class Op:
    name: str
    kind: str  # "softmax", "pointwise" or "bias"
    doc: str  # the public function's docstring
    module: str  # the fastact.nn class
    module_doc: str
    torch_fn: Callable  # the torch function this op is a drop-in for (F.gelu, torch.sigmoid, ...)
    # torch's own derivative op, called (grad, saved, **params) (softmax kind: (grad, output, dim, dtype)); the
    # torch.func rules differentiate through it, so higher orders and vmap work
    torch_backward: Any
    saves: str = "input"  # what the backward reads besides the gradient: the forward's "input" or "output"
    params: tuple = ()  # Param rows, in the function's argument order after the tensors
    torch_module: Any = None  # the torch.nn twin the module is a drop-in for (None: no twin)
    # the torch signature whose parameters the public function must cover (tests/test_api.py): torch_fn when
    # inspect can read it, else the aten op whose schema names them
    signature_twin: Any = None
    # True: `inplace=False` as torch's function and module take it; inplace=True computes with torch's own
    # in-place function (fastact's kernels write a new tensor)
    inplace: bool = False
    integral_to_default: bool = False  # an integer input is computed in the default dtype (torch.sigmoid)
    log: bool = False  # softmax kind: log_softmax
    pointwise: str = None  # bias kind: the pointwise row applied to input + bias
    # fastact.patch: the torch functions routed to this op while the mode is on, each with its Python signature
    # (the keyword `out` and `inplace` must be left at None/False for fastact to take the call; any other
    # argument after `input` is one of the op's params)
    routes: tuple = ()
    # ONNX: ``onnx(op, x, **params)`` builds the op from ONNX nodes through ``op.<OnnxOp>(...)`` (both exporters
    # hand in such a namespace); None where onnx.py has a translation of the kind (softmax, gelu family)
    onnx: Callable = None
    explain_doc: str = ""  # explain's op list: extra names (the softmax backwards)
    # the torch.func rules' derivative where torch_backward is not differentiable at every order (an aten backward
    # op without a forward-mode formula): the same derivative written in differentiable torch ops; None: torch_backward
    differentiable_backward: Callable = None

    @property
    def backward(self):
        """The name of the registered backward op."""
        return self.name + "_backward"

    @property
    def tensors(self):
        """The tensor arguments of the forward, in order."""
        return ("input", "bias") if self.kind == "bias" else ("input",)

    @property
    def param_names(self):
        return tuple(p.name for p in self.params)

    @property
    def variants(self):
        """(label, params) for every value of the op's params, the default first: gelu -> ("gelu", {"approximate":
        "none"}), ("gelu_tanh", {"approximate": "tanh"}). One param at most varies (there is no op with two)."""
        base = {p.name: p.default for p in self.params}
        out = [(self.name, base)]
        for p in self.params:
            out += [(f"{self.name}_{c}", {**base, p.name: c}) for c in p.choices if c != p.default]
        return out


_APPROXIMATE = Param("approximate", "none", ("none", "tanh"))


OPS = (
    Op("softmax", "softmax",
       doc="""Softmax over `dim`; matches ``torch.nn.functional.softmax(input, dim, _stacklevel, dtype)`` (and so
    ``torch.softmax`` and ``Tensor.softmax``).

    ``dim=None`` takes torch's deprecated implicit dim (0 for 0-, 1- and 3-d inputs, else 1) with its warning.
    ``dtype`` casts before the op, as in torch; a float16/bfloat16 input with ``dtype=torch.float32`` is converted
    inside the kernel (no extra pass over memory).""",
       module="Softmax",
       module_doc="""Drop-in for ``torch.nn.Softmax``: softmax over ``dim``; ``dim=None`` picks torch's implicit dim
    (0 for 0-, 1- and 3-d inputs, else 1) with torch's deprecation warning.""",
       torch_fn=F.softmax, torch_backward=aten._softmax_backward_data, saves="output",
       torch_module=torch.nn.Softmax, signature_twin=F.softmax,
       routes=((F.softmax, "f_softmax"), (torch.softmax, "softmax"), (torch.Tensor.softmax, "softmax")),
       explain_doc="softmax_backward"),
    Op("log_softmax", "softmax",
       doc="""Log-softmax over `dim`; matches ``torch.nn.functional.log_softmax(input, dim, _stacklevel, dtype)`` (and
    ``torch.log_softmax``, ``Tensor.log_softmax``), the implicit ``dim=None`` included.""",
       module="LogSoftmax",
       module_doc="""Drop-in for ``torch.nn.LogSoftmax``; ``dim=None`` as in :class:`Softmax`.""",
       torch_fn=F.log_softmax, torch_backward=aten._log_softmax_backward_data, saves="output", log=True,
       torch_module=torch.nn.LogSoftmax, signature_twin=F.log_softmax,
       routes=((F.log_softmax, "f_softmax"), (torch.log_softmax, "softmax"), (torch.Tensor.log_softmax, "softmax")),
       explain_doc="log_softmax_backward"),
    Op("gelu", "pointwise",
       doc="""GELU; matches ``torch.nn.functional.gelu(input, approximate=approximate)`` ("none" or "tanh").""",
       module="GELU",
       module_doc="""Drop-in for ``torch.nn.GELU``: ``approximate`` is ``"none"`` (erf) or ``"tanh"``.""",
       torch_fn=F.gelu, torch_backward=aten.gelu_backward, saves="input", params=(_APPROXIMATE,),
       torch_module=torch.nn.GELU, signature_twin=aten.gelu.default,
       routes=((F.gelu, "input, approximate='none'"),)),
    Op("bias_gelu", "bias",
       doc="""``F.gelu(input + bias, approximate=approximate)`` in one pass; ``bias`` is 1-d over the last dim.

    The backward returns the gradients of ``input`` and ``bias``, also fused (no materialised
    ``input + bias``).""",
       module="BiasGELU",
       module_doc="""``gelu(input + bias)`` with a learnable ``bias`` of shape ``[features]``, initialised to zero
    (``reset_parameters``), so that ``Linear(in, features, bias=False)`` followed by ``BiasGELU``
    computes ``gelu(linear(x))`` with a bias, in one pass after the matmul. No torch twin; built like
    ``torch.nn.Linear``: ``device``/``dtype`` factory arguments, ``reset_parameters()`` (a meta-device
    module becomes usable through ``to_empty(device=...)`` then ``reset_parameters()``).""",
       torch_fn=F.gelu, torch_backward=aten.gelu_backward, saves="input",
       params=(Param("approximate", "tanh", ("none", "tanh")),), pointwise="gelu"),
    Op("sigmoid", "pointwise",
       doc="""Sigmoid; matches ``torch.sigmoid`` (computed without overflow for large ``|input|``).""",
       module="Sigmoid",
       module_doc="""Drop-in for ``torch.nn.Sigmoid``.""",
       torch_fn=torch.sigmoid, torch_backward=aten.sigmoid_backward, saves="output", integral_to_default=True,
       torch_module=torch.nn.Sigmoid, signature_twin=aten.sigmoid.default,
       # F.sigmoid is a plain function calling Tensor.sigmoid
       routes=((torch.sigmoid, "input, *, out=None"), (torch.Tensor.sigmoid, "input")),
       onnx=lambda op, x: op.Sigmoid(x)),
    Op("silu", "pointwise",
       doc="""SiLU (swish), ``input * sigmoid(input)``; matches ``torch.nn.functional.silu(input, inplace)`` (computed
    without overflow for large ``|input|``). ``inplace=True`` runs torch's own in-place function.""",
       module="SiLU",
       module_doc="""Drop-in for ``torch.nn.SiLU``; ``inplace=True`` runs torch's own in-place function.""",
       torch_fn=F.silu, torch_backward=aten.silu_backward, saves="input", inplace=True,
       # aten.silu_backward has no forward-mode formula (torch's autograd differentiates silu through this one)
       differentiable_backward=lambda grad, x: grad * torch.sigmoid(x) * (1 + x * (1 - torch.sigmoid(x))),
       torch_module=torch.nn.SiLU, signature_twin=F.silu,
       routes=((F.silu, "input, inplace=False"),),
       onnx=lambda op, x: op.Mul(x, op.Sigmoid(x))),
)

BY_NAME = {op.name: op for op in OPS}


def of_kind(*kinds):
    return tuple(op for op in OPS if op.kind in kinds)


def define(source, namespace, label):
    """Runs generated `source` (function or class definitions) in `namespace` (a module's globals), with the
    source kept in linecache under a name of its own, so that inspect.getsource, tracebacks and TorchScript
    (which compiles a scripted module's forward from its source) see it as if it were written in a file."""
    filename = f"<fastact generated: {label}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102
