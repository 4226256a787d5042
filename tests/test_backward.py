"""The backward ops called directly (they are registered ops of their own: autograd, compile and
opcheck all see them), torch.autograd.gradcheck and gradgradcheck in float64 on every public op and
every backward op, and second derivatives (double backward) in every dtype against torch."""

import pytest
import torch

import fastact
from fastact_testing import (
    ALL_OPS,
    FLOAT_DTYPES,
    POINTWISE_OPS,
    ROW_VIEW_COLS,
    ROW_VIEWS,
    assert_close,
    bias_for,
    coarsest,
    contiguous_stride,
    describe,
    dtype_id,
    make_tensor,
    poison_allocator,
    row_view,
    softmax_backward_ref,
    softmax_backward_torch,
)

ops = torch.ops.fastact

# (output, grad) layouts: equal layouts, grad in another memory order (copied into output's),
# misaligned dense tensors, and a non-dense output (made contiguous).
BWD_LAYOUTS = [
    ("contiguous", "contiguous"),
    ("transposed", "transposed"),
    ("contiguous", "transposed"),
    ("transposed", "contiguous"),
    ("offset", "offset"),
    ("sliced_last", "contiguous"),
    ("contiguous", "expanded"),
    ("transposed_stepped", "transposed_stepped"),
    ("contiguous", "transposed_stepped"),
]


@pytest.mark.parametrize("log", [False, True], ids=["softmax_backward", "log_softmax_backward"])
@pytest.mark.parametrize("layouts", BWD_LAYOUTS, ids=lambda p: f"{p[0]}-{p[1]}")
@pytest.mark.parametrize("shape", [(6, 33), (5, 2049), (3, 7, 5), (2, 3, 4, 9)], ids=lambda s: "x".join(map(str, s)))
def test_softmax_backward_op(device, dtype, log, layouts, shape):
    out_layout, grad_layout = layouts
    name = "log_softmax_backward" if log else "softmax_backward"
    op = getattr(ops, name).default
    fwd = torch.log_softmax if log else torch.softmax
    x = make_tensor(shape, dtype, device)
    for dim in range(-len(shape), len(shape)):
        # a real (log-)softmax output, in the layout under test
        y = _relayout(fwd(x, dim), out_layout)
        g = _relayout(make_tensor(shape, dtype, device), grad_layout)
        msg = f"{name} dim={dim} output: {describe(y)} grad: {describe(g)}"
        poison_allocator(device, y.numel() * dtype.itemsize)
        dx = op(g, y, dim, dtype)
        assert dx.dtype == dtype and dx.shape == y.shape, msg
        want = torch.empty_like(y, dtype=dtype).stride()  # y's strides when dense, else contiguous
        assert dx.stride() == want, f"{msg}: strides {dx.stride()} != {want}"
        assert_close(dx, softmax_backward_ref(g, y, dim, log), torch_actual=softmax_backward_torch(g, y, dim, dtype, log), msg=msg)


def _relayout(t, layout):
    """t's values in a tensor of the given layout (make_tensor's names)."""
    if layout == "contiguous":
        return t.contiguous()
    if layout == "expanded":  # dim 0 broadcast (stride 0), as a sum's gradient is
        return t[:1].expand(t.shape)
    return make_tensor(tuple(t.shape), t.dtype, t.device, layout).copy_(t)


@pytest.mark.parametrize("log", [False, True], ids=["softmax_backward", "log_softmax_backward"])
@pytest.mark.parametrize("input_dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("out_dtype", FLOAT_DTYPES, ids=dtype_id)
def test_softmax_backward_input_dtype(device, log, out_dtype, input_dtype):
    """grad_input comes back in input_dtype (fused for a bf16/fp16 input of an fp32 output)."""
    op = (ops.log_softmax_backward if log else ops.softmax_backward).default
    for shape, dim in [((7, 300), -1), ((4, 33, 6), 1)]:
        x = make_tensor(shape, out_dtype, device)
        y = (torch.log_softmax if log else torch.softmax)(x, dim)
        g = make_tensor(shape, out_dtype, device)
        dx = op(g, y, dim, input_dtype)
        assert dx.dtype == input_dtype and dx.stride() == y.stride()
        assert_close(
            dx,
            softmax_backward_ref(g, y, dim, log),
            coarsest(out_dtype, input_dtype),
            torch_actual=softmax_backward_torch(g, y, dim, input_dtype, log),
            msg=f"{op} {shape} dim={dim} {out_dtype}->{input_dtype}",
        )


@pytest.mark.parametrize("log", [False, True], ids=["softmax_backward", "log_softmax_backward"])
def test_softmax_backward_scalar_and_empty(device, dtype, log):
    op = (ops.log_softmax_backward if log else ops.softmax_backward).default
    fwd = torch.log_softmax if log else torch.softmax
    for shape in [(), (0,), (3, 0), (0, 4), (2, 0, 5)]:
        x = make_tensor(shape, dtype, device)
        for dim in range(-max(len(shape), 1), max(len(shape), 1)):
            y, g = fwd(x, dim), make_tensor(shape, dtype, device)
            dx = op(g, y, dim, dtype)
            assert dx.shape == x.shape and dx.dtype == dtype
            assert_close(dx, softmax_backward_ref(g, y, dim, log), torch_actual=softmax_backward_torch(g, y, dim, dtype, log), msg=f"{shape} dim={dim}")


def _elementwise_bwd_cases():
    """(shape, layouts): every layout pair on tensors of rank >= 2, contiguous ones on 0-d and 1-d."""
    for shape in [(), (0, 3), (1025,), (6, 33), (3, 7, 5)]:
        for layouts in BWD_LAYOUTS if len(shape) >= 2 else BWD_LAYOUTS[:1]:
            yield pytest.param(shape, layouts, id=f"{'x'.join(map(str, shape)) or 'scalar'}-{layouts[0]}-{layouts[1]}")


ELEMENTWISE_BWD_CASES = list(_elementwise_bwd_cases())


def _saved(op, shape, dtype, device, layout, view=None):
    """What the backward of pointwise `op` reads besides the gradient: an input x (scale 3) in `layout` (or the
    row view `view`), or, for an op that saves its output, its twin's output of such an x in that layout."""
    if view is not None:
        x = row_view(shape[0], shape[1], dtype, device, view, scale=3.0)
        return x if op.row.saves == "input" else row_view(shape[0], shape[1], dtype, device, view, values=op.torch(x))
    if op.row.saves == "output":
        return _relayout(op.torch(make_tensor(shape, dtype, device, scale=3.0)), layout)
    return make_tensor(shape, dtype, device, layout, scale=3.0)


def _check_pointwise_backward(op, g, saved, msg):
    """op's backward op on (g, saved) against its row's torch derivative op in float64, layout of empty_like."""
    dtype = saved.dtype
    poison_allocator(saved.device.type, saved.numel() * dtype.itemsize)
    dx = getattr(ops, op.row.backward).default(g, saved, *op.params.values())
    assert dx.dtype == dtype and dx.shape == saved.shape, msg
    assert dx.stride() == torch.empty_like(saved).stride(), msg
    ref = op.row.torch_backward(g.double(), saved.double(), **op.params)
    pt = op.row.torch_backward(g, saved, **op.params)
    assert_close(dx, ref, torch_actual=pt, msg=f"{op.row.backward} {op} {msg}")


@pytest.mark.parametrize("op", POINTWISE_OPS, ids=str)
@pytest.mark.parametrize("shape,layouts", ELEMENTWISE_BWD_CASES)
def test_pointwise_backward_op(device, dtype, op, layouts, shape):
    """Every pointwise op's backward op (gelu_backward at each approximation, sigmoid_backward, ...) on the saved
    tensor and the gradient in every pair of layouts."""
    saved_layout, g_layout = layouts
    saved = _saved(op, shape, dtype, device, saved_layout)
    g = make_tensor(shape, dtype, device, g_layout)
    _check_pointwise_backward(op, g, saved, f"saved: {describe(saved)} g: {describe(g)}")


@pytest.mark.parametrize("view", ROW_VIEWS)
@pytest.mark.parametrize("cols", ROW_VIEW_COLS)
def test_elementwise_backward_row_views(device, dtype, cols, view):
    """Every pointwise op's backward op with grad_output and the saved tensor both row views
    (fastact_testing.row_view), read in place."""
    g = row_view(67, cols, dtype, device, view)
    for op in POINTWISE_OPS:
        saved = _saved(op, (67, cols), dtype, device, None, view)
        _check_pointwise_backward(op, g, saved, f"saved: {describe(saved)} g: {describe(g)}")


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize(
    "shape,x_layout,bias_layout,g_layout",
    [
        ((1,), "contiguous", "contiguous", "contiguous"),
        ((33,), "contiguous", "contiguous", "contiguous"),
        ((7, 33), "contiguous", "contiguous", "contiguous"),
        ((7, 33), "transposed", "strided", "transposed"),
        ((7, 33), "offset", "offset", "contiguous"),
        ((129, 1025), "contiguous", "contiguous", "expanded"),
        ((3, 5, 64), "sliced_last", "contiguous", "transposed"),
        ((2048, 31), "contiguous", "contiguous", "contiguous"),
        ((10007, 7), "contiguous", "contiguous", "contiguous"),  # the bias gradient over many rows and threads
        # 128-bit path, several row groups, the last one short: one column strip, and (4104 = 4096 + 8)
        # several column strips, the last one partly past the row's end
        ((1000, 256), "contiguous", "contiguous", "contiguous"),
        ((300, 4104), "contiguous", "contiguous", "contiguous"),
        ((3, 4099, 33), "offset", "strided", "contiguous"),
        ((0, 17), "contiguous", "contiguous", "contiguous"),
        ((4, 0), "contiguous", "contiguous", "contiguous"),
    ],
    ids=str,
)
def test_bias_gelu_backward_op(device, dtype, approximate, shape, x_layout, bias_layout, g_layout):
    x = make_tensor(shape, dtype, device, x_layout, scale=2.0)
    b = bias_for(x, bias_layout)
    g = make_tensor(shape, dtype, device, g_layout if len(shape) >= 2 else "contiguous")
    poison_allocator(device, x.numel() * dtype.itemsize, b.numel() * dtype.itemsize)
    dx, db = ops.bias_gelu_backward.default(g, x, b, approximate)
    msg = f"bias_gelu_backward {approximate} x: {describe(x)} bias: {describe(b)} g: {describe(g)}"
    assert dx.dtype == dtype and dx.shape == x.shape and dx.stride() == contiguous_stride(x.shape), msg
    assert db.dtype == dtype and db.shape == b.shape, msg
    z64 = x.double() + b.double()
    dx_ref = torch.ops.aten.gelu_backward(g.double(), z64, approximate=approximate)
    db_ref = dx_ref.sum(tuple(range(x.dim() - 1))) if x.dim() > 1 else dx_ref
    dx_pt = torch.ops.aten.gelu_backward(g, x + b, approximate=approximate)
    db_pt = dx_pt.sum(tuple(range(x.dim() - 1))) if x.dim() > 1 else dx_pt
    assert_close(dx, dx_ref, torch_actual=dx_pt, msg=msg + ": dx")
    assert_close(db, db_ref, torch_actual=db_pt, msg=msg + ": dbias")


# ----------------------------------------------------------------------------------------------
# gradcheck (float64)


def _gradcheck_inputs(device):
    """Small float64 inputs: contiguous, transposed and sliced (non-contiguous)."""
    return {
        "contiguous": make_tensor((3, 5), torch.float64, device),
        "transposed": make_tensor((4, 3, 5), torch.float64, device, "transposed"),
        "sliced": make_tensor((3, 6), torch.float64, device, "sliced_last"),
        "scalar": make_tensor((), torch.float64, device),
    }


@pytest.mark.parametrize(
    "op,layout",
    [(op, layout) for op in ALL_OPS for layout in ("contiguous", "transposed", "sliced", "scalar") if not (op.takes_bias and layout == "scalar")],
    ids=str,
)
def test_gradcheck(device, op, layout):
    """First and second derivatives (the backward ops are differentiable, as torch's are)."""
    x = _gradcheck_inputs(device)[layout].detach().requires_grad_()
    if op.takes_bias:
        b = bias_for(x, "strided").detach().requires_grad_()
        assert torch.autograd.gradcheck(lambda x, b: op.fastact(x, bias=b), (x, b))
        assert torch.autograd.gradgradcheck(lambda x, b: op.fastact(x, bias=b), (x, b))
    elif op.takes_dim:
        for dim in range(-max(x.dim(), 1), max(x.dim(), 1)):
            assert torch.autograd.gradcheck(lambda x: op.fastact(x, dim=dim), (x,)), dim
            assert torch.autograd.gradgradcheck(lambda x: op.fastact(x, dim=dim), (x,)), dim
    else:
        assert torch.autograd.gradcheck(lambda x: op.fastact(x), (x,))
        assert torch.autograd.gradgradcheck(lambda x: op.fastact(x), (x,))


def _backward_op_inputs(op, device, shape=(3, 5), dim=1):
    """(callable, float64 inputs that require grad) of op's backward op: the grad and the saved
    tensors (a real softmax / sigmoid output where the op saves its output)."""
    t = lambda: make_tensor(shape, torch.float64, device).requires_grad_()  # noqa: E731
    g, x = t(), t()
    if op.takes_dim:
        log = op.name == "log_softmax"
        y = (torch.log_softmax if log else torch.softmax)(x.detach(), dim).requires_grad_()
        f = getattr(ops, f"{op.name}_backward")
        return (lambda g, y: f(g, y, dim, torch.float64)), (g, y)
    if op.kind == "pointwise":
        saved = op.torch(x.detach()).requires_grad_() if op.row.saves == "output" else x
        f, params = getattr(ops, op.row.backward), tuple(op.params.values())
        return (lambda g, s: f(g, s, *params)), (g, saved)
    b = make_tensor(shape[-1:], torch.float64, device).requires_grad_()
    return (lambda g, x, b: ops.bias_gelu_backward(g, x, b, op.approximate)), (g, x, b)


@pytest.mark.parametrize("op", ALL_OPS, ids=str)
def test_backward_op_gradcheck(device, op):
    """Every backward op is differentiable in all its tensor inputs, twice (triple backward)."""
    f, inputs = _backward_op_inputs(op, device)
    assert torch.autograd.gradcheck(f, inputs)
    assert torch.autograd.gradgradcheck(f, inputs)


def _derivatives(f, x, orders, w=None, create_last=True):
    """The first `orders` derivatives of sum(w * f(x)) (w: all ones where None), each taken with create_graph; the
    last without it where not `create_last` (a plain value)."""
    t = x.clone().requires_grad_()
    y, out = f(t), []
    for order in range(1, orders + 1):
        weighted = y if w is None else y * w.to(y.dtype)
        (y,) = torch.autograd.grad(weighted.sum(), t, create_graph=order < orders or create_last)
        out.append(y)
    return out


@pytest.mark.parametrize("op", ALL_OPS, ids=str)
def test_higher_derivatives(device, dtype, op):
    """Derivatives to the sixth order, each taken with create_graph, and the last also without (a plain value):
    against torch's in float64, within the dtype's tolerance widened by torch's own error in the dtype (in float64:
    equal). The pointwise ops' first three come from fastact's own kernels (math.h), the fourth and beyond from
    torch's twin of the op (autograd.cpp twin_derivative)."""
    x = make_tensor((3, 7), dtype, device)
    w = make_tensor((3, 7), dtype, device)  # weights: the sum's gradient is not all ones
    bias = make_tensor((7,), dtype, device) if op.takes_bias else None
    b64 = None if bias is None else bias.double()
    for create_last in (True, False):
        got = _derivatives(lambda t: op.fastact(t, bias=bias), x, 6, w, create_last)
        want = _derivatives(lambda t: op.torch(t, bias=b64), x.double(), 6, w, create_last)
        theirs = _derivatives(lambda t: op.torch(t, bias=bias), x, 6, w, create_last)
        for order, (g, r, t) in enumerate(zip(got, want, theirs), 1):
            assert_close(g, r, torch_actual=t, msg=f"{op} {dtype_id(dtype)} order {order}")
        assert got[-1].requires_grad == create_last


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=dtype_id)
@pytest.mark.parametrize("op", POINTWISE_OPS, ids=str)
def test_higher_derivatives_far_out(device, dtype, op):
    """Where the functions flatten out (|x| from 9 to 100, where cosh overflows in float): the first three
    derivatives (fastact's own, math.h) finite everywhere and equal to float64 torch's within the dtype's tolerance
    where torch's are finite; the fourth (torch's, from the twin) torch's in the same dtype, NaN where it has NaN.
    (The tanh GELU's third derivative was NaN from |x| ~ 10 in float32: its dual numbers squared cosh. torch's own
    is NaN at |x| = 30 in float64, its fourth at |x| = 13 in float32; the true values there are below 1e-70.)"""
    far = [-100.0, -30.0, -13.0, -10.05, -9.0, 9.0, 10.05, 13.0, 30.0, 100.0]
    x = torch.tensor(far, dtype=dtype, device=device)
    got = _derivatives(op.fastact, x, 4)
    want = _derivatives(op.torch, x.double(), 4)
    for order, (g, r) in enumerate(zip(got[:3], want), 1):
        msg = f"{op} {dtype_id(dtype)} order {order} at {far}"
        assert g.isfinite().all(), f"{msg}: {g.tolist()}"
        ok = r.isfinite()
        assert_close(g[ok], r[ok], msg=msg)
        assert (g[~ok].abs() < 1e-30).all(), f"{msg}: {g.tolist()} where torch has NaN"
    torch_same_dtype = _derivatives(op.torch, x, 4)[3]
    assert torch.equal(got[3].isnan(), torch_same_dtype.isnan()), (got[3].tolist(), torch_same_dtype.tolist())
    ok = torch_same_dtype.isfinite()
    assert_close(got[3][ok], torch_same_dtype[ok].double(), msg=f"{op} {dtype_id(dtype)} order 4 at {far}")


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")  # torch's forward_ad
@pytest.mark.parametrize("op", ALL_OPS, ids=str)
def test_forward_ad_raises_on_backward_ops(device, op):
    """Forward-mode AD through the backward ops themselves is not supported (their C++ autograd
    Functions have no jvp): a tangent on any of their inputs raises rather than being dropped. (The
    public functions take tangents: tests/test_func.py.)"""
    import torch.autograd.forward_ad as fwAD

    f, inputs = _backward_op_inputs(op, device)
    inputs = [t.detach() for t in inputs]
    with fwAD.dual_level():
        for i in range(len(inputs)):
            dual = list(inputs)
            dual[i] = fwAD.make_dual(inputs[i], torch.randn_like(inputs[i]))
            with pytest.raises(RuntimeError, match="jvp"):
                f(*dual)


def _second_derivatives(fn, inputs, w, vs):
    """d/d inputs of sum(v * d/d input sum(w * fn(inputs))) over the inputs: a Hessian-vector
    product, through create_graph=True and a second backward."""
    inputs = [t.detach().requires_grad_() for t in inputs]
    y = fn(*inputs)
    grads = torch.autograd.grad((y * w.to(y.dtype)).sum(), inputs, create_graph=True)
    assert all(g.requires_grad for g in grads)
    return torch.autograd.grad(sum((g * v.to(g.dtype)).sum() for g, v in zip(grads, vs)), inputs)


@pytest.mark.parametrize("op", ALL_OPS, ids=str)
@pytest.mark.parametrize("shape,dim", [((6, 40), 1), ((8, 33, 5), 1)], ids=["rows", "dim1"])
def test_double_backward(device, dtype, op, shape, dim):
    """Second derivatives in every dtype (and softmax's dtype= cast of 16-bit inputs to float32)
    against float64 torch autograd; torch's own result in the tested dtype widens the bound. A first
    backward without create_graph records nothing. In 16-bit, the second derivative passes through
    several roundings to the dtype (y, the gradient of y, the result), so fastact's and torch's
    largest errors are tail statistics: over a hundred-odd elements, torch's can be a lucky third of
    its usual size (one f16 sample of [4, 7, 5] on CUDA, at 3 ulp against torch's 0.8); these shapes
    hold a few hundred to a thousand elements. fastact's errors are the smaller ones: the median of
    the largest error over 200 CPU samples of [4, 7, 5], softmax f16 0.00018 against torch's 0.00035,
    bf16 0.0015 against 0.0026."""
    x = make_tensor(shape, dtype, device)
    inputs = [x] + ([bias_for(x)] if op.takes_bias else [])
    w, vs = make_tensor(shape, dtype, device), [make_tensor(t.shape, dtype, device) for t in inputs]
    out_dtypes = [None] + ([torch.float32] if op.takes_dim and dtype in (torch.float16, torch.bfloat16) else [])
    for out_dtype in out_dtypes:
        kw = dict(dim=dim, dtype=out_dtype) if op.takes_dim else {}
        if op.takes_bias:
            fa, pt = (lambda x, b: op.fastact(x, bias=b)), (lambda x, b: op.torch(x, bias=b))
        else:
            fa, pt = (lambda x: op.fastact(x, **kw)), (lambda x: op.torch(x, **kw))
        got = _second_derivatives(fa, inputs, w, vs)
        want = _second_derivatives(pt, [t.double() for t in inputs], w.double(), [v.double() for v in vs])
        torch_got = _second_derivatives(pt, inputs, w, vs)
        for name, a, e, t in zip(("x", "bias"), got, want, torch_got):
            assert a.dtype == dtype
            assert_close(a, e, torch_actual=t, msg=f"{op} {shape} dim={dim} dtype={out_dtype}: d2/d{name}")
        xg = x.detach().requires_grad_()
        (g,) = torch.autograd.grad(fa(*([xg] + inputs[1:])).sum(), xg)
        assert not g.requires_grad and g.grad_fn is None


@pytest.mark.parametrize("op", [o for o in ALL_OPS if o.takes_dim], ids=str)
def test_gradcheck_dtype_argument(device, op):
    # float32 in, float64 out: the cast is part of the op, so the gradient flows through it
    x = make_tensor((3, 7), torch.float64, device).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: op.fastact(x, dim=0, dtype=torch.float64), (x,))


def test_gradcheck_large_values(device):
    x = torch.tensor([[30.0, -30.0, 0.5, 40.0], [-50.0, 50.0, 49.9, 0.0]], dtype=torch.float64, device=device)
    x.requires_grad_()
    for f in [lambda t: fastact.softmax(t, 1), lambda t: fastact.log_softmax(t, 0)] + [op.fastact for op in POINTWISE_OPS]:
        assert torch.autograd.gradcheck(f, (x,))
