"""torch.nn modules over the fastact functions, one per row of the op table (fastact/_optable.py), drop-in
for their torch twins (torch.nn.Softmax, LogSoftmax, GELU, Sigmoid, ...): the same constructor arguments,
defaults, repr, state dict and pickling; BiasGELU owns its bias (a Linear without bias followed by BiasGELU is the fused
``gelu(x @ W.T + b)``).

Every module is scriptable: under ``torch.jit.script`` the forward calls the registered op
(``torch.ops.fastact.*``), which TorchScript compiles; in eager it calls the fastact function, whose C
fast path TorchScript cannot see. ``torch.jit.is_scripting()`` (here ``_scripting()``) is a constant
to the TorchScript compiler, which compiles only the branch it takes, so the eager branch may call
anything. The check costs eager ~30 ns a call (one Python call), ~1% of a module call on a small
tensor."""

import warnings

import torch
from torch import Tensor  # noqa: F401  (the generated modules' annotations)
from torch.compiler import is_dynamo_compiling as _dynamo_tracing
# bound here: 20 ns a call less than torch.jit.is_scripting (the generated forwards call it)
from torch.jit import is_scripting as _scripting  # noqa: F401

import fastact

from ._optable import OPS as _OPS
from ._optable import define as _define

__all__ = [op.module for op in _OPS]


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


def _torch_layout(input: Tensor) -> Tensor:
    """The input the softmax family reads to return torch's layout: torch's softmax and log_softmax return a
    contiguous tensor whatever the input's layout, fastact's functions empty_like(input)'s (a permuted input's own
    order, no copy). Where that differs, a contiguous copy of the input, as torch's kernels read; else the input
    itself (contiguous, or rows with gaps, which fastact reads in place into a contiguous output). The drop-in paths
    (these modules, fastact.patch's routes) call it; code written against torch may view the result."""
    if input.is_contiguous() or torch.empty_like(input, device="meta").is_contiguous():
        return input
    return input.contiguous()


# The modules are generated from the op table, one class per row, from the source templates below (one per
# kind), kept in linecache so that TorchScript, which compiles a scripted module's forward from its source, and
# inspect read them as if written here. They run in this module's namespace: the classes are fastact.nn.<Module>
# (pickles name them so), and their forwards see the fastact functions bound below.

_SOFTMAX_MODULE = """
class {module}(torch.nn.Module):
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
            # Module._wrapped_call_impl: where torch.nn.{module}'s warning points (F.{name} called with
            # _stacklevel=5, one frame deeper), so both have the same file and line and a warnings
            # filter treats them alike. (A literal: TorchScript cannot read a global int.)
            dim = _implicit_dim("{name}", input.dim(), 4)
        input = _torch_layout(input)  # torch's output layout
        if _scripting():
            return torch.ops.fastact.{name}(input, dim, None)
        return {name}(input, dim)

    def extra_repr(self) -> str:
        return f"dim={{self.dim}}"
"""

# Pointwise: the constructor takes the op's params (and torch's `inplace`, where the op's twin has it), stored
# under their own names, as torch's modules store them.
_POINTWISE_MODULE = """
class {module}(torch.nn.Module):
{init}
    def forward(self, input: Tensor) -> Tensor:
{inplace}        if _scripting():
            return torch.ops.fastact.{name}(input{args})
        return {name}(input{args})

    def extra_repr(self) -> str:
        return {repr}
"""

# (without params, as torch.nn.Sigmoid: Module's own constructor)
_POINTWISE_INIT = """    __constants__ = [{constants}]
{annotations}
    def __init__(self{ctor}) -> None:
        super().__init__()
{assign}
    def __setstate__(self, state):
        super().__setstate__(state)
{restore}"""

_BIAS_MODULE = """
class {module}(torch.nn.Module):
    __constants__ = ["features", {constants}]
    features: int
{annotations}
    def __init__(self, features: int{ctor}, device=None, dtype=None) -> None:
        super().__init__()
        self.features = features
{assign}        self.bias = torch.nn.Parameter(torch.empty(features, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        torch.nn.init.zeros_(self.bias)

    def __setstate__(self, state):
        super().__setstate__(state)
        if not hasattr(self, "features"):  # pickled by a version that kept no features attribute
            self.features = self.bias.shape[0]
{restore}
    def forward(self, input: Tensor) -> Tensor:
        if _scripting():
            return torch.ops.fastact.{name}(input, self.bias{args})
        return {name}(input, self.bias{args})

    def extra_repr(self) -> str:
        return {repr}
"""


def _module_source(op):
    """The fastact.nn class of `op` (a table row)."""
    if op.kind == "softmax":
        return _SOFTMAX_MODULE.format(module=op.module, name=op.name)
    names = list(op.param_names)
    attrs = [(p.name, "str", repr(p.default)) for p in op.params]
    if op.inplace:
        attrs.append(("inplace", "bool", "False"))
    fields = dict(
        module=op.module, name=op.name,
        constants=", ".join(f'"{a}"' for a, _, _ in attrs),
        annotations="".join(f"    {a}: {t}\n" for a, t, _ in attrs),
        ctor="".join(f", {a}: {t} = {d}" for a, t, d in attrs),
        assign="".join(f"        self.{a} = {a}\n" for a, _, _ in attrs),
        # attributes a pickle from a version without them lacks take their defaults
        restore="".join(f"        if not hasattr(self, {a!r}):\n            self.{a} = {d}\n" for a, _, d in attrs),
        args="".join(f", self.{a}" for a in names),
        # torch's repr: the params by name; `inplace=True` only when set
        repr=" + ".join([f'f"{a}={{repr(self.{a})}}"' for a in names] or ['""'])
        + (' + ((", " if ' + repr(bool(names)) + ' else "") + "inplace=True" if self.inplace else "")'
           if op.inplace else ""),
        # inplace=True: torch's own in-place function, as the fastact function's inplace=True runs it (written out
        # here: TorchScript compiles the fastact function to the registered op, whose schema has no inplace)
        inplace=(f"        if self.inplace:\n            return _torch_{op.name}(input, inplace=True)\n"
                 if op.inplace else ""))
    if op.kind == "bias":
        fields["features"] = True
        fields["repr"] = 'f"features={self.features}, " + ' + fields["repr"]
        return _BIAS_MODULE.format(**fields)
    return _POINTWISE_MODULE.format(init=_POINTWISE_INIT.format(**fields) if attrs else "", **fields)


for _op in _OPS:
    globals()[_op.name] = getattr(fastact, _op.name)
    if _op.inplace:
        globals()[f"_torch_{_op.name}"] = _op.torch_fn
    _define(_module_source(_op), globals(), f"fastact.nn.{_op.module}")
    globals()[_op.module].__doc__ = _op.module_doc


# TorchScript code that calls the fastact functions (``fastact.softmax(x, -1)`` in a scripted forward)
# compiles to the registered ops: TorchScript looks a called Python function up in its table of
# builtins before it tries to compile its source (which it cannot: the C fast path). The ops' schemas
# decide the arguments there: positional or by the schema's names (``self`` for the input), ``dim``
# required.
for _op in _OPS:
    torch.jit._builtins._register_builtin(getattr(fastact, _op.name), f"fastact::{_op.name}")
del _op
