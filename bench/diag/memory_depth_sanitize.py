"""A small run of the kernels the deep memory class adds (include/fastact/memory_depth.cuh), for compute-sanitizer:
the 16-bit softmax / log_softmax vec backward one unit a thread (rows of 896-4096) and the deep elementwise shapes
(tile edges), each checked loosely against float64 torch. scripts/sanitize.sh runs the device's own class; this puts
the other class under the sanitizer (the deep one on an H100, the standard one with FASTACT_MEMORY_DEPTH=standard on
an H200).

    FASTACT_MEMORY_DEPTH=deep compute-sanitizer --tool memcheck python3 bench/diag/memory_depth_sanitize.py
"""
import torch, fastact
import torch.nn.functional as F
torch.manual_seed(0)
for dt in (torch.float16, torch.bfloat16, torch.float32):
    for d in (896, 1024, 4096):
        x = torch.randn(5, d, device="cuda", dtype=dt)
        g = torch.randn_like(x)
        for name in ("softmax", "log_softmax"):
            y = getattr(fastact, name)(x, -1)
            dx = getattr(torch.ops.fastact, name + "_backward")(g, y, -1, dt)
            ref = getattr(torch.ops.aten, "_" + name + "_backward_data")(g.double(), y.double(), -1, torch.float64)
            assert (dx.double() - ref).abs().max() < 0.05, (name, dt, d)
    for n in (4097, 3 * 4096 + 5):
        x = torch.randn(n, device="cuda", dtype=dt)
        g = torch.randn_like(x)
        for a in ("none", "tanh"):
            assert torch.allclose(fastact.gelu(x, a).double(), F.gelu(x.double(), approximate=a), atol=2e-2)
            assert torch.allclose(torch.ops.fastact.gelu_backward(g, x, a).double(), torch.ops.aten.gelu_backward(g.double(), x.double(), approximate=a), atol=5e-2)
        y = fastact.sigmoid(x)
        assert torch.allclose(y.double(), torch.sigmoid(x.double()), atol=1e-2)
        assert torch.allclose(torch.ops.fastact.sigmoid_backward(g, y).double(), torch.ops.aten.sigmoid_backward(g.double(), y.double()), atol=1e-2)
torch.cuda.synchronize()
print("san_deep: all ran")
