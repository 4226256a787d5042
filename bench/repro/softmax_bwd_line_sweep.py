"""Backward rows around the warp / vec line (dispatch.h softmax_rows_leave_warp), 256 MB-class tensors, timed as the
report times them (bench_case, rotated rounds): auto, forced warp and vec, torch eager; f32 / bf16 / f16, softmax and
log_softmax. bench/NOTES.md, fortieth session (first run D = 640 768 776 896 1000 1024, then 776 888 896 1024).

    python3 bench/repro/softmax_bwd_line_sweep.py [D ...]"""
import sys

import torch

from fastact import bench as B

print(f"{'case':36s} {'auto':>8s} {'warp':>8s} {'vec':>8s} {'torch':>8s}  vec/warp")
for D in [int(v) for v in (sys.argv[1:] or "776 888 896 1024".split())]:
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        for op in ("softmax", "log_softmax"):
            c = B.Case(op, "bwd", dt, (B._rows(256 << 20, D, dt.itemsize), D))
            rows = B.bench_case(c, "cuda", None, variants=True, verify=False)["rows"]

            def us(k):
                return rows[k]["seconds"] * 1e6 if k in rows else float("nan")

            print(f"{c.name:36s} {us('fastact'):8.1f} {us('fastact[warp]'):8.1f} {us('fastact[vec]'):8.1f} "
                  f"{us('torch'):8.1f}  {us('fastact[vec]') / us('fastact[warp]'):.4f}", flush=True)
