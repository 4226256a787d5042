"""Where the per-call host time goes on CUDA (bench/NOTES.md, H100 section): fastact's public function,
its torch.ops OpOverload, and the same entries into torch's own kernels. Prints microseconds per call
(best of 5 x 2000 calls) on an 8x1024 float32 tensor. Run: python bench/overhead_paths.py"""
import time
import torch
import fastact

x = torch.randn(8, 1024, device="cuda")
b = torch.randn(1024, device="cuda")
N = 2000


def per_call(fn):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(N):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / N)
    return best * 1e6


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
for name, fn in cases.items():
    print(f"{name:40s} {per_call(fn):7.2f} us")
with torch.inference_mode():
    print("inference_mode:")
    for name in ("fastact.softmax(x)", "torch.ops.fastact.softmax.default", "torch.softmax(x)",
                 "torch.ops.aten._softmax.default"):
        print(f"  {name:38s} {per_call(cases[name]):7.2f} us")
x.requires_grad_(True)
print("x.requires_grad:")
for name in ("fastact.softmax(x)", "torch.softmax(x)"):
    print(f"  {name:38s} {per_call(cases[name]):7.2f} us")
