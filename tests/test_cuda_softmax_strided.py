"""CUDA only, softmax over a dim with inner > 1 (include/fastact/softmax/strided.cuh, staged.cuh): the strided
planner's tiles, clusters, streamed and split modes, L2 prefetch of the tiles ahead, the staged mode (its bounds,
special values down a column), tiles of one D-group, and a D too long to cache (`huge`)."""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import fastact  # noqa: E402
from cuda_testing import _clusters_capped, _explain_plan, _is_staged  # noqa: E402
from fastact_testing import (  # noqa: E402
    SOFTMAX_OPS,
    assert_close,
    check_op,
    dtype_id,
    make_tensor,
    poison_allocator,
    softmax_backward_ref,
    softmax_backward_torch,
)

pytestmark = pytest.mark.cuda
ops = torch.ops.fastact


# ----------------------------------------------------------------------------------------------
# Plans and modes


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


# ----------------------------------------------------------------------------------------------
# L2 prefetch


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


# ----------------------------------------------------------------------------------------------
# The staged mode


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


@pytest.mark.parametrize("shape", [(264, 100, 300), (264, 128, 300), (40, 1000, 300)], ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
def test_strided_staged_special_values(op, dtype, shape):
    """The staged forward with special values down a column (as test_ops.py test_softmax_special_values along rows),
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
