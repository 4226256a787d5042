"""Loads fastact._C (which registers every op, its CPU/CUDA kernels and its autograd) and adds the
fake kernels that torch.compile and opcheck use. The fake kernels follow the real ones' layout rule
(csrc/common.h): outputs are `empty_like(input)`, contiguous only for bias_gelu."""

import ctypes
import importlib.metadata
import os

import torch


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

from . import _C  # noqa: E402  (registers the ops)

ops = torch.ops.fastact

_FLOATING = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _check_floating(op, t, arg="input"):
    torch._check(
        t.dtype in _FLOATING,
        lambda: f"{op}: expected a floating point tensor (float32, float64, float16 or bfloat16) "
        f"for {arg}, got {t.dtype}",
    )


def _integral(t):
    """Integer or bool: what torch converts to a floating dtype first where a float op allows it."""
    return not (t.dtype.is_floating_point or t.dtype.is_complex)


def _softmax_fake(op):
    def fake(x, dim, dtype=None, *, variant="auto"):
        if dtype is None or not _integral(x):  # with a dtype an integer x is cast first, as in torch
            _check_floating(op, x)
        torch._check(dtype is None or dtype in _FLOATING,
                     lambda: f"{op}: expected dtype to be float32, float64, float16 or bfloat16, got {dtype}")
        torch._check_index(-max(x.dim(), 1) <= dim < max(x.dim(), 1), lambda: f"{op}: dim {dim} out of range")
        return torch.empty_like(x, dtype=dtype if dtype is not None else x.dtype)

    return fake


def _softmax_backward_fake(op):
    def fake(grad_output, output, dim, input_dtype, *, variant="auto"):
        _check_floating(op, output, "output")
        return torch.empty_like(output, dtype=input_dtype)

    return fake


torch.library.register_fake("fastact::softmax")(_softmax_fake("softmax"))
torch.library.register_fake("fastact::log_softmax")(_softmax_fake("log_softmax"))
torch.library.register_fake("fastact::softmax_backward")(_softmax_backward_fake("softmax_backward"))
torch.library.register_fake("fastact::log_softmax_backward")(_softmax_backward_fake("log_softmax_backward"))


@torch.library.register_fake("fastact::gelu")
def _gelu_fake(x, approximate="none"):
    _check_floating("gelu", x)
    return torch.empty_like(x)


@torch.library.register_fake("fastact::gelu_backward")
def _gelu_backward_fake(grad_output, x, approximate="none"):
    return torch.empty_like(x)


@torch.library.register_fake("fastact::bias_gelu")
def _bias_gelu_fake(x, bias, approximate="tanh"):
    _check_floating("bias_gelu", x)
    torch._check(x.dim() >= 1 and bias.dim() == 1 and bias.shape[0] == x.shape[-1],
                 lambda: f"bias_gelu: expected bias of shape [{x.shape[-1] if x.dim() else '?'}], got {list(bias.shape)}")
    return x.new_empty(x.shape)


@torch.library.register_fake("fastact::bias_gelu_backward")
def _bias_gelu_backward_fake(grad_output, x, bias, approximate="tanh"):
    return x.new_empty(x.shape), bias.new_empty(bias.shape)


@torch.library.register_fake("fastact::sigmoid")
def _sigmoid_fake(x):
    if _integral(x):  # torch.sigmoid computes an integer x in the default dtype
        return torch.empty_like(x, dtype=torch.get_default_dtype())
    _check_floating("sigmoid", x)
    return torch.empty_like(x)


@torch.library.register_fake("fastact::sigmoid_backward")
def _sigmoid_backward_fake(grad_output, output):
    return torch.empty_like(output)
