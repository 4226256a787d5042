"""torch.compile(fullgraph=True) over every op, forward and backward, against eager.

fullgraph=True turns any graph break into an error. backend="aot_eager" traces through dynamo and
AOTAutograd (the fake kernels, the backward ops) quickly; "inductor" also generates code around the
ops and is slow on a CPU (tens of seconds a compile), hence the `slow` marker and few cases."""

import pytest
import torch

import fastact
from fastact_testing import POINTWISE_OPS, assert_close, make_tensor, random_values


def every_op(x, b, xh):
    """Every public op (both GELU approximations, softmax's dtype=, non-last dims, views)."""
    return [
        fastact.softmax(x, -1),
        fastact.log_softmax(x, 0),
        fastact.softmax(x.transpose(0, 1), 0),
        fastact.log_softmax(x[:, 1:], -1),
        fastact.bias_gelu(x, b),
        fastact.bias_gelu(x, b, "none"),
        fastact.softmax(xh, 1, dtype=torch.float32),
        fastact.log_softmax(xh, 0, dtype=torch.float32),
        fastact.gelu(xh, "tanh"),
    ] + [op.fastact(x) for op in POINTWISE_OPS]  # every pointwise op at every value of its params


def _run(fn, x, b, xh, weights):
    x, b, xh = (t.detach().requires_grad_() for t in (x, b, xh))
    outs = fn(x, b, xh)
    loss = sum((o.float() * w).sum() for o, w in zip(outs, weights))
    loss.backward()
    return outs, (x.grad, b.grad, xh.grad)


def _inputs(device, shape):
    x = make_tensor(shape, torch.float32, device)
    b = random_values((shape[-1],), torch.float32, device)
    xh = make_tensor(shape, torch.bfloat16, device)
    return x, b, xh


def _check_compiled(device, backend, shapes, dynamic=None):
    torch._dynamo.reset()
    compiled = torch.compile(every_op, backend=backend, fullgraph=True, dynamic=dynamic)
    for shape in shapes:
        x, b, xh = _inputs(device, shape)
        weights = [random_values(o.shape, torch.float32, device) for o in every_op(x, b, xh)]
        eager_out, eager_grads = _run(every_op, x, b, xh, weights)
        comp_out, comp_grads = _run(compiled, x, b, xh, weights)
        for i, (c, e) in enumerate(zip(comp_out, eager_out)):
            assert c.dtype == e.dtype and c.shape == e.shape, (i, c.dtype, e.dtype, c.shape, e.shape)
            # the ops run as the same kernels: equal up to the order of the compiled sums around them
            assert_close(c, e, msg=f"{backend} {shape} output {i}")
        for name, c, e in zip(("x", "b", "xh"), comp_grads, eager_grads):
            assert_close(c, e, msg=f"{backend} {shape} grad {name}")
    torch._dynamo.reset()


def test_compile_aot_eager(device):
    _check_compiled(device, "aot_eager", [(6, 33)])


def test_compile_aot_eager_dynamic(device):
    # dynamic shapes: the fake kernels must work with symbolic sizes; one graph for all three
    _check_compiled(device, "aot_eager", [(6, 33), (9, 17), (4, 1025)], dynamic=True)


@pytest.mark.slow
def test_compile_inductor(device):
    _check_compiled(device, "inductor", [(6, 33), (5, 40)])


def test_compile_backward_ops_directly(device):
    """The backward ops inside a compiled graph (their fake kernels under dynamo)."""
    ops = torch.ops.fastact

    def f(g, y, x, b):
        return (
            ops.softmax_backward(g, y, 1, torch.float32),
            ops.log_softmax_backward(g, y, 0, torch.float16),
            *ops.bias_gelu_backward(g, x, b, "none"),
        ) + tuple(  # every pointwise backward (a softmax output stands for an op's output)
            getattr(ops, op.row.backward)(g, y if op.row.saves == "output" else x, *op.params.values())
            for op in POINTWISE_OPS)

    g, x = make_tensor((5, 12), torch.float32, device), make_tensor((5, 12), torch.float32, device)
    y = torch.softmax(make_tensor((5, 12), torch.float32, device), 1)
    b = random_values((12,), torch.float32, device)
    torch._dynamo.reset()
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    for c, e in zip(compiled(g, y, x, b), f(g, y, x, b)):
        assert c.dtype == e.dtype and c.shape == e.shape and c.stride() == e.stride()
        assert torch.equal(c, e)
    torch._dynamo.reset()


@pytest.mark.slow
def test_compile_nn_module_inductor(device):
    """A small model of fastact.nn modules, compiled, trains like eager for a step."""
    torch._dynamo.reset()

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Linear(16, 32, bias=False),
            fastact.nn.BiasGELU(32),
            torch.nn.Linear(32, 10),
            fastact.nn.Sigmoid(),
            fastact.nn.LogSoftmax(-1),
        ).to(device)

    eager, comp = model(), model()
    with torch.no_grad():
        for m in (eager, comp):
            m[1].bias.copy_(torch.linspace(-1, 1, 32))
    compiled = torch.compile(comp, fullgraph=True)
    x = make_tensor((8, 16), torch.float32, device)
    eager(x).sum().backward()
    compiled(x).sum().backward()
    for (name, pe), pc in zip(eager.named_parameters(), comp.parameters()):
        assert_close(pc.grad, pe.grad, msg=name)
    torch._dynamo.reset()
