"""The eager entry points (csrc/eager.cpp): fastact's Python functions call _C's unboxed entry for a
plain tensor and fall back to the OpOverload for everything else. Both paths must give the same
results, errors, autograd and dispatch-mode behaviour; these tests check that each path is the one
taken where it should be, and that what the fast path skips (Python argument handling) is all it
skips."""

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import fastact
from fastact._ops import _C
from fastact._optable import OPS as TABLE
from fastact_testing import assert_close, make_tensor

ops = torch.ops.fastact

# (public call, _C entry call, OpOverload call, torch reference) per op, on x (and bias b): the softmax family and
# the bias op by hand, every pointwise row of the op table at its last params (gelu: "tanh")
CASES = {
    "softmax": (lambda x, b: fastact.softmax(x, 1), lambda x, b: _C.softmax(x, 1),
                lambda x, b: ops.softmax.default(x, 1, None), lambda x, b: torch.softmax(x, 1)),
    "log_softmax": (lambda x, b: fastact.log_softmax(x, -1), lambda x, b: _C.log_softmax(x, -1),
                    lambda x, b: ops.log_softmax.default(x, -1, None), lambda x, b: torch.log_softmax(x, -1)),
    "bias_gelu": (lambda x, b: fastact.bias_gelu(x, b), lambda x, b: _C.bias_gelu(x, b, "tanh"),
                  lambda x, b: ops.bias_gelu.default(x, b, "tanh"),
                  lambda x, b: torch.nn.functional.gelu(x + b, approximate="tanh")),
}


def _pointwise_case(op):
    params = op.variants[-1][1]
    v = tuple(params.values())
    return (lambda x, b: getattr(fastact, op.name)(x, *v), lambda x, b: getattr(_C, op.name)(x, *v),
            lambda x, b: getattr(ops, op.name).default(x, *v), lambda x, b: op.torch_fn(x, **params))


CASES.update({op.name: _pointwise_case(op) for op in TABLE if op.kind == "pointwise"})


def _inputs(device, dtype=torch.float32, requires_grad=False):
    x = make_tensor((6, 40), dtype, device).requires_grad_(requires_grad)
    b = make_tensor((40,), dtype, device).requires_grad_(requires_grad)
    return x, b


@pytest.mark.parametrize("name", CASES)
def test_entry_takes_plain_tensors(device, dtype, name):
    public, entry, overload, ref = CASES[name]
    x, b = _inputs(device, dtype)
    y = entry(x, b)
    assert isinstance(y, torch.Tensor), y
    assert torch.equal(y, overload(x, b)), "the entry and the OpOverload run the same kernel"
    assert torch.equal(public(x, b), y)
    assert_close(y, ref(x.double(), b.double()), dtype, torch_actual=ref(x, b))


@pytest.mark.parametrize("name", CASES)
def test_entry_declines_subclasses(device, name):
    _, entry, _, _ = CASES[name]
    x, b = _inputs(device)
    assert entry(x.as_subclass(_Sub), b) is NotImplemented
    if name == "bias_gelu":
        assert entry(x, b.as_subclass(_Sub)) is NotImplemented
    assert entry(torch.nn.Parameter(x), torch.nn.Parameter(b)) is not NotImplemented  # Parameter is plain


@pytest.mark.parametrize("name", CASES)
def test_public_function_takes_the_entry(device, name, monkeypatch):
    # with the OpOverload fallback made to fail, a plain tensor still works: the entry ran
    public, _, _, ref = CASES[name]
    for op in TABLE:
        monkeypatch.setitem(fastact._OVERLOADS, op.name, _refuse)
    x, b = _inputs(device)
    assert_close(public(x, b), ref(x.double(), b.double()), torch.float32)
    with pytest.raises(AssertionError, match="fallback"):
        public(x.as_subclass(_Sub), b)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_entry_takes_softmax_dtype(device, name, monkeypatch):
    """softmax's dtype= goes through the entry as well (the fused cast among them); anything but None
    or a torch.dtype declines, and the OpOverload decides."""
    entry, public, overload = getattr(_C, name), getattr(fastact, name), getattr(ops, name).default
    x = make_tensor((6, 40), torch.bfloat16, device)
    for dt in (None, torch.float32, torch.bfloat16, torch.float64):
        y = entry(x, 1, dt)
        assert y.dtype == (dt or x.dtype) and torch.equal(y, overload(x, 1, dt)), dt
    assert entry(x, 1, "float32") is NotImplemented
    assert entry(x, 1, torch.float32.itemsize) is NotImplemented
    with pytest.raises(TypeError, match="2 to 3 positional"):
        entry(x)
    for op in ("softmax", "log_softmax"):
        monkeypatch.setitem(fastact._OVERLOADS, op, _refuse)
    assert torch.equal(public(x, 1, dtype=torch.float32), overload(x, 1, torch.float32))  # the entry ran


def test_entry_declines_transforms_and_tangents(device):
    """Under a torch.func transform, or for a tensor with a forward-mode tangent, the entry declines:
    the C++ autograd Functions cannot take those, fastact/_functorch.py does."""
    import torch.autograd.forward_ad as fwAD

    x, b = _inputs(device)
    declined = []

    def f(t):
        declined.extend(entry(t, b) is NotImplemented for _, entry, _, _ in CASES.values())
        return fastact.softmax(t, 1).sum()

    torch.func.grad(f)(x)
    assert declined and all(declined), declined
    with fwAD.dual_level():
        xd, bd = fwAD.make_dual(x, torch.ones_like(x)), fwAD.make_dual(b, torch.ones_like(b))
        for _, entry, _, _ in CASES.values():
            assert entry(xd, b) is NotImplemented
        assert _C.bias_gelu(x, bd, "tanh") is NotImplemented
    for _, entry, _, _ in CASES.values():  # and takes plain tensors again after
        assert entry(x, b) is not NotImplemented


def _refuse(*args, **kwargs):
    raise AssertionError("the OpOverload fallback ran")


class _Sub(torch.Tensor):
    pass


class _Recorder(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen.append(func)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", CASES)
def test_torch_function_mode_sees_the_op(device, name):
    # under a mode the entry declines and the OpOverload runs, so the mode sees the fastact op
    public, entry, _, ref = CASES[name]
    x, b = _inputs(device)
    with _Recorder() as mode:
        assert entry(x, b) is NotImplemented
        y = public(x, b)
    assert any(getattr(f, "namespace", None) == "fastact" for f in mode.seen), mode.seen
    assert_close(y, ref(x.double(), b.double()), torch.float32)


class _Dispatches(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", CASES)
def test_dispatch_mode_sees_the_op(device, name):
    # the entry goes through the dispatcher, so dispatch modes (below autograd) see the op as well
    public, entry, _, _ = CASES[name]
    x, b = _inputs(device)
    with _Dispatches() as mode:
        y = entry(x, b)
    assert isinstance(y, torch.Tensor)
    assert any(s.startswith(f"fastact.{name}") for s in mode.seen), mode.seen


class _Wrapper(torch.Tensor):
    """A __torch_function__ subclass that records what reaches it."""

    seen = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.seen.append(func)
        return super().__torch_function__(func, types, args, kwargs or {})


def test_subclass_torch_function_sees_the_op(device):
    x = make_tensor((4, 9), torch.float32, device).as_subclass(_Wrapper)
    _Wrapper.seen.clear()
    y = fastact.softmax(x, -1)
    assert type(y) is _Wrapper
    assert ops.softmax.default in _Wrapper.seen


@pytest.mark.parametrize("name", CASES)
def test_entry_autograd(device, name):
    public, _, overload, _ = CASES[name]
    x, b = _inputs(device, requires_grad=True)
    g = make_tensor((6, 40), torch.float32, device)
    y = public(x, b)
    assert y.grad_fn is not None
    fast = torch.autograd.grad(y, [x, b] if name == "bias_gelu" else [x], g)
    slow = torch.autograd.grad(overload(x, b), [x, b] if name == "bias_gelu" else [x], g)
    for a, e in zip(fast, slow):
        assert torch.equal(a, e)


def test_entry_inference_and_no_grad(device):
    x, _ = _inputs(device, requires_grad=True)
    with torch.no_grad():
        assert fastact.softmax(x, 1).grad_fn is None
    with torch.inference_mode():
        y = fastact.softmax(x, 1)
    assert y.is_inference()


@pytest.mark.parametrize(
    "name,args,err,match",
    [
        ("softmax", lambda x: (x, 2), IndexError, "out of range"),
        ("softmax", lambda x: (x.int(), 1), RuntimeError, "floating point"),
        ("log_softmax", lambda x: (x.to(torch.complex64), -1), RuntimeError, "floating point"),
        ("gelu", lambda x: (x, "fast"), RuntimeError, "approximate"),
        ("bias_gelu", lambda x: (x, x[0, :3], "tanh"), RuntimeError, "bias"),
    ] + [(op.name, lambda x, v=tuple(op.variants[0][1].values()): (x.to(torch.complex64), *v), RuntimeError,
          "floating point") for op in TABLE if op.kind == "pointwise"],
)
def test_entry_errors_match_the_overload(device, name, args, err, match):
    # the entry raises what the OpOverload raises: the same exception type and message
    x, _ = _inputs(device)
    overload = getattr(ops, name).default
    a = args(x)
    with pytest.raises(err, match=match) as slow:
        overload(*a) if name not in ("softmax", "log_softmax") else overload(*a, None)
    with pytest.raises(err, match=match) as fast:
        getattr(_C, name)(*a)
    assert str(fast.value) == str(slow.value)


def test_unusual_arguments_fall_back(device):
    x, _ = _inputs(device)
    assert _C.softmax(x, 1.0) is NotImplemented
    assert _C.softmax(x, 2**70) is NotImplemented
    assert _C.gelu(x, b"tanh") is NotImplemented
    assert _C.softmax([1.0, 2.0], 0) is NotImplemented
    assert _C.softmax(x, True) is NotImplemented  # bool is not int here; the OpOverload decides
    assert _C.softmax(x, -(2**70)) is NotImplemented

    class Name(str):
        pass

    assert _C.gelu(x, Name("tanh")) is NotImplemented
    assert torch.equal(fastact.gelu(x, Name("tanh")), _C.gelu(x, "tanh"))
    with pytest.raises(TypeError, match="must be int, not float"):
        fastact.softmax(x, 1.0)  # torch's argument error, raised before the OpOverload
    with pytest.raises(TypeError, match="positional"):
        _C.sigmoid()
