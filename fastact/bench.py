"""The benchmark report: ``python -m fastact.bench [--quick] [--device cuda|cpu] [--check] [--out DIR]``.

Times fastact against torch (eager) and torch.compile on the current device and prints one table per
op: shape, dtype, direction, the three times, fastact's bandwidth, its fraction of the device's
measured limit and its speed-up over the better of torch and torch.compile; then the per-call
overhead on small tensors. Writes ``report.json`` (every figure) and ``softmax_fwd_bandwidth.png``
(bandwidth against row length; needs matplotlib) into ``--out`` (default ``./bench-out``).

The figure of merit is bandwidth: the fewest bytes the op must move (each input read once, each
output written once; ``Case.nbytes``) over the median time. Every implementation of a case is
charged the same bytes, so the GB/s of torch's extra passes shows up as a lower number. The limit is
measured once per run: the better of ``y.copy_(x)`` and ``torch.mul(x, 2, out=y)`` on a large float32
tensor, bytes read + written (``measure_limit``). CUDA times come from CUDA events around each call
after warm-up, CPU times from ``time.perf_counter`` around each call at torch's default thread count;
on both the rows of a case take turns over rotated rounds (``bench_case``, ``TIMING``) and each row's
figure is the median of its calls. Inputs are random (never zeros).

The case grid, byte counts, inputs, implementations, timers and limit live here; ``bench/``
(pytest-benchmark) imports them, so both measure the same things the same way.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import datetime
import functools
import json
import math
import os
import platform
import re
import statistics
import sys
import time

import torch

import fastact
from fastact._optable import OPS as _TABLE

aten = torch.ops.aten

# The benchmarked ops, from the op table: the softmax family; every pointwise op once per value of its
# params (gelu is the erf form, gelu_tanh approximate="tanh"); the bias ops with their default params.
SOFTMAX_OPS = tuple(op.name for op in _TABLE if op.kind == "softmax")
# bench name -> (table row, params)
_POINTWISE = {label: (op, params) for op in _TABLE if op.kind == "pointwise" for label, params in op.variants}
_BIAS = {op.name: (op, op.variants[0][1]) for op in _TABLE if op.kind == "bias"}
ELEMENTWISE_OPS = tuple(_POINTWISE)
BIAS_OPS = tuple(_BIAS)
OPS = SOFTMAX_OPS + ELEMENTWISE_OPS + BIAS_OPS
DIRECTIONS = ("fwd", "bwd")
# Forced softmax kernel variants (the `variant=` argument of the softmax family's ops), CUDA only.
VARIANTS = ("warp", "vec", "scalar", "long_row", "strided", "split", "grid")

DTYPE_NAMES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16", torch.float64: "f64"}
DTYPES = {v: k for k, v in DTYPE_NAMES.items()}

MiB = 1 << 20
# Size class of the bandwidth cases: far beyond the H100's 50 MB L2 (and the CPU's L3), so every
# byte comes from memory. Quick mode keeps a small CPU busy for seconds, not minutes, per op.
FULL_CLASS_BYTES = 256 * MiB
QUICK_CLASS_BYTES = {"cuda": 128 * MiB, "cpu": 64 * MiB}
ROW_LENGTHS = {"full": (128, 1024, 4096, 16384, 65536, 262144), "quick": (128, 4096, 65536)}
# The irregular grid (``--grid irregular``): row lengths that models use and that no 128-bit vector
# divides — ViT-B/16's attention rows (197 tokens), ImageNet's 1000 classes, BERT's and GPT-2's
# vocabularies (30522, 50257) — and a strided-rows view, D = 4096 read from rows of 4097.
IRREGULAR_ROWS = {"full": (197, 1000, 30522, 50257), "quick": (197, 50257)}
VIEW_ROW = 4096
# The wide grid (``--grid wide``): what the other two leave out, f32 and bf16 on 256 MB-class tensors.
# Row lengths across the range: the powers of two between the bar's, hidden sizes (96, 768, 3072) and
# the vocabularies of current language models (32000 Llama 2, 128256 Llama 3, 151936 Qwen 2).
WIDE_ROWS = {"full": (32, 64, 96, 256, 512, 768, 2048, 3072, 8192, 32000, 32768, 128256, 131072, 151936, 524288,
                      1048576),
             "quick": (64, 768, 32000)}
# Softmax over a dim that is not the last, as (D, inner): [outer, D, inner] over dim 1 (outer from the
# size class), inner 0 meaning [D, rest] over dim 0 (one column block). Channel softmax of an NCHW map
# (64 channels of 64 x 64), long and short columns, odd D over odd columns (short, middling, long: each
# strided element rule of dispatch.h), and dim 0 of a matrix.
WIDE_STRIDED = {"full": ((64, 4096), (2048, 4096), (16, 1024), (1000, 256), (100, 1023), (257, 1023), (700, 1023),
                         (16384, 0)),
                "quick": ((64, 4096), (257, 1023))}
# Elementwise ops on a chunk view (Case.view), rows of CHUNK_ROW elements out of 2 * CHUNK_ROW.
CHUNK_ROW = 4096
OVERHEAD_SHAPE = (8, 1024)  # small enough that the call, not the data, is what costs
OVERHEAD_CALLS = 1000  # back-to-back calls per timed round

# The performance bar (``--check``; docs/performance.md, "The bar"). On CUDA: fastact's fraction of the measured limit,
# by (kind, direction) (Case.kind). On every device: in every case fastact no slower than torch or torch.compile,
# and the per-call overhead (OVERHEAD_SHAPE) within OVERHEAD_BAR of torch's own.
BARS = {
    ("softmax", "fwd"): 0.90,
    ("softmax", "bwd"): 0.88,
    ("strided", "fwd"): 0.85,
    ("strided", "bwd"): 0.85,
    ("elementwise", "fwd"): 0.95,
    ("elementwise", "bwd"): 0.95,
    ("bias_gelu", "fwd"): 0.95,
    ("bias_gelu", "bwd"): 0.85,
}

# The CPU's bar replaces the fractions with a speed-up: the geometric mean over the cells of torch eager's time over
# fastact's at least CPU_GEOMEAN_BAR. A CPU's limit is a copy that pays a read-for-ownership which fastact's
# streaming stores skip (fractions above 1 are normal there), and a 2-core machine's bandwidth is not what a CPU
# fallback is judged by: against torch on the same cores is.
CPU_GEOMEAN_BAR = 1.5
# fastact's host time per call on small tensors over torch's: "no more than torch's own, within 10%".
OVERHEAD_BAR = 1.10

# Largest ‖fastact − torch‖ / ‖torch‖ that counts as the same result (a sanity check that the
# benchmark times correct code, not the test suite): a few roundings of the output dtype.
MATCH_TOL = {torch.float64: 1e-6, torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}


class Skip(Exception):
    """This implementation does not run this case (a forced variant that cannot take the input,
    torch.compile switched off or out of budget)."""


# --------------------------------------------------------------------------------------------------
# Cases


@dataclasses.dataclass(frozen=True)
class Case:
    """One benchmark cell: an op in one direction on one input.

    ``dim`` is the softmax dim (other ops ignore it); ``out_dtype`` is the softmax family's
    ``dtype=`` (fused cast: ``x`` in ``dtype``, ``y`` in ``out_dtype``)."""

    op: str
    direction: str
    dtype: torch.dtype
    shape: tuple
    dim: int = -1
    out_dtype: torch.dtype | None = None
    # The input is a view that is not dense (make_inputs), None: dense. "sliced" (softmax family's
    # forward): x = base[..., 1:] of a [rows, D + 1] tensor, every row's start off its 16-byte
    # alignment, the layout of a sliced activation. "chunk" (gelu, sigmoid, bias_gelu): x =
    # base[..., H:] of a [rows, 2H] tensor, the second half of ``base.chunk(2, -1)`` as in a GeGLU
    # block (gelu's and bias_gelu's backwards read x in that layout; dy, and sigmoid's y, are dense).
    view: str | None = None

    @property
    def numel(self):
        return math.prod(self.shape)

    @property
    def last_dim(self):
        return self.dim % len(self.shape) == len(self.shape) - 1

    @property
    def row(self):
        """Length of the reduced dim (softmax family) or of the last dim."""
        return self.shape[self.dim] if self.op in SOFTMAX_OPS else self.shape[-1]

    @property
    def result_dtype(self):
        """The dtype of the op's (first) output: y forward, dx backward."""
        return (self.out_dtype or self.dtype) if self.direction == "fwd" else self.dtype

    @property
    def kind(self):
        """softmax (last dim), strided (another dim), elementwise or bias_gelu: selects the bar."""
        if self.op in SOFTMAX_OPS:
            return "softmax" if self.last_dim else "strided"
        return "bias_gelu" if self.op in BIAS_OPS else "elementwise"

    @property
    def dtype_name(self):
        s = DTYPE_NAMES[self.dtype]
        return f"{s}>{DTYPE_NAMES[self.out_dtype]}" if self.out_dtype is not None else s

    @property
    def shape_name(self):
        s = "x".join(map(str, self.shape))
        if self.view == "sliced":
            return f"{s} of {self.shape[-1] + 1}"
        if self.view == "chunk":
            return f"{s} of {2 * self.shape[-1]}"
        return s if self.op not in SOFTMAX_OPS or self.last_dim else f"{s} dim{self.dim % len(self.shape)}"

    @property
    def name(self):
        """Unique id, e.g. ``softmax-fwd-bf16-32768x4096`` or ``log_softmax-bwd-f32-32x1024x2048-dim1``."""
        return f"{self.op}-{self.direction}-{self.dtype_name}-{self.shape_name.replace(' ', '-')}"

    @property
    def group(self):
        """pytest-benchmark group: one per (op, direction, dtype, shape)."""
        return f"{self.op} {self.direction} {self.dtype_name} {self.shape_name}"

    @property
    def nbytes(self):
        """Fewest bytes the op must move: each input read once, each output written once.

        softmax/log_softmax fwd: read x, write y (2·N·size; with dtype=: N·in_size + N·out_size);
        bwd: read dy and y, write dx (3·N·size; with dtype=: 2·N·out_size + N·in_size).
        gelu, sigmoid fwd: read x, write y (2·N·size); bwd: read dy and x (gelu) or y (sigmoid),
        write dx (3·N·size). bias_gelu fwd: read x and bias, write y (2·N·size + H·size); bwd: read
        dy, x and bias, write dx and dbias (3·N·size + 2·H·size)."""
        n, s = self.numel, self.dtype.itemsize
        if self.op in SOFTMAX_OPS:
            o = (self.out_dtype or self.dtype).itemsize
            return n * s + n * o if self.direction == "fwd" else 2 * n * o + n * s
        if self.op in BIAS_OPS:
            h = self.shape[-1]
            return 2 * n * s + h * s if self.direction == "fwd" else 3 * n * s + 2 * h * s
        return 2 * n * s if self.direction == "fwd" else 3 * n * s

    def to_json(self):
        return {"name": self.name, "op": self.op, "direction": self.direction, "dtype": DTYPE_NAMES[self.dtype],
                "out_dtype": DTYPE_NAMES.get(self.out_dtype), "shape": list(self.shape),
                "dim": self.dim % len(self.shape), "row": self.row, "kind": self.kind, "bytes": self.nbytes,
                "view": self.view}


def _rows(class_bytes, row, itemsize):
    return max(1, class_bytes // (row * itemsize))


def _row_cases(op, direction, dtypes, row_lengths, cb):
    """Last-dim cases of the softmax family: one per dtype and row length (in that order), as many rows
    as fill ``cb`` bytes."""
    return [Case(op, direction, dt, (_rows(cb, D, dt.itemsize), D)) for dt in dtypes for D in row_lengths]


def class_bytes(mode, device_type):
    return FULL_CLASS_BYTES if mode == "full" else QUICK_CLASS_BYTES.get(device_type, QUICK_CLASS_BYTES["cpu"])


def cases(mode="full", device_type="cuda", grid="bar"):
    """The bandwidth grid, in report order: ``grid`` "bar" (the performance bar's grid, below),
    "irregular" (irregular_cases), "wide" (wide_cases) or "all" (the three).

    full (the performance bar's grid): softmax and log_softmax, fwd and bwd, rows of 128 … 262144
    elements in f32/bf16/f16 on 256 MB-class tensors (rows = 256 MB / (D·size)); the fused
    bf16 > f32 cast at D = 4096; softmax over dim 1 of [32, 1024, 2048] in f32 and bf16; gelu (erf,
    tanh) and sigmoid on 256 MB-class [rows, 4096] tensors; bias_gelu on [16384, 4096] and
    [8192, 8192] in f32 and bf16. quick: fewer row lengths and dtypes on smaller tensors."""
    if grid not in GRIDS:
        raise ValueError(f"unknown grid {grid!r}; choose from {GRIDS}")
    if grid == "irregular":
        return irregular_cases(mode, device_type)
    if grid == "wide":
        return wide_cases(mode, device_type)
    if grid == "all":
        return cases(mode, device_type) + irregular_cases(mode, device_type) + wide_cases(mode, device_type)
    full = mode == "full"
    cb = class_bytes(mode, device_type)
    f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
    dtypes = (f32, bf16, f16) if full else (f32, bf16)
    out = []
    for op in SOFTMAX_OPS:
        for d in DIRECTIONS:
            out += _row_cases(op, d, dtypes, ROW_LENGTHS[mode], cb)
            out.append(Case(op, d, bf16, (_rows(cb, 4096, 2), 4096), out_dtype=f32))
            # Softmax over a dim that is not the last: [outer, 1024, 2048], dim=1 (outer = 32 in full).
            outer = max(1, cb // (1024 * 2048 * 4))
            out += [Case(op, d, dt, (outer, 1024, 2048), dim=1) for dt in ((f32, bf16) if full else (f32,))]
    for op in ELEMENTWISE_OPS:
        for d in DIRECTIONS:
            out += [Case(op, d, dt, (_rows(cb, 4096, dt.itemsize), 4096)) for dt in dtypes]
    shapes = ((16384, 4096), (8192, 8192)) if full else ((_rows(cb, 4096, 4), 4096),)
    for d in DIRECTIONS:
        out += [Case(op, d, dt, s) for op in BIAS_OPS for dt in (f32, bf16) for s in shapes]
    return out


GRIDS = ("bar", "irregular", "wide", "all")


def irregular_cases(mode="full", device_type="cuda"):
    """Shapes off the powers of two: softmax and log_softmax, fwd and bwd, f32 and bf16, on rows of
    IRREGULAR_ROWS elements (no 128-bit vector divides them, so every row starts at another
    alignment), 256 MB-class tensors; and the softmax forward of a sliced view (``Case.view``)."""
    cb = class_bytes(mode, device_type)
    f32, bf16 = torch.float32, torch.bfloat16
    out = []
    for op in SOFTMAX_OPS:
        for d in DIRECTIONS:
            out += _row_cases(op, d, (f32, bf16), IRREGULAR_ROWS[mode], cb)
    for dt in (f32, bf16):
        out.append(Case("softmax", "fwd", dt, (_rows(cb, VIEW_ROW + 1, dt.itemsize), VIEW_ROW), view="sliced"))
    return out


def wide_cases(mode="full", device_type="cuda"):
    """Shapes the bar's grid leaves out, f32 and bf16, 256 MB-class tensors: softmax and log_softmax,
    fwd and bwd, on rows of WIDE_ROWS elements; softmax fwd and bwd over the WIDE_STRIDED dims; gelu
    (erf, tanh), sigmoid and bias_gelu on chunk views (Case.view), forward and (where the backward
    reads the view) backward."""
    cb = class_bytes(mode, device_type)
    f32, bf16 = torch.float32, torch.bfloat16
    out = []
    for op in SOFTMAX_OPS:
        for d in DIRECTIONS:
            out += _row_cases(op, d, (f32, bf16), WIDE_ROWS[mode], cb)
    for d in DIRECTIONS:
        for dt in (f32, bf16):
            for D, inner in WIDE_STRIDED[mode]:
                if inner == 0:
                    out.append(Case("softmax", d, dt, (D, _rows(cb, D, dt.itemsize)), dim=0))
                else:
                    out.append(Case("softmax", d, dt, (_rows(cb, D * inner, dt.itemsize), D, inner), dim=1))
    for op in ELEMENTWISE_OPS + BIAS_OPS:
        for d in DIRECTIONS:
            if d == "bwd" and op in _POINTWISE and _POINTWISE[op][0].saves == "output":
                continue  # its backward reads y, the forward's (dense) output
            out += [Case(op, d, dt, (_rows(cb, CHUNK_ROW, dt.itemsize), CHUNK_ROW), view="chunk") for dt in (f32, bf16)]
    return out


def overhead_cases():
    """Per-call overhead: every op, forward, on a small float32 tensor."""
    return [Case(op, "fwd", torch.float32, OVERHEAD_SHAPE) for op in OPS]


# --------------------------------------------------------------------------------------------------
# Inputs and implementations


def make_inputs(case, device, seed=0):
    """Random inputs by name: x (and bias b) forward; dy plus what the backward reads (y for softmax,
    log_softmax and sigmoid — computed from a random x —, x for gelu, x and b for bias_gelu, and
    h = x + b, which torch's autograd saves for F.gelu(x + b))."""
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(shape, dtype):
        return torch.randn(shape, generator=g, device=device, dtype=dtype)

    fwd = case.direction == "fwd"
    if case.view == "sliced":
        if not (fwd and case.op in SOFTMAX_OPS and case.last_dim):
            raise ValueError(f"{case.name}: only the softmax family's last-dim forward takes a sliced input")
        return {"x": randn((*case.shape[:-1], case.shape[-1] + 1), case.dtype)[..., 1:]}
    if case.view == "chunk":
        if case.op in SOFTMAX_OPS:
            raise ValueError(f"{case.name}: the softmax family takes no chunk view")
        h = case.shape[-1]
        x = randn((*case.shape[:-1], 2 * h), case.dtype)[..., h:]
    elif case.view is not None:
        raise ValueError(f"{case.name}: unknown view {case.view!r}")
    else:
        x = randn(case.shape, case.dtype)
    if case.op in SOFTMAX_OPS:
        if fwd:
            return {"x": x}
        f = torch.softmax if case.op == "softmax" else torch.log_softmax
        y = f(x, case.dim, dtype=case.out_dtype)
        del x
        return {"y": y, "dy": randn(y.shape, y.dtype)}
    if case.op in BIAS_OPS:
        b = randn((case.shape[-1],), case.dtype)
        if fwd:
            return {"x": x, "b": b}
        return {"x": x, "b": b, "h": x + b, "dy": randn(case.shape, case.dtype)}
    if fwd:
        return {"x": x}
    row, params = _POINTWISE[case.op]
    if row.saves == "output":
        y = row.torch_fn(x, **params)
        del x
        return {"y": y, "dy": randn(case.shape, case.dtype)}
    return {"x": x, "dy": randn(case.shape, case.dtype)}


def _saved(row):
    """The name of the input a pointwise row's backward reads besides dy."""
    return "y" if row.saves == "output" else "x"


def fastact_impl(case, variant="auto"):
    """fastact's function for the case and the names of the inputs it takes. Forward calls go through
    the public API (its overhead included); backward calls go to the registered backward ops that
    autograd calls. ``variant`` forces a softmax kernel."""
    op, dim = case.op, case.dim
    fwd = case.direction == "fwd"
    if variant != "auto" and op not in SOFTMAX_OPS:
        raise Skip(f"{op} has no kernel variants")
    if op in SOFTMAX_OPS:
        if fwd and variant == "auto":
            return functools.partial(getattr(fastact, op), dim=dim, dtype=case.out_dtype), ("x",)
        if fwd:
            return functools.partial(getattr(torch.ops.fastact, op).default, dim=dim, dtype=case.out_dtype,
                                     variant=variant), ("x",)
        bwd = getattr(torch.ops.fastact, op + "_backward").default
        return functools.partial(bwd, dim=dim, input_dtype=case.dtype, variant=variant), ("dy", "y")
    if op in BIAS_OPS:
        row, params = _BIAS[op]
        if fwd:
            return functools.partial(getattr(fastact, op), **params), ("x", "b")
        return functools.partial(getattr(torch.ops.fastact, row.backward).default, **params), ("dy", "x", "b")
    row, params = _POINTWISE[op]
    if fwd:
        return functools.partial(getattr(fastact, row.name), **params), ("x",)
    return functools.partial(getattr(torch.ops.fastact, row.backward).default, **params), ("dy", _saved(row))


def torch_impl(case, *, eager=True):
    """torch's way to compute the case (what eager autograd runs), as a function of tensors, and the
    names of the inputs it takes. ``eager=False``: a plain Python function for torch.compile (the
    same computation); eager forward calls are the torch functions themselves, as a user calls them."""
    op, dim = case.op, case.dim
    fwd = case.direction == "fwd"
    if eager and fwd and op not in BIAS_OPS:
        if op in SOFTMAX_OPS:
            return functools.partial(getattr(torch, op), dim=dim, dtype=case.out_dtype), ("x",)
        row, params = _POINTWISE[op]
        return (functools.partial(row.torch_fn, **params) if params else row.torch_fn), ("x",)
    if op in SOFTMAX_OPS:
        odt, idt = case.out_dtype, case.dtype
        if fwd:
            f = torch.softmax if op == "softmax" else torch.log_softmax

            def softmax_fwd(x):
                return f(x, dim, dtype=odt)

            return softmax_fwd, ("x",)
        b = aten._softmax_backward_data.default if op == "softmax" else aten._log_softmax_backward_data.default
        odt = odt or idt

        def softmax_bwd(dy, y):
            if odt == idt or (y.is_cuda and idt == torch.float16 and odt == torch.float32):
                return b(dy, y, dim, idt)  # same dtype, or CUDA's fused half-to-float softmax
            return b(dy, y, dim, odt).to(idt)  # softmax(x.to(odt)): its backward, then the cast's

        return softmax_bwd, ("dy", "y")
    if op in BIAS_OPS:
        row, params = _BIAS[op]
        f, fb = row.torch_fn, row.torch_backward.default
        if fwd:

            def bias_fwd(x, b):
                return f(x + b, **params)

            return bias_fwd, ("x", "b")

        def bias_bwd(dy, h):
            dh = fb(dy, h, **params)
            return dh, dh.sum(tuple(range(dh.dim() - 1)))

        return bias_bwd, ("dy", "h")
    row, params = _POINTWISE[op]
    f, fb = row.torch_fn, row.torch_backward.default
    if fwd:

        def pointwise_fwd(x):
            return f(x, **params)

        return pointwise_fwd, ("x",)

    def pointwise_bwd(dy, saved):
        return fb(dy, saved, **params)

    return pointwise_bwd, ("dy", _saved(row))


def _raise_recompile_limits():
    # Every case is a new shape, hence a recompile of the same Python function; past the limit
    # (8 by default) dynamo would silently run eager. Lift the limit and fail loudly if it is hit.
    c = torch._dynamo.config
    for name, value in (("recompile_limit", 100000), ("cache_size_limit", 100000),
                        ("accumulated_recompile_limit", 100000), ("accumulated_cache_size_limit", 100000),
                        ("fail_on_recompile_limit_hit", True), ("fail_on_cache_limit_hit", True)):
        if hasattr(c, name):
            setattr(c, name, value)


class Compiler:
    """torch.compile of torch_impl's functions: one compiled function per (op, direction, dtype, dim,
    out dtype), ``dynamic=False``, so each shape gets its own static kernels — what a user with fixed
    shapes gets — compiled on its first call, outside the timing (``prepare``).

    ``budget_s`` bounds the total compile time: once spent, cases get no torch.compile row (they
    are listed in ``skipped``). None: no bound."""

    def __init__(self, budget_s=None):
        self.budget_s = budget_s
        self.spent_s = 0.0
        self.compile_s = {}  # case name -> seconds of its first (compiling) call
        self.skipped = []
        self._fns = {}
        _raise_recompile_limits()

    def impl(self, case):
        if self.budget_s is not None and self.spent_s >= self.budget_s:
            self.skipped.append(case.name)
            raise Skip(f"torch.compile budget ({self.budget_s:.0f} s) spent")
        key = (case.op, case.direction, case.dtype, case.dim, case.out_dtype)
        fn, names = torch_impl(case, eager=False)
        if key not in self._fns:
            self._fns[key] = torch.compile(fn, dynamic=False)
        return self._fns[key], names


def impl_names(case, device, *, compile=True, variants=True):
    """The rows of a case: fastact (its own dispatch), each forced softmax variant (CUDA only),
    torch, torch.compile."""
    names = ["fastact"]
    if variants and torch.device(device).type == "cuda" and case.op in SOFTMAX_OPS:
        names += [f"fastact[{v}]" for v in VARIANTS]
    names.append("torch")
    if compile:
        names.append("torch.compile")
    return names


def implementation(case, name, compiler=None):
    if name == "fastact":
        return fastact_impl(case)
    if name.startswith("fastact["):
        return fastact_impl(case, name[len("fastact["):-1])
    if name == "torch":
        return torch_impl(case)
    if name == "torch.compile":
        if compiler is None:
            raise Skip("torch.compile not asked for")
        return compiler.impl(case)
    raise ValueError(f"unknown implementation {name!r}")


def keep_cpu_allocations():
    """CPU: let glibc's malloc reuse freed memory for large blocks instead of returning it to the
    system. torch's CPU allocator does not cache, so by default every output beyond glibc's mmap
    threshold (at most 32 MB) is a fresh mapping whose pages fault in on first write — on the 2-core
    dev VM that is 10 ms for a 32 MB output, four times the softmax itself, and it would hide the
    kernels behind the kernel's page-fault path. With this, outputs reuse memory as they do under
    CUDA's caching allocator. Every implementation gets the same treatment. Returns whether it
    applied (glibc only)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    return bool(mallopt(m_mmap_threshold, 1 << 30) and mallopt(m_trim_threshold, (1 << 31) - 1))


def release_cpu_allocations():
    """After a case under keep_cpu_allocations: hand the freed memory back to the system (malloc_trim),
    which the raised trim threshold otherwise keeps for good. Kept across cases of different sizes, in
    the arenas of every thread that allocated (the main thread's, oneTBB's and OpenMP's workers'), it
    grew past 24 GB on the 24 GiB dev VM by the 86th case of the full CPU report; within a case the
    timed calls still reuse their memory."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def prepare(case, name, inputs, device, compiler=None):
    """A zero-argument callable that runs implementation ``name`` on ``inputs``, called once already
    (compiled, warmed up), and the seconds that first call took. Raises Skip where the
    implementation does not take the case (a forced variant's "cannot take")."""
    fn, names = implementation(case, name, compiler)
    call = functools.partial(fn, *(inputs[n] for n in names))
    t0 = time.perf_counter()
    try:
        call()
        sync(device)
    except RuntimeError as e:
        if "cannot take" in str(e):
            raise Skip(f"{name} cannot take this input") from None
        raise
    first = time.perf_counter() - t0
    if name == "torch.compile":
        compiler.spent_s += first
        compiler.compile_s[case.name] = first
    return call, first


def mismatch(out, ref):
    """‖out − ref‖ / ‖ref‖ in float64, the worst over the outputs (bias_gelu's backward has two); inf
    when the shapes or the positions of non-finite values differ."""
    outs = out if isinstance(out, tuple) else (out,)
    refs = ref if isinstance(ref, tuple) else (ref,)
    worst = 0.0
    for o, r in zip(outs, refs, strict=True):
        if o.shape != r.shape:
            return math.inf
        o, r = o.double(), r.double()
        fin = torch.isfinite(r)
        if not torch.equal(torch.isfinite(o), fin):
            return math.inf
        err = torch.linalg.vector_norm((o - r)[fin]) / torch.linalg.vector_norm(r[fin]).clamp_min(1e-30)
        worst = max(worst, float(err))
    return worst


# --------------------------------------------------------------------------------------------------
# Timing


@dataclasses.dataclass
class Timing:
    """How long to time each row: until ``target_s`` of timed calls or ``max_reps``, at least
    ``min_reps``; ``warmup`` untimed calls first. bench_case splits that over ``rounds`` rounds, the
    rows of a case taking turns in a rotated order (see there)."""

    target_s: float = 0.05
    min_reps: int = 20
    max_reps: int = 200
    warmup: int = 3
    rounds: int = 1  # at least 1

    def per_round(self):
        """The share of one round (each row's warm-up repeated in every round)."""
        r = self.rounds
        return dataclasses.replace(self, target_s=self.target_s / r, min_reps=-(-self.min_reps // r),
                                   max_reps=-(-self.max_reps // r), rounds=1)


# CPU rows take turns over three rounds, as CUDA's do: with one, a burst of another tenant's work on a shared VM fell on
# whichever row was being timed, and two quick reports in a row on the same 2-core VM (AMD EPYC)
# each showed one cell at 0.72-0.80x the better of torch and torch.compile, a different cell each
# time, every one ahead when re-timed alone (log_softmax backward bf16>f32 [8192, 4096]: 20.9 ms in the report,
# 9.5-11.4 alone, torch.compile 14.5-15.2).
TIMING = {
    ("cuda", "full"): Timing(0.05, 20, 200, 5, 3),
    ("cuda", "quick"): Timing(0.03, 20, 100, 3, 2),
    ("cpu", "full"): Timing(1.0, 6, 51, 1, 3),
    ("cpu", "quick"): Timing(0.25, 6, 30, 1, 3),
}


def timing_for(device, mode):
    return TIMING.get((torch.device(device).type, mode), TIMING[("cpu", mode)])


def time_samples(call, device, timing=None):
    """Seconds of each timed call. CUDA: CUDA events around each of back-to-back calls, after
    warm-up (the GPU's time per call, without host gaps). CPU: time.perf_counter around each call."""
    device = torch.device(device)
    timing = timing or timing_for(device, "full")
    for _ in range(timing.warmup):
        call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        call()
        torch.cuda.synchronize(device)
        est = max(time.perf_counter() - t0, 1e-6)
        reps = int(min(timing.max_reps, max(timing.min_reps, timing.target_s / est)))
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for start, end in events:
            start.record()
            call()
            end.record()
        torch.cuda.synchronize(device)
        return [s.elapsed_time(e) / 1e3 for s, e in events]
    times = []
    deadline = time.perf_counter() + timing.target_s
    while len(times) < timing.max_reps and (len(times) < timing.min_reps or time.perf_counter() < deadline):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return times


def time_call(call, device, timing=None):
    """Median seconds of one call (time_samples)."""
    return statistics.median(time_samples(call, device, timing))


def time_per_call(calls_by_name, device, calls=OVERHEAD_CALLS, rounds=9):
    """Host time per call of each callable in ``calls_by_name``: wall time of ``calls`` back-to-back
    calls (then one synchronize) over ``calls``, the best of ``rounds`` rounds, after warm-up. The
    rounds of the callables alternate, so a drift of the machine (clock, a background process) hits
    them alike, and the best round is taken because host noise only ever adds time. On CUDA with
    small tensors this is the launch path: argument handling, dispatch, allocation, the launch."""
    for call in calls_by_name.values():
        for _ in range(min(100, calls)):
            call()
    sync(device)
    best = {name: math.inf for name in calls_by_name}
    for _ in range(rounds):
        for name, call in calls_by_name.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                call()
            sync(device)
            best[name] = min(best[name], (time.perf_counter() - t0) / calls)
    return best


def limit_bytes(mode, device_type):
    # On CUDA at least 256 MB whatever the mode: the limit must be far beyond L2.
    cb = class_bytes(mode, device_type)
    return max(cb, FULL_CLASS_BYTES) if device_type == "cuda" else cb


def measure_limit(device, nbytes=FULL_CLASS_BYTES, timing=None):
    """The device's bandwidth limit in GB/s: the better of torch's copy ``y.copy_(x)`` and a simple
    elementwise kernel ``torch.mul(x, 2, out=y)`` on float32 tensors of ``nbytes`` each, counting
    bytes read + written."""
    device = torch.device(device)
    timing = timing or timing_for(device, "full")
    x = torch.randn(nbytes // 4, device=device)
    y = torch.empty_like(x)
    moved = 2 * x.numel() * 4
    copy_s = time_call(lambda: y.copy_(x), device, timing)
    mul_s = time_call(lambda: torch.mul(x, 2, out=y), device, timing)
    del x, y
    copy, mul = moved / copy_s / 1e9, moved / mul_s / 1e9
    return {"limit_gbps": max(copy, mul), "copy_gbps": copy, "mul_gbps": mul, "bytes": nbytes,
            "method": "max(y.copy_(x), torch.mul(x, 2, out=y)), float32, bytes = read + write"}


def figures(case, seconds, limit_gbps):
    """GB/s and the fraction of the limit for one timed row."""
    gbps = case.nbytes / seconds / 1e9
    return {"time_us": seconds * 1e6, "gbps": gbps, "fraction": gbps / limit_gbps if limit_gbps else math.nan}


# --------------------------------------------------------------------------------------------------
# The report


def bench_case(case, device, compiler=None, *, variants=True, timing=None, verify=True):
    """Every row of one case: {"case": …, "rows": {name: figures}, "skipped": {name: why}, …}."""
    inputs = make_inputs(case, device)
    rows, skipped, errors, mismatches, outputs, checked = {}, {}, {}, {}, {}, {}
    calls, firsts = {}, {}
    for name in impl_names(case, device, compile=compiler is not None, variants=variants):
        try:
            calls[name], firsts[name] = prepare(case, name, inputs, device, compiler)
        except Skip as e:
            skipped[name] = str(e)
        except Exception as e:  # noqa: BLE001 — reported (and a miss under --check), the report goes on
            errors[name] = f"{type(e).__name__}: {e}"[:4000]
    # The rows take turns over timing.rounds rounds, each round starting 1 / rounds of the way further along the
    # rows, and each row's figure is the median of all its samples: a row timed first in one round is timed late
    # in another, so whatever drifts during a case (the GPU's clocks after make_inputs' writes, a background
    # process) falls on the rows more alike (exactly alike only with as many rounds as rows). Timed one after the
    # other, the first row (fastact's auto dispatch) read slower than the same kernel forced and timed next in 80
    # of the 84 softmax cells of an H100 bar report (median 0.11%, up to 0.34%; a diag that replayed the report's
    # rows found the first row's first round slow), enough to decide a tie. The first row also runs
    # untimed for one round's length before any timing: on CUDA it settles the clocks; on the CPU a case's fresh
    # tensors ran their first calls slow on the 2-core dev VM (gelu backward bf16 [8192, 4096]: 5-20 calls at 25-31
    # ms, then 10; torch's first calls 29-39 ms, then 16), and with the CPU's single round that window fell on the
    # first row alone (the quick report's cell read 0.75x torch).
    timing = timing or timing_for(device, "full")
    share = timing.per_round()
    samples = {name: [] for name in calls}
    order = list(calls)
    if order:
        time_samples(calls[order[0]], device, share)  # untimed: settles the device
        step = max(1, len(order) // timing.rounds)
        for r in range(timing.rounds):
            k = (r * step) % len(order)
            for name in order[k:] + order[:k]:
                samples[name] += time_samples(calls[name], device, share)
    for name, call in calls.items():
        ts = samples[name]
        # min_s and reps in the JSON tell noise apart: a min far under the median means interference.
        rows[name] = {"seconds": statistics.median(ts), "min_s": min(ts), "reps": len(ts), "first_call_s": firsts[name]}
        if verify and (name.startswith("fastact") or name == "torch"):
            checked[name] = call
    calls.clear()
    # The outputs to verify are made only after every row is timed, so that each row is timed with the same
    # tensors alive: its own output then comes from the same cached block as every other row's. Kept outputs
    # put the later rows' outputs elsewhere in memory, and where a 256 MB output lies relative to its input
    # moved a memory-bound kernel by up to 0.3% on the H100 (a diag of the 16-bit elementwise kernels beside
    # torch's), enough to decide a tie.
    for name, call in checked.items():
        outputs[name] = call()
    checked.clear()
    if verify and "torch" in outputs:
        ref = outputs.pop("torch")
        tol = MATCH_TOL[case.result_dtype]
        for name, out in outputs.items():
            err = mismatch(out, ref)
            if not err <= tol:
                mismatches[name] = err
        del ref
    outputs.clear()
    explain = None
    if case.op in SOFTMAX_OPS:
        op = case.op if case.direction == "fwd" else case.op + "_backward"
        t = inputs["x"] if case.direction == "fwd" else inputs["y"]
        # The op's dtype argument: the forward's output dtype, the backward's input_dtype (the fused cast's).
        dtype = None if case.out_dtype is None else (case.out_dtype if case.direction == "fwd" else case.dtype)
        try:
            explain = fastact.explain(op, t, case.dim, dtype=dtype)
        except Exception as e:  # noqa: BLE001 — a report must not die on explain
            explain = f"explain failed: {e}"
    del inputs
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    return {"case": case, "rows": rows, "skipped": skipped, "errors": errors, "mismatch": mismatches,
            "explain": explain}


def summarise(result, limit_gbps):
    """Adds GB/s and fractions to each row and fastact's speed-up over the better of torch and
    torch.compile."""
    case = result["case"]
    for row in result["rows"].values():
        row.update(figures(case, row["seconds"], limit_gbps))
    rows = result["rows"]
    base = [rows[n]["seconds"] for n in ("torch", "torch.compile") if n in rows]
    fa = rows.get("fastact")
    result["best_torch_s"] = min(base) if base else None
    result["speedup"] = min(base) / fa["seconds"] if base and fa else None
    forced = {n: r["seconds"] for n, r in rows.items() if n.startswith("fastact[")}
    result["best_variant"] = min(forced, key=forced.get) if forced else None
    return result


def fraction_bar(case, device_type):
    """The fraction of the limit ``case`` must reach on a device of ``device_type``: BARS on CUDA; None on the CPU,
    whose bar is a speed-up (CPU_GEOMEAN_BAR)."""
    return BARS[(case.kind, case.direction)] if device_type == "cuda" else None


def check(result, device_type):
    """The bar's misses for one summarised case on a device of ``device_type``, as sentences (empty: the case
    passes). The bar's misses of the whole run are check_run's."""
    case, rows = result["case"], result["rows"]
    misses = []
    fa = rows.get("fastact")
    if fa is None:
        return [f"{case.name}: no fastact figure"]
    bar = fraction_bar(case, device_type)
    if bar is not None and fa["fraction"] < bar:
        misses.append(f"{case.name}: {fa['fraction']:.3f} of the limit < {bar:.2f}")
    for n in ("torch", "torch.compile"):
        if n in rows and rows[n]["seconds"] < fa["seconds"]:
            misses.append(f"{case.name}: slower than {n} ({fa['time_us']:.1f} us vs {rows[n]['time_us']:.1f} us)")
    for n, err in result["errors"].items():
        if n.startswith("fastact"):  # a torch or torch.compile failure is shown, but is not fastact's miss
            misses.append(f"{case.name}: {n} failed: {err.splitlines()[0][:300]}")
    for n, err in result["mismatch"].items():
        misses.append(f"{case.name}: {n} differs from torch (relative error {err:.2e})")
    return misses


def geomean(values):
    """Geometric mean of positive numbers; None for none."""
    values = list(values)
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else None


def speedup_summary(results):
    """Geometric means over the cases with both figures: torch eager's time over fastact's (``vs_torch``, the CPU
    bar's figure) and the better of torch and torch.compile over fastact's (``vs_best``: the cases that measured
    torch.compile), with their case counts."""
    vs_torch = [r["rows"]["torch"]["seconds"] / r["rows"]["fastact"]["seconds"] for r in results
                if "fastact" in r["rows"] and "torch" in r["rows"]]
    vs_best = [r["speedup"] for r in results if r["speedup"] and "torch.compile" in r["rows"]]
    return {"vs_torch": geomean(vs_torch), "cases_vs_torch": len(vs_torch),
            "vs_best": geomean(vs_best), "cases_vs_best": len(vs_best)}


def check_run(speedups, overhead, device_type):
    """The bar's misses that belong to the run, not to one case, as sentences: on the CPU the geometric mean of the
    speed-ups over torch (speedup_summary) under CPU_GEOMEAN_BAR; on every device each op's per-call overhead
    (bench_overhead) over OVERHEAD_BAR times torch's."""
    misses = []
    g = speedups["vs_torch"]
    if device_type == "cpu" and g is not None and g < CPU_GEOMEAN_BAR:
        misses.append(f"speed-up over torch, geometric mean of {speedups['cases_vs_torch']} case(s): {g:.2f}x < "
                      f"{CPU_GEOMEAN_BAR:.1f}x")
    for o in overhead:
        f, t = o.get("fastact_us"), o.get("torch_us")
        if not (f and t):
            misses.append(f"per-call overhead of {o['op']}: no figure")
        elif f / t > OVERHEAD_BAR:
            misses.append(f"per-call overhead of {o['op']}: {f:.2f} us, {f / t:.2f}x torch's {t:.2f} us > "
                          f"{OVERHEAD_BAR:.2f}x")
    return misses


def format_speedups(speedups):
    if not speedups["cases_vs_torch"]:
        return []
    line = (f"\nspeed-up, geometric mean: {speedups['vs_torch']:.2f}x over torch ({speedups['cases_vs_torch']} "
            "case(s))")
    if speedups["cases_vs_best"] and speedups["vs_best"] is not None:
        line += (f", {speedups['vs_best']:.2f}x over the better of torch and torch.compile "
                 f"({speedups['cases_vs_best']} case(s))")
    return [line]


def _fmt_us(row):
    if row is None:
        return "-"
    us = row["time_us"]
    return f"{us:.1f}" if us < 1e4 else f"{us:.0f}"


def _fmt_speedup(s):
    return f"{s:.2f}x" if s else "-"


def _variant_note(result):
    """On CUDA's softmax rows: the dispatcher's choice (first word of explain) and, when a forced
    variant beats it by more than 2%, which one and by how much."""
    rows, best = result["rows"], result["best_variant"]
    # explain reads "variant=vec: why…" (CUDA) or "variant=cpu_lastdim: …".
    chosen = result["explain"].split(":")[0].split("=")[-1].strip()[:12] if result["explain"] else "?"
    if best is None or "fastact" not in rows:
        return chosen
    gain = rows["fastact"]["seconds"] / rows[best]["seconds"]
    return f"{chosen}; {best[8:-1]} {gain:.2f}x" if gain > 1.02 else chosen


def format_tables(results, limit, *, with_check=False, device_type="cpu"):
    lines = []
    for op in OPS:
        rs = [r for r in results if r["case"].op == op]
        if not rs:
            continue
        variants = device_type == "cuda" and op in SOFTMAX_OPS
        head = (f"{'shape':<20} {'dtype':<8} {'dir':<4} {'fastact us':>11} {'torch us':>10} {'compile us':>11} "
                f"{'GB/s':>8} {'of limit':>8} {'speed-up':>8}")
        head += f"  {'kernel':<22}" if variants else ""
        head += f"  {'bar':>4}" if with_check else ""
        lines += ["", f"== {op} ==  (GB/s: fastact's minimum bytes / median time; limit {limit['limit_gbps']:.1f} GB/s;"
                  " speed-up: min(torch, torch.compile) / fastact)", head, "-" * len(head)]
        for r in rs:
            c, rows = r["case"], r["rows"]
            fa = rows.get("fastact")
            line = (f"{c.shape_name:<20} {c.dtype_name:<8} {c.direction:<4} {_fmt_us(fa):>11} "
                    f"{_fmt_us(rows.get('torch')):>10} {_fmt_us(rows.get('torch.compile')):>11} "
                    f"{(fa['gbps'] if fa else math.nan):>8.1f} {(fa['fraction'] if fa else math.nan):>8.3f} "
                    f"{_fmt_speedup(r['speedup']):>8}")
            if variants:
                line += f"  {_variant_note(r):<22}"
            if with_check:
                line += f"  {'ok' if not r['misses'] else 'MISS':>4}"
            if r["mismatch"]:
                line += "  WRONG: " + ", ".join(r["mismatch"])
            if r["errors"]:
                line += "  ERROR: " + ", ".join(r["errors"])
            lines.append(line)
    return lines


def format_overhead(overhead):
    lines = ["", f"== per-call overhead ({'x'.join(map(str, OVERHEAD_SHAPE))} float32, forward; wall time of "
             f"{OVERHEAD_CALLS} back-to-back calls / {OVERHEAD_CALLS}, best of interleaved rounds) =="]
    head = f"{'op':<12} {'fastact us':>11} {'torch us':>10} {'fastact/torch':>14}"
    lines += [head, "-" * len(head)]
    for o in overhead:
        f, t = o.get("fastact_us"), o.get("torch_us")
        ratio = f"{f / t:.2f}" if f and t else "-"
        lines.append(f"{o['op']:<12} {f if f is not None else math.nan:>11.2f} {t if t is not None else math.nan:>10.2f} "
                     f"{ratio:>14}")
    return lines


def bench_overhead(device, ops=OPS):
    out = []
    for case in overhead_cases():
        if case.op not in ops:
            continue
        inputs = make_inputs(case, device)
        entry = {"op": case.op, "shape": list(case.shape), "dtype": "f32", "calls": OVERHEAD_CALLS}
        calls = {name: prepare(case, name, inputs, device)[0] for name in ("fastact", "torch")}
        for name, seconds in time_per_call(calls, device).items():
            entry[f"{name}_us"] = seconds * 1e6
        out.append(entry)
    return out


def plot(results, limit, path, device_name):
    """Bandwidth against row length for softmax fwd (last dim, no cast): one panel per dtype, lines
    for fastact, torch and torch.compile, and the limit. Returns a message."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot (pip install matplotlib)"
    sel = [r for r in results if r["case"].op == "softmax" and r["case"].direction == "fwd"
           and r["case"].last_dim and r["case"].out_dtype is None]
    dtypes = [d for d in DTYPE_NAMES if any(r["case"].dtype == d for r in sel)]
    if not dtypes:
        return "no softmax fwd cases: no plot"
    fig, axes = plt.subplots(1, len(dtypes), figsize=(5 * len(dtypes), 4), squeeze=False, sharey=True)
    for ax, dt in zip(axes[0], dtypes):
        rs = sorted((r for r in sel if r["case"].dtype == dt), key=lambda r: r["case"].row)
        for name, style in (("fastact", "o-"), ("torch", "s--"), ("torch.compile", "^:")):
            pts = [(r["case"].row, r["rows"][name]["gbps"]) for r in rs if name in r["rows"]]
            if pts:
                ax.plot(*zip(*pts), style, label=name)
        ax.axhline(limit["limit_gbps"], color="k", lw=1, label=f"limit {limit['limit_gbps']:.0f} GB/s")
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("row length (elements)")
        ax.set_title(f"softmax fwd {DTYPE_NAMES[dt]}")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("GB/s (minimum bytes / median time)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(device_name, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"wrote {path}"


def device_name(device):
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return f"CPU {model}, {os.cpu_count()} cores, {torch.get_num_threads()} threads"


def _json_result(r):
    return {"case": r["case"].to_json(), "rows": r["rows"], "skipped": r["skipped"], "errors": r["errors"],
            "mismatch": r["mismatch"],
            "explain": r["explain"], "speedup": r["speedup"], "best_variant": r["best_variant"],
            "bar": r["bar"], "misses": r["misses"]}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m fastact.bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda if available, else cpu")
    p.add_argument("--quick", action="store_true",
                   help="a small grid on smaller tensors (minutes on a 2-core CPU)")
    p.add_argument("--no-compile", action="store_true", help="no torch.compile rows (compilation is the slow part)")
    p.add_argument("--compile-budget", type=float, default=None, metavar="S",
                   help="stop compiling after S seconds of compilation in all (default: 240 in full mode on "
                        "CUDA, no bound otherwise); later cases get no torch.compile row")
    p.add_argument("--no-variants", action="store_true", help="CUDA: no forced softmax variant rows")
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    p.add_argument("--grid", choices=GRIDS, default="bar",
                   help="bar: the performance bar's grid (default); irregular: row lengths no 128-bit vector "
                        "divides (197, 1000, 30522, 50257) and a sliced view; wide: row lengths across the range "
                        "and model vocabularies, other softmax dims, elementwise ops on chunk views; all: the three")
    p.add_argument("--match", default=None, metavar="REGEX",
                   help="only the grid's cases whose name (e.g. softmax-fwd-bf16-128x1048576) REGEX matches")
    p.add_argument("--check", action="store_true",
                   help="mark each case against the performance bar (CUDA: the fraction of the limit; every "
                        "device: no slower than torch or torch.compile; the CPU: the speed-ups' geometric mean), "
                        "and the per-call overhead; print the misses, exit 1 if any")
    p.add_argument("--default-malloc", action="store_true",
                   help="CPU: leave glibc's malloc as it is, so every large output comes from fresh pages "
                        "(page faults in every call; see keep_cpu_allocations)")
    p.add_argument("--models", action="store_true", help="also a GPT-2 and a BERT training step with and without "
                   "fastact (fastact/bench_models.py; needs transformers)")
    p.add_argument("--out", default="bench-out", help="folder for report.json and the PNG (default ./bench-out)")
    args = p.parse_args(argv)

    t_start = time.perf_counter()
    dev_type = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dev_type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: CUDA is not available")
    device = torch.device(dev_type)
    mode = "quick" if args.quick else "full"
    ops = tuple(o for o in args.ops.split(",") if o)
    bad = [o for o in ops if o not in OPS]
    if bad:
        p.error(f"--ops: unknown {bad}; choose from {OPS}")
    budget = args.compile_budget
    if budget is None and mode == "full" and dev_type == "cuda":
        budget = 240.0
    timing = timing_for(device, mode)
    malloc_kept = dev_type == "cpu" and not args.default_malloc and keep_cpu_allocations()
    name = device_name(device)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(f"fastact {fastact.__version__} bench: {name}, torch {torch.__version__}, mode {mode}, "
          f"threads {torch.get_num_threads()}" + (f", load average {load:.2f}" if load is not None else ""), flush=True)
    if dev_type == "cpu" and load is not None and load > 1.0:
        print(f"warning: load average {load:.2f} before the run: other processes share the CPU, its figures "
              "will be noisy", flush=True)

    limit = measure_limit(device, limit_bytes(mode, dev_type), timing)
    print(f"limit {limit['limit_gbps']:.1f} GB/s (copy {limit['copy_gbps']:.1f}, mul {limit['mul_gbps']:.1f}; "
          f"{limit['bytes'] // MiB} MiB float32, read + write)", flush=True)

    compiler = None if args.no_compile else Compiler(budget)
    grid = [c for c in cases(mode, dev_type, args.grid) if c.op in ops]
    if args.match is not None:
        grid = [c for c in grid if re.search(args.match, c.name)]
    results = []
    for i, case in enumerate(grid, 1):
        r = summarise(bench_case(case, device, compiler, variants=not args.no_variants, timing=timing),
                      limit["limit_gbps"])
        r["bar"] = fraction_bar(case, dev_type)
        r["misses"] = check(r, dev_type)
        results.append(r)
        if malloc_kept:
            release_cpu_allocations()
        rows = r["rows"]
        msg = "  ".join(f"{n} {rows[n]['time_us']:.1f}us" for n in ("fastact", "torch", "torch.compile") if n in rows)
        comp = compiler.compile_s.get(case.name) if compiler else None
        print(f"[{i}/{len(grid)}] {case.name}: {msg}" + (f"  (compiled in {comp:.1f} s)" if comp else "")
              + (f"  MISMATCH {r['mismatch']}" if r["mismatch"] else "")
              + "".join(f"\n  {n} failed: {e}" for n, e in r["errors"].items()), file=sys.stderr, flush=True)

    overhead = bench_overhead(device, ops)

    lines = [f"", f"fastact bench: {name}; torch {torch.__version__}; {mode} mode; "
             f"limit {limit['limit_gbps']:.1f} GB/s"]
    lines += format_tables(results, limit, with_check=args.check, device_type=dev_type)
    speedups = speedup_summary(results)
    lines += format_speedups(speedups)
    lines += format_overhead(overhead)
    models = None
    if args.models:
        from . import bench_models
        models, model_lines = bench_models.report(device)
        lines += model_lines
    if compiler is not None:
        lines.append(f"\ntorch.compile: {len(compiler.compile_s)} compilations, {compiler.spent_s:.1f} s"
                     + (f"; budget spent, no compile row for {len(compiler.skipped)} case(s): "
                        + ", ".join(compiler.skipped) if compiler.skipped else ""))
    print("\n".join(lines), flush=True)

    os.makedirs(args.out, exist_ok=True)
    misses = [m for r in results for m in r["misses"]] + check_run(speedups, overhead, dev_type)
    report = {
        "meta": {"fastact": fastact.__version__, "torch": torch.__version__, "device": name, "device_type": dev_type,
                 "mode": mode, "grid": args.grid, "match": args.match, "threads": torch.get_num_threads(),
                 "load_average": load, "python": platform.python_version(),
                 "date": datetime.datetime.now().isoformat(timespec="seconds"),
                 "timing": dataclasses.asdict(timing), "cpu_malloc_kept": malloc_kept,
                 "compile": None if compiler is None else {"seconds": compiler.spent_s, "budget_s": compiler.budget_s,
                                                           "per_case_s": compiler.compile_s,
                                                           "skipped": compiler.skipped}},
        "limit": limit,
        "results": [_json_result(r) for r in results],
        "overhead": overhead,
        "speedups": speedups,
        "bar": {"fractions": {f"{k}-{d}": v for (k, d), v in BARS.items()} if dev_type == "cuda" else None,
                "cpu_geomean": CPU_GEOMEAN_BAR if dev_type == "cpu" else None, "overhead": OVERHEAD_BAR},
        "misses": misses,
        "models": models,
    }
    path = os.path.join(args.out, "report.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=1, default=str)
    print(f"\nwrote {path}")
    print(plot(results, limit, os.path.join(args.out, "softmax_fwd_bandwidth.png"), name))
    if args.check:
        print(f"\ncheck: {len(misses)} miss(es) against the bar" + (":" if misses else ""))
        for m in misses:
            print(f"  {m}")
    print(f"total {time.perf_counter() - t_start:.0f} s")
    return 1 if args.check and misses else 0


if __name__ == "__main__":
    sys.exit(main())
