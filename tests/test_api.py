"""The public functions take what their torch twins take, with torch's semantics, or refuse with torch's error
kind: the parameters of each twin's signature (inspect for Python functions, the aten schema for builtins), torch's
implicit softmax dim and its warning, and TypeError for arguments of the wrong type (dim=None / float / bool / str /
non-0-d tensors where an int is due, approximate=None)."""

import inspect
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fastact
from fastact._optable import OPS

# fastact function -> its torch twin (a Python function whose signature inspect reads, or an aten op whose schema
# names the arguments; `self` is `input` in Python): every row of the op table with a twin.
TWINS = {op.name: op.signature_twin for op in OPS if op.signature_twin is not None}


def _twin_parameters(twin):
    if isinstance(twin, torch._ops.OpOverload):
        return [("input" if a.name == "self" else a.name, a.default_value if a.has_default_value() else inspect._empty)
                for a in twin._schema.arguments]
    return [(p.name, p.default) for p in inspect.signature(twin).parameters.values()]


@pytest.mark.parametrize("name", sorted(TWINS))
def test_signature_covers_the_twin(name):
    """Every parameter of the torch twin exists in fastact's function with the same default and can be passed the
    way torch allows (by keyword; positionally at the same position where torch's is positional)."""
    ours = inspect.signature(getattr(fastact, name)).parameters
    theirs = _twin_parameters(TWINS[name])
    for i, (pname, default) in enumerate(theirs):
        assert pname in ours, f"fastact.{name} lacks torch's parameter {pname!r}"
        p = ours[pname]
        assert p.default == default, f"fastact.{name}({pname}=...) defaults to {p.default!r}, torch to {default!r}"
        assert p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY), f"fastact.{name}: {pname} cannot be a keyword"
    if not isinstance(TWINS[name], torch._ops.OpOverload):  # Python twins: positions agree too
        assert [p for p in ours][: len(theirs)] == [p for p, _ in theirs], (list(ours), theirs)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("ndim", [0, 1, 2, 3, 4])
def test_implicit_dim(name, ndim):
    """dim=None (the default) is F.softmax's deprecated implicit dim, with the same warning at the caller's line."""
    x = torch.randn((2, 3, 4, 5)[:ndim])
    with warnings.catch_warnings(record=True) as ours:
        warnings.simplefilter("always")
        y = getattr(fastact, name)(x)
    with warnings.catch_warnings(record=True) as theirs:
        warnings.simplefilter("always")
        want = getattr(F, name)(x)
    torch.testing.assert_close(y, want)
    assert [str(w.message) for w in ours] == [str(w.message) for w in theirs]
    assert [w.filename for w in ours] == [__file__], [w.filename for w in ours]


def test_positional_stacklevel_and_dtype():
    """F.softmax(input, dim, _stacklevel, dtype), all positional."""
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    torch.testing.assert_close(fastact.softmax(x, 1, 3, torch.float32), F.softmax(x, 1, 3, torch.float32))
    torch.testing.assert_close(fastact.log_softmax(x, 0, 5, torch.float64), F.log_softmax(x, 0, 5, torch.float64))


def _outcome(f):
    try:
        f()
        return None
    except Exception as e:  # noqa: BLE001
        return type(e)


DIMS = [torch.tensor(0.7), np.float32(0.7), True, False, np.bool_(True), torch.tensor([1]), torch.tensor(True), 1.0,
        "1", torch.tensor(1), np.int64(1), np.int32(-1), 1, -1, 2**63, -2**63 - 1, np.uint64(2**63)]


@pytest.mark.parametrize("dim", DIMS, ids=repr)
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_dim_types(name, dim):
    """An int dim as torch parses one: ints, numpy integers and 0-d integer tensors; anything else (floats, bools,
    strings, other tensors) is a TypeError, never silently truncated."""
    x = torch.randn(2, 3)
    want = _outcome(lambda: getattr(F, name)(x, dim))
    got = _outcome(lambda: getattr(fastact, name)(x, dim))
    if isinstance(dim, str) and want is RuntimeError:
        # torch 2.11 takes a str as a dimension name (named tensors: "Name '1' not found"), 2.13 refuses it with a
        # TypeError; fastact has no named dims and gives the TypeError on every version.
        want = TypeError
    assert got is want, f"fastact.{name}(x, {dim!r}): {got}, torch: {want}"
    if want is None:
        torch.testing.assert_close(getattr(fastact, name)(x, dim), getattr(F, name)(x, dim))


@pytest.mark.parametrize("value", [None, [1.0, 2.0], 1.5, np.ones(3, np.float32), torch.Tensor], ids=repr)
@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_non_tensor_arguments(op, value):
    """A tensor argument given anything else is torch's TypeError naming the argument, as the twin gives it (not the
    dispatcher's RuntimeError about the schema)."""
    x = torch.randn(3)
    tensors = {"input": x, "bias": torch.zeros(3)}
    extra = (0,) if op.kind == "softmax" else ()
    for i, name in enumerate(op.tensors):
        args = [value if n == name else tensors[n] for n in op.tensors]
        with pytest.raises(TypeError, match=rf"^{op.name}\(\): argument '{name}' \(position {i + 1}\) must be Tensor"):
            getattr(fastact, op.name)(*args, *extra)
    if op.torch_fn is not None and op.kind != "bias":
        assert _outcome(lambda: op.torch_fn(value, *extra)) in (TypeError, AttributeError)  # F.softmax: AttributeError


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64], ids=str)
@pytest.mark.parametrize("op", [op for op in OPS if op.torch_fn is not None], ids=lambda op: op.name)
def test_unsupported_dtypes_raise_torch_kind(op, dtype):
    """An input dtype the kernels lack raises what torch's function raises for it (NotImplementedError: "... not
    implemented for 'Long'"), where torch refuses it; where torch computes it (sigmoid of integers) fastact does too."""
    x = torch.arange(6).reshape(2, 3).to(dtype)
    args = (x, torch.zeros(3, dtype=dtype)) if op.kind == "bias" else (x, 1) if op.kind == "softmax" else (x,)
    twin = (lambda x, b: F.gelu(x + b, approximate="tanh")) if op.kind == "bias" else op.torch_fn
    want = _outcome(lambda: twin(*args))
    got = _outcome(lambda: getattr(fastact, op.name)(*args))
    if want is None and got is not None:  # torch computes complex sigmoid / silu; fastact refuses (README)
        assert dtype.is_complex and got is NotImplementedError, (got, want)
    else:
        assert got is want, (got, want)
    if op.kind == "softmax":  # a dtype the kernels lack
        y = torch.randn(2, 3)
        assert _outcome(lambda: getattr(fastact, op.name)(y, 1, dtype=torch.int32)) is \
            _outcome(lambda: op.torch_fn(y, 1, dtype=torch.int32)) is NotImplementedError


@pytest.mark.parametrize("approximate", [None, 1, b"tanh", "bad"], ids=repr)
def test_approximate_types(approximate):
    """str as torch's parser takes it (bytes too); None or an int is a TypeError, an unknown name a RuntimeError."""
    x = torch.randn(5)
    want = _outcome(lambda: F.gelu(x, approximate=approximate))
    assert _outcome(lambda: fastact.gelu(x, approximate=approximate)) is want
    assert _outcome(lambda: fastact.bias_gelu(x, torch.zeros(5), approximate)) is want


@pytest.mark.parametrize("dtype", ["float32", 1, torch.float32.itemsize], ids=repr)
def test_dtype_argument_types(dtype):
    x = torch.randn(2, 3)
    want = _outcome(lambda: F.softmax(x, 1, dtype=dtype))
    assert want is TypeError
    assert _outcome(lambda: fastact.softmax(x, 1, dtype=dtype)) is want


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_implicit_dim_compiles(name):
    """dim=None under torch.compile(fullgraph=True), as F.softmax compiles (dynamo cannot trace the warning)."""
    x = torch.randn(2, 3, 4)
    f = torch.compile(lambda t: getattr(fastact, name)(t), fullgraph=True, backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(f(x), getattr(F, name)(x))
