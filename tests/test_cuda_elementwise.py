"""CUDA only, the elementwise ops: the 16-bit math forms on every one of the 65536 inputs, and bias_gelu's backward
over more tiles of rows than one pass of blocks takes. Their other CUDA tests: the device-parametrised files
(test_ops.py and the rest), and test_cuda_memory.py (memory-depth classes, allocation, tensors beyond 2^31
elements)."""

import math

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import fastact  # noqa: E402
from fastact_testing import assert_close, bias_for, describe, dtype_id, make_tensor, poison_allocator  # noqa: E402

pytestmark = pytest.mark.cuda
ops = torch.ops.fastact


def _ordered_bits(t):
    """A 16-bit tensor's bit patterns as integers in the order of the values (+0 and -0 both 0), so that the
    difference of two is their distance in units in the last place."""
    i = t.view(torch.int16).to(torch.int32)
    return torch.where(i < 0, -(i & 0x7FFF), i)


def _silu_derivative(x64):
    s = torch.sigmoid(x64)
    return s * (1 + x64 * (1 - s))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
def test_elementwise_16bit_math_every_input(dtype):
    """The 16-bit forms of the erf GELU, the sigmoid and SiLU (math.h GeluErf16, Sigmoid16, Silu16, which the launchers
    take for 16-bit tensors) on every one of the 65536 inputs, against the float64 formulas rounded once: the forwards
    within one unit in the last place (faithful), the erf GELU's and SiLU's derivatives (dy = 1) within two; NaN and infinities where
    the float64 formulas have them. The float64 GELU is x Phi(x), Phi = erfc(-x / sqrt 2) / 2, accurate in the
    negative tail where 0.5 x (1 + erf(x / sqrt 2)) cancels to 0, and subnormal results count like the others."""
    x = torch.arange(-32768, 32768, dtype=torch.int32, device="cuda").to(torch.int16).view(dtype)
    x64 = x.double()
    ndtr = 0.5 * torch.special.erfc(-x64 / math.sqrt(2))  # torch.special.ndtr cancels to 0 below x ~ -8 on CUDA
    density = torch.exp(-0.5 * x64 * x64) / math.sqrt(2 * math.pi)
    dy = torch.ones_like(x)  # before the poisoning, so that the output, not dy, takes the poisoned block
    cases = {
        "gelu": (lambda: fastact.gelu(x), x64 * ndtr, 1),
        "sigmoid": (lambda: fastact.sigmoid(x), torch.sigmoid(x64), 1),
        "gelu_backward": (lambda: ops.gelu_backward(dy, x, "none"), ndtr + x64 * density, 2),
        "silu": (lambda: fastact.silu(x), x64 * torch.sigmoid(x64), 1),
        "silu_backward": (lambda: ops.silu_backward(dy, x), _silu_derivative(x64), 2),
    }
    for name, (call, ref64, max_ulp) in cases.items():
        poison_allocator("cuda", x.numel() * x.element_size())
        got = call()
        want = ref64.to(dtype)
        nan = want.isnan()
        assert torch.equal(got.isnan(), nan), f"{name}: NaN at {got.isnan().sum()} inputs, want {nan.sum()}"
        if not name.endswith("_backward"):  # the forwards' zeros carry the reference's sign (-0 in gelu's tail)
            assert torch.equal(got.signbit()[~nan], want.signbit()[~nan]), f"{name}: signs differ"
        ulp = (_ordered_bits(got) - _ordered_bits(want)).abs()[~nan]
        worst = int(ulp.argmax())
        assert int(ulp.max()) <= max_ulp, (
            f"{name} {dtype}: {int((ulp > max_ulp).sum())} input(s) over {max_ulp} ulp; worst at x = "
            f"{x[~nan][worst].item()!r}: {got[~nan][worst].item()!r}, want {want[~nan][worst].item()!r} "
            f"({int(ulp.max())} ulp)")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize(
    "shape",
    [
        # Past kMaxRowGroups (2048) tiles of rows, so that a block takes several batches one after
        # another (BiasGeluPlan::steps = 2), the last group's last batch short. 256 columns: the
        # 128-bit path (32 rows a batch in every dtype); 33: the element path (120 rows a batch).
        (2048 * 32 + 40, 256),
        (2048 * 120 + 40, 33),
    ],
    ids=str,
)
def test_bias_gelu_backward_tall(dtype, shape):
    x = make_tensor(shape, dtype, "cuda", scale=2.0)
    b = bias_for(x)
    g = make_tensor(shape, dtype, "cuda")
    explain = fastact.explain("bias_gelu_backward", x)
    assert "2 batches a block" in explain, explain
    poison_allocator("cuda", x.numel() * dtype.itemsize, b.numel() * dtype.itemsize)
    dx, db = ops.bias_gelu_backward.default(g, x, b, "tanh")
    z64 = x.double() + b.double()
    dx_ref = torch.ops.aten.gelu_backward(g.double(), z64, approximate="tanh")
    dx_pt = torch.ops.aten.gelu_backward(g, x + b, approximate="tanh")
    msg = f"bias_gelu_backward x: {describe(x)}"
    assert_close(dx, dx_ref, torch_actual=dx_pt, msg=msg + ": dx")
    assert_close(db, dx_ref.sum(0), torch_actual=dx_pt.sum(0), msg=msg + ": dbias")
