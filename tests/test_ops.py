"""Every public op against torch, forward and backward (through autograd), on every device and
dtype: every dim of tensors of rank 0 to 4 in every layout, the boundary sizes of every kernel path,
empty tensors, softmax's `dtype=`, and the layout rule of the outputs."""

import math

import pytest
import torch

import fastact
from fastact_testing import (
    ALL_OPS,
    BOUNDARY_SIZES,
    ELEMENTWISE_OPS,
    FLOAT_DTYPES,
    LAYOUTS,
    POINTWISE_OPS,
    ROW_VIEW_COLS,
    ROW_VIEWS,
    SOFTMAX_OPS,
    assert_close,
    bias_for,
    check_op,
    dtype_id,
    is_dense,
    layout_applies,
    make_tensor,
    pytest_under_isa,
    row_view,
    strided_tensor,
)

# One shape per rank with sizes that are no kernel's friends (odd, prime, around a warp), and
# shapes with size-1 dims (whose strides are arbitrary).
SHAPES = [(), (37,), (7, 33), (3, 5, 17), (2, 3, 4, 9), (1,), (5, 1), (1, 6), (3, 1, 4), (2, 1, 3, 1)]


def _rank_cases():
    for shape in SHAPES:
        for layout in LAYOUTS:
            if layout_applies(layout, len(shape)):
                yield pytest.param(shape, layout, id=f"{'x'.join(map(str, shape)) or 'scalar'}-{layout}")


RANK_CASES = list(_rank_cases())
GRAD_LAYOUT = {"transposed": "transposed", "expanded": "expanded"}  # grads in an unusual layout too


@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
@pytest.mark.parametrize("shape,layout", RANK_CASES)
def test_softmax_every_dim(device, dtype, op, shape, layout):
    x = make_tensor(shape, dtype, device, layout)
    for dim in range(-max(len(shape), 1), max(len(shape), 1)):
        check_op(op, x, dim=dim, grad_layout=GRAD_LAYOUT.get(layout, "contiguous"))


@pytest.mark.parametrize(
    "op,shape,layout",
    # bias_gelu needs x of rank >= 1 (a 0-d x is an error: test_errors.py)
    [pytest.param(op, *c.values, id=f"{op}-{c.id}") for op in ELEMENTWISE_OPS for c in RANK_CASES if c.values[0] or not op.takes_bias],
)
def test_elementwise_every_rank(device, dtype, op, shape, layout):
    x = make_tensor(shape, dtype, device, layout)
    bias = bias_for(x) if op.takes_bias else None
    check_op(op, x, bias=bias, grad_layout=GRAD_LAYOUT.get(layout, "contiguous"))


@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
def test_default_dim_is_torchs(device, op):
    """No dim: F.softmax's deprecated implicit dim (0 for a 3-d input), as F.softmax picks it (tests/test_api.py has
    the warning and every rank)."""
    x = make_tensor((4, 6, 5), torch.float32, device)
    f = fastact.softmax if op.name == "softmax" else fastact.log_softmax
    with pytest.warns(UserWarning, match="Implicit dimension choice"):
        y = f(x)
    torch.testing.assert_close(y, f(x, 0), rtol=0, atol=0)
    torch.testing.assert_close(y, op.torch(x, dim=0))


def test_default_approximate(device):
    x = make_tensor((8, 33), torch.float64, device, scale=3.0)
    b = bias_for(x)
    torch.testing.assert_close(fastact.gelu(x), torch.nn.functional.gelu(x), rtol=1e-12, atol=1e-12)
    # bias_gelu defaults to the tanh approximation (the common choice of fused bias+GELU)
    want = torch.nn.functional.gelu(x + b, approximate="tanh")
    torch.testing.assert_close(fastact.bias_gelu(x, b), want, rtol=1e-12, atol=1e-12)
    # and the two approximations do differ here, so the check above can fail
    assert not torch.allclose(want, torch.nn.functional.gelu(x + b), rtol=1e-9, atol=1e-9)


# ----------------------------------------------------------------------------------------------
# Boundary sizes


def _rows(n):
    """Rows for a boundary test of row length n: many short rows (several rows per warp, a grid of
    many blocks), a few long ones (keeps the CPU run short)."""
    return max(3, min(67, 200_000 // n))


@pytest.mark.parametrize("n", BOUNDARY_SIZES)
@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "offset", "sliced_last", "strided"])
def test_softmax_boundary_sizes(device, dtype, op, n, layout):
    if layout == "strided":
        # reduction over a non-last dim: [outer, D, inner] with inner > 1
        x = make_tensor((2, n, 3), dtype, device)
        check_op(op, x, dim=1)
    else:
        x = make_tensor((_rows(n), n), dtype, device, layout)
        check_op(op, x, dim=-1)


# elementwise_kernel's tiles (elementwise_shape: 128-512 threads x accesses x width) are 512 to 4096
# elements: their edges +-1 as well, where BOUNDARY_SIZES lacks them.
@pytest.mark.parametrize("n", BOUNDARY_SIZES + (511, 513, 4095, 4097, 2 * 65536 + 3))
@pytest.mark.parametrize("op", [o for o in ELEMENTWISE_OPS if not o.takes_bias], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "offset"])
def test_unary_boundary_sizes(device, dtype, op, n, layout):
    # 1-d tensors of n elements: the vector body and the scalar tail of the elementwise kernel
    check_op(op, make_tensor((n,), dtype, device, layout))


# Elementwise ops on strided stacks of rows (fastact_testing.row_view), read in place: forward and
# backward through autograd, and the kernel explain() reports (CUDA: vector accesses where the row
# starts and length allow them). The backward ops with both inputs row views: test_backward.py.
@pytest.mark.parametrize("view", ROW_VIEWS)
@pytest.mark.parametrize("cols", ROW_VIEW_COLS)
@pytest.mark.parametrize("op", ELEMENTWISE_OPS, ids=str)
def test_elementwise_row_views(device, dtype, op, cols, view):
    x = row_view(67, cols, dtype, device, view, scale=3.0)
    check_op(op, x, bias=bias_for(x) if op.takes_bias else None)
    s = fastact.explain(op.name, x)
    if is_dense(x):  # cols == 1 of a chunk: a column of stride 2 is dense
        return
    assert "read in place" in s and "copied" not in s and "made contiguous" not in s, s
    if x.is_cuda:
        # the rows kernel's accesses (elementwise_rows_shape): 16 bytes, but 8 for float's two-operand
        # ops (bias_gelu: the bias its second input)
        access = 8 if op.takes_bias and dtype == torch.float32 else 16
        vec = cols % (access // x.element_size()) == 0 and view != "sliced"
        kernel = "elementwise_rows_vec" if vec else "elementwise_rows_scalar"
        assert s.startswith(f"kernel={kernel}:"), s
        if op.takes_bias:  # the backward's tiles read x in place too, 128-bit where its rows allow
            s = fastact.explain("bias_gelu_backward", x)
            vec = cols % (16 // x.element_size()) == 0 and view != "sliced"
            assert s.startswith("kernel=bias_gelu_vec:" if vec else "kernel=bias_gelu_scalar:"), s
            assert "read in place" in s and "copied" not in s, s


@pytest.mark.parametrize("n", BOUNDARY_SIZES)
@pytest.mark.parametrize("op", [o for o in ELEMENTWISE_OPS if o.takes_bias], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "offset", "transposed"])
def test_bias_gelu_boundary_sizes(device, dtype, op, n, layout):
    x = make_tensor((_rows(n), n), dtype, device, layout)
    check_op(op, x, bias=bias_for(x, "offset" if layout == "offset" else "contiguous"))


@pytest.mark.parametrize("inner", [1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 64, 127, 128, 129, 1025])
@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
def test_softmax_inner_sizes(device, dtype, op, inner):
    # the strided case's inner extent around vector widths and warp/block sizes
    x = make_tensor((3, 37, inner), dtype, device)
    check_op(op, x, dim=1)


@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
@pytest.mark.parametrize(
    "shape,dim",
    [((3, 40, 1100), 1), ((2, 700, 1030), 1), ((520, 2100), 0), ((2, 700, 600), 1), ((5, 64, 196), 1), ((4, 20, 130), 1),
     ((2, 40, 8236), 1), ((2, 600, 5000), 1), ((2, 9, 3000), 1), ((3, 16, 4097), 1), ((1, 64, 4104), 1)],
)
def test_softmax_strided_column_chunks(device, dtype, op, shape, dim):
    """The CPU strided kernels' column runs (csrc/cpu/softmax_kernels.cpp strided_run_width; the widths named are for two
    threads, as on CI): whole slabs, a slab's columns past the last vector pair in padded lanes and run on into the
    next row (1100, 1030, 600, 196, 130; D past the 256 rows each partial sum takes: 700); the backward's slab split
    for the threads, one slab (dim 0 of [520, 2100]: two runs of about 1050; the forward's vector pairs, the columns
    past the last pair in the runs' lanes); chunks that fit L2 (inner 8236 at D 40: 800 columns on AVX512, the last
    partial); the backward's runs as wide as the buffer where L2 chunks would be too narrow (inner 5000 at D 600:
    4096 and a partial); D under 16, a vector pair a task (D 9); a slab one column wider than the buffer (4097:
    chunks); a last chunk under a vector pair (4104: 8 columns). Forward and backward against float64."""
    check_op(op, make_tensor(shape, dtype, device), dim=dim)


@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
@pytest.mark.parametrize("inner", [2, 3, 5, 7, 9, 15, 17, 20, 33, 130])
def test_softmax_strided_small_inner(device, dtype, op, inner):
    """The CPU strided forward's columns past a slab's last SIMD vector (every column where inner is under one
    vector: 16 float lanes on AVX512, 8 on AVX2, half that in double) where the runs do not apply (D under 16 or inner
    under 128): a vector's lanes take that many such columns of consecutive slabs at once, forward and backward
    (csrc/cpu/softmax_kernels.cpp softmax_turned_cols_fwd, softmax_turned_cols_bwd). Outer counts of one slab, a partial block
    of lanes and several blocks; D of 1, 2, 8 and 300 (past the 256 rows of each partial sum); columns all -inf, with a
    +inf, with a NaN (NaN, as torch, the backward's too, in those columns' lanes only), and masked elements; forward and
    backward against float64, and softmax's dtype=float32 output of float16 and bfloat16 (its backward: float dy and y
    to a 16-bit dx)."""
    ninf = float("-inf")
    for outer, d in ((1, 8), (5, 1), (19, 2), (37, 8), (3, 300)):
        if d == 300 and inner > 20:
            continue  # D past 256 at a few widths is enough
        x = make_tensor((outer, d, inner), dtype, device)
        x[0, :, 0] = ninf  # the first column of the first slab
        x[-1, d // 2, inner - 1] = float("inf")  # the last column of the last slab
        x[outer // 2, d - 1, inner // 2] = float("nan")
        y = check_op(op, x, dim=1, backward=False)
        g = make_tensor((outer, d, inner), dtype, device)
        backward = getattr(torch.ops.fastact, f"{op.name}_backward")
        (dx_ref, _), (dx_pt, _) = op.backward_given(g, x, y, dim=1)
        assert_close(backward(g, y, 1, dtype), dx_ref, dtype, torch_actual=dx_pt, msg=f"{op} {list(x.shape)}: backward")
        m = make_tensor((outer, d, inner), dtype, device)
        m[-1, :, -1] = ninf  # a fully masked column
        if d > 1:
            m[0, : d // 2, inner // 2] = ninf  # masked elements
            m[outer // 2, 0, :] = ninf
        check_op(op, m, dim=1)
        if dtype in (torch.float16, torch.bfloat16):
            check_op(op, m, dim=1, dtype=torch.float32)


@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
@pytest.mark.parametrize(
    "shape,dim",
    [
        ((4096, 1), 0),
        ((1, 4096), 1),
        ((2, 5, 3, 7), 0),
        ((2, 5, 3, 7), 2),
        ((1, 1, 1, 1), 3),
        ((1, 3000), 0),
        ((64, 3, 1), 1),
        ((10007, 5), -1),  # many short rows: the split of rows over threads
        ((3, 5, 10007), 1),  # a wide inner that is no multiple of any SIMD width
        ((2, 3, 70001), 1),
        ((7, 3001, 2), 1),  # long columns, narrow inner
    ],
)
def test_softmax_degenerate_geometries(device, dtype, op, shape, dim):
    check_op(op, make_tensor(shape, dtype, device), dim=dim)


# ----------------------------------------------------------------------------------------------
# Layouts


@pytest.mark.parametrize("op", ALL_OPS, ids=str)
@pytest.mark.parametrize(
    "layout",
    [
        "transposed",
        "channels_last",
        "sliced_first",  # x[1:]: dense, offset start
        "rows_strided",  # x[:, :D] of a wider tensor: rows with a stride, aligned start
        "double_slice",  # x[1:, 2:-1]: offset and row stride
        "stepped_last",  # x[..., ::2]: unit stride broken in the reduced dim
        "expanded_last",  # a row of stride 0
        "broadcast_rows",  # x.expand over rows
        "transposed_stepped",  # x.t()[:, ::2]: gaps, and a memory order that is not row-major
        "transposed_expanded",  # an expanded dim over a transposed tensor
    ],
)
def test_layouts(device, dtype, op, layout):
    shape = (6, 5, 4, 9)
    if layout == "transposed":
        x = make_tensor(shape, dtype, device, "transposed").transpose(0, 1)
    elif layout == "channels_last":
        x = make_tensor(shape, dtype, device).contiguous(memory_format=torch.channels_last)
    elif layout == "sliced_first":
        x = make_tensor((7,) + shape[1:], dtype, device)[1:]
    elif layout == "rows_strided":
        x = strided_tensor(shape, dtype, device, slices={3: (0, 1, 7)})
    elif layout == "double_slice":
        x = strided_tensor(shape, dtype, device, slices={0: (1, 1, 0), 3: (2, 1, 1)})
    elif layout == "stepped_last":
        x = strided_tensor(shape, dtype, device, slices={3: (0, 2, 0)})
    elif layout == "expanded_last":
        x = strided_tensor(shape, dtype, device, expand=(3,))
    elif layout == "transposed_stepped":
        x = strided_tensor(shape, dtype, device, perm=(3, 2, 1, 0), slices={3: (0, 2, 0)})
    elif layout == "transposed_expanded":
        x = strided_tensor(shape, dtype, device, perm=(0, 1, 3, 2), expand=(0,))
    else:
        x = strided_tensor(shape, dtype, device, expand=(0, 1))
    bias = bias_for(x, "strided") if op.takes_bias else None
    for dim in (-1, 0, 2) if op.takes_dim else (None,):
        check_op(op, x, dim=dim, bias=bias, grad_layout="transposed")


@pytest.mark.parametrize("op", ALL_OPS, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "permuted", "offset", "channels_last"])
def test_output_keeps_dense_layout(device, op, layout):
    """A dense input's output has the input's strides (empty_like); bias_gelu's is contiguous."""
    shape = (3, 4, 5, 6)
    if layout == "channels_last":
        x = make_tensor(shape, torch.float32, device).contiguous(memory_format=torch.channels_last)
    else:
        x = make_tensor(shape, torch.float32, device, layout)
    assert is_dense(x)
    bias = bias_for(x) if op.takes_bias else None
    y = op.fastact(x, dim=1, bias=bias)
    if op.takes_bias:
        assert y.is_contiguous(), y.stride()
    else:
        assert y.stride() == x.stride(), (y.stride(), x.stride())


@pytest.mark.parametrize("op", ALL_OPS, ids=str)
@pytest.mark.parametrize("layout", ["sliced_last", "sliced_step", "expanded"])
def test_output_of_non_dense_input_is_contiguous(device, op, layout):
    x = make_tensor((3, 4, 5, 6), torch.float32, device, layout)
    assert not is_dense(x)
    y = op.fastact(x, dim=-1, bias=bias_for(x) if op.takes_bias else None)
    assert y.is_contiguous(), y.stride()


def test_input_is_not_modified(device):
    x = make_tensor((5, 33), torch.float16, device, "sliced_last")
    base_before = x._base.clone()
    for op in ALL_OPS:
        x_ = x.detach().requires_grad_()
        y = op.fastact(x_, dim=0, bias=bias_for(x) if op.takes_bias else None)
        y.backward(torch.ones_like(y))
    torch.testing.assert_close(x._base, base_before, rtol=0, atol=0)


# ----------------------------------------------------------------------------------------------
# Empty tensors


EMPTY_SHAPES = [(0,), (0, 5), (5, 0), (0, 0), (2, 0, 3), (2, 3, 0), (0, 3, 4), (1, 0, 1, 2)]


@pytest.mark.parametrize("shape", EMPTY_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
def test_softmax_empty(device, dtype, op, shape):
    x = make_tensor(shape, dtype, device)
    for dim in range(-len(shape), len(shape)):
        y = check_op(op, x, dim=dim)
        assert y.numel() == 0


@pytest.mark.parametrize("shape", EMPTY_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("op", ELEMENTWISE_OPS, ids=str)
def test_elementwise_empty(device, dtype, op, shape):
    x = make_tensor(shape, dtype, device)
    y = check_op(op, x, bias=bias_for(x) if op.takes_bias else None)
    assert y.numel() == 0


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_gelu_no_rows_gives_zero_bias_grad(device, dtype, approximate):
    # the bias gradient of an input with no rows is a sum over nothing: zeros, not garbage
    for shape in [(0, 37), (3, 0, 129), (0, 1025)]:
        x = make_tensor(shape, dtype, device).requires_grad_()
        b = bias_for(x).requires_grad_()
        y = fastact.bias_gelu(x, b, approximate)
        y.backward(torch.ones_like(y))
        assert torch.equal(b.grad, torch.zeros_like(b)), (shape, b.grad)


# ----------------------------------------------------------------------------------------------
# softmax(dtype=)

DTYPE_PAIRS = [(a, b) for a in FLOAT_DTYPES for b in FLOAT_DTYPES]


@pytest.mark.parametrize("in_dtype,out_dtype", DTYPE_PAIRS, ids=[f"{dtype_id(a)}-to-{dtype_id(b)}" for a, b in DTYPE_PAIRS])
@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
@pytest.mark.parametrize("case", ["rows", "strided", "sliced", "long"])
def test_softmax_dtype_argument(device, op, in_dtype, out_dtype, case):
    """softmax(x, dim, dtype=d) == softmax(x.to(d), dim): fused for bf16/fp16 -> fp32, a cast
    otherwise; the gradient comes back in x's dtype."""
    if case == "rows":
        x, dim = make_tensor((9, 129), in_dtype, device), -1
    elif case == "strided":
        x, dim = make_tensor((4, 33, 5), in_dtype, device), 1
    elif case == "sliced":
        x, dim = make_tensor((9, 64), in_dtype, device, "sliced_last"), -1
    else:
        x, dim = make_tensor((2, 4099), in_dtype, device), -1
    y = check_op(op, x, dim=dim, dtype=out_dtype, grad_layout="transposed")
    assert y.dtype == out_dtype


INTEGRAL_DTYPES = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]


def _integral(dtype, device, layout="contiguous"):
    """A [6, 33] tensor of random integers (-20..20, 0..40 for uint8) or bools; `layout`
    contiguous, transposed (a [33, 6] base, .t()) or sliced_step (a [6, 66] base, [:, ::2])."""
    base_shape = {"contiguous": (6, 33), "transposed": (33, 6), "sliced_step": (6, 66)}[layout]
    v = (make_tensor(base_shape, torch.float64, device) * 12).round().clamp(-20, 20)
    base = (v > 0) if dtype == torch.bool else (v + 20 if dtype == torch.uint8 else v).to(dtype)
    return {"contiguous": base, "transposed": base.t(), "sliced_step": base[:, ::2]}[layout]


@pytest.mark.parametrize("in_dtype", INTEGRAL_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced_step"])
def test_integral_inputs_as_torch(device, in_dtype, layout):
    """torch casts an integer or bool input where its op allows one: sigmoid (a pointwise row with
    integral_to_default) computes it in the default dtype; softmax and log_softmax take it with dtype= (cast
    first) and raise without; the other pointwise ops (gelu) raise. Same dtypes, layouts and values (to float64's
    rounding) as torch."""
    x = _integral(in_dtype, device, layout)
    for op in POINTWISE_OPS:
        if not op.row.integral_to_default:
            with pytest.raises(RuntimeError, match=op.name):
                op.fastact(x)
            continue
        for default in (torch.float32, torch.float64):
            old = torch.get_default_dtype()
            torch.set_default_dtype(default)
            try:
                y, want = op.fastact(x), op.torch(x)
                why = fastact.explain(op.name, x)
            finally:
                torch.set_default_dtype(old)
            assert y.dtype == want.dtype == default and y.stride() == want.stride()
            assert f"converted to {'Float' if default == torch.float32 else 'Double'}" in why, why
            torch.testing.assert_close(y, want, rtol=2 * torch.finfo(default).eps, atol=0)
    for out_dtype in FLOAT_DTYPES:
        for name, dim in (("softmax", -1), ("log_softmax", 0)):
            y = getattr(fastact, name)(x, dim, dtype=out_dtype)
            want = getattr(torch, name)(x.to(torch.float64), dim).to(out_dtype)
            assert y.dtype == out_dtype and y.shape == x.shape
            tol = {torch.float32: 2e-6, torch.float64: 1e-12}.get(out_dtype, 2 * torch.finfo(out_dtype).eps)
            torch.testing.assert_close(y, want, rtol=tol, atol=tol)
    with pytest.raises(RuntimeError, match="softmax"):
        fastact.softmax(x, -1)
    with pytest.raises(RuntimeError, match="log_softmax"):
        fastact.log_softmax(x, -1)
    with pytest.raises(RuntimeError, match="softmax"):
        fastact.softmax(x, -1, dtype=torch.int64)  # an integer dtype is refused, as by torch


def test_integral_inputs_compile_and_vmap(device):
    """The same rules through torch.compile(fullgraph=True) (the fake kernels' dtypes) and vmap."""
    x = _integral(torch.int32, device)

    def f(t):
        return fastact.sigmoid(t) + fastact.log_softmax(t, -1, dtype=torch.float32)

    want = torch.sigmoid(x) + torch.log_softmax(x, -1, dtype=torch.float32)
    torch.testing.assert_close(torch.compile(f, fullgraph=True)(x), want)
    torch.testing.assert_close(torch.vmap(f)(x), want)
    torch.library.opcheck(torch.ops.fastact.sigmoid.default, (x,))
    torch.library.opcheck(torch.ops.fastact.softmax.default, (x, 1, torch.float64))
    # the fake kernel refuses an integer dtype= as the real op does (it skips the input's check here)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = mode.from_tensor(x)
        for op in (torch.ops.fastact.softmax, torch.ops.fastact.log_softmax):
            with pytest.raises(RuntimeError, match="expected dtype"):
                op(fake, -1, torch.int64)


def test_softmax_dtype_none_keeps_dtype(device, dtype):
    x = make_tensor((3, 7), dtype, device)
    assert fastact.softmax(x, -1, dtype=None).dtype == dtype
    assert fastact.log_softmax(x, 0).dtype == dtype


# ----------------------------------------------------------------------------------------------
# Values: invariants and special values


@pytest.mark.parametrize("shape,dim", [((64, 1000), -1), ((8, 4097), -1), ((16, 300, 5), 1), ((3, 65536), 1), ((700, 2), 0)])
def test_softmax_invariants(device, dtype, shape, dim):
    """Softmax rows sum to 1 and lie in [0, 1]; log_softmax is <= 0 and its logsumexp is 0.

    Bounds: rounding each output to the dtype moves a row's sum by at most eps/2 (the outputs sum
    to 1); the normalising sum, computed in float (double for float64), adds about sqrt(D) ulps of
    the compute type. For log_softmax the rounding of an output y is |y| eps/2, weighted by the
    probabilities: at most log(D) eps/2."""
    x = make_tensor(shape, dtype, device, scale=5.0)
    d = shape[dim]
    eps = torch.finfo(dtype).eps
    compute_eps = torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps
    compute_tol = compute_eps * (4 + d**0.5)

    y = fastact.softmax(x, dim)
    assert ((y >= 0) & (y <= 1)).all()
    err = (y.double().sum(dim) - 1).abs().max().item()
    assert err <= eps + compute_tol, err

    ly = fastact.log_softmax(x, dim)
    assert (ly <= 0).all()
    err = torch.logsumexp(ly.double(), dim).abs().max().item()
    assert err <= eps * (1 + math.log(d)) + compute_tol, err


@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
@pytest.mark.parametrize("n,dim", [(1, -1), (7, -1), (33, -1), (1025, -1), (4099, -1), (50257, -1), (7, 0), (300, 0)])
def test_softmax_special_values(device, dtype, op, n, dim):
    """Rows of all -inf give NaN (as torch), a +inf or a NaN in a row makes it NaN, a partly -inf
    (masked) row is finite with zeros (or -inf for log_softmax) where masked, gradients included."""
    shape = (6, n) if dim == -1 else (n, 6)
    ninf, inf, nan = float("-inf"), float("inf"), float("nan")

    def along(t, k):  # row/column k along the reduced dim
        return t[k] if dim == -1 else t[:, k]

    x = make_tensor(shape, dtype, device)
    along(x, 0).fill_(ninf)  # all -inf
    along(x, 2)[n // 2] = inf
    along(x, 3)[n // 3] = nan
    along(x, 4)[0] = inf
    along(x, 4)[-1] = ninf
    check_op(op, x, dim=dim, backward=False)

    # masked rows (attention masks), forward and backward
    m = make_tensor(shape, dtype, device)
    along(m, 1)[: n // 2] = ninf
    along(m, 5)[1::2] = ninf
    if n > 1:  # a masked element, not a fully masked row
        along(m, 3)[-1] = ninf
    check_op(op, m, dim=dim)


@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "sliced_last"])
def test_softmax_short_rows(device, dtype, op, layout):
    """Every row length from 1 to 65 (the CPU kernels turn rows shorter than two SIMD vectors so that a lane
    holds a row, kV rows at a time: in float D < 16 on AVX2 and < 32 on AVX512 (on AVX512 forwards < 27, but float
    log_softmax's, which takes rows of 24-128 in blocks, and backwards < 10: csrc/cpu/softmax_kernels.cpp
    softmax_rows_turned, log_softmax_rows_blocked), in double < 8 and < 16; longer
    rows end in a tail of every length 0 to 2 kV - 1, element by element or through padded vectors), 19 rows (a
    partial block of lanes): an all -inf row, a +inf and a NaN (the row's last element) forward; masked
    elements and a fully masked row forward and backward, against float64."""
    ninf = float("-inf")
    for d in range(1, 66):
        x = make_tensor((19, d), dtype, device, layout=layout)
        x[0] = ninf
        x[5, d // 2] = float("inf")
        x[18, d - 1] = float("nan")
        check_op(op, x, dim=-1, backward=False)
        m = make_tensor((19, d), dtype, device, layout=layout)
        m[3] = ninf
        if d > 1:
            m[7, 0] = ninf
            m[18, d // 2] = ninf
        check_op(op, m, dim=-1)


@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "sliced_last"])
def test_softmax_row_blocks(device, dtype, op, layout):
    """Rows of 24-129 over many rows: the AVX512 float log_softmax forward takes rows of 24-128 in blocks of 16-85
    rows, a pass over the block at a time (csrc/cpu/softmax_kernels.cpp log_softmax_blocked_fwd), so 300 rows give whole
    blocks, a partial last block and several tasks; all -inf, NaN and +inf rows land in the first, a middle and the
    last block, against float64 (backward too, through masked rows)."""
    ninf = float("-inf")
    for d in (24, 31, 32, 33, 47, 64, 65, 100, 127, 128, 129):
        x = make_tensor((300, d), dtype, device, layout=layout)
        x[0] = ninf
        x[150, d // 3] = float("nan")
        x[17, d - 1] = float("inf")
        x[299] = ninf
        x[200, :] = 3.0
        check_op(op, x, dim=-1, backward=False)
        m = make_tensor((300, d), dtype, device, layout=layout)
        m[1] = ninf
        m[160, ::2] = ninf
        check_op(op, m, dim=-1)


@pytest.mark.parametrize("op", ALL_OPS, ids=str)
def test_large_values(device, dtype, op):
    """No overflow: values of 1e4 (65000 in float16 and bfloat16) go through exp/erf/tanh safely."""
    big = 65000.0 if dtype in (torch.float16, torch.bfloat16) else 1e4
    x = make_tensor((4, 40), dtype, device)
    x[0, :3] = big
    x[1, ::2] = -big
    x[2, 5] = big
    x[2, 6] = -big
    x[3] = big  # a whole row of the same huge value
    x[:, 10] = 1e4
    x[:, 11] = -1e4
    bias = bias_for(x) if op.takes_bias else None
    for dim in (-1, 0) if op.takes_dim else (None,):
        y = check_op(op, x, dim=dim, bias=bias)
        if op.name in ("softmax", "sigmoid"):
            assert y.isfinite().all()


def test_sigmoid_saturates_finite(device, dtype):
    x = torch.tensor([1e4, -1e4, 100.0, -100.0, 30.0, -30.0, 0.0], dtype=dtype, device=device)
    x = x.requires_grad_()
    y = fastact.sigmoid(x)
    assert y.isfinite().all(), y
    assert y[0].item() == 1.0 and y[1].item() == 0.0 and y[6].item() == 0.5
    y.backward(torch.ones_like(y))
    assert x.grad.isfinite().all(), x.grad
    assert x.grad[0].item() == 0.0 and x.grad[1].item() == 0.0


@pytest.mark.parametrize("op", ELEMENTWISE_OPS, ids=str)
def test_elementwise_special_values(device, dtype, op):
    """+-inf and NaN as the float64 formula has them (gelu(-inf) is NaN: -inf * 0)."""
    vals = [float("inf"), float("-inf"), float("nan"), 0.0, -0.0, 1.0, -1.0]
    x = torch.tensor(vals * 7, dtype=dtype, device=device).view(7, 7)
    check_op(op, x, bias=bias_for(x) if op.takes_bias else None, backward=False)


@pytest.mark.parametrize("op", [o for o in ALL_OPS if not o.takes_bias], ids=str)  # 0-d bias_gelu: an error
def test_scalar_tensor(device, dtype, op):
    x = torch.tensor(0.75, dtype=dtype, device=device)
    for dim in (0, -1) if op.takes_dim else (None,):
        y = check_op(op, x, dim=dim)
        assert y.dim() == 0


# Outputs of 16 MiB or more take the CPU kernels' streaming-store path (csrc/cpu/vec_io.h and the kernel files,
# kStreamBytes): elementwise over one long array; softmax backward over rows that start off the 64-byte
# boundary, through the StreamStager (rows of up to 1 KB) or with a head of plain stores (longer rows).
_STREAM_BYTES = 16 << 20


@pytest.mark.parametrize("op", [o for o in ELEMENTWISE_OPS if not o.takes_bias], ids=str)
def test_large_output_elementwise(device, dtype, op):
    n = _STREAM_BYTES // dtype.itemsize + 37
    check_op(op, make_tensor((n,), dtype, device))


@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
@pytest.mark.parametrize("d", [40, 64, 77, 100, 128, 197])
@pytest.mark.parametrize("cast", [False, True], ids=["same", "to_f32"])
def test_large_output_softmax_short_rows(device, dtype, op, d, cast):
    """Rows the CPU backward holds in registers (softmax_bwd_row_in_registers: up to 128 elements on AVX512, 64 on
    AVX2) and short rows of the row loop (197; float64's streamed directly), with a dx of 16 MiB or more: streamed
    through a StreamStager, whose tasks start at many offsets from the alignment (rows of 40, 77, 100 and 197) and
    copy the units at their ends plainly."""
    if cast and dtype not in (torch.float16, torch.bfloat16):
        pytest.skip("the fused cast widens 16-bit inputs")
    rows = _STREAM_BYTES // (d * dtype.itemsize) + 3
    check_op(op, make_tensor((rows, d), dtype, device), dim=-1, dtype=torch.float32 if cast else None)


@pytest.mark.parametrize("isa", ["avx2", "default"])
def test_large_output_softmax_other_isas(isa):
    """The streamed 16-bit softmax tests above under the CPU kernels built for narrower vectors than the machine's
    (ATEN_CPU_CAPABILITY; a vector pair holds 16 floats there, not 32, and the portable build's streaming store
    is a plain one): a row's head before the 64-byte alignment spans up to two pairs in 16-bit. Rows of 77 (in
    registers), 197 (the row loop through a StreamStager) and 1003 (a head, then streamed), each ~3 s a case."""
    if not torch.backends.cpu.get_cpu_capability().lower().startswith("avx"):
        pytest.skip("a CPU without AVX2: the kernels already run the narrowest build")
    pytest_under_isa(__file__, isa, "cpu and (f16 or bf16) and large_output_softmax and not other_isas and (77 or 197 or 1003)")



# bfloat16 vector pairs in lane order (csrc/cpu/vec_io.h, Io<c10::BFloat16>::load2_lanes on AVX2: elements 0-3 and
# 8-11 in one float vector, 4-7 and 12-15 in the other), which every loop that uses them must load and store alike:
# the elementwise maps, the softmax family's row max, sums and writing passes (rows held in registers, the row loop,
# padded and element-by-element tails), bias_gelu's forward. Rows of less than a pair, of whole pairs, and of pairs
# with tails of 1, 4 (kPaddedTailBwd) and more.
PAIR_SHAPES = [(5, 15), (3, 16), (4, 17), (3, 20), (6, 48), (3, 64), (2, 65), (7, 96), (3, 100), (2, 128), (3, 129),
               (2, 4097)]


@pytest.mark.parametrize("shape", PAIR_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("op", ALL_OPS, ids=str)
def test_bf16_pairs(device, op, shape):
    x = make_tensor(shape, torch.bfloat16, device, scale=3.0)
    check_op(op, x, dim=-1, bias=bias_for(x) if op.takes_bias else None)
    if op.takes_dim:  # the fused cast: bf16 in, float out (element order on the float side)
        check_op(op, x, dim=-1, dtype=torch.float32)
    # NaN and infinities through the lane-order loads and stores: NaN and infinite outputs where the float64 formula
    # has them (a softmax row with a NaN is NaN; sigmoid(-inf) is 0, gelu(inf) is inf; README.md "Special values").
    # Not torch's bfloat16 result: its vectorised erf GELU gives NaN for +inf on some CPUs.
    x.view(-1)[::7] = float("nan")
    x.view(-1)[3::11] = float("inf")
    x.view(-1)[5::13] = -float("inf")
    b = bias_for(x) if op.takes_bias else None
    y, want = op.fastact(x, bias=b), op.formula(x, bias=b).to(x.dtype)
    assert torch.equal(y.isnan(), want.isnan()), f"{op.id} {shape}: NaN at other places than the formula's"
    assert torch.equal(y.isinf(), want.isinf()) and torch.equal(y[y.isinf()], want[want.isinf()]), (
        f"{op.id} {shape}: infinities at other places than the formula's")


@pytest.mark.parametrize("op", [o for o in ELEMENTWISE_OPS if not o.takes_bias], ids=str)
def test_bf16_stores_independent_of_size(op):
    """A bfloat16 output's vector body has the same bits whether the output is small (plain stores, lane order on
    AVX2) or streamed (16 MiB or more): every store path of an ISA rounds alike. Inputs that give float results under
    bfloat16's smallest normal (sigmoid(-88) = 6e-39, where AVX512-BF16's conversion flushes to zero) and NaN."""
    n_small = 4096
    n_large = _STREAM_BYTES // 2 + 4096
    g = torch.Generator().manual_seed(5)
    x = (torch.rand(n_large, generator=g) * 200 - 100).to(torch.bfloat16)
    x[: n_small : 9] = -88.0
    x[4 : n_small : 97] = float("nan")
    body = slice(64, n_small - 64)  # past any head up to the stream alignment and before the small output's tail
    small, large = op.fastact(x[:n_small].clone()), op.fastact(x)
    assert torch.equal(small[body].view(torch.int16), large[body].view(torch.int16)), op.id


def test_bf16_pairs_other_isas():
    """test_bf16_pairs and the streamed bfloat16 elementwise ops under the AVX2 build on a CPU whose own build is wider
    (ATEN_CPU_CAPABILITY): lane order exists in the AVX2 build alone, which an AVX512 machine runs only when told."""
    cap = torch.backends.cpu.get_cpu_capability().lower()
    if not cap.startswith("avx512"):
        pytest.skip(f"the CPU's own build is {cap}: test_bf16_pairs already runs it")
    pytest_under_isa(__file__, "avx2", "cpu and ((bf16_pairs and not other_isas) or (large_output_elementwise and bf16))")


@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
@pytest.mark.parametrize("cast", [False, True], ids=["same", "to_f32"])
@pytest.mark.parametrize("d", [1003, 2100])
def test_large_output_softmax(device, dtype, op, cast, d):
    """Longer rows with a dx of 16 MiB or more, past the StreamStager's rows (kStagedBwdRowBytes): streamed directly
    after a head of plain stores."""
    if cast and dtype not in (torch.float16, torch.bfloat16):
        pytest.skip("the fused cast widens 16-bit inputs")
    rows = _STREAM_BYTES // (d * dtype.itemsize) + 3
    check_op(op, make_tensor((rows, d), dtype, device), dim=-1, dtype=torch.float32 if cast else None)
