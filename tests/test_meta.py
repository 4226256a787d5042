"""The fake (meta) kernels make their real kernel's checks: every bad call that the CPU kernel refuses, the meta
kernel refuses with the same error kind and message (modulo how a dtype prints), and a meta tensor mixed with a CPU
tensor is refused, as torch refuses it, instead of giving an uninitialised CPU tensor. Good calls give outputs of the
real kernel's dtype, shape and strides."""

import re
import sys

import pytest
import torch

import fastact  # noqa: F401  (registers the ops)
from fastact._optable import OPS as TABLE

ops = torch.ops.fastact

F32, F16, I64 = torch.float32, torch.float16, torch.int64


def t(*shape, dtype=F32, device="cpu"):
    return torch.randn(shape).to(dtype) if device == "cpu" else torch.empty(shape, dtype=dtype, device=device)


# (name, call): each call takes a tensor factory (CPU or meta) and calls one op. The bad ones must raise.
BAD = [
    ("softmax int", lambda T: ops.softmax(T(3, 4, dtype=I64), -1)),
    ("softmax dim", lambda T: ops.softmax(T(3, 4), 2)),
    ("softmax dim 0-d", lambda T: ops.softmax(T(), 1)),
    ("softmax dtype int", lambda T: ops.softmax(T(3, 4), -1, I64)),
    ("softmax variant unknown", lambda T: ops.softmax(T(3, 4), -1, variant="nope")),
    ("log_softmax int", lambda T: ops.log_softmax(T(3, 4, dtype=I64), 0)),
    ("log_softmax dim", lambda T: ops.log_softmax(T(3, 4), -3)),
    ("softmax_backward shape", lambda T: ops.softmax_backward(T(3, 4), T(3, 5), -1, F32)),
    ("softmax_backward dtype", lambda T: ops.softmax_backward(T(3, 4, dtype=F16), T(3, 4), -1, F32)),
    ("softmax_backward input_dtype", lambda T: ops.softmax_backward(T(3, 4), T(3, 4), -1, I64)),
    ("softmax_backward dim", lambda T: ops.softmax_backward(T(3, 4), T(3, 4), 5, F32)),
    ("softmax_backward variant", lambda T: ops.softmax_backward(T(3, 4), T(3, 4), -1, F32, variant="nope")),
    ("log_softmax_backward int", lambda T: ops.log_softmax_backward(T(3, 4, dtype=I64), T(3, 4, dtype=I64), -1, F32)),
    ("gelu approximate", lambda T: ops.gelu(T(5), "fast")),
    ("gelu_backward approximate", lambda T: ops.gelu_backward(T(5), T(5), "fast")),
    ("bias_gelu bias shape", lambda T: ops.bias_gelu(T(3, 4), T(5))),
    ("bias_gelu bias 2-d", lambda T: ops.bias_gelu(T(3, 4), T(1, 4))),
    ("bias_gelu 0-d", lambda T: ops.bias_gelu(T(), T(1))),
    ("bias_gelu bias dtype", lambda T: ops.bias_gelu(T(3, 4), T(4, dtype=F16))),
    ("bias_gelu approximate", lambda T: ops.bias_gelu(T(3, 4), T(4), "fast")),
    ("bias_gelu_backward grad shape", lambda T: ops.bias_gelu_backward(T(3, 5), T(3, 4), T(4))),
    ("bias_gelu_backward bias", lambda T: ops.bias_gelu_backward(T(3, 4), T(3, 4), T(3))),
    ("bias_gelu_backward approximate", lambda T: ops.bias_gelu_backward(T(3, 4), T(3, 4), T(4), "fast")),
]



def _pointwise_bad(op):
    """The bad calls every pointwise row of the op table has: a complex input, an integer one (unless torch computes
    it in the default dtype), a backward of mismatched shapes or dtypes."""
    f, b, v = getattr(ops, op.name), getattr(ops, op.backward), tuple(op.variants[0][1].values())
    out = [(f"{op.name} complex", lambda T: f(T(5, dtype=torch.complex64), *v)),
           (f"{op.backward} shape", lambda T: b(T(5), T(4), *v)),
           (f"{op.backward} dtype", lambda T: b(T(5, dtype=F16), T(5), *v))]
    if not op.integral_to_default:
        out.append((f"{op.name} int", lambda T: f(T(5, dtype=I64), *v)))
    return out


def _pointwise_good(op):
    """Each pointwise row's forward and backward at every value of its params (and an integer input where torch
    computes it in the default dtype)."""
    f, b = getattr(ops, op.name), getattr(ops, op.backward)
    out = []
    for label, params in op.variants:
        v = tuple(params.values())
        out += [(label, lambda T, v=v: f(T(2, 5), *v)), (f"{label} backward", lambda T, v=v: b(T(5), T(5), *v))]
    if op.integral_to_default:
        out.append((f"{op.name} int", lambda T: f(T(5, dtype=I64))))
    return out


POINTWISE = [op for op in TABLE if op.kind == "pointwise"]
BAD += [case for op in POINTWISE for case in _pointwise_bad(op)]

GOOD = [
    ("softmax", lambda T: ops.softmax(T(3, 4), -1)),
    ("softmax cast", lambda T: ops.softmax(T(3, 4, dtype=F16), 0, F32)),
    ("softmax int cast", lambda T: ops.softmax(T(3, 4, dtype=I64), 0, F32)),
    ("softmax transposed", lambda T: ops.softmax(T(4, 3).t(), 1)),
    ("log_softmax 0-d", lambda T: ops.log_softmax(T(), 0)),
    ("softmax_backward fused", lambda T: ops.softmax_backward(T(3, 4), T(3, 4), -1, F16)),
    ("bias_gelu", lambda T: ops.bias_gelu(T(4, 3).t(), T(4))),
    ("bias_gelu_backward", lambda T: ops.bias_gelu_backward(T(3, 4), T(3, 4), T(4), "none")),
]

GOOD += [case for op in POINTWISE for case in _pointwise_good(op)]


def cpu(*shape, dtype=F32):
    return t(*shape, dtype=dtype)


def meta(*shape, dtype=F32):
    return t(*shape, dtype=dtype, device="meta")


def _outcome(call, factory):
    try:
        return call(factory)
    except Exception as e:  # noqa: BLE001  (the kind is what is compared)
        return e


_DTYPE_WORDS = {"torch.float32": "Float", "torch.float16": "Half", "torch.int64": "Long", "torch.complex64": "ComplexFloat"}


def _normalise(message):
    """The first line of an error, with dtypes in C++'s spelling (Long, Half) and torch's Python spelling alike."""
    line = message.splitlines()[0]
    for py, cpp in _DTYPE_WORDS.items():
        line = line.replace(py, cpp)
    return line


@pytest.mark.parametrize("name,call", BAD, ids=[b[0] for b in BAD])
def test_meta_refuses_what_cpu_refuses(name, call):
    real, fake = _outcome(call, cpu), _outcome(call, meta)
    assert isinstance(real, Exception), f"{name}: the CPU kernel took it"
    assert isinstance(fake, Exception), f"{name}: the meta kernel took what the CPU kernel refuses ({real})"
    assert type(fake) is type(real), f"{name}: {type(fake).__name__} on meta, {type(real).__name__} on the CPU"
    if "variant" in name:  # the list of valid names is worded per device (CUDA's on meta, which stands for any)
        fake, real = str(fake).split(";")[0], str(real).split(";")[0]
    assert _normalise(str(fake)) == _normalise(str(real)), f"{name}:\n meta: {fake}\n cpu:  {real}"


@pytest.mark.parametrize("name,call", GOOD, ids=[g[0] for g in GOOD])
def test_meta_outputs_match_cpu(name, call):
    real, fake = call(cpu), call(meta)
    real, fake = (real, fake) if isinstance(real, tuple) else ((real,), (fake,))
    for r, f in zip(real, fake):
        assert f.device.type == "meta"
        assert (f.dtype, f.shape, f.stride()) == (r.dtype, r.shape, r.stride()), (name, f, r)


MIXED = [
    ("bias_gelu", lambda: ops.bias_gelu(cpu(2, 6), meta(6))),
    ("bias_gelu x meta", lambda: ops.bias_gelu(meta(2, 6), cpu(6))),
    ("bias_gelu_backward", lambda: ops.bias_gelu_backward(cpu(2, 6), cpu(2, 6), meta(6))),
    ("softmax_backward", lambda: ops.softmax_backward(meta(2, 6), cpu(2, 6), -1, F32)),
    ("log_softmax_backward", lambda: ops.log_softmax_backward(cpu(2, 6), meta(2, 6), -1, F32)),
    ("public bias_gelu", lambda: fastact.bias_gelu(cpu(2, 6), torch.zeros(6, device="meta"))),
]
for _op in POINTWISE:  # each pointwise backward, with the meta tensor second and first
    MIXED += [(_op.backward, lambda b=getattr(ops, _op.backward): b(cpu(5), meta(5))),
              (f"{_op.backward} meta first", lambda b=getattr(ops, _op.backward): b(meta(5), cpu(5)))]


@pytest.mark.parametrize("name,call", MIXED, ids=[m[0] for m in MIXED])
def test_meta_mixed_with_cpu_is_refused(name, call):
    with pytest.raises(RuntimeError, match=re.escape("on the same device, got")):
        call()


def test_variant_names_follow_the_dispatcher():
    """A CUDA variant's name on the meta device passes the check (meta stands for any device); on the CPU it is the
    CPU kernel's refusal."""
    names = sys.modules["fastact._ops"]._variant_names()
    assert "auto" in names and "warp" in names
    y = ops.softmax(meta(3, 4), -1, variant="warp")
    assert y.shape == (3, 4)
    with pytest.raises(RuntimeError, match="CUDA kernel"):
        ops.softmax(cpu(3, 4), -1, variant="warp")
