"""Property-based tests (hypothesis): random shapes (rank 0-4, sizes 0-70), dims (in and out of
range), dtypes (floating, and integer/bool/complex where torch rejects them too), layouts
(permutations, slices with offsets and steps, expanded dims, misaligned storage offsets, and
combinations), value scales and special values, thrown at every public function. Each call matches
torch (forward and, for finite float inputs, backward) or raises the kind of error torch raises; and
after an error the next call works. By design (DESIGN.md) integer/bool/complex inputs are always a
RuntimeError, also where torch returns an empty result or reports a bad dim first.

Example counts are bounded for CI (FASTACT_HYPOTHESIS_EXAMPLES scales them; see conftest.py)."""

import math
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fastact
from fastact_testing import (
    DEVICES,
    ELEMENTWISE_OPS,
    FLOAT_DTYPES,
    SOFTMAX_OPS,
    check_op,
    make_tensor,
    strided_tensor,
)

EXAMPLES = int(os.environ.get("FASTACT_HYPOTHESIS_EXAMPLES", "250"))
MAX_NUMEL = 40_000  # keeps one example to milliseconds on a CPU
NON_FLOAT = (torch.int64, torch.int32, torch.bool, torch.complex64)


@st.composite
def shapes(draw, min_rank=0):
    rank = draw(st.integers(min_rank, 4))
    shape, numel = [], 1
    for _ in range(rank):
        size = draw(st.integers(0, max(1, min(70, MAX_NUMEL // max(numel, 1)))))
        shape.append(size)
        numel *= max(size, 1)
    return tuple(shape)


@st.composite
def layouts(draw, shape):
    """strided_tensor arguments for a random layout of `shape`."""
    rank = len(shape)
    kinds = draw(st.sets(st.sampled_from(["permute", "slice", "expand", "offset"]), max_size=3))
    kw = {}
    if "permute" in kinds and rank >= 2:
        kw["perm"] = draw(st.permutations(range(rank)))
    if "slice" in kinds and rank >= 1:
        dims = draw(st.sets(st.integers(0, rank - 1), min_size=1, max_size=2))
        kw["slices"] = {d: (draw(st.integers(0, 3)), draw(st.integers(1, 3)), draw(st.integers(0, 2))) for d in dims}
    if "expand" in kinds and rank >= 1:
        kw["expand"] = tuple(draw(st.sets(st.integers(0, rank - 1), min_size=1, max_size=rank)))
    if "offset" in kinds:
        kw["offset"] = draw(st.integers(1, 5))
    return kw


@st.composite
def inputs(draw, device, min_rank=0, allow_non_float=True, specials=True):
    """(x, number of special values in it): a fresh random tensor on `device` of a random shape,
    dtype and layout (built there, so the layout survives)."""
    shape = draw(shapes(min_rank))
    non_float = allow_non_float and draw(st.integers(0, 9)) == 0  # one example in ten
    dtype = draw(st.sampled_from(NON_FLOAT if non_float else FLOAT_DTYPES))
    kw = draw(layouts(shape))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    scale = draw(st.sampled_from([0.25, 1.0, 4.0, 30.0]))
    if non_float:
        x = strided_tensor(shape, torch.float64, device, scale=40.0, gen=gen, **kw)
        x = (x > 0) if dtype == torch.bool else x.to(dtype)
    else:
        x = strided_tensor(shape, dtype, device, scale=scale, gen=gen, **kw)
    n_special = draw(st.integers(0, 3)) if (specials and not non_float and draw(st.integers(0, 4)) == 0) else 0
    if n_special and x.numel():
        root = x._base if x._base is not None else x
        for _ in range(n_special):
            i = draw(st.integers(0, root.numel() - 1))
            root.view(-1)[i] = draw(st.sampled_from([math.inf, -math.inf, math.nan]))
    return x, n_special


def _expected_exception(e):
    """The kind of error fastact must raise where torch raises `e`."""
    if isinstance(e, IndexError):
        return IndexError
    if isinstance(e, RuntimeError):  # NotImplementedError (torch's "not implemented for 'Long'") too
        return RuntimeError
    return type(e)


def _matches_torch(op, x, *, dim=-1, dtype=None, bias=None, backward=True, grad_layout="contiguous"):
    floating = x.dtype in FLOAT_DTYPES
    try:
        op.torch(x, dim=dim, dtype=dtype, bias=bias)
        torch_error = None
    except Exception as e:  # noqa: BLE001 (torch's error, whatever it is, is the spec)
        torch_error = e
    if torch_error is None and floating:
        check_op(op, x, dim=dim, dtype=dtype, bias=bias, backward=backward, grad_layout=grad_layout)
        return
    if torch_error is not None:
        kinds = (_expected_exception(torch_error),)
    else:
        kinds = ()
    if not floating:
        # Integer/bool/complex inputs are always an error in fastact (DESIGN.md), where torch
        # returns an empty result for an empty tensor and checks the dim before the dtype: a
        # RuntimeError is right there too.
        kinds += (RuntimeError,)
    with pytest.raises(kinds):
        op.fastact(x, dim=dim, dtype=dtype, bias=bias)
    # and the library still works
    y = make_tensor((3, 5), torch.float32, x.device)
    torch.testing.assert_close(fastact.softmax(y, 0), torch.softmax(y, 0))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
@settings(max_examples=EXAMPLES)
@given(data=st.data())
def test_softmax_matches_torch(device, op, data):
    torch.manual_seed(data.draw(st.integers(0, 2**31 - 1), label="seed"))  # the gradient check's inputs
    x, n_special = data.draw(inputs(device))
    rank = x.dim()
    dim = data.draw(st.integers(-max(rank, 1) - 2, max(rank, 1) + 1), label="dim")
    dtype = None
    if x.dtype in FLOAT_DTYPES:
        dtype = data.draw(st.sampled_from((None, None, None) + FLOAT_DTYPES), label="dtype")
    grad_layout = data.draw(st.sampled_from(["contiguous", "transposed", "expanded", "offset"]), label="grad_layout")
    _matches_torch(op, x, dim=dim, dtype=dtype, backward=n_special == 0, grad_layout=grad_layout)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ELEMENTWISE_OPS, ids=str)
@settings(max_examples=EXAMPLES)
@given(data=st.data())
def test_elementwise_matches_torch(device, op, data):
    # an op that computes integer inputs in the default dtype (sigmoid, as torch) takes floating inputs here
    # (test_ops.py test_integral_inputs_as_torch has the integer ones); bias_gelu:
    # fastact needs x of rank >= 1 and a bias of exactly [x.shape[-1]] (both in test_errors.py)
    torch.manual_seed(data.draw(st.integers(0, 2**31 - 1), label="seed"))  # bias and gradient inputs
    x, n_special = data.draw(inputs(device, min_rank=1 if op.takes_bias else 0,
                                    allow_non_float=not op.row.integral_to_default))
    bias = None
    if op.takes_bias:
        bdtype = x.dtype  # an integer x gets an integer bias: torch rejects that pair too
        bkw = data.draw(st.sampled_from([{}, {"offset": 1}, {"slices": {0: (1, 2, 0)}}, {"expand": (0,)}]), label="bias layout")
        bias = strided_tensor((x.shape[-1],), bdtype, device, **bkw)
    grad_layout = data.draw(st.sampled_from(["contiguous", "transposed", "expanded", "offset"]), label="grad_layout")
    _matches_torch(op, x, bias=bias, backward=n_special == 0, grad_layout=grad_layout)
