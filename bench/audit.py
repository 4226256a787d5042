"""Audit: fastact against torch eager on shapes that no report grid holds (CUDA only).

The report's grids (fastact.bench) time 256 MB-class tensors. This sweep takes mid-size tensors (8 and 64 MB by
default) of model shapes: rows of 2 to 200000 elements (classes, sequence lengths, vocabularies), channel, dim-0
and dim -2 softmaxes, f32 / bf16 / f16, forward and backward. Each call is timed in a CUDA graph of ten calls,
so that host overhead does not hide the kernel at the small sizes, and beside it a plain elementwise kernel that
moves the same bytes (torch.neg forward, torch.mul backward) as a size-aware limit. It prints every cell, then
the cells where fastact is slower than torch, then those under 0.85 of the elementwise kernel.

    python bench/audit.py [--sizes-mb 8 64] [--variants] [--json out.json]

``--variants`` also times every forced kernel variant that takes the input (the softmax family's ``variant=``),
to see which one a dispatcher rule should pick. bench/NOTES.md (thirtieth session) has what it found."""
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


def audit_case(case, variants):
    inputs = B.make_inputs(case, "cuda")
    th, th_names = B.torch_impl(case)
    targs = [inputs[n] for n in th_names]
    want = th(*targs)
    want = want[0] if isinstance(want, tuple) else want
    row = {"name": case.name}
    for v in ("auto",) + (B.VARIANTS if variants else ()):
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
        row[v] = min(graph_time_us(lambda: fa(*args)) for _ in range(2))
    row["torch"] = min(graph_time_us(lambda: th(*targs)) for _ in range(2))
    buf = torch.empty_like(targs[0])
    row["ref"] = graph_time_us((lambda: torch.neg(targs[0], out=buf)) if case.direction == "fwd" else
                               (lambda: torch.mul(targs[0], targs[1], out=buf)))
    x = inputs.get("x", inputs.get("y"))
    row["plan"] = fastact.explain(case.op + ("_backward" if case.direction == "bwd" else ""), x, dim=case.dim)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes-mb", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--variants", action="store_true", help="also time every forced variant that takes the input")
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench/audit.py: needs a CUDA device")
    rows = []
    for case in cases([s * MB for s in a.sizes_mb]):
        r = audit_case(case, a.variants)
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
