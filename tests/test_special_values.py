"""The special-value semantics that README.md writes down ("Special values"), op by op: +-inf, NaN, -0,
subnormals and the largest finite numbers, forward and backward, in every dtype on every device.

The reference is the op's formula evaluated in float64 (OpSpec.formula), never torch's result in the
tested dtype: that one depends on the CPU (torch's vectorised erf GELU gives NaN for +inf in float32 and
bfloat16 on AVX512 machines, +inf elsewhere), and fastact's must not. The special values sit at
several positions of rows long enough to cover the kernels' vector bodies, their tails and (on the
CPU) the 16-bit lane-order pairs."""

import pytest
import torch

import fastact
from fastact_testing import ELEMENTWISE_OPS, SOFTMAX_OPS, assert_close, bias_for, make_tensor, pytest_under_isa

INF, NAN = float("inf"), float("nan")
LENGTHS = (13, 77, 1000)  # under one vector pair, a body and a tail, several blocks


def specials(dtype):
    """The special inputs of one dtype: infinities, NaN, signed zeros, the smallest subnormal and the largest
    finite number of each sign, and numbers whose exp/erf saturate."""
    fi = torch.finfo(dtype)
    tiny_sub = fi.tiny * fi.eps  # the smallest positive subnormal
    return [INF, -INF, NAN, 0.0, -0.0, tiny_sub, -tiny_sub, fi.tiny, fi.max, -fi.max, 100.0, -100.0]


def with_specials(n, dtype, device, rows=3):
    """Random rows of length n with every special value at spread positions of each row (a different spread per
    row, so each lands in the vector body and in the tail somewhere)."""
    x = make_tensor((rows, n), dtype, device, scale=3.0)
    vals = specials(dtype)
    for r in range(rows):
        for k, v in enumerate(vals):
            x[r, (k * (n // len(vals) + r) + r) % n] = v
    return x


def assert_same_specials(y, ref, msg):
    """NaN where the reference has NaN, the same infinities, and -0 where the reference is -0 (the sign of an exact
    zero is part of the result: gelu(-0) is -0)."""
    assert torch.equal(y.isnan(), ref.isnan()), f"{msg}: NaN at {(y.isnan() != ref.isnan()).nonzero()[:5].tolist()}"
    inf = ref.isinf() | y.isinf()
    assert torch.equal(y[inf], ref[inf]), f"{msg}: infinities {y[inf].tolist()} != {ref[inf].tolist()}"
    zero = (ref == 0) & (y == 0)
    assert torch.equal(y[zero].signbit(), ref[zero].signbit()), f"{msg}: the sign of a zero differs"


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("op", ELEMENTWISE_OPS, ids=str)
def test_elementwise_specials_forward(device, dtype, op, n):
    x = with_specials(n, dtype, device)
    bias = bias_for(x) if op.takes_bias else None
    if bias is not None:
        bias[1] = -0.0  # x + (-0) keeps x's zeros' signs; +0 would turn -0 into +0
        bias[2] = INF
    y = op.fastact(x, bias=bias)
    ref64 = op.formula(x, bias=bias)
    assert_same_specials(y, ref64.to(dtype), f"{op.id} {dtype} n={n}")
    assert_close(y, ref64, msg=f"{op.id} {dtype} n={n}")


@pytest.mark.parametrize("op", ELEMENTWISE_OPS, ids=str)
def test_elementwise_specials_table(device, dtype, op):
    """README.md's table, value by value (an op the table does not list yet: its float64 reference's values)."""
    if op.takes_bias:
        pytest.skip("bias_gelu is gelu(x + bias): the gelu rows cover it, test_elementwise_specials_forward the sum")
    fi = torch.finfo(dtype)
    x = torch.tensor([INF, -INF, NAN, -0.0, 0.0, fi.max, -fi.max], dtype=dtype, device=device)
    y = op.fastact(x).cpu()
    readme = {
        "gelu": [INF, NAN, NAN, -0.0, 0.0, fi.max, -0.0],
        "sigmoid": [1.0, 0.0, NAN, 0.5, 0.5, 1.0, 0.0],
    }
    if op.name in readme:
        want = torch.tensor(readme[op.name], dtype=dtype)
    else:
        want = op.formula(x).to(dtype).cpu()
    assert_same_specials(y, want, op.id)
    assert torch.equal(y.nan_to_num(), want.nan_to_num()), f"{op.id}: {y.tolist()} != {want.tolist()}"


@pytest.mark.parametrize("op", ELEMENTWISE_OPS, ids=str)
def test_elementwise_subnormals(device, dtype, op):
    """Subnormal inputs are numbers, not zeros: gelu(s) is about s/2, sigmoid(s) is 1/2. Subnormal results are
    kept in float32 and float64 (sigmoid(-100) = 3.7e-44 in float32); a 16-bit result under the smallest normal
    is either that subnormal or a zero of its sign (CPUs with a native bfloat16 conversion flush it)."""
    if op.takes_bias:
        pytest.skip("gelu(x + bias): gelu's case")
    fi = torch.finfo(dtype)
    wide = dtype in (torch.float32, torch.float64)
    far = -720.0 if dtype == torch.float64 else -100.0  # sigmoid: a subnormal result (2.9e-313, 3.7e-44)
    x = torch.tensor([fi.tiny / 4, -fi.tiny / 4, fi.tiny, far], dtype=dtype, device=device)
    y = op.fastact(x).cpu().double()
    ref = op.formula(x.cpu()).to(dtype).double()
    sub = (ref != 0) & (ref.abs() < fi.tiny)
    if wide:
        assert (y[sub] != 0).all(), f"{op.id}: subnormal results flushed: {y.tolist()} (formula {ref.tolist()})"
        assert torch.equal(y.sign(), ref.sign()), f"{op.id}: {y.tolist()} vs {ref.tolist()}"
        assert_close(y, op.formula(x.cpu()), dtype, msg=op.id)
    else:
        exact_or_flushed = (y == ref) | ((y == 0) & sub & (y.signbit() == ref.signbit()))
        assert exact_or_flushed.all(), f"{op.id}: {y.tolist()} vs {ref.tolist()}"


@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
@pytest.mark.parametrize("dim", [-1, 0])
def test_softmax_specials_table(device, dtype, op, dim):
    """A row with NaN, or with +inf, is all NaN; a row of only -inf is all NaN; -inf elements of a row with a finite
    element are 0 (log_softmax: -inf); a row of the largest finite numbers is uniform; -0 and +0 are equal."""
    fi = torch.finfo(dtype)
    rows = torch.tensor([
        [1.0, NAN, 2.0, 3.0],
        [1.0, INF, 2.0, 3.0],
        [-INF, -INF, -INF, -INF],
        [1.0, -INF, 2.0, -INF],
        [fi.max, fi.max, fi.max, fi.max],
        [-0.0, 0.0, -0.0, 0.0],
        [INF, -INF, 0.0, 1.0],
    ], dtype=dtype)
    x = (rows if dim == -1 else rows.t().contiguous()).to(device)
    y = op.fastact(x, dim=dim).cpu()
    y = y if dim == -1 else y.t()
    nan = torch.tensor([True, True, True, False, False, False, True])
    assert torch.equal(y.isnan().all(1), nan) and not y[~nan].isnan().any(), y
    masked = rows[3].isneginf()
    if op.name == "softmax":
        assert (y[3][masked] == 0).all() and torch.allclose(y[4:6].double(), torch.full((2, 4), 0.25, dtype=torch.float64))
    else:
        assert y[3][masked].isneginf().all() and torch.allclose(y[4:6].double(), torch.full((2, 4), -1.3862943611198906,
                                                                                             dtype=torch.float64), rtol=1e-2)
    assert_close(y.to(device), op.formula(x, dim=dim).t() if dim == 0 else op.formula(x, dim=dim), msg=op.id)


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
def test_softmax_specials_rows(device, dtype, op, n):
    """Every special value in long rows (vector bodies and tails): rows with NaN or +inf are NaN; the forward against
    the float64 formula, infinities and signs included."""
    x = with_specials(n, dtype, device, rows=4)
    x[3] = make_tensor((n,), dtype, device)  # a row without specials but for -inf and subnormals
    x[3, ::5] = -INF
    x[3, 1::7] = torch.finfo(dtype).tiny * torch.finfo(dtype).eps
    y = op.fastact(x, dim=-1)
    ref = op.formula(x, dim=-1)
    assert_same_specials(y, ref.to(dtype), f"{op.id} n={n}")
    assert_close(y, ref, msg=f"{op.id} n={n}")


def test_backward_specials(device, dtype):
    """The gradients at special values: gelu's at +-inf and NaN is NaN (Phi(x) + x phi(x) with inf * 0); sigmoid's
    is 0 where the output is exactly 0 or 1 (sigmoid(+-inf)), NaN at NaN; softmax's backward of a NaN row is a NaN
    row and of a masked element 0 (log_softmax's: the incoming gradient's share, finite)."""
    x = torch.tensor([INF, -INF, NAN, -0.0, 0.0, 100.0, -100.0], dtype=dtype, device=device)
    g = torch.ones_like(x)
    for approximate in ("none", "tanh"):
        dx = torch.ops.fastact.gelu_backward(g, x, approximate).cpu()
        want = torch.tensor([NAN, NAN, NAN, 0.5, 0.5, 1.0, 0.0], dtype=dtype)
        assert torch.equal(dx.isnan(), want.isnan()) and torch.equal(dx.nan_to_num(), want.nan_to_num()), (
            approximate, dx.tolist())
    y = fastact.sigmoid(x)
    dx = torch.ops.fastact.sigmoid_backward(g, y).cpu()
    assert torch.equal(dx.isnan(), torch.tensor([False, False, True, False, False, False, False])), dx.tolist()
    assert dx[0] == 0 and dx[1] == 0 and dx[3] == 0.25 and dx[4] == 0.25, dx.tolist()

    rows = torch.tensor([[1.0, NAN, 2.0], [1.0, -INF, 2.0], [-INF, -INF, -INF]], dtype=dtype, device=device)
    for op in SOFTMAX_OPS:
        xr = rows.clone().requires_grad_()
        op.fastact(xr, dim=-1).backward(torch.ones_like(rows))
        gx = xr.grad.cpu()
        assert gx[0].isnan().all() and gx[2].isnan().all() and not gx[1].isnan().any(), (op.id, gx.tolist())
        assert gx[1, 1] == 0 if op.name == "softmax" else gx[1, 1].isfinite(), (op.id, gx.tolist())


@pytest.mark.parametrize("isa", ["avx2", "default"])
def test_special_values_other_isas(isa):
    """This file under the CPU kernels of a narrower instruction set than the machine's (ATEN_CPU_CAPABILITY: torch's
    and fastact's kernels both follow it), so one CI machine checks the semantics of every build it can run."""
    order = ["default", "avx2", "avx512"]
    cap = torch.backends.cpu.get_cpu_capability().lower()
    if cap not in order or order.index(cap) <= order.index(isa):
        pytest.skip(f"the CPU's own build is {cap}: the plain run covers {isa}")
    pytest_under_isa(__file__, isa, "cpu")
