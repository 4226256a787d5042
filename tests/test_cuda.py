"""CUDA only: every softmax variant forced on every shape class it accepts (boundary sizes, every
dtype, forward and backward), the dispatcher's plans as explain() reports them (checked for what every plan must
satisfy, and run, never against the tuning: tests/host/dispatch_golden.txt.gz pins that), the caller's
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
# doubles), lengths around lines the dispatcher drew when these were chosen (the warp kernel's 512 for float64 and
# 1024, one block's register cache: 512 or 1024 threads x 8, 16 or 32 elements; docs/dispatch.md has the current
# ones), and a row far beyond what one SM holds. Every variant runs forced at every length, so where the lines lie
# now changes which plans auto picks, not what is tested.
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


def _plan(explanation):
    """explain()'s plan line (dispatch.h softmax_plan_fields) as a dict: every SoftmaxPlan field by name (numbers as
    ints), "flags" and "rows" (the preference rows that shaped the plan: docs/dispatch.md) as sets."""
    lines = [line for line in explanation.splitlines() if line.startswith("plan: ")]
    assert len(lines) == 1, explanation
    out = {}
    for kv in lines[0][len("plan: "):].split():
        k, v = kv.split("=", 1)
        out[k] = (set() if v == "-" else set(v.split(","))) if k in ("flags", "rows") else (
            v if k in ("variant", "mode") else int(v))
    return out


def _assert_plan_valid(plan, shape, dim, backward, msg=""):
    """What every plan of the dispatcher satisfies, whatever its tuning: the kernels' capacities and the modes'
    conditions (dispatch.h eligibility, softmax_shapes.h), on the current device."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    dim = dim % len(shape) if shape else 0
    d = shape[dim] if shape else 1
    note = f"{msg}: {plan}"
    flags, mode = plan["flags"], plan["mode"]
    assert mode == ("strided" if plan["variant"] == "strided" else mode), note
    assert 0 < plan["threads"] <= 1024 and plan["threads"] % 32 == 0, note
    assert plan["cluster"] in (1, 2, 4, 8, 16), note
    assert plan["cluster"] == 1 or torch.cuda.get_device_capability()[0] >= 9, note
    assert plan["vec"] == 1 or plan["vec"] in (2, 4, 8), note
    if mode == "warp":
        assert d <= 1024 and (1 << plan["warp_log2"]) >= d and plan["threads"] in (64, 128), note
        assert (1 << plan["warp_log2"]) // plan["elems_per_thread"] <= 32, note  # a row within a warp
    if mode == "resident":  # the row cached: a block, or a cluster of them
        assert plan["cluster"] * plan["threads"] * plan["elems_per_thread"] >= d, note
    if mode == "grid":  # every CTA of a row resident at once, partials through the workspace
        assert 2 <= plan["chunks"] <= props.multi_processor_count or plan["chunks"] == 1, note
        assert plan["chunks"] * plan["threads"] * plan["elems_per_thread"] >= d and plan["workspace_bytes"] > 0, note
    if mode == "strided":
        assert plan["columns"] > 0, note
        if "staged" in flags:
            assert plan["vec"] == 1 and plan["cluster"] == 1 and plan["groups"] >= 1, note
        if plan["chunks"] > 1:
            assert "streaming" in flags and plan["workspace_bytes"] > 0 and plan["cluster"] == 1, note
    else:
        assert not flags & {"staged", "streaming"}, note
    assert not backward or not flags & {"packed", "shifted", "raw", "prefetch"}, note  # forward-only kernels
    assert backward or not flags & {"two_pass", "one_unit"}, note  # backward-only kernels
    assert "edges" not in flags or (plan["vec"] > 1 and d % plan["vec"] != 0), note
    assert "shifted" not in flags or plan["vec"] > 1, note


def _explain_plan(op, x, dim=-1, backward=False, msg="", **kw):
    """(explain()'s text, its plan) for `op` on x, the plan checked by _assert_plan_valid."""
    s = fastact.explain(op + ("_backward" if backward else ""), x, dim, **kw)
    plan = _plan(s)
    _assert_plan_valid(plan, tuple(x.shape), dim, backward, msg or s.splitlines()[0])
    return s, plan


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
    row vec-fwd-deep-cast; 2048 to 16384), of a partial last warp (264, 1000, 1016, 4104, 12296), aligned rows
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
    print("PLAN", d, fastact.explain("softmax", x, dtype=torch.float32).replace("\\n", " | "))
print("\\n".join(failures), file=sys.stderr)
sys.exit(1 if failures else 0)
"""


@pytest.mark.gpu_memory(8)  # a subprocess of its own: a CUDA context and tensors outside this worker's allocator
@pytest.mark.parametrize("depth", ["standard", "deep"])
def test_fused_cast_long_rows(depth):
    """The long rows of 16-bit into float (the dtype= cast) under both memory-depth classes (FASTACT_MEMORY_DEPTH),
    auto and forced long_row and grid, rows of 65544 (a partial last warp), 131072, 139264 and 262144, aligned and
    with a padded stride, outputs poisoned, against float64. Their forwards store a warp's units by lane pairs
    (block.cuh WarpPairedStores) in block.cuh's register clusters kept as loaded (to 131072), long_row.cuh's
    shared-memory clusters and grid.cuh's slices; the clusters with a register part as loaded (the deep class's
    longest rows: test_long_row_rows_beyond_one_wave's rows of the cast) store plain. explain(dtype=torch.float32)'s
    plans of these rows, in both classes, are valid, and between them take both the register clusters kept as loaded
    and the shared-memory clusters where clusters run (so both store paths ran above)."""
    env = dict(os.environ, FASTACT_MEMORY_DEPTH=depth)
    tests = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, "-c", _FUSED_CAST_LONG_ROWS_SCRIPT, tests], env=env, capture_output=True,
                         text=True)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    plans = {d: p.replace(" | ", "\n") for d, p in
             (line.split(" ", 2)[1:] for line in out.stdout.splitlines() if line.startswith("PLAN"))}
    assert len(plans) == 7, out.stdout
    kinds = set()
    for d, p in plans.items():
        assert p.splitlines()[0].endswith("the BFloat16 input read as it is, the output written in Float"), p
        plan = _plan(p)
        _assert_plan_valid(plan, (5, int(d)), -1, False, p)
        if plan["mode"] == "resident" and plan["cluster"] > 1:
            kinds.add(("raw" in plan["flags"], plan["smem_elems"] > 0))
    if torch.cuda.get_device_capability()[0] >= 9 and not _clusters_capped():
        assert (True, False) in kinds and (False, True) in kinds, plans  # block.cuh's and long_row.cuh's clusters


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
    plan = _plan(explanation)
    if plan["mode"] == "resident":
        return plan["cluster"], plan["threads"]
    return (plan["chunks"], plan["threads"]) if plan["mode"] == "grid" else None


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
    """dispatch.h cluster_backward_yields_to_grid (row grid-over-cluster): a backward of 128-bit accesses whose
    16-CTA cluster would hold CTAs too large for two an SM (the size launch.cuh's block_backward_two_cta_threads
    probes from the kernel's registers) may take the grid mode instead. Every plan of these long rows is valid; the
    16-CTA cluster plans that remain say whether two of their CTAs fit an SM (the probe ran); the grid mode is reached
    from some length, and auto runs bitwise as long_row forced and right."""
    if torch.cuda.get_device_capability()[0] < 9 or _clusters_capped():
        pytest.skip("clusters need sm_90 (and FASTACT_MAX_CLUSTER unset or >= 8)")
    op = "log_softmax" if log else "softmax"
    grids = 0
    for d in (131072, 132096, 140000, 151936, 163840, 200000, 262144, 270336, 300000, 400000, 524288):
        y = (torch.log_softmax if log else torch.softmax)(make_tensor((2, d), dtype, "cuda"), -1)
        s, plan = _explain_plan(op, y, -1, backward=True)
        assert plan["variant"] == "long_row", s
        if plan["mode"] == "grid":
            grids += 1
        elif plan["mode"] == "resident" and plan["vec"] > 1 and "edges" not in plan["flags"] and plan["cluster"] > 8:
            assert "two CTAs an SM" in s or "one CTA an SM" in s, s  # the probe ran
        g = make_tensor((2, d), dtype, "cuda")
        bwd = getattr(ops, op + "_backward")
        poison_allocator("cuda", y.numel() * dtype.itemsize)
        auto = bwd(g, y, -1, dtype)
        assert torch.equal(auto, bwd(g, y, -1, dtype, variant="long_row")), s
        assert_close(auto, softmax_backward_ref(g, y, -1, log),
                     torch_actual=softmax_backward_torch(g, y, -1, dtype, log), msg=s)
    assert grids > 0, "no row length took the grid mode"


def test_grid_mode_needs_no_clusters_and_bounds_its_ctas():
    """dispatch.h plan_grid: at most one CTA an SM per row (so the device holds all of a row's CTAs);
    a row beyond that takes the split mode."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    x = make_tensor((1, 1 << 20), torch.float32, "cuda")
    s, plan = _explain_plan("softmax", x)
    assert plan["mode"] == "grid" and 2 <= plan["chunks"] <= sms, s
    # float forward: 512 threads x 64 elements a CTA at most
    too_long = make_tensor((1, sms * 1024 * 64 + 4), torch.float32, "cuda")
    s, plan = _explain_plan("softmax", too_long)
    assert plan["mode"] == "split", s
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


@pytest.mark.gpu_memory(8)  # a subprocess of its own: a CUDA context and tensors outside this worker's allocator
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
    return _plan(explanation)["variant"]


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


# (dtype, D, direction, layout) of long rows whose caches differ (test_long_row_cache_plan).
_LONG_ROW_CACHE_CASES = [
        (torch.float32, 262144, "fwd", "contiguous"),
        (torch.bfloat16, 262144, "fwd", "contiguous"),
        (torch.float16, 262144, "fwd", "contiguous"),
        (torch.float32, 65536, "fwd", "contiguous"),
        (torch.float64, 262144, "fwd", "contiguous"),
        (torch.float32, 262144, "fwd", "sliced_last"),  # element accesses
        (torch.float32, 50257, "fwd", "contiguous"),
        (torch.float32, 262144, "bwd", "contiguous"),
        (torch.bfloat16, 50257, "bwd", "contiguous"),
        (torch.bfloat16, 50257, "fwd", "sliced_last"),  # element accesses
        (torch.bfloat16, 30522, "fwd", "contiguous"),  # a vocabulary's row: head and tail too
        (torch.float16, 50257, "fwd", "contiguous"),
        (torch.bfloat16, 65536, "fwd", "contiguous"),
        (torch.bfloat16, 131072, "fwd", "contiguous"),
        (torch.bfloat16, 262143, "fwd", "contiguous"),  # rows off the alignment
        (torch.bfloat16, 1 << 20, "fwd", "contiguous"),
        (torch.float16, 600000, "fwd", "contiguous"),
        (torch.bfloat16, 1 << 20, "bwd", "contiguous"),
        (torch.float32, 1 << 20, "fwd", "contiguous"),
]


@pytest.mark.parametrize("dtype,d,direction,layout", _LONG_ROW_CACHE_CASES,
                         ids=lambda v: dtype_id(v) if isinstance(v, torch.dtype) else None)
def test_long_row_cache_plan(dtype, d, direction, layout):
    """Where a long_row plan keeps a slice, it is one the kernels can: part of it in shared memory only in forwards
    with 128-bit accesses and float arithmetic (long_row.cuh; grid.cuh's backwards of 16-byte units too), registers
    kept as loaded only in 16-bit forwards with 128-bit accesses (softmax_resident_raw), both only in the 16-bit
    shared-memory shape (softmax_cluster_smem_raw_regs); element accesses keep converted registers. The plan is
    valid, and auto runs bitwise as long_row forced, right against float64 (outputs poisoned)."""
    if torch.cuda.get_device_capability()[0] < 9 or _clusters_capped():
        pytest.skip("clusters need sm_90 (and FASTACT_MAX_CLUSTER unset or >= 8)")
    x = make_tensor((2, d), dtype, "cuda", layout)
    backward = direction == "bwd"
    s, plan = _explain_plan("softmax", torch.softmax(x, -1) if backward else x, -1, backward=backward)
    assert plan["variant"] == "long_row", s
    flags, smem = plan["flags"], plan["smem_elems"]
    if smem > 0 and plan["mode"] == "resident":
        assert not backward and plan["vec"] > 1 and dtype != torch.float64, s
    if "raw" in flags:
        assert not backward and plan["vec"] > 1 and dtype.itemsize == 2, s
    if plan["vec"] == 1:
        assert smem == 0 and "raw" not in flags, s
    if not backward:
        poison_allocator("cuda", x.numel() * dtype.itemsize)
        auto = fastact.softmax(x, -1)
        assert torch.equal(auto, ops.softmax(x, -1, None, variant="long_row")), s
        assert_close(auto, torch.softmax(x.double(), -1), torch_actual=torch.softmax(x, -1), msg=s)
    else:
        y, g = torch.softmax(x, -1), make_tensor((2, d), dtype, "cuda")
        poison_allocator("cuda", x.numel() * dtype.itemsize)
        auto = ops.softmax_backward(g, y, -1, dtype)
        assert torch.equal(auto, ops.softmax_backward(g, y, -1, dtype, variant="long_row")), s
        assert_close(auto, softmax_backward_ref(g, y, -1, False),
                     torch_actual=softmax_backward_torch(g, y, -1, dtype, False), msg=s)


def test_long_row_cache_kinds_reached():
    """Between them, test_long_row_cache_plan's rows take every cache the long_row kernels have where 16-CTA clusters
    run (sm_90): converted registers, registers kept as loaded, part in shared memory, shared memory with a register
    part kept as loaded, and the grid mode; so each is run there."""
    if torch.cuda.get_device_capability()[0] < 9 or _clusters_capped(16):
        pytest.skip("16-CTA clusters (sm_90, FASTACT_MAX_CLUSTER unset or 16)")
    kinds = set()
    for dtype, d, direction, layout in _LONG_ROW_CACHE_CASES:
        x = make_tensor((2, d), dtype, "cuda", layout)
        s, plan = _explain_plan("softmax", torch.softmax(x, -1) if direction == "bwd" else x, -1,
                                backward=direction == "bwd")
        kinds.add("grid" if plan["mode"] == "grid" else ("raw" in plan["flags"], plan["smem_elems"] > 0))
    assert kinds >= {(False, False), (True, False), (False, True), (True, True), "grid"}, kinds


def _clusters_capped(below=8):
    """FASTACT_MAX_CLUSTER below `below` (8: clusters off; 16: no 16-CTA clusters; softmax/launch.cuh
    probe_clusters)."""
    env = os.environ.get("FASTACT_MAX_CLUSTER")
    return env is not None and (int(env) if env.strip().lstrip("-").isdigit() else 0) < below


@pytest.mark.parametrize("dtype,d", [(torch.bfloat16, 256), (torch.bfloat16, 512), (torch.float16, 1024),
                                     (torch.float32, 512)])
def test_strided_forward_tile_plan(dtype, d):
    """The strided cached forward of 128-bit columns (raw 16-bit rows, float; dispatch.h rows strided-small-ctas,
    strided-deep-half-lines): whole or half lines, in one CTA or over a cluster. The plan is valid and right against
    float64, outputs poisoned."""
    x = make_tensor((2, d, 2048), dtype, "cuda")
    s, plan = _explain_plan("softmax", x, 1)
    assert plan["variant"] == "strided" and plan["vec"] > 1, s
    poison_allocator("cuda", x.numel() * dtype.itemsize)
    assert_close(fastact.softmax(x, 1), torch.softmax(x.double(), 1), torch_actual=torch.softmax(x, 1), msg=s)


# (dtype, shape, dim, backward) of strided problems around the strided planner's rules (docs/dispatch.md
# strided-*): element accesses narrowing lines, short float element forwards, 16-bit element forwards over small
# clusters, element backwards streamed (short and long D, over clusters), dim 0 of tall matrices (narrow tiles over
# the largest cluster, or the split mode), whole outer indices as tiles, streaming over a cluster.
_STRIDED_RULES = [
    (torch.bfloat16, (2, 257, 1023), 1, False), (torch.float32, (2, 257, 1023), 1, False),
    (torch.float32, (2, 513, 1023), 1, False), (torch.float32, (2, 64, 1023), 1, False),
    (torch.float32, (2, 100, 49), 1, False), (torch.float32, (5, 100, 3), 1, False),
    (torch.bfloat16, (2, 513, 1023), 1, False), (torch.float16, (2, 700, 1023), 1, False),
    (torch.bfloat16, (2, 2000, 1023), 1, False), (torch.bfloat16, (2, 513, 49), 1, False),
    (torch.float32, (2, 257, 1023), 1, True), (torch.bfloat16, (2, 257, 1023), 1, True),
    (torch.float32, (2, 513, 1023), 1, True), (torch.bfloat16, (2, 513, 1023), 1, True),
    (torch.float32, (2, 1000, 1023), 1, True), (torch.bfloat16, (2, 2000, 1023), 1, True),
    (torch.float64, (2, 513, 1023), 1, True), (torch.float32, (7, 1600, 13), 1, True),
    (torch.float32, (2, 64, 1023), 1, True), (torch.float32, (3, 100, 1023), 1, True),
    (torch.bfloat16, (2, 64, 1023), 1, True), (torch.float16, (3, 100, 255), 1, True),
    (torch.float32, (4, 160, 49), 1, True), (torch.float32, (2, 48, 1023), 1, True),
    (torch.bfloat16, (2, 16, 1023), 1, True), (torch.float64, (2, 100, 1023), 1, True),
    (torch.float32, (2, 2000, 1023), 1, True), (torch.float64, (2, 1500, 1023), 1, True),
    (torch.float32, (16384, 64), 0, False), (torch.float32, (16384, 64), 0, True),
    (torch.bfloat16, (16384, 64), 0, False), (torch.bfloat16, (16384, 64), 0, True),
    (torch.float32, (16385, 64), 0, False), (torch.float32, (65536, 64), 0, False),
    (torch.float32, (65536, 64), 0, True), (torch.bfloat16, (65536, 64), 0, False),
    (torch.bfloat16, (65536, 64), 0, True), (torch.float64, (65536, 64), 0, True),
    (torch.float32, (4, 65536, 8), 1, True), (torch.float32, (100000, 3), 0, False),
    (torch.bfloat16, (65536, 33), 0, False), (torch.float32, (65536, 33), 0, True),
    (torch.float64, (65536, 33), 0, False), (torch.float32, (65536, 100), 0, False),
    (torch.float32, (65536, 100), 0, True), (torch.bfloat16, (65536, 100), 0, True),
    (torch.float32, (66, 16384, 33), 1, False), (torch.float32, (66, 16384, 33), 1, True),
]


@pytest.mark.parametrize("dtype,shape,dim,backward", _STRIDED_RULES,
                         ids=lambda v: dtype_id(v) if isinstance(v, torch.dtype) else None)
def test_strided_plan_rules(dtype, shape, dim, backward):
    """Each strided plan of the cases above (cached, over a cluster, streamed, streamed over a cluster, split
    through the workspace, staged) is valid and gives the right result, outputs poisoned first."""
    x = make_tensor(shape, dtype, "cuda")
    y = torch.softmax(x, dim)
    s, plan = _explain_plan("softmax", y if backward else x, dim, backward=backward)
    assert plan["variant"] == "strided", s
    poison_allocator("cuda", x.numel() * dtype.itemsize)
    if not backward:
        assert_close(fastact.softmax(x, dim), torch.softmax(x.double(), dim), torch_actual=y, msg=s)
    else:
        g = make_tensor(shape, dtype, "cuda")
        assert_close(ops.softmax_backward(g, y, dim, dtype), softmax_backward_ref(g, y, dim, False),
                     torch_actual=softmax_backward_torch(g, y, dim, dtype, False), msg=s)


def test_strided_modes_reached():
    """Between them, _STRIDED_RULES' cases take every strided mode on sm_90 with clusters: cached in one CTA, cached
    over a cluster, streamed, streamed over a cluster, split through the workspace; so each runs there."""
    if torch.cuda.get_device_capability()[0] < 9 or _clusters_capped():
        pytest.skip("clusters need sm_90 (and FASTACT_MAX_CLUSTER unset or >= 8)")
    modes = set()
    for dtype, shape, dim, backward in _STRIDED_RULES:
        x = make_tensor(shape, dtype, "cuda")
        _, plan = _explain_plan("softmax", torch.softmax(x, dim) if backward else x, dim, backward=backward)
        streaming = "streaming" in plan["flags"]
        modes.add("split" if plan["chunks"] > 1 else (streaming, plan["cluster"] > 1))
    assert modes >= {(False, False), (False, True), (True, False), (True, True), "split"}, modes


# Strided forwards of inputs just past the device's L2 size (dispatch.h row strided-prefetch): (dtype, D, inner; 0:
# dim 0 of [D, m]): 128-bit columns in a CTA a tile (the last partial), raw 16-bit rows over a cluster, element
# accesses (16-bit ones staged), dim 0 of a tall matrix, D = 8 and 7, float64.
_PREFETCH_CASES = [
    (torch.float32, 1024, 2056), (torch.bfloat16, 1024, 2056), (torch.float16, 1024, 2056),
    (torch.float32, 100, 1023), (torch.bfloat16, 100, 1023), (torch.float32, 16384, 0),
    (torch.float32, 8, 65536), (torch.float32, 7, 65536), (torch.float64, 1024, 2056),
]


def _past_l2(d, inner, size, under=False):
    """(shape, dim) of an input just past (or, `under`, just under) the device's L2 size."""
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    if inner == 0:
        return ((d, (l2 // (d * size) - 1) // 8 * 8) if under else (d, -(-l2 // (d * size * 8)) * 8)), 0
    return (((l2 - 1) // (d * inner * size), d, inner) if under else (-(-l2 // (d * inner * size)), d, inner)), 1


@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
def test_strided_forward_prefetch(op):
    """The cached strided forwards that ask L2 for the tiles a quarter of the device's resident tiles ahead (explain
    says so) give the right result (outputs poisoned), their last tiles included, whose counterparts ahead lie past
    the end; only forwards prefetch, and only inputs of at least the L2 size; on sm_90 with clusters some case of
    _PREFETCH_CASES prefetches, so that the path runs here."""
    torch_fn = torch.log_softmax if op.name == "log_softmax" else torch.softmax
    prefetched = 0
    for dtype, d, inner in _PREFETCH_CASES:
        shape, dim = _past_l2(d, inner, dtype.itemsize)
        x = make_tensor(shape, dtype, "cuda")
        s, plan = _explain_plan(op.name, x, dim)
        if "prefetch" in plan["flags"]:
            prefetched += 1
            assert plan["mode"] == "strided" and "streaming" not in plan["flags"], s
            under, _ = _past_l2(d, inner, dtype.itemsize, under=True)
            assert "prefetch" not in _explain_plan(op.name, make_tensor(under, dtype, "cuda"), dim)[1]["flags"]
        poison_allocator("cuda", x.numel() * dtype.itemsize)
        y = getattr(fastact, op.name)(x, dim)
        assert_close(y, torch_fn(x.double(), dim), torch_actual=torch_fn(x, dim), msg=s)
        assert "prefetch" not in _explain_plan(op.name, y, dim, backward=True)[1]["flags"]
    if torch.cuda.get_device_capability()[0] >= 9 and not _clusters_capped():
        assert prefetched, "no case prefetched"


# Long rows of inputs just past a multiple of the device's L2 size (dispatch.h row long-row-prefetch): (dtype, D,
# multiple): 16-bit rows in shared memory, float rows, portable register-only clusters, 16-bit rows with a register
# part besides (which the deep class prefetches from a larger input).
_LONG_ROW_PREFETCH_CASES = [(torch.bfloat16, 262144, 1), (torch.float16, 151936, 1), (torch.float32, 262144, 1),
                            (torch.bfloat16, 131072, 1), (torch.bfloat16, 1 << 20, 1), (torch.bfloat16, 262144, 4)]


@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
def test_long_row_forward_prefetch(op):
    """The long_row forwards that ask L2 for the slices of the rows a quarter of the device's resident clusters ahead
    (long_row.cuh softmax_cluster_smem_fwd_kernel; explain says so) keep 16-bit slices in shared memory and give the
    right result (outputs poisoned), their last rows included, whose counterparts ahead lie past the end; inputs
    under the L2 size and backwards do not prefetch; on sm_90 with clusters some case prefetches (in either memory
    class)."""
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    torch_fn = torch.log_softmax if op.name == "log_softmax" else torch.softmax
    prefetched = 0
    for dtype, d, multiple in _LONG_ROW_PREFETCH_CASES:
        size = dtype.itemsize
        x = make_tensor((-(-multiple * l2 // (d * size)), d), dtype, "cuda")
        s, plan = _explain_plan(op.name, x)
        if "prefetch" in plan["flags"]:
            prefetched += 1
            assert plan["mode"] == "resident" and plan["smem_elems"] > 0 and size == 2, s
            under = make_tensor(((l2 - 1) // (d * size), d), dtype, "cuda")
            assert "prefetch" not in _explain_plan(op.name, under)[1]["flags"]
        poison_allocator("cuda", x.numel() * size)
        y = getattr(fastact, op.name)(x, -1)
        assert_close(y, torch_fn(x.double(), -1), torch_actual=torch_fn(x, -1), msg=s)
        assert "prefetch" not in _explain_plan(op.name, y, backward=True)[1]["flags"]
    if torch.cuda.get_device_capability()[0] >= 9 and not _clusters_capped(16):
        assert prefetched, "no case prefetched"


_PREFETCH_OFF_SCRIPT = """
import sys, torch, fastact
l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
torch.manual_seed(0)
x = torch.randn(-(-l2 // (1024 * 2056 * 4)), 1024, 2056, device="cuda")
print(fastact.explain("softmax", x, 1).splitlines()[-1])
r = torch.randn(-(-l2 // (262144 * 2)), 262144, device="cuda", dtype=torch.bfloat16)
print(fastact.explain("softmax", r).splitlines()[-1])
r4 = torch.randn(-(-4 * l2 // (262144 * 2)), 262144, device="cuda", dtype=torch.bfloat16)
print(fastact.explain("log_softmax", r4).splitlines()[-1])
torch.save((fastact.softmax(x, 1).cpu(), fastact.softmax(r).cpu(), fastact.log_softmax(r4).cpu()), sys.argv[1])
"""


@pytest.mark.gpu_memory(8)  # a subprocess of its own: a CUDA context and tensors outside this worker's allocator
def test_forward_prefetch_off(tmp_path):
    """FASTACT_PREFETCH=0 (read once, with the device's properties) turns the L2 prefetches off (the strided
    forward's, the 16-bit long_row forward's): no plan of the three prefetches, where with prefetches on one does;
    and the results are bitwise the prefetching run's (a prefetch changes no value)."""
    runs = {}
    for flag in ("0", "1"):
        path = tmp_path / f"prefetch{flag}.pt"
        env = dict(os.environ, FASTACT_PREFETCH=flag)
        out = subprocess.run([sys.executable, "-c", _PREFETCH_OFF_SCRIPT, str(path)], env=env, capture_output=True,
                             text=True)
        assert out.returncode == 0, out.stderr[-3000:]
        plans = [_plan(line) for line in out.stdout.splitlines()[:3]]
        prefetching = ["prefetch" in p["flags"] for p in plans]
        assert not any(prefetching) if flag == "0" else any(prefetching), out.stdout
        runs[flag] = torch.load(path)
    assert all(torch.equal(a, b) for a, b in zip(runs["0"], runs["1"]))


def _is_staged(op, t, backward=False):
    """Whether auto's plan of `op` over dim 1 of t is the staged mode (softmax/staged.cuh)."""
    return "staged" in _plan(fastact.explain(op + ("_backward" if backward else ""), t, 1))["flags"]


def _assert_staged_fits(plan, shape, size, backward, msg):
    """A staged plan's tile fits the shared memory its kernel asks for (softmax_shapes.h: both arrays' D-rows of
    `columns` elements and a 16-byte chunk of slack each, or x's, plus the groups' partials; 113 KB) in CTAs of 256
    threads (softmax/staged.cuh)."""
    if "staged" not in plan["flags"]:
        return
    d, cols, groups = shape[1], plan["columns"], plan["groups"]
    smem = (2 if backward else 1) * d * (cols + 16 // size) * size + (
        groups * cols * (4 if backward else 8) if groups > 1 else 0)
    assert smem <= 113 * 1024 and plan["threads"] == 256 and cols <= shape[2] + 16 // size, msg


# (grad_output dtype, grad_input dtype, [outer, D, inner] over dim 1, log_softmax, layouts of (grad_output,
# output), a note: the staged tile the H100 took when the case was written, (columns, groups); 0: not staged):
# around the staged rows' bounds (docs/dispatch.md strided-staged, strided-staged-vec).
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
def test_strided_staged_backward(dtype, in_dtype, shape, log, layouts, h100):  # noqa: ARG001 (h100: a note)
    """Backwards around the staged rows' bounds (element accesses at short D; 128-bit columns whose D-rows start
    off a 32-byte sector; the narrow 16-bit tiles with thread groups; the device fill; 2- and 4-byte elements): each
    plan, staged or not, is valid (a staged tile fits its shared memory) and gives the right result (outputs
    poisoned first), auto and strided forced, with grad_output and output off the 16-byte alignment, apart or
    together. test_strided_staged_reached: the staged shapes are reached."""
    op = "log_softmax" if log else "softmax"
    x = make_tensor(shape, dtype, "cuda")
    y = make_tensor(shape, dtype, "cuda", layouts[1])
    y.copy_(torch.log_softmax(x, 1) if log else torch.softmax(x, 1))
    g = make_tensor(shape, dtype, "cuda", layouts[0])
    s, plan = _explain_plan(op, y, 1, backward=True)  # explain sees the output (a fused 16-bit dx plans as float)
    _assert_staged_fits(plan, shape, dtype.itemsize, True, s)
    poison_allocator("cuda", y.numel() * in_dtype.itemsize)
    backward = ops.log_softmax_backward if log else ops.softmax_backward
    assert_close(backward(g, y, 1, in_dtype), softmax_backward_ref(g, y, 1, log),
                 in_dtype, torch_actual=softmax_backward_torch(g, y, 1, in_dtype, log), msg=s)
    assert_close(backward(g, y, 1, in_dtype, variant="strided"), softmax_backward_ref(g, y, 1, log),
                 in_dtype, torch_actual=softmax_backward_torch(g, y, 1, in_dtype, log), msg=s)


# (dtype, [outer, D, inner] over dim 1, log_softmax, layout of x, a note: the staged tile the H100 took when the
# case was written, (columns, groups); 0: not staged): around the staged forward's bounds.
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
def test_strided_staged_forward(dtype, shape, log, layout, h100):  # noqa: ARG001 (h100: a note)
    """Forwards around the staged forward's bounds (its D table's rows, the shared-memory bound at each width past
    it, an inner narrower than the width, the device fill, vectors against elements, float): each plan, staged or
    not, is valid (a staged tile fits its shared memory; 128-bit columns are not staged) and gives the right result
    (outputs poisoned first), auto and strided forced, x on or off the 16-byte alignment; so does the fused float
    output of a 16-bit x (another plan: a staged one would fail to launch)."""
    op = "log_softmax" if log else "softmax"
    x = make_tensor(shape, dtype, "cuda", layout)
    s, plan = _explain_plan(op, x, 1)
    _assert_staged_fits(plan, shape, dtype.itemsize, False, s)
    if layout != "offset" and shape[2] % (16 // dtype.itemsize) == 0:
        assert "staged" not in plan["flags"], s
    ref = getattr(torch, op)(x.double(), 1)
    poison_allocator("cuda", x.numel() * dtype.itemsize)
    assert_close(getattr(fastact, op)(x, 1), ref, torch_actual=getattr(torch, op)(x, 1), msg=s)
    assert_close(getattr(ops, op)(x, 1, None, variant="strided"), ref, torch_actual=getattr(torch, op)(x, 1), msg=s)
    if dtype != torch.float32:  # the fused float output: another plan (a staged one would fail to launch)
        assert_close(getattr(fastact, op)(x, 1, dtype=torch.float32), ref,
                     torch_actual=getattr(torch, op)(x, 1, dtype=torch.float32), msg=s)


def test_strided_staged_reached():
    """On sm_90 the staged mode is what auto runs for some of _STAGED_CASES (one thread group a column and several)
    and of _STAGED_FORWARD_CASES, so that those tests run its kernels."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the staged mode is planned on sm_90 (where it was measured)")
    groups = set()
    for dtype, _, shape, log, layouts, _ in _STAGED_CASES:
        y = make_tensor(shape, dtype, "cuda", layouts[1])
        _, plan = _explain_plan("log_softmax" if log else "softmax", y, 1, backward=True)
        if "staged" in plan["flags"]:
            groups.add(plan["groups"] > 1)
    assert groups == {False, True}, groups
    forward = [_explain_plan("softmax", make_tensor(shape, dtype, "cuda", layout), 1)[1]
               for dtype, shape, _, layout, _ in _STAGED_FORWARD_CASES]
    assert any("staged" in p["flags"] for p in forward)


_CLUSTER_CAP_SCRIPT = """
import torch, fastact
x = torch.randn(4, 262144, device="cuda")
for op, t in (("softmax", x), ("softmax_backward", torch.softmax(x, -1))):
    print(fastact.explain(op, t).splitlines()[-1])
y = fastact.softmax(x, -1)
torch.testing.assert_close(y, torch.softmax(x.double(), -1).float(), rtol=1e-5, atol=1e-7)
g = torch.randn_like(x)
dx = torch.ops.fastact.softmax_backward(g, y, -1, torch.float32)
ref = torch.ops.aten._softmax_backward_data(g.double(), y.double(), -1, torch.float64).float()
torch.testing.assert_close(dx, ref, rtol=1e-5, atol=1e-7)
"""


@pytest.mark.gpu_memory(8)  # a subprocess of its own: a CUDA context and tensors outside this worker's allocator
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
        plan = _plan(line)
        assert plan["variant"] == "long_row" and plan["cluster"] <= (1 if cap == "1" else 8), line
        if plan["cluster"] == 1:  # no cluster: the grid mode (or the split mode past it)
            assert plan["mode"] in ("grid", "split"), line


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
    y = make_tensor(shape, torch.bfloat16, "cuda")
    g = make_tensor(shape, torch.bfloat16, "cuda", "offset")
    if not _is_staged("softmax", y, backward=True):
        pytest.skip("auto does not stage this shape here (the staged mode is planned on sm_90)")
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
    ninf, inf, nan = float("-inf"), float("inf"), float("nan")
    x = make_tensor(shape, dtype, "cuda")
    if not _is_staged(op.name, x):
        pytest.skip("auto does not stage this shape here (the staged mode is planned on sm_90)")
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
    x = make_tensor(shape, torch.bfloat16, "cuda", "offset")
    if not _is_staged("softmax", x):
        pytest.skip("auto does not stage this shape here (the staged mode is planned on sm_90)")
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



# Softmax shapes whose plans keep per-device state or take a workspace where clusters run (forward; the backward of
# each shape runs through check_op): long rows (the grid mode: partials in a zeroed workspace), dim 0 of tall
# matrices (tiles cached over clusters, sizes beyond 8 needing a per-function attribute; the split mode), streamed
# over a cluster, whole outer indices as tiles.
_SECOND_GPU_SHAPES = [((4, 1 << 20), -1), ((16384, 64), 0), ((66, 16384, 33), 1), ((1048576, 64), 0),
                      ((65536, 33), 0)]


@pytest.mark.parametrize("shape,dim", _SECOND_GPU_SHAPES, ids=lambda v: str(v) if isinstance(v, tuple) else None)
@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
def test_second_gpu_plans(op, shape, dim):
    """Each shape above on cuda:1 while cuda:0 is current, and on cuda:0 while cuda:1 is: the plan is the one the
    tensor's device gets when it is current (its properties, not the current device's), and the workspace and
    cluster attributes are those of the tensor's device (right results, forward and backward)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    for current, where in ((0, "cuda:1"), (1, "cuda:0")):
        x = make_tensor(shape, torch.float32, where)
        with torch.cuda.device(x.device):
            own = _plan(fastact.explain(op.name, x, dim))
        with torch.cuda.device(current):
            s = fastact.explain(op.name, x, dim)
            assert _plan(s) == own, s
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
    """What the caching allocator charges for the workspace of the plan (explain's workspace_bytes: a grid plan's
    counters and partials, a strided split plan's partials; 0 for any other plan)."""
    del x
    n = _plan(explanation)["workspace_bytes"]
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
# Softmax: the 16-bit vec backward one unit a thread on deep devices (dispatch.h row vec-one-unit), rows
# of 896-4096 (two units past 4096; softmax's two passes from 2048; 1028: rows off the vector width, edges).
for dtype in (torch.float16, torch.bfloat16):
    for op in SOFTMAX_OPS:
        for d in (896, 1024, 1028, 2048, 4096, 4104):
            check_op(op, make_tensor((37, d), dtype, "cuda", scale=3.0), note=depth)
# Softmax: the vec plans that keep the whole register cache a thread on deep devices (dispatch.h
# row vec-full-cache: the float forward, log_softmax's backward) and softmax's 16-bit two passes at two units past
# 512 threads (row two-pass), rows around the halved plan's bounds and past them (f32 1032-8192, 16-bit
# 4104-8196; 3074 / 8196: rows off the vector width, edges), forward and backward.
for dtype, dims in ((torch.float32, (1032, 2048, 3072, 3074, 4096, 6144, 8192)),
                    (torch.bfloat16, (4104, 5120, 6144, 8192, 8196)), (torch.float16, (6144, 8192))):
    for op in SOFTMAX_OPS:
        for d in dims:
            check_op(op, make_tensor((19, d), dtype, "cuda", scale=3.0), note=depth)
# Softmax: the 16-bit forward of aligned rows leaves vec past 320 threads on deep devices (dispatch.h
# row vec-deep-fwd16: long_row's clusters), rows around that bound and up to vec's 512 threads elsewhere.
for dtype in (torch.bfloat16, torch.float16):
    for op in SOFTMAX_OPS:
        for d in (10240, 10248, 12288, 16384):
            check_op(op, make_tensor((11, d), dtype, "cuda", scale=3.0), note=depth)
# Softmax: the warp forward packs rows whose 128-bit units are not a power of two on deep devices (dispatch.h
# row warp-packed: four accesses a lane, several rows a warp), every packable padded length of each vector width
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
# row vec-fwd-deep-f32: one warp a row, the whole register cache), rows around that bound and to 1024.
for op in SOFTMAX_OPS:
    for d in (504, 512, 516, 768, 1000, 1024):
        check_op(op, make_tensor((37, d), torch.float32, "cuda", scale=3.0), note=depth)
# Softmax: the strided cached forward of 128-bit accesses on deep devices (dispatch.h rows strided-small-ctas, strided-deep-half-lines): float's
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
# Softmax: long rows (dispatch.h rows cluster-deep-shapes, grid-over-cluster). Deep: 16-bit forwards
# past 131072 with a register part as loaded over clusters of the fewest threads, at least 128 (139264: 8 x 160,
# 262144: 16 x 128), float forwards of the shared-memory kernel over 16 CTAs (16 x 160, 16 x 256), the float
# backward of 16 x 1024 the grid mode;
# standard: 8 x 512 shared memory, and the 16-bit rows of an input of at least the L2 size prefetched ahead.
l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size


def show(explanation):  # a softmax plan line (dispatch.h softmax_plan_fields), for the test to read
    print("SOFTMAX", explanation.splitlines()[-1])


for dtype in (torch.float32, torch.bfloat16):
    for op in SOFTMAX_OPS:
        for d in (139264, 262144):
            check_op(op, make_tensor((3, d), dtype, "cuda", scale=3.0), note=depth)
x_l2 = make_tensor((-(-l2 // (262144 * 2)), 262144), torch.bfloat16, "cuda", scale=3.0)
for op in SOFTMAX_OPS:
    check_op(op, x_l2, backward=False, note=depth)
show(fastact.explain("softmax", torch.randn(2, 139264, device="cuda", dtype=torch.bfloat16)))
show(fastact.explain("softmax", x_l2))
del x_l2
# Inputs of at least four times the L2 size (dispatch.h row long-row-prefetch): deep, the 16-bit forward with the
# register part prefetches the rows ahead as well (both 16-bit types checked; one row fewer: unprefetched).
rows_4l2 = -(-4 * l2 // (262144 * 2))
for dtype in (torch.float16, torch.bfloat16):
    x_4l2 = make_tensor((rows_4l2, 262144), dtype, "cuda", scale=3.0)
    for op in SOFTMAX_OPS:
        check_op(op, x_4l2, backward=False, note=depth)
show(fastact.explain("softmax", x_4l2))
show(fastact.explain("log_softmax", x_4l2[:rows_4l2 - 1]))
del x_4l2
show(fastact.explain("softmax", torch.randn(2, 262144, device="cuda")))
show(fastact.explain("softmax_backward", torch.randn(2, 262144, device="cuda")))
for dtype in (torch.float32, torch.bfloat16):
    show(fastact.explain("softmax", torch.randn(4, 1024, 2048, device="cuda", dtype=dtype), 1))
show(fastact.explain("softmax", torch.randn(8, 96, device="cuda"), -1))
show(fastact.explain("log_softmax", torch.randn(8, 96, device="cuda", dtype=torch.bfloat16), -1))
show(fastact.explain("log_softmax", torch.randn(8, 1024, device="cuda"), -1))
# Softmax: the 16-bit warp forward of rows padded to 1024 in blocks of two warps on deep devices (dispatch.h
# row warp-small-blocks), 37 rows (the last block of rows partial).
for dtype in (torch.bfloat16, torch.float16):
    for op in SOFTMAX_OPS:
        for d in (520, 1000, 1024):
            check_op(op, make_tensor((37, d), dtype, "cuda", scale=3.0), note=depth)
show(fastact.explain("softmax", torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16), -1))
for name, d in (("softmax", 10240), ("softmax", 10248), ("log_softmax", 16384)):
    show(fastact.explain(name, torch.randn(8, d, device="cuda", dtype=torch.bfloat16), -1))
for op in SOFTMAX_OPS:
    for d in (1024, 4096):
        y = getattr(fastact, op.name)(torch.randn(8, d, device="cuda", dtype=torch.bfloat16), -1)
        show(fastact.explain(op.name + "_backward", y))
for name in ("log_softmax_backward", "softmax_backward"):
    show(fastact.explain(name, torch.randn(8, 8192, device="cuda", dtype=torch.bfloat16), -1))
show(fastact.explain("log_softmax", torch.randn(8, 8192, device="cuda"), -1))
show(fastact.explain("softmax_backward", torch.randn(8, 3072, device="cuda"), -1))
for dtype in (torch.float32, torch.bfloat16):
    print("ELEM", fastact.explain("sigmoid", torch.randn(4096, device="cuda", dtype=dtype)))
    print("ELEM", fastact.explain("gelu_backward", torch.randn(4096, device="cuda", dtype=dtype)))
"""


@pytest.mark.gpu_memory(8)  # a subprocess of its own: a CUDA context and tensors outside this worker's allocator
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
    deep = depth == "deep"
    # Softmax: the deep class's kernels (vec's one unit and whole register cache, the warp forward's packed rows and
    # blocks of two warps) planned for some of the shapes above, which check_op ran, and never in the standard class.
    plans = [_plan(line[len("SOFTMAX "):]) for line in lines if line.startswith("SOFTMAX ")]
    assert len(plans) == 23, out.stdout
    deep_kernels = {"one_unit", "full_cache", "packed"}
    used = set().union(*(p["flags"] & deep_kernels for p in plans))
    used |= {"small_blocks"} if any(p["mode"] == "warp" and p["threads"] == 64 for p in plans) else set()
    assert used == (deep_kernels | {"small_blocks"} if deep else set()), (used, out.stdout)
    lines = [line[len("ELEM "):] for line in lines if line.startswith("ELEM ")]
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
explained = {  # the softmax cases' plans (dispatch.h softmax_plan_fields)
    "log_softmax_backward bf16": fastact.explain("log_softmax_backward", yb),
    "log_softmax_backward f32": fastact.explain("log_softmax_backward", yf),
    "softmax f32 rows of 96": fastact.explain("softmax", xf[:96 * 64].view(64, 96)),
    "softmax f32 rows of 128": fastact.explain("softmax", xf[:128 * 64].view(64, 128)),
    "softmax bf16 rows of 1024": fastact.explain("softmax", xb[:1024 * 64].view(64, 1024)),
}
for name, s in explained.items():
    print("PLAN " + name + "\t" + s.splitlines()[-1])
for name, call in cases.items():
    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    kernels = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
    print(name + "\t" + "|".join(kernels))
"""


@pytest.mark.gpu_memory(8)  # a subprocess of its own: a CUDA context and tensors outside this worker's allocator
def test_memory_depth_kernels():
    """The kernels that run (torch.profiler's names) under each forced class: another instantiation where the class
    changes the shape (16-bit elementwise, flat and rows; float backwards; softmax plans whose kernel-selecting fields
    differ between the classes: variant, mode, access width, warp row and block size, the flags but full_cache and
    prefetch), the same one where it does not (float forwards, double, softmax plans alike), so the launchers'
    wiring is checked, not only explain()'s report of the plan; some softmax case differs (the deep class's
    kernels run here)."""
    runs, plans = {}, {}
    for depth in ("standard", "deep"):
        env = dict(os.environ, FASTACT_MEMORY_DEPTH=depth)
        out = subprocess.run([sys.executable, "-c", _MEMORY_DEPTH_KERNELS_SCRIPT], env=env, capture_output=True,
                             text=True)
        assert out.returncode == 0, out.stderr[-3000:]
        lines = [line for line in out.stdout.splitlines() if "\t" in line]
        runs[depth] = dict(line.split("\t", 1) for line in lines if not line.startswith("PLAN "))
        plans[depth] = {k[len("PLAN "):]: _plan(v) for k, v in (line.split("\t", 1) for line in lines
                                                               if line.startswith("PLAN "))}
    if not any(runs["standard"].values()):
        pytest.skip("the profiler recorded no CUDA kernels here")

    def kernel_key(p):
        return (p["variant"], p["mode"], p["vec"], p["warp_log2"], frozenset(p["flags"] - {"full_cache", "prefetch"}),
                p["threads"] if p["mode"] == "warp" else 0)

    softmax_differs = 0
    for name, standard in runs["standard"].items():
        deep = runs["deep"][name]
        assert standard and deep, (name, standard, deep)
        if name in plans["standard"]:
            differs = kernel_key(plans["standard"][name]) != kernel_key(plans["deep"][name])
            softmax_differs += differs
        else:
            differs = name in ("sigmoid bf16", "sigmoid bf16 rows", "gelu_backward f32")
        assert (standard != deep) == differs, (name, standard, deep, plans["standard"].get(name),
                                               plans["deep"].get(name))
    assert softmax_differs, plans


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
    # (tile, chunk, column): 4096 columns x chunks x 4 bytes (dispatch.h: the plan's workspace_bytes), a small fraction of dx.
    strided_ws = -(-_plan(fastact.explain("softmax_backward", y, 0))["workspace_bytes"] // 512) * 512
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
    """A strided plan of 128-bit accesses for a D too long to cache: [8, 40000, 1024] dim 1 (f32, 1.3 GB), 256
    tiles, which on the H100 each stream over a cluster (the device is then full, so no split). The plan is valid
    and the result right against float64, outputs poisoned first."""
    if torch.cuda.get_device_capability()[0] < 9 or _clusters_capped():
        pytest.skip("clusters need sm_90 (and FASTACT_MAX_CLUSTER unset or >= 8)")
    shape = (8, 40000, 1024)
    x = make_tensor(shape, torch.float32, "cuda")
    y = torch.softmax(x, 1)
    s, plan = _explain_plan("softmax", y if backward else x, 1, backward=backward)
    assert plan["variant"] == "strided" and plan["vec"] > 1, s
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
    """softmax_shapes.h softmax_strided_smem_bytes, common.cuh column_allreduce: at D <= a thread's cached D-rows a
    column may have one D-group (columns == threads, no cluster), which folds nothing across threads and takes no
    shared-memory scratch; at D = 2 and 3 the cached plans are such tiles. 128-bit (inner 2056) and element (inner
    2055) tiles, the last of them partial (D = 1 runs as rows: a dim of size 1 has no stride to follow). Results
    against float64, outputs poisoned first."""
    shape = (3, d, inner)
    x = make_tensor(shape, dtype, "cuda")
    y = torch.softmax(x, 1)
    s, plan = _explain_plan("softmax", y if backward else x, 1, backward=backward)
    if d <= 3 and "staged" not in plan["flags"] and "streaming" not in plan["flags"]:
        assert plan["columns"] == plan["threads"] and plan["cluster"] == 1, s
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
    y = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
    if not _is_staged("softmax", y, backward=True):
        pytest.skip("auto does not stage this shape here (the staged mode is planned on sm_90)")
    for i in range(0, shape[0], 4096):
        n = min(4096, shape[0] - i)
        y[i : i + n] = torch.softmax(torch.randn(n, *shape[1:], device="cuda"), 1).to(torch.bfloat16)
    g = torch.randn(shape, dtype=torch.bfloat16, device="cuda")
    s = fastact.explain("softmax_backward", y, 1)
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
    x = torch.randn(shape, dtype=torch.bfloat16, device="cuda")
    if not _is_staged("softmax", x):
        pytest.skip("auto does not stage this shape here (the staged mode is planned on sm_90)")
    s = fastact.explain("softmax", x, 1)
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
