"""Times elementwise_rows_diag.cu's launch shapes of the elementwise rows kernel against torch.compile and torch on
chunk views, in one process (diagnostic, not part of the library; bench/NOTES.md, forty-ninth session).

    python3 bench/repro/elementwise_rows_diag.py [--rounds 7] [--reps 40] [--build DIR] [--ops 0,3,4,6] [--dtypes 0,2]

Builds one shared library per op asked for (OPS below) with nvcc into DIR (in parallel) unless it is there. For each
op and dtype (0 bf16, 1 f16: x = base[:, 4096:] of a [32768, 8192] randn base, as the report's chunk-view cases;
2 float32: [16384, 8192]) it times torch, torch.compile and every variant: CUDA events around each of `reps`
back-to-back calls after warm-up, the median; rounds interleave the rows, in a rotated order each round. Prints each
row's median over rounds and its ratio to torch.compile's time, and checks every variant's output bitwise against
the library launcher's and against torch's (max |diff|).
"""
import argparse
import ctypes
from pathlib import Path

import torch
import torch.nn.functional as F

from elementwise16_diag import build, row_report, time_rounds  # this folder's (the script's own folder leads sys.path)

OPS = ["gelu_tanh fwd", "sigmoid fwd", "gelu fwd", "gelu_tanh bwd", "gelu bwd", "sigmoid bwd (y strided)",
       "bias_gelu erf fwd", "bias_gelu tanh fwd"]


def torch_fn(op):
    """torch's op as a function of (in0, in1), the operands in the library's order."""
    return [
        lambda x, _: F.gelu(x, approximate="tanh"),
        lambda x, _: torch.sigmoid(x),
        lambda x, _: F.gelu(x),
        lambda dy, x: torch.ops.aten.gelu_backward(dy, x, approximate="tanh"),
        lambda dy, x: torch.ops.aten.gelu_backward(dy, x),
        lambda dy, y: torch.ops.aten.sigmoid_backward(dy, y),
        lambda x, b: F.gelu(x + b),
        lambda x, b: F.gelu(x + b, approximate="tanh"),
    ][op]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--build", default="/tmp/eltrows")
    ap.add_argument("--dtypes", default="0,2")
    ap.add_argument("--ops", default="0,1,2,3,4,6,7")
    args = ap.parse_args()
    folder = Path(args.build)
    ops = [int(o) for o in args.ops.split(",")]
    build(folder, ops, source="elementwise_rows_diag", lib_prefix="libeltrows", ptxas=True)
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    torch.manual_seed(0)
    for op in ops:
        lib = ctypes.CDLL(str(folder / f"libeltrows_{op}.so"))
        launch = getattr(lib, f"diag_launch_{op}")
        launch.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                           ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
        name_of = getattr(lib, f"diag_variant_name_{op}")
        name_of.restype = ctypes.c_char_p
        variants = getattr(lib, f"diag_variants_{op}")()
        for dt_i, dtype in enumerate((torch.bfloat16, torch.float16, torch.float32)):
            if str(dt_i) not in args.dtypes.split(","):
                continue
            rows, h = (32768 if dt_i < 2 else 16384), 4096
            x = torch.randn(rows, 2 * h, device="cuda", dtype=dtype)[:, h:]
            if op < 3:
                in0, in1 = x, None
            elif op < 5:
                in0, in1 = torch.randn(rows, h, device="cuda", dtype=dtype), x
            elif op == 5:
                in0, in1 = torch.randn(rows, h, device="cuda", dtype=dtype), torch.sigmoid(x.float()).to(dtype)
                in1 = torch.empty(rows, 2 * h, device="cuda", dtype=dtype)[:, h:].copy_(in1)
            else:
                in0, in1 = x, torch.randn(h, device="cuda", dtype=dtype)
            stride1 = 0 if in1 is None or in1.dim() == 1 else in1.stride(0)  # none, or the bias
            fn = torch_fn(op)
            compiled = torch.compile(fn, dynamic=False)
            ref = fn(in0, in1)
            rows_ = {"torch": lambda: fn(in0, in1), "torch.compile": lambda: compiled(in0, in1),
                     "torch.compile (again)": lambda: compiled(in0, in1)}
            stream = torch.cuda.current_stream().cuda_stream
            outs = {}
            for v in range(variants):
                def call(v=v, stream=stream):
                    out = torch.empty(rows, h, device="cuda", dtype=dtype)
                    rc = launch(dt_i, v, in0.data_ptr(), in0.stride(0), 0 if in1 is None else in1.data_ptr(),
                                stride1, out.data_ptr(), rows, h, stream)
                    if rc != 0:
                        raise RuntimeError(f"variant {v}: CUDA error {rc}")
                    return out

                outs[v] = call()
                rows_[name_of(v).decode()] = call
            torch.cuda.synchronize()
            checks = {}
            for v, out in outs.items():
                diff = (out.float() - ref.float()).abs()
                checks[name_of(v).decode()] = (diff.max().item(), bool(torch.equal(out, outs[0])))
            names = list(rows_)
            times = time_rounds(rows_, args.rounds, args.reps)
            print(f"\n== {OPS[op]} {str(dtype).replace('torch.', '')} [{rows}, {h}] of {2 * h} ({args.rounds} rounds x "
                  f"{args.reps} calls; us, median of round medians) ==", flush=True)
            base = times["torch.compile"]
            for n in names:
                chk = "" if n not in checks else f"  max|d| {checks[n][0]:.3g} same-as-lib {checks[n][1]}"
                print(row_report(n, times[n], base, "compile", width=40) + chk, flush=True)
            del x, in0, in1, ref, outs, rows_, compiled
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
