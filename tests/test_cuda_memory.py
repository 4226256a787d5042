"""CUDA only, memory: the memory-depth classes (include/fastact/memory_depth.cuh; FASTACT_MEMORY_DEPTH forces either,
in a subprocess of its own), what each op allocates beyond its outputs (peak memory), and tensors beyond 2^31
elements (`huge`: sampled rows and columns against float64)."""

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
from cuda_testing import VARIANTS, _call, _is_staged, _plan, must_accept  # noqa: E402
from fastact_testing import (  # noqa: E402
    ALL_OPS,
    assert_close,
    bias_for,
    make_tensor,
    softmax_backward_ref,
    softmax_backward_torch,
)

pytestmark = pytest.mark.cuda
ops = torch.ops.fastact


# ----------------------------------------------------------------------------------------------
# Memory-depth classes


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
            # the saved tensor a row view too: the input, or the twin's output of it
            saved = x if op.row.saves == "input" else row_view(67, cols, dtype, "cuda", view, values=op.torch(x))
            got = getattr(torch.ops.fastact, op.row.backward)(g, saved, *op.params.values())
            want = [op.row.torch_backward(g.to(t), saved.to(t), **op.params) for t in (torch.float64, dtype)]
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


def show(explanation):  # a softmax plan line (dispatch_explain.h softmax_plan_fields), for the test to read
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
explained = {  # the softmax cases' plans (dispatch_explain.h softmax_plan_fields)
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


# ----------------------------------------------------------------------------------------------
# Peak memory: what each op allocates


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


# ----------------------------------------------------------------------------------------------
# Tensors beyond 2^31 elements


HUGE = (1 << 31) + 8  # float16 elements: 4 GiB, past every int32 offset


def _need_huge_gpu():
    torch.cuda.empty_cache()  # what earlier huge tests left in the caching allocator counts as used
    free, _ = torch.cuda.mem_get_info()
    if free < 40 * 2**30:
        pytest.skip(f"needs a GPU with >= 40 GiB free, {free / 2**30:.0f} GiB free")


def _lse_long_row(row):
    chunk = 1 << 28
    parts = torch.stack([torch.logsumexp(row[i : i + chunk].float(), 0) for i in range(0, row.numel(), chunk)])
    return torch.logsumexp(parts, 0)


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
