"""How close streams come to the report's limit at each tensor size (diagnostic, not part of the library):
stream_size.cu's copy kernels, torch's copy_, and fastact's 16-bit elementwise ops, on bf16 tensors of 64 MB to
512 MB, in one process. It says whether a cell below its bar at a size other than the limit's 256 MB has room.

    python3 bench/diag/stream_size.py [--build DIR] [--sizes 64,128,256,512] [--rounds 5] [--reps 30]

Builds DIR/libstreamsize.so with nvcc unless it is there (it needs no torch: it can be built on another machine and
carried). The limit is the report's (fastact.bench.measure_limit: the better of torch's copy_ and torch.mul of 256 MB
float32 tensors). For each size, rows: torch's copy_, each copy kind, and fastact.sigmoid, gelu (tanh) and bias_gelu
(rows of 4096, the bias added) where fastact is installed; CUDA events around each of `reps` back-to-back calls after
warm-up, the median; rounds interleave the rows in a rotated order. Prints each row's median over rounds, its
bandwidth (bytes read + written) and its fraction of the limit. Every copy kind's output is checked bitwise against
the input.
"""
import argparse
import ctypes
import statistics
import subprocess
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
KINDS = ["copy 1 x 16 B a thread", "copy 4 x 16 B a thread", "copy 4 x 16 B, persistent grid",
         "copy 4 x 16 B, streaming hints", "copy 8 x 16 B, 512 threads"]
MB = 1 << 20


def time_row(call, reps, warmup=3):
    """Median microseconds of `reps` back-to-back calls, each bracketed by CUDA events, after warm-up."""
    for _ in range(warmup):
        call()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in events:
        s.record()
        call()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in events)


def time_rounds(calls, rounds, reps):
    """{name: [time_row of calls[name], one a round]}: rounds interleave the rows, in an order rotated by one each
    round, so that no row always runs first or after the same neighbour."""
    names = list(calls)
    times = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            times[n].append(time_row(calls[n], reps))
    return times


def load(folder):
    so = Path(folder) / "libstreamsize.so"
    if not so.exists():
        so.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["nvcc", "-std=c++17", "-O3", "-arch=sm_90", "-Xcompiler", "-fPIC", "-shared", "-o", str(so),
                        str(ROOT / "bench/diag/stream_size.cu")], check=True)
    lib = ctypes.CDLL(str(so))
    lib.diag_copy.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    return lib


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="/tmp/streamsize")
    ap.add_argument("--sizes", default="64,128,256,512", help="MB of each bf16 tensor")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    lib = load(args.build)
    stream = torch.cuda.current_stream().cuda_stream
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    try:
        import fastact
        from fastact.bench import measure_limit
        limit = measure_limit("cuda")["limit_gbps"]
    except ImportError:
        fastact = None  # the same limit, torch's copy_ alone
        src = torch.randn(64 * MB, device="cuda")
        dst = torch.empty_like(src)
        t = statistics.median(time_rounds({"copy": lambda: dst.copy_(src)}, 3, args.reps)["copy"])
        limit = 2 * src.numel() * 4 / (t * 1e-6) / 1e9
    print(f"limit {limit:.1f} GB/s", flush=True)
    for size in (int(s) for s in args.sizes.split(",")):
        n = size * MB // 2  # bf16 elements
        x = torch.randn(n // 4096, 4096, device="cuda").to(torch.bfloat16)
        y = torch.empty_like(x)
        bias = torch.randn(4096, device="cuda").to(torch.bfloat16)
        n16 = x.numel() * 2 // 16
        calls = {"torch copy_": lambda: y.copy_(x)}

        def kind_call(k):
            def call():
                assert lib.diag_copy(k, x.data_ptr(), y.data_ptr(), n16, stream) == 0, KINDS[k]
            return call

        for k, name in enumerate(KINDS):
            y.fill_(float("nan"))
            kind_call(k)()
            torch.cuda.synchronize()
            assert torch.equal(y.view(torch.int16), x.view(torch.int16)), f"{name}: the copy differs"
            calls[name] = kind_call(k)
        if fastact is not None:
            calls["fastact.sigmoid"] = lambda: fastact.sigmoid(x)
            calls["fastact.gelu tanh"] = lambda: fastact.gelu(x, approximate="tanh")
            calls["fastact.bias_gelu"] = lambda: fastact.bias_gelu(x, bias)
        times = time_rounds(calls, args.rounds, args.reps)
        moved = 2 * x.numel() * 2
        print(f"== bf16 [{x.shape[0]}, 4096], {size} MB a tensor, {moved / 1e6:.0f} MB moved ==", flush=True)
        for name, samples in times.items():
            t = statistics.median(samples)
            gbps = moved / (t * 1e-6) / 1e9
            print(f"  {name:34s} {t:9.2f} us  {gbps:8.1f} GB/s  {gbps / limit:.3f} of the limit", flush=True)


if __name__ == "__main__":
    main()
