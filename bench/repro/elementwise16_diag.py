"""Times elementwise16_diag.cu's variants of the 16-bit elementwise kernels against torch's own ops in one
process (diagnostic, not part of the library; bench/NOTES.md, thirty-ninth session).

    python3 bench/repro/elementwise16_diag.py [--rounds 7] [--reps 60] [--build DIR] [--ops 6,7,8] [--dtypes 0,1]

Builds one shared library per op asked for (ops: OPS below; 6-8 the 16-bit math forms the library runs on 16-bit
tensors, forty-sixth session) with nvcc into DIR (in parallel) unless they are there, then for each op and
dtype (0 bf16, 1 f16: [32768, 4096]; 2 float32: [16384, 4096]; 256 MB, randn inputs) times torch's op and every variant: CUDA events around each
of `reps` back-to-back calls after warm-up, the median; rounds interleave the rows, in a rotated order each
round. Prints each row's median over rounds, its ratio to torch's time per round and how many rounds it was
behind, and checks every variant's output against torch's (max |diff| and differing elements) and bitwise
against the library launcher's.
"""
import argparse
import ctypes
import statistics
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
OPS = ["gelu_tanh fwd", "sigmoid fwd", "gelu fwd", "gelu_tanh bwd", "gelu bwd", "sigmoid bwd", "gelu16 fwd",
       "gelu16 bwd", "sigmoid16 fwd"]


def build(folder, ops, source="elementwise16_diag", lib_prefix="libelt16", ptxas=False, macro="DIAG_OP"):
    """One shared library a value of `macro` (DIAG_OP) of bench/repro/<source>.cu, <lib_prefix>_<op>.so in folder,
    built by nvcc in parallel unless it is there; ptxas: each build's `-Xptxas -v` report into folder/ptxas_<op>.txt."""
    folder.mkdir(parents=True, exist_ok=True)
    procs = []
    for op in ops:
        lib = folder / f"{lib_prefix}_{op}.so"
        if lib.exists():
            continue
        cmd = ["nvcc", "-std=c++17", "-O3", "-arch=sm_90", "--expt-relaxed-constexpr", f"-I{ROOT / 'include'}",
               "-Xcompiler", "-fPIC", "-shared", *(["-Xptxas", "-v"] if ptxas else []), f"-D{macro}={op}", "-o",
               str(lib), str(ROOT / f"bench/repro/{source}.cu")]
        procs.append(subprocess.Popen(cmd, stderr=open(folder / f"ptxas_{op}.txt", "w") if ptxas else None))
    if any(p.wait() != 0 for p in procs):
        sys.exit("nvcc failed")


def torch_call(op, x, dy, y):
    return [
        lambda: F.gelu(x, approximate="tanh"),
        lambda: torch.sigmoid(x),
        lambda: F.gelu(x),
        lambda: torch.ops.aten.gelu_backward(dy, x, approximate="tanh"),
        lambda: torch.ops.aten.gelu_backward(dy, x),
        lambda: torch.ops.aten.sigmoid_backward(dy, y),
        lambda: F.gelu(x),
        lambda: torch.ops.aten.gelu_backward(dy, x),
        lambda: torch.sigmoid(x),
    ][op]


def time_row(call, reps, warmup=3):
    for _ in range(warmup):
        call()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in events:
        s.record()
        call()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in events)  # us


def time_rounds(calls, rounds, reps):
    """{name: [time_row of calls[name], one a round]}: rounds interleave the rows, in an order rotated by one each
    round, so that no row always runs first or after the same neighbour."""
    names = list(calls)
    times = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            times[n].append(time_row(calls[n], reps))
    return times


def row_report(name, samples, base, base_name, width=34, behind=False):
    """One row of a diag's table: the median of the row's round medians, its ratio to the base row's per round
    (median, [min, max]) and, with behind, the rounds it was slower than the base."""
    ratios = [t / b for t, b in zip(samples, base)]
    line = (f"  {name:{width}s} {statistics.median(samples):8.2f}  /{base_name} {statistics.median(ratios):.4f} "
            f"[{min(ratios):.4f}, {max(ratios):.4f}]")
    return line + (f" behind {sum(x > 1 for x in ratios)}/{len(ratios)}" if behind else "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--build", default="/tmp/elt16")
    ap.add_argument("--dtypes", default="0,1,2")
    ap.add_argument("--ops", default=",".join(str(i) for i in range(len(OPS))))
    args = ap.parse_args()
    folder = Path(args.build)
    build(folder, [int(o) for o in args.ops.split(",")])
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    torch.manual_seed(0)
    for op in (int(o) for o in args.ops.split(",")):
        lib = ctypes.CDLL(str(folder / f"libelt16_{op}.so"))
        launch = getattr(lib, f"diag_launch_{op}")
        launch.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                           ctypes.c_int64, ctypes.c_void_p]
        name_of = getattr(lib, f"diag_variant_name_{op}")
        name_of.restype = ctypes.c_char_p
        variants = getattr(lib, f"diag_variants_{op}")()
        for dt_i, dtype in enumerate((torch.bfloat16, torch.float16, torch.float32)):
            if str(dt_i) not in args.dtypes.split(","):
                continue
            x = torch.randn(32768 if dt_i < 2 else 16384, 4096, device="cuda", dtype=dtype)
            dy = torch.randn_like(x)
            y = torch.sigmoid(x)
            ref = torch_call(op, x, dy, y)()
            in0, in1 = (x, None) if op in (0, 1, 2, 6, 8) else (dy, y if op == 5 else x)
            outs = {}
            # torch twice: the second row is the noise floor of a ratio between two rows of the same kernel.
            rows = {"torch": torch_call(op, x, dy, y), "torch (again)": torch_call(op, x, dy, y)}
            stream = torch.cuda.current_stream().cuda_stream
            for v in range(variants):
                # Each call writes a fresh torch.empty_like(x), as torch's op and fastact's do: the caching
                # allocator hands every row the same block, so no row gains or loses by where its output
                # lies relative to x (a fixed output a row was worth +-0.3% in the first runs).
                def call(v=v, stream=stream):
                    out = torch.empty_like(x)
                    rc = launch(dt_i, v, in0.data_ptr(), 0 if in1 is None else in1.data_ptr(), out.data_ptr(),
                                x.numel(), stream)
                    if rc != 0:
                        raise RuntimeError(f"variant {v}: CUDA error {rc}")
                    return out

                outs[v] = call()
                rows[name_of(v).decode()] = call
                if v == 0:
                    rows["library launcher (again)"] = call
            torch.cuda.synchronize()
            checks = {}
            for v, out in outs.items():
                diff = (out.float() - ref.float()).abs()
                checks[name_of(v).decode()] = (diff.max().item(), int((out != ref).sum().item()),
                                               bool(torch.equal(out, outs[0])))
            names = list(rows)
            times = time_rounds(rows, args.rounds, args.reps)
            print(f"\n== {OPS[op]} {str(dtype).replace('torch.', '')} {list(x.shape)} ({args.rounds} rounds x "
                  f"{args.reps} calls; us, median of round medians) ==", flush=True)
            base = times["torch"]
            for n in names:
                chk = "" if n not in checks else (
                    f"  max|d| {checks[n][0]:.3g} differing {checks[n][1]} same-as-lib {checks[n][2]}")
                print(row_report(n, times[n], base, "torch", behind=True) + chk, flush=True)
            del x, dy, y, ref, outs, rows
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
