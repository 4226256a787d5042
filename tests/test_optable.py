"""The op table (fastact/_optable.py) against what is generated from it and what the tests need of it: every row has
a float64 reference (tests/fastact_testing.py REFERENCES) that agrees with its torch twin, registered forward and
backward ops, a public function, an nn module, patch routes, ONNX, bench and test entries."""

import pickle
import sys

import pytest
import torch

import fastact
import fastact.bench as B
from fastact import _optable
from fastact_testing import ALL_OPS, REFERENCES, TOL, assert_close

P = sys.modules["fastact.patch"]  # the module (the attribute fastact.patch is its function)
ROWS = _optable.OPS
IDS = [op.name for op in ROWS]


def test_reference_for_every_op():
    """Each row of the table has its float64 reference formula: a new op fails here until it gets one."""
    missing = [op.name for op in ROWS if op.name not in REFERENCES]
    assert not missing, f"no reference entry in tests/fastact_testing.py REFERENCES for {missing}"
    assert set(REFERENCES) <= {op.name for op in ROWS}, "a reference entry for an op not in the table"


@pytest.mark.parametrize("op", ROWS, ids=IDS)
def test_reference_agrees_with_the_torch_twin(op):
    """The reference entry and the row's torch twin agree in float64 on random inputs (wide enough to reach the
    tails), at every value of the op's params: a wrong formula, or a wrong twin in the table, fails."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 33, generator=g, dtype=torch.float64) * 6
    for _, params in op.variants:
        if op.kind == "softmax":
            for dim in (0, 1, -1):
                assert_close(REFERENCES[op.name](x, dim=dim), op.torch_fn(x, dim), torch.float64)
        elif op.kind == "bias":
            b = torch.randn(33, generator=g, dtype=torch.float64)
            twin = _optable.BY_NAME[op.pointwise].torch_fn
            assert_close(REFERENCES[op.name](x, bias=b, **params), twin(x + b, **params), torch.float64)
        else:
            assert_close(REFERENCES[op.name](x, **params), op.torch_fn(x, **params), torch.float64)


@pytest.mark.parametrize("op", ROWS, ids=IDS)
def test_torch_backward_is_the_twins_derivative(op):
    """The row's torch_backward (the tests' gradient references) and the torch.func rules' derivative
    (differentiable_backward where set) are the derivative of the twin: float64 autograd of the twin gives the same
    gradient."""
    if op.kind != "pointwise":
        pytest.skip("the softmax family's and the bias op's backwards are checked by hand in test_backward")
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(200, generator=g, dtype=torch.float64) * 6).requires_grad_()
    dy = torch.randn(200, generator=g, dtype=torch.float64)
    for _, params in op.variants:
        y = op.torch_fn(x, **params)
        (want,) = torch.autograd.grad(y, x, dy)
        saved = y.detach() if op.saves == "output" else x.detach()
        for backward in filter(None, (op.torch_backward, op.differentiable_backward)):
            got = backward(dy, saved, **params)
            torch.testing.assert_close(got, want, rtol=TOL[torch.float64][0], atol=TOL[torch.float64][1])


@pytest.mark.parametrize("op", ROWS, ids=IDS)
def test_generated_from_the_row(op):
    """What each row generates exists: the registered ops, the public function (its docstring the row's), the nn
    module (drop-in for the twin's constructor defaults where there is a twin), the module swap and patch routes,
    the bench's and the tests' op lists."""
    assert hasattr(torch.ops.fastact, op.name) and hasattr(torch.ops.fastact, op.backward)
    assert op.name in fastact.__all__ and getattr(fastact, op.name).__doc__ == op.doc
    assert op.module in fastact.nn.__all__
    module = getattr(fastact.nn, op.module)
    assert module.__module__ == "fastact.nn" and module.__doc__ == op.module_doc
    if op.torch_module is not None:
        assert op.torch_module in P._TORCH_SWAPS
        swapped = P._TORCH_SWAPS[op.torch_module](op.torch_module())
        assert type(swapped) is module
        assert repr(swapped) == repr(op.torch_module()).replace(op.torch_module.__name__, op.module, 1)
    for fn, _ in op.routes:
        assert P._ROUTES[fn][0] == op.name
    assert op.name in fastact.explain.__doc__
    assert any(name == op.name or name.startswith(op.name + "_") for name in B.OPS)
    assert any(spec.name == op.name for spec in ALL_OPS)


@pytest.mark.parametrize("op", ROWS, ids=IDS)
def test_module_pickles_and_scripts(op):
    """Every generated module pickles (by its fastact.nn name) and compiles under torch.jit.script, with the same
    result as in eager."""
    module = getattr(fastact.nn, op.module)
    m = module(5) if op.kind == "bias" else module(-1) if op.kind == "softmax" else module()
    if op.kind == "bias":
        with torch.no_grad():
            m.bias.normal_()
    m2 = pickle.loads(pickle.dumps(m))
    assert type(m2) is module and repr(m2) == repr(m)
    x = torch.randn(4, 5)
    torch.testing.assert_close(torch.jit.script(m)(x), m(x), rtol=0, atol=0)
    torch.testing.assert_close(m2(x), m(x), rtol=0, atol=0)
