"""Each pointwise op of the C++ op table (gelu erf / tanh, sigmoid, silu), forward and backward, on CUDA against the
copy limit: GB/s (bytes read + written) over the better of y.copy_(x) and torch.mul(x, 2, out=y) on the same
bytes, with torch's own op beside it. 256 MB per operand by default (far beyond L2), every dtype.

    PYTHONPATH=<checkout> python bench/diag/pointwise_cuda_limit.py [MB]
"""
import sys

import torch
import torch.nn.functional as F

import fastact  # noqa: F401  (loads the ops)

ops = torch.ops.fastact
aten = torch.ops.aten


def time_us(fn, reps=50):
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(5):
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / reps)
    return best


def main():
    mb = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    print(torch.cuda.get_device_name())
    print(f"{'op':22} {'dtype':9} {'fastact us':>10} {'of limit':>8} {'torch us':>9} {'of limit':>8}")
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        n = mb * 2**20 // torch.tensor([], dtype=dtype).element_size()
        x = torch.randn(n, device="cuda", dtype=dtype) * 3
        dy = torch.randn_like(x)
        y = torch.empty_like(x)
        copy = min(time_us(lambda: y.copy_(x)), time_us(lambda: torch.mul(x, 2, out=y)))
        sy = torch.sigmoid(x)
        cases = [
            ("gelu", lambda: ops.gelu(x, "none"), lambda: F.gelu(x), 2),
            ("gelu tanh", lambda: ops.gelu(x, "tanh"), lambda: F.gelu(x, approximate="tanh"), 2),
            ("sigmoid", lambda: ops.sigmoid(x), lambda: torch.sigmoid(x), 2),
            ("silu", lambda: ops.silu(x), lambda: F.silu(x), 2),
            ("gelu_backward", lambda: ops.gelu_backward(dy, x, "none"), lambda: aten.gelu_backward(dy, x), 3),
            ("gelu_backward tanh", lambda: ops.gelu_backward(dy, x, "tanh"),
             lambda: aten.gelu_backward(dy, x, approximate="tanh"), 3),
            ("sigmoid_backward", lambda: ops.sigmoid_backward(dy, sy), lambda: aten.sigmoid_backward(dy, sy), 3),
            ("silu_backward", lambda: ops.silu_backward(dy, x), lambda: aten.silu_backward(dy, x), 3),
        ]
        for name, mine, theirs, operands in cases:
            t_mine, t_torch = time_us(mine), time_us(theirs)
            # The copy moves 2 operands' bytes; an op of k operands moves k / 2 times that.
            limit = copy * operands / 2
            print(f"{name:22} {str(dtype)[6:]:9} {t_mine:10.1f} {limit / t_mine:8.3f} {t_torch:9.1f} {limit / t_torch:8.3f}")


if __name__ == "__main__":
    main()
