"""Smoke test of an installed fastact: it imports, it is the copy expected, and each op on the CPU
agrees with torch on a float64 reference, forward and backward.

    python scripts/smoke_test.py [--expect-under DIR]

Run it from outside the checkout (or with the install first on sys.path) so that `import fastact`
finds the installed package; --expect-under fails the run when fastact was imported from elsewhere.
scripts/check_sdist.sh runs it on a wheel built from the sdist.
"""

import argparse
import importlib.metadata
import os
import sys

import torch
import torch.nn.functional as F


def check(name, got, ref, dtype):
    # float32 results against the float64 reference, within torch's default float32 tolerance.
    torch.testing.assert_close(got, ref.to(dtype), msg=lambda m: f"{name}: {m}")
    print(f"  {name}: ok (max abs error {(got.double() - ref).abs().max().item():.2e})")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--expect-under", metavar="DIR", help="fail unless fastact is imported from under DIR")
    args = p.parse_args()

    import fastact

    where = os.path.realpath(fastact.__file__)
    print(f"fastact {fastact.__version__} from {where}; torch {torch.__version__}")
    if args.expect_under and not where.startswith(os.path.realpath(args.expect_under) + os.sep):
        sys.exit(f"smoke test: fastact was imported from {where}, not from under {args.expect_under}")
    installed = importlib.metadata.version("fastact")
    if installed != fastact.__version__:
        sys.exit(f"smoke test: installed metadata says {installed}, fastact.__version__ {fastact.__version__}")

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 1000, generator=gen) * 4  # rows longer than one SIMD vector, with a tail
    bias = torch.randn(1000, generator=gen)
    x64, bias64 = x.double(), bias.double()
    for dim in (-1, 0):
        check(f"softmax dim={dim}", fastact.softmax(x, dim), torch.softmax(x64, dim), x.dtype)
        check(f"log_softmax dim={dim}", fastact.log_softmax(x, dim), torch.log_softmax(x64, dim), x.dtype)
    for approximate in ("none", "tanh"):
        check(f"gelu {approximate}", fastact.gelu(x, approximate), F.gelu(x64, approximate=approximate), x.dtype)
    check("bias_gelu", fastact.bias_gelu(x, bias), F.gelu(x64 + bias64, approximate="tanh"), x.dtype)
    check("sigmoid", fastact.sigmoid(x), torch.sigmoid(x64), x.dtype)

    # Backward through autograd: the registered backward ops.
    dy = torch.randn(x.shape, generator=gen)
    xg = x.clone().requires_grad_()
    fastact.softmax(xg, -1).backward(dy)
    xr = x64.clone().requires_grad_()
    torch.softmax(xr, -1).backward(dy.double())
    check("softmax backward", xg.grad, xr.grad, x.dtype)
    xg = x.clone().requires_grad_()
    fastact.gelu(xg).backward(dy)
    xr = x64.clone().requires_grad_()
    F.gelu(xr).backward(dy.double())
    check("gelu backward", xg.grad, xr.grad, x.dtype)
    print("smoke test: ok")


if __name__ == "__main__":
    main()
