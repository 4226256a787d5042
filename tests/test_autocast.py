"""torch.autocast: fastact's ops give torch's output dtypes and values under autocast, on every device.

torch's autocast lists: on CUDA softmax and log_softmax run in float32 (a float16 or bfloat16 input
gives a float32 output unless dtype= says otherwise); gelu, bias_gelu and sigmoid are on no list and
keep their input's dtype. On the CPU none of them is on a list. fastact's CUDA softmax fuses that
cast into its kernel (csrc/autocast.cpp); these tests hold it to torch's dtypes, values and gradients,
eager and under torch.compile."""

import pytest
import torch

import fastact
from fastact_testing import ALL_OPS, assert_close, bias_for, coarsest, dtype_id, make_tensor

AMP_DTYPES = [torch.float16, torch.bfloat16]
X_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def _double(kw):
    return {k: (v.double() if torch.is_tensor(v) else v) for k, v in kw.items()}


@pytest.mark.parametrize("amp", AMP_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("x_dtype", X_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("op", ALL_OPS, ids=str)
def test_autocast_matches_torch(device, op, x_dtype, amp):
    """Output dtype as torch's under autocast, values against float64 (torch's own error bounds the
    tolerance), the gradient in the input's dtype against float64 autograd; an explicit dtype= wins."""
    for shape, dim in (((6, 300), -1), ((4, 33, 6), 1)):
        x = make_tensor(shape, x_dtype, device)
        kw = dict(dim=dim) if op.takes_dim else {}
        if op.takes_bias:
            kw["bias"] = bias_for(x)
        xa, xt = x.clone().requires_grad_(), x.clone().requires_grad_()
        with torch.autocast(device, dtype=amp):
            y, yt = op.fastact(xa, **kw), op.torch(xt, **kw)
        msg = f"{op} {shape} {dtype_id(x_dtype)} under autocast({device}, {dtype_id(amp)})"
        assert y.dtype == yt.dtype, f"{msg}: {y.dtype}, torch gives {yt.dtype}"
        assert_close(y, op.torch(x.double(), **_double(kw)), torch_actual=yt, msg=msg)

        g = make_tensor(shape, y.dtype, device)
        y.backward(g)
        yt.backward(g)
        assert xa.grad.dtype == xt.grad.dtype == x_dtype, msg
        xr = x.double().requires_grad_()
        (want,) = torch.autograd.grad(op.torch(xr, **_double(kw)), xr, g.double())
        assert_close(xa.grad, want, coarsest(x_dtype, y.dtype), torch_actual=xt.grad, msg=f"{msg}: grad")

        if op.takes_dim and x_dtype in AMP_DTYPES:
            with torch.autocast(device, dtype=amp):
                y, yt = op.fastact(x, dim=dim, dtype=x_dtype), op.torch(x, dim=dim, dtype=x_dtype)
            assert y.dtype == yt.dtype == x_dtype, msg


def _model(x, b):
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        h = x @ x.transpose(-1, -2)  # bfloat16 under autocast
        return fastact.softmax(h, -1), fastact.log_softmax(h, 0), fastact.gelu(h), fastact.bias_gelu(h, b)


def test_autocast_compile(device):
    """Autocast inside a torch.compile(fullgraph=True) region: the same dtypes and values as eager."""
    x = make_tensor((8, 24), torch.float32, device)
    b = make_tensor((8,), torch.bfloat16, device)
    torch._dynamo.reset()
    compiled = torch.compile(_model, backend="aot_eager", fullgraph=True)
    for c, e in zip(compiled(x, b), _model(x, b)):
        assert c.dtype == e.dtype, (c.dtype, e.dtype)
        assert_close(c, e, msg=f"compiled under autocast, {c.dtype}")
    torch._dynamo.reset()
