"""Does the bench's row order move a tie? (diagnostic; bench/NOTES.md, thirty-ninth session) fastact's row was
always timed first in a case until the fortieth session, whose bench_case times the rows in rotated rounds, so
the two orders below now differ only in each round's start. Times the 16-bit elementwise bar cells with the bench's own bench_case, in its order
and reversed (torch first), rounds alternating, without verification.  python3 bench/repro/bench_order_diag.py [rounds]"""
import re
import statistics
import sys

import torch

import fastact.bench as B

dev = torch.device("cuda")
timing = B.timing_for(dev, "full")
grid = [c for c in B.cases("full", "cuda", "bar") if c.op in ("gelu", "gelu_tanh", "sigmoid") and re.search("bf16|f16", c.name)]
orig = B.impl_names


def reverse(case, device, *, compile=True, variants=True):
    return list(reversed(orig(case, device, compile=compile, variants=variants)))


res = {}
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
for r in range(rounds):
    for order in ("fastact-first", "torch-first"):
        B.impl_names = orig if order == "fastact-first" else reverse
        for case in grid:
            rows = B.bench_case(case, dev, None, variants=False, timing=timing, verify=False)["rows"]
            res.setdefault((case.name, order), []).append(rows["fastact"]["seconds"] / rows["torch"]["seconds"])
for (name, order), v in sorted(res.items()):
    print(f"{name:34s} {order:14s} " + " ".join(f"{x:.4f}" for x in v)
          + f"  median {statistics.median(v):.4f} behind {sum(x > 1 for x in v)}/{len(v)}", flush=True)
