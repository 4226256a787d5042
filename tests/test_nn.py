"""fastact.nn modules: drop-ins for torch.nn.Softmax, LogSoftmax, GELU and Sigmoid, and BiasGELU
with its own (learnable) bias."""

import pytest
import torch

import fastact
from fastact_testing import assert_close, make_tensor


@pytest.mark.parametrize(
    "make_fa,make_pt",
    [
        (lambda: fastact.nn.Softmax(1), lambda: torch.nn.Softmax(1)),
        (lambda: fastact.nn.Softmax(), lambda: torch.nn.Softmax(-1)),
        (lambda: fastact.nn.LogSoftmax(0), lambda: torch.nn.LogSoftmax(0)),
        (lambda: fastact.nn.LogSoftmax(), lambda: torch.nn.LogSoftmax(-1)),
        (lambda: fastact.nn.GELU(), lambda: torch.nn.GELU()),
        (lambda: fastact.nn.GELU("tanh"), lambda: torch.nn.GELU("tanh")),
        (lambda: fastact.nn.GELU(approximate="none"), lambda: torch.nn.GELU(approximate="none")),
        (lambda: fastact.nn.Sigmoid(), lambda: torch.nn.Sigmoid()),
    ],
    ids=["Softmax1", "Softmax", "LogSoftmax0", "LogSoftmax", "GELU", "GELU-tanh", "GELU-none", "Sigmoid"],
)
def test_module_matches_torch(device, dtype, make_fa, make_pt):
    m_fa, m_pt = make_fa(), make_pt()
    assert list(m_fa.parameters()) == []
    x = make_tensor((4, 7, 33), dtype, device, "transposed", scale=2.0)
    x_fa, x_pt, x_ref = x.detach().requires_grad_(), x.detach().requires_grad_(), x.detach().double().requires_grad_()
    y_fa, y_pt, y_ref = m_fa(x_fa), m_pt(x_pt), m_pt(x_ref)
    assert_close(y_fa, y_ref, torch_actual=y_pt, msg=repr(m_fa))
    g = make_tensor(tuple(y_fa.shape), dtype, device)
    y_fa.backward(g), y_pt.backward(g), y_ref.backward(g.double())
    assert_close(x_fa.grad, x_ref.grad, torch_actual=x_pt.grad, msg=f"{m_fa!r} grad")


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_bias_gelu_module(device, dtype, approximate):
    m = fastact.nn.BiasGELU(33, approximate=approximate, device=device, dtype=dtype)
    params = dict(m.named_parameters())
    assert list(params) == ["bias"]
    assert m.bias.shape == (33,) and m.bias.dtype == dtype and m.bias.device.type == device and m.bias.requires_grad
    assert torch.equal(m.bias, torch.zeros_like(m.bias))  # documented initialisation
    with torch.no_grad():
        m.bias.copy_(make_tensor((33,), dtype, device))
    x = make_tensor((5, 6, 33), dtype, device, scale=2.0).requires_grad_()
    y = m(x)
    b_ref = m.bias.detach().double().requires_grad_()
    x_ref = x.detach().double().requires_grad_()
    y_ref = torch.nn.functional.gelu(x_ref + b_ref, approximate=approximate)
    b_pt = m.bias.detach().requires_grad_()
    x_pt = x.detach().requires_grad_()
    y_pt = torch.nn.functional.gelu(x_pt + b_pt, approximate=approximate)
    assert_close(y, y_ref, torch_actual=y_pt)
    g = make_tensor(tuple(y.shape), dtype, device)
    y.backward(g), y_ref.backward(g.double()), y_pt.backward(g)
    assert m.bias.grad is not None, "the module's own bias gets a gradient"
    assert_close(m.bias.grad, b_ref.grad, torch_actual=b_pt.grad, msg="bias.grad")
    assert_close(x.grad, x_ref.grad, torch_actual=x_pt.grad, msg="x.grad")
    assert "features=33" in repr(m) and approximate in repr(m)


def test_bias_gelu_module_default_is_tanh(device):
    m = fastact.nn.BiasGELU(8, device=device)
    assert m.approximate == "tanh"
    with torch.no_grad():
        m.bias.normal_()
    x = make_tensor((3, 8), torch.float64, device)
    m = m.double()
    torch.testing.assert_close(m(x), torch.nn.functional.gelu(x + m.bias, approximate="tanh"))


def test_modules_train_a_step(device):
    """Linear(no bias) + BiasGELU + Linear + LogSoftmax trains like the torch equivalent."""

    def build(fa):
        lin1 = torch.nn.Linear(16, 24, bias=not fa)
        act = fastact.nn.BiasGELU(24) if fa else torch.nn.GELU("tanh")
        lin2 = torch.nn.Linear(24, 5)
        head = fastact.nn.LogSoftmax(-1) if fa else torch.nn.LogSoftmax(-1)
        return torch.nn.Sequential(lin1, act, lin2, head).to(device).double()

    m_fa, m_pt = build(True), build(False)
    with torch.no_grad():  # the same function: the torch model's first bias is BiasGELU's bias
        m_fa[0].weight.copy_(m_pt[0].weight)
        m_fa[1].bias.copy_(m_pt[0].bias)
        m_fa[2].weight.copy_(m_pt[2].weight)
        m_fa[2].bias.copy_(m_pt[2].bias)
    before = m_fa[0].weight.detach().clone()
    x = make_tensor((10, 16), torch.float64, device)
    target = torch.randint(0, 5, (10,), device=device)
    for m in (m_fa, m_pt):
        torch.nn.functional.nll_loss(m(x), target).backward()
        torch.optim.SGD(m.parameters(), lr=0.5).step()
    torch.testing.assert_close(m_fa[0].weight, m_pt[0].weight)
    torch.testing.assert_close(m_fa[1].bias, m_pt[0].bias)
    torch.testing.assert_close(m_fa[2].weight, m_pt[2].weight)
    torch.testing.assert_close(m_fa[2].bias, m_pt[2].bias)
    assert not torch.equal(m_fa[0].weight, before)  # the step moved the weights


def test_module_reprs():
    assert "dim=1" in repr(fastact.nn.Softmax(1))
    assert "dim=0" in repr(fastact.nn.LogSoftmax(0))
    assert "tanh" in repr(fastact.nn.GELU("tanh"))
    # a state dict round trip keeps BiasGELU's bias
    m = fastact.nn.BiasGELU(4)
    with torch.no_grad():
        m.bias.copy_(torch.tensor([1.0, -2.0, 3.0, 0.5]))
    m2 = fastact.nn.BiasGELU(4)
    m2.load_state_dict(m.state_dict())
    assert torch.equal(m2.bias, m.bias)
