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
import ctypes
import statistics
from pathlib import Path

import torch

from elementwise16_diag import row_report, time_rounds  # this folder's (the script's own folder leads sys.path)
from softmax_bwd_plans_diag import DTYPES, aten_bwd, cta_threads


def load(folder, d):
    lib = ctypes.CDLL(str(Path(folder) / f"libsmplans_{d}.so"))
    lib.diag_run.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    return lib


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
    libs = {"A": load(args.a, d_i), "B": load(args.b, d_i)}
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    stream = torch.cuda.current_stream().cuda_stream
    w = 16 // min(in_dtype.itemsize, out_dtype.itemsize)  # dispatch.h softmax_vec_width
    cast = None if out_dtype == in_dtype else out_dtype  # the forward's dtype=
    for case in args.cases.split(","):
        op, dim, direction = (case.split(":") + ["fwd"])[:3]
        dim, fwd, log = int(dim), int(direction == "fwd"), int(op == "log_softmax")
        rows = (1 << 28) // (dim * in_dtype.itemsize)
        torch._dynamo.reset()
        torch.manual_seed(0)
        x = torch.randn(rows, dim, device="cuda") * 3
        forward = torch.log_softmax if log else torch.softmax
        if fwd:
            a, b, result_dtype = x.to(in_dtype), None, out_dtype
            fn = lambda t, _: forward(t, -1, dtype=cast)  # noqa: E731
            ref = forward(a.double(), -1)
            nbytes = a.numel() * (in_dtype.itemsize + out_dtype.itemsize)
        else:
            b, result_dtype = forward(x, -1).to(out_dtype), in_dtype
            a = torch.randn(rows, dim, device="cuda", dtype=out_dtype)
            bwd = aten_bwd(op)
            fn = lambda t, u: bwd(t, u, -1, in_dtype)  # noqa: E731
            ref = bwd(a.double(), b.double(), -1, torch.float64)
            nbytes = a.numel() * (2 * out_dtype.itemsize + in_dtype.itemsize)
        del x
        compiled = torch.compile(fn, dynamic=False)
        calls = {"torch.compile": lambda: compiled(a, b), "torch.compile (again)": lambda: compiled(a, b)}
        errs = {}
        out = torch.empty(rows, dim, device="cuda", dtype=result_dtype)
        kinds = [("dispatcher", 0, 0)]
        if dim % w == 0:
            seen = set()
            for u in (1, 2, 4):
                t = cta_threads(dim // w, u)
                if 32 <= t <= 1024 and t not in seen:
                    seen.add(t)
                    kinds.append((f"vec {t} thr, {u} units", 3, t))
        for name, kind, threads in kinds:
            for k, lib in libs.items():
                def call(lib=lib, kind=kind, threads=threads, o=None):
                    o = out if o is None else o
                    rc = lib.diag_run(fwd, log, kind, threads, a.data_ptr(), 0 if b is None else b.data_ptr(),
                                      o.data_ptr(), rows, dim, stream)
                    if rc != 0:
                        raise RuntimeError(f"code {rc}")
                    return o
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
