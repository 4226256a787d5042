"""CUDA only, softmax's long rows (include/fastact/softmax/long_row.cuh, grid.cuh, split.cuh): clusters in several
waves, the caches a cluster's slice keeps, the grid mode beyond a cluster (and its CTAs that give up waiting), the
split mode beyond the grid, L2 prefetch of the rows ahead, the dtype= cast's paired stores, and the environment's
knobs (FASTACT_MAX_CLUSTER, FASTACT_PREFETCH, FASTACT_GRID_WAIT_US, FASTACT_MEMORY_DEPTH), each in a subprocess of
its own."""

import os
import subprocess
import sys

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import fastact  # noqa: E402
from cuda_testing import (  # noqa: E402
    DTYPE_CONFIGS,
    _assert_plan_valid,
    _clusters_capped,
    _explain_plan,
    _plan,
    _vec_width,
)
from fastact_testing import (  # noqa: E402
    SOFTMAX_OPS,
    assert_close,
    coarsest,
    dtype_id,
    make_tensor,
    poison_allocator,
    softmax_backward_ref,
    softmax_backward_torch,
    strided_tensor,
)

pytestmark = pytest.mark.cuda
ops = torch.ops.fastact


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
    """A CTA that waits for its row longer than softmax_shapes.h kGridWaitNs gives up and the launch's last CTA
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
