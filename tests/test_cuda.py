"""CUDA only: every softmax variant forced on every shape class it accepts (boundary sizes, every
dtype, forward and backward), the dispatcher's choices as explain() reports them, the caller's
stream, CUDA graphs, torch.compile(mode="reduce-overhead"), a second GPU, peak memory, and tensors
beyond 2^31 elements (`huge`). The device-parametrised tests of the other files run on CUDA too.

Unwritten outputs: the caching allocator is left holding NaN-filled blocks of the output's size
before each call (poison_allocator), so an element a kernel fails to write shows up as NaN."""

import math
import os
import re
import subprocess
import sys

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import fastact  # noqa: E402
from fastact_testing import (  # noqa: E402
    ALL_OPS,
    BOUNDARY_SIZES,
    SOFTMAX_OPS,
    assert_close,
    bias_for,
    check_op,
    coarsest,
    describe,
    dtype_id,
    fused_cast_forward_failures,
    is_dense,
    make_tensor,
    poison_allocator,
    random_values,
    softmax_backward_ref,
    softmax_backward_torch,
    strided_tensor,
)

pytestmark = pytest.mark.cuda
ops = torch.ops.fastact

# include/fastact/dispatch.h: "split" is long_row's two-read fallback and "grid" its mode beyond a
# cluster, each forceable on its own.
VARIANTS = ("warp", "vec", "scalar", "long_row", "split", "strided", "grid")
# input dtype, output dtype (the fused conversions included)
DTYPE_CONFIGS = [
    (torch.float32, torch.float32),
    (torch.float64, torch.float64),
    (torch.float16, torch.float16),
    (torch.bfloat16, torch.bfloat16),
    (torch.bfloat16, torch.float32),
    (torch.float16, torch.float32),
]
# Row lengths: the suite's boundaries, the 128-bit vector widths +-1 (4 floats, 8 halves, 2
# doubles), each dispatcher threshold of include/fastact/dispatch.h +-1 (the warp kernel's 512 for
# float64 and 1024; backwards leaving it past 768, from 896 or (float) from 512: kWarpBackwardMaxDim,
# kVecBackwardMinAlignedDim and kVecBackwardMinAlignedFloatDim;
# one block's register cache: 512 or 1024 threads x 8, 16 or 32 elements = 4096 ... 32768; 10240: the 16-bit
# forward's vec rows on a deep-memory device, kDeepVecForward16MaxThreads), and a row far beyond
# what one SM holds.
THRESHOLDS = (512, 768, 896, 1024, 4096, 8192, 10240, 16384, 32768)
CUDA_SIZES = tuple(
    sorted(set(BOUNDARY_SIZES + (3, 4, 5, 7, 8, 9, 15, 16, 17, 262144) + tuple(t + k for t in THRESHOLDS for k in (-1, 0, 1))))
)
# Shape classes: inner == 1 rows (contiguous; misaligned dense; `x[..., 1:]` rows with a stride and
# a misaligned start; aligned rows with a padded stride; a transposed tensor reduced over its
# memory-contiguous dim) and inner > 1 (strided: 2 and 33 take element accesses, 64 and 40 the
# 128-bit vectors of every dtype; 40 leaves the last tile of columns partial).
CLASSES = ("rows", "misaligned", "row_strided", "row_padded", "transposed", "strided_2", "strided_33", "strided_64",
           "strided_40")
MAX_ELEMENTS = 1 << 21


def _vec_width(dtype):
    return 16 // dtype.itemsize


def _rows(d):
    return max(3, min(1031, (1 << 19) // d))


def make_class(cls, d, dtype):
    """(x, dim) of shape class `cls` with reduction length d."""
    if cls.startswith("strided_"):
        inner = int(cls.split("_")[1])
        outer = max(1, min(5, MAX_ELEMENTS // (d * inner)))
        return make_tensor((outer, d, inner), dtype, "cuda"), 1
    rows = _rows(d)
    if cls == "rows":
        return make_tensor((rows, d), dtype, "cuda"), -1
    if cls == "misaligned":
        return strided_tensor((rows, d), dtype, "cuda", offset=1), -1
    if cls == "row_strided":
        return strided_tensor((rows, d), dtype, "cuda", slices={1: (1, 1, 0)}), -1
    if cls == "row_padded":
        return strided_tensor((rows, d), dtype, "cuda", slices={1: (0, 1, _vec_width(dtype))}), -1
    if cls == "transposed":
        return make_tensor((rows, d), dtype, "cuda").t(), 0
    raise ValueError(cls)


def must_accept(variant, cls, d, dtype):
    """Where a forced variant must take the input (DESIGN.md's table and include/fastact/dispatch.h);
    elsewhere it may take it (and must then be right) or refuse with "cannot take"."""
    # a softmax dim of size 1 is a rows problem whatever its stride (csrc/common.h): rows of one element
    inner1 = not cls.startswith("strided_") or d == 1
    aligned = cls in ("rows", "row_padded", "transposed")
    if variant == "warp":  # the row in one warp's registers: 1024 values (512 doubles)
        return inner1 and d <= (512 if dtype == torch.float64 else 1024)
    if variant == "vec":  # aligned rows that fit one block's registers (4096 is far below that); a D that
        # the vector width does not divide too (every row of these classes starts at the same offset
        # from the alignment in x and y: the head and tail elements move one at a time)
        return inner1 and aligned and d <= 4096
    if variant in ("scalar", "long_row", "split", "grid"):  # any rows: any alignment, D, row stride (grid: rows
        # that one CTA an SM caches, far beyond these)
        return inner1
    if variant == "strided":
        return not inner1
    raise ValueError(variant)


def must_refuse(variant, cls, d, dtype, out_dtype=None, backward=True):
    # a 128-bit load from a misaligned pointer is wrong: vec must refuse those views, but for the 16-bit
    # forward into an aligned output of the same dtype whose rows the vector width divides, which it
    # realigns in registers (dispatch.h softmax_rows_shift_vectorizable; test_vec_shifted_rows)
    shifted = (not backward and dtype in (torch.float16, torch.bfloat16) and out_dtype in (None, dtype)
               and d % _vec_width(dtype) == 0)
    return variant == "vec" and cls in ("misaligned", "row_strided") and not shifted


def _call(fn):
    """fn() -> (result, None) or (None, the refusal message); any other error propagates."""
    try:
        return fn(), None
    except RuntimeError as e:
        if "cannot take" not in str(e):
            raise
        return None, str(e)


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


@pytest.mark.parametrize("in_dtype", (torch.bfloat16, torch.float16), ids=dtype_id)
@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
def test_fused_cast_forward_warp_pairs(op, in_dtype):
    """The resident forwards of 16-bit rows into float (block.cuh WarpPairedStores): lanes l and l ^ 16 swap halves
    of their units where the warp's 32 units lie inside the row; the warp that holds the row's end stores plain.
    Rows of whole warps (256: one warp; 1024, vec's plan on a deep-memory device, dispatch.h
    kDeepVecForwardMinCastDim; 2048 to 16384), of a partial last warp (264, 1000, 1016, 4104, 12296), aligned rows
    with a padded stride, and rows off the alignment (4095, 4097: plain stores); vec forced and the dispatcher's
    plan; outputs poisoned, against float64 (fastact_testing.fused_cast_forward_failures). Long rows:
    test_fused_cast_long_rows."""
    failures = []
    for d in (256, 264, 1000, 1016, 1024, 2048, 4095, 4096, 4097, 4104, 12288, 12296, 16384):
        failures += fused_cast_forward_failures(in_dtype, 37, d, ("vec", "auto"), ops=(op.name,))
    assert not failures, f"{len(failures)} case(s) failed:\n" + "\n".join(failures)


_FUSED_CAST_LONG_ROWS_SCRIPT = """
import sys, torch, fastact
sys.path.insert(0, sys.argv[1])
from fastact_testing import fused_cast_forward_failures
torch.manual_seed(0)
failures = []
for in_dtype in (torch.bfloat16, torch.float16):
    for d in (65544, 131072, 139264, 262144):
        failures += fused_cast_forward_failures(in_dtype, 5, d, ("auto", "long_row", "grid"))
for d in (1016, 1024, 65544, 131072, 139264, 262144, 524288):
    x = torch.empty(5, d, dtype=torch.bfloat16, device="cuda")
    print("PLAN", d, fastact.explain("softmax", x, dtype=torch.float32))
print("\\n".join(failures), file=sys.stderr)
sys.exit(1 if failures else 0)
"""


@pytest.mark.parametrize("depth", ["standard", "deep"])
def test_fused_cast_long_rows(depth):
    """The long rows of 16-bit into float (the dtype= cast) under both memory-depth classes (FASTACT_MEMORY_DEPTH),
    auto and forced long_row and grid, rows of 65544 (a partial last warp), 131072, 139264 and 262144, aligned and
    with a padded stride, outputs poisoned, against float64. Their forwards store a warp's units by lane pairs
    (block.cuh WarpPairedStores) in block.cuh's register clusters kept as loaded (to 131072), long_row.cuh's
    shared-memory clusters (to 262144: dispatch.h long_row_deep_shapes) and grid.cuh's slices; the clusters with a
    register part as loaded (deep, past 262144: test_long_row_rows_beyond_one_wave's rows of the cast) store plain.
    explain(dtype=torch.float32) shows those plans in both classes, the deep class's register part at 524288, and
    rows of 1024 in vec on deep (dispatch.h kDeepVecForwardMinCastDim), in warp on standard, 1016 in warp on both."""
    env = dict(os.environ, FASTACT_MEMORY_DEPTH=depth)
    tests = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, "-c", _FUSED_CAST_LONG_ROWS_SCRIPT, tests], env=env, capture_output=True,
                         text=True)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    plans = dict(line.split(" ", 2)[1:] for line in out.stdout.splitlines() if line.startswith("PLAN"))
    assert len(plans) == 7, out.stdout
    for p in plans.values():
        assert p.endswith("the BFloat16 input read as it is, the output written in Float"), p
    assert plans["1016"].startswith("variant=warp"), plans["1016"]
    assert plans["1024"].startswith("variant=vec" if depth == "deep" else "variant=warp"), plans["1024"]
    for d in ("65544", "131072"):  # block.cuh's register clusters, kept as loaded
        assert "(kept as loaded)" in plans[d] and "in shared memory" not in plans[d], plans[d]
    for d in ("139264", "262144"):  # long_row.cuh's shared-memory kernel, its units converted
        assert "in shared memory" in plans[d] and "kept as loaded" not in plans[d], plans[d]
    if depth == "deep":  # the register part as loaded beside shared memory (plain stores)
        assert "the rest kept as loaded" in plans["524288"], plans["524288"]


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


def _cluster_plan(explanation):
    """(CTAs per row, threads per CTA) of a long_row plan that caches the row (a cluster, or the grid
    mode beyond one), or None for its two-read mode."""
    m = re.search(r"\[(\d+) CTA\(s\) x (\d+) threads", explanation)
    return (int(m.group(1)), int(m.group(2))) if m else None


@pytest.mark.parametrize(
    "d",
    (32776, 65536, 65544, 131072, 151936, 262136, 262144, 300000, 524288, 524296, 600000, 1 << 20, (1 << 20) + 1,
     3 << 19),
)
@pytest.mark.parametrize("dtypes", DTYPE_CONFIGS, ids=lambda p: f"{dtype_id(p[0])}-{dtype_id(p[1])}")
@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
@pytest.mark.parametrize("direction,layout", [("fwd", "rows"), ("fwd", "row_padded"), ("bwd", "rows")])
def test_long_row_rows_beyond_one_wave(direction, layout, op, dtypes, d):
    """More rows than the GPU holds clusters at once, at each cluster shape the dispatcher picks for
    long rows (8 x 256 threads up to 16 x 1024), so that clusters run in several waves and the last
    one is partial; dense and padded rows. Beyond 8 x 256 x 32 elements the 128-bit forward keeps part
    of each slice in shared memory (include/fastact/softmax/long_row.cuh), at 8 x 256, 8 x 512 and
    16 x 512; 65544 and 262136 leave its last CTAs a partial slice (and none at all). 16-bit forward rows
    past 16 x 512 x 64 keep a register part as loaded besides, at 16 x 288-512 (2^20; 600000: a partial slice,
    524296 and 600000: the last CTA none); on a deep-memory device past 8 x 256 x 64, at 8 x 160-256 and 16 x
    128-512, and float's shared-memory forwards at 16 x 160-256 (dispatch.h kDeepClusterWideThreads). Beyond what a
    cluster caches, the grid mode (include/fastact/softmax/grid.cuh): rows start while others wait for
    their partials; an odd D takes element accesses. Backwards whose cluster CTAs would run one an SM
    (151936 in float, 300000 in 16-bit) take the grid mode too. Twice, bitwise equal: partials fold in a
    fixed order."""
    in_dtype, out_dtype = dtypes
    log = op.name == "log_softmax"
    out_arg = out_dtype if out_dtype != in_dtype else None
    probe = make_tensor((1, d), out_dtype if direction == "bwd" else in_dtype, "cuda")
    name = op.name + ("_backward" if direction == "bwd" else "")
    # explain's dtype is the op's own: the forward's output dtype, the backward's input_dtype
    explain_dtype = out_arg if direction == "fwd" else (in_dtype if out_arg is not None else None)
    plan = _cluster_plan(fastact.explain(name, probe, dtype=explain_dtype))
    if plan is None:
        pytest.skip("neither a cluster nor the grid mode caches this row here: long_row takes its two-read mode "
                    "(tested elsewhere)")
    cluster, threads = plan
    sms = torch.cuda.get_device_properties(probe.device).multi_processor_count
    # More rows than the clusters that fit at once: at most 2048 // threads CTAs per SM (the
    # hardware's 2048 threads), so 2x that bound and a partial round.
    rows = 2 * sms * (2048 // threads) // cluster + 3
    msg = f"long_row {name} {rows}x{d} {layout} {in_dtype}->{out_dtype}, plan {cluster} x {threads}"
    if layout == "rows":
        x = make_tensor((rows, d), in_dtype, "cuda")
    else:
        x = strided_tensor((rows, d), in_dtype, "cuda", slices={1: (0, 1, _vec_width(in_dtype))})
    fn = torch.log_softmax if log else torch.softmax
    if direction == "fwd":
        poison_allocator("cuda", x.numel() * out_dtype.itemsize)
        y = getattr(ops, op.name).default(x, -1, out_arg, variant="long_row")
        assert_close(y, fn(x.to(out_dtype).double(), -1), torch_actual=fn(x, -1, dtype=out_arg), msg=msg)
        again = getattr(ops, op.name).default(x, -1, out_arg, variant="long_row")
        assert torch.equal(y, again), msg + ": not deterministic"
        return
    y = fn(x, -1, dtype=out_arg)
    g = make_tensor((rows, d), out_dtype, "cuda")
    poison_allocator("cuda", x.numel() * in_dtype.itemsize)
    dx = getattr(ops, f"{op.name}_backward").default(g, y, -1, in_dtype, variant="long_row")
    assert_close(
        dx,
        softmax_backward_ref(g, y, -1, log),
        coarsest(in_dtype, out_dtype),
        torch_actual=softmax_backward_torch(g, y, -1, in_dtype, log),
        msg=msg,
    )
    again = getattr(ops, f"{op.name}_backward").default(g, y, -1, in_dtype, variant="long_row")
    assert torch.equal(dx, again), msg + ": not deterministic"


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=dtype_id)
def test_long_row_backward_clusters_run_two_ctas_an_sm(dtype, log):
    """dispatch.h cluster_backward_yields_to_grid: a backward of 128-bit accesses runs a 16-CTA cluster only
    where two of its CTAs fit an SM (the size launch.cuh's block_backward_two_cta_threads probes from the
    kernel's registers, at least 512 threads) or its CTAs are 1024 threads (not on a deep-memory device); in
    between it takes the grid mode. 8-CTA clusters and rows off the vector width keep their cluster."""
    if torch.cuda.get_device_capability()[0] < 9 or _clusters_capped():
        pytest.skip("clusters need sm_90 (and FASTACT_MAX_CLUSTER unset or >= 8)")
    op = "log_softmax_backward" if log else "softmax_backward"
    deep = _deep_memory()
    grids = 0
    for d in (131072, 132096, 140000, 151936, 163840, 200000, 262144, 270336, 300000, 400000, 524288):
        s = fastact.explain(op, make_tensor((2, d), dtype, "cuda"))
        assert _variant(s) == "long_row", s
        if "partials through global memory" in s:
            grids += 1
        elif "128-bit" in s and (plan := _cluster_plan(s)) is not None:
            two = "at least two CTAs an SM" in s
            assert two or "one CTA an SM" in s, s  # the probe ran
            assert two or plan[1] > 512, s  # two CTAs of 512 threads always fit (64 registers at most)
            assert plan[0] <= 8 or two or (plan[1] == 1024 and not deep), s  # deep: 16 x 1024 takes the grid
    assert grids > 0, "no row length took the grid mode"
    if torch.cuda.get_device_properties(0).multi_processor_count == 132:  # 16-CTA clusters cache it (H100, H200)
        s = fastact.explain(op, make_tensor((2, 151935), dtype, "cuda"))  # off the vector width
        assert "partials through global memory" not in s, s


def test_grid_mode_needs_no_clusters_and_bounds_its_ctas():
    """dispatch.h plan_grid: at most one CTA an SM per row (so the device holds all of a row's CTAs);
    a row beyond that takes the split mode."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    x = make_tensor((1, 1 << 20), torch.float32, "cuda")
    s = fastact.explain("softmax", x)
    plan = _cluster_plan(s)
    assert "partials through global memory" in s and 2 <= plan[0] <= sms, s
    # float forward: 512 threads x 64 elements a CTA at most
    too_long = make_tensor((1, sms * 1024 * 64 + 4), torch.float32, "cuda")
    s = fastact.explain("softmax", too_long)
    assert "chunk(s) per row" in s, s
    with pytest.raises(RuntimeError, match="cannot take"):
        ops.softmax(too_long, -1, None, variant="grid")


_GRID_GIVE_UP_SCRIPT = """
import sys, torch, fastact
ops = torch.ops.fastact
torch.manual_seed(0)
out = {}
for dtype in (torch.float32, torch.bfloat16):
    for shape, variant in (((5, 1 << 20), "grid"), ((7, 262148), "grid"), ((3, 70001), "grid")):
        x = torch.randn(shape, dtype=dtype, device="cuda")
        g = torch.randn(shape, dtype=dtype, device="cuda")
        for log in (False, True):
            fwd = ops.log_softmax if log else ops.softmax
            bwd = ops.log_softmax_backward if log else ops.softmax_backward
            y = fwd(x, -1, None, variant=variant)
            out[(str(dtype), shape, log)] = (y.cpu(), bwd(g, y, -1, dtype, variant=variant).cpu())
            if dtype == torch.bfloat16:  # the dtype= cast: bf16 x into a float y, a float dy into a bf16 dx
                yc = fwd(x, -1, torch.float32, variant=variant)
                out[("cast", shape, log)] = (yc.cpu(), bwd(g.float(), yc, -1, dtype, variant=variant).cpu())
torch.save(out, sys.argv[1])
"""


def test_grid_mode_ctas_that_give_up(tmp_path):
    """A CTA that waits for its row longer than dispatch.h kGridWaitNs gives up and the launch's last CTA
    computes its slice (include/fastact/softmax/grid.cuh): FASTACT_GRID_WAIT_US=0 makes every CTA that
    would wait give up. Results bitwise equal to those of a run that waits, and right; also the bf16 -> float
    dtype= cast (its forward's warp-paired stores, block.cuh WarpPairedStores)."""
    runs = {}
    for wait in ("0", str(4000)):
        path = tmp_path / f"wait{wait}.pt"
        env = dict(os.environ, FASTACT_GRID_WAIT_US=wait)
        out = subprocess.run([sys.executable, "-c", _GRID_GIVE_UP_SCRIPT, str(path)], env=env, capture_output=True,
                             text=True)
        assert out.returncode == 0, out.stderr[-3000:]
        runs[wait] = torch.load(path)
    for key, (y, dx) in runs["0"].items():
        y_wait, dx_wait = runs["4000"][key]
        assert torch.equal(y, y_wait) and torch.equal(dx, dx_wait), key
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        for shape in ((5, 1 << 20), (7, 262148), (3, 70001)):
            x = torch.randn(shape, dtype=dtype, device="cuda")
            g = torch.randn(shape, dtype=dtype, device="cuda")
            for log in (False, True):
                fn = torch.log_softmax if log else torch.softmax
                y, dx = runs["0"][(str(dtype), shape, log)]
                msg = f"gave up: {dtype} {shape} log={log}"
                assert_close(y.cuda(), fn(x.double(), -1), torch_actual=fn(x, -1), msg=msg)
                assert_close(dx.cuda(), softmax_backward_ref(g, y.cuda(), -1, log),
                             torch_actual=softmax_backward_torch(g, y.cuda(), -1, dtype, log), msg=msg + " backward")
                if dtype == torch.bfloat16:
                    yc, dxc = runs["0"][("cast", shape, log)]
                    assert_close(yc.cuda(), fn(x.double(), -1), torch_actual=fn(x, -1, dtype=torch.float32),
                                 msg=msg + " -> float32")
                    assert_close(dxc.cuda(), softmax_backward_ref(g.float(), yc.cuda(), -1, log), dtype,
                                 torch_actual=softmax_backward_torch(g.float(), yc.cuda(), -1, dtype, log),
                                 msg=msg + " -> float32 backward")


def fastact_softmax_variant(x, dim, variant):
    return ops.softmax(x, dim, None, variant=variant)


def test_unknown_variant_cuda():
    x = make_tensor((4, 64), torch.float32, "cuda")
    for name in ("", "Warp", "long-row", "cpu_rows"):
        with pytest.raises(RuntimeError):
            ops.softmax(x, -1, None, variant=name)
    torch.testing.assert_close(fastact.softmax(x), torch.softmax(x, -1))


# ----------------------------------------------------------------------------------------------
# The dispatcher


def _deep_memory():
    """Whether the current device plans as a deep-memory one (memory_depth.cuh; FASTACT_MEMORY_DEPTH forces it), as
    explain() reports it for the elementwise ops."""
    s = fastact.explain("sigmoid", torch.randn(8, device="cuda"))
    m = re.search(r"memory depth (standard|deep)", s)
    assert m, s
    return m.group(1) == "deep"


def _variant(explanation):
    m = re.search(r"variant=(\w+)", explanation)
    assert m, explanation
    return m.group(1)


@pytest.mark.parametrize(
    "expected,shape,dim,layout",
    [
        ("warp", (4096, 256), -1, "contiguous"),  # 512: vec on a deep-memory device (kDeepVecForwardMinFloatDim)
        ("warp", (4096, 33), -1, "contiguous"),
        ("vec", (1024, 4096), -1, "contiguous"),
        ("vec", (1024, 4097), -1, "contiguous"),  # odd D, aligned base: 128-bit body, head and tail elements
        ("long_row", (16, 50257), -1, "contiguous"),  # a vocabulary's row: clusters, head and tail elements
        ("scalar", (1024, 4097), -1, "sliced_last"),  # x[..., 1:]: misaligned, odd D
        ("long_row", (4, 262144), -1, "contiguous"),
        ("strided", (64, 1024, 64), 1, "contiguous"),
        ("strided", (8, 33, 2), 1, "contiguous"),
    ],
)
def test_explain_reports_dispatcher_branch(expected, shape, dim, layout):
    x = make_tensor(shape, torch.float32, "cuda", layout)
    s = fastact.explain("softmax", x, dim)
    assert _variant(s) == expected, s


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
    masked rows forward and backward; against float64, outputs poisoned. Auto dispatch keeps such rows on the warp
    kernel except 16-bit backwards beyond 768 (dispatch.h softmax_rows_leave_warp: vec, head and tail elements);
    backwards of float rows and of 16-bit rows up to 16 hold 4 elements a lane (softmax_warp_element_lane)."""
    if dtype == torch.float64 and d > 512:
        pytest.skip("the warp kernel takes float64 rows up to 512")
    log = op.name == "log_softmax"
    fwd = getattr(ops, op.name).default
    bwd = getattr(ops, f"{op.name}_backward").default
    torch_fn = torch.log_softmax if log else torch.softmax
    ninf, inf, nan = float("-inf"), float("inf"), float("nan")
    x = make_tensor((13, d), dtype, "cuda")
    s = fastact.explain(op.name, x, -1)
    assert _variant(s) == "warp" and "element accesses" in s, s
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
    s = fastact.explain(op.name + "_backward", y, -1)
    leaves = dtype.itemsize == 2 and d > 768
    assert _variant(s) == ("vec" if leaves else "warp") and ("head and tail" if leaves else "element accesses") in s, s
    if d <= 128:  # dispatch.h softmax_warp_element_lane: 4 elements a lane in float and short 16-bit backwards
        padded = 1 << (d - 1).bit_length()
        per_lane = min(padded, 4 if dtype.itemsize == 4 or (dtype.itemsize == 2 and padded <= 16) else 8)
        assert f"{padded // per_lane} lanes per row, {per_lane} elements per lane" in s, s
    g = make_tensor((13, d), dtype, "cuda")
    poison_allocator("cuda", g.numel() * dtype.itemsize)
    dx = bwd(g, y, -1, dtype, variant="warp")
    assert_close(dx, softmax_backward_ref(g, y, -1, log), torch_actual=softmax_backward_torch(g, y, -1, dtype, log),
                 msg=msg + " backward")


@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("d", [256, 504, 512, 520, 768, 776, 888, 896, 904, 1000, 1024])
def test_backward_rows_leave_warp(op, dtype, d):
    """Aligned rows (D a multiple of the vector width): the forward stays on the warp kernel up to 1024 (but float
    rows leave it for vec from 512 on a deep-memory device: dispatch.h kDeepVecForwardMinFloatDim), the
    backward leaves it for vec from 896 (dispatch.h kVecBackwardMinAlignedDim), float rows from 512
    (kVecBackwardMinAlignedFloatDim); both 128-bit. The forward and backward that auto runs are bitwise the forced vec
    (or warp) ones and match float64, outputs poisoned; rows of 13 blocks of 13."""
    log = op.name == "log_softmax"
    fwd = getattr(ops, op.name).default
    bwd = getattr(ops, f"{op.name}_backward").default
    torch_fn = torch.log_softmax if log else torch.softmax
    x = make_tensor((169, d), dtype, "cuda")
    s = fastact.explain(op.name, x, -1)
    want = "vec" if _deep_memory() and dtype == torch.float32 and d >= 512 else "warp"
    assert _variant(s) == want and "128-bit" in s, s
    poison_allocator("cuda", x.numel() * dtype.itemsize)
    auto = fwd(x, -1, None)
    assert torch.equal(auto, fwd(x, -1, None, variant=want))
    assert_close(auto, torch_fn(x.double(), -1), torch_actual=torch_fn(x, -1), msg=f"{op.name} forward {dtype} D={d}")
    y = torch_fn(x, -1)
    s = fastact.explain(op.name + "_backward", y, -1)
    want = "vec" if d >= (512 if dtype == torch.float32 else 896) else "warp"
    assert _variant(s) == want and "128-bit" in s and "head and tail" not in s, s
    g = make_tensor((169, d), dtype, "cuda")
    poison_allocator("cuda", g.numel() * dtype.itemsize)
    auto = bwd(g, y, -1, dtype)
    assert torch.equal(auto, bwd(g, y, -1, dtype, variant=want))
    assert_close(auto, softmax_backward_ref(g, y, -1, log), torch_actual=softmax_backward_torch(g, y, -1, dtype, log),
                 msg=f"{op.name} backward {dtype} D={d}")


@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=dtype_id)
@pytest.mark.parametrize("d", [1024, 2040, 2048, 3072, 4088, 4096, 4104, 8192, 8200, 12288, 16384, 16392])
def test_backward_two_pass(op, dtype, d):
    """Softmax backwards of aligned 16-bit rows of 2048-16384 run vec in two passes (dispatch.h softmax_rows_two_pass:
    dy and y loaded again after the row's all-reduce), a unit of each a thread up to 1024 threads (512 on a
    deep-memory device: softmax_two_pass_units), then two (4104: 513 units in 544 threads, some past the row, or in
    288 of two; 8200: 1025 units in 544 threads of two, some holding one; 12288: 768 threads of two); log_softmax,
    float and rows outside the range keep the row in registers (or take long_row). The backward auto runs is bitwise
    the forced variant explain names and matches float64 with poisoned outputs."""
    log = op.name == "log_softmax"
    bwd = getattr(ops, f"{op.name}_backward").default
    torch_fn = torch.log_softmax if log else torch.softmax
    rows = 67
    x = make_tensor((rows, d), dtype, "cuda")
    y = torch_fn(x, -1)
    s = fastact.explain(op.name + "_backward", y, -1)
    two_pass = not log and dtype != torch.float32 and 2048 <= d <= 16384
    assert ("two passes" in s) == two_pass, s
    if two_pass:
        units = 1 if d <= (512 if _deep_memory() else 1024) * 8 else 2
        threads = -(-(-(-d // (8 * units))) // 32) * 32
        assert _variant(s) == "vec" and f"x {threads} threads x {8 * units} elements" in s, s
    g = make_tensor((rows, d), dtype, "cuda")
    poison_allocator("cuda", g.numel() * dtype.itemsize)
    auto = bwd(g, y, -1, dtype)
    assert torch.equal(auto, bwd(g, y, -1, dtype, variant=_variant(s)))
    msg = f"{op.name} backward {dtype} D={d}"
    assert_close(auto, softmax_backward_ref(g, y, -1, log), torch_actual=softmax_backward_torch(g, y, -1, dtype, log),
                 msg=msg)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("d", [1025, 4097, 30522, 50257])
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_rows_off_alignment_take_vectors(dtype, d, direction):
    """Rows whose length the 128-bit width does not divide (vocabulary sizes) run the resident kernels
    with 128-bit bodies and head/tail elements when every row starts at one offset in every tensor;
    a view whose rows start elsewhere in x than in y (x[..., 1:]) keeps element accesses."""
    op = "softmax" if direction == "fwd" else "softmax_backward"
    s = fastact.explain(op, make_tensor((8, d), dtype, "cuda"))
    edges = d % _vec_width(dtype) != 0  # 30522 is a whole number of float64 vectors
    assert _variant(s) in ("vec", "long_row") and ("head and tail" in s) == edges and "128-bit" in s, s
    if direction == "fwd":
        s = fastact.explain(op, make_tensor((8, d), dtype, "cuda", "sliced_last"))
        assert "head and tail" not in s and "element accesses" in s, s


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
    row vec caches (1024 threads, the stage's last slot)."""
    op = "log_softmax" if log else "softmax"
    fwd = getattr(ops, op).default
    rows = max(3, min(97, (1 << 21) // d))
    for name, x in _shifted_views(rows, d, dtype):
        msg = f"{op} {dtype_id(dtype)} {name} {describe(x)}"
        auto = fastact.explain(op, x)
        if 1024 < d <= 16384:  # past the warp kernel's rows; up to 512 threads x 32 (dispatch.h
            # kVecMaxThreadsWithClusters; 32768: long_row's clusters)
            assert _variant(auto) == "vec" and "staged in shared memory and realigned" in auto, f"{msg}: {auto}"
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
    assert "realigned" not in fastact.explain(op, x)
    with pytest.raises(RuntimeError, match="cannot take"):
        fwd(x, -1, None, variant="vec")


@pytest.mark.parametrize(
    "dtype,d,direction,layout,cache",
    [
        (torch.float32, 262144, "fwd", "contiguous", "shared"),  # 32 in registers, 32 in shared memory
        (torch.bfloat16, 262144, "fwd", "contiguous", "shared"),  # all 64 in shared memory, as loaded
        (torch.float16, 262144, "fwd", "contiguous", "shared"),
        (torch.float32, 65536, "fwd", "contiguous", "registers"),  # 8 x 256 in registers
        (torch.float64, 262144, "fwd", "contiguous", "registers"),  # double arithmetic: registers only
        (torch.float32, 262144, "fwd", "sliced_last", "registers"),  # element accesses
        (torch.float32, 50257, "fwd", "contiguous", "registers"),  # float: the converted cache
        (torch.float32, 262144, "bwd", "contiguous", "registers"),
        (torch.bfloat16, 50257, "bwd", "contiguous", "registers"),  # raw is a forward cache only
        (torch.bfloat16, 50257, "fwd", "sliced_last", "registers"),  # element accesses
        (torch.bfloat16, 30522, "fwd", "contiguous", "raw"),  # a vocabulary's row: head and tail too
        (torch.float16, 50257, "fwd", "contiguous", "raw"),
        (torch.bfloat16, 65536, "fwd", "contiguous", "raw"),
        (torch.bfloat16, 131072, "fwd", "contiguous", "raw"),  # 8 x 256 x 64: the last portable cluster
        (torch.bfloat16, 262143, "fwd", "contiguous", "raw"),  # rows off the alignment: registers only
        (torch.bfloat16, 1 << 20, "fwd", "contiguous", "shared_raw"),  # 64 as loaded, 64 in shared memory
        (torch.float16, 600000, "fwd", "contiguous", "shared_raw"),
        (torch.bfloat16, 1 << 20, "bwd", "contiguous", "grid"),  # raw is a forward cache only
        (torch.float32, 1 << 20, "fwd", "contiguous", "grid"),  # float: 16 x 512 x 64 caches 2^19
    ],
)
def test_long_row_cache_plan(dtype, d, direction, layout, cache):
    """Where the long_row cluster kernels keep a slice, exactly as dispatch.h says: part of it in shared
    memory in forwards with 128-bit accesses and float arithmetic, rows beyond 8 x 256 x 32 elements
    (16-bit: beyond 8 x 256 x 64); registers as loaded in 16-bit forwards with 128-bit accesses
    (softmax_resident_raw, 64 elements a thread); both in 16-bit forwards past 16 x 512 x 64 elements
    (softmax_cluster_smem_raw_regs: 64 as loaded and 64 in shared memory, 16 x 512 x 128 = 2^20); converted
    registers otherwise, and in every backward. Past what a cluster caches: the grid mode. On a deep-memory
    device (kDeepClusterWideThreads) the 16-bit forwards past 8 x 256 x 64 take both (16 x 128 at 262144), and the
    backward of 16 CTAs of 1024 threads the grid mode (cluster_backward_yields_to_grid)."""
    if torch.cuda.get_device_capability()[0] < 9 or _clusters_capped():
        pytest.skip("clusters need sm_90 (and FASTACT_MAX_CLUSTER unset or >= 8)")
    deep = _deep_memory()
    if deep:
        cache = _DEEP_LONG_ROW_CACHE.get((dtype, d, direction, layout), cache)
    # A slice of 16 registers a thread (the float backward, float64) caches 8 x 1024 x 16 = 131072 elements in 8-CTA
    # clusters: with clusters capped there (FASTACT_MAX_CLUSTER=8), longer rows take the grid mode.
    if cache == "registers" and layout == "contiguous" and d > 8 * 1024 * 16 and _clusters_capped(16):
        cache = "grid"
    x = make_tensor((2, d), dtype, "cuda", layout)
    s = fastact.explain("softmax" if direction == "fwd" else "softmax_backward", x)
    assert _variant(s) == "long_row", s
    if cache == "grid":
        assert "partials through global memory" in s, s
        return
    if cache == "shared_raw" and (_clusters_capped(16) or
                                  torch.cuda.get_device_properties(x.device).multi_processor_count < 16):
        pytest.skip("16-CTA clusters (FASTACT_MAX_CLUSTER unset or 16, 16 SMs)")
    assert "global memory" not in s, s
    assert ("in shared memory" in s) == (cache in ("shared", "shared_raw")), s
    assert ("kept as loaded" in s) == (cache in ("raw", "shared_raw")), s
    if cache == "shared_raw":
        m = re.search(r"\[(\d+) CTA\(s\) x (\d+) threads x (\d+) elements per row \(the rest kept as loaded, (\d+) in "
                      r"shared memory\)", s)
        assert m and int(m.group(1)) == 16 and int(m.group(3)) == 128 and int(m.group(4)) == 64, s
        if deep and d == 262144:  # the fewest threads: 16 x 128 x 128
            assert int(m.group(2)) == 128, s
    if cache == "shared":  # 64 elements a thread: 32 in registers, 32 in shared memory (32-bit); 64 there (16-bit)
        m = re.search(r"\[(\d+) CTA\(s\) x (\d+) threads x (\d+) elements per row \((\d+) in shared memory\)", s)
        assert m and int(m.group(3)) == 64 and int(m.group(4)) == (32 if dtype.itemsize == 4 else 64), s
        if d == 262144 and deep and not _clusters_capped(16):  # 16 x 256 (kDeepClusterWideThreads)
            assert (int(m.group(1)), int(m.group(2))) == (16, 256), s
    if cache == "raw":
        assert re.search(r"x 64 elements per row \(kept as loaded\)", s), s


# test_long_row_cache_plan's cases whose cache differs on a deep-memory device.
_DEEP_LONG_ROW_CACHE = {
    (torch.bfloat16, 262144, "fwd", "contiguous"): "shared_raw",
    (torch.float16, 262144, "fwd", "contiguous"): "shared_raw",
    (torch.float32, 262144, "bwd", "contiguous"): "grid",
}


def _clusters_capped(below=8):
    """FASTACT_MAX_CLUSTER below `below` (8: clusters off; 16: no 16-CTA clusters; softmax/launch.cuh
    probe_clusters)."""
    env = os.environ.get("FASTACT_MAX_CLUSTER")
    return env is not None and (int(env) if env.strip().lstrip("-").isdigit() else 0) < below


@pytest.mark.parametrize(
    "dtype,d,standard,deep",  # (columns, threads, cluster) on a standard-memory device, on a deep one
    [
        (torch.bfloat16, 256, (8, 256, 1), (8, 256, 1)),  # a whole line (128 bytes) in one CTA of 256 threads
        (torch.bfloat16, 512, (8, 256, 2), (4, 256, 1)),  # not one CTA of 512: 256-thread CTAs in a cluster (deep:
        (torch.float16, 1024, (8, 256, 4), (4, 256, 2)),  # half lines, as the docstring says)
        (torch.float32, 512, (8, 512, 1), (8, 256, 2)),  # float keeps whole lines in CTAs of up to 512 threads (deep: 256)
    ],
)
def test_strided_forward_tile_plan(dtype, d, standard, deep):
    """dispatch.h kStridedRawCtaThreads / kStridedRawClusterThreads: the strided forward of raw 16-bit
    rows takes whole lines in CTAs of at most 256 threads, clusters beyond; float keeps its rule. On a deep-memory
    device (strided_deep_forward) float takes the raw rows' shapes and the raw rows half lines where a whole one needs
    a cluster."""
    if torch.cuda.get_device_capability()[0] < 9 or _clusters_capped():
        pytest.skip("clusters need sm_90 (and FASTACT_MAX_CLUSTER unset or >= 8)")
    x = make_tensor((2, d, 2048), dtype, "cuda")
    s = fastact.explain("softmax", x, 1)
    m = re.search(r"\[(\d+) column\(s\) x (\d+) threads per CTA, cluster (\d+), cached", s)
    want = deep if _deep_memory() else standard
    assert m and (int(m.group(1)), int(m.group(2)), int(m.group(3))) == want, s
    poison_allocator("cuda", x.numel() * dtype.itemsize)
    assert_close(fastact.softmax(x, 1), torch.softmax(x.double(), 1), torch_actual=torch.softmax(x, 1), msg=s)


# (dtype, shape, dim, backward, the launch shapes explain may report: (columns, threads, cluster, mode)).
_STRIDED_RULES = [
    # element accesses (inner 1023), forward: the line halves to 16 columns (bf16: 32 bytes) to stay in one CTA
    (torch.bfloat16, (2, 257, 1023), 1, False, {(16, 288, 1, "cached")}),
    # float stops at 64 bytes (16 columns), and takes no fewer than 16 columns: at D = 513 a cluster
    (torch.float32, (2, 257, 1023), 1, False, {(16, 288, 1, "cached")}),
    (torch.float32, (2, 513, 1023), 1, False, {(32, 288, 4, "cached")}),
    # float element forwards of short D widen to 512 threads where the inner holds a whole line
    # (kStridedMinFloatElementThreads), not below (inner 3: 128 threads, as other short tiles)
    (torch.float32, (2, 64, 1023), 1, False, {(128, 512, 1, "cached")}),
    (torch.float32, (2, 100, 49), 1, False, {(64, 448, 1, "cached")}),
    (torch.float32, (5, 100, 3), 1, False, {(16, 128, 1, "cached")}),
    # 16-bit element forwards whose 16-column tile needs more than one CTA: those 16 columns over the
    # smallest cluster of CTAs of at most 320 threads (kStridedElementClusterThreads), up to 8 CTAs;
    # not where the inner holds less than a whole line (inner 49: the line over a cluster, as before)
    (torch.bfloat16, (2, 513, 1023), 1, False, {(16, 288, 2, "cached")}),
    (torch.float16, (2, 700, 1023), 1, False, {(16, 192, 4, "cached")}),
    (torch.bfloat16, (2, 2000, 1023), 1, False, {(16, 256, 8, "cached")}),
    (torch.bfloat16, (2, 513, 49), 1, False, {(32, 288, 4, "cached")}),
    # element accesses, backward, a tile beyond one CTA: streamed, each thread ~64 bytes of each array
    # (strided_element_stream_shape; "stream" computes the shape from the device's SMs and L2)
    (torch.float32, (2, 257, 1023), 1, True, "stream"),
    (torch.bfloat16, (2, 257, 1023), 1, True, "stream"),
    (torch.float32, (2, 513, 1023), 1, True, "stream"),
    (torch.bfloat16, (2, 513, 1023), 1, True, "stream"),
    (torch.float32, (2, 1000, 1023), 1, True, "stream"),
    (torch.bfloat16, (2, 2000, 1023), 1, True, "stream"),
    (torch.float64, (2, 513, 1023), 1, True, "stream"),
    (torch.float32, (7, 1600, 13), 1, True, "stream"),
    # ... and, where the inner holds a whole line of 2- or 4-byte elements, at short D too (from 64 rows;
    # kStridedElementStreamMinRows), in a wider set of shapes (256-thread CTAs, up to two lines)
    (torch.float32, (2, 64, 1023), 1, True, "stream"),
    (torch.float32, (3, 100, 1023), 1, True, "stream"),
    (torch.bfloat16, (2, 64, 1023), 1, True, "stream"),
    (torch.float16, (3, 100, 255), 1, True, "stream"),
    (torch.float32, (4, 160, 49), 1, True, "stream"),
    # below 64 rows, or float64, the cached plans
    (torch.float32, (2, 48, 1023), 1, True, {(32, 192, 1, "cached")}),
    (torch.bfloat16, (2, 16, 1023), 1, True, {(64, 128, 1, "cached")}),
    (torch.float64, (2, 100, 1023), 1, True, {(16, 416, 1, "cached")}),
    # ... D over a cluster where that comes closer to the share (float D = 2000: no shape without a
    # cluster fits L2 on the H100; with one, 512 x 32 x 8)
    (torch.float32, (2, 2000, 1023), 1, True, "stream"),
    (torch.float64, (2, 1500, 1023), 1, True, "stream"),
    # dim 0 of a tall matrix: narrower tiles over the largest cluster (16 on the H100; with 8, the
    # forward of 16384 halves the tile again and the others, 2 tiles, take the split mode)
    # (a device whose 16-clusters fill it at 1024 threads takes those in the cluster loop first)
    (torch.float32, (16384, 64), 0, False, {(4, 512, 16, "cached"), (2, 512, 8, "cached"), (8, 1024, 16, "cached")}),
    (torch.float32, (16384, 64), 0, True, {(2, 512, 16, "cached"), (8, 512, 1, "split")}),
    (torch.bfloat16, (16384, 64), 0, False, {(4, 512, 16, "cached"), (2, 512, 8, "cached")}),
    (torch.bfloat16, (16384, 64), 0, True, {(2, 512, 16, "cached"), (8, 512, 1, "split")}),
    (torch.float32, (16385, 64), 0, False, {(2, 288, 16, "cached"), (8, 512, 1, "split")}),
    # D too long for any cached tile, and too few tiles to fill the device even over a cluster: the split
    # mode (chunks of D, a CTA each, partials through the workspace)
    (torch.float32, (65536, 64), 0, False, {(8, 512, 1, "split")}),
    (torch.float32, (65536, 64), 0, True, {(8, 512, 1, "split")}),
    (torch.bfloat16, (65536, 64), 0, False, {(8, 512, 1, "split")}),
    (torch.bfloat16, (65536, 64), 0, True, {(8, 512, 1, "split")}),
    (torch.float64, (65536, 64), 0, True, {(8, 512, 1, "split")}),
    (torch.float32, (4, 65536, 8), 1, True, {(2, 512, 1, "split")}),  # tiles over 4 outer indices
    # ... in tiles of a whole outer index where a line does not divide its column vectors
    # (kStridedWholeOuterUnits: 3 or 33 elements, 25 vectors of [*, 100]; not a power of two, the threads
    # past the last whole D-group idle)
    (torch.float32, (100000, 3), 0, False, {(3, 512, 1, "split"), (2, 800, 16, "cached")}),
    (torch.bfloat16, (65536, 33), 0, False, {(33, 512, 1, "split")}),
    (torch.float32, (65536, 33), 0, True, {(33, 512, 1, "split")}),
    (torch.float64, (65536, 33), 0, False, {(33, 512, 1, "split")}),
    (torch.float32, (65536, 100), 0, False, {(25, 512, 1, "split")}),
    (torch.float32, (65536, 100), 0, True, {(25, 512, 1, "split")}),
    (torch.bfloat16, (65536, 100), 0, True, {(100, 512, 1, "split")}),
    # ... and streamed over a cluster where 66 tiles fill the device with one (8 CTAs on 132 SMs)
    (torch.float32, (66, 16384, 33), 1, False, {(33, 512, 8, "streamed twice"), (33, 512, 4, "streamed twice")}),
    (torch.float32, (66, 16384, 33), 1, True, {(33, 512, 8, "streamed twice"), (33, 512, 4, "streamed twice")}),
]


_H100_STREAMS = {
    (torch.float32, (2, 513, 1023)): (32, 1024, 1, "streamed twice"),
    (torch.bfloat16, (2, 513, 1023)): (32, 512, 1, "streamed twice"),
    (torch.float32, (2, 1000, 1023)): (32, 512, 4, "streamed twice"),
    (torch.bfloat16, (2, 2000, 1023)): (32, 512, 4, "streamed twice"),
    (torch.float32, (2, 2000, 1023)): (32, 512, 8, "streamed twice"),
    # twenty-fourth session's sweep
    (torch.float32, (2, 64, 1023)): (64, 256, 1, "streamed twice"),
    (torch.float32, (3, 100, 1023)): (32, 256, 1, "streamed twice"),
    (torch.bfloat16, (2, 64, 1023)): (128, 256, 1, "streamed twice"),
    (torch.bfloat16, (2, 257, 1023)): (32, 256, 1, "streamed twice"),
}


def _pow2_floor(n):
    return 1 << (n.bit_length() - 1)


def _element_stream_shapes(d, size, line, wide_cap=None):
    """dispatch.h strided_element_stream_shape, written again from its comment: the streamed shapes
    (512 or 1024 threads, columns a power of two from 16, or the line if narrower, to the line; with
    `wide_cap` (strided_element_stream_wide: the inner's largest power of two) also 256 threads and
    columns up to two lines, within wide_cap, without a cluster; D split over a cluster of up to the
    device's cap, 8 or 16 at each CTA size: every cap the probe can give) whose tiles in flight fit L2
    with every SM full (2048 threads, each ceil(D / (G x cluster)) elements of two arrays); the one
    whose share is closest to 64 bytes, then columns nearest 32, then the first tried (no cluster
    first, narrower columns first, 256 / 512 / 1024 threads at each; then 512 threads before 1024,
    smaller clusters first). None fits: the cached plans (any cluster)."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())

    def widths_to(top):
        out, cols = [], min(16, line)
        while cols <= top:
            out.append(cols)
            cols *= 2
        return out

    widths = widths_to(line)
    single = widths_to(min(2 * line, wide_cap)) if wide_cap else widths
    out = set()
    for cap in ({512: 8, 1024: 8}, {512: 16, 1024: 8}, {512: 16, 1024: 16}):
        tried = [(1, c, t) for c in single for t in ((256, 512, 1024) if wide_cap else (512, 1024))]
        tried += [(1 << k, c, t) for t in (512, 1024) for k in range(1, cap[t].bit_length()) for c in widths]
        best = None
        for cl, c, t in tried:
            groups = t // c * cl
            if c > t or (cl > 1 and groups > d):
                continue
            share = -(-d // groups) * size
            if props.multi_processor_count * 2048 * share * 2 > props.L2_cache_size:
                continue
            key = (max(share, 64) / min(share, 64), abs(c.bit_length() - 6))
            if best is None or key < best[0]:
                best = (key, (c, t, cl, "streamed twice"))
        if best is None:
            return {(line, t, c, "cached") for t in range(32, 1025, 32) for c in (2, 4, 8, 16)}
        out.add(best[1])
    return out


@pytest.mark.parametrize("dtype,shape,dim,backward,shapes", _STRIDED_RULES,
                         ids=lambda v: dtype_id(v) if isinstance(v, torch.dtype) else None)
def test_strided_plan_rules(dtype, shape, dim, backward, shapes):
    """dispatch.h kStridedMinElementColumns, kStridedMinFloatElementThreads, kStridedSectorBytes,
    strided_element_stream_shape and strided_stream_cluster: the strided plan narrows element forwards
    to lines of 16 columns in one CTA (16-bit ones past one CTA: 16 columns over a small cluster), widens
    short float element forwards to 512 threads, streams element backwards whose tile needs more than one
    CTA, or whose inner holds a whole line at D >= 64, in the shape the L2 rule picks (D over a cluster
    where that comes closer), narrows the tiles of a D too long for a line's cluster over the
    largest cluster, and streams the few tiles of a D too long for any of those over a cluster (or
    splits D), in tiles of a whole outer index where a line does not divide it (kStridedWholeOuterUnits);
    each of those plans gives the right result (outputs poisoned first)."""
    if torch.cuda.get_device_capability()[0] < 9 or _clusters_capped():
        pytest.skip("clusters need sm_90 (and FASTACT_MAX_CLUSTER unset or >= 8)")
    element_stream = shapes == "stream"
    if element_stream:
        line = min(128 // dtype.itemsize, _pow2_floor(shape[2]))
        wide = line * dtype.itemsize == 128 and dtype.itemsize <= 4 and shape[1] >= 64
        shapes = _element_stream_shapes(shape[1], dtype.itemsize, line, _pow2_floor(shape[2]) if wide else None)
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        if (props.multi_processor_count, props.L2_cache_size) == (132, 50 << 20) and (dtype, shape) in _H100_STREAMS:
            # the shapes measured on the H100 (bench/NOTES.md, nineteenth and twenty-fourth sessions), in case the rule and
            # its Python copy above share a mistake
            assert _H100_STREAMS[(dtype, shape)] in shapes, shapes
            shapes = {_H100_STREAMS[(dtype, shape)]}
    x = make_tensor(shape, dtype, "cuda")
    y = torch.softmax(x, dim)
    s = fastact.explain("softmax_backward" if backward else "softmax", y if backward else x, dim)
    m = re.search(r"\[(\d+) column\(s\) x (\d+) threads per CTA, cluster (\d+), (cached|streamed twice)"
                  r"(, \d+ chunks of D)?", s)
    mode = "split" if m and m.group(5) else m and m.group(4)
    assert m and (int(m.group(1)), int(m.group(2)), int(m.group(3)), mode) in shapes, s
    if element_stream and mode == "streamed twice":
        assert "the second mostly from L2" in s, s
    poison_allocator("cuda", x.numel() * dtype.itemsize)
    if not backward:
        assert_close(fastact.softmax(x, dim), torch.softmax(x.double(), dim), torch_actual=y, msg=s)
    else:
        g = make_tensor(shape, dtype, "cuda")
        assert_close(ops.softmax_backward(g, y, dim, dtype), softmax_backward_ref(g, y, dim, False),
                     torch_actual=softmax_backward_torch(g, y, dim, dtype, False), msg=s)


# dispatch.h strided_prefetches: (dtype, D, inner (0: dim 0 of [D, m]), whether the cached forward of an input
# just past the device's L2 size prefetches the tiles ahead into L2).
_PREFETCH_CASES = [
    (torch.float32, 1024, 2056, True),   # 128-bit accesses, a CTA a tile (the last partial where n x 514 is odd)
    (torch.bfloat16, 1024, 2056, True),  # raw 16-bit rows over a cluster of 4 (not on a deep-memory device)
    (torch.float16, 1024, 2056, True),
    (torch.float32, 100, 1023, False),   # element accesses
    (torch.bfloat16, 100, 1023, False),  # 16-bit element accesses, staged in shared memory: no prefetch
    (torch.float32, 16384, 0, True),     # dim 0 of a tall matrix: narrow tiles over clusters of 16
    (torch.float32, 8, 65536, True),     # D = kStridedPrefetchMinRows ...
    (torch.float32, 7, 65536, False),    # ... and below it
    (torch.float64, 1024, 2056, False),  # float64 accumulation
]


@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
@pytest.mark.parametrize("dtype,d,inner,prefetch", _PREFETCH_CASES,
                         ids=lambda v: dtype_id(v) if isinstance(v, torch.dtype) else None)
def test_strided_forward_prefetch(op, dtype, d, inner, prefetch):
    """dispatch.h kStridedPrefetchDivisor / strided_prefetches: the cached strided forward of an input of at least
    the L2 size, float accumulation, 128-bit accesses and D >= 8 asks L2 for the tiles a quarter of the device's
    resident tiles ahead (explain says so); one just under the L2 size, float64, D = 7, element accesses, the staged
    16-bit forward and the backward do not; nor, on a deep-memory device, the raw 16-bit rows (128-bit accesses).
    The prefetching forward gives the right result (outputs poisoned), its
    last tiles included, whose counterparts ahead lie past the end. The plans named above are the H100's; without
    clusters (or with FASTACT_MAX_CLUSTER below 8) a case whose plan streams instead is skipped."""
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    size = dtype.itemsize
    if inner == 0:
        dim, shape = 0, (d, -(-l2 // (d * size * 8)) * 8)
        under = (d, (l2 // (d * size) - 1) // 8 * 8)
    else:
        dim, shape = 1, (-(-l2 // (d * inner * size)), d, inner)
        under = ((l2 - 1) // (d * inner * size), d, inner)
    x = make_tensor(shape, dtype, "cuda")
    s = fastact.explain(op.name, x, dim)
    clusters = torch.cuda.get_device_capability()[0] >= 9 and not _clusters_capped()
    mode = "staged" if "staged in shared memory" in s else "cached"
    if not clusters and f", {mode}" not in s:
        pytest.skip(f"without clusters this plan is neither cached nor staged: {s}")
    assert (mode == "staged") == (dtype.itemsize == 2 and inner % 8 != 0), s
    if prefetch and dtype.itemsize == 2 and mode == "cached" and _deep_memory():
        prefetch = False  # D = 1024: half lines on a deep device, not prefetched
    assert ("the tiles ahead prefetched into L2" in s) == prefetch, s
    if prefetch:
        s_under = fastact.explain(op.name, make_tensor(under, dtype, "cuda"), dim)
        assert mode in s_under and "prefetched" not in s_under, s_under
    torch_fn = torch.log_softmax if op.name == "log_softmax" else torch.softmax
    poison_allocator("cuda", x.numel() * size)
    y = getattr(fastact, op.name)(x, dim)
    assert_close(y, torch_fn(x.double(), dim), torch_actual=torch_fn(x, dim), msg=s)
    s_bwd = fastact.explain(op.name + "_backward", y, dim)
    assert "prefetched" not in s_bwd, s_bwd


# dispatch.h long_row_prefetches: (dtype, D, whether part of the slice is in shared memory, whether the long_row
# forward of an input just past the device's L2 size prefetches the rows ahead into L2).
_LONG_ROW_PREFETCH_CASES = [
    (torch.bfloat16, 262144, True, True),    # 16-bit rows all in shared memory (deep: a register part, unprefetched
                                             # at this size)
    (torch.float16, 151936, True, True),
    (torch.float32, 262144, True, False),    # float rows: half the slice in registers
    (torch.bfloat16, 131072, False, False),  # 16-bit rows in portable register-only clusters, kept as loaded
    (torch.bfloat16, 1 << 20, True, False),  # 16-bit rows with a register part as loaded besides
]


@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
@pytest.mark.parametrize("dtype,d,smem,prefetch", _LONG_ROW_PREFETCH_CASES,
                         ids=lambda v: dtype_id(v) if isinstance(v, torch.dtype) else None)
def test_long_row_forward_prefetch(op, dtype, d, smem, prefetch):
    """dispatch.h kLongRowPrefetchDivisor / long_row_prefetches: the long_row forward of 16-bit rows cached in
    shared memory (long_row.cuh softmax_cluster_smem_fwd_kernel), of an input of at least the L2 size, asks L2 for
    the slices of the rows a quarter of the device's resident clusters ahead (explain says so); one just under the
    L2 size, float rows, the register-only clusters, 16-bit rows with a register part besides (past 2^19; on a
    deep-memory device past 2^17, prefetched only from four times the L2 size, so none here: the memory-depth test
    runs both) and the backward do not. The prefetching forward gives the right
    result (outputs poisoned), its last rows included, whose counterparts ahead lie past the end. Without clusters
    (or with FASTACT_MAX_CLUSTER capping them) a case whose plan is not a cluster one is skipped."""
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    size = dtype.itemsize
    x = make_tensor((-(-l2 // (d * size)), d), dtype, "cuda")
    s = fastact.explain(op.name, x)
    if "variant=long_row" not in s or "global memory" in s:
        pytest.skip(f"not a cluster plan here: {s}")
    if _deep_memory() and dtype.itemsize == 2 and d > 131072:  # a register part (kDeepRawPrefetchL2Multiple)
        assert "the rest kept as loaded" in s, s
        prefetch = False
    assert ("in shared memory)" in s) == smem, s
    assert ("the rows ahead prefetched into L2" in s) == prefetch, s
    if prefetch:
        s_under = fastact.explain(op.name, make_tensor(((l2 - 1) // (d * size), d), dtype, "cuda"))
        assert "in shared memory)" in s_under and "prefetched" not in s_under, s_under
    torch_fn = torch.log_softmax if op.name == "log_softmax" else torch.softmax
    poison_allocator("cuda", x.numel() * size)
    y = getattr(fastact, op.name)(x, -1)
    assert_close(y, torch_fn(x.double(), -1), torch_actual=torch_fn(x, -1), msg=s)
    assert "prefetched" not in fastact.explain(op.name + "_backward", y), s


_PREFETCH_OFF_SCRIPT = """
import sys, torch, fastact
l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
torch.manual_seed(0)
x = torch.randn(-(-l2 // (1024 * 2056 * 4)), 1024, 2056, device="cuda")
print(fastact.explain("softmax", x, 1))
r = torch.randn(-(-l2 // (262144 * 2)), 262144, device="cuda", dtype=torch.bfloat16)
print(fastact.explain("softmax", r))
r4 = torch.randn(-(-4 * l2 // (262144 * 2)), 262144, device="cuda", dtype=torch.bfloat16)
print(fastact.explain("log_softmax", r4))
torch.save((fastact.softmax(x, 1).cpu(), fastact.softmax(r).cpu(), fastact.log_softmax(r4).cpu()), sys.argv[1])
"""


def test_forward_prefetch_off(tmp_path):
    """FASTACT_PREFETCH=0 (read once, with the device's properties) turns the L2 prefetches off (the strided
    forward's; the 16-bit long_row forward's where clusters run it, on a deep-memory device with the register part
    from four times the L2 size): the plans say so, and the results are bitwise the prefetching run's (a prefetch
    changes no value)."""
    runs = {}
    for flag in ("0", "1"):
        path = tmp_path / f"prefetch{flag}.pt"
        env = dict(os.environ, FASTACT_PREFETCH=flag)
        out = subprocess.run([sys.executable, "-c", _PREFETCH_OFF_SCRIPT, str(path)], env=env, capture_output=True,
                             text=True)
        assert out.returncode == 0, out.stderr[-3000:]
        strided, long_row, long_row_4l2 = out.stdout.splitlines()[:3]
        assert "cached" in strided and ("prefetched into L2" in strided) == (flag == "1"), out.stdout
        # The shared-memory cluster plan without a register part (not the grid's; on a deep-memory device these rows
        # keep one, unprefetched under four times the L2 size: dispatch.h kDeepRawPrefetchL2Multiple).
        if "in shared memory)" in long_row and "global memory" not in long_row and "kept as loaded" not in long_row:
            assert ("prefetched into L2" in long_row) == (flag == "1"), out.stdout
        elif "kept as loaded" in long_row:  # not prefetched at this size, whatever the flag
            assert "prefetched" not in long_row, out.stdout
        # Four times the L2 size: any shared-memory cluster plan prefetches (on a deep-memory device the register part
        # too: dispatch.h kDeepRawPrefetchL2Multiple).
        if "in shared memory)" in long_row_4l2 and "global memory" not in long_row_4l2:
            assert ("prefetched into L2" in long_row_4l2) == (flag == "1"), out.stdout
        runs[flag] = torch.load(path)
    assert all(torch.equal(a, b) for a, b in zip(runs["0"], runs["1"]))


# dispatch.h kStridedStagedNarrowBackwardShapes: (bytes a D-row, thread groups a column).
_STAGED_NARROW_BACKWARD_SHAPES = ((128, 2), (64, 4), (64, 2), (64, 1))
# dispatch.h kStridedStagedVec16BackwardShapes: (up to D, bytes a D-row, thread groups a column).
_STAGED_VEC16_BACKWARD_SHAPES = ((95, 256, 1), (128, 128, 2), (299, 0, 0), (398, 128, 4), (400, 128, 2))
# dispatch.h kStridedStagedForwardShapes: (up to D, bytes a D-row, thread groups a column).
_STAGED_FORWARD_SHAPES = ((79, 256, 2), (111, 128, 2), (143, 128, 4), (256, 64, 4))


def _staged_shape(shape, size, forward=False, out_size=None, vector=False):
    """dispatch.h strided_staged_shape, written again from its comment: the staged tile's (columns, thread
    groups a column) of an element backward (an inner no 16-byte vector divides, or a pointer off the
    alignment) of [outer, D, inner] with `size`-byte grad_output, or of an element forward of `size`-byte x
    and `out_size`-byte y (default: the same), or with `vector` of a backward whose plan takes 16-byte
    vectors; columns 0 where it does not stage (sm_90 only, D >= 64; backwards of 2- or 4-byte elements,
    forwards of 16-bit x and y; vector backwards of 2- or 4-byte grad_output and grad_input whose D-rows are
    not whole 32-byte sectors: in float 64 columns and 2 groups, in 16-bit the table's tile (none at D 129-299),
    where both arrays and the partial dots fit 113 KB and the inner's largest power of two holds the
    columns). Element backward: the
    widest power of two of at most 512 bytes a D-row and at most the inner's largest power of two whose
    tile (both arrays, a 16-byte chunk of slack a D-row) fits 113 KB, if still >= 256 bytes a D-row; one
    group; else for 16-bit elements where no 256-byte tile fits shared memory, the first narrow shape whose
    tile (plus 4 bytes a column and group past one group) fits, if the inner's largest power of two holds
    it. Forward: the table's D-row bytes and groups up to D = 256, past it the widest of 256, 128, 64
    bytes a D-row whose tile (plus 8 bytes a column and group past one group) fits 113 KB, 256 / columns
    groups; no stage if the inner's largest power of two is narrower. Then the inner's tiles of that width
    evened out, the columns rounded up to a 16-byte chunk's elements; tiles for two CTAs on every SM."""
    outer, d, inner = shape
    if d < 64 or torch.cuda.get_device_capability()[0] != 9:
        return 0, 1
    if (size != 2 or (out_size or size) != 2) if forward else size > 4:
        return 0, 1
    groups = 1
    if vector:
        if forward or (out_size or size) != size or inner * size % 32 == 0:
            return 0, 1
        if size == 4:
            w, groups = 64, 2
        else:
            tile = next(((b // size, g) for most, b, g in _STAGED_VEC16_BACKWARD_SHAPES if d <= most), None)
            if tile is None or tile[0] == 0:  # past the table, or its cached-plan row
                return 0, 1
            w, groups = tile
        if 2 * d * (w + 16 // size) * size + (4 * groups * w if groups > 1 else 0) > 113 * 1024:
            return 0, 1
    elif not forward:
        w = min(512 // size, _pow2_floor(inner))
        while w * size >= 256 and 2 * d * (w + 16 // size) * size > 113 * 1024:
            w //= 2
        if w * size < 256:
            if size != 2 or 2 * d * (256 // size + 16 // size) * size <= 113 * 1024:
                return 0, 1  # narrow tiles: 16-bit, where shared memory (not the inner) stops the wide ones
            for row_bytes, groups in _STAGED_NARROW_BACKWARD_SHAPES:
                w = row_bytes // size
                if 2 * d * (w + 16 // size) * size + (4 * groups * w if groups > 1 else 0) <= 113 * 1024:
                    break
            else:
                return 0, 1
    else:
        w = 0
        for most, row_bytes, g in _STAGED_FORWARD_SHAPES:
            if d <= most:
                w, groups = row_bytes // size, g
                break
        if not w:
            w = 256 // size
            while w * size >= 64:
                groups = 256 // w
                if d * (w + 16 // size) * size + (8 * groups * w if groups > 1 else 0) <= 113 * 1024:
                    break
                w //= 2
            if w * size < 64:
                return 0, 1
    if w > _pow2_floor(inner):  # the wide backward tiles are capped above
        return 0, 1
    tiles = -(-inner // w)
    cols = -(-(-(-inner // tiles)) // (16 // size)) * (16 // size)
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return (cols, groups) if outer * -(-inner // cols) >= 2 * sms else (0, 1)


def _assert_staged_plan(explained, want):
    """explain()'s plan is staged with want = (columns, groups) in CTAs of 256 threads, or (columns 0) not staged."""
    m = re.search(r"\[(\d+) column\(s\) x (\d+) threads per CTA, cluster 1, staged in shared memory, (\d+) thread "
                  r"group\(s\) a column", explained)
    if want[0]:
        assert m and tuple(int(v) for v in m.groups()) == (want[0], 256, want[1]), explained
    else:
        assert "staged" not in explained, explained


def _staged_columns(shape, size, forward=False, out_size=None):
    """The staged tile's columns (_staged_shape), 0 where it does not stage."""
    return _staged_shape(shape, size, forward, out_size)[0]


# (grad_output dtype, grad_input dtype, [outer, D, inner] over dim 1, log_softmax, layouts of (grad_output,
# output), the staged (columns, groups) on the H100 (columns 0: not staged)).
_STAGED_CASES = [
    (torch.float32, torch.float32, (140, 64, 67), False, ("contiguous", "contiguous"), (36, 1)),  # 2 tiles of 64 evened
    (torch.float32, torch.float32, (140, 63, 67), False, ("contiguous", "contiguous"), (0, 1)),  # D below 64
    (torch.bfloat16, torch.bfloat16, (264, 100, 300), False, ("contiguous", "contiguous"), (152, 1)),
    (torch.bfloat16, torch.bfloat16, (264, 100, 300), True, ("offset", "contiguous"), (152, 1)),  # dy, y misaligned apart
    (torch.float32, torch.float32, (140, 64, 67), False, ("offset", "offset"), (36, 1)),
    (torch.float16, torch.float16, (264, 64, 1023), True, ("contiguous", "offset"), (256, 1)),
    (torch.float32, torch.float32, (300, 160, 130), True, ("contiguous", "contiguous"), (44, 1)),
    (torch.bfloat16, torch.bfloat16, (264, 212, 129), False, ("contiguous", "contiguous"), (72, 1)),
    (torch.bfloat16, torch.bfloat16, (264, 213, 129), False, ("contiguous", "contiguous"), (48, 2)),  # narrow: 128 bytes
    (torch.float16, torch.float16, (264, 400, 129), True, ("offset", "contiguous"), (48, 2)),  # 113 KB at 128 x 2
    (torch.bfloat16, torch.bfloat16, (264, 401, 129), False, ("contiguous", "offset"), (32, 4)),
    (torch.bfloat16, torch.bfloat16, (100, 720, 129), True, ("contiguous", "contiguous"), (32, 4)),  # 113 KB at 64 x 4
    (torch.bfloat16, torch.bfloat16, (100, 721, 129), False, ("offset", "offset"), (32, 2)),
    (torch.bfloat16, torch.bfloat16, (100, 723, 129), False, ("contiguous", "contiguous"), (32, 1)),
    (torch.bfloat16, torch.bfloat16, (100, 724, 129), False, ("contiguous", "contiguous"), (0, 1)),
    (torch.bfloat16, torch.bfloat16, (264, 300, 60), False, ("contiguous", "contiguous"), (0, 1)),  # inner holds 32
    (torch.bfloat16, torch.bfloat16, (264, 100, 100), False, ("contiguous", "contiguous"), (0, 1)),  # the inner, not
    # shared memory, narrows the wide tile (64 columns): not the narrow tiles
    (torch.float32, torch.float32, (264, 213, 129), False, ("contiguous", "contiguous"), (0, 1)),  # float: no narrow
    (torch.float32, torch.float32, (264, 100, 63), False, ("contiguous", "contiguous"), (0, 1)),  # 32 columns: 128 bytes
    (torch.float64, torch.float64, (140, 64, 67), False, ("contiguous", "contiguous"), (0, 1)),
    (torch.float32, torch.float32, (100, 64, 67), False, ("contiguous", "contiguous"), (0, 1)),  # 200 tiles < 2 x 132
    (torch.float32, torch.bfloat16, (140, 64, 67), False, ("contiguous", "contiguous"), (36, 1)),  # softmax(bf16, dtype=f32)
    # 16-byte vectors of float whose D-rows are not whole 32-byte sectors: 64 columns (evened out), 2 groups
    (torch.float32, torch.float32, (264, 64, 300), False, ("contiguous", "contiguous"), (60, 2)),  # 5 tiles of 60
    (torch.float32, torch.float32, (264, 64, 300), True, ("contiguous", "offset"), (100, 1)),  # y off the alignment
    (torch.float32, torch.float32, (100, 64, 2500), True, ("contiguous", "contiguous"), (64, 2)),
    (torch.float32, torch.float32, (264, 63, 300), False, ("contiguous", "contiguous"), (0, 1)),  # D below 64
    (torch.float32, torch.float32, (264, 211, 300), True, ("contiguous", "contiguous"), (60, 2)),  # 113 KB
    (torch.float32, torch.float32, (264, 212, 300), False, ("contiguous", "contiguous"), (0, 1)),
    (torch.float32, torch.float32, (264, 64, 1024), False, ("contiguous", "contiguous"), (0, 1)),  # whole lines
    (torch.float32, torch.float32, (264, 100, 1000), True, ("contiguous", "contiguous"), (0, 1)),  # whole sectors
    (torch.float32, torch.float32, (264, 100, 1004), False, ("contiguous", "contiguous"), (64, 2)),  # half a sector off
    (torch.float32, torch.float32, (264, 64, 96), False, ("contiguous", "contiguous"), (0, 1)),  # 384 bytes: whole
    (torch.float32, torch.float32, (264, 100, 36), False, ("contiguous", "contiguous"), (0, 1)),  # the inner holds 32
    (torch.float32, torch.float32, (40, 64, 300), False, ("contiguous", "contiguous"), (0, 1)),  # 200 tiles < 2 x 132
    # the same in 16-bit (inner = 8 mod 16): 256 bytes x 1 group up to D 95, 128 x 2 up to 128, the cached plan
    # up to 299, 128 x 4 up to 398, 128 x 2 up to 400
    (torch.bfloat16, torch.bfloat16, (264, 64, 264), False, ("contiguous", "contiguous"), (88, 1)),
    (torch.float16, torch.float16, (264, 95, 520), True, ("contiguous", "contiguous"), (104, 1)),
    (torch.bfloat16, torch.bfloat16, (264, 96, 520), True, ("contiguous", "contiguous"), (64, 2)),
    (torch.float16, torch.float16, (264, 128, 1000), False, ("contiguous", "contiguous"), (64, 2)),
    (torch.bfloat16, torch.bfloat16, (264, 129, 1000), False, ("contiguous", "contiguous"), (0, 1)),  # past the table
    (torch.bfloat16, torch.bfloat16, (264, 256, 264), False, ("contiguous", "contiguous"), (0, 1)),
    (torch.float16, torch.float16, (200, 299, 264), True, ("contiguous", "contiguous"), (0, 1)),
    (torch.float16, torch.float16, (200, 300, 264), True, ("contiguous", "contiguous"), (56, 4)),
    (torch.bfloat16, torch.bfloat16, (100, 398, 520), False, ("contiguous", "contiguous"), (64, 4)),
    (torch.bfloat16, torch.bfloat16, (100, 399, 520), True, ("contiguous", "contiguous"), (64, 2)),
    (torch.float16, torch.float16, (100, 400, 1000), False, ("contiguous", "contiguous"), (64, 2)),
    (torch.bfloat16, torch.bfloat16, (100, 401, 1000), False, ("contiguous", "contiguous"), (0, 1)),  # past the table
    (torch.bfloat16, torch.bfloat16, (264, 64, 1008), False, ("contiguous", "contiguous"), (0, 1)),  # whole sectors
    (torch.bfloat16, torch.bfloat16, (30, 64, 264), False, ("contiguous", "contiguous"), (0, 1)),  # 90 tiles < 2 x 132
]


@pytest.mark.parametrize("dtype,in_dtype,shape,log,layouts,h100", _STAGED_CASES,
                         ids=lambda v: dtype_id(v) if isinstance(v, torch.dtype) else None)
def test_strided_staged_backward(dtype, in_dtype, shape, log, layouts, h100):
    """dispatch.h kStridedStagedThreads / kStridedStagedNarrowBackwardShapes / strided_staged_shape: element
    backwards at short D take the staged mode (tiles through shared memory in 16-byte chunks) exactly where
    the rule says, with its columns and thread groups, at its bounds (D 63 / 64, the wide tiles'
    shared-memory bound at D 212 / 213, then the narrow shapes' at D 400 / 401, 720 / 721 and 723 / 724 in
    16-bit, none in float; 256 bytes a D-row, an inner narrower than the tile, the device fill, 2- and
    4-byte elements); so do float backwards of 16-byte vectors whose D-rows are not whole 32-byte sectors
    (kStridedStagedVecBackwardColumns: D 63 / 64 and 211 / 212, whole lines, whole sectors, a narrow inner;
    16-bit kStridedStagedVec16BackwardShapes: D 95 / 96, 128 / 129, 299 / 300, 398 / 399, 400 / 401);
    each plan, staged or not, gives the right result (outputs poisoned first), with grad_output and output
    off the 16-byte alignment, apart or together."""
    # explain sees only the output: a float output of a fused 16-bit grad_input plans as float there
    vector = layouts == ("contiguous", "contiguous") and shape[2] % (16 // dtype.itemsize) == 0
    want = _staged_shape(shape, dtype.itemsize, vector=vector)
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    if props.multi_processor_count == 132 and torch.cuda.get_device_capability()[0] == 9:
        assert want == h100, want  # the rule's Python copy against the H100 figures above
    op = "log_softmax" if log else "softmax"
    x = make_tensor(shape, dtype, "cuda")
    y = make_tensor(shape, dtype, "cuda", layouts[1])
    y.copy_(torch.log_softmax(x, 1) if log else torch.softmax(x, 1))
    g = make_tensor(shape, dtype, "cuda", layouts[0])
    s = fastact.explain(op + "_backward", y, 1)
    _assert_staged_plan(s, want)
    poison_allocator("cuda", y.numel() * in_dtype.itemsize)
    backward = ops.log_softmax_backward if log else ops.softmax_backward
    assert_close(backward(g, y, 1, in_dtype), softmax_backward_ref(g, y, 1, log),
                 in_dtype, torch_actual=softmax_backward_torch(g, y, 1, in_dtype, log), msg=s)
    assert_close(backward(g, y, 1, in_dtype, variant="strided"), softmax_backward_ref(g, y, 1, log),
                 in_dtype, torch_actual=softmax_backward_torch(g, y, 1, in_dtype, log), msg=s)


# (dtype, [outer, D, inner] over dim 1, log_softmax, layout of x, the staged (columns, groups) on the H100
# (columns 0: not staged)).
_STAGED_FORWARD_CASES = [
    (torch.bfloat16, (264, 100, 300), False, "contiguous", (64, 2)),  # 5 tiles of 64 evened out: 60 -> 64
    (torch.bfloat16, (264, 100, 300), True, "offset", (64, 2)),  # x off the 16-byte alignment
    (torch.float16, (264, 64, 1023), True, "contiguous", (128, 2)),
    (torch.bfloat16, (264, 63, 1023), False, "contiguous", (0, 1)),  # D below 64
    (torch.bfloat16, (264, 79, 300), False, "contiguous", (104, 2)),  # the table's rows, at their bounds
    (torch.bfloat16, (264, 80, 300), True, "contiguous", (64, 2)),
    (torch.float16, (264, 111, 300), False, "offset", (64, 2)),
    (torch.bfloat16, (264, 112, 300), False, "contiguous", (64, 4)),
    (torch.bfloat16, (264, 143, 300), True, "contiguous", (64, 4)),
    (torch.bfloat16, (264, 144, 300), False, "contiguous", (32, 4)),
    (torch.bfloat16, (264, 256, 300), False, "offset", (32, 4)),
    (torch.bfloat16, (264, 257, 300), True, "contiguous", (104, 2)),  # past the table: the widest that fits
    (torch.bfloat16, (100, 417, 300), False, "contiguous", (104, 2)),  # 113 KB at 256 bytes a D-row
    (torch.float16, (100, 418, 300), False, "contiguous", (64, 4)),
    (torch.bfloat16, (60, 789, 300), True, "contiguous", (64, 4)),  # 113 KB at 128 bytes
    (torch.bfloat16, (30, 790, 300), False, "offset", (32, 8)),
    (torch.bfloat16, (30, 1420, 300), False, "contiguous", (32, 8)),  # 113 KB at 64 bytes
    (torch.bfloat16, (30, 1421, 300), True, "contiguous", (0, 1)),
    (torch.bfloat16, (264, 64, 100), False, "contiguous", (0, 1)),  # 256 bytes a D-row, the inner holds 128
    (torch.bfloat16, (264, 100, 67), False, "contiguous", (40, 2)),  # 128 bytes: 2 tiles of 64 evened out
    (torch.bfloat16, (50, 100, 300), False, "contiguous", (0, 1)),  # 250 tiles < 2 x 132
    (torch.bfloat16, (264, 100, 256), False, "contiguous", (0, 1)),  # 16-byte vectors: not element accesses
    (torch.bfloat16, (264, 100, 256), False, "offset", (64, 2)),  # the same off the alignment: elements
    (torch.float32, (264, 100, 300), False, "contiguous", (0, 1)),  # float: the cached plans
]


@pytest.mark.parametrize("dtype,shape,log,layout,h100", _STAGED_FORWARD_CASES,
                         ids=lambda v: dtype_id(v) if isinstance(v, torch.dtype) else None)
def test_strided_staged_forward(dtype, shape, log, layout, h100):
    """dispatch.h kStridedStagedForwardShapes / strided_staged_shape: 16-bit element forwards at short D
    take the staged mode exactly where the rule says, with its columns and thread groups: the table's
    rows at their bounds (D 63 / 64, 79 / 80, 111 / 112, 143 / 144, 256 / 257), the shared-memory bound
    at each width past the table (D 417 / 418, 789 / 790, 1420 / 1421), an inner narrower than the width,
    the device fill, vectors against elements, float; each plan, staged or not, gives the right result
    (outputs poisoned first), x on or off the 16-byte alignment; the fused float output of a 16-bit x
    does not stage."""
    elements = layout == "offset" or shape[2] % (16 // dtype.itemsize) != 0
    want = _staged_shape(shape, dtype.itemsize, forward=True) if elements else (0, 1)
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    if props.multi_processor_count == 132 and torch.cuda.get_device_capability()[0] == 9:
        assert want == h100, want  # the rule's Python copy against the H100 figures above
    op = "log_softmax" if log else "softmax"
    x = make_tensor(shape, dtype, "cuda", layout)
    s = fastact.explain(op, x, 1)
    _assert_staged_plan(s, want)
    ref = getattr(torch, op)(x.double(), 1)
    poison_allocator("cuda", x.numel() * dtype.itemsize)
    assert_close(getattr(fastact, op)(x, 1), ref, torch_actual=getattr(torch, op)(x, 1), msg=s)
    assert_close(getattr(ops, op)(x, 1, None, variant="strided"), ref, torch_actual=getattr(torch, op)(x, 1), msg=s)
    if dtype != torch.float32:  # the fused float output: another plan (a staged one would fail to launch)
        assert_close(getattr(fastact, op)(x, 1, dtype=torch.float32), ref,
                     torch_actual=getattr(torch, op)(x, 1, dtype=torch.float32), msg=s)


_CLUSTER_CAP_SCRIPT = """
import torch, fastact
x = torch.randn(4, 262144, device="cuda")
for op, t in (("softmax", x), ("softmax_backward", torch.softmax(x, -1))):
    print(fastact.explain(op, t))
y = fastact.softmax(x, -1)
torch.testing.assert_close(y, torch.softmax(x.double(), -1).float(), rtol=1e-5, atol=1e-7)
g = torch.randn_like(x)
dx = torch.ops.fastact.softmax_backward(g, y, -1, torch.float32)
ref = torch.ops.aten._softmax_backward_data(g.double(), y.double(), -1, torch.float64).float()
torch.testing.assert_close(dx, ref, rtol=1e-5, atol=1e-7)
"""


@pytest.mark.parametrize("cap", ["1", "8"])
def test_max_cluster_environment_cap(cap):
    """FASTACT_MAX_CLUSTER=1 turns clusters off (long rows take the grid mode); =8 keeps them
    portable. Results stay right either way."""
    env = dict(os.environ, FASTACT_MAX_CLUSTER=cap)
    out = subprocess.run([sys.executable, "-c", _CLUSTER_CAP_SCRIPT], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 2, out.stdout
    for line in lines:
        assert _variant(line) == "long_row", line
        sizes = [int(n) for n in re.findall(r"(\d+) CTA\(s\)", line)]
        if cap == "1" or torch.cuda.get_device_capability()[0] < 9:  # no clusters: the grid mode
            assert "partials through global memory" in line, line
        else:  # portable clusters, or the grid mode where none caches the row (float backward)
            assert sizes and sizes[0] <= 8 or "partials through global memory" in line, line


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


# ----------------------------------------------------------------------------------------------
# Streams, graphs, compile, devices


def test_device_mismatch():
    x = make_tensor((4, 6), torch.float32, "cuda")
    b = random_values((6,), torch.float32, "cpu")
    with pytest.raises(RuntimeError, match="bias_gelu"):
        fastact.bias_gelu(x, b)
    with pytest.raises(RuntimeError, match="bias_gelu"):
        fastact.bias_gelu(x.cpu(), b.cuda())
    y = torch.softmax(x, -1)
    with pytest.raises(RuntimeError, match="softmax_backward"):
        ops.softmax_backward(y, y.cpu(), -1, torch.float32)
    with pytest.raises(RuntimeError, match="gelu_backward"):
        ops.gelu_backward(y, y.cpu())
    with pytest.raises(RuntimeError, match="sigmoid_backward"):
        ops.sigmoid_backward(y.cpu(), y)
    with pytest.raises(RuntimeError, match="bias_gelu_backward"):
        ops.bias_gelu_backward(y, y, b)
    torch.testing.assert_close(fastact.softmax(x), torch.softmax(x, -1))


def _side_stream_case(op, shape, dim, dtype):
    """Runs op forward and backward on a side stream whose input is produced on that stream after a
    long sleep; a kernel issued on any other stream would read the NaN the input held before."""
    s = torch.cuda.Stream()
    src = make_tensor(shape, dtype, "cuda")
    gsrc = make_tensor(shape, dtype, "cuda")
    b = bias_for(src) if op.takes_bias else None
    s.wait_stream(torch.cuda.current_stream())  # the inputs above were made on the default stream
    with torch.cuda.stream(s):
        x = torch.full(shape, float("nan"), dtype=dtype, device="cuda")
        g = torch.full(shape, float("nan"), dtype=dtype, device="cuda")
        torch.cuda._sleep(100_000_000)  # ~0.05-0.1 s of GPU time on stream s
        x.copy_(src)
        g.copy_(gsrc)
        x.requires_grad_()
        y = op.fastact(x, dim=dim, bias=b)
        y.backward(g)
        x_ref = x.detach().double().requires_grad_()
        y_ref = op.torch(x_ref, dim=dim, bias=b.double() if b is not None else None)
        y_ref.backward(g.double())
        done = torch.cuda.Event()
        done.record(s)
    done.synchronize()  # the stream's work only, not the device
    assert_close(y, y_ref, msg=f"{op} on a side stream")
    assert_close(x.grad, x_ref.grad, msg=f"{op} grad on a side stream")


@pytest.mark.parametrize("op", ALL_OPS, ids=str)
@pytest.mark.parametrize("shape,dim", [((64, 1024), -1), ((4, 70000), -1), ((16, 300, 8), 1)], ids=str)
def test_side_stream(op, shape, dim):
    if not op.takes_dim and dim != -1:
        pytest.skip("elementwise op: one case is enough")
    _side_stream_case(op, shape, dim, torch.float32)


@pytest.mark.parametrize("variant", VARIANTS)
def test_side_stream_forced_variants(variant):
    for cls, d in [("rows", 512), ("rows", 4096), ("misaligned", 1025), ("rows", 65536), ("strided_33", 129)]:
        x0, dim = make_class(cls, d, torch.float16)
        if _call(lambda: ops.softmax(x0, dim, None, variant=variant))[1] is not None:
            continue
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            x = torch.full_like(x0, float("nan"))
            torch.cuda._sleep(50_000_000)
            x.copy_(x0)
            y = ops.softmax(x, dim, None, variant=variant)
            dx = ops.softmax_backward(x, y, dim, torch.float16, variant=variant)
            ev = torch.cuda.Event()
            ev.record(s)
        ev.synchronize()
        ref = torch.softmax(x0.double(), dim)
        assert_close(y, ref, msg=f"{variant} {cls} {d}")
        assert_close(dx, softmax_backward_ref(x0, y, dim, False), msg=f"{variant} {cls} {d} backward")


def _graph_step(x, b, xh, weights):
    outs = [
        fastact.softmax(x, -1),
        fastact.log_softmax(x, 0),
        fastact.gelu(x),
        fastact.gelu(x, "tanh"),
        fastact.bias_gelu(x, b),
        fastact.sigmoid(x),
        fastact.softmax(xh, -1, dtype=torch.float32),
        fastact.log_softmax(x[:, 1:], -1),
    ]
    loss = sum((o.float() * w).sum() for o, w in zip(outs, weights))
    grads = torch.autograd.grad(loss, (x, b, xh))
    return [o.detach() for o in outs] + list(grads)


def test_cuda_graph_capture_and_replay():
    x = make_tensor((96, 1031), torch.float32, "cuda").requires_grad_()
    b = random_values((1031,), torch.float32, "cuda").requires_grad_()
    xh = make_tensor((96, 1031), torch.bfloat16, "cuda").requires_grad_()
    weights = [random_values(o.shape, torch.float32, "cuda") for o in _graph_step(x, b, xh, [1.0] * 8)[:8]]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside the capture, as torch's docs do
        for _ in range(3):
            _graph_step(x, b, xh, weights)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = _graph_step(x, b, xh, weights)
    for trial in range(3):
        with torch.no_grad():
            x.copy_(make_tensor(tuple(x.shape), torch.float32, "cuda", scale=1 + trial))
            b.copy_(random_values(tuple(b.shape), torch.float32, "cuda"))
            xh.copy_(make_tensor(tuple(xh.shape), torch.bfloat16, "cuda"))
        graph.replay()
        eager = _graph_step(x, b, xh, weights)
        for i, (r, e) in enumerate(zip(static, eager)):
            assert torch.equal(r, e), f"replay {trial}: output {i} differs from eager"


def test_cuda_graph_forced_variants():
    cases = [(v, cls, d) for v in VARIANTS for cls, d in [("rows", 256), ("rows", 4096), ("misaligned", 1025), ("rows", 65536), ("strided_2", 100)]]
    inputs = {}
    for v, cls, d in cases:
        x, dim = make_class(cls, d, torch.float16)
        y, refusal = _call(lambda: ops.log_softmax(x, dim, None, variant=v))
        if refusal is None and _call(lambda: ops.log_softmax_backward(x, y, dim, torch.float16, variant=v))[1] is None:
            inputs[(v, cls, d)] = (x, dim)
    assert inputs
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for (v, _, _), (x, dim) in inputs.items():
            ops.log_softmax(x, dim, None, variant=v)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = {k: ops.log_softmax(x, dim, None, variant=k[0]) for k, (x, dim) in inputs.items()}
        grads = {k: ops.log_softmax_backward(x, outs[k], dim, torch.float16, variant=k[0]) for k, (x, dim) in inputs.items()}
    for (x, _) in inputs.values():
        with torch.no_grad():
            x.copy_(torch.randn_like(x, dtype=torch.float32).to(x.dtype))
    graph.replay()
    for k, (x, dim) in inputs.items():
        assert torch.equal(outs[k], ops.log_softmax(x, dim, None, variant=k[0])), k
        assert torch.equal(grads[k], ops.log_softmax_backward(x, outs[k], dim, torch.float16, variant=k[0])), k


def test_cuda_graph_staged_backward():
    """The strided backward's staged mode captured in a CUDA graph and replayed on new values (both ops,
    grad_output off the 16-byte alignment): the same bits as eager."""
    shape = (264, 100, 300)
    if not _staged_columns(shape, 2):
        pytest.skip("the staged mode: sm_90 with up to 132 SMs")
    y = make_tensor(shape, torch.bfloat16, "cuda")
    g = make_tensor(shape, torch.bfloat16, "cuda", "offset")
    assert "staged in shared memory" in fastact.explain("softmax_backward", y, 1)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for log in (False, True):
            (ops.log_softmax_backward if log else ops.softmax_backward)(g, y, 1, torch.bfloat16)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [(ops.log_softmax_backward if log else ops.softmax_backward)(g, y, 1, torch.bfloat16)
                for log in (False, True)]
    for trial in range(2):
        with torch.no_grad():
            y.copy_(torch.softmax(torch.randn(shape, device="cuda"), 1).to(torch.bfloat16))
            g.copy_(make_tensor(shape, torch.bfloat16, "cuda", scale=1 + trial))
        graph.replay()
        for log, out in zip((False, True), outs):
            eager = (ops.log_softmax_backward if log else ops.softmax_backward)(g, y, 1, torch.bfloat16)
            assert torch.equal(out, eager), f"replay {trial}, log_softmax {log}"


@pytest.mark.parametrize("shape", [(264, 100, 300), (264, 128, 300), (40, 1000, 300)], ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
def test_strided_staged_special_values(op, dtype, shape):
    """The staged forward with special values down a column (as test_softmax_special_values along rows),
    at 2, 4 and 8 thread groups a column (their (max, sum) pairs combined): all -inf gives NaN, a +inf or
    a NaN makes the column NaN, a -inf first and last; masked columns (partly -inf) forward and, through
    autograd, the staged backward (or at D = 1000 the streamed one)."""
    if not _staged_columns(shape, 2, forward=True):
        pytest.skip("the staged mode: sm_90 with up to 132 SMs")
    ninf, inf, nan = float("-inf"), float("inf"), float("nan")
    x = make_tensor(shape, dtype, "cuda")
    assert "staged in shared memory" in fastact.explain(op.name, x, 1)
    x[:, :, 0] = ninf  # all -inf
    x[:, 50, 2] = inf
    x[:, 33, 3] = nan
    x[:, 0, 4] = inf
    x[:, -1, 4] = ninf
    check_op(op, x, dim=1, backward=False)
    m = make_tensor(shape, dtype, "cuda")
    m[:, :50, 1] = ninf
    m[:, 1::2, 5] = ninf
    m[:, -1, 3] = ninf  # a masked element, not a fully masked column
    check_op(op, m, dim=1)


def test_cuda_graph_staged_forward():
    """The strided forward's staged mode captured in a CUDA graph and replayed on new values (both ops, x
    off the 16-byte alignment): the same bits as eager."""
    shape = (264, 100, 300)
    if not _staged_columns(shape, 2, forward=True):
        pytest.skip("the staged mode: sm_90 with up to 132 SMs")
    x = make_tensor(shape, torch.bfloat16, "cuda", "offset")
    assert "staged in shared memory" in fastact.explain("softmax", x, 1)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for log in (False, True):
            (ops.log_softmax if log else ops.softmax)(x, 1, None)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [(ops.log_softmax if log else ops.softmax)(x, 1, None) for log in (False, True)]
    for trial in range(2):
        with torch.no_grad():
            x.copy_(make_tensor(shape, torch.bfloat16, "cuda", scale=1 + trial))
        graph.replay()
        for log, out in zip((False, True), outs):
            eager = (ops.log_softmax if log else ops.softmax)(x, 1, None)
            assert torch.equal(out, eager), f"replay {trial}, log_softmax {log}"


def _compile_fn(x, b, xh):
    return (
        fastact.softmax(x, -1),
        fastact.log_softmax(x, 0),
        fastact.gelu(x, "tanh"),
        fastact.bias_gelu(x, b, "none"),
        fastact.sigmoid(x),
        fastact.softmax(xh, 1, dtype=torch.float32),
    )


@pytest.mark.slow
def test_compile_reduce_overhead():
    torch._dynamo.reset()
    compiled = torch.compile(_compile_fn, mode="reduce-overhead", fullgraph=True)
    for step in range(4):
        torch.compiler.cudagraph_mark_step_begin()
        x = make_tensor((64, 257), torch.float32, "cuda").requires_grad_()
        b = random_values((257,), torch.float32, "cuda").requires_grad_()
        xh = make_tensor((64, 257), torch.bfloat16, "cuda").requires_grad_()
        outs = compiled(x, b, xh)
        loss = sum(o.float().sum() * (i + 1) for i, o in enumerate(outs))
        loss.backward()
        got = [o.detach().clone() for o in outs] + [x.grad.clone(), b.grad.clone(), xh.grad.clone()]
        xe, be, xhe = (t.detach().requires_grad_() for t in (x, b, xh))
        oute = _compile_fn(xe, be, xhe)
        sum(o.float().sum() * (i + 1) for i, o in enumerate(oute)).backward()
        want = [o.detach() for o in oute] + [xe.grad, be.grad, xhe.grad]
        for i, (g_, w_) in enumerate(zip(got, want)):
            assert_close(g_, w_, msg=f"step {step} output {i}")
    torch._dynamo.reset()


@pytest.mark.parametrize("op", ALL_OPS, ids=str)
def test_second_gpu(op):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    with torch.cuda.device(0):
        x = make_tensor((33, 1025), torch.float16, "cuda:1")
        for dim in (-1, 0) if op.takes_dim else (None,):
            y = check_op(op, x, dim=dim, bias=bias_for(x) if op.takes_bias else None)
            assert y.device == torch.device("cuda:1")
        assert isinstance(fastact.explain("softmax", x), str)
    # and with cuda:1 current while the tensor is on cuda:0
    with torch.cuda.device(1):
        x = make_tensor((33, 1025), torch.float32, "cuda:0")
        y = check_op(op, x, bias=bias_for(x) if op.takes_bias else None)
        assert y.device == torch.device("cuda:0")


@pytest.mark.parametrize("variant", VARIANTS)
def test_second_gpu_forced_variants(variant):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    with torch.cuda.device(0):
        # (4, 262144): long_row's shared-memory forward, whose dynamic shared memory limit is set per device
        for shape, dim in [((64, 512), -1), ((8, 4096), -1), ((4, 65536), -1), ((4, 262144), -1), ((8, 100, 3), 1)]:
            x = make_tensor(shape, torch.float32, "cuda:1")
            y, refusal = _call(lambda: ops.softmax(x, dim, None, variant=variant))
            if refusal is None:
                assert y.device == x.device
                assert_close(y, torch.softmax(x.double(), dim), msg=f"{variant} {shape}")



# Softmax plans that keep per-device state or take a workspace (forward; the backward of each shape runs
# through check_op): the grid mode (partials in a zeroed workspace), strided tiles cached over clusters
# (sizes beyond 8 need a per-function attribute), streamed over a cluster, split with a workspace (tiles of
# a line, and of a whole outer index). What explain must name, where it is the same on every sm_90 device.
_SECOND_GPU_PLANS = [
    ((4, 1 << 20), -1, "partials through global memory"),
    ((16384, 64), 0, ", cached"),
    ((66, 16384, 33), 1, "streamed twice"),
    ((1048576, 64), 0, "chunks of D"),
    ((65536, 33), 0, "variant=strided"),
]


@pytest.mark.parametrize("shape,dim,plan", _SECOND_GPU_PLANS, ids=lambda v: str(v) if isinstance(v, tuple) else None)
@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
def test_second_gpu_plans(op, shape, dim, plan):
    """Each plan above on cuda:1 while cuda:0 is current, and on cuda:0 while cuda:1 is: the workspace,
    cluster attributes and device properties of the tensor's device, not the current one's."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    if min(torch.cuda.get_device_capability(i)[0] for i in (0, 1)) < 9 or _clusters_capped():
        pytest.skip("these plans need sm_90 clusters (and FASTACT_MAX_CLUSTER unset or >= 8)")
    for current, where in ((0, "cuda:1"), (1, "cuda:0")):
        with torch.cuda.device(current):
            x = make_tensor(shape, torch.float32, where)
            s = fastact.explain(op.name, x, dim)
            assert plan in s, s
            y = check_op(op, x, dim=dim, note=f"current cuda:{current}; {s}")
            assert y.device == x.device


# ----------------------------------------------------------------------------------------------
# Memory


def _extra_peak(fn):
    """(result, peak bytes allocated during fn beyond what was allocated before it)."""
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    return out, torch.cuda.max_memory_allocated() - before


def _bytes(*tensors):
    """What the caching allocator charges for these tensors: sizes rounded up to its 512-byte granule,
    and blocks of 1 MiB and more to whole 2 MiB (it does not split off a remainder smaller than that
    from a large segment). Still far below a second tensor of the same size."""
    def charged(n):
        n = -(-n // 512) * 512
        return -(-n // (2 << 20)) * (2 << 20) if n >= (1 << 20) else n
    return sum(charged(t.numel() * t.element_size()) for t in tensors)


@pytest.mark.parametrize(
    "name,make",
    [
        ("softmax-rows", lambda: (fastact.softmax, make_tensor((4096, 4096), torch.float32, "cuda"), {"dim": -1})),
        ("softmax-long-rows", lambda: (fastact.softmax, make_tensor((4, 1 << 20), torch.float16, "cuda"), {"dim": -1})),
        ("softmax-grid-rows", lambda: (fastact.softmax, make_tensor((4, 3 << 19), torch.float16, "cuda"), {"dim": -1})),
        ("softmax-sliced", lambda: (fastact.softmax, make_tensor((4096, 4095), torch.float32, "cuda", "sliced_last"), {"dim": -1})),
        ("softmax-strided", lambda: (fastact.softmax, make_tensor((64, 1024, 64), torch.float32, "cuda"), {"dim": 1})),
        ("softmax-bf16-to-f32", lambda: (fastact.softmax, make_tensor((4096, 4096), torch.bfloat16, "cuda"), {"dim": -1, "dtype": torch.float32})),
        ("log_softmax-rows", lambda: (fastact.log_softmax, make_tensor((4096, 4096), torch.float16, "cuda"), {"dim": -1})),
        ("gelu", lambda: (fastact.gelu, make_tensor((4096, 4096), torch.float32, "cuda"), {})),
        ("sigmoid", lambda: (fastact.sigmoid, make_tensor((4096, 4097), torch.float16, "cuda"), {})),
    ],
)
def test_forward_allocates_only_its_output(name, make):
    fn, x, kw = make()
    y, extra = _extra_peak(lambda: fn(x, **kw))
    op = "log_softmax" if fn is fastact.log_softmax else "softmax"
    allowed = _bytes(y) + (_grid_workspace_bytes(fastact.explain(op, x, kw["dim"]), x) if "dim" in kw else 0)
    assert extra <= allowed, f"{name}: {extra} bytes allocated for a {_bytes(y)}-byte output"


def _grid_workspace_bytes(explanation, x):
    """What the caching allocator charges for the workspace of a grid plan (dispatch.h
    softmax_grid_workspace: a 16-byte header, a 4-byte counter per row padded to 16, a 16-byte slot and
    a 4-byte list entry per row and CTA), 0 for any other plan."""
    if "partials through global memory" not in explanation:
        return 0
    ctas = int(re.search(r"\[(\d+) CTA\(s\)", explanation).group(1))
    rows = x.numel() // x.shape[-1]
    n = 16 + -(-rows * 4 // 16) * 16 + rows * ctas * 20
    return -(-n // 512) * 512


_MEMORY_DEPTH_SCRIPT = """
import itertools, sys, torch, fastact
sys.path.insert(0, sys.argv[1])
from fastact_testing import ELEMENTWISE_OPS, SOFTMAX_OPS, assert_close, bias_for, check_op, make_tensor, row_view
torch.manual_seed(0)
depth = sys.argv[2]
# Tiles of the two classes (elementwise_shape): 128-512 threads x 1-2 accesses x 2-8 elements, 256 to 4096
# elements; their edges, several whole tiles, and a partial last tile behind many.
sizes = (1, 5, 255, 257, 1023, 2047, 2049, 4095, 4097, 8193, 3 * 65536 + 7)
for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
    for op in ELEMENTWISE_OPS:
        if op.takes_bias:  # the rows kernel with the bias as second input; its backward is bias_gelu's own
            for view in ("chunk", "padded"):
                for cols in (8, 24, 256, 1032, 4096):
                    x = row_view(67, cols, dtype, "cuda", view, scale=3.0)
                    check_op(op, x, bias=bias_for(x), note=depth)
            continue
        for n in sizes:
            check_op(op, make_tensor((n,), dtype, "cuda", scale=3.0), note=depth)
        # The rows kernel: forward, backward through autograd, and both inputs rows. Rows of 8-4096 elements: a
        # thread's later accesses (elementwise_rows_kernel's RowStep; four a thread in the deep 16-bit GELU shape)
        # move on by many whole rows, by a few rows and columns, past one row end (1032 in 16-bit: 129 accesses, one
        # more than the 128 threads) or within a row.
        for view, cols in itertools.product(("chunk", "padded"), (8, 24, 1000, 1032, 4096)):
            x = row_view(67, cols, dtype, "cuda", view, scale=3.0)
            check_op(op, x, note=depth)
            g = row_view(67, cols, dtype, "cuda", view)
            if op.name == "gelu":
                got = torch.ops.fastact.gelu_backward(g, x, op.approximate)
                want = [torch.ops.aten.gelu_backward(g.to(t), x.to(t), approximate=op.approximate)
                        for t in (torch.float64, dtype)]
            else:
                y = row_view(67, cols, dtype, "cuda", view, values=torch.sigmoid(x))
                got = torch.ops.fastact.sigmoid_backward(g, y)
                want = [torch.ops.aten.sigmoid_backward(g.to(t), y.to(t)) for t in (torch.float64, dtype)]
            assert_close(got, want[0], torch_actual=want[1], msg=f"{op.id} {dtype} {view} {cols} rows backward [{depth}]")
# Softmax: the 16-bit vec backward one unit a thread on deep devices (dispatch.h softmax_vec_backward_one_unit), rows
# of 896-4096 (two units past 4096; softmax's two passes from 2048; 1028: rows off the vector width, edges).
for dtype in (torch.float16, torch.bfloat16):
    for op in SOFTMAX_OPS:
        for d in (896, 1024, 1028, 2048, 4096, 4104):
            check_op(op, make_tensor((37, d), dtype, "cuda", scale=3.0), note=depth)
# Softmax: the vec plans that keep the whole register cache a thread on deep devices (dispatch.h
# softmax_vec_full_cache: the float forward, log_softmax's backward) and softmax's 16-bit two passes at two units past
# 512 threads (softmax_two_pass_units), rows around the halved plan's bounds and past them (f32 1032-8192, 16-bit
# 4104-8196; 3074 / 8196: rows off the vector width, edges), forward and backward.
for dtype, dims in ((torch.float32, (1032, 2048, 3072, 3074, 4096, 6144, 8192)),
                    (torch.bfloat16, (4104, 5120, 6144, 8192, 8196)), (torch.float16, (6144, 8192))):
    for op in SOFTMAX_OPS:
        for d in dims:
            check_op(op, make_tensor((19, d), dtype, "cuda", scale=3.0), note=depth)
# Softmax: the 16-bit forward of aligned rows leaves vec past 320 threads on deep devices (dispatch.h
# softmax_vec_max_threads: long_row's clusters), rows around that bound and up to vec's 512 threads elsewhere.
for dtype in (torch.bfloat16, torch.float16):
    for op in SOFTMAX_OPS:
        for d in (10240, 10248, 12288, 16384):
            check_op(op, make_tensor((11, d), dtype, "cuda", scale=3.0), note=depth)
# Softmax: the warp forward packs rows whose 128-bit units are not a power of two on deep devices (dispatch.h
# softmax_warp_packed: four accesses a lane, several rows a warp), every packable padded length of each vector width
# (4 to 32 units), 37 rows (the last block of rows partial), rows with -inf runs, and the dtype= cast.
for dtype, dims in ((torch.float32, (12, 20, 24, 40, 48, 96, 100, 124)), (torch.float64, (6, 10, 24, 40, 62)),
                    (torch.bfloat16, (24, 40, 96, 136, 200, 248)), (torch.float16, (24, 96, 248))):
    for op in SOFTMAX_OPS:
        for d in dims:
            check_op(op, make_tensor((37, d), dtype, "cuda", scale=3.0), note=depth)
            m = make_tensor((37, d), dtype, "cuda", scale=3.0)
            m[1, : d // 2] = float("-inf")
            m[6, 1::2] = float("-inf")
            m[36, :-1] = float("-inf")
            check_op(op, m, note=depth)
for op in SOFTMAX_OPS:
    check_op(op, make_tensor((37, 96), torch.bfloat16, "cuda", scale=3.0), dtype=torch.float32, note=depth)
# Softmax: the float forward of aligned rows leaves warp for vec from 512 on deep devices (dispatch.h
# kDeepVecForwardMinFloatDim: one warp a row, the whole register cache), rows around that bound and to 1024.
for op in SOFTMAX_OPS:
    for d in (504, 512, 516, 768, 1000, 1024):
        check_op(op, make_tensor((37, d), torch.float32, "cuda", scale=3.0), note=depth)
# Softmax: the strided cached forward of 128-bit accesses on deep devices (dispatch.h strided_deep_forward): float's
# whole lines in CTAs of up to 256 threads over clusters, 16-bit rows' half lines where a whole one needs a cluster;
# D around the single-CTA bound (256-300) and the clusters' (520, 1000, 1024, 4096), inner a line or two (64) and with a
# partial last tile (136), forward and backward, and the bf16 -> float cast.
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    for op in SOFTMAX_OPS:
        for d, inner in ((256, 136), (300, 64), (520, 136), (1000, 64), (1024, 136), (4096, 64)):
            check_op(op, make_tensor((2, d, inner), dtype, "cuda", scale=3.0), dim=1, note=depth)
for op in SOFTMAX_OPS:
    check_op(op, make_tensor((2, 1024, 136), torch.bfloat16, "cuda", scale=3.0), dim=1, dtype=torch.float32,
             note=depth)
# Softmax: long rows (dispatch.h kDeepClusterWideThreads, cluster_backward_yields_to_grid). Deep: 16-bit forwards
# past 131072 with a register part as loaded over clusters of the fewest threads, at least 128 (139264: 8 x 160,
# 262144: 16 x 128), float forwards of the shared-memory kernel over 16 CTAs (16 x 160, 16 x 256), the float
# backward of 16 x 1024 the grid mode;
# standard: 8 x 512 shared memory, and the 16-bit rows of an input of at least the L2 size prefetched ahead.
l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
for dtype in (torch.float32, torch.bfloat16):
    for op in SOFTMAX_OPS:
        for d in (139264, 262144):
            check_op(op, make_tensor((3, d), dtype, "cuda", scale=3.0), note=depth)
x_l2 = make_tensor((-(-l2 // (262144 * 2)), 262144), torch.bfloat16, "cuda", scale=3.0)
for op in SOFTMAX_OPS:
    check_op(op, x_l2, backward=False, note=depth)
print(fastact.explain("softmax", torch.randn(2, 139264, device="cuda", dtype=torch.bfloat16)))
print(fastact.explain("softmax", x_l2))
del x_l2
# Inputs of at least four times the L2 size (dispatch.h kDeepRawPrefetchL2Multiple): deep, the 16-bit forward with the
# register part prefetches the rows ahead as well (both 16-bit types checked; one row fewer: unprefetched).
rows_4l2 = -(-4 * l2 // (262144 * 2))
for dtype in (torch.float16, torch.bfloat16):
    x_4l2 = make_tensor((rows_4l2, 262144), dtype, "cuda", scale=3.0)
    for op in SOFTMAX_OPS:
        check_op(op, x_4l2, backward=False, note=depth)
print(fastact.explain("softmax", x_4l2))
print(fastact.explain("log_softmax", x_4l2[:rows_4l2 - 1]))
del x_4l2
print(fastact.explain("softmax", torch.randn(2, 262144, device="cuda")))
print(fastact.explain("softmax_backward", torch.randn(2, 262144, device="cuda")))
for dtype in (torch.float32, torch.bfloat16):
    print(fastact.explain("softmax", torch.randn(4, 1024, 2048, device="cuda", dtype=dtype), 1))
print(fastact.explain("softmax", torch.randn(8, 96, device="cuda"), -1))
print(fastact.explain("log_softmax", torch.randn(8, 96, device="cuda", dtype=torch.bfloat16), -1))
print(fastact.explain("log_softmax", torch.randn(8, 1024, device="cuda"), -1))
# Softmax: the 16-bit warp forward of rows padded to 1024 in blocks of two warps on deep devices (dispatch.h
# softmax_warp_small_blocks), 37 rows (the last block of rows partial).
for dtype in (torch.bfloat16, torch.float16):
    for op in SOFTMAX_OPS:
        for d in (520, 1000, 1024):
            check_op(op, make_tensor((37, d), dtype, "cuda", scale=3.0), note=depth)
print(fastact.explain("softmax", torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16), -1))
for name, d in (("softmax", 10240), ("softmax", 10248), ("log_softmax", 16384)):
    print(fastact.explain(name, torch.randn(8, d, device="cuda", dtype=torch.bfloat16), -1))
for op in SOFTMAX_OPS:
    for d in (1024, 4096):
        y = getattr(fastact, op.name)(torch.randn(8, d, device="cuda", dtype=torch.bfloat16), -1)
        print(fastact.explain(op.name + "_backward", y))
for name in ("log_softmax_backward", "softmax_backward"):
    print(fastact.explain(name, torch.randn(8, 8192, device="cuda", dtype=torch.bfloat16), -1))
print(fastact.explain("log_softmax", torch.randn(8, 8192, device="cuda"), -1))
print(fastact.explain("softmax_backward", torch.randn(8, 3072, device="cuda"), -1))
for dtype in (torch.float32, torch.bfloat16):
    print(fastact.explain("sigmoid", torch.randn(4096, device="cuda", dtype=dtype)))
    print(fastact.explain("gelu_backward", torch.randn(4096, device="cuda", dtype=dtype)))
"""


@pytest.mark.parametrize("depth", ["standard", "deep"])
def test_elementwise_memory_depth(depth):
    """FASTACT_MEMORY_DEPTH forces either memory-depth class (include/fastact/memory_depth.cuh: kStandard, the H100's;
    kDeep, the H200's) on whatever GPU runs the test. Elementwise vector shapes (deep: more accesses a thread): every
    op, dtype and tile edge, flat and rows kernels, forward and backward; the 16-bit softmax vec backward (deep: one
    unit a thread), the vec plans that keep the whole register cache (deep: the float forward, log_softmax's
    backward), softmax's 16-bit two passes (deep: two units past 512 threads), the 16-bit forward's vec rows (deep:
    to 320 threads, then long_row) on rows around their bounds, and the warp forward's packed rows (deep: 128-bit
    units not a power of two, four accesses a lane; 16-bit rows padded to 1024 in blocks of two warps), and the
    strided forward's cached shapes (deep: float whole lines over clusters of small CTAs, 16-bit half lines), long
    rows (deep: 16-bit forwards past 131072 with a register part, prefetched from four times the L2 size; float
    forwards over 16 x 256; the float backward at 16 x 1024 in the grid mode); against float64 torch, with poisoned
    outputs; explain() names the class and the shape."""
    env = dict(os.environ, FASTACT_MEMORY_DEPTH=depth)
    tests = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, "-c", _MEMORY_DEPTH_SCRIPT, tests, depth], env=env, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    bf16_fwd139264, bf16_fwd_l2, bf16_fwd_4l2, bf16_log_fwd_under_4l2, f32_fwd262144, f32_bwd262144 = lines[-27:-21]
    f32_dim1, bf16_dim1 = lines[-21:-19]
    f32_fwd96, bf16_log_fwd96, f32_log_fwd1024, bf16_fwd1024 = lines[-19:-15]
    fwd10240, fwd10248, log_fwd16384 = lines[-15:-12]
    sm1024, sm4096, log1024, log4096, log8192, sm8192, f32_fwd8192, f32_sm_bwd3072 = lines[-12:-4]
    # softmax at 4096: two passes in both classes; below 2048 and log_softmax's: one unit a thread where deep
    assert "two passes" in sm4096 and "one unit" not in sm4096, sm4096
    for s, threads in ((sm1024, 128), (log1024, 128), (log4096, 512)):
        assert ("one unit a thread" in s) == (depth == "deep"), s
        if depth == "deep":
            assert f"[1 CTA(s) x {threads} threads x 8 elements per row" in s, s
    # The whole register cache on deep devices (log_softmax's 16-bit backward past 4096, the float forward), half of
    # it on standard ones; softmax's float backward halved in both; softmax's 16-bit two passes at 8192: one unit at
    # 1024 threads (standard) or two at 512 (deep).
    deep = depth == "deep"
    for s, full, half in ((log8192, "256 threads x 32", "512 threads x 16"),
                          (f32_fwd8192, "256 threads x 32", "512 threads x 16")):
        assert f"[1 CTA(s) x {full if deep else half} elements per row" in s, s
        assert ("the whole register cache a thread (a deep-memory device)" in s) == deep, s
    assert "[1 CTA(s) x 384 threads x 8 elements per row" in f32_sm_bwd3072, f32_sm_bwd3072
    assert "whole register cache" not in f32_sm_bwd3072, f32_sm_bwd3072
    want = "512 threads x 16 elements per row" if deep else "1024 threads x 8 elements per row"
    assert want in sm8192 and "two passes" in sm8192, sm8192
    # The warp forward of rows of 96: one 128-bit access a lane on standard devices (24 of 32 lanes a row for float,
    # 12 of 16 for bf16), packed on deep ones (four accesses a lane: 8 lanes a row, or 4).
    for s, standard, packed in ((f32_fwd96, "32 lanes per row, 4 elements", "8 lanes per row, 16 elements"),
                                (bf16_log_fwd96, "16 lanes per row, 8 elements", "4 lanes per row, 32 elements")):
        assert _variant(s) == "warp" and f"[{packed if deep else standard} per lane, 128-bit accesses" in s, s
        assert ("rows packed several a warp (a deep-memory device)" in s) == deep, s
    # The float forward of rows of 1024: warp on standard devices, vec's one warp a row on deep ones.
    want = "[1 CTA(s) x 32 threads x 32 elements per row" if deep else "[32 lanes per row, 32 elements per lane"
    assert _variant(f32_log_fwd1024) == ("vec" if deep else "warp") and want in f32_log_fwd1024, f32_log_fwd1024
    # The 16-bit forward of rows of 1024: warp in both classes, in blocks of two warps on deep devices.
    assert _variant(bf16_fwd1024) == "warp" and "[32 lanes per row, 32 elements per lane" in bf16_fwd1024, bf16_fwd1024
    assert ("blocks of two warps (a deep-memory device)" in bf16_fwd1024) == deep, bf16_fwd1024
    # The strided forward of [4, 1024, 2048] dim 1: float half lines in one CTA of 512 threads (standard) or whole
    # lines over clusters of 256-thread CTAs (deep); bf16 whole lines over a cluster of 4 (standard) or half lines
    # over a cluster of 2 (deep).
    for s, standard, deep_shape in ((f32_dim1, "4 column(s) x 512 threads per CTA, cluster 1",
                                     "8 column(s) x 256 threads per CTA, cluster 4"),
                                    (bf16_dim1, "8 column(s) x 256 threads per CTA, cluster 4",
                                     "4 column(s) x 256 threads per CTA, cluster 2")):
        assert _variant(s) == "strided" and f"[{deep_shape if deep else standard}, cached" in s, s
    # Rows of 262144: the 16-bit forward over 16 x 128 with a register part as loaded, the rows ahead prefetched from
    # four times the L2 size (deep), or over 8 x 512 in shared memory, prefetched from the L2 size (standard); float's
    # over 16 x 256 (deep) or 8 x 512; the float backward in the grid mode (deep) or over 16 x 1024. (Not with
    # FASTACT_MAX_CLUSTER below 16; the standard shapes are those of a device whose 16-CTA clusters leave SMs idle, as
    # the H100's and the H200's do.)
    wide = not _clusters_capped(16)
    # Rows of 139264: the 16-bit forward with the register part over 8 x 160 (deep: not 16 CTAs of 96 threads, which
    # lost) or 8 x 288 in shared memory alone (standard).
    if deep and wide:
        assert "[8 CTA(s) x 160 threads x 128 elements per row (the rest kept as loaded, 64 in shared" in bf16_fwd139264, (
            bf16_fwd139264)
        assert "[16 CTA(s) x 128 threads x 128 elements per row (the rest kept as loaded, 64 in shared" in bf16_fwd_l2, (
            bf16_fwd_l2)
        assert "prefetched" not in bf16_fwd_l2, bf16_fwd_l2
        # From four times the L2 size, prefetched as well (dispatch.h kDeepRawPrefetchL2Multiple).
        assert "[16 CTA(s) x 128 threads x 128 elements per row (the rest kept as loaded, 64 in shared" in bf16_fwd_4l2, (
            bf16_fwd_4l2)
        assert "the rows ahead prefetched into L2" in bf16_fwd_4l2, bf16_fwd_4l2
        assert "the rest kept as loaded" in bf16_log_fwd_under_4l2, bf16_log_fwd_under_4l2
        assert "prefetched" not in bf16_log_fwd_under_4l2, bf16_log_fwd_under_4l2
        assert "[16 CTA(s) x 256 threads x 64 elements per row (32 in shared memory)" in f32_fwd262144, f32_fwd262144
        assert "partials through global memory" in f32_bwd262144, f32_bwd262144
    elif wide:
        assert "[8 CTA(s) x 288 threads x 64 elements per row (64 in shared memory)" in bf16_fwd139264, bf16_fwd139264
        assert "[8 CTA(s) x 512 threads x 64 elements per row (64 in shared memory)" in bf16_fwd_l2, bf16_fwd_l2
        assert "the rows ahead prefetched into L2" in bf16_fwd_l2, bf16_fwd_l2
        for s in (bf16_fwd_4l2, bf16_log_fwd_under_4l2):
            assert "[8 CTA(s) x 512 threads x 64 elements per row (64 in shared memory)" in s, s
            assert "the rows ahead prefetched into L2" in s, s
        assert "[8 CTA(s) x 512 threads x 64 elements per row (32 in shared memory)" in f32_fwd262144, f32_fwd262144
        assert "[16 CTA(s) x 1024 threads x 16 elements per row" in f32_bwd262144, f32_bwd262144
    # The 16-bit forward: vec to 320 threads (10240) in both classes; past it long_row on deep devices, vec (up to 512
    # threads) on standard ones.
    assert _variant(fwd10240) == "vec" and "[1 CTA(s) x 320 threads x 32 elements per row" in fwd10240, fwd10240
    for s in (fwd10248, log_fwd16384):
        assert _variant(s) == ("long_row" if deep else "vec"), s
        assert ("past 320 threads of one block on a deep-memory device" in s) == deep, s
    f32_fwd, f32_bwd, bf16_fwd, bf16_bwd = lines[-4:]
    for s in (f32_fwd, f32_bwd, bf16_fwd, bf16_bwd):
        assert f"memory depth {depth} (FASTACT_MEMORY_DEPTH)" in s, s
    # elementwise_shape: float forwards one 16-byte access at 128 threads in both classes; the two-operand
    # backwards (the 16-bit erf one too) 8-byte accesses at 512 threads on standard devices, 16-byte ones at 128 on
    # deep ones (16-bit erf: two); the 16-bit sigmoid forward one 16-byte access at 512 threads (standard) or two
    # at 128 (deep).
    assert "4 x float32 per 128-bit access, 1 access per thread and operand, 128 threads" in f32_fwd, f32_fwd
    want = "4 x float32 per 128-bit access, 1 access per thread and operand, 128 threads" if deep else (
        "2 x float32 per 64-bit access, 1 access per thread and operand, 512 threads")
    assert want in f32_bwd, f32_bwd
    want = "8 x bfloat16 per 128-bit access, 2 accesses per thread and operand, 128 threads" if deep else (
        "8 x bfloat16 per 128-bit access, 1 access per thread and operand, 512 threads")
    assert want in bf16_fwd, bf16_fwd
    want = "8 x bfloat16 per 128-bit access, 2 accesses per thread and operand, 128 threads" if deep else (
        "4 x bfloat16 per 64-bit access, 1 access per thread and operand, 512 threads")
    assert want in bf16_bwd, bf16_bwd
    for s in (bf16_fwd, bf16_bwd):
        assert "16-bit math form" in s, s
    for s in (f32_fwd, f32_bwd):
        assert "16-bit math form" not in s, s


_MEMORY_DEPTH_KERNELS_SCRIPT = """
import torch, fastact
from torch.profiler import ProfilerActivity, profile
torch.manual_seed(0)
xb = torch.randn(65536, device="cuda", dtype=torch.bfloat16)
xf, xd = xb.float(), xb.double()
rows = torch.randn(64, 2048, device="cuda", dtype=torch.bfloat16)[:, 1024:]
yb = torch.log_softmax(torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16), -1)
yf = yb.float()
cases = {
    "sigmoid bf16": lambda: fastact.sigmoid(xb),
    "sigmoid bf16 rows": lambda: fastact.sigmoid(rows),
    "gelu_backward f32": lambda: torch.ops.fastact.gelu_backward(xf, xf, "none"),
    "log_softmax_backward bf16": lambda: torch.ops.fastact.log_softmax_backward(yb, yb, -1, torch.bfloat16),
    "sigmoid f32": lambda: fastact.sigmoid(xf),
    "gelu_backward f64": lambda: torch.ops.fastact.gelu_backward(xd, xd, "none"),
    "log_softmax_backward f32": lambda: torch.ops.fastact.log_softmax_backward(yf, yf, -1, torch.float32),
    "softmax f32 rows of 96": lambda: fastact.softmax(xf[:96 * 64].view(64, 96), -1),
    "softmax f32 rows of 128": lambda: fastact.softmax(xf[:128 * 64].view(64, 128), -1),
    "softmax bf16 rows of 1024": lambda: fastact.softmax(xb[:1024 * 64].view(64, 1024), -1),
}
for name, call in cases.items():
    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    kernels = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
    print(name + "\t" + "|".join(kernels))
"""


def test_memory_depth_kernels():
    """The kernels that run (torch.profiler's names) under each forced class: another instantiation where the class
    changes the shape (16-bit elementwise, flat and rows; float backwards; the 16-bit softmax vec backward's one unit;
    the warp forward's packed rows of 96 and its 16-bit rows of 1024 in blocks of two warps), the same one where it does not (float forwards, double, float softmax
    backward, rows of 128), so the launchers' wiring is checked, not only explain()'s report of the plan."""
    runs = {}
    for depth in ("standard", "deep"):
        env = dict(os.environ, FASTACT_MEMORY_DEPTH=depth)
        out = subprocess.run([sys.executable, "-c", _MEMORY_DEPTH_KERNELS_SCRIPT], env=env, capture_output=True,
                             text=True)
        assert out.returncode == 0, out.stderr[-3000:]
        runs[depth] = dict(line.split("\t", 1) for line in out.stdout.splitlines() if "\t" in line)
    if not any(runs["standard"].values()):
        pytest.skip("the profiler recorded no CUDA kernels here")
    for name, standard in runs["standard"].items():
        deep = runs["deep"][name]
        assert standard and deep, (name, standard, deep)
        differs = name in ("sigmoid bf16", "sigmoid bf16 rows", "gelu_backward f32", "log_softmax_backward bf16",
                           "softmax f32 rows of 96", "softmax bf16 rows of 1024")
        assert (standard != deep) == differs, (name, standard, deep)


def test_elementwise_memory_depth_auto():
    """Unforced, the class follows the device's DRAM bytes per SM cycle (memory_depth.cuh), which explain() shows:
    deep from 16 (the H200's 18.8), standard below (the H100's 12.8)."""
    s = fastact.explain("sigmoid", torch.randn(4096, device="cuda"))
    if "FASTACT_MEMORY_DEPTH" in s:
        pytest.skip("FASTACT_MEMORY_DEPTH is set")
    m = re.search(r"memory depth (standard|deep) \(([0-9.]+) DRAM bytes an SM cycle; deep from 16\.0\)", s)
    assert m, s
    assert (m.group(1) == "deep") == (float(m.group(2)) >= 16.0), s
    assert float(m.group(2)) > 1.0, s


def _ordered_bits(t):
    """A 16-bit tensor's bit patterns as integers in the order of the values (+0 and -0 both 0), so that the
    difference of two is their distance in units in the last place."""
    i = t.view(torch.int16).to(torch.int32)
    return torch.where(i < 0, -(i & 0x7FFF), i)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
def test_elementwise_16bit_math_every_input(dtype):
    """The 16-bit forms of the erf GELU and the sigmoid (math.h GeluErf16, Sigmoid16, which the launchers take for
    16-bit tensors) on every one of the 65536 inputs, against the float64 formulas rounded once: the forwards within
    one unit in the last place (faithful), the erf GELU's derivative (dy = 1) within two; NaN and infinities where
    the float64 formulas have them. The float64 GELU is x Phi(x), Phi = erfc(-x / sqrt 2) / 2, accurate in the
    negative tail where 0.5 x (1 + erf(x / sqrt 2)) cancels to 0, and subnormal results count like the others."""
    x = torch.arange(-32768, 32768, dtype=torch.int32, device="cuda").to(torch.int16).view(dtype)
    x64 = x.double()
    ndtr = 0.5 * torch.special.erfc(-x64 / math.sqrt(2))  # torch.special.ndtr cancels to 0 below x ~ -8 on CUDA
    density = torch.exp(-0.5 * x64 * x64) / math.sqrt(2 * math.pi)
    dy = torch.ones_like(x)  # before the poisoning, so that the output, not dy, takes the poisoned block
    cases = {
        "gelu": (lambda: fastact.gelu(x), x64 * ndtr, 1),
        "sigmoid": (lambda: fastact.sigmoid(x), torch.sigmoid(x64), 1),
        "gelu_backward": (lambda: ops.gelu_backward(dy, x, "none"), ndtr + x64 * density, 2),
    }
    for name, (call, ref64, max_ulp) in cases.items():
        poison_allocator("cuda", x.numel() * x.element_size())
        got = call()
        want = ref64.to(dtype)
        nan = want.isnan()
        assert torch.equal(got.isnan(), nan), f"{name}: NaN at {got.isnan().sum()} inputs, want {nan.sum()}"
        if name != "gelu_backward":  # the forwards' zeros carry the reference's sign (-0 in gelu's tail)
            assert torch.equal(got.signbit()[~nan], want.signbit()[~nan]), f"{name}: signs differ"
        ulp = (_ordered_bits(got) - _ordered_bits(want)).abs()[~nan]
        worst = int(ulp.argmax())
        assert int(ulp.max()) <= max_ulp, (
            f"{name} {dtype}: {int((ulp > max_ulp).sum())} input(s) over {max_ulp} ulp; worst at x = "
            f"{x[~nan][worst].item()!r}: {got[~nan][worst].item()!r}, want {want[~nan][worst].item()!r} "
            f"({int(ulp.max())} ulp)")


def test_bias_gelu_forward_allocates_only_its_output():
    x = make_tensor((4096, 4096), torch.float16, "cuda")
    b = bias_for(x)
    y, extra = _extra_peak(lambda: fastact.bias_gelu(x, b))
    assert extra <= _bytes(y), f"{extra} bytes allocated for a {_bytes(y)}-byte output"


def test_backward_ops_allocate_only_their_gradients():
    x = make_tensor((4096, 4096), torch.float32, "cuda")
    y = torch.softmax(x, -1)
    g = make_tensor((4096, 4096), torch.float32, "cuda")
    # Over dim 0 a device without clusters takes the strided split mode, whose workspace holds one float a
    # (tile, chunk, column): 4096 columns x chunks x 4 bytes (dispatch.h plan_strided), a small fraction of dx.
    split = re.search(r"(\d+) chunks of D", fastact.explain("softmax_backward", y, 0))
    strided_ws = -(-4096 * int(split.group(1)) * 4 // 512) * 512 if split else 0
    for name, fn, ws in [
        ("softmax_backward", lambda: ops.softmax_backward(g, y, -1, torch.float32), 0),
        ("log_softmax_backward", lambda: ops.log_softmax_backward(g, y, -1, torch.float32), 0),
        ("softmax_backward-strided", lambda: ops.softmax_backward(g, y, 0, torch.float32), strided_ws),
        ("gelu_backward", lambda: ops.gelu_backward(g, x, "tanh"), 0),
        ("sigmoid_backward", lambda: ops.sigmoid_backward(g, y), 0),
    ]:
        dx, extra = _extra_peak(fn)
        assert extra <= _bytes(dx) + ws, f"{name}: {extra} bytes allocated for a {_bytes(dx)}-byte gradient"
    # fused fp16-input gradient of an fp32 output: written in fp16 directly
    dx, extra = _extra_peak(lambda: ops.softmax_backward(g, y, -1, torch.float16))
    assert dx.dtype == torch.float16 and extra <= _bytes(dx), extra


def test_bias_gelu_backward_workspace_is_small():
    """dx and dbias, plus at most a small workspace: per-tile partial sums of the bias gradient (one
    row of H floats per 32 rows: 256 x 4096 x 4 B = 4 MiB here; include/fastact/elementwise.cuh,
    BiasGeluPlan). 16 MiB is far below what a materialised x + bias or a float32 dx (128 MiB here)
    would take, so the bound still proves the backward is fused."""
    x = make_tensor((8192, 4096), torch.float16, "cuda")
    b = bias_for(x)
    g = make_tensor((8192, 4096), torch.float16, "cuda")
    (dx, db), extra = _extra_peak(lambda: ops.bias_gelu_backward(g, x, b, "tanh"))
    workspace = extra - _bytes(dx, db)
    assert workspace <= 16 * 2**20, f"bias_gelu_backward used a {workspace / 2**20:.1f} MiB workspace"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize(
    "shape",
    [
        # Past kMaxRowGroups (2048) tiles of rows, so that a block takes several batches one after
        # another (BiasGeluPlan::steps = 2), the last group's last batch short. 256 columns: the
        # 128-bit path (32 rows a batch in every dtype); 33: the element path (120 rows a batch).
        (2048 * 32 + 40, 256),
        (2048 * 120 + 40, 33),
    ],
    ids=str,
)
def test_bias_gelu_backward_tall(dtype, shape):
    x = make_tensor(shape, dtype, "cuda", scale=2.0)
    b = bias_for(x)
    g = make_tensor(shape, dtype, "cuda")
    explain = fastact.explain("bias_gelu_backward", x)
    assert "2 batches a block" in explain, explain
    poison_allocator("cuda", x.numel() * dtype.itemsize, b.numel() * dtype.itemsize)
    dx, db = ops.bias_gelu_backward.default(g, x, b, "tanh")
    z64 = x.double() + b.double()
    dx_ref = torch.ops.aten.gelu_backward(g.double(), z64, approximate="tanh")
    dx_pt = torch.ops.aten.gelu_backward(g, x + b, approximate="tanh")
    msg = f"bias_gelu_backward x: {describe(x)}"
    assert_close(dx, dx_ref, torch_actual=dx_pt, msg=msg + ": dx")
    assert_close(db, dx_ref.sum(0), torch_actual=dx_pt.sum(0), msg=msg + ": dbias")


# ----------------------------------------------------------------------------------------------
# Tensors beyond 2^31 elements

HUGE = (1 << 31) + 8  # float16 elements: 4 GiB, past every int32 offset


def _need_huge_gpu():
    torch.cuda.empty_cache()  # what earlier huge tests left in the caching allocator counts as used
    free, _ = torch.cuda.mem_get_info()
    if free < 40 * 2**30:
        pytest.skip(f"needs a GPU with >= 40 GiB free, {free / 2**30:.0f} GiB free")


def _lse_rows(x):
    """float32 logsumexp of each row of a 2-d half tensor, chunked (no full-size float copy)."""
    out = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    step = max(1, (1 << 28) // x.shape[1])
    for i in range(0, x.shape[0], step):
        out[i : i + step] = torch.logsumexp(x[i : i + step].float(), dim=1)
    return out


def _lse_long_row(row):
    chunk = 1 << 28
    parts = torch.stack([torch.logsumexp(row[i : i + chunk].float(), 0) for i in range(0, row.numel(), chunk)])
    return torch.logsumexp(parts, 0)


@pytest.mark.huge
@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
def test_strided_stream_over_cluster(backward):
    """dispatch.h strided_stream_cluster with 128-bit accesses: [8, 40000, 1024] dim 1 (f32, 1.3 GB) has
    256 tiles of a D too long to cache; on the H100 each streams over a cluster of 4 (the device is then
    full, so no split). The result against float64, outputs poisoned first."""
    if torch.cuda.get_device_capability()[0] < 9 or _clusters_capped():
        pytest.skip("clusters need sm_90 (and FASTACT_MAX_CLUSTER unset or >= 8)")
    shape = (8, 40000, 1024)
    x = make_tensor(shape, torch.float32, "cuda")
    y = torch.softmax(x, 1)
    s = fastact.explain("softmax_backward" if backward else "softmax", y if backward else x, 1)
    m = re.search(r"\[8 column\(s\) x 512 threads per CTA, cluster (\d+), streamed twice, 128-bit", s)
    assert m and int(m.group(1)) > 1 and "chunks of D" not in s, s
    poison_allocator("cuda", x.numel() * 4)
    if not backward:
        got = fastact.softmax(x, 1)
        want = torch.softmax(x.double(), 1)
        del x
        assert_close(got, want, torch_actual=y, msg=s)
    else:
        g = make_tensor(shape, torch.float32, "cuda")
        del x
        assert_close(ops.softmax_backward(g, y, 1, torch.float32), softmax_backward_ref(g, y, 1, False),
                     torch_actual=softmax_backward_torch(g, y, 1, torch.float32, False), msg=s)


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64, torch.float16, torch.bfloat16))
@pytest.mark.parametrize("d,inner", ((2, 2056), (3, 2056), (8, 2056), (2, 2055), (3, 2055)))
@pytest.mark.parametrize("backward", (False, True), ids=("fwd", "bwd"))
def test_strided_one_group_tiles(dtype, d, inner, backward):
    """dispatch.h softmax_strided_smem_bytes, common.cuh column_allreduce: at D <= a thread's cached D-rows every
    column has one D-group (columns == threads, no cluster), which folds nothing across threads and takes no
    shared-memory scratch, so 16-bit 128-bit forwards widen to 128 columns x 128 threads at D <= 8 (before: 64 x
    64, the scratch of 128 columns being over 48 KB); 128-bit (inner 2056) and element (inner 2055) tiles, the
    last of them partial (D = 1 runs as rows: a dim of size 1 has no stride to follow). Results against float64,
    outputs poisoned first."""
    shape = (3, d, inner)
    x = make_tensor(shape, dtype, "cuda")
    y = torch.softmax(x, 1)
    s = fastact.explain("softmax_backward" if backward else "softmax", y if backward else x, 1)
    m = re.search(r"\[(\d+) column\(s\) x (\d+) threads per CTA, cluster 1, cached", s)
    vector = inner % (16 // dtype.itemsize) == 0
    if d <= 3:
        assert m and m.group(1) == m.group(2), s
    if dtype.itemsize == 2 and vector and not backward:
        assert m and (int(m.group(1)), int(m.group(2))) == (128, 128), s
    poison_allocator("cuda", x.numel() * dtype.itemsize)
    if not backward:
        assert_close(fastact.softmax(x, 1), torch.softmax(x.double(), 1), torch_actual=y, msg=s)
        assert_close(fastact.log_softmax(x, 1), torch.log_softmax(x.double(), 1),
                     torch_actual=torch.log_softmax(x, 1), msg=s)
    else:
        g = make_tensor(shape, dtype, "cuda")
        assert_close(ops.softmax_backward(g, y, 1, dtype), softmax_backward_ref(g, y, 1, False),
                     torch_actual=softmax_backward_torch(g, y, 1, dtype, False), msg=s)


@pytest.mark.huge
@pytest.mark.parametrize("variant", ("auto",) + VARIANTS)
def test_huge_softmax_many_short_rows(variant):
    _need_huge_gpu()
    x = torch.randn(HUGE // 8, 8, dtype=torch.float16, device="cuda")
    y, refusal = _call(lambda: ops.softmax(x, -1, None, variant=variant))
    if refusal is not None:
        assert variant != "auto" and not must_accept(variant, "rows", 8, torch.float16), refusal
        return
    rows = torch.cat([torch.arange(0, 4096), torch.arange(x.shape[0] // 2, x.shape[0] // 2 + 4096), torch.arange(x.shape[0] - 4096, x.shape[0])]).cuda()
    assert_close(y[rows], torch.softmax(x[rows].double(), -1), msg=f"{variant} sampled rows")
    del y
    g = torch.randn_like(x)
    y = torch.softmax(x, -1)
    dx, refusal = _call(lambda: ops.softmax_backward(g, y, -1, torch.float16, variant=variant))
    if refusal is None:
        assert_close(dx[rows], softmax_backward_ref(g[rows], y[rows], -1, False), msg=f"{variant} backward sampled rows")


@pytest.mark.huge
@pytest.mark.parametrize("variant", ("auto", "long_row", "split", "scalar", "vec"))
@pytest.mark.parametrize(
    "shape",
    # rows of a multiple of 8 halves (16-byte aligned): 8 rows of 2^28 + 8, 2 rows beyond 2^31 bytes,
    # one row of 2^31 + 8 elements
    [(8, (1 << 28) + 8), (2, (1 << 30) + 8), (1, HUGE)],
    ids=["8-rows-of-2^28", "2-rows-of-2^31-bytes", "1-row-of-2^31"],
)
def test_huge_softmax_long_rows(variant, shape):
    _need_huge_gpu()
    x = torch.randn(shape, dtype=torch.float16, device="cuda")
    # softmax into float32 (fused): probabilities of ~2^-28 are below float16's range, so a float16
    # output would be (correctly) all but zero and compare trivially; log_softmax stays in float16.
    for op, out in (("softmax", torch.float32), ("log_softmax", None)):
        y, refusal = _call(lambda: getattr(ops, op)(x, -1, out, variant=variant))
        if refusal is not None:
            assert variant not in ("auto", "long_row", "split", "scalar"), refusal
            continue
        for r in sorted({0, shape[0] - 1}):
            lse = _lse_long_row(x[r])
            idx = torch.cat([torch.arange(0, 1 << 16), torch.randint(0, shape[1], (1 << 16,)), torch.arange(shape[1] - (1 << 16), shape[1])]).cuda()
            want = x[r, idx].float() - lse
            want = want if op == "log_softmax" else want.exp()
            assert_close(y[r, idx], want.double(), msg=f"{op} {variant} row {r}")
        del y


@pytest.mark.huge
@pytest.mark.parametrize("variant", ("auto", "strided"))
def test_huge_softmax_strided(variant):
    _need_huge_gpu()
    x = torch.randn(HUGE // 8, 8, dtype=torch.float16, device="cuda")
    # columns of 2^28 + 1: float32 output (fused), as in the long-row test
    y, refusal = _call(lambda: ops.softmax(x, 0, torch.float32, variant=variant))
    assert refusal is None, refusal
    for j in (0, 7):
        lse = _lse_long_row(x[:, j].contiguous())
        idx = torch.cat([torch.arange(0, 4096), torch.arange(x.shape[0] - 4096, x.shape[0])]).cuda()
        assert_close(y[idx, j], (x[idx, j].float() - lse).exp().double(), msg=f"{variant} column {j}")


@pytest.mark.huge
def test_huge_softmax_staged_backward():
    """The strided backward's staged mode past 2^31 elements (64-bit offsets): bf16 [32801, 64, 1023] dim 1
    (2^31 + 48,064 elements), checked on the first and last outer indices."""
    _need_huge_gpu()
    shape = (32801, 64, 1023)
    if not _staged_columns(shape, 2):
        pytest.skip("the staged mode is sm_90 only")
    y = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
    for i in range(0, shape[0], 4096):
        n = min(4096, shape[0] - i)
        y[i : i + n] = torch.softmax(torch.randn(n, *shape[1:], device="cuda"), 1).to(torch.bfloat16)
    g = torch.randn(shape, dtype=torch.bfloat16, device="cuda")
    s = fastact.explain("softmax_backward", y, 1)
    assert "staged in shared memory" in s, s
    dx = ops.softmax_backward(g, y, 1, torch.bfloat16)
    for o in (0, shape[0] - 1):
        assert_close(dx[o], softmax_backward_ref(g[o], y[o], 0, False),
                     torch_actual=softmax_backward_torch(g[o], y[o], 0, torch.bfloat16, False), msg=f"outer {o}: {s}")


@pytest.mark.huge
def test_huge_softmax_staged_forward():
    """The strided forward's staged mode past 2^31 elements (64-bit offsets): bf16 [32801, 64, 1023] dim 1
    (2^31 + 48,064 elements), checked on the first and last outer indices."""
    _need_huge_gpu()
    shape = (32801, 64, 1023)
    if not _staged_columns(shape, 2, forward=True):
        pytest.skip("the staged mode is sm_90 only")
    x = torch.randn(shape, dtype=torch.bfloat16, device="cuda")
    s = fastact.explain("softmax", x, 1)
    assert "staged in shared memory" in s, s
    y = fastact.softmax(x, 1)
    for o in (0, shape[0] - 1):
        assert_close(y[o], torch.softmax(x[o].double(), 0), torch_actual=torch.softmax(x[o], 0), msg=f"outer {o}: {s}")


@pytest.mark.huge
def test_huge_elementwise_row_views():
    """Row views past 2^31 accesses (float16, element accesses: no row starts aligned). x[:, 1:] of a
    [2^21 + 1, 1025] tensor is 2^31 + 1024 elements: the rows kernel in two launches, the second
    from row 2^21 - 1 (rows_per_launch = (2^31 - 1) // 1024). x[:, 1:] of [2, 2^31 + 9]: rows of
    2^31 + 8 elements, each its own flat launch. Sampled rows against float64."""
    _need_huge_gpu()
    base = torch.randn((1 << 21) + 1, 1025, dtype=torch.float16, device="cuda")
    x = base[:, 1:]
    assert "elementwise_rows_scalar" in fastact.explain("sigmoid", x)
    rows = torch.cat([torch.arange(0, 64), torch.arange((1 << 21) - 66, (1 << 21) + 1)]).cuda()
    y = fastact.sigmoid(x)
    want = torch.sigmoid(x[rows].double())
    assert_close(y[rows], want, torch_actual=torch.sigmoid(x[rows]), msg="sigmoid, two launches")
    del y
    g = torch.randn(x.shape, dtype=torch.float16, device="cuda")
    dx = ops.gelu_backward(g, x, "none")
    ref = torch.ops.aten.gelu_backward(g[rows].double(), x[rows].double())
    pt = torch.ops.aten.gelu_backward(g[rows], x[rows])
    assert_close(dx[rows], ref, torch_actual=pt, msg="gelu_backward, two launches")
    del base, x, g, dx
    base = torch.randn(2, (1 << 31) + 9, dtype=torch.float16, device="cuda")
    x = base[:, 1:]
    y = fastact.gelu(x, "tanh")
    for r in range(2):
        for c in (slice(0, 1 << 20), slice((1 << 31) - (1 << 20), (1 << 31) + 8)):
            want = torch.nn.functional.gelu(x[r, c].double(), approximate="tanh")
            pt = torch.nn.functional.gelu(x[r, c], approximate="tanh")
            assert_close(y[r, c], want, torch_actual=pt, msg=f"gelu, row {r} {c}")


@pytest.mark.huge
def test_huge_elementwise():
    _need_huge_gpu()
    x = torch.randn(HUGE, dtype=torch.float16, device="cuda")
    chunks = [slice(0, 1 << 20), slice((1 << 31) - (1 << 20), (1 << 31) + 8)]
    for op in [o for o in ALL_OPS if not o.takes_dim and not o.takes_bias]:
        y = op.fastact(x)
        for c in chunks:
            assert_close(y[c], op.torch(x[c].double()), torch_actual=op.torch(x[c]), msg=f"{op} {c}")
        del y
    # bias_gelu over 2^28 + 1 rows of 8, forward and the bias gradient (a reduction over 2^28 rows)
    x2 = x.view(-1, 8)
    b = torch.randn(8, dtype=torch.float16, device="cuda")
    y = fastact.bias_gelu(x2, b)
    assert_close(y[-4096:], torch.nn.functional.gelu(x2[-4096:].double() + b.double(), approximate="tanh"), torch.float16)
    del y
    g = torch.full_like(x2, 2.0**-14)  # small: the bias gradient (2^28 terms, < 2^15) stays in float16
    dx, db = ops.bias_gelu_backward(g, x2, b, "tanh")
    assert_close(dx[-4096:], torch.ops.aten.gelu_backward(g[-4096:].double(), x2[-4096:].double() + b.double(), approximate="tanh"), torch.float16)
    db_ref = torch.zeros(8, dtype=torch.float64, device="cuda")
    step = 1 << 24
    for i in range(0, x2.shape[0], step):
        db_ref += torch.ops.aten.gelu_backward(g[i : i + step].double(), x2[i : i + step].double() + b.double(), approximate="tanh").sum(0)
    # a sum of 2^28 terms: float accumulation is good to ~1e-4 relative, float16 output to 1e-3
    assert_close(db, db_ref, torch.bfloat16, msg="dbias over 2^28 rows")
    assert math.isfinite(db.float().sum().item())
