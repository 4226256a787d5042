"""fastact.nn modules: drop-ins for torch.nn.Softmax, LogSoftmax, GELU and Sigmoid (the same
constructor, semantics, warnings, repr, state dict and pickling), and BiasGELU with its own (learnable)
bias."""

import copy
import inspect
import io
import math
import pickle
import warnings

import pytest
import torch

import fastact
from fastact._optable import OPS as TABLE
from fastact_testing import assert_close, make_tensor

# the pointwise rows of the op table with a torch module twin, and each at every value of its params:
# (id, fastact module constructor, torch module constructor)
POINTWISE = [op for op in TABLE if op.kind == "pointwise" and op.torch_module is not None]
POINTWISE_MODULES = [
    ("-".join([op.module, *params.values()]), lambda op=op, v=tuple(params.values()): getattr(fastact.nn, op.module)(*v),
     lambda op=op, v=tuple(params.values()): op.torch_module(*v))
    for op in POINTWISE for _, params in op.variants
]


@pytest.mark.parametrize(
    "make_fa,make_pt",
    [
        (lambda: fastact.nn.Softmax(1), lambda: torch.nn.Softmax(1)),
        (lambda: fastact.nn.Softmax(-1), lambda: torch.nn.Softmax(-1)),
        (lambda: fastact.nn.LogSoftmax(0), lambda: torch.nn.LogSoftmax(0)),
        (lambda: fastact.nn.LogSoftmax(dim=-1), lambda: torch.nn.LogSoftmax(dim=-1)),
        (lambda: fastact.nn.GELU(approximate="none"), lambda: torch.nn.GELU(approximate="none")),
    ] + [(fa, pt) for _, fa, pt in POINTWISE_MODULES],
    ids=["Softmax1", "Softmax", "LogSoftmax0", "LogSoftmax", "GELU-none-keyword"] + [i for i, _, _ in POINTWISE_MODULES],
)
def test_module_matches_torch(device, dtype, make_fa, make_pt):
    m_fa, m_pt = make_fa(), make_pt()
    assert list(m_fa.parameters()) == []
    x = make_tensor((4, 7, 33), dtype, device, "transposed", scale=2.0)
    x_fa, x_pt, x_ref = x.detach().requires_grad_(), x.detach().requires_grad_(), x.detach().double().requires_grad_()
    y_fa, y_pt, y_ref = m_fa(x_fa), m_pt(x_pt), m_pt(x_ref)
    assert_close(y_fa, y_ref, torch_actual=y_pt, msg=repr(m_fa))
    assert y_fa.stride() == y_pt.stride(), (repr(m_fa), y_fa.stride(), y_pt.stride())  # torch's layout
    assert "fastact" in y_fa.grad_fn.name(), y_fa.grad_fn.name()  # the op's own node: no copy after it
    g = make_tensor(tuple(y_fa.shape), dtype, device)
    y_fa.backward(g), y_pt.backward(g), y_ref.backward(g.double())
    assert_close(x_fa.grad, x_ref.grad, torch_actual=x_pt.grad, msg=f"{m_fa!r} grad")
    assert x_fa.grad.stride() == x_pt.grad.stride(), (repr(m_fa), x_fa.grad.stride(), x_pt.grad.stride())


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_bias_gelu_module(device, dtype, approximate):
    m = fastact.nn.BiasGELU(33, approximate=approximate, device=device, dtype=dtype)
    params = dict(m.named_parameters())
    assert list(params) == ["bias"]
    assert m.bias.shape == (33,) and m.bias.dtype == dtype and m.bias.device.type == device and m.bias.requires_grad
    assert torch.equal(m.bias, torch.zeros_like(m.bias))  # documented initialisation
    with torch.no_grad():
        m.bias.copy_(make_tensor((33,), dtype, device))
    x = make_tensor((5, 6, 33), dtype, device, scale=2.0).requires_grad_()
    y = m(x)
    b_ref = m.bias.detach().double().requires_grad_()
    x_ref = x.detach().double().requires_grad_()
    y_ref = torch.nn.functional.gelu(x_ref + b_ref, approximate=approximate)
    b_pt = m.bias.detach().requires_grad_()
    x_pt = x.detach().requires_grad_()
    y_pt = torch.nn.functional.gelu(x_pt + b_pt, approximate=approximate)
    assert_close(y, y_ref, torch_actual=y_pt)
    g = make_tensor(tuple(y.shape), dtype, device)
    y.backward(g), y_ref.backward(g.double()), y_pt.backward(g)
    assert m.bias.grad is not None, "the module's own bias gets a gradient"
    assert_close(m.bias.grad, b_ref.grad, torch_actual=b_pt.grad, msg="bias.grad")
    assert_close(x.grad, x_ref.grad, torch_actual=x_pt.grad, msg="x.grad")
    assert "features=33" in repr(m) and approximate in repr(m)


def test_bias_gelu_module_default_is_tanh(device):
    m = fastact.nn.BiasGELU(8, device=device)
    assert m.approximate == "tanh"
    with torch.no_grad():
        m.bias.normal_()
    x = make_tensor((3, 8), torch.float64, device)
    m = m.double()
    torch.testing.assert_close(m(x), torch.nn.functional.gelu(x + m.bias, approximate="tanh"))


def test_modules_train_a_step(device):
    """Linear(no bias) + BiasGELU + Linear + LogSoftmax trains like the torch equivalent."""

    def build(fa):
        lin1 = torch.nn.Linear(16, 24, bias=not fa)
        act = fastact.nn.BiasGELU(24) if fa else torch.nn.GELU("tanh")
        lin2 = torch.nn.Linear(24, 5)
        head = fastact.nn.LogSoftmax(-1) if fa else torch.nn.LogSoftmax(-1)
        return torch.nn.Sequential(lin1, act, lin2, head).to(device).double()

    m_fa, m_pt = build(True), build(False)
    with torch.no_grad():  # the same function: the torch model's first bias is BiasGELU's bias
        m_fa[0].weight.copy_(m_pt[0].weight)
        m_fa[1].bias.copy_(m_pt[0].bias)
        m_fa[2].weight.copy_(m_pt[2].weight)
        m_fa[2].bias.copy_(m_pt[2].bias)
    before = m_fa[0].weight.detach().clone()
    x = make_tensor((10, 16), torch.float64, device)
    target = torch.randint(0, 5, (10,), device=device)
    for m in (m_fa, m_pt):
        torch.nn.functional.nll_loss(m(x), target).backward()
        torch.optim.SGD(m.parameters(), lr=0.5).step()
    torch.testing.assert_close(m_fa[0].weight, m_pt[0].weight)
    torch.testing.assert_close(m_fa[1].bias, m_pt[0].bias)
    torch.testing.assert_close(m_fa[2].weight, m_pt[2].weight)
    torch.testing.assert_close(m_fa[2].bias, m_pt[2].bias)
    assert not torch.equal(m_fa[0].weight, before)  # the step moved the weights


# (fastact module, its torch twin), every row of the op table with a twin (the softmax family first)
TWINS = [(getattr(fastact.nn, op.module), op.torch_module) for op in TABLE if op.torch_module is not None]
TWIN_IDS = [fa.__name__ for fa, _ in TWINS]


def _params(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("fa,pt", TWINS, ids=TWIN_IDS)
def test_signatures_match_torch(fa, pt):
    """Every argument torch's module takes, by the same name, kind and default (so any call that
    builds torch's module builds fastact's), and the same forward."""
    assert _params(fa.__init__) == _params(pt.__init__)
    assert _params(fa.forward) == _params(pt.forward)
    assert getattr(fa, "__constants__", []) == getattr(pt, "__constants__", [])


@pytest.mark.parametrize("name", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("ndim", [0, 1, 2, 3, 4])
def test_implicit_dim_matches_torch(name, ndim):
    """dim=None: torch's implicit dim (0 for 0-, 1- and 3-d inputs, else 1) and torch's deprecation
    warning: the same text and category, attributed to the same file and line."""
    m_fa, m_pt = getattr(fastact.nn, name)(), getattr(torch.nn, name)()
    x = make_tensor((3, 4, 5, 6)[:ndim], torch.float32, "cpu", scale=2.0)  # sizes differ: a wrong dim shows
    with warnings.catch_warnings(record=True) as w_fa:
        warnings.simplefilter("always")
        y_fa = m_fa(x)
    with warnings.catch_warnings(record=True) as w_pt:
        warnings.simplefilter("always")
        y_pt = m_pt(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y_ref = m_pt(x.double())
    assert_close(y_fa, y_ref, torch_actual=y_pt, msg=f"{name}() on {ndim}-d")
    assert len(w_fa) == len(w_pt) == 1
    (a,), (b,) = w_fa, w_pt
    assert (str(a.message), a.category, a.filename, a.lineno) == (str(b.message), b.category, b.filename, b.lineno)
    assert "Implicit dimension choice for" in str(a.message)
    # an explicit dim warns of nothing
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        getattr(fastact.nn, name)(0)(x)


def test_implicit_dim_is_recomputed_per_input():
    m = fastact.nn.Softmax()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x3, x2 = torch.randn(2, 3, 4), torch.randn(3, 4)
        torch.testing.assert_close(m(x3), torch.softmax(x3, 0))
        torch.testing.assert_close(m(x2), torch.softmax(x2, 1))
        assert m.dim is None


@pytest.mark.parametrize(
    "make",
    [
        lambda nn: nn.Softmax(),
        lambda nn: nn.Softmax(dim=None),
        lambda nn: nn.Softmax(1),
        lambda nn: nn.Softmax(-2),
        lambda nn: nn.LogSoftmax(),
        lambda nn: nn.LogSoftmax(0),
        lambda nn: nn.GELU(),
        lambda nn: nn.GELU("tanh"),
        lambda nn: nn.GELU(approximate="none"),
        lambda nn: nn.Sigmoid(),
        lambda nn: torch.nn.Sequential(nn.Softmax(dim=1), nn.GELU("tanh"), nn.Sigmoid()),
    ],
)
def test_repr_matches_torch(make):
    assert repr(make(fastact.nn)) == repr(make(torch.nn))


@pytest.mark.parametrize("case", POINTWISE_MODULES, ids=[i for i, _, _ in POINTWISE_MODULES])
def test_pointwise_module_repr_and_pickle(case):
    """Every pointwise module: torch's repr (`inplace=True` too, where torch's module takes it), and it pickles
    (torch.save as well) to a module of the same class, attributes and results."""
    _, make_fa, make_pt = case
    m, pt = make_fa(), make_pt()
    assert repr(m) == repr(pt)
    x = torch.randn(3, 7)
    for m2 in _pickle_round_trips(m):
        assert type(m2) is type(m) and m2.__dict__.keys() == m.__dict__.keys() and repr(m2) == repr(m)
        assert torch.equal(m2(x), m(x))
    if "inplace" in inspect.signature(type(pt)).parameters:
        assert repr(type(m)(inplace=True)) == repr(type(pt)(inplace=True))


@pytest.mark.parametrize("op", [op for op in POINTWISE if op.inplace], ids=lambda op: op.module)
def test_inplace_module_like_torch(op):
    """`inplace=True` writes the result into the input and returns it, as torch's module does (eager and scripted)."""
    fa, pt = getattr(fastact.nn, op.module)(inplace=True), op.torch_module(inplace=True)
    x = torch.randn(4, 9, dtype=torch.float64)
    want = pt(x.clone())
    for m in (fa, torch.jit.script(fa)):
        y = x.clone()
        out = m(y)
        assert out.data_ptr() == y.data_ptr()
        torch.testing.assert_close(y, want)
    torch.testing.assert_close(getattr(fastact.nn, op.module)()(x), want)  # and out of place, the same values


def test_bias_gelu_repr():
    assert repr(fastact.nn.BiasGELU(4)) == "BiasGELU(features=4, approximate='tanh')"
    assert repr(fastact.nn.BiasGELU(7, "none")) == "BiasGELU(features=7, approximate='none')"


@pytest.mark.parametrize("fa,pt", TWINS, ids=TWIN_IDS)
def test_state_dict_interchangeable_with_torch(fa, pt):
    """A model's state dict loads (strict) whichever of the twins it holds, both ways."""

    def model(act):
        return torch.nn.Sequential(torch.nn.Linear(4, 6), act, torch.nn.Linear(6, 3))

    m_fa = model(fa(1) if fa in (fastact.nn.Softmax, fastact.nn.LogSoftmax) else fa())
    m_pt = model(pt(1) if pt in (torch.nn.Softmax, torch.nn.LogSoftmax) else pt())
    assert m_fa[1].state_dict() == m_pt[1].state_dict() == {}
    m_fa.load_state_dict(m_pt.state_dict(), strict=True)
    x = torch.randn(5, 4, dtype=torch.float64)
    m_fa.double(), m_pt.double()
    torch.testing.assert_close(m_fa(x), m_pt(x))
    m_pt[0].weight.data.normal_()
    m_pt.load_state_dict(m_fa.state_dict(), strict=True)
    torch.testing.assert_close(m_fa(x), m_pt(x))


def test_bias_gelu_state_dict_round_trip():
    m = fastact.nn.BiasGELU(4)
    with torch.no_grad():
        m.bias.copy_(torch.tensor([1.0, -2.0, 3.0, 0.5]))
    assert list(m.state_dict()) == ["bias"]
    m2 = fastact.nn.BiasGELU(4)
    m2.load_state_dict(m.state_dict())
    assert torch.equal(m2.bias, m.bias)
    with pytest.raises(RuntimeError, match="size mismatch"):
        fastact.nn.BiasGELU(5).load_state_dict(m.state_dict())


@pytest.mark.parametrize("how", ["device-argument", "device-context"])
def test_bias_gelu_meta_init_then_reset_parameters(how):
    """Built on the meta device (no memory), moved with to_empty (uninitialised memory, poisoned
    here), reset_parameters gives the documented zero bias, as torch.nn.Linear's pattern expects."""
    if how == "device-argument":
        m = fastact.nn.BiasGELU(8, device="meta", dtype=torch.float64)
    else:
        with torch.device("meta"):
            m = fastact.nn.BiasGELU(8, dtype=torch.float64)
    assert m.bias.is_meta and m.bias.dtype == torch.float64
    m.to_empty(device="cpu")
    with torch.no_grad():
        m.bias.fill_(math.nan)
    m.reset_parameters()
    assert not m.bias.is_meta and m.bias.requires_grad
    assert torch.equal(m.bias, torch.zeros(8, dtype=torch.float64))
    x = torch.randn(3, 8, dtype=torch.float64)
    torch.testing.assert_close(m(x), torch.nn.functional.gelu(x, approximate="tanh"))


def test_bias_gelu_reset_parameters_resets_a_trained_bias():
    m = fastact.nn.BiasGELU(6, "none")
    with torch.no_grad():
        m.bias.normal_()
    before = m.bias
    m.reset_parameters()
    assert m.bias is before  # in place: an optimizer holding the parameter keeps it
    assert torch.equal(m.bias, torch.zeros(6))


def _pickle_round_trips(m):
    yield pickle.loads(pickle.dumps(m))
    yield copy.deepcopy(m)
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    yield torch.load(buf, weights_only=False)


@pytest.mark.parametrize("dim", [None, 1])
def test_softmax_pickles(dim):
    x = torch.randn(2, 3, 4)
    for m in _pickle_round_trips(fastact.nn.Softmax(dim=dim)):
        assert type(m) is fastact.nn.Softmax and m.dim == dim
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.testing.assert_close(m(x), torch.nn.Softmax(dim=dim)(x))
    for m in _pickle_round_trips(fastact.nn.BiasGELU(4, "none")):
        assert type(m) is fastact.nn.BiasGELU and m.features == 4 and m.approximate == "none"


@pytest.mark.parametrize("fa,pt", TWINS[:2], ids=TWIN_IDS[:2])
def test_setstate_without_dim_like_torch(fa, pt):
    """A pickle from a version without the ``dim`` attribute loads as dim=None, as torch's does."""
    for cls in (fa, pt):
        state = cls(1).__dict__.copy()
        del state["dim"]
        m = cls.__new__(cls)
        m.__setstate__(state)
        assert m.dim is None
    # and a pickle of a BiasGELU without ``features`` takes it from the bias
    state = fastact.nn.BiasGELU(5).__dict__.copy()
    del state["features"]
    m = fastact.nn.BiasGELU.__new__(fastact.nn.BiasGELU)
    m.__setstate__(state)
    assert m.features == 5 and repr(m) == "BiasGELU(features=5, approximate='tanh')"


@pytest.mark.parametrize(
    "make",
    [
        lambda: fastact.nn.Softmax(),
        lambda: fastact.nn.LogSoftmax(),
        lambda: fastact.nn.Softmax(1),
        lambda: fastact.nn.GELU("tanh"),
        lambda: fastact.nn.BiasGELU(5, "none"),
    ] + [fa for _, fa, _ in POINTWISE_MODULES],
    ids=["Softmax-implicit", "LogSoftmax-implicit", "Softmax1", "GELU-tanh", "BiasGELU"] + [i for i, _, _ in POINTWISE_MODULES],
)
def test_module_compiles_fullgraph(make):
    """torch.compile(fullgraph=True) of each module, dim=None included (whose warning dynamo could
    not trace), equals eager."""
    m = make().double()
    if isinstance(m, fastact.nn.BiasGELU):
        with torch.no_grad():
            m.bias.normal_()
    x = torch.randn(3, 4, 5, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y_eager = m(x)
        y = torch.compile(m, backend="aot_eager", fullgraph=True)(x)
    assert torch.equal(y, y_eager)
