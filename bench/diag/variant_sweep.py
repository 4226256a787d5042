"""Every forced softmax variant against the dispatcher's own choice across row lengths, timed as the report times
them: the diagnostic for a dispatcher line between two variants (warp / vec / long_row / split / grid), on the device
the line is for.

    python3 bench/diag/variant_sweep.py [--direction fwd|bwd] [--ops softmax,log_softmax] [--dtypes f32,bf16,f16]
                                        [--compile] D [D ...]

For each D, dtype and op: a 256 MB-class [rows, D] input, the report's own bench_case (fastact.bench: rows timed in
rotated rounds by CUDA events, the median), outputs not verified (the test suite checks every forced variant). Rows:
auto (the dispatcher's plan; its variant from explain), each variant that takes the problem, torch eager and, with
--compile, torch.compile. Prints the microseconds of each row and, per forced variant, its time over auto's (below 1:
the variant is faster than the dispatcher's plan). A line set from this should hold over several runs and on every
row length near it: single cells move by about 0.3% between runs, and ties within that are noise.
"""
import argparse
import re

import torch

import fastact
from fastact import bench as B

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "f64": torch.float64}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dims", nargs="*", type=int, default=[768, 896, 1024], help="row lengths D")
    ap.add_argument("--direction", choices=("fwd", "bwd"), default="bwd")
    ap.add_argument("--ops", default="softmax,log_softmax")
    ap.add_argument("--dtypes", default="f32,bf16,f16")
    ap.add_argument("--compile", action="store_true", help="add torch.compile rows (compiles every shape)")
    args = ap.parse_args()
    compiler = B.Compiler() if args.compile else None
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    for D in args.dims:
        for dt in (DTYPES[d] for d in args.dtypes.split(",")):
            for op in args.ops.split(","):
                c = B.Case(op, args.direction, dt, (B._rows(B.FULL_CLASS_BYTES, D, dt.itemsize), D))
                res = B.bench_case(c, "cuda", compiler, variants=True, verify=False)
                rows = res["rows"]
                auto_us = rows["fastact"]["seconds"] * 1e6
                m = re.search(r"variant=(\w+)", res["explain"] or "")
                cells = [f"auto ({m.group(1) if m else '?'}) {auto_us:8.1f}"]
                for v in B.VARIANTS:
                    r = rows.get(f"fastact[{v}]")
                    cells.append(f"{v} " + ("-" if r is None else f"{r['seconds'] * 1e6:8.1f} "
                                                                     f"({r['seconds'] * 1e6 / auto_us:.4f})"))
                for name in ("torch", "torch.compile"):
                    if name in rows:
                        cells.append(f"{name} {rows[name]['seconds'] * 1e6:8.1f}")
                print(f"{c.name:40s} " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
