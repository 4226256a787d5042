"""fastact in an existing model, in one line.

Two tools, for the two ways models reach an activation:

* ``with fastact.patch():`` routes torch's *functions* to fastact while the block runs: the torch
  twins each row of the op table (``fastact/_optable.py``, ``routes``) names, such as ``F.softmax``,
  ``torch.softmax``, ``Tensor.softmax``, ``F.gelu``, ``torch.sigmoid`` and ``F.sigmoid`` (which calls
  ``Tensor.sigmoid``). Each keeps its torch semantics (``F.softmax``'s implicit dim and
  ``_stacklevel``, ``dtype=``, ``F.gelu``'s ``approximate``); calls fastact does not take (complex,
  integer, sparse or nested tensors, tensor subclasses, devices without a fastact kernel, ``out=``,
  named dims) run torch's own function unchanged. This is what reaches the ``F.softmax`` inside a
  Hugging Face attention.
* ``fastact.apply(model)`` swaps, in place, the activation *modules* whose math is exactly a fastact
  op: each row's torch module twin (``nn.Softmax``, ``nn.GELU``, ...) and the transformers GELU
  classes (erf GELU: ``GELUActivation``; tanh GELU: ``GELUTanh``/``PytorchGELUTanh``,
  ``NewGELUActivation``, ``FastGELUActivation``, ``AccurateGELUActivation``; SiLU: ``SiLUActivation``). With
  ``functional=True`` (the default) it also routes the covered functions that submodules' forwards
  call (an attention's ``F.softmax``): through copies of those forwards whose globals reach fastact,
  held by a subclass that becomes the module's class (``_Rebinder``: no cost per call), where the
  bytecode shows every such call made through a module global; else by running that forward inside
  ``fastact.patch()``.

``patch()`` is a ``torch.overrides.TorchFunctionMode``. Its cost: while it is active every torch
function call (matmul, add, view, ``x.size()``, ...) passes through its Python ``__torch_function__``,
1-3.5 us each on a desktop CPU core, ~7 us on an H100 host's (bench_models's ``--mode-overhead`` measures
it). A training step that the host cannot feed fast enough pays it in full: BERT-base in bfloat16 on an
H100 (b8x512) ran 0.89x of torch with the mode around the whole forward, 0.90x with it around the
attentions only, which is why ``apply`` copies the attentions' functions instead. It
does not turn off fastact's own fast entry point: torch runs ``__torch_function__`` with the mode
taken off the stack, so inside it fastact's functions see no mode (unless another mode sits below
this one, ``with torch.device(...)`` for one, in which case they take the registered op: same
results, ~1.5 us more a call).

Under ``torch.compile`` dynamo traces through the mode (and through the hooks and the copies that ``apply``
adds): the graph holds fastact's ops, with no graph break (``fullgraph=True`` works); ``counts`` then
counts what was traced, not each compiled call.

Not covered: a forward recomputed during backward by activation checkpointing runs outside a mode
that ``apply`` enters around a module's forward (the copies route there too; wrap the backward in
``fastact.patch()``, or accept torch's ops there: results agree within tolerance); modules of other
classes than those above, even when they call a covered function, route only through the copies or
the mode; a forward that reaches a covered function only through a function chosen at run time (a
callable attribute set later, a lookup table), more than two calls deep, is not found
(``model.fastact_mode.counts`` shows what routed; wrap the call in ``fastact.patch()`` to cover it).
The copies hold a snapshot of their module's globals taken by ``apply``: a global rebound later
(another library patching the modeling module) is not seen by the applied model.
"""

import collections
import dis
import functools
import inspect
import operator
import sys
import threading
import types

import torch
import torch.nn.functional as F
from torch.compiler import is_dynamo_compiling as _dynamo_tracing
from torch.overrides import TorchFunctionMode

import fastact
from fastact import nn as _fnn
from fastact.nn import _torch_layout
from fastact._optable import OPS as _OPS
from fastact._optable import define as _define

__all__ = ["patch", "apply", "FastActMode", "OpCounter"]

_FLOATING = frozenset((torch.float32, torch.float64, torch.float16, torch.bfloat16))
_Tensor, _Parameter, _strided = torch.Tensor, torch.nn.Parameter, torch.strided


def _has_kernel(dispatch_key):
    """Whether fastact registered kernels for this dispatch key (a CPU-only build has no CUDA ones)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key("fastact::softmax", dispatch_key)


_CPU_KERNELS, _CUDA_KERNELS = _has_kernel("CPU"), _has_kernel("CUDA")


def _takes(x):
    """An input fastact computes as torch would: a torch.Tensor or Parameter (a subclass, DTensor or
    a wrapper tensor, has its own __torch_function__ / __torch_dispatch__ contract and meets torch's
    op unchanged), strided (not sparse) and not nested, floating, on a device fastact has kernels
    for. Ordered and written for speed: this runs on every routed call (each check ~0.1 us; a
    x.device.type alone costs more than all of them)."""
    t = type(x)
    return ((t is _Tensor or t is _Parameter) and x.dtype in _FLOATING
            and ((x.is_cpu and _CPU_KERNELS) or (x.is_cuda and _CUDA_KERNELS))
            and x.layout is _strided and not x.is_nested)


def _as_dim(dim):
    """An int dim (Python int or anything with __index__, as torch's parser takes), or None where
    torch means something else by it (a Dimname string, None)."""
    if dim is None or isinstance(dim, str):
        return None
    try:
        return operator.index(dim)
    except TypeError:
        return None


# Argument binders: Python signatures of the torch functions, so positional and keyword calls
# normalise the same way. A call they cannot bind is one torch would refuse: torch then raises its
# own error.
def _bind_f_softmax(input, dim=None, _stacklevel=3, dtype=None):
    return input, dim, _stacklevel, dtype


def _bind_softmax(input, dim, dtype=None, *, out=None):
    return input, dim, dtype, out


# How many more frames than torch's F.softmax a route sits below the caller: torch's F.softmax passes its
# _stacklevel straight to _get_softmax_dim, two frames below the caller. The mode's path: F.softmax ->
# handle_torch_function -> FastActMode.__torch_function__ -> FastActMode._run -> route; a rebound
# function's path: the routed function (_Rebinder._routed) -> FastActMode._run -> route.
_MODE_FRAMES, _ROUTED_FRAMES = 4, 2


def _route_f_softmax(fn, name):
    def route(args, kwargs, frames):
        input, dim, stacklevel, dtype = _bind_f_softmax(*args, **kwargs)
        if not _takes(input) or (dtype is not None and dtype not in _FLOATING):
            return NotImplemented
        if dim is None:  # torch's implicit-dim rule, with its deprecation warning at the caller's line
            dim = F._get_softmax_dim(name, input.dim(), stacklevel + frames)
        dim = _as_dim(dim)
        if dim is None:
            return NotImplemented
        return fn(_torch_layout(input), dim, dtype=dtype)  # torch's output layout (fastact.nn._torch_layout)

    return route


def _route_softmax(fn):
    def route(args, kwargs, frames):
        input, dim, dtype, out = _bind_softmax(*args, **kwargs)
        dim = _as_dim(dim)
        if out is not None or dim is None or not _takes(input) or (dtype is not None and dtype not in _FLOATING):
            return NotImplemented
        return fn(_torch_layout(input), dim, dtype=dtype)

    return route


def _route_pointwise(op, signature):
    """The route of a pointwise row's torch function with Python signature `signature` (the table's): binds the
    call as torch would, leaves it to torch where an `out=` or `inplace=True` is given, the input is one fastact
    does not take or a param is not one the kernel takes; else calls the fastact function with the params."""
    names = [p.strip().split("=")[0] for p in signature.split(",")]
    params = [n for n in names[1:] if n not in ("*", "out", "inplace")]
    # the binder: torch's signature as a Python function, so positional and keyword calls normalise the same way
    source = (f"def bind({signature}):\n"
              f"    return input, {'out' if 'out' in names else 'None'}, {'inplace' if 'inplace' in names else 'False'}"
              f", ({''.join(p + ', ' for p in params)})\n")
    namespace = {}
    _define(source, namespace, f"fastact.patch binder of {op.name}: {signature}")
    bind, fn = namespace["bind"], getattr(fastact, op.name)
    choices = [p.choices for p in op.params if p.name in params]
    assert [p.name for p in op.params] == params, (op.name, signature)

    def route(args, kwargs, frames):
        input, out, inplace, values = bind(*args, **kwargs)
        if out is not None or inplace or not _takes(input):
            return NotImplemented
        for value, allowed in zip(values, choices):
            if value not in allowed:
                return NotImplemented
        return fn(input, *values)

    return route


def _route(op, fn, signature):
    if signature == "f_softmax":
        return _route_f_softmax(getattr(fastact, op.name), op.name)
    if signature == "softmax":
        return _route_softmax(getattr(fastact, op.name))
    return _route_pointwise(op, signature)


# torch function -> (op name, route), from the op table's routes. Tensor methods arrive as the TensorBase
# method descriptors (torch.Tensor.softmax is torch._C.TensorBase.softmax); torch.softmax is the
# _VariableFunctions builtin; F.gelu is torch._C._nn.gelu.
_ROUTES = {fn: (op.name, _route(op, fn, signature)) for op in _OPS for fn, signature in op.routes}


class FastActMode(TorchFunctionMode):
    """The mode behind :func:`patch`. ``counts`` counts the calls that fastact ran, ``fallbacks``
    those of the covered functions that went to torch, both by op name; they accumulate over every time the mode is entered."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()
        self.fallbacks = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        hit = _ROUTES.get(func)
        if hit is not None:
            return self._run(func, hit, args, kwargs, _MODE_FRAMES)
        # torch runs this handler with the mode off the stack: func reaches torch (or the next mode)
        # without coming back here.
        return func(*args, **kwargs)

    def _run(self, func, hit, args, kwargs, frames):
        """A call of the routed torch function `func` (its `_ROUTES` entry `hit`): fastact's op where it takes the
        call, else torch's function."""
        name, route = hit
        try:
            y = route(args, kwargs, frames)
        except TypeError:  # arguments torch's signature refuses: torch raises its own error below
            y = NotImplemented
        if y is not NotImplemented:
            self.counts[name] += 1
            return y
        self.fallbacks[name] += 1
        return func(*args, **kwargs)


def patch():
    """Context manager: inside ``with fastact.patch() as mode:`` the torch functions of fastact's
    ops (softmax, gelu, ...) run fastact's ops (see this module's docstring for the list and the
    fallbacks). ``mode.counts`` says how many calls fastact ran, by op."""
    return FastActMode()


# Module swaps: (old module) -> new fastact module, or None to leave it. Exact types only: a
# subclass may override forward with other math.
# torch.nn twin -> the fastact module made from it, for every row with a twin: the twin's attributes named as
# the fastact module's constructor arguments (dim=None, torch's deprecated implicit dim chosen per call from
# the input's rank, included: fastact.nn's modules apply the same rule, with the same warning).
def _swap(op):
    cls = getattr(_fnn, op.module)
    names = [p.name for p in inspect.signature(cls).parameters.values() if p.kind == p.POSITIONAL_OR_KEYWORD]
    return lambda m: cls(*(getattr(m, n) for n in names))


_TORCH_SWAPS = {op.torch_module: _swap(op) for op in _OPS if op.torch_module is not None}


def _transformers_swaps():
    """The transformers activation classes whose forward is exactly a fastact op, read off
    transformers/activations.py: an empty dict where transformers is not installed."""
    try:
        from transformers import activations as act
    except Exception:  # not installed, or broken in a way that is none of fastact's business
        return {}

    def gelu_activation(m):
        # GELUActivation: self.act is F.gelu, or _gelu_python: x * 0.5 * (1 + erf(x / sqrt(2))).
        f = getattr(m, "act", None)
        if f is F.gelu or getattr(f, "__func__", None) is getattr(act.GELUActivation, "_gelu_python", object()):
            return _fnn.GELU("none")
        return None

    def gelu_tanh(m):
        # GELUTanh: self.act is partial(F.gelu, approximate="tanh"), or _gelu_tanh_python, the same
        # formula as NewGELU.
        f = getattr(m, "act", None)
        if isinstance(f, functools.partial) and f.func is F.gelu and not f.args and f.keywords == {"approximate": "tanh"}:
            return _fnn.GELU("tanh")
        if getattr(f, "__func__", None) is getattr(act.GELUTanh, "_gelu_tanh_python", object()):
            return _fnn.GELU("tanh")
        return None

    swaps = {}
    if hasattr(act, "GELUActivation"):
        swaps[act.GELUActivation] = gelu_activation
    for name in ("GELUTanh", "PytorchGELUTanh"):  # PytorchGELUTanh: the older name (an alias now)
        if isinstance(getattr(act, name, None), type):
            swaps[getattr(act, name)] = gelu_tanh
    # 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))): tanh GELU, F.gelu(approximate="tanh").
    # FastGELU writes it x * 0.7978845608 * (1 + 0.044715 * x * x), the same polynomial with
    # sqrt(2 / pi) rounded at its 11th digit (3.6e-12 relative), far below float32's rounding.
    for name in ("NewGELUActivation", "AccurateGELUActivation", "FastGELUActivation"):
        if isinstance(getattr(act, name, None), type):
            swaps[getattr(act, name)] = lambda m: _fnn.GELU("tanh")
    # SiLUActivation (newer transformers' "silu"; "swish" is torch.nn.SiLU, a torch twin): F.silu(input).
    if isinstance(getattr(act, "SiLUActivation", None), type):
        swaps[act.SiLUActivation] = lambda m: _fnn.SiLU()
    # Not swapped: QuickGELU (x * sigmoid(1.702 x)), ClippedGELU (a clamp after), Mish, ...: no fastact op
    # computes them.
    return swaps


# The per-module hook tables a swap carries over, so hooks registered on an activation keep firing
# (and their handles keep removing them: a handle holds a weak reference to the table itself).
_HOOK_TABLES = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
                "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_backward_hooks",
                "_backward_pre_hooks")


def _swap_modules(model, swaps):
    replaced = collections.Counter()
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            make = swaps.get(type(child))
            new = make(child) if make is not None else None
            if new is None:
                continue
            new.train(child.training)
            for table in _HOOK_TABLES:
                if hasattr(child, table):
                    setattr(new, table, getattr(child, table))
            setattr(parent, name, new)
            replaced[type(child).__name__] += 1
    return replaced


_tls = threading.local()


def _enter(mode):
    def pre_hook(module, args):
        if _dynamo_tracing():
            # dynamo traces one call on one thread and inlines the mode (the graph holds no trace of it), so no
            # per-thread bookkeeping; torch 2.11's dynamo cannot trace threading.local's __dict__ either.
            mode.__enter__()
            return
        # One mode per thread however deep the nesting (a patched module called inside another, or
        # recursively): a mode on top of the same mode would only add its per-call cost.
        stack = _tls.__dict__.setdefault("modules", [])
        if not stack:
            mode.__enter__()
            _tls.mode = mode
        stack.append(module)

    return pre_hook


def _exit(mode):
    def hook(module, args, output):
        if _dynamo_tracing():
            mode.__exit__(None, None, None)
            return
        # always_call hooks run even where an earlier pre-hook raised before ours pushed: pop only our own.
        stack = _tls.__dict__.get("modules")
        if stack and stack[-1] is module:
            stack.pop()
            if not stack:
                _tls.mode.__exit__(None, None, None)
                _tls.mode = None

    return hook


# The attribute names by which code reaches a routed function (F.softmax, torch.softmax, x.softmax, F.gelu,
# torch.sigmoid, ...): what a function's bytecode names when it calls one.
_ROUTED_NAMES = frozenset(name for name, _ in _ROUTES.values())


def _code_names(code):
    """The global and attribute names a code object uses, its nested functions' and comprehensions' included."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _calls_routed(fn, owner, depth, seen):
    """Whether `fn` (a Python function) names a routed function, directly or through the functions and methods
    it names (module globals, methods of `owner`'s class), `depth` calls deep."""
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is None or fn in seen:
        return False
    seen.add(fn)
    # A decorated function (functools.wraps, as transformers decorates forwards) is its wrapper's code around the
    # original: both count, at the same depth.
    wrapped = getattr(fn, "__wrapped__", None)
    if wrapped is not None and _calls_routed(wrapped, owner, depth, seen):
        return True
    names = _code_names(code)
    if names & _ROUTED_NAMES:
        return True
    if depth == 0:
        return False
    scope = getattr(fn, "__globals__", {})
    callees = [scope.get(name) or (inspect.getattr_static(owner, name, None) if owner is not None else None)
               for name in names]
    callees += [cell.cell_contents for cell in fn.__closure__ or () if _cell_set(cell)]
    for callee in callees:
        if isinstance(callee, (staticmethod, classmethod)):
            callee = callee.__func__
        if isinstance(callee, types.FunctionType) and _calls_routed(callee, owner, depth - 1, seen):
            return True
    return False


def _cell_set(cell):
    try:
        cell.cell_contents
    except ValueError:  # an empty cell
        return False
    return True


def _holds_routed(module):
    """Whether the module keeps a routed function as an attribute (``self.act = F.gelu``, a partial of one, or one in a
    list, tuple or dict)."""
    return any(_holds(value) for value in vars(module).values())


def _holds(value):
    """Whether `value` is a routed function, a partial of one or a list, tuple, set or dict holding one."""
    if isinstance(value, dict):
        return any(_holds(v) for v in value.values())
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(_holds(v) for v in value)
    return _routed(value.func if isinstance(value, functools.partial) else value)


def _calling_modules(model):
    """The modules of `model` whose forward calls a routed function: its own code or the functions and methods it
    calls, two calls deep (a Hugging Face attention's forward calls ``eager_attention_forward``, which calls
    ``F.softmax``). fastact.nn modules are left out: they call fastact directly."""
    found = []
    for m in model.modules():
        cls = type(m)
        if cls.__module__ == _fnn.__name__:
            continue
        if _holds_routed(m) or _calls_routed(cls.forward, cls, 2, set()):
            found.append(m)
    return found


class _Uncovered(Exception):
    """A routed function reached in a way that copies with other globals cannot redirect (a Tensor method, a function
    used as a value, a call through super() or a property, a call deeper than the search): the module keeps the
    mode."""


_MISSING = object()
_ACTIVE = object()  # a function whose copy is being made (a call back into it is a recursion)
_METHOD_BIT_ATTR = sys.version_info >= (3, 12)  # LOAD_ATTR's low bit marks a method load (3.11: LOAD_METHOD)


def _routed(value):
    try:
        return value in _ROUTES
    except TypeError:  # unhashable
        return False


def _called(ins):
    """Whether a LOAD_GLOBAL / LOAD_ATTR / LOAD_METHOD loads its value to call it at once (``F.softmax(x)``, not
    ``fn = F.softmax`` or ``fn is F.gelu``): the call form pushes NULL / self with it. (A call of an attribute of an
    imported name, ``F.softmax(x)``, pushes the NULL with the name: the LOAD_GLOBAL at the chain's root.)"""
    if ins.opname == "LOAD_METHOD":
        return True
    if ins.opname == "LOAD_GLOBAL" or (ins.opname == "LOAD_ATTR" and _METHOD_BIT_ATTR):
        return bool(ins.arg & 1)
    return False


def _nested_codes(code):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _nested_codes(const)


def _reaches(fn, owner=None):
    """Whether Python function `fn` may call a routed function, four calls deep: what the copies must not miss."""
    fn = fn.__func__ if isinstance(fn, (staticmethod, classmethod)) else fn
    return isinstance(fn, types.FunctionType) and _calls_routed(fn, owner, 4, set())


class _Rebinder:
    """Routes an attention's functional calls through copies of its functions instead of the mode.

    An eager attention reaches ``F.softmax`` as ``nn.functional.softmax`` (or ``F.softmax``, ``torch.softmax``) in
    its forward, in a module-level function the forward calls (transformers' ``eager_attention_forward``) or in a
    method (GPT-2's ``_upcast_and_reordered_attn``). A copy of such a function shares its code and closure and has a
    copy of its module's globals in which the root of that name (``nn``, ``F``, ``torch``) is a stand-in module: the
    real module's attributes, the routed functions replaced by fastact's routes (``FastActMode._run``: the same
    checks and fallbacks as the mode), and the functions it calls that need the same replaced by their copies. The
    module's class becomes a subclass of it (same name) holding the copied methods, as torch.nn.utils.parametrize
    does; nothing is paid per torch call, where the mode costs every torch call of the forward ~1-7 us.

    Only calls the bytecode shows are redirected: a routed function reached any other way (``x.softmax(...)``, a
    function used as a value or held in an attribute, container or default, a torch function that calls one, a call
    through super(), a class name or a property, a submodule or function beyond the search, code that writes
    globals or reads ``__name__``) raises _Uncovered, and the module keeps the mode."""

    def __init__(self, mode):
        self.mode = mode
        self.stand_ins = {}  # id(real module) -> (real module, its stand-in)
        self.wrappers = {}  # routed torch function -> the function the stand-ins hold instead
        self.subclasses = {}  # module class -> its subclass with the copies, or None: keep the mode
        self.reaching = {}  # module class -> whether its forward may reach a routed function (_reaches)

    def install(self, module, callers):
        """Gives `module` the copies (its class becomes the subclass holding them); False where it keeps the mode.
        `callers`: the modules that get copies or the mode themselves."""
        cls = type(module)
        if getattr(cls, "_fastact_routes", None) is not None:  # copied by an earlier apply, counting into its mode
            return True
        if cls not in self.subclasses:
            try:
                methods = self._methods(cls)
            except _Uncovered:
                methods = None
            self.subclasses[cls] = self._subclass(cls, methods) if methods else None
        sub = self.subclasses[cls]
        # an instance attribute (a method the user replaced on this module, a function held) wins over the class
        if sub is None or _holds_routed(module) or any(name in vars(module) for name in sub._fastact_routes):
            return False
        # a submodule whose forward reaches a routed function, and that gets neither copies nor a mode of its own,
        # ran inside the mode around this forward: this module keeps it
        for d in module.modules():
            if d is not module and d not in callers and type(d).__module__ != _fnn.__name__:
                if type(d) not in self.reaching:
                    self.reaching[type(d)] = _reaches(type(d).forward, type(d))
                if self.reaching[type(d)]:
                    return False
        module.__class__ = sub
        return True

    def _methods(self, cls):
        copies, methods = {}, {}
        forward = self._copy(cls.forward, cls, 2, copies, methods)
        if forward is not None:
            methods["forward"] = forward
        return methods

    def _subclass(self, cls, methods):
        ns = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "_fastact_routes": tuple(methods)}
        for name, fn in methods.items():
            static = inspect.getattr_static(cls, name)
            ns[name] = staticmethod(fn) if isinstance(static, staticmethod) else (
                classmethod(fn) if isinstance(static, classmethod) else fn)
        return type(cls)(cls.__name__, (cls,), ns)

    def _copy(self, fn, owner, depth, copies, methods):
        """The copy of Python function `fn` whose globals (and closure, and those of the functions it calls,
        `depth` calls deep) reach fastact's routes, or None where it reaches no routed function. Methods of
        `owner` that need a copy go into `methods`."""
        fn = getattr(fn, "__func__", fn)
        if not isinstance(fn, types.FunctionType):
            return None
        key = (fn, depth)
        if key in copies:
            return None if copies[key] is _ACTIVE else copies[key]
        copies[key] = _ACTIVE
        defaults = (fn.__defaults__ or ()) + tuple((fn.__kwdefaults__ or {}).values())
        if any(_holds(d) or _reaches(d) for d in defaults):
            raise _Uncovered
        scope = fn.__globals__
        replace = {}
        for code in _nested_codes(fn.__code__):
            chain = None  # (global name, module reached, attribute path, root loaded to call) while a.b.c walks modules
            for ins in dis.get_instructions(code):
                op, name = ins.opname, ins.argval
                if op in ("STORE_GLOBAL", "DELETE_GLOBAL") or (op == "LOAD_GLOBAL" and name in ("__name__", "globals")):
                    raise _Uncovered  # the copy's globals are a snapshot without __name__
                if op == "LOAD_GLOBAL":
                    value = scope.get(name, _MISSING)
                    chain = (name, value, (), _called(ins)) if isinstance(value, (types.ModuleType, type)) else None
                    if _routed(value):
                        if not _called(ins):
                            raise _Uncovered
                        replace[name] = self._wrapper(value)
                    elif isinstance(value, types.FunctionType):
                        self._callee(value, None, depth, copies, methods, replace, name)
                    elif _holds(value):  # a table of activations
                        raise _Uncovered
                elif op in ("LOAD_ATTR", "LOAD_METHOD", "LOAD_SUPER_ATTR"):
                    if chain is not None and isinstance(chain[1], type):  # SomeClass.name: the original class's
                        if _reaches(inspect.getattr_static(chain[1], name, None), chain[1]):
                            raise _Uncovered
                        chain = None
                    elif chain is not None:
                        root, mod, path, root_called = chain
                        target = getattr(mod, name, None)
                        path += (name,)
                        chain = (root, target, path, root_called) if isinstance(target, types.ModuleType) else None
                        if _routed(target):
                            if not (_called(ins) or root_called):
                                raise _Uncovered
                            replace[root] = self._stand_in(scope[root], path[:-1])
                        elif _reaches(target) or _holds(target):  # a torch function that calls one (F.sigmoid)
                            raise _Uncovered
                    else:
                        if name in _ROUTED_NAMES:  # x.softmax(...), self.act(...), ...
                            raise _Uncovered
                        if owner is not None:
                            self._attribute(owner, name, depth, copies, methods)
                else:
                    chain = None
                    # an import of one inside the function, a closure's name, ...
                    if isinstance(name, str) and name in _ROUTED_NAMES:
                        raise _Uncovered
        closure = fn.__closure__
        if closure:
            cells = []
            for cell in closure:
                content = cell.cell_contents if _cell_set(cell) else None
                if _holds(content):
                    raise _Uncovered
                # a decorator's wrapper holds the decorated function in its closure: the same depth
                new = self._copy(content, owner, depth, copies, methods) if isinstance(content, types.FunctionType) else None
                cells.append(cell if new is None else types.CellType(new))
            if any(c is not old for c, old in zip(cells, closure)):
                closure = tuple(cells)
        if not replace and closure is fn.__closure__:
            copies[key] = None
            return None
        # No __name__ in the copied globals: dynamo reaches a function's globals through sys.modules[__name__] where
        # there is one (the real module, whose nn is torch.nn), and through the dict itself where there is none.
        scope = {k: v for k, v in scope.items() if k != "__name__"}
        copy = types.FunctionType(fn.__code__, {**scope, **replace}, fn.__name__, fn.__defaults__, closure)
        copy.__kwdefaults__ = fn.__kwdefaults__
        copy.__dict__.update(fn.__dict__)
        copy.__qualname__, copy.__doc__, copy.__module__ = fn.__qualname__, fn.__doc__, fn.__module__
        wrapped = copies.get((getattr(fn, "__wrapped__", None), depth))
        if wrapped is not None and wrapped is not _ACTIVE:  # a copy made, not one still being made up the chain
            copy.__wrapped__ = wrapped
        copies[key] = copy
        return copy

    def _attribute(self, owner, name, depth, copies, methods):
        """`name` loaded from an object (``self.name``, ``super().name``, ``other.name``): where `owner`'s classes
        define it, the definition ``self.name`` finds is copied into the subclass if it needs to be; one that only
        super() reaches, or a property, must reach no routed function."""
        found = [c.__dict__[name] for c in owner.__mro__ if name in c.__dict__]
        for i, attr in enumerate(found):
            if isinstance(attr, property):
                if any(_reaches(f, owner) for f in (attr.fget, attr.fset, attr.fdel)):
                    raise _Uncovered
            elif i == 0 and isinstance(attr, (types.FunctionType, staticmethod, classmethod)):
                self._callee(getattr(attr, "__func__", attr), owner, depth, copies, methods, None, name)
            elif _reaches(attr, owner):
                raise _Uncovered

    def _callee(self, fn, owner, depth, copies, methods, replace, name):
        """A function that `fn`'s code calls (a module global, or a method of `owner` reached through self)."""
        known = [v for (f, d), v in copies.items() if f is fn and d >= depth - 1]
        if known:  # searched higher up already (or being searched: a call back into it)
            copy = known[0]
            if copy is _ACTIVE:
                if replace is not None:  # a global function called back before its copy exists
                    raise _Uncovered
                return  # a method: self.name finds the copy in the subclass
        elif depth == 0:
            # beyond the search: it must not reach a routed function either, or the copy would miss that call
            if _reaches(fn, owner):
                raise _Uncovered
            return
        else:
            copy = self._copy(fn, owner, depth - 1, copies, methods)
        if copy is None:
            return
        if replace is None:
            methods[name] = copy
        else:
            replace[name] = copy

    def _stand_in(self, module, path=()):
        """The stand-in for `module`, with the stand-ins of its submodules along `path` (torch -> nn -> functional)."""
        hit = self.stand_ins.get(id(module))
        if hit is None:
            stand_in = types.ModuleType(module.__name__, module.__doc__)
            for k, v in vars(module).items():
                if k not in ("__name__", "__doc__"):
                    stand_in.__dict__[k] = self._wrapper(v) if _routed(v) else v
            # what the real module makes on first use (torch's lazy submodules) comes from it
            stand_in.__dict__["__getattr__"] = functools.partial(getattr, module)
            hit = self.stand_ins[id(module)] = (module, stand_in)
        stand_in = hit[1]
        if path:
            setattr(stand_in, path[0], self._stand_in(getattr(module, path[0]), path[1:]))
        return stand_in

    def _wrapper(self, func):
        routed = self.wrappers.get(func)
        if routed is None:
            run, hit = self.mode._run, _ROUTES[func]

            def routed(*args, **kwargs):
                return run(func, hit, args, kwargs, _ROUTED_FRAMES)

            functools.update_wrapper(routed, func)  # torch's name, doc and (through __wrapped__) signature
            self.wrappers[func] = routed
        return routed


def apply(model, *, functional=True):
    """Puts fastact into ``model`` in place: returns ``(model, replaced)``.

    Swaps every module whose forward is exactly a fastact op (each op's torch module twin:
    ``nn.Softmax``, ``nn.GELU``, ...; transformers' erf and tanh GELU classes) for the
    ``fastact.nn`` module with the same arguments; ``replaced`` counts the swaps by the
    old class's name. With ``functional=True`` the calls of ``F.softmax`` / ``F.gelu`` /
    ``torch.sigmoid`` / ... in the forwards (the softmax of an eager attention) route to fastact too;
    ``model.fastact_mode.counts`` counts them. Which forwards: those of the submodules whose code names
    one of the covered functions, directly or two calls deep (found once, here, from their bytecode).
    Where that code calls the function through a module global (``nn.functional.softmax``,
    ``F.gelu``, ``torch.sigmoid``), the module's class becomes a subclass of it (same name) holding
    copies of its forward and of the functions and methods in between that call fastact instead, at no
    cost per call; otherwise (``x.softmax()``, a function held in an attribute, ...: see
    ``_Rebinder``) its forward runs inside :func:`patch` (the whole model's forward where no such
    module is found). The rest of the model runs as before. Applying twice swaps nothing more and adds
    nothing. An applied model does not pickle (its copies are no importable class): pickle or save the
    ``state_dict``, or the model before ``apply``."""
    replaced = _swap_modules(model, {**_TORCH_SWAPS, **_transformers_swaps()})
    if functional and getattr(model, "fastact_mode", None) is None:
        mode = FastActMode()
        model.fastact_mode = mode
        rebinder = _Rebinder(mode)
        callers = _calling_modules(model)
        found = set(callers)
        for m in [m for m in callers if not rebinder.install(m, found)] if callers else [model]:
            m.register_forward_pre_hook(_enter(mode))
            # always_call: the mode leaves the stack even when the forward raises.
            m.register_forward_hook(_exit(mode), always_call=True)
    return model, replaced


class OpCounter(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the ``fastact::`` ops the dispatcher runs (forward and backward), by op name: the
    proof that fastact's kernels ran, whatever path the call took. For tests and diagnosis (every op
    passes through Python while it is active: slow)."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "fastact":
            self.counts[func._opname] += 1
        return func(*args, **(kwargs or {}))
