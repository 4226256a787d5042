"""Audit: fastact against torch eager on shapes that no report grid holds (CUDA, or the CPU with --device cpu).

The report's grids (fastact.bench) time 256 MB-class tensors. This sweep takes mid-size tensors (8 and 64 MB by
default) of model shapes: rows of 2 to 200000 elements (classes, sequence lengths, vocabularies), channel, dim-0
and dim -2 softmaxes, f32 / bf16 / f16, forward and backward. On CUDA each call is timed in a CUDA graph of ten
calls, so that host overhead does not hide the kernel at the small sizes; on the CPU each is the median of calls
timed as the report times them, with glibc told to keep freed memory as the report does (keep_cpu_allocations: else
every output past malloc's 32 MB mmap threshold faults its pages in on each call, which at 64 MB costs more than the
kernels), and run it with OMP_WAIT_POLICY=passive (torch's OpenMP workers otherwise spin for ~10 ms after each of
its parallel calls and slow fastact's threads; docs/performance.md, "Timing on the CPU"). Beside each, a
plain elementwise kernel that moves the same bytes (torch.neg forward, torch.mul backward) is timed as a size-aware
limit. It prints every cell, then the cells where fastact is slower than torch, then those under 0.85 of the
elementwise kernel.

    python bench/audit.py [--device cpu] [--sizes-mb 8 64] [--variants] [--json out.json]

``--variants`` (CUDA) also times every forced kernel variant that takes the input (the softmax family's
``variant=``), to see which one a dispatcher rule should pick. docs/performance.md (known gaps) has what it left
open on the H100 and on the CPU."""
from __future__ import annotations

import argparse
import json
import statistics

import torch

import fastact
from fastact import bench as B

MB = 1 << 20
ROW_D = (2, 5, 10, 33, 77, 100, 197, 257, 384, 577, 1000, 1500, 2304, 5000, 10000, 30522, 50257, 100000, 151936,
         200000)
# (C, inner) over dim 1 of [N, C, inner]; inner 0: [C, N] over dim 0.
STRIDED = ((3, 50176), (19, 4096), (21, 1024), (64, 196), (150, 1024), (1000, 49), (8, 7), (2, 65536), (512, 512),
           (4, 0), (64, 0), (1000, 0), (8192, 0))
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
GRAPH_CALLS = 10


def graph_time_us(fn, reps=7):
    """GPU microseconds of one call: GRAPH_CALLS calls captured in a CUDA graph, the replay's median."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(GRAPH_CALLS):
            fn()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / GRAPH_CALLS)
    return statistics.median(ts)


# The CPU's timing: the report's quick mode for CPU rows, a little shorter (many small cells).
CPU_TIMING = B.Timing(0.15, 5, 30, 1)


def time_us(fn, device):
    """Microseconds of one call of fn on `device` (CUDA: graph_time_us's best of two; CPU: the median of calls)."""
    if device == "cuda":
        return min(graph_time_us(fn) for _ in range(2))
    return B.time_call(fn, "cpu", CPU_TIMING) * 1e6


def cases(sizes):
    for size in sizes:
        for dt in DTYPES:
            for d in ROW_D:
                for op in B.SOFTMAX_OPS:
                    for direction in B.DIRECTIONS:
                        yield B.Case(op, direction, dt, (max(1, size // (d * dt.itemsize)), d))
            for c, inner in STRIDED:
                for direction in B.DIRECTIONS:
                    if inner == 0:
                        yield B.Case("softmax", direction, dt, (c, max(1, size // (c * dt.itemsize))), dim=0)
                    else:
                        yield B.Case("softmax", direction, dt, (max(1, size // (c * inner * dt.itemsize)), c, inner),
                                     dim=1)
            for s in (128, 512):  # attention scores over the query dim
                for direction in B.DIRECTIONS:
                    yield B.Case("softmax", direction, dt, (max(1, size // (s * s * dt.itemsize)), s, s), dim=-2)


def audit_case(case, variants, device="cuda"):
    inputs = B.make_inputs(case, device)
    th, th_names = B.torch_impl(case)
    targs = [inputs[n] for n in th_names]
    want = th(*targs)
    want = want[0] if isinstance(want, tuple) else want
    row = {"name": case.name}
    for v in ("auto",) + (B.VARIANTS if variants and device == "cuda" else ()):
        fa, names = B.fastact_impl(case, v)
        args = [inputs[n] for n in names]
        try:
            got = fa(*args)
        except RuntimeError as e:  # a forced variant that cannot take the input
            if "cannot take" not in str(e):
                raise
            continue
        err = float((got.double() - want.double()).norm() / max(want.double().norm(), 1e-30))
        if err > B.MATCH_TOL[case.dtype]:
            raise AssertionError(f"{case.name} {v}: relative error {err:.2e} against torch")
        row[v] = time_us(lambda: fa(*args), device)
    row["torch"] = time_us(lambda: th(*targs), device)
    buf = torch.empty_like(targs[0])
    row["ref"] = time_us((lambda: torch.neg(targs[0], out=buf)) if case.direction == "fwd" else
                         (lambda: torch.mul(targs[0], targs[1], out=buf)), device)
    x = inputs.get("x", inputs.get("y"))
    row["plan"] = fastact.explain(case.op + ("_backward" if case.direction == "bwd" else ""), x, dim=case.dim)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--sizes-mb", type=int, nargs="+", default=None, help="tensor sizes (default: 8 64 on CUDA, 8 on the CPU)")
    ap.add_argument("--variants", action="store_true", help="CUDA: also time every forced variant that takes the input")
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench/audit.py: no CUDA device (--device cpu audits the CPU kernels)")
    sizes = a.sizes_mb or ([8, 64] if a.device == "cuda" else [8])
    rows = []
    malloc_kept = a.device == "cpu" and B.keep_cpu_allocations()
    for case in cases([s * MB for s in sizes]):
        r = audit_case(case, a.variants, a.device)
        if malloc_kept:
            B.release_cpu_allocations()
        rows.append(r)
        forced = " ".join(f"{v} {r[v]:.1f}" for v in B.VARIANTS if v in r)
        print(f"{r['name']:50s} {r['auto']:8.1f} torch {r['torch']:8.1f} ({r['torch'] / r['auto']:5.2f}x) ref "
              f"{r['ref']:8.1f} frac {r['ref'] / r['auto']:5.2f}  {forced}  {r['plan'][:70]}", flush=True)
    print("\n== slower than torch eager, worst first")
    for r in sorted(rows, key=lambda r: r["torch"] / r["auto"]):
        if r["auto"] > r["torch"]:
            print(f"{r['name']:50s} {r['auto']:8.1f} torch {r['torch']:8.1f}  {r['plan'][:100]}")
    print("\n== under 0.85 of the elementwise kernel moving the same bytes, worst first")
    for r in sorted(rows, key=lambda r: r["ref"] / r["auto"]):
        if r["ref"] / r["auto"] < 0.85:
            print(f"{r['name']:50s} {r['auto']:8.1f} ref {r['ref']:8.1f} frac {r['ref'] / r['auto']:.3f} torch "
                  f"{r['torch']:8.1f}  {r['plan'][:100]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
