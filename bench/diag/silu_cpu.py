"""fastact's CPU silu (forward and backward) against torch's, 4M elements, float32 and bfloat16, at 1 and 2
threads, timed with torch.utils.benchmark: the median of blocked_autorange, the best of ROUNDS rounds that alternate
the two (on a shared machine the best round is the one least disturbed).

    PYTHONPATH=<checkout> python bench/diag/silu_cpu.py
"""
import torch
import torch.utils.benchmark as benchmark

import fastact  # noqa: F401  (loads the ops)
from fastact import _C

N = 4 * 1024 * 1024
ROUNDS = 5


def median_us(stmt, glob, threads):
    t = benchmark.Timer(stmt=stmt, globals=glob, num_threads=threads)
    return t.blocked_autorange(min_run_time=0.5).median * 1e6


def main():
    print(f"{'dtype':9} {'threads':>7} {'op':9} {'torch us':>9} {'fastact us':>10} {'torch/fastact':>13}")
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(N, dtype=dtype) * 4
        dy = torch.randn(N, dtype=dtype)
        glob = {"x": x, "dy": dy, "F": torch.nn.functional, "_C": _C, "ops": torch.ops.fastact, "aten": torch.ops.aten}
        for threads in (1, 2):
            for name, mine, theirs in (
                ("forward", "_C.silu(x)", "F.silu(x)"),
                ("backward", "ops.silu_backward(dy, x)", "aten.silu_backward(dy, x)"),
            ):
                t_torch = t_mine = float("inf")
                for _ in range(ROUNDS):
                    t_torch = min(t_torch, median_us(theirs, glob, threads))
                    t_mine = min(t_mine, median_us(mine, glob, threads))
                print(f"{str(dtype)[6:]:9} {threads:7d} {name:9} {t_torch:9.1f} {t_mine:10.1f} {t_torch / t_mine:13.2f}")


if __name__ == "__main__":
    main()
