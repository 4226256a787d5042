"""Two builds of softmax_bwd_plans_diag.cu timed against each other in one process (diagnostic, not part of the
library; bench/NOTES.md, fifty-fifth session): a kernel change measured by its effect on the same plans, with the
rows interleaved so that both see the same device state.

    python3 bench/repro/softmax_plans_ab.py --a DIR --b DIR [--dtype bf16>f32] [--cases softmax:4096,...]
                                            [--rounds 5] [--reps 30]

DIR holds libsmplans_<DIAG_DTYPE>.so, built from each tree (it needs no torch, so it can be built on another machine
and carried):

    nvcc -std=c++17 -O3 -arch=sm_90 --expt-relaxed-constexpr -Iinclude -Xcompiler -fPIC -shared \\
         -DDIAG_DTYPE=<0 bf16 | 1 f16 | 2 f32 | 3 bf16 in, f32 out> -o DIR/libsmplans_<d>.so \\
         bench/repro/softmax_bwd_plans_diag.cu

CASES: comma-separated op:D[:bwd] (op softmax | log_softmax; the forward unless :bwd), each a 256 MB-class input
[2^28 / (D x input itemsize), D], x randn (scale 3). Rows, each for build A and build B: the dispatcher's plan, and
where D divides into 128-bit units, vec (the kernel sized for the longest row) at 1, 2 and 4 units a thread; and
torch.compile twice (the second is its noise floor). Each row's output is checked against float64 from a NaN-filled
buffer first. CUDA events around each of `reps` back-to-back calls after warm-up, the median; rounds interleave the
rows in a rotated order. Prints each row's median over rounds, its ratio to torch.compile's (median and range over
rounds), its bandwidth and its max |diff| from float64.
"""
import argparse
import statistics

import torch

from elementwise16_diag import row_report, time_rounds  # this folder's (the script's own folder leads sys.path)
from softmax_bwd_plans_diag import DTYPES, case_tensors, load_lib, run_plan, vec_kinds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--dtype", default="bf16>f32", choices=sorted(DTYPES))
    ap.add_argument("--cases", default="softmax:4096,log_softmax:4096")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    d_i, in_dtype, out_dtype = DTYPES[args.dtype]
    libs = {"A": load_lib(args.a, d_i), "B": load_lib(args.b, d_i)}
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    stream = torch.cuda.current_stream().cuda_stream
    w = 16 // min(in_dtype.itemsize, out_dtype.itemsize)  # dispatch.h softmax_vec_width
    for case in args.cases.split(","):
        op, dim, direction = (case.split(":") + ["fwd"])[:3]
        dim, fwd, log = int(dim), int(direction == "fwd"), int(op == "log_softmax")
        rows = (1 << 28) // (dim * in_dtype.itemsize)
        torch._dynamo.reset()
        torch.manual_seed(0)
        a, b, fn, ref, result_dtype = case_tensors(op, in_dtype, out_dtype, rows, dim, fwd)
        per_element = in_dtype.itemsize + out_dtype.itemsize * (1 if fwd else 2)  # x and y; dx, dy and y
        nbytes = a.numel() * per_element
        compiled = torch.compile(fn, dynamic=False)
        calls = {"torch.compile": lambda: compiled(a, b), "torch.compile (again)": lambda: compiled(a, b)}
        errs = {}
        out = torch.empty(rows, dim, device="cuda", dtype=result_dtype)
        kinds = {"dispatcher": (0, 0)}
        if dim % w == 0:
            kinds.update(vec_kinds(dim // w, (1, 2, 4)))
        for name, (kind, threads) in kinds.items():
            for k, lib in libs.items():
                def call(lib=lib, kind=kind, threads=threads, o=None):
                    return run_plan(lib, fwd, log, kind, threads, a, b, out if o is None else o, rows, dim, stream)
                try:
                    errs[f"{k} {name}"] = (call(o=torch.full_like(out, float("nan"))).double() - ref).abs().max().item()
                except RuntimeError as e:
                    print(f"  skip {k} {name}: {e}", flush=True)
                    continue
                calls[f"{k} {name}"] = call
        del ref
        torch.cuda.synchronize()
        times = time_rounds(calls, args.rounds, args.reps)
        print(f"\n== {op} {direction} {args.dtype} [{rows}, {dim}]; {nbytes / 1e6:.0f} MB moved ==", flush=True)
        for n in calls:
            med = statistics.median(times[n])
            print(row_report(n, times[n], times["torch.compile"], "compile") + f"  {nbytes / med / 1e3:7.1f} GB/s" +
                  (f"  max|d| {errs[n]:.3g}" if n in errs else ""), flush=True)
        del a, b, calls, compiled, out
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
