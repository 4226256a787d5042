"""Loads fastact._C (which registers every op, its CPU/CUDA kernels and its autograd) and adds the
fake kernels that torch.compile and opcheck use. The fake kernels follow the real ones' layout rule
(csrc/common.h): outputs are `empty_like(input)`, contiguous only for bias_gelu."""

import ctypes
import functools
import importlib.metadata
import os

import torch

from ._optable import OPS


def _preload_tbb():
    """Loads oneTBB's runtime from the `tbb` distribution before _C needs it.

    _C carries an rpath to where tbb-devel was at build time; this covers installs where that
    folder moved (a wheel installed elsewhere, a relocated venv)."""
    try:
        files = importlib.metadata.files("tbb") or []
    except importlib.metadata.PackageNotFoundError:
        return
    for f in files:
        if os.path.basename(str(f)) == "libtbb.so.12":
            path = f.locate()
            if os.path.exists(path):
                ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
            return


_preload_tbb()

try:
    from . import _C  # noqa: E402  (registers the ops)
except ImportError as e:
    # Python started in a source checkout imports its fastact/ folder, which shadows the installed package and,
    # unless built in place (pip install -e), has no _C: say so rather than "partially initialized module".
    _here = os.path.dirname(os.path.abspath(__file__))
    if os.path.exists(os.path.join(_here, os.pardir, "setup.py")) and not any(
            f.startswith("_C.") for f in os.listdir(_here)):
        raise ImportError(
            f"fastact is imported from its source tree ({_here}), where the extension fastact._C is not built. "
            "Run Python from another directory to use the installed fastact, or build this tree in place: "
            "pip install --no-build-isolation -e .") from e
    raise

ops = torch.ops.fastact

_FLOATING = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

# The fake kernels below serve torch.compile's FakeTensors and the meta device (register_fake registers them as the
# ops' Meta kernels too, which the dispatcher also picks when a meta tensor meets a real one). Each makes the checks
# of its real kernel (csrc/common.h, csrc/cpu/ops.cpp, csrc/cuda/*), in the same order and with the same error kind
# and wording, so that what fails eagerly fails under compile and on meta tensors, and a meta tensor mixed with a CPU
# tensor is refused instead of returning an uninitialised CPU tensor. tests/test_meta.py holds the two to each other.


def _check_floating(op, t, arg="input"):
    torch._check_not_implemented(
        t.dtype in _FLOATING,
        lambda: f"{op}: expected a floating point tensor (float32, float64, float16 or bfloat16) for {arg}, "
        f"got {t.dtype}",
    )


def _check_same_device(op, a, b, arg_a, arg_b):
    torch._check(a.device == b.device,
                 lambda: f"{op}: expected {arg_a} and {arg_b} on the same device, got {a.device} and {b.device}")


def _check_same_shape(op, a, b, arg_a, arg_b):
    torch._check(a.shape == b.shape,
                 lambda: f"{op}: expected {arg_a} and {arg_b} of the same shape, got {list(a.shape)} and {list(b.shape)}")


def _check_same_dtype(op, a, b, arg_a, arg_b):
    torch._check(a.dtype == b.dtype,
                 lambda: f"{op}: expected {arg_a} and {arg_b} of the same dtype, got {a.dtype} and {b.dtype}")


def _check_grad(op, grad, t, arg):
    _check_floating(op, grad, "grad_output")
    _check_floating(op, t, arg)
    _check_same_shape(op, grad, t, "grad_output", arg)
    _check_same_dtype(op, grad, t, "grad_output", arg)
    _check_same_device(op, grad, t, "grad_output", arg)


def _check_bias_gelu(op, x, bias):
    _check_floating(op, x, "input")
    _check_floating(op, bias, "bias")
    torch._check(x.dim() >= 1,
                 lambda: f"{op}: expected input of at least 1 dim (bias is added over the last), got a 0-d tensor")
    torch._check(bias.dim() == 1 and bias.shape[0] == x.shape[-1],
                 lambda: f"{op}: expected bias of shape [{x.shape[-1]}], got {list(bias.shape)}")
    _check_same_dtype(op, x, bias, "input", "bias")
    _check_same_device(op, x, bias, "input", "bias")


def _check_dim(op, dim, ndim):
    n = max(ndim, 1)
    torch._check_index(-n <= dim < n, lambda: f"{op}: dim {dim} out of range for a tensor of {ndim} dims "
                                              f"(expected to be in range of [{-n}, {n - 1}])")


@functools.cache
def _variant_names():
    return tuple(_C.softmax_variant_names().split(", "))


def _check_variant(op, variant, device):
    """The variant argument as the real kernels take it: "auto" anywhere, a CUDA kernel's name on CUDA (and on the
    meta device, which stands for any device); whether that kernel can take the input is the CUDA kernel's check."""
    if variant == "auto":
        return
    known = variant in _variant_names()
    torch._check(not (known and device.type == "cpu"),
                 lambda: f"{op}: variant '{variant}' is a CUDA kernel; on the CPU only 'auto' is accepted")
    if device.type == "cpu":
        torch._check(known, lambda: f"{op}: unknown variant '{variant}'; expected one of "
                                    f"{', '.join(_variant_names())} (on the CPU only 'auto')")
    torch._check(known, lambda: f"{op}: unknown variant '{variant}'; valid variants: {', '.join(_variant_names())}")


def _integral(t):
    """Integer or bool: what torch converts to a floating dtype first where a float op allows it."""
    return not (t.dtype.is_floating_point or t.dtype.is_complex)


def _softmax_fake(op):
    def fake(x, dim, dtype=None, *, variant="auto"):
        _check_variant(op, variant, x.device)
        if dtype is None or not _integral(x):  # with a dtype an integer x is cast first, as in torch
            _check_floating(op, x)
        out_dtype = dtype if dtype is not None else x.dtype
        torch._check_not_implemented(
            out_dtype in _FLOATING,
            lambda: f"{op}: expected dtype to be float32, float64, float16 or bfloat16, got {out_dtype}")
        _check_dim(op, dim, x.dim())
        return torch.empty_like(x, dtype=out_dtype)

    return fake


def _softmax_backward_fake(op):
    def fake(grad_output, output, dim, input_dtype, *, variant="auto"):
        _check_variant(op, variant, output.device)
        _check_floating(op, grad_output, "grad_output")
        _check_floating(op, output, "output")
        _check_same_shape(op, grad_output, output, "grad_output", "output")
        _check_same_dtype(op, grad_output, output, "grad_output", "output")
        _check_same_device(op, grad_output, output, "grad_output", "output")
        torch._check_not_implemented(
            input_dtype in _FLOATING,
            lambda: f"{op}: expected input_dtype to be float32, float64, float16 or bfloat16, got {input_dtype}")
        _check_dim(op, dim, output.dim())
        return torch.empty_like(output, dtype=input_dtype)

    return fake


def _check_params(op, row, params):
    """Each string param of a pointwise or bias row among the values its kernel takes."""
    for p, value in zip(row.params, params):
        torch._check(value in p.choices, lambda: f"{op}: {p.name} argument must be either "
                                                f"{' or '.join(p.choices)}, got '{value}'")


def _pointwise_fake(row):
    def fake(x, *params):
        if row.integral_to_default and _integral(x):  # torch.sigmoid computes an integer x in the default dtype
            return torch.empty_like(x, dtype=torch.get_default_dtype())
        _check_floating(row.name, x)
        _check_params(row.name, row, params)
        return torch.empty_like(x)

    return fake


def _pointwise_backward_fake(row):
    op = row.backward

    def fake(grad_output, saved, *params):
        _check_grad(op, grad_output, saved, row.saves)
        _check_params(op, row, params)
        return torch.empty_like(saved)

    return fake


def _bias_fake(row):
    def fake(x, bias, *params):
        _check_bias_gelu(row.name, x, bias)
        _check_params(row.name, row, params)
        return x.new_empty(x.shape)

    return fake


def _bias_backward_fake(row):
    op = row.backward

    def fake(grad_output, x, bias, *params):
        _check_bias_gelu(op, x, bias)
        _check_grad(op, grad_output, x, "input")
        _check_params(op, row, params)
        return x.new_empty(x.shape), bias.new_empty(bias.shape)

    return fake


_FAKES = {
    "softmax": (_softmax_fake, _softmax_backward_fake),
    "pointwise": (_pointwise_fake, _pointwise_backward_fake),
    "bias": (_bias_fake, _bias_backward_fake),
}

for _row in OPS:
    _forward, _backward = _FAKES[_row.kind]
    if _row.kind == "softmax":
        torch.library.register_fake(f"fastact::{_row.name}")(_forward(_row.name))
        torch.library.register_fake(f"fastact::{_row.backward}")(_backward(_row.backward))
    else:
        torch.library.register_fake(f"fastact::{_row.name}")(_forward(_row))
        torch.library.register_fake(f"fastact::{_row.backward}")(_backward(_row))
del _row, _forward, _backward
