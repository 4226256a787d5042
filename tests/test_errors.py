"""Bad input gets the error torch gives (RuntimeError, IndexError for a dim), with the op's name in
the message, never a crash; and the next call works."""

import re

import pytest
import torch

import fastact
from fastact_testing import POINTWISE_OPS, make_tensor, random_values

ops = torch.ops.fastact
BAD_DTYPES = [torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool, torch.complex64]


def _bad(dtype, shape, device):
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, device=device)
    if dtype == torch.bool:
        return torch.randn(shape, device=device) > 0
    return torch.randint(1, 100, shape, device=device).to(dtype)


def _follow_up_works(device):
    """After an error the library (and the device) still work."""
    x = make_tensor((4, 37), torch.float32, device)
    torch.testing.assert_close(fastact.softmax(x, -1), torch.softmax(x, -1))
    torch.testing.assert_close(fastact.gelu(x), torch.nn.functional.gelu(x))


def _raises(exc, name, fn):
    """fn() raises `exc` (exactly that kind, or a subclass of it) naming the op `name`."""
    with pytest.raises(exc) as info:
        fn()
    assert re.search(rf"\b{name}\b", str(info.value)), f"message does not name {name!r}: {info.value}"
    return info.value


@pytest.mark.parametrize("bad", BAD_DTYPES, ids=str)
def test_bad_dtype_public_ops(device, bad):
    x = _bad(bad, (3, 5), device)
    _raises(RuntimeError, "softmax", lambda: fastact.softmax(x, -1))
    _raises(RuntimeError, "log_softmax", lambda: fastact.log_softmax(x, 0))
    for op in POINTWISE_OPS:
        # sigmoid computes integer and bool inputs in the default dtype, as torch does (test_ops)
        if bad.is_complex or not op.row.integral_to_default:
            _raises(RuntimeError, op.name, lambda: op.fastact(x))
    _raises(RuntimeError, "bias_gelu", lambda: fastact.bias_gelu(x, _bad(bad, (5,), device)))
    f = make_tensor((3, 5), torch.float32, device)
    # a float x with a bias of a bad dtype, and the reverse
    _raises(RuntimeError, "bias_gelu", lambda: fastact.bias_gelu(f, _bad(bad, (5,), device)))
    _raises(RuntimeError, "bias_gelu", lambda: fastact.bias_gelu(x, random_values((5,), torch.float32, device)))
    _follow_up_works(device)


@pytest.mark.parametrize("bad", BAD_DTYPES, ids=str)
def test_bad_dtype_backward_ops(device, bad):
    f = make_tensor((3, 5), torch.float32, device)
    y = torch.softmax(f, -1)
    x = _bad(bad, (3, 5), device)
    _raises(RuntimeError, "softmax_backward", lambda: ops.softmax_backward(x, y, -1, torch.float32))
    _raises(RuntimeError, "softmax_backward", lambda: ops.softmax_backward(f, x, -1, torch.float32))
    _raises(RuntimeError, "log_softmax_backward", lambda: ops.log_softmax_backward(x, x, -1, torch.float32))
    for op in POINTWISE_OPS:
        bwd, v = getattr(ops, op.row.backward), tuple(op.params.values())
        saved = y if op.row.saves == "output" else f
        _raises(RuntimeError, op.row.backward, lambda: bwd(x, saved, *v))
        _raises(RuntimeError, op.row.backward, lambda: bwd(f, x, *v))
    b = random_values((5,), torch.float32, device)
    _raises(RuntimeError, "bias_gelu_backward", lambda: ops.bias_gelu_backward(x, f, b))
    _raises(RuntimeError, "bias_gelu_backward", lambda: ops.bias_gelu_backward(f, x, b))
    if not bad.is_complex:
        # integer/bool input_dtype of a softmax backward
        _raises(RuntimeError, "softmax_backward", lambda: ops.softmax_backward(f, y, -1, bad))
        _raises(RuntimeError, "log_softmax_backward", lambda: ops.log_softmax_backward(f, y, -1, bad))
    _follow_up_works(device)


@pytest.mark.parametrize("bad", [torch.int64, torch.bool, torch.complex64], ids=str)
def test_bad_output_dtype_argument(device, bad):
    x = make_tensor((3, 5), torch.float32, device)
    _raises(RuntimeError, "softmax", lambda: fastact.softmax(x, -1, dtype=bad))
    _raises(RuntimeError, "log_softmax", lambda: fastact.log_softmax(x, -1, dtype=bad))
    # torch raises the same kind
    with pytest.raises(RuntimeError):
        torch.softmax(x, -1, dtype=bad)
    _follow_up_works(device)


@pytest.mark.parametrize("shape", [(), (4,), (3, 4), (2, 3, 4), (2, 3, 4, 5), (0, 3)], ids=str)
def test_dim_out_of_range(device, shape):
    x = make_tensor(shape, torch.float32, device)
    n = max(len(shape), 1)
    for dim in (n, n + 3, -n - 1, -n - 7):
        with pytest.raises(IndexError):  # torch's kind
            torch.softmax(x, dim)
        _raises(IndexError, "softmax", lambda: fastact.softmax(x, dim))
        _raises(IndexError, "log_softmax", lambda: fastact.log_softmax(x, dim))
        _raises(IndexError, "softmax", lambda: fastact.softmax(x, dim, dtype=torch.float64))
        y = torch.softmax(x, -1) if x.dim() else torch.softmax(x, 0)
        _raises(IndexError, "softmax_backward", lambda: ops.softmax_backward(y, y, dim, torch.float32))
        _raises(IndexError, "log_softmax_backward", lambda: ops.log_softmax_backward(y, y, dim, torch.float32))
    _follow_up_works(device)


def test_bias_wrong_shape(device):
    x = make_tensor((4, 6), torch.float32, device)
    for shape in [(5,), (7,), (1,), (0,), (), (1, 6), (4, 6), (6, 1)]:
        b = random_values(shape, torch.float32, device)
        _raises(RuntimeError, "bias_gelu", lambda: fastact.bias_gelu(x, b))
        _raises(RuntimeError, "bias_gelu_backward", lambda: ops.bias_gelu_backward(x, x, b))
    # bias over a dim other than the last is not accepted either
    _raises(RuntimeError, "bias_gelu", lambda: fastact.bias_gelu(x, random_values((4,), torch.float32, device)))
    _follow_up_works(device)


def test_bias_wrong_dtype(device):
    for xd, bd in [(torch.float32, torch.float64), (torch.float16, torch.float32), (torch.bfloat16, torch.float16)]:
        x = make_tensor((4, 6), xd, device)
        b = random_values((6,), bd, device)
        _raises(RuntimeError, "bias_gelu", lambda: fastact.bias_gelu(x, b))
        _raises(RuntimeError, "bias_gelu_backward", lambda: ops.bias_gelu_backward(x, x, b))
    _follow_up_works(device)


def test_bias_gelu_scalar_input(device):
    x = torch.tensor(0.5, device=device)
    for b in (torch.tensor(0.25, device=device), random_values((1,), torch.float32, device)):
        _raises(RuntimeError, "bias_gelu", lambda: fastact.bias_gelu(x, b))
        _raises(RuntimeError, "bias_gelu_backward", lambda: ops.bias_gelu_backward(x, x, b))
    _follow_up_works(device)


@pytest.mark.parametrize("approximate", ["", "erf", "Tanh", "none ", "sigmoid"])
def test_bad_approximate(device, approximate):
    x = make_tensor((3, 8), torch.float32, device)
    b = random_values((8,), torch.float32, device)
    with pytest.raises(RuntimeError):  # torch's kind
        torch.nn.functional.gelu(x, approximate=approximate)
    _raises(RuntimeError, "gelu", lambda: fastact.gelu(x, approximate))
    _raises(RuntimeError, "bias_gelu", lambda: fastact.bias_gelu(x, b, approximate))
    _raises(RuntimeError, "gelu_backward", lambda: ops.gelu_backward(x, x, approximate))
    _raises(RuntimeError, "bias_gelu_backward", lambda: ops.bias_gelu_backward(x, x, b, approximate))
    _follow_up_works(device)


def test_backward_ops_mismatched_arguments(device):
    f32 = torch.float32
    a, b_ = make_tensor((3, 5), f32, device), make_tensor((3, 6), f32, device)
    t = make_tensor((5, 3), f32, device)
    h = make_tensor((3, 5), torch.float16, device)
    bias = random_values((5,), f32, device)
    for name in ("softmax_backward", "log_softmax_backward"):
        op = getattr(ops, name)
        _raises(RuntimeError, name, lambda: op(a, b_, -1, f32))
        _raises(RuntimeError, name, lambda: op(a, t, -1, f32))  # same numel, other shape
        _raises(RuntimeError, name, lambda: op(a, a[:, :4], -1, f32))
        _raises(RuntimeError, name, lambda: op(h, a, -1, f32))  # grad and output dtypes differ
    for op in POINTWISE_OPS:
        bwd, v = getattr(ops, op.row.backward), tuple(op.params.values())
        _raises(RuntimeError, op.row.backward, lambda: bwd(a, b_, *v))
        _raises(RuntimeError, op.row.backward, lambda: bwd(a, t, *v))  # same numel, other shape
        _raises(RuntimeError, op.row.backward, lambda: bwd(h, a, *v))  # grad and saved dtypes differ
    _raises(RuntimeError, "bias_gelu_backward", lambda: ops.bias_gelu_backward(a, b_, bias))
    _raises(RuntimeError, "bias_gelu_backward", lambda: ops.bias_gelu_backward(b_, a, bias))
    _follow_up_works(device)


def test_unknown_variant(device):
    x = make_tensor((4, 64), torch.float32, device)
    y = torch.softmax(x, -1)
    for name in ("", "Warp", "fastest", "auto ", "warp;vec"):
        _raises(RuntimeError, "softmax", lambda: ops.softmax(x, -1, None, variant=name))
        _raises(RuntimeError, "log_softmax", lambda: ops.log_softmax(x, -1, None, variant=name))
        _raises(RuntimeError, "softmax_backward", lambda: ops.softmax_backward(y, y, -1, torch.float32, variant=name))
        _raises(RuntimeError, "log_softmax_backward", lambda: ops.log_softmax_backward(y, y, -1, torch.float32, variant=name))
    _follow_up_works(device)


@pytest.mark.parametrize("variant", ["warp", "vec", "scalar", "long_row", "strided", "split", "grid"])
def test_cuda_variant_on_cpu_tensor(variant):
    """The CUDA variants cannot run on CPU tensors: a clear error, not a silent fallback."""
    x = make_tensor((4, 64), torch.float32, "cpu")
    y = torch.softmax(x, -1)
    _raises(RuntimeError, "softmax", lambda: ops.softmax(x, -1, None, variant=variant))
    _raises(RuntimeError, "log_softmax", lambda: ops.log_softmax(x, -1, None, variant=variant))
    _raises(RuntimeError, "softmax_backward", lambda: ops.softmax_backward(y, y, -1, torch.float32, variant=variant))
    _raises(RuntimeError, "log_softmax_backward", lambda: ops.log_softmax_backward(y, y, -1, torch.float32, variant=variant))
    _follow_up_works("cpu")


def test_auto_variant_is_default(device):
    x = make_tensor((4, 64), torch.float32, device)
    assert torch.equal(ops.softmax(x, -1, None, variant="auto"), ops.softmax(x, -1))


def test_explain_bad_op(device):
    x = make_tensor((4, 64), torch.float32, device)
    with pytest.raises(RuntimeError):
        fastact.explain("softmaxx", x)
    with pytest.raises(RuntimeError):
        fastact.explain("", x)
