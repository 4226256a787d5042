"""fastact.explain, determinism (bit-identical repeated runs), and the CPU thread count."""

import re

import pytest
import torch

import fastact
from fastact._optable import OPS as TABLE
from fastact_testing import ALL_OPS, assert_close, bias_for, make_tensor

SOFTMAX_FAMILY = ("softmax", "log_softmax", "softmax_backward", "log_softmax_backward")
OTHER_OPS = tuple(op.name for op in TABLE if op.kind != "softmax")
EXPLAIN_OPS = SOFTMAX_FAMILY + OTHER_OPS  # the ops explain() knows: every row of the op table


@pytest.mark.parametrize("op", EXPLAIN_OPS)
@pytest.mark.parametrize("shape,dim", [((4, 64), -1), ((4, 64, 3), 1), ((5,), 0), ((), 0), ((0, 3), 1)], ids=str)
def test_explain_returns_text(device, op, shape, dim):
    x = make_tensor(shape, torch.float32, device)
    s = fastact.explain(op, x, dim)
    assert isinstance(s, str) and s.strip(), repr(s)
    if device == "cpu" and op in SOFTMAX_FAMILY:
        assert s.startswith("variant=cpu_"), s


def test_explain_cpu_paths_differ():
    # the strided (inner > 1) case and the rows case are different CPU paths, and explain says so
    rows = fastact.explain("softmax", make_tensor((8, 64), torch.float32, "cpu"), -1)
    strided = fastact.explain("softmax", make_tensor((8, 64, 4), torch.float32, "cpu"), 1)
    assert rows.startswith("variant=cpu_") and strided.startswith("variant=cpu_")
    assert _variant(rows) != _variant(strided), (rows, strided)


def _variant(explanation):
    return re.match(r"variant=(\w+)", explanation).group(1)


def test_explain_default_dim(device):
    x = make_tensor((4, 64, 3), torch.float32, device)
    assert fastact.explain("softmax", x) == fastact.explain("softmax", x, -1)


def test_explain_dtype(device):
    """explain's dtype is the op's own (the forward's output dtype, the backward's input_dtype) and says where the
    conversion happens: in the kernel for the fused casts (16-bit <-> float), as a cast around it otherwise; the same
    plan as without it where the dtype is the tensor's; errors as the ops give them."""
    x = make_tensor((4, 64), torch.bfloat16, device)
    y = make_tensor((4, 64), torch.float32, device)
    for op in ("softmax", "log_softmax"):
        assert fastact.explain(op, x, dtype=torch.bfloat16) == fastact.explain(op, x)
        assert "the BFloat16 input read as it is, the output written in Float" in fastact.explain(
            op, x, dtype=torch.float32)
        assert "the Float input first cast to Half" in fastact.explain(op, y, dtype=torch.float16)
        assert "the Int input first cast to Float" in fastact.explain(
            op, torch.arange(256, device=device, dtype=torch.int32).view(4, 64), dtype=torch.float32)
        with pytest.raises(RuntimeError, match="expected dtype to be float32"):
            fastact.explain(op, x, dtype=torch.int64)
        backward = op + "_backward"
        assert fastact.explain(backward, y, dtype=torch.float32) == fastact.explain(backward, y)
        assert "BFloat16 grad_input written by the kernel" in fastact.explain(backward, y, dtype=torch.bfloat16)
        assert "computed in Float, grad_input then cast to Double" in fastact.explain(backward, y, dtype=torch.float64)
        with pytest.raises(RuntimeError, match="expected input_dtype to be float32"):
            fastact.explain(backward, y, dtype=torch.int32)
        with pytest.raises(RuntimeError, match="expected a floating point tensor"):
            fastact.explain(backward, torch.ones(4, 64, device=device, dtype=torch.int32), dtype=torch.float32)
    for op in OTHER_OPS:
        with pytest.raises(RuntimeError, match="dtype applies to softmax"):
            fastact.explain(op, y, dtype=torch.float32)
    with pytest.raises(RuntimeError, match="unknown"):
        fastact.explain("softmaxx", y, dtype=torch.float32)
    # The plan is the kernel's: a cast-first input is a fresh dense tensor (here of a transposed, non-dense x); the
    # fused backward plans by the float dy and y it reads (CPU: the strided runs of float); on CUDA the mixed widths
    # leave warp from 896, float rows from 512 (dispatch.h rows vec-bwd-aligned, vec-bwd-f32).
    xt = make_tensor((300, 64), torch.float32, device)[::2].t()
    cast = fastact.explain("softmax", xt, 0, dtype=torch.float16)
    plain = fastact.explain("softmax", xt.to(torch.float16), 0)
    if device == "cpu":  # the CPU text names the layout
        plain = plain.replace("dense input read in place in its memory order", "a fresh dense copy")
    assert cast.replace("; the Float input first cast to Half (a fresh dense tensor)", "") == plain, (cast, plain)
    for shape, dim in (((64, 64, 20), 1), ((3, 64, 33), 1), ((8, 768), -1)):
        y = make_tensor(shape, torch.float32, device)
        fused = fastact.explain("softmax_backward", y, dim, dtype=torch.bfloat16)
        note = "; Float grad_output and output, BFloat16 grad_input written by the kernel"
        assert note in fused, fused
        if device == "cpu":
            assert fused.replace(note, "") == fastact.explain("softmax_backward", y, dim), fused
    if device == "cuda":
        y = make_tensor((8, 768), torch.float32, device)
        assert fastact.explain("softmax_backward", y).startswith("variant=vec")
        assert fastact.explain("softmax_backward", y, dtype=torch.bfloat16).startswith("variant=warp")


# ----------------------------------------------------------------------------------------------
# Determinism: large enough that the CPU splits the work over threads and the GPU over many blocks


DETERMINISM_CASES = [
    ((256, 4096), -1),
    ((64, 1000, 16), 1),  # strided
    ((4, 65536), -1),  # long rows
    ((4096, 64), 0),  # long strided
]


@pytest.mark.parametrize("op", ALL_OPS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_deterministic(device, op, dtype):
    cases = DETERMINISM_CASES if op.takes_dim else [((2048, 1024), None), ((64, 3, 4097), None)]
    for shape, dim in cases:
        x = make_tensor(shape, dtype, device, scale=3.0)
        b = bias_for(x) if op.takes_bias else None
        g = make_tensor(shape, dtype, device)
        runs = []
        for _ in range(3):
            xr = x.detach().requires_grad_()
            br = b.detach().requires_grad_() if b is not None else None
            y = op.fastact(xr, dim=dim, bias=br)
            y.backward(g)
            runs.append((y.detach(), xr.grad, br.grad if br is not None else None))
        for y, dx, db in runs[1:]:
            assert torch.equal(y, runs[0][0]), f"{op} {shape}: forward differs between runs"
            assert torch.equal(dx, runs[0][1]), f"{op} {shape}: x.grad differs between runs"
            if db is not None:
                assert torch.equal(db, runs[0][2]), f"{op} {shape}: bias.grad differs between runs"


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_cpu_thread_counts(threads):
    """Results are right whatever torch's thread count (the TBB arena follows it)."""
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        x = make_tensor((97, 2049), torch.float32, "cpu")
        for op in ALL_OPS:
            for dim in (-1, 0) if op.takes_dim else (None,):
                b = bias_for(x) if op.takes_bias else None
                y = op.fastact(x, dim=dim, bias=b)
                ref = op.torch(x.double(), dim=dim, bias=b.double() if b is not None else None)
                assert_close(y, ref, torch_actual=op.torch(x, dim=dim, bias=b), msg=f"{op} threads={threads}")
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=["f32", "bf16", "f64"])
@pytest.mark.parametrize(
    "shape,dim",
    [((2, 300, 1100), 1), ((700, 2100), 0), ((3, 40, 8236), 1), ((4000, 300), 0), ((3001, 8, 7), 1), ((997, 9, 37), 1),
     ((5, 1000, 3), 1), ((40, 13, 20), 1)],
    ids=str,
)
def test_cpu_strided_thread_invariant(dtype, shape, dim):
    """The CPU strided kernels' run width follows the thread count (whole slabs, or slabs split so that every thread
    has a task: csrc/cpu/softmax_kernels.cpp strided_run_width); each column's arithmetic is the same in the same order
    whatever the width, so outputs and gradients are bit for bit the same. Dim 0 of [4000, 300]: whole slabs at one
    thread, vector pairs (their last columns in the runs' lanes) at more, forward and backward. Inner 7, 37, 3 and 20
    (D under 16, or inner under 128): the columns past a slab's last vector in lanes across slabs, in groups whose
    width and split follow the thread count (turned_group_width), or for float backwards of slabs wider than a
    vector in the slab's own task's padded lanes. log_softmax's backward of any y too (positive values: its exp)."""
    old = torch.get_num_threads()
    x = make_tensor(shape, dtype, "cpu")
    g = make_tensor(shape, dtype, "cpu")
    runs = {}
    try:
        for threads in (1, 2, 3, 5):
            torch.set_num_threads(threads)
            for name, fn in (("softmax", fastact.softmax), ("log_softmax", fastact.log_softmax)):
                xr = x.detach().requires_grad_()
                y = fn(xr, dim)
                y.backward(g)
                runs.setdefault(name, []).append((threads, y.detach(), xr.grad))
            # log_softmax's backward of a y that is not a log_softmax output: mostly <= 0 with a sparse few positive
            # values, so that some vectors hold one and others none whatever the grouping; its exp must take the
            # same arithmetic in every lane, whatever the lane's neighbours hold.
            y_any = -x.detach().abs()
            y_any.view(-1)[::37] = 1.5
            dx = torch.ops.fastact.log_softmax_backward(g, y_any, dim, dtype)
            runs.setdefault("log_softmax_backward of any y", []).append((threads, dx, dx))
    finally:
        torch.set_num_threads(old)
    for name, rs in runs.items():
        for threads, y, dx in rs[1:]:
            assert torch.equal(y, rs[0][1]), f"{name} {shape}: threads={threads}: the output differs from one thread's"
            assert torch.equal(dx, rs[0][2]), f"{name} {shape}: threads={threads}: the gradient differs from one thread's"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64], ids=str)
@pytest.mark.parametrize("op", SOFTMAX_FAMILY)
def test_explain_cpu_strided_runs(op, dtype):
    """explain names the CPU strided kernels' task width (at two threads): whole slabs for dim 1 of [8, 64, 300], a
    vector pair's columns for D under 16 (never more than inner), the columns past a slab's last vector in lanes across
    slabs where the runs do not apply (inner 3: all of them; inner 20: past the vectors, but for float backwards,
    which keep them in the slab's own task's padded lanes), forward and backward, and answers for an integral input."""
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        whole = fastact.explain(op, make_tensor((8, 64, 300), torch.float32, "cpu").to(dtype), 1)
        pairs = fastact.explain(op, make_tensor((4, 8, 16), torch.float32, "cpu").to(dtype), 1)
        turned = fastact.explain(op, make_tensor((4, 8, 3), torch.float32, "cpu").to(dtype), 1)
        both = fastact.explain(op, make_tensor((40, 8, 20), torch.float32, "cpu").to(dtype), 1)
    finally:
        torch.set_num_threads(old)
    assert whole.startswith("variant=cpu_strided:") and "300 adjacent columns: whole slabs" in whole, whole
    lanes = int(re.search(r"(\d+)-lane SIMD", pairs).group(1))  # this build's for this dtype (AVX512: 16 float)
    pair = min(2 * lanes, 16)
    want = f"tasks of (outer index, {pair} columns), a vector pair at a time in registers, split across threads"
    assert want in pairs, pairs
    assert "no transposing copy; tasks of" in pairs and "lanes across slabs" not in pairs, pairs
    # Inner 3: every column in lanes across slabs, the 4 slabs' 12 columns in groups of 6 at two threads (more lanes
    # would leave a thread without a group).
    assert ("own max and sum; " if "backward" not in op else "own sum; ") in turned, turned
    assert f"; each slab's 3 columns in vector lanes across slabs (tasks of {min(6, lanes)} such columns of " \
        "consecutive slabs, turned through buffers, a lane a column), split across threads" in turned, turned
    assert "a vector pair" not in turned and "no transposing copy" not in turned and "scalar" not in turned, turned
    # Inner 20 (16 lanes: a vector and 4 columns; 8: two vectors and 4; 4: none left), 40 slabs. Float backwards (an
    # integral input computes in float) keep the columns past the last vector pair in the slab's own task, in padded
    # lanes (16 lanes: all 20; 8: a pair, then 4); the rest take them in groups of all lanes across slabs.
    body = 20 - 20 % lanes
    padded = "backward" in op and dtype in (torch.float32, torch.int64) and body < 20 and body > 0
    if padded and 20 < 2 * lanes:
        assert "tasks of (outer index, 20 columns: whole slabs) in padded lanes" in both, both
    elif padded:
        assert (f"tasks of (outer index, {2 * lanes} columns), a vector pair at a time in registers, each slab's last "
                f"{20 % (2 * lanes)} columns in padded lanes") in both, both
    else:
        assert f"tasks of (outer index, {min(2 * lanes, body)} columns), a vector pair at a time in registers" in both, both
    if body < 20 and not padded:
        assert f", then each slab's last {20 - body} columns in vector lanes across slabs (tasks of {lanes} such " \
            "columns" in both, both
    else:
        assert "across slabs" not in both, both
