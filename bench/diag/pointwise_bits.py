"""Dumps fastact's CPU gelu / sigmoid / bias_gelu outputs (forward and backward, every dtype, a few layouts,
1 and 2 threads) on fixed random inputs, or compares such a dump with the current build's outputs bit for bit.

    PYTHONPATH=<checkout> python bench/diag/pointwise_bits.py dump OUT.pt
    PYTHONPATH=<checkout> python bench/diag/pointwise_bits.py compare OUT.pt
"""
import sys

import torch

import fastact  # noqa: F401  (loads the ops)

ops = torch.ops.fastact
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
SPECIAL = [0.0, -0.0, 1e-30, -1e-30, 5.0, -5.0, 10.0, -10.0, 20.0, -20.0, 88.0, -88.0, 100.0, -100.0,
           float("inf"), float("-inf"), float("nan")]


def inputs(dtype, gen):
    n = 5000
    x = torch.randn(n, generator=gen, dtype=torch.float64) * torch.tensor([1.0, 4.0, 20.0]).repeat(n // 3 + 1)[:n]
    x = torch.cat([x, torch.tensor(SPECIAL, dtype=torch.float64)])
    x = x.to(dtype)
    yield "flat", x
    y = x[: 64 * 70].reshape(64, 70)
    yield "rows", y[:, 3:67]       # strided rows
    yield "t", y.t()               # dense, transposed
    yield "odd", x[1:4001]         # misaligned start


def run_all():
    gen = torch.Generator().manual_seed(1234)
    out = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for dtype in DTYPES:
            for layout, x in inputs(dtype, gen):
                dy = torch.randn(x.shape, generator=gen, dtype=torch.float64).to(dtype)
                key = f"{threads}/{dtype}/{layout}"
                for approx in ("none", "tanh"):
                    out[f"{key}/gelu/{approx}"] = ops.gelu(x, approx)
                    out[f"{key}/gelu_backward/{approx}"] = ops.gelu_backward(dy, x, approx)
                    if x.dim() == 2:
                        b = torch.randn(x.shape[-1], generator=gen, dtype=torch.float64).to(dtype)
                        out[f"{key}/bias_gelu/{approx}"] = ops.bias_gelu(x, b, approx)
                        out[f"{key}/bias_gelu_backward/{approx}"] = torch.cat(
                            [t.flatten() for t in ops.bias_gelu_backward(dy, x, b, approx)])
                y = ops.sigmoid(x)
                out[f"{key}/sigmoid"] = y
                out[f"{key}/sigmoid_backward"] = ops.sigmoid_backward(dy, y.clone())
    return out


if __name__ == "__main__":
    mode, path = sys.argv[1], sys.argv[2]
    got = run_all()
    if mode == "dump":
        torch.save(got, path)
        print(f"{len(got)} outputs dumped")
    else:
        want = torch.load(path)
        assert want.keys() == got.keys()
        def bits(t):
            return t.contiguous().view(-1).view(torch.uint8)

        bad = [k for k in want
               if want[k].shape != got[k].shape or want[k].stride() != got[k].stride()
               or not torch.equal(bits(want[k]), bits(got[k]))]
        print(f"{len(want)} outputs compared, {len(bad)} differ")
        for k in bad[:20]:
            print("  differs:", k)
        sys.exit(1 if bad else 0)
