"""Shared helpers of the CUDA-only tests (tests/test_cuda_*.py): the softmax variants, the dtype pairs, row lengths
and shape classes the forced-variant tests sweep, which variant must take or refuse which input, and explain()'s
machine-readable plan line, read and checked for what every plan must satisfy (never against the tuning:
tests/host/dispatch_golden.txt.gz pins that). No GPU query at import: each test module skips before importing this
where CUDA is absent. The device-parametrised tests of the other files run on CUDA too.

Unwritten outputs: the tests leave the caching allocator holding NaN-filled blocks of the output's size before each
call (fastact_testing.poison_allocator), so an element a kernel fails to write shows up as NaN."""

import os

import torch

import fastact
from fastact_testing import BOUNDARY_SIZES, make_tensor, strided_tensor

# include/fastact/dispatch.h: "split" is long_row's two-read fallback and "grid" its mode beyond a
# cluster, each forceable on its own.
VARIANTS = ("warp", "vec", "scalar", "long_row", "split", "strided", "grid")
# input dtype, output dtype (the fused conversions included)
DTYPE_CONFIGS = [
    (torch.float32, torch.float32),
    (torch.float64, torch.float64),
    (torch.float16, torch.float16),
    (torch.bfloat16, torch.bfloat16),
    (torch.bfloat16, torch.float32),
    (torch.float16, torch.float32),
]
# Row lengths: the suite's boundaries, the 128-bit vector widths +-1 (4 floats, 8 halves, 2
# doubles), lengths around lines the dispatcher drew when these were chosen (the warp kernel's 512 for float64 and
# 1024, one block's register cache: 512 or 1024 threads x 8, 16 or 32 elements; docs/dispatch.md has the current
# ones), and a row far beyond what one SM holds. Every variant runs forced at every length, so where the lines lie
# now changes which plans auto picks, not what is tested.
THRESHOLDS = (512, 768, 896, 1024, 4096, 8192, 10240, 16384, 32768)
CUDA_SIZES = tuple(
    sorted(set(BOUNDARY_SIZES + (3, 4, 5, 7, 8, 9, 15, 16, 17, 262144) + tuple(t + k for t in THRESHOLDS for k in (-1, 0, 1))))
)
# Shape classes: inner == 1 rows (contiguous; misaligned dense; `x[..., 1:]` rows with a stride and
# a misaligned start; aligned rows with a padded stride; a transposed tensor reduced over its
# memory-contiguous dim) and inner > 1 (strided: 2 and 33 take element accesses, 64 and 40 the
# 128-bit vectors of every dtype; 40 leaves the last tile of columns partial).
CLASSES = ("rows", "misaligned", "row_strided", "row_padded", "transposed", "strided_2", "strided_33", "strided_64",
           "strided_40")
MAX_ELEMENTS = 1 << 21


def _vec_width(dtype):
    return 16 // dtype.itemsize


def _rows(d):
    return max(3, min(1031, (1 << 19) // d))


def make_class(cls, d, dtype):
    """(x, dim) of shape class `cls` with reduction length d."""
    if cls.startswith("strided_"):
        inner = int(cls.split("_")[1])
        outer = max(1, min(5, MAX_ELEMENTS // (d * inner)))
        return make_tensor((outer, d, inner), dtype, "cuda"), 1
    rows = _rows(d)
    if cls == "rows":
        return make_tensor((rows, d), dtype, "cuda"), -1
    if cls == "misaligned":
        return strided_tensor((rows, d), dtype, "cuda", offset=1), -1
    if cls == "row_strided":
        return strided_tensor((rows, d), dtype, "cuda", slices={1: (1, 1, 0)}), -1
    if cls == "row_padded":
        return strided_tensor((rows, d), dtype, "cuda", slices={1: (0, 1, _vec_width(dtype))}), -1
    if cls == "transposed":
        return make_tensor((rows, d), dtype, "cuda").t(), 0
    raise ValueError(cls)


def must_accept(variant, cls, d, dtype):
    """Where a forced variant must take the input (docs/dispatch.md's table of variants and include/fastact/dispatch.h);
    elsewhere it may take it (and must then be right) or refuse with "cannot take"."""
    # a softmax dim of size 1 is a rows problem whatever its stride (csrc/common.h): rows of one element
    inner1 = not cls.startswith("strided_") or d == 1
    aligned = cls in ("rows", "row_padded", "transposed")
    if variant == "warp":  # the row in one warp's registers: 1024 values (512 doubles)
        return inner1 and d <= (512 if dtype == torch.float64 else 1024)
    if variant == "vec":  # aligned rows that fit one block's registers (4096 is far below that); a D that
        # the vector width does not divide too (every row of these classes starts at the same offset
        # from the alignment in x and y: the head and tail elements move one at a time)
        return inner1 and aligned and d <= 4096
    if variant in ("scalar", "long_row", "split", "grid"):  # any rows: any alignment, D, row stride (grid: rows
        # that one CTA an SM caches, far beyond these)
        return inner1
    if variant == "strided":
        return not inner1
    raise ValueError(variant)


def must_refuse(variant, cls, d, dtype, out_dtype=None, backward=True):
    # a 128-bit load from a misaligned pointer is wrong: vec must refuse those views, but for the 16-bit
    # forward into an aligned output of the same dtype whose rows the vector width divides, which it
    # realigns in registers (dispatch.h softmax_rows_shift_vectorizable; test_cuda_softmax.py test_vec_shifted_rows)
    shifted = (not backward and dtype in (torch.float16, torch.bfloat16) and out_dtype in (None, dtype)
               and d % _vec_width(dtype) == 0)
    return variant == "vec" and cls in ("misaligned", "row_strided") and not shifted


def _plan(explanation):
    """explain()'s plan line (dispatch_explain.h softmax_plan_fields) as a dict: every SoftmaxPlan field by name
    (numbers as ints), "flags" and "rows" (the preference rows that shaped the plan: docs/dispatch.md) as sets."""
    lines = [line for line in explanation.splitlines() if line.startswith("plan: ")]
    assert len(lines) == 1, explanation
    out = {}
    for kv in lines[0][len("plan: "):].split():
        k, v = kv.split("=", 1)
        out[k] = (set() if v == "-" else set(v.split(","))) if k in ("flags", "rows") else (
            v if k in ("variant", "mode") else int(v))
    return out


def _assert_plan_valid(plan, shape, dim, backward, msg=""):
    """What every plan of the dispatcher satisfies, whatever its tuning: the kernels' capacities and the modes'
    conditions (dispatch.h eligibility, softmax_shapes.h), on the current device."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    dim = dim % len(shape) if shape else 0
    d = shape[dim] if shape else 1
    note = f"{msg}: {plan}"
    flags, mode = plan["flags"], plan["mode"]
    assert mode == ("strided" if plan["variant"] == "strided" else mode), note
    assert 0 < plan["threads"] <= 1024 and plan["threads"] % 32 == 0, note
    assert plan["cluster"] in (1, 2, 4, 8, 16), note
    assert plan["cluster"] == 1 or torch.cuda.get_device_capability()[0] >= 9, note
    assert plan["vec"] == 1 or plan["vec"] in (2, 4, 8), note
    if mode == "warp":
        assert d <= 1024 and (1 << plan["warp_log2"]) >= d and plan["threads"] in (64, 128), note
        assert (1 << plan["warp_log2"]) // plan["elems_per_thread"] <= 32, note  # a row within a warp
    if mode == "resident":  # the row cached: a block, or a cluster of them
        assert plan["cluster"] * plan["threads"] * plan["elems_per_thread"] >= d, note
    if mode == "grid":  # every CTA of a row resident at once, partials through the workspace
        assert 2 <= plan["chunks"] <= props.multi_processor_count or plan["chunks"] == 1, note
        assert plan["chunks"] * plan["threads"] * plan["elems_per_thread"] >= d and plan["workspace_bytes"] > 0, note
    if mode == "strided":
        assert plan["columns"] > 0, note
        if "staged" in flags:
            assert plan["vec"] == 1 and plan["cluster"] == 1 and plan["groups"] >= 1, note
        if plan["chunks"] > 1:
            assert "streaming" in flags and plan["workspace_bytes"] > 0 and plan["cluster"] == 1, note
    else:
        assert not flags & {"staged", "streaming"}, note
    assert not backward or not flags & {"packed", "shifted", "raw", "prefetch"}, note  # forward-only kernels
    assert backward or not flags & {"two_pass", "one_unit"}, note  # backward-only kernels
    assert "edges" not in flags or (plan["vec"] > 1 and d % plan["vec"] != 0), note
    assert "shifted" not in flags or plan["vec"] > 1, note


def _explain_plan(op, x, dim=-1, backward=False, msg="", **kw):
    """(explain()'s text, its plan) for `op` on x, the plan checked by _assert_plan_valid."""
    s = fastact.explain(op + ("_backward" if backward else ""), x, dim, **kw)
    plan = _plan(s)
    _assert_plan_valid(plan, tuple(x.shape), dim, backward, msg or s.splitlines()[0])
    return s, plan


def _call(fn):
    """fn() -> (result, None) or (None, the refusal message); any other error propagates."""
    try:
        return fn(), None
    except RuntimeError as e:
        if "cannot take" not in str(e):
            raise
        return None, str(e)


def _variant(explanation):
    return _plan(explanation)["variant"]


def _clusters_capped(below=8):
    """FASTACT_MAX_CLUSTER below `below` (8: clusters off; 16: no 16-CTA clusters; softmax/launch.cuh
    probe_clusters)."""
    env = os.environ.get("FASTACT_MAX_CLUSTER")
    return env is not None and (int(env) if env.strip().lstrip("-").isdigit() else 0) < below


def _is_staged(op, t, backward=False):
    """Whether auto's plan of `op` over dim 1 of t is the staged mode (softmax/staged.cuh)."""
    return "staged" in _plan(fastact.explain(op + ("_backward" if backward else ""), t, 1))["flags"]
