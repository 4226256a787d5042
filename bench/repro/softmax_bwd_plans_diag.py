"""Times softmax_bwd_plans_diag.cu's launch plans of the softmax / log_softmax (backward, and forward) against torch
and torch.compile in one process (diagnostic, not part of the library; bench/NOTES.md, fiftieth session).

    python3 bench/repro/softmax_bwd_plans_diag.py [--rounds 7] [--reps 40] [--build DIR] [--cases CASES]

CASES: comma-separated op:dtype:D[:fwd] (op softmax | log_softmax, dtype bf16 | f16 | f32 | bf16>f32, the last the
ops' dtype= cast: bfloat16 x and dx, float y and dy; the backward unless :fwd), e.g. log_softmax:bf16:8192. Each case is a 256 MB-class tensor, [2^28 / (D x itemsize), D], x randn (scale 3),
y the op's forward of x, dy randn. Builds libsmplans_<dtype>.so into DIR with nvcc unless it is there (it needs no torch, so it can
be built on another machine and carried). Rows: torch, torch.compile (twice: the second is its noise floor), the
dispatcher's plan, split and long_row forced, vec (the kernel sized for the longest row) at 1, 2, 4 and 8 units a
thread; rows the warp kernel takes (D <= 1024, 128-bit units): warp at one access a lane and, in the forward, packed
(four accesses a lane, several rows a warp, where dispatch.h softmax_warp_packable allows) and at blocks of 64
threads (where softmax_warp_small_blockable allows); backward also vec one unit a thread, two passes at one and at
two units a pass (each where the row allows; the library compiles those two kernels only for the 16-bit backwards its
dispatcher gives them, so other cases print "skip …: code 9"). CUDA events around each of `reps` back-to-back calls
after warm-up, the median; rounds interleave the rows in a rotated order.
Prints each row's median over rounds, its ratio to torch.compile's (median and range over rounds), and its max |diff|
from float64 (torch's own alongside).
"""
import argparse
import ctypes
from pathlib import Path

import torch

from elementwise16_diag import build, row_report, time_rounds  # this folder's (the script's own folder leads sys.path)

# name: (DIAG_DTYPE, the input's dtype (the backward's grad_input's), the output's (the backward's grad_output's and
# output's)); bf16>f32: the ops' dtype= cast.
DTYPES = {"bf16": (0, torch.bfloat16, torch.bfloat16), "f16": (1, torch.float16, torch.float16),
          "f32": (2, torch.float32, torch.float32), "bf16>f32": (3, torch.bfloat16, torch.float32)}
VARIANT_NAMES = ["auto", "warp", "vec", "scalar", "long_row", "strided", "split", "grid"]  # dispatch.h SoftmaxVariant
DEFAULT_CASES = ("log_softmax:bf16:8192,log_softmax:bf16:6144,log_softmax:bf16:12288,log_softmax:bf16:4096,"
                 "softmax:bf16:8192,log_softmax:f32:3072,log_softmax:f32:2048,log_softmax:f32:4096,"
                 "log_softmax:f32:6144,softmax:f32:3072")


def cta_threads(units, per_thread):
    """Threads, a whole number of warps, that cover `units` 128-bit units at `per_thread` units a thread."""
    return -(-units // per_thread // 32) * 32


def aten_bwd(op):
    return (torch.ops.aten._log_softmax_backward_data if op == "log_softmax"
            else torch.ops.aten._softmax_backward_data)


def load_lib(folder, d):
    """libsmplans_<d>.so from folder, its entry points typed."""
    lib = ctypes.CDLL(str(Path(folder) / f"libsmplans_{d}.so"))
    lib.diag_run.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.diag_auto_plan.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                   ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)]
    return lib


def case_tensors(op, in_dtype, out_dtype, rows, dim, fwd):
    """A case's inputs from the current random state: x randn (scale 3); forward: a = x in in_dtype, b None;
    backward: b = the op's forward of x in out_dtype (y), a randn in out_dtype (dy). Returns (a, b, fn, ref64,
    result_dtype): fn(a, b) torch's call (the forward's dtype= cast where the dtypes differ), ref64 its float64
    result, result_dtype the kernel output's dtype."""
    x = torch.randn(rows, dim, device="cuda") * 3
    forward = torch.log_softmax if op == "log_softmax" else torch.softmax
    cast = None if out_dtype == in_dtype else out_dtype  # the forward's dtype=
    if fwd:
        a, b, result_dtype = x.to(in_dtype), None, out_dtype
        del x
        fn = lambda t, _: forward(t, -1, dtype=cast)  # noqa: E731
        ref64 = forward(a.double(), -1)
    else:
        b, result_dtype = forward(x, -1).to(out_dtype), in_dtype
        del x
        a = torch.randn(rows, dim, device="cuda", dtype=out_dtype)
        bwd = aten_bwd(op)
        fn = lambda t, u: bwd(t, u, -1, in_dtype)  # noqa: E731
        ref64 = bwd(a.double(), b.double(), -1, torch.float64)
    return a, b, fn, ref64, result_dtype


def run_plan(lib, fwd, log, kind, threads, a, b, out, rows, dim, stream):
    """The library's kernels on plan `kind` (the .cu file's list) into out; RuntimeError where the kind does not
    take the case (code 1000) or the launch fails."""
    rc = lib.diag_run(fwd, log, kind, threads, a.data_ptr(), 0 if b is None else b.data_ptr(), out.data_ptr(), rows,
                      dim, stream)
    if rc != 0:
        raise RuntimeError(f"code {rc}")
    return out


def vec_kinds(units, per_thread):
    """{name: (3, threads)}: vec sized for the longest row at each count of units a thread in per_thread, where
    its CTA is 32-1024 threads (one row for each CTA size)."""
    kinds, seen = {}, set()
    for u in per_thread:
        t = cta_threads(units, u)
        if 32 <= t <= 1024 and t not in seen:
            seen.add(t)
            kinds[f"vec {t} thr, {u} units"] = (3, t)
    return kinds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--build", default="/tmp/smplans")
    ap.add_argument("--cases", default=DEFAULT_CASES)
    args = ap.parse_args()
    folder = Path(args.build)
    cases = [(c.split(":") + ["bwd"])[:4] for c in args.cases.split(",")]
    dts = sorted({DTYPES[c[1]][0] for c in cases})
    build(folder, dts, source="softmax_bwd_plans_diag", lib_prefix="libsmplans", macro="DIAG_DTYPE")
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    libs = {d: load_lib(folder, d) for d in dts}
    torch.manual_seed(0)
    for op, dname, dim, direction in cases:
        d_i, in_dtype, out_dtype = DTYPES[dname]
        dim, fwd = int(dim), int(direction == "fwd")
        lib, log = libs[d_i], int(op == "log_softmax")
        rows = (1 << 28) // (dim * in_dtype.itemsize)
        torch._dynamo.reset()  # one compile a case, not the recompile limit's eager fallback
        a, b, fn, ref64, result_dtype = case_tensors(op, in_dtype, out_dtype, rows, dim, fwd)
        compiled = torch.compile(fn, dynamic=False)
        calls = {"torch": lambda: fn(a, b), "torch.compile": lambda: compiled(a, b),
                 "torch.compile (again)": lambda: compiled(a, b)}
        w = 16 // min(in_dtype.itemsize, out_dtype.itemsize)  # dispatch.h softmax_vec_width
        units = dim // w
        kinds = {"dispatcher": (0, 0), "split": (1, 0), "long_row": (2, 0)}
        if dim % w == 0:
            kinds.update(vec_kinds(units, (1, 2, 4, 8)))
        if dim % w == 0 and dim <= 1024:
            kinds["warp, one access a lane"] = (7, 0)
            if fwd:
                kinds["warp, packed"] = (6, 0)
                kinds["warp, blocks of 64 threads"] = (8, 0)
        if dim % w == 0 and not fwd:
            if units <= 1024:
                t = cta_threads(units, 1)
                kinds[f"vec one unit ({t} thr)"] = (4, 0)
                kinds[f"two-pass 1 unit ({t} thr)"] = (5, t)
            if units <= 2048:
                t = cta_threads(units, 2)
                if t * w < dim:
                    kinds[f"two-pass 2 units ({t} thr)"] = (5, t)
        stream = torch.cuda.current_stream().cuda_stream
        errs = {"torch": (calls["torch"]().double() - ref64).abs().max().item()}
        for name, (kind, threads) in kinds.items():
            def call(kind=kind, threads=threads, name=name):
                out = torch.empty(rows, dim, device="cuda", dtype=result_dtype)
                try:
                    return run_plan(lib, fwd, log, kind, threads, a, b, out, rows, dim, stream)
                except RuntimeError as e:
                    raise RuntimeError(f"{name}: {e}") from None
            try:
                errs[name] = (call().double() - ref64).abs().max().item()
            except RuntimeError as e:
                print(f"  skip {name}: {e}")
                continue
            calls[name] = call
        del ref64
        f = (ctypes.c_int64 * 9)()
        out0 = torch.empty(rows, dim, device="cuda", dtype=result_dtype)
        rc = lib.diag_auto_plan(fwd, log, a.data_ptr(), 0 if b is None else b.data_ptr(), out0.data_ptr(), rows, dim, f)
        plan = "?" if rc else (f"{VARIANT_NAMES[f[0]]}, {f[1]} threads, {f[2]} elems a thread, two_pass {f[3]}, "
                               f"one_unit {f[4]}, chunks {f[5]}, group_rows {f[6]}, cluster {f[7]}, packed {f[8]}")
        torch.cuda.synchronize()
        times = time_rounds(calls, args.rounds, args.reps)
        print(f"\n== {op} {direction} {dname} [{rows}, {dim}] ({args.rounds} rounds x {args.reps} calls; us, median of round "
              f"medians) ==\n  dispatcher's plan: {plan}", flush=True)
        base = times["torch.compile"]
        for n in calls:
            err = f"  max|d| {errs[n]:.3g}" if n in errs else ""
            print(row_report(n, times[n], base, "compile") + err, flush=True)
        del a, b, calls, compiled, out0
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
