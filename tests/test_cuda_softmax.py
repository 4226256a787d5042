"""CUDA only, softmax and log_softmax along rows: every variant forced on every shape class it accepts (boundary
sizes, every dtype and the fused casts, forward and backward; cuda_testing's sweep), and the dispatcher's plans of
short and medium rows as explain() reports them (warp and vec, element rows, two passes, rows off the alignment,
16-bit rows realigned in shared memory), each plan checked for what every plan must satisfy and run: auto bitwise the
variant it names, forced. Long rows: test_cuda_softmax_long_rows.py; a dim with inner > 1:
test_cuda_softmax_strided.py."""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import fastact  # noqa: E402
from cuda_testing import (  # noqa: E402
    CLASSES,
    CUDA_SIZES,
    DTYPE_CONFIGS,
    THRESHOLDS,
    VARIANTS,
    _call,
    _explain_plan,
    _variant,
    _vec_width,
    make_class,
    must_accept,
    must_refuse,
)
from fastact_testing import (  # noqa: E402
    SOFTMAX_OPS,
    assert_close,
    coarsest,
    describe,
    dtype_id,
    fused_cast_forward_failures,
    is_dense,
    make_tensor,
    poison_allocator,
    softmax_backward_ref,
    softmax_backward_torch,
    strided_tensor,
)

pytestmark = pytest.mark.cuda
ops = torch.ops.fastact


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("dtypes", DTYPE_CONFIGS, ids=lambda p: f"{dtype_id(p[0])}-{dtype_id(p[1])}")
@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
@pytest.mark.parametrize("variant", VARIANTS)
def test_forced_variant(variant, op, dtypes, cls):
    in_dtype, out_dtype = dtypes
    log = op.name == "log_softmax"
    fwd = getattr(ops, op.name).default
    bwd = getattr(ops, f"{op.name}_backward").default
    out_arg = out_dtype if out_dtype != in_dtype else None
    failures, accepted = [], []
    for d in CUDA_SIZES:
        if cls.startswith("strided_") and d > 65536:
            continue
        x, dim = make_class(cls, d, in_dtype)
        msg = f"{variant} {op.name} {describe(x)} dim={dim} out={out_dtype}"
        try:
            # forward
            poison_allocator("cuda", x.numel() * out_dtype.itemsize)
            y, refusal = _call(lambda: fwd(x, dim, out_arg, variant=variant))
            if refusal is not None:
                assert not must_accept(variant, cls, d, in_dtype), f"{msg}: refused an input it must take: {refusal}"
                assert variant in refusal or op.name in refusal, f"{msg}: refusal names neither op nor variant: {refusal}"
            else:
                assert not must_refuse(variant, cls, d, in_dtype, out_dtype, backward=False), (
                    f"{msg}: took an input it must refuse"
                )
                accepted.append(d)
                assert y.dtype == out_dtype and y.stride() == torch.empty_like(x, dtype=out_dtype).stride(), f"{msg}: {describe(y)}"
                ref = (torch.log_softmax if log else torch.softmax)(x.to(out_dtype).double(), dim)
                pt = (torch.log_softmax if log else torch.softmax)(x, dim, dtype=out_arg)
                assert_close(y, ref, torch_actual=pt, msg=msg + " forward")

            # backward, with the output and grad in the same class as x (computed in out_dtype,
            # gradient in in_dtype)
            y_true = (torch.log_softmax if log else torch.softmax)(x, dim, dtype=out_arg)
            y_in, _ = make_class(cls, d, out_dtype)
            y_in.copy_(y_true)  # writes through the view classes too (their elements are distinct)
            g, _ = make_class(cls, d, out_dtype)
            poison_allocator("cuda", x.numel() * in_dtype.itemsize)
            dx, refusal = _call(lambda: bwd(g, y_in, dim, in_dtype, variant=variant))
            if refusal is not None:
                assert not must_accept(variant, cls, d, in_dtype), f"{msg}: backward refused an input it must take: {refusal}"
            else:
                assert not must_refuse(variant, cls, d, in_dtype) or not is_dense(y_in), (
                    f"{msg}: backward took a misaligned output it must refuse"
                )
                assert dx.dtype == in_dtype and dx.shape == x.shape, f"{msg}: {describe(dx)}"
                assert_close(
                    dx,
                    softmax_backward_ref(g, y_in, dim, log),
                    coarsest(in_dtype, out_dtype),
                    torch_actual=softmax_backward_torch(g, y_in, dim, in_dtype, log),
                    msg=msg + " backward",
                )
        except AssertionError as e:
            failures.append(str(e)[:600])
    assert not failures, f"{len(failures)} size(s) failed:\n" + "\n".join(failures)
    if any(must_accept(variant, cls, d, in_dtype) for d in CUDA_SIZES):
        assert accepted


@pytest.mark.parametrize("variant", VARIANTS)
def test_forced_variant_through_autograd(variant):
    """The variant a forward was forced to is the one its backward uses (autograd passes it on)."""
    for cls, d in [("rows", 1024), ("strided_2", 33), ("rows", 65536), ("rows", 4096)]:
        x, dim = make_class(cls, d, torch.float32)
        x.requires_grad_()
        y, refusal = _call(lambda: fastact_softmax_variant(x, dim, variant))
        if refusal is not None:
            assert not must_accept(variant, cls, d, torch.float32), refusal
            continue
        g = make_tensor(tuple(y.shape), torch.float32, "cuda")
        y.backward(g)
        ref = softmax_backward_ref(g, torch.softmax(x.detach().double(), dim), dim, False)
        assert_close(x.grad, ref, msg=f"{variant} {cls} {d}")


def fastact_softmax_variant(x, dim, variant):
    return ops.softmax(x, dim, None, variant=variant)


def test_unknown_variant_cuda():
    x = make_tensor((4, 64), torch.float32, "cuda")
    for name in ("", "Warp", "long-row", "cpu_rows"):
        with pytest.raises(RuntimeError):
            ops.softmax(x, -1, None, variant=name)
    torch.testing.assert_close(fastact.softmax(x), torch.softmax(x, -1))


@pytest.mark.parametrize("in_dtype", (torch.bfloat16, torch.float16), ids=dtype_id)
@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
def test_fused_cast_forward_warp_pairs(op, in_dtype):
    """The resident forwards of 16-bit rows into float (block.cuh WarpPairedStores): lanes l and l ^ 16 swap halves
    of their units where the warp's 32 units lie inside the row; the warp that holds the row's end stores plain.
    Rows of whole warps (256: one warp; 1024, vec's plan on a deep-memory device, dispatch.h
    row vec-fwd-deep-cast; 2048 to 16384), of a partial last warp (264, 1000, 1016, 4104, 12296), aligned rows
    with a padded stride, and rows off the alignment (4095, 4097: plain stores); vec forced and the dispatcher's
    plan; outputs poisoned, against float64 (fastact_testing.fused_cast_forward_failures). Long rows:
    test_cuda_softmax_long_rows.py test_fused_cast_long_rows."""
    failures = []
    for d in (256, 264, 1000, 1016, 1024, 2048, 4095, 4096, 4097, 4104, 12288, 12296, 16384):
        failures += fused_cast_forward_failures(in_dtype, 37, d, ("vec", "auto"), ops=(op.name,))
    assert not failures, f"{len(failures)} case(s) failed:\n" + "\n".join(failures)


@pytest.mark.parametrize(
    "allowed,shape,dim,layout",
    [
        ({"warp", "vec"}, (4096, 256), -1, "contiguous"),  # short aligned rows
        ({"warp", "vec"}, (4096, 33), -1, "contiguous"),
        ({"vec", "long_row"}, (1024, 4096), -1, "contiguous"),  # longer than a warp holds
        ({"vec", "long_row"}, (1024, 4097), -1, "contiguous"),  # odd D, aligned base: 128-bit body, head and tail
        ({"long_row"}, (16, 50257), -1, "contiguous"),  # longer than a block caches
        ({"scalar", "long_row"}, (1024, 4097), -1, "sliced_last"),  # x[..., 1:]: misaligned, odd D: no vectors
        ({"long_row"}, (4, 262144), -1, "contiguous"),
        ({"strided"}, (64, 1024, 64), 1, "contiguous"),  # inner > 1: only strided takes it
        ({"strided"}, (8, 33, 2), 1, "contiguous"),
    ],
)
def test_explain_reports_dispatcher_branch(allowed, shape, dim, layout):
    """explain()'s variant is one that can take the input (the others refuse it: must_accept's table), its plan is
    valid, and auto runs it: bitwise the variant forced."""
    x = make_tensor(shape, torch.float32, "cuda", layout)
    s, plan = _explain_plan("softmax", x, dim)
    assert plan["variant"] in allowed, s
    assert torch.equal(ops.softmax(x, dim, None), ops.softmax(x, dim, None, variant=plan["variant"])), s


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64], ids=dtype_id)
def test_explained_variant_is_the_one_that_runs(dtype):
    """For many shapes: explain()'s variant, forced, gives bit-identical results to auto."""
    for cls in CLASSES:
        for d in (1, 32, 33, 2048, 65536) + tuple(t + k for t in THRESHOLDS for k in (-1, 0, 1)):
            x, dim = make_class(cls, d, dtype)
            for op in ("softmax", "log_softmax"):
                v = _variant(fastact.explain(op, x, dim))
                assert v in VARIANTS, v
                auto = getattr(ops, op)(x, dim, None)
                forced = getattr(ops, op)(x, dim, None, variant=v)
                assert torch.equal(auto, forced), f"{op} {describe(x)}: explain says {v}"
            y = torch.softmax(x, dim)
            v = _variant(fastact.explain("softmax_backward", y, dim))
            assert v in VARIANTS, v


@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("d", [3, 65, 127, 257, 301, 511, 513, 577, 767, 769, 1001, 1023])
def test_warp_element_rows(op, dtype, d):
    """softmax/warp.cuh at one element an access (D off the vector width), forced: at 2^9 and 2^10 (WarpShape::kFill)
    a lane's slots past the row are filled (-inf forward, 0 backward) so that the max and the backward's dot run over
    every slot, and the forward's sum and the stores test fresh copies of the lane's count; shorter rows guard every
    phase with the count. Every padded row length (2^2 ... 2^10), a last slot
    that few lanes hold (257, 513: one), 13 rows (the last block of rows partial). Special values where a fill could
    show: an all -inf row, +inf / NaN / -inf as the row's last element, a row whose only finite element is the last;
    masked rows forward and backward; against float64, outputs poisoned. Auto's plans of such rows are valid: warp
    with element accesses, or vec with head and tail elements (dispatch.h row vec-bwd-edges16)."""
    if dtype == torch.float64 and d > 512:
        pytest.skip("the warp kernel takes float64 rows up to 512")
    log = op.name == "log_softmax"
    fwd = getattr(ops, op.name).default
    bwd = getattr(ops, f"{op.name}_backward").default
    torch_fn = torch.log_softmax if log else torch.softmax
    ninf, inf, nan = float("-inf"), float("inf"), float("nan")
    x = make_tensor((13, d), dtype, "cuda")
    s, plan = _explain_plan(op.name, x, -1)
    assert plan["variant"] == "vec" and "edges" in plan["flags"] or plan["variant"] == "warp" and plan["vec"] == 1, s
    x[0] = ninf
    x[2, -1] = inf
    x[3, -1] = nan
    x[4, -1] = ninf
    x[5, :-1] = ninf
    x[12, 0] = inf
    m = make_tensor((13, d), dtype, "cuda")  # masked rows
    m[1, : d // 2] = ninf
    m[6, 1::2] = ninf
    m[7, -1] = ninf
    m[12, :-1] = ninf
    msg = f"warp {op.name} {dtype} D={d}"
    for t in (x, m):
        poison_allocator("cuda", t.numel() * dtype.itemsize)
        y = fwd(t, -1, None, variant="warp")
        assert_close(y, torch_fn(t.double(), -1), torch_actual=torch_fn(t, -1), msg=msg + " forward")
    y = torch_fn(m, -1)
    s, plan = _explain_plan(op.name, y, -1, backward=True)
    assert plan["variant"] == "vec" and "edges" in plan["flags"] or plan["variant"] == "warp" and plan["vec"] == 1, s
    g = make_tensor((13, d), dtype, "cuda")
    poison_allocator("cuda", g.numel() * dtype.itemsize)
    dx = bwd(g, y, -1, dtype, variant="warp")
    assert_close(dx, softmax_backward_ref(g, y, -1, log), torch_actual=softmax_backward_torch(g, y, -1, dtype, log),
                 msg=msg + " backward")


@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("d", [256, 504, 512, 520, 768, 776, 888, 896, 904, 1000, 1024])
def test_backward_rows_leave_warp(op, dtype, d):
    """Aligned rows (D a multiple of the vector width) around the lines where the dispatcher moves rows from warp to
    vec (dispatch.h rows vec-bwd-*, vec-fwd-deep-*): auto's plans are warp or vec, both 128-bit, and the forward and
    backward auto runs are bitwise those of the variant explain names, forced; the other of the two, forced, is right
    too; both match float64, outputs poisoned; rows of 13 blocks of 13."""
    log = op.name == "log_softmax"
    fwd = getattr(ops, op.name).default
    bwd = getattr(ops, f"{op.name}_backward").default
    torch_fn = torch.log_softmax if log else torch.softmax
    x = make_tensor((169, d), dtype, "cuda")
    s, plan = _explain_plan(op.name, x, -1)
    assert plan["variant"] in ("warp", "vec") and plan["vec"] > 1, s
    poison_allocator("cuda", x.numel() * dtype.itemsize)
    auto = fwd(x, -1, None)
    assert torch.equal(auto, fwd(x, -1, None, variant=plan["variant"]))
    for variant in ("auto", "warp", "vec"):
        got = auto if variant == "auto" else fwd(x, -1, None, variant=variant)
        assert_close(got, torch_fn(x.double(), -1), torch_actual=torch_fn(x, -1),
                     msg=f"{op.name} forward {variant} {dtype} D={d}")
    y = torch_fn(x, -1)
    s, plan = _explain_plan(op.name, y, -1, backward=True)
    assert plan["variant"] in ("warp", "vec") and plan["vec"] > 1 and "edges" not in plan["flags"], s
    g = make_tensor((169, d), dtype, "cuda")
    poison_allocator("cuda", g.numel() * dtype.itemsize)
    auto = bwd(g, y, -1, dtype)
    assert torch.equal(auto, bwd(g, y, -1, dtype, variant=plan["variant"]))
    for variant in ("auto", "warp", "vec"):
        got = auto if variant == "auto" else bwd(g, y, -1, dtype, variant=variant)
        assert_close(got, softmax_backward_ref(g, y, -1, log), torch_actual=softmax_backward_torch(g, y, -1, dtype, log),
                     msg=f"{op.name} backward {variant} {dtype} D={d}")


@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=dtype_id)
@pytest.mark.parametrize("d", [1024, 2040, 2048, 3072, 4088, 4096, 4104, 8192, 8200, 12288, 16384, 16392])
def test_backward_two_pass(op, dtype, d):
    """Backwards of aligned rows where the dispatcher may take vec's two passes (dispatch.h row two-pass: dy and y
    loaded again after the row's all-reduce, a unit or two of each a thread): auto's plan is valid, a two-pass plan
    only for softmax's 16-bit backward with one or two 128-bit units a thread (4104: 513 units, some threads past
    the row; 8200: some holding one unit); the backward auto runs is bitwise the forced variant explain names and
    matches float64 with poisoned outputs. test_two_pass_reached: some length takes it."""
    log = op.name == "log_softmax"
    bwd = getattr(ops, f"{op.name}_backward").default
    torch_fn = torch.log_softmax if log else torch.softmax
    rows = 67
    x = make_tensor((rows, d), dtype, "cuda")
    y = torch_fn(x, -1)
    s, plan = _explain_plan(op.name, y, -1, backward=True)
    if "two_pass" in plan["flags"]:
        assert not log and dtype.itemsize == 2 and plan["variant"] == "vec", s
        assert plan["elems_per_thread"] in (plan["vec"], 2 * plan["vec"]), s
    g = make_tensor((rows, d), dtype, "cuda")
    poison_allocator("cuda", g.numel() * dtype.itemsize)
    auto = bwd(g, y, -1, dtype)
    assert torch.equal(auto, bwd(g, y, -1, dtype, variant=plan["variant"]))
    msg = f"{op.name} backward {dtype} D={d}"
    assert_close(auto, softmax_backward_ref(g, y, -1, log), torch_actual=softmax_backward_torch(g, y, -1, dtype, log),
                 msg=msg)


def test_two_pass_reached():
    """The two-pass vec backward (block.cuh softmax_block_bwd_two_pass_kernel) is what auto runs for some 16-bit
    softmax row length of test_backward_two_pass's on sm_80 and later (where its cache policies exist), so that those
    tests run it."""
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the two-pass kernel's cache policies need sm_80")
    units = set()
    for d in (1024, 2040, 2048, 3072, 4088, 4096, 4104, 8192, 8200, 12288, 16384, 16392):
        y = torch.softmax(make_tensor((3, d), torch.bfloat16, "cuda"), -1)
        s, plan = _explain_plan("softmax", y, -1, backward=True)
        if "two_pass" in plan["flags"]:
            units.add(plan["elems_per_thread"] // plan["vec"])
    assert units, "no row length took the two-pass kernel"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("d", [1025, 4097, 30522, 50257])
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_rows_off_alignment_take_vectors(dtype, d, direction):
    """Rows whose length the 128-bit width does not divide (vocabulary sizes) run the resident kernels
    with 128-bit bodies and head/tail elements when every row starts at one offset in every tensor;
    a view whose rows start elsewhere in x than in y (x[..., 1:]) keeps element accesses."""
    backward = direction == "bwd"
    s, plan = _explain_plan("softmax", make_tensor((8, d), dtype, "cuda"), -1, backward=backward)
    edges = d % _vec_width(dtype) != 0  # 30522 is a whole number of float64 vectors
    assert plan["variant"] in ("vec", "long_row"), s
    if plan["mode"] == "resident":  # vec, or a cluster (the grid and split modes take element accesses)
        assert ("edges" in plan["flags"]) == edges and plan["vec"] > 1, s
    if direction == "fwd":
        s, plan = _explain_plan("softmax", make_tensor((8, d), dtype, "cuda", "sliced_last"), -1)
        assert "edges" not in plan["flags"] and plan["vec"] == 1, s


def _shifted_views(rows, d, dtype):
    """16-bit row views whose rows start off the 16-byte alignment, most by a different amount in each row:
    (name, x). Every shift 0-7 occurs; the first and last rows' chunks reach past the view (and, for
    `offset` and `:d`, past the storage's end)."""
    out = []
    for start, pad in [(1, 0), (0, 1), (3, 4), (7, 0), (5, 2)]:  # base[:, start:start + d] of [rows, start + d + pad]
        out.append((f"[:, {start}:{start}+{d}] of {start + d + pad}",
                    strided_tensor((rows, d), dtype, "cuda", slices={1: (start, 1, pad)})))
    for off in (1, 3, 7):  # dense rows, the data pointer off by `off` elements: every row at one shift
        out.append((f"dense at offset {off}", strided_tensor((rows, d), dtype, "cuda", offset=off)))
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("d", [8, 64, 1032, 2048, 4096, 4104, 8192, 16392, 32768])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_vec_shifted_rows(dtype, d, log):
    """16-bit forward rows whose input starts off the alignment, row by row (dispatch.h
    softmax_rows_shift_vectorizable), run vec with the input staged in shared memory and realigned (block.cuh
    ShiftedRow): the dispatcher takes it past the warp kernel's rows and up to a block's, forced vec takes it at
    any D the width divides; the results match float64 with poisoned outputs, and are bitwise those of the same values in an
    aligned contiguous tensor (the same units, the same reduction). D = 8 and 64: a row of one or a few units,
    most threads past it (the chunk after the row's last unit is staged by a thread whose own unit is not in
    the row); 16392: past auto's vec rows (long_row takes them), forced vec in 544 threads; 32768: the largest
    row vec caches (1024 threads, the stage's last slot). Where auto takes vec, its plan realigns the rows."""
    op = "log_softmax" if log else "softmax"
    fwd = getattr(ops, op).default
    rows = max(3, min(97, (1 << 21) // d))
    for name, x in _shifted_views(rows, d, dtype):
        msg = f"{op} {dtype_id(dtype)} {name} {describe(x)}"
        auto, plan = _explain_plan(op, x, -1)
        if plan["variant"] == "vec":
            assert "shifted" in plan["flags"], f"{msg}: {auto}"
        ref = (torch.log_softmax if log else torch.softmax)(x.double(), -1)
        pt = (torch.log_softmax if log else torch.softmax)(x, -1)
        aligned = fwd(torch.empty(x.shape, dtype=dtype, device="cuda").copy_(x), -1, None, variant="vec")
        for variant in ("auto", "vec"):
            poison_allocator("cuda", x.numel() * dtype.itemsize)
            y = fwd(x, -1, None, variant=variant)
            assert_close(y, ref, torch_actual=pt, msg=f"{msg} {variant}")
            if variant == "vec" or _variant(auto) == "vec":
                assert torch.equal(y, aligned), f"{msg} {variant}: differs from the aligned copy's result"
    # Not taken: D off the vector width (the rows start off the alignment, and their ends too).
    x = strided_tensor((rows, d + 1), dtype, "cuda", slices={1: (1, 1, 0)})
    assert "shifted" not in _explain_plan(op, x, -1)[1]["flags"]
    with pytest.raises(RuntimeError, match="cannot take"):
        fwd(x, -1, None, variant="vec")
