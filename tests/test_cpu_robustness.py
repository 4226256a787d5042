"""CPU robustness: results that do not depend on the thread count, fork() and DataLoader workers, the memory of
expanded inputs, and the thread count explain() reports.

- Determinism: every elementwise op (the pointwise ops, bias_gelu and their backwards) gives the same bits at 1, 2 and 3
  threads, in every dtype, on flat tensors, strided and repeated rows, with and without streaming stores: the chunks
  threads take are cut only where the loop over a whole row would be between two of its steps.
- fork(): a child forked while another thread of the parent is inside a fastact op neither hangs nor runs on one
  thread; nor does a DataLoader worker.
- Memory: an expanded input (stride 0) costs no copy beyond the output, as in torch.
- explain() names the threads that really run (oneTBB runs no more than the machine's cores).
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import fastact
from fastact_testing import DTYPE_IDS, FLOAT_DTYPES, POINTWISE_OPS, assert_close

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPUS = len(os.sched_getaffinity(0))
needs_two_cpus = pytest.mark.skipif(CPUS < 2, reason="needs two CPUs: oneTBB runs one thread on one")


def _run_python(code, *, timeout, env=None):
    """Runs `code` in a fresh interpreter with this checkout's fastact; returns the CompletedProcess."""
    full_env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=ROOT)


# ----------------------------------------------------------------------------------------------
# Determinism across thread counts


def _inputs(shape, dtype, layout, gen):
    """x (and dy) of `shape` in `layout`: flat (contiguous), rows (x[..., 3:3 + cols] of a wider tensor: a row stride,
    each row starting off the vector alignment), repeated (one row expanded over the rows: row stride 0); dy
    contiguous. Values randn * 3."""
    rows, cols = shape

    def rand(*s):
        return (torch.randn(*s, generator=gen, dtype=torch.float64) * 3).to(dtype)

    if layout == "flat":
        x = rand(rows, cols)
    elif layout == "rows":
        x = rand(rows, cols + 5)[:, 3:3 + cols]
    else:
        x = rand(1, cols).expand(rows, cols)
    return x, rand(rows, cols), rand(cols)


def _elementwise_results(x, dy, b):
    """Every elementwise op and backward of x (forward of x, backward at grad dy), by name."""
    ops = torch.ops.fastact
    out = {}
    for op in POINTWISE_OPS:
        v = tuple(op.params.values())
        y = out[str(op)] = op.fastact(x)
        bwd = getattr(ops, op.row.backward)
        out[f"{op.row.backward} {op}"] = bwd(dy, y if op.row.saves == "output" else x, *v)
        # a backward reading the output on x's layout too (its "output" any tensor: the formula is what is run)
        if op.row.saves == "output":
            out[f"{op.row.backward} {op} of x"] = bwd(dy, x, *v)
    for approx in ("none", "tanh"):
        out[f"bias_gelu {approx}"] = fastact.bias_gelu(x, b, approximate=approx)
        dx, db = ops.bias_gelu_backward(dy, x, b, approx)
        out[f"bias_gelu_backward dx {approx}"] = dx
        out[f"bias_gelu_backward dbias {approx}"] = db
    return out


def _thread_invariance_failures(shape, dtype, layout, threads=(1, 2, 3)):
    gen = torch.Generator().manual_seed(hash((shape, layout)) % 2**31)
    x, dy, b = _inputs(shape, dtype, layout, gen)
    old = torch.get_num_threads()
    runs = {}
    try:
        for t in threads:
            torch.set_num_threads(t)
            runs[t] = _elementwise_results(x, dy, b)
    finally:
        torch.set_num_threads(old)
    failures = []
    for t in threads[1:]:
        for name, ref in runs[threads[0]].items():
            got, want = runs[t][name].view(_int_of(dtype)), ref.view(_int_of(dtype))  # bits, NaNs included
            if not torch.equal(got, want):
                bad = int((got != want).sum())
                failures.append(f"{name} {DTYPE_IDS[dtype]} {layout} {shape}: {bad} element(s) differ at {t} threads "
                                f"from {threads[0]}")
    return failures


def _int_of(dtype):
    return {8: torch.int64, 4: torch.int32, 2: torch.int16}[dtype.itemsize]


# (1, 100001): one long row (the chunks cut it); (7, 33333) and (3, 70001): odd rows, cut within and between rows.
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("layout", ["flat", "rows", "repeated"])
@pytest.mark.parametrize("shape", [(1, 100001), (7, 33333), (3, 70001)], ids=str)
def test_elementwise_bits_independent_of_threads(dtype, layout, shape):
    if layout == "repeated" and shape[0] == 1:
        pytest.skip("one row repeated once is the flat case")
    failures = _thread_invariance_failures(shape, dtype, layout)
    assert not failures, "\n".join(failures)


# Outputs of 16 MiB and more take streaming stores, whose single-element prologue runs to the next 64-byte boundary:
# rows of an odd length start at every alignment.
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize("layout", ["flat", "rows"])
def test_elementwise_bits_independent_of_threads_streaming(dtype, layout):
    cols = 4099
    rows = (17 << 20) // (cols * dtype.itemsize) + 1
    failures = _thread_invariance_failures((rows, cols), dtype, layout, threads=(1, 2))
    assert not failures, "\n".join(failures)


_ISA_SCRIPT = """
    import sys, torch
    sys.path.insert(0, "tests")
    import test_cpu_robustness as t
    failures = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for layout in ("flat", "rows"):
            failures += t._thread_invariance_failures((1, 100001), dtype, layout, threads=(1, 2))
    cols = 4099
    failures += t._thread_invariance_failures(((17 << 20) // (cols * 2) + 1, cols), torch.bfloat16, "rows", threads=(1, 2))
    failures += t._thread_invariance_failures((1, (17 << 20) // 2 + 5), torch.bfloat16, "flat", threads=(1, 2))
    print(fastact_isa := __import__("fastact").explain("gelu", torch.ones(4)).split("ISA ")[1].split(" ")[0])
    print("\\n".join(failures))
    sys.exit(1 if failures else 0)
"""


@pytest.mark.slow
@pytest.mark.parametrize("isa", ["avx2", "default"])
def test_elementwise_bits_independent_of_threads_other_isas(isa):
    """The same under the AVX2 and portable builds (16-bit vector pairs of 32 bytes there: half the streaming
    alignment)."""
    r = _run_python(_ISA_SCRIPT, timeout=900, env={"ATEN_CPU_CAPABILITY": isa})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.split()[0] == isa.upper(), r.stdout


# ----------------------------------------------------------------------------------------------
# fork() and DataLoader workers

_FORK_SCRIPT = """
    import os, threading, numpy as np, torch, fastact
    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1 << 20, generator=g)
    b = torch.randn(1 << 10, generator=g)
    ref = fastact.gelu(x)
    ref_bias = fastact.bias_gelu(x.view(-1, 1 << 10), b)
    stop = threading.Event()

    def hammer():  # another thread of the parent inside fastact ops at every fork
        while not stop.is_set():
            fastact.gelu(x)
            fastact.bias_gelu(x.view(-1, 1 << 10), b)

    def same(a, b):
        return np.array_equal(a.numpy().view(np.int32), b.numpy().view(np.int32))

    def child(depth):
        # Runs in the child: a hang is killed by the alarm (SIGALRM's default action ends the process).
        import signal
        signal.alarm(30)
        torch.set_num_threads(2)
        before = len(os.listdir("/proc/self/task"))  # the forking thread alone
        # Bits compared in numpy: torch's own parallel ops (GNU OpenMP) hang in a process forked after its forking
        # thread ran one, and the children fork again.
        ok = same(fastact.gelu(x), ref) and same(fastact.bias_gelu(x.view(-1, 1 << 10), b), ref_bias)
        after = len(os.listdir("/proc/self/task"))
        ok = ok and after > before  # a thread came up to take part
        explained = fastact.explain("gelu", x)
        ok = ok and " 2 threads " in explained
        if ok and depth == 0:  # and a child of the child
            pid = os.fork()
            if pid == 0:
                child(1)
            ok = os.waitpid(pid, 0)[1] == 0
        if not ok:
            print("child", os.getpid(), depth, before, after, explained, flush=True)
        os._exit(0 if ok else 3)

    t = threading.Thread(target=hammer, daemon=True)
    t.start()
    statuses = []
    for i in range(30):
        pid = os.fork()
        if pid == 0:
            child(0 if i % 10 == 0 else 1)
        statuses.append(os.waitpid(pid, 0)[1])
    stop.set()
    t.join()
    bad = [s for s in statuses if s != 0]
    print("children", len(statuses), "failed", len(bad), "statuses", sorted(set(statuses)))
    raise SystemExit(1 if bad else 0)
"""


@needs_two_cpus
def test_fork_while_another_thread_runs_an_op():
    """30 children forked while a parent thread hammers fastact ops: none hangs, each runs its op on the 2 threads
    it asks for (a thread comes up in the child; explain says 2), with the parent's bits; every tenth forks a child
    of its own that does the same."""
    r = _run_python(_FORK_SCRIPT, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


_DATALOADER_SCRIPT = """
    import os, threading, numpy as np, torch, fastact
    from torch.utils.data import DataLoader, Dataset
    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(1)
    # The inputs made before any worker forks, and the workers run fastact ops alone: torch's own parallel ops (GNU
    # OpenMP) can hang in a process forked from a thread that ran one.
    xs = [torch.randn(1 << 20, generator=g) * (i + 1) for i in range(6)]
    refs = [fastact.gelu(x) for x in xs]  # the parent has started its threads
    stop = threading.Event()

    def hammer():  # and another thread of the parent is inside fastact ops as the workers fork
        while not stop.is_set():
            fastact.gelu(xs[0])

    class Gelus(Dataset):
        def __len__(self):
            return len(xs)

        def __getitem__(self, i):
            before = len(os.listdir("/proc/self/task"))
            y = fastact.gelu(xs[i])
            return y, before, len(os.listdir("/proc/self/task"))

    def init(worker_id):
        torch.set_num_threads(2)  # DataLoader sets 1 in its workers

    hammering = threading.Thread(target=hammer, daemon=True)
    hammering.start()
    for epoch in range(3):  # new workers each epoch
        loader = DataLoader(Gelus(), batch_size=None, num_workers=2, worker_init_fn=init, timeout=120)
        for i, (y, before, after) in enumerate(loader):
            assert np.array_equal(y.numpy().view(np.int32), refs[i].numpy().view(np.int32)), (epoch, i)
            if i < 2:  # each worker's first item (items go to the workers in turn): a thread came up to take part
                assert after > before, (epoch, i, before, after)
    stop.set()
    hammering.join()
    print("ok")
"""


@needs_two_cpus
def test_dataloader_workers_after_the_parent_used_fastact():
    """DataLoader workers (num_workers=2, three epochs) forked after the parent used fastact, while a parent thread
    runs fastact ops: each worker's op runs on the 2 threads its worker_init_fn asks for, with the parent's bits."""
    r = _run_python(_DATALOADER_SCRIPT, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]


# ----------------------------------------------------------------------------------------------
# Memory of expanded inputs

_MEMORY_SCRIPT = """
    import gc, torch, fastact
    from fastact._optable import OPS
    torch.set_num_threads(2)
    N = 1 << 20
    R = 64  # a [64, 2^20] float32 result: 256 MiB

    def hwm():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmHWM")) * 1024

    def reset_hwm():
        gc.collect()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")

    def growth(fn):
        reset_hwm()
        base = hwm()
        out = fn()
        peak = hwm() - base
        del out
        return peak

    g = torch.Generator().manual_seed(0)
    row = torch.randn(1, N, generator=g)
    b = torch.randn(N, generator=g)
    xr = row.expand(R, N)  # one row repeated
    ones = torch.ones(()).expand(R, N)  # a sum's gradient: every element one value
    xd = torch.randn(R, N, generator=g)
    out_bytes = R * N * 4
    cases = {}
    for op in OPS:  # every pointwise op at its default params: forward and backward, against torch's twin
        if op.kind != "pointwise":
            continue
        f, tf, bwd, tbwd = getattr(fastact, op.name), op.torch_fn, getattr(torch.ops.fastact, op.backward), op.torch_backward
        saved = tf(xd) if op.saves == "output" else xd
        cases[f"{op.name} repeated row"] = (lambda f=f: f(xr), lambda tf=tf: tf(xr))
        cases[f"{op.name} scalar"] = (lambda f=f: f(ones), lambda tf=tf: tf(ones))
        cases[f"{op.backward} expanded grad"] = (lambda b=bwd, s=saved: b(ones, s), lambda b=tbwd, s=saved: b(ones, s))
    cases.update({
        "bias_gelu repeated row": (lambda: fastact.bias_gelu(xr, b), None),
        "bias_gelu scalar": (lambda: fastact.bias_gelu(ones, b), None),
        "bias_gelu_backward expanded grad": (lambda: torch.ops.fastact.bias_gelu_backward(ones, xd, b, "tanh"), None),
        "bias_gelu_backward repeated row": (lambda: torch.ops.fastact.bias_gelu_backward(xd, xr, b, "tanh"), None),
    })
    slack = 24 << 20  # the bias gradient's partial sums, the allocator's own, page rounding
    failures = []
    for name, (fa, pt) in cases.items():
        for _ in range(2):  # the second run measured: nothing first-call about it
            fa_peak = growth(fa)
        line = f"{name}: fastact +{fa_peak >> 20} MiB"
        limit = out_bytes + slack
        if pt is not None:
            pt_peak = growth(pt)
            line += f", torch +{pt_peak >> 20} MiB"
            limit = max(pt_peak, out_bytes) + slack
        print(line)
        if fa_peak > limit:
            failures.append(line)
    print("FAILED: " + "; ".join(failures) if failures else "ok")
"""


def test_expanded_inputs_allocate_only_the_output():
    """The pointwise ops, their backwards and bias_gelu's of an input with stride-0 dims (a row expanded over rows, a
    sum's gradient) raise the peak RSS by the output's 256 MiB, as torch's ops do, not by a copy of the input too."""
    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak RSS")
    r = _run_python(_MEMORY_SCRIPT, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-3000:] + r.stderr[-3000:]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=DTYPE_IDS.get)
def test_expanded_inputs_allocate_only_the_output_cuda(dtype):
    """The same on CUDA, by torch.cuda.max_memory_allocated: fastact's peak over the inputs is at most torch's op's
    (or the output's, where torch has no single op)."""
    R, N = 64, 1 << 20
    row = torch.randn(1, N, device="cuda", dtype=dtype)
    b = torch.randn(N, device="cuda", dtype=dtype)
    xr = row.expand(R, N)
    ones = torch.ones((), device="cuda", dtype=dtype).expand(R, N)
    xd = torch.randn(R, N, device="cuda", dtype=dtype)
    out_bytes = R * N * dtype.itemsize

    def peak(fn):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn()
        torch.cuda.synchronize()
        p = torch.cuda.max_memory_allocated() - base
        del out
        return p

    cases = {}
    for op in (o for o in POINTWISE_OPS if o.params == o.row.variants[0][1]):  # at the default params
        bwd, tbwd = getattr(torch.ops.fastact, op.row.backward), op.row.torch_backward
        saved = op.torch(xd) if op.row.saves == "output" else xd
        cases[f"{op} repeated row"] = (lambda op=op: op.fastact(xr), lambda op=op: op.torch(xr))
        cases[f"{op} scalar"] = (lambda op=op: op.fastact(ones), lambda op=op: op.torch(ones))
        cases[f"{op.row.backward} expanded grad"] = (lambda b=bwd, s=saved: b(ones, s), lambda b=tbwd, s=saved: b(ones, s))
    cases.update({
        "bias_gelu repeated row": (lambda: fastact.bias_gelu(xr, b), None),
        "bias_gelu_backward expanded grad": (lambda: torch.ops.fastact.bias_gelu_backward(ones, xd, b, "tanh"), None),
        "bias_gelu_backward repeated row": (lambda: torch.ops.fastact.bias_gelu_backward(xd, xr, b, "tanh"), None),
    })
    failures = []
    for name, (fa, pt) in cases.items():
        fa_peak = peak(fa)
        # bias_gelu_backward's [row groups, N] float workspace of column sums comes on top of dx.
        limit = out_bytes + (64 * N * 4 if "backward" in name and pt is None else 0)
        if pt is not None:
            limit = max(limit, peak(pt))
        if fa_peak > limit:
            failures.append(f"{name}: fastact +{fa_peak >> 20} MiB > {limit >> 20} MiB")
    assert not failures, "; ".join(failures)


# Values of the layouts the memory test takes (read in place through a stride-0 row, or copied into the output and
# computed there), against the float64 reference, forward and backward, at sizes that use threads.
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("layout", ["repeated_row", "scalar", "expanded_last", "repeated_3d"])
def test_expanded_input_values(dtype, layout):
    g = torch.Generator().manual_seed(3)
    R, C = 37, 2051

    def rand(*s):
        return (torch.randn(*s, generator=g, dtype=torch.float64) * 3).to(dtype)

    if layout == "repeated_row":
        x = rand(1, C).expand(R, C)
    elif layout == "scalar":
        x = rand(()).expand(R, C)
    elif layout == "expanded_last":
        x = rand(R, 1).expand(R, C)
    else:
        x = rand(1, 1, C).expand(3, R, C)
    b = rand(C)
    dy_dense = rand(*x.shape)
    xd = x.contiguous()
    ops = torch.ops.fastact
    F = torch.nn.functional
    x64, b64 = x.double(), b.double()
    for op in POINTWISE_OPS:
        y = op.fastact(x)
        assert_close(y, op.torch(x64), torch_actual=op.torch(x), msg=f"{op} {layout}")
        bwd, tbwd, v = getattr(ops, op.row.backward), op.row.torch_backward, tuple(op.params.values())
        # a dense gradient and one of x's own layout at x; an expanded gradient at the output, for an op whose
        # backward reads it (the formula is what is run: any tensor may stand for the output)
        for dy, saved in ((dy_dense, x), (x, x)) + (((x, y),) if op.row.saves == "output" else ()):
            assert_close(bwd(dy, saved, *v), tbwd(dy.double(), saved.double(), **op.params),
                         torch_actual=tbwd(dy, saved, **op.params), msg=f"{op.row.backward} {op} {layout}")
    for approx in ("none", "tanh"):
        for dy in (dy_dense, x):  # a dense gradient, and one of x's own layout
            dy64 = dy.double()
            assert_close(fastact.bias_gelu(x, b, approximate=approx), F.gelu(x64 + b64, approximate=approx),
                         torch_actual=F.gelu(x + b, approximate=approx), msg=f"bias_gelu {approx} {layout}")
            dx, db = ops.bias_gelu_backward(dy, x, b, approx)
            dx_ref = torch.ops.aten.gelu_backward(dy64, x64 + b64, approximate=approx)
            dx_pt = torch.ops.aten.gelu_backward(dy, x + b, approximate=approx)
            assert_close(dx, dx_ref, torch_actual=dx_pt, msg=f"bias_gelu_backward dx {approx} {layout}")
            assert_close(db, dx_ref.reshape(-1, C).sum(0), torch_actual=dx_pt.float().reshape(-1, C).sum(0).to(dtype),
                         msg=f"bias_gelu_backward dbias {approx} {layout}")


# ----------------------------------------------------------------------------------------------
# explain's thread count


def test_explain_reports_the_threads_that_run():
    """At torch.set_num_threads(cores + 2), oneTBB runs as many threads as the process has CPUs (its
    max_allowed_parallelism), and explain says that number, not torch's; at 1 and at the CPU count, torch's."""
    old = torch.get_num_threads()
    x = torch.randn(1 << 16)
    try:
        for asked, runs in ((1, 1), (CPUS, CPUS), (CPUS + 2, CPUS)):
            torch.set_num_threads(asked)
            s = fastact.explain("gelu", x)
            word = "thread" if runs == 1 else "threads"
            assert f", {runs} {word} (" in s, (asked, s)
            if asked > runs:
                assert f"torch.get_num_threads() is {asked}" in s, s
            soft = fastact.explain("softmax", x.view(256, 256))
            assert f", {runs} {word} (" in soft, (asked, soft)
    finally:
        torch.set_num_threads(old)
