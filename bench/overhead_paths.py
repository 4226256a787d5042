"""Where the per-call host time goes on CUDA (docs/performance.md, per-call overhead): fastact's public function,
its torch.ops OpOverload, and the same entries into torch's own kernels. Prints microseconds per call
(best of 15 interleaved rounds of 2000 calls) on an 8x1024 float32 tensor. Run: python bench/overhead_paths.py"""
import torch

import fastact
from fastact.bench import time_per_call

x = torch.randn(8, 1024, device="cuda")
b = torch.randn(1024, device="cuda")
N = 2000


def per_call(fns):
    """Microseconds per call of each fn: fastact.bench's interleaved best-of-rounds host timing."""
    return {name: t * 1e6 for name, t in time_per_call(fns, "cuda", calls=N, rounds=15).items()}


cases = {
    "fastact.softmax(x)": lambda: fastact.softmax(x, -1),
    "fastact._C.softmax (eager entry)": lambda: fastact._C.softmax(x, -1),
    "torch.ops.fastact.softmax.default": lambda: torch.ops.fastact.softmax.default(x, -1, None),
    "torch.ops.fastact.softmax (packet)": lambda: torch.ops.fastact.softmax(x, -1, None),
    "torch.softmax(x)": lambda: torch.softmax(x, -1),
    "torch.ops.aten._softmax.default": lambda: torch.ops.aten._softmax.default(x, -1, False),
    "torch.ops.aten.softmax.int": lambda: torch.ops.aten.softmax.int(x, -1),
    "fastact.gelu(x)": lambda: fastact.gelu(x),
    "torch.ops.fastact.gelu.default": lambda: torch.ops.fastact.gelu.default(x, "none"),
    "F.gelu(x)": lambda: torch.nn.functional.gelu(x),
    "torch.ops.aten.gelu.default": lambda: torch.ops.aten.gelu.default(x),
    "fastact.sigmoid(x)": lambda: fastact.sigmoid(x),
    "torch.sigmoid(x)": lambda: torch.sigmoid(x),
    "torch.ops.aten.sigmoid.default": lambda: torch.ops.aten.sigmoid.default(x),
    "torch.empty_like(x)": lambda: torch.empty_like(x),
    "x.mul(2) (torch elementwise)": lambda: x.mul(2),
}
for name, us in per_call(cases).items():
    print(f"{name:40s} {us:7.2f} us")
some = ("fastact.softmax(x)", "torch.ops.fastact.softmax.default", "torch.softmax(x)", "torch.ops.aten._softmax.default")
with torch.inference_mode():
    print("inference_mode:")
    for name, us in per_call({n: cases[n] for n in some}).items():
        print(f"  {name:38s} {us:7.2f} us")
x.requires_grad_(True)
print("x.requires_grad:")
for name, us in per_call({n: cases[n] for n in ("fastact.softmax(x)", "torch.softmax(x)")}).items():
    print(f"  {name:38s} {us:7.2f} us")
