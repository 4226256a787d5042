"""Shared helpers of the fastact test suite: the ops under test with their torch references, inputs
of every memory layout, and the comparison rule.

The rule (DESIGN.md "Testing"; flash-attention's for the part that depends on torch): the reference
is the op's formula evaluated in float64 on float64 copies of the inputs (OpSpec.formula; for gradients,
torch's float64 autograd and the float64 backward formulas). An output element passes when

    |actual - ref| <= atol * max(1, max|ref|) + rtol * |ref| + 2 * max|torch - ref|

with (rtol, atol) from TOL for the output dtype, and `torch` the same torch op in the input's own
dtype on the same device. The last term allows for the error torch itself makes in that dtype (a
half softmax backward works from a half-rounded forward output, a bias gradient sums rounded
terms), so the bound is never tighter than what torch achieves, and never looser than twice its
worst error plus the table. NaN and infinities must sit exactly where the reference (rounded to the
output dtype) has them.

Gradients (check_op) are held to the same rule twice: against the float64 backward formula at the
tensors autograd hands the backward op (fastact's own forward output among them), in every dtype;
and, where the compute dtype is float32 or float64, end to end against the exact derivative at x.
"""

import math
import os
import subprocess
import sys

import pytest
import torch

import fastact
from fastact._optable import BY_NAME
from fastact._optable import OPS as TABLE

# Devices of device-parametrised tests: the cuda case skips where there is no GPU (the one GPU query
# made at import time is torch.cuda.is_available()).
CUDA = torch.cuda.is_available()
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")]),
]

FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
DTYPE_IDS = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16"}

# (rtol, atol) per output dtype. rtol is a couple of units in the last place (float16: 2^-10 ~ 1e-3,
# bfloat16: torch's own default of 1.6e-2, ~4 ulp); float32 and float64 leave room for sums over
# long rows. atol covers subnormals and cancellation and is scaled by the reference's magnitude.
TOL = {
    torch.float64: (1e-10, 1e-12),
    torch.float32: (1e-5, 1e-6),
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
}
# How many times torch's own worst error fastact may make (flash-attention uses 2).
TORCH_ERROR_FACTOR = 2.0

# Reduction lengths at the edges of every kernel path: 1, warp size +-1, vector widths, the warp
# kernel's upper end (1024 +- 1), 2048 +- 1, a long row (16384 + 1) and a very long one.
BOUNDARY_SIZES = (1, 2, 31, 32, 33, 127, 128, 129, 1023, 1024, 1025, 2047, 2048, 2049, 4096, 16385, 65536)


def dtype_id(dtype):
    return DTYPE_IDS.get(dtype, str(dtype).replace("torch.", ""))


def coarsest(*dtypes):
    """The dtype with the loosest tolerance among `dtypes` (the precision a chain of them keeps)."""
    return max(dtypes, key=lambda d: TOL[d][0])


# ----------------------------------------------------------------------------------------------
# The ops under test


def _softmax_reference(x, dim, log):
    if x.numel() == 0:  # no row to reduce (amax refuses an empty dim): an empty result of the same shape
        return x.clone()
    if x.dim() == 0:
        return _softmax_reference(x.view(1), 0, log).view(())
    shifted = x - x.amax(dim, keepdim=True)  # amax propagates NaN; +inf - +inf is NaN; an all -inf row too
    if log:
        return shifted - shifted.exp().sum(dim, keepdim=True).log()
    e = shifted.exp()
    return e / e.sum(dim, keepdim=True)


def _gelu_reference(x, approximate):
    if approximate == "tanh":  # x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))
    return 0.5 * x * (1 + torch.erf(x * math.sqrt(0.5)))  # x Phi(x)


def _sigmoid_reference(x):  # the stable form: exp of a non-positive number only
    e = (-x.abs()).exp()
    return torch.where(x >= 0, 1 / (1 + e), e / (1 + e))


# The float64 reference of every op of the table (fastact/_optable.py), by op name: its defining formula on
# float64 tensors (IEEE arithmetic, no torch kernel of the op itself), called with the op's keyword arguments
# (dim for the softmax family, bias for a bias op, the op's params by name). test_reference_for_every_op fails for
# a table row without an entry.
REFERENCES = {
    "softmax": lambda x, dim: _softmax_reference(x, dim, log=False),
    "log_softmax": lambda x, dim: _softmax_reference(x, dim, log=True),
    "gelu": _gelu_reference,
    "bias_gelu": lambda x, bias, approximate: _gelu_reference(x + bias, approximate),
    "sigmoid": _sigmoid_reference,
    "silu": lambda x: x * _sigmoid_reference(x),  # x sigmoid(x), the sigmoid in its stable form
}


class OpSpec:
    """One public fastact function (a row of the op table) at one value of its params (`approximate`, for the
    GELUs), and its torch twin."""

    def __init__(self, name, params=None):
        self.name = name
        self.row = BY_NAME[name]
        self.params = dict(params if params is not None else self.row.variants[0][1])
        self.id = "-".join([name, *self.params.values()])

    def __repr__(self):
        return self.id

    @property
    def kind(self):
        return self.row.kind

    @property
    def approximate(self):
        return self.params.get("approximate")

    @property
    def takes_dim(self):
        return self.kind == "softmax"

    @property
    def takes_bias(self):
        return self.kind == "bias"

    def fastact(self, x, *, dim=-1, dtype=None, bias=None):
        f = getattr(fastact, self.name)
        if self.takes_dim:
            return f(x, dim, dtype=dtype)
        if self.takes_bias:
            return f(x, bias, *self.params.values())
        return f(x, *self.params.values())

    def torch(self, x, *, dim=-1, dtype=None, bias=None):
        if self.takes_dim:
            return getattr(torch, self.name)(x, dim, dtype=dtype)
        if self.takes_bias:
            return BY_NAME[self.row.pointwise].torch_fn(x + bias, **self.params)
        return self.row.torch_fn(x, **self.params)

    def formula(self, x, *, dim=-1, bias=None):
        """The op's defining formula (REFERENCES) evaluated in float64: the reference for values and for the
        special-value semantics that README.md "Special values" writes down, the same on every CPU and GPU. torch's
        own result in a low precision is not a reference: its vectorised erf GELU gives NaN for +inf in float32 and
        bfloat16 on some CPUs."""
        x = x.to(torch.float64)
        if self.takes_dim:
            return REFERENCES[self.name](x, dim=dim)
        if self.takes_bias:
            return REFERENCES[self.name](x, bias=bias.to(torch.float64), **self.params)
        return REFERENCES[self.name](x, **self.params)

    def backward_given(self, g, x, y, *, dim=-1, bias=None):
        """The gradients autograd must produce from the tensors it hands the backward op: g (the
        incoming gradient), x (the op's input, after softmax's dtype= cast) and y (fastact's own
        forward output). Returns ((dx, dbias) by the float64 formula, (dx, dbias) from torch's own
        backward kernels on the same tensors in their dtype); dbias None without a bias."""
        g64, x64, y64 = g.to(torch.float64), x.to(torch.float64), y.detach().to(torch.float64)
        if self.takes_dim:
            log = self.name == "log_softmax"
            ref = softmax_backward_ref(g64, y64, dim, log)
            f = torch.ops.aten._log_softmax_backward_data if log else torch.ops.aten._softmax_backward_data
            return (ref, None), (f(g, y.detach(), dim, y.dtype), None)
        # torch's derivative op of the row (of its pointwise op, for a bias op) at what the backward reads
        grad = self.row.torch_backward
        if not self.takes_bias:
            saved, saved64 = (y.detach(), y64) if self.row.saves == "output" else (x, x64)
            return (grad(g64, saved64, **self.params), None), (grad(g, saved, **self.params), None)
        # a bias op: the gradient at x + bias; the bias's is its sum over all but the last dim
        rows = tuple(range(x.dim() - 1))
        dx64 = grad(g64, x64 + bias.to(torch.float64), **self.params)
        dx = grad(g, x + bias, **self.params)
        return (dx64, dx64.sum(rows) if rows else dx64), (dx, dx.sum(rows) if rows else dx)

    def expected_stride(self, x, out_dtype):
        """The layout rule of csrc/common.h: empty_like(input) (a dense input keeps its strides, any
        other becomes contiguous); a bias op's output is always contiguous."""
        if self.takes_bias:
            return contiguous_stride(x.shape)
        return torch.empty_like(x, dtype=out_dtype).stride()


# The ops under test, from the table: the softmax family, then every other row at every value of its params.
SOFTMAX_OPS = tuple(OpSpec(op.name) for op in TABLE if op.kind == "softmax")
ELEMENTWISE_OPS = tuple(OpSpec(op.name, params) for op in TABLE if op.kind != "softmax" for _, params in op.variants)
# the pointwise ones alone (one tensor input, no bias)
POINTWISE_OPS = tuple(op for op in ELEMENTWISE_OPS if op.kind == "pointwise")
ALL_OPS = SOFTMAX_OPS + ELEMENTWISE_OPS


def contiguous_stride(shape):
    return torch.empty(shape, device="meta").stride()


def is_dense(t):
    """Non-overlapping and dense (ATen's is_non_overlapping_and_dense, which Python lacks): the
    elements fill exactly numel() consecutive slots in some order of the dims."""
    expected = 1
    for stride, size in sorted((t.stride(i), t.size(i)) for i in range(t.dim()) if t.size(i) != 1):
        if stride != expected:
            return False
        expected *= size
    return True


# ----------------------------------------------------------------------------------------------
# Inputs


def random_values(shape, dtype, device, *, scale=1.0, gen=None):
    """Fresh normal random values (never a constant fill), generated in float32/float64 and cast."""
    gen_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    if gen is not None:
        t = torch.randn(shape, dtype=gen_dtype, generator=gen).to(device)
    else:
        t = torch.randn(shape, dtype=gen_dtype, device=device)
    if scale != 1.0:
        t = t * scale
    return t.to(dtype)


def strided_tensor(shape, dtype, device, *, perm=None, slices=None, expand=(), offset=0, scale=1.0, gen=None):
    """A random tensor of logical `shape` with a chosen memory layout.

    perm:   memory order; the tensor is `P.permute(perm)` of a contiguous P (None: identity).
    slices: {dim: (start, step, pad)}: along dim the tensor is base[start::step] of a longer base
            (pad extra elements at the end), so rows get a stride and a start offset.
    expand: dims that have size 1 in storage and are expanded (stride 0) to their size.
    offset: elements skipped at the start of the storage (offset 1: a misaligned data pointer).
    """
    shape = tuple(int(s) for s in shape)
    rank = len(shape)
    perm = tuple(range(rank)) if perm is None else tuple(perm)
    slices = slices or {}
    base = []
    for i, size in enumerate(shape):
        if i in expand:
            base.append(1)
        elif i in slices:
            start, step, pad = slices[i]
            base.append(start + (size - 1) * step + 1 + pad if size > 0 else start + pad)
        else:
            base.append(size)
    # Physical (contiguous) shape P with P.permute(perm).shape == base.
    phys = [0] * rank
    for i in range(rank):
        phys[perm[i]] = base[i]
    n = math.prod(phys)
    storage = random_values((n + offset,), dtype, device, scale=scale, gen=gen)
    t = storage[offset:].view(phys).permute(perm)
    if slices:
        index = []
        for i, size in enumerate(shape):
            if i in slices and i not in expand:
                start, step, _ = slices[i]
                index.append(slice(start, start + (size - 1) * step + 1 if size > 0 else start, step))
            else:
                index.append(slice(None))
        t = t[tuple(index)]
    if expand:
        t = t.expand(shape)
    assert t.shape == shape, (t.shape, shape)
    return t


# Named layouts (the ones DESIGN.md lists): each maps to arguments of strided_tensor.
LAYOUTS = ("contiguous", "transposed", "permuted", "sliced_last", "sliced_step", "expanded", "offset", "transposed_stepped")


def layout_applies(layout, rank):
    if layout in ("contiguous", "offset"):
        return True
    if layout in ("transposed", "transposed_stepped"):
        return rank >= 2
    if layout == "permuted":
        return rank >= 3  # rank 2 would repeat "transposed"
    return rank >= 1


def make_tensor(shape, dtype, device, layout="contiguous", *, scale=1.0, gen=None):
    """A random tensor of `shape` in one of LAYOUTS:
    contiguous; transposed (last two dims swapped in memory); permuted (dims reversed in memory);
    sliced_last (`base[..., 1:]`: rows with a stride, start off by one); sliced_step
    (`base[:, ::2]`, dim 0 for rank 1); expanded (dim 0 expanded from size 1, stride 0); offset
    (`storage[1:1+n].view(shape)`: dense, misaligned data pointer); transposed_stepped (dims reversed
    in memory and the last one stepped, `base.t()[:, ::2]`: gaps in a memory order that is not
    row-major, where empty_like(x) is neither x's strides nor contiguous)."""
    rank = len(shape)
    if not layout_applies(layout, rank):
        raise ValueError(f"layout {layout} needs a higher rank than {rank}")
    kw = {}
    if layout == "transposed":
        p = list(range(rank))
        p[-1], p[-2] = p[-2], p[-1]
        kw["perm"] = p
    elif layout == "permuted":
        kw["perm"] = list(reversed(range(rank)))
    elif layout == "sliced_last":
        kw["slices"] = {rank - 1: (1, 1, 0)}
    elif layout == "sliced_step":
        kw["slices"] = {1 if rank >= 2 else 0: (0, 2, 0)}
    elif layout == "expanded":
        kw["expand"] = (0,)
    elif layout == "offset":
        kw["offset"] = 1
    elif layout == "transposed_stepped":
        kw["perm"] = list(reversed(range(rank)))
        kw["slices"] = {rank - 1: (0, 2, 0)}
    return strided_tensor(shape, dtype, device, scale=scale, gen=gen, **kw)


# Strided stacks of rows, which the elementwise ops read in place (ElementRows): row lengths around
# the 64- and 128-bit access widths, and the views below.
ROW_VIEW_COLS = (1, 3, 4, 7, 8, 9, 16, 31, 33, 256, 1000, 4096)
ROW_VIEWS = ("chunk", "padded", "sliced")


def row_view(rows, cols, dtype, device, view, *, scale=1.0, values=None):
    """A [rows, cols] view that is a strided stack of rows: "chunk" base[:, cols:] of [rows, 2 * cols]
    (a GeGLU block's gate half); "padded" base[:, :cols] of rows padded to a multiple of 16 bytes
    plus 16 (every row start 16-byte aligned); "sliced" base[:, 1:] of [rows, cols + 1] (row starts
    off the alignment). Random values, or a copy of `values`."""
    if view == "chunk":
        v = make_tensor((rows, 2 * cols), dtype, device, scale=scale)[:, cols:]
    elif view == "padded":
        w = 16 // dtype.itemsize
        v = make_tensor((rows, (cols + w - 1) // w * w + w), dtype, device, scale=scale)[:, :cols]
    elif view == "sliced":
        v = make_tensor((rows, cols + 1), dtype, device, scale=scale)[:, 1:]
    else:
        raise ValueError(f"unknown row view {view!r}")
    if values is not None:
        v.copy_(values)
    return v


def poison_allocator(device, *nbytes):
    """Leaves freed blocks of these sizes filled with 0xFF bytes (NaN in every float dtype) in the
    allocator's cache, so that an output the op allocates next from that cache and then fails to
    write shows up as NaN (outputs are not exposed to be filled before the kernel runs). Effective
    with the CUDA caching allocator; on the CPU it is best effort (malloc may hand back fresh pages)."""
    blocks = [torch.empty(int(n), dtype=torch.uint8, device=device).fill_(0xFF) for n in nbytes if n > 0]
    del blocks


# ----------------------------------------------------------------------------------------------
# Comparison


def assert_close(actual, expected, dtype=None, *, torch_actual=None, msg=""):
    """Checks `actual` against the float64 reference `expected` by the rule in the module docstring.
    `dtype` picks the tolerance (default: actual's dtype); `torch_actual` is torch's own result in
    the tested dtype, whose error widens the bound (flash-attention's rule)."""
    assert actual.shape == expected.shape, f"{msg}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    dtype = dtype or actual.dtype
    rtol, atol = TOL[dtype]
    a = actual.detach().to(torch.float64)
    e = expected.detach().to(torch.float64)
    # Non-finite structure against the reference rounded to the output dtype (an overflow there is
    # an infinity the output must have too).
    e_round = e if actual.dtype == torch.float64 else e.to(actual.dtype).to(torch.float64)
    fin = e_round.isfinite()
    all_finite = bool(fin.all()) and bool(a.isfinite().all())
    if not all_finite:
        nan_e, nan_a = e_round.isnan(), a.isnan()
        if not torch.equal(nan_e, nan_a):
            where = (nan_e != nan_a).nonzero()[:5].tolist()
            raise AssertionError(
                f"{msg}: NaN pattern differs from the reference at {int((nan_e != nan_a).sum())} element(s), "
                f"e.g. {where}: actual {[a[tuple(i)].item() for i in where]}, "
                f"expected {[e_round[tuple(i)].item() for i in where]}"
            )
        inf_mismatch = (e_round.isinf() | a.isinf()) & ~nan_e & (a != e_round)
        if inf_mismatch.any():
            where = inf_mismatch.nonzero()[:5].tolist()
            raise AssertionError(
                f"{msg}: infinities differ from the reference at {int(inf_mismatch.sum())} element(s), "
                f"e.g. {where}: actual {[a[tuple(i)].item() for i in where]}, "
                f"expected {[e_round[tuple(i)].item() for i in where]}"
            )
        if not fin.any():
            return
        a, e = a[fin], e[fin]
    else:
        a, e = a.reshape(-1), e.reshape(-1)
    if e.numel() == 0:
        return
    e_abs = e.abs()
    scale = max(1.0, e_abs.max().item())
    err = (a - e).abs_()
    allowed = e_abs.mul_(rtol).add_(atol * scale)
    torch_err = 0.0
    if torch_actual is not None:
        t = torch_actual.detach().to(torch.float64)
        t = t[fin] if not all_finite else t.reshape(-1)
        terr = (t - e).abs_()
        terr = terr[terr.isfinite()]
        if terr.numel():
            torch_err = terr.max().item()
        allowed.add_(TORCH_ERROR_FACTOR * torch_err)
    excess = err - allowed
    if bool((excess > 0).any()):
        i = int(excess.argmax())
        bad = int((excess > 0).sum())
        raise AssertionError(
            f"{msg}: {bad} of {e.numel()} element(s) out of tolerance ({dtype}, rtol={rtol}, "
            f"atol={atol}, torch's max error {torch_err:.3g}); worst: actual {a[i].item()!r}, "
            f"expected {e[i].item()!r}, error {err[i].item():.3g} > allowed {allowed[i].item():.3g}; "
            f"max error {err.max().item():.3g}"
        )


def describe(x):
    return f"shape={tuple(x.shape)} stride={x.stride()} offset={x.storage_offset()} dtype={x.dtype} device={x.device}"


def fused_cast_forward_failures(in_dtype, rows, d, variants, ops=("softmax", "log_softmax")):
    """The forwards `ops` of 16-bit rows [rows, d] of in_dtype into float32 (the dtype= cast) under each forced
    variant, for rows aligned and with a padded stride (d + 8), x randn (scale 3): the output poisoned first; a
    refusal, another error, a wrong dtype or layout, or a value off float64 (torch's own error widening the bound) is
    a failure. Returns the failures' messages (none: all right)."""
    failures = []
    for padded in (False, True):
        if padded:
            x = strided_tensor((rows, d), in_dtype, "cuda", slices={1: (0, 1, 8)}, scale=3.0)
        else:
            x = make_tensor((rows, d), in_dtype, "cuda", scale=3.0)
        for op in ops:
            fwd = getattr(torch.ops.fastact, op)
            ref_fn = torch.log_softmax if op == "log_softmax" else torch.softmax
            ref, pt = ref_fn(x.double(), -1), ref_fn(x, -1, dtype=torch.float32)
            for variant in variants:
                msg = f"{op} {variant} {describe(x)} -> float32"
                poison_allocator("cuda", x.numel() * 4)
                try:
                    y = fwd(x, -1, torch.float32, variant=variant)
                    assert y.dtype == torch.float32 and y.is_contiguous(), f"{msg}: {describe(y)}"
                    assert_close(y, ref, torch_actual=pt, msg=msg)
                except (AssertionError, RuntimeError) as e:  # a refusal too: the callers' variants take their rows
                    failures.append(f"{msg}: {e}"[:400])
    return failures


def check_op(op, x, *, dim=-1, dtype=None, bias=None, backward=True, grad_layout="contiguous", note=""):
    """Runs `op` through fastact and torch on `x` (and `bias`), checks the forward output (dtype,
    shape, device, strides, values) and, when `backward`, the gradients of x and bias through
    autograd, against torch on float64 copies. Returns fastact's output."""
    device = x.device
    out_dtype = dtype or x.dtype
    msg = f"{op.id} dim={dim} dtype={dtype} x: {describe(x)}" + (f" bias: {describe(bias)}" if bias is not None else "")
    if note:
        msg += f" [{note}]"

    x_fa = x.detach().requires_grad_(backward)
    b_fa = bias.detach().requires_grad_(backward) if bias is not None else None
    poison_allocator(device, x.numel() * out_dtype.itemsize)
    y = op.fastact(x_fa, dim=dim, dtype=dtype, bias=b_fa)

    x_pt = x.detach().requires_grad_(backward)
    b_pt = bias.detach().requires_grad_(backward) if bias is not None else None
    y_pt = op.torch(x_pt, dim=dim, dtype=dtype, bias=b_pt)

    x_ref = (x.detach().to(dtype) if dtype is not None else x.detach()).to(torch.float64).requires_grad_(backward)
    b_ref = bias.detach().to(torch.float64).requires_grad_(backward) if bias is not None else None
    y_ref = op.torch(x_ref, dim=dim, bias=b_ref)

    assert y.dtype == y_pt.dtype, f"{msg}: output dtype {y.dtype}, torch gives {y_pt.dtype}"
    assert y.shape == y_pt.shape, f"{msg}: output shape {tuple(y.shape)}, torch gives {tuple(y_pt.shape)}"
    assert y.device == device, f"{msg}: output on {y.device}"
    want_stride = op.expected_stride(x, out_dtype)
    assert y.stride() == want_stride, f"{msg}: output strides {y.stride()}, layout rule gives {want_stride}"
    x_formula = x.detach().to(dtype) if dtype is not None else x.detach()
    assert_close(y, op.formula(x_formula, dim=dim, bias=bias), torch_actual=y_pt, msg=f"{msg}: forward")

    if backward:
        rank = y.dim()
        g_layout = grad_layout if layout_applies(grad_layout, rank) else "contiguous"
        g = make_tensor(tuple(y.shape), y.dtype, device, g_layout)
        poison_allocator(device, x.numel() * x.dtype.itemsize, bias.numel() * bias.dtype.itemsize if bias is not None else 0)
        y.backward(g)
        y_pt.backward(g)
        y_ref.backward(g.to(torch.float64))
        gmsg = f"{msg} grad: {describe(g)}"
        assert x_fa.grad is not None, f"{gmsg}: no gradient for x"
        assert x_fa.grad.dtype == x.dtype, f"{gmsg}: x.grad dtype {x_fa.grad.dtype}, expected {x.dtype}"
        assert x_fa.grad.shape == x.shape, f"{gmsg}: x.grad shape {tuple(x_fa.grad.shape)}"
        if bias is not None:
            assert b_fa.grad is not None, f"{gmsg}: no gradient for bias"
            assert b_fa.grad.dtype == bias.dtype and b_fa.grad.shape == bias.shape, f"{gmsg}: bias.grad {b_fa.grad.dtype} {tuple(b_fa.grad.shape)}"
        tol = coarsest(x.dtype, out_dtype)
        # (1) The backward against the float64 formula at the very tensors it is given (fastact's
        # own forward output among them): the backward kernel's error alone, in every dtype.
        x_in = x.detach().to(dtype) if dtype is not None else x.detach()
        (dx_ref, db_ref), (dx_pt, db_pt) = op.backward_given(g, x_in, y, dim=dim, bias=bias)
        assert_close(x_fa.grad, dx_ref, tol, torch_actual=dx_pt, msg=f"{gmsg}: x.grad (backward of fastact's forward)")
        if bias is not None:
            assert_close(b_fa.grad, db_ref, bias.dtype, torch_actual=db_pt, msg=f"{gmsg}: bias.grad")
        # (2) End to end against the exact derivative at x. In float16/bfloat16 the forward output
        # the backward works from is rounded by an ulp, which a cancelling gradient (softmax's
        # y * (g - sum(g y)), sigmoid's y (1 - y)) turns into an error far above that ulp, in
        # torch as in fastact and differently for each: (1) and the forward check cover it there.
        if tol in (torch.float32, torch.float64):
            assert_close(x_fa.grad, x_ref.grad, tol, torch_actual=x_pt.grad, msg=f"{gmsg}: x.grad (exact derivative)")
            if bias is not None:
                assert_close(b_fa.grad, b_ref.grad, bias.dtype, torch_actual=b_pt.grad, msg=f"{gmsg}: bias.grad (exact)")
    return y


def bias_for(x, layout="contiguous", *, gen=None):
    """A random bias over x's last dim, contiguous or in a non-contiguous/misaligned layout."""
    n = x.shape[-1]
    if layout == "contiguous":
        return random_values((n,), x.dtype, x.device, gen=gen)
    if layout == "strided":
        return strided_tensor((n,), x.dtype, x.device, slices={0: (0, 2, 0)}, gen=gen)
    if layout == "offset":
        return strided_tensor((n,), x.dtype, x.device, offset=1, gen=gen)
    raise ValueError(layout)


# ----------------------------------------------------------------------------------------------
# Backward ops: float64 references by formula (torch's CPU _softmax_backward_data refuses mixed
# dtypes, so the formula is the device-independent reference)


def softmax_backward_ref(grad, out, dim, log):
    g, y = grad.to(torch.float64), out.to(torch.float64)
    if log:
        return g - y.exp() * g.sum(dim, keepdim=True)
    return y * (g - (g * y).sum(dim, keepdim=True))


def softmax_backward_torch(grad, out, dim, input_dtype, log):
    """torch's own backward in the output's dtype, cast to input_dtype (what autograd gives)."""
    f = torch.ops.aten._log_softmax_backward_data if log else torch.ops.aten._softmax_backward_data
    return f(grad, out, dim, out.dtype).to(input_dtype)


def pytest_under_isa(test_file, isa, k):
    """The tests of `test_file` that `k` selects, in a subprocess whose CPU kernels (torch's and fastact's) are the
    `isa` build (ATEN_CPU_CAPABILITY); they must pass, and some must run."""
    env = dict(os.environ, ATEN_CPU_CAPABILITY=isa)
    out = subprocess.run([sys.executable, "-m", "pytest", test_file, "-q", "-p", "no:cacheprovider", "-x", "-k", k],
                         env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert " passed" in out.stdout, out.stdout[-2000:]
