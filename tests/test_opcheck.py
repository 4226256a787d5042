"""torch.library.opcheck on every op, forward and backward: schema, autograd registration, the fake
(meta) kernel against the real one (shapes, dtypes, strides), and AOT dispatch with dynamic shapes.
Forward ops get inputs that require grad (so the autograd tests run); backward ops get both (they
are differentiable too: double backward)."""

import pytest
import torch

from fastact._optable import OPS as TABLE
from fastact_testing import make_tensor, random_values, strided_tensor

ops = torch.ops.fastact


def _samples(device):
    f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16

    def t(shape, dtype=f32, layout="contiguous", grad=False, scale=1.0):
        return make_tensor(shape, dtype, device, layout, scale=scale).detach().requires_grad_(grad)

    def odd(shape, dtype=f32, grad=False, values=None):
        """Gaps and a memory order that is not row-major (x.t()[:, ::2]): the layout where
        empty_like(x) is neither x's strides nor contiguous. `values`: copied in."""
        t = strided_tensor(shape, dtype, device, perm=tuple(reversed(range(len(shape)))), slices={len(shape) - 1: (0, 2, 0)})
        if values is not None:
            t.copy_(values)
        return t.detach().requires_grad_(grad)

    def sm(x, dim, log=False):
        return (torch.log_softmax if log else torch.softmax)(x, dim).detach()

    s = []
    for name, log in (("softmax", False), ("log_softmax", True)):
        fwd, bwd = getattr(ops, name).default, getattr(ops, f"{name}_backward").default
        s += [
            (f"{name}-rows", fwd, (t((5, 33), grad=True), -1, None), {}),
            (f"{name}-dim0-transposed", fwd, (t((4, 6, 5), layout="transposed", grad=True), 0, None), {}),
            (f"{name}-sliced", fwd, (t((3, 17), layout="sliced_last", grad=True), 1, None), {}),
            (f"{name}-bf16-to-f32", fwd, (t((3, 40), bf16, grad=True), -1, f32), {}),
            (f"{name}-f32-to-f16", fwd, (t((3, 40), grad=True), 0, f16), {}),
            (f"{name}-scalar", fwd, (t((), grad=True), 0, None), {}),
            (f"{name}-empty", fwd, (t((0, 7), grad=True), 1, None), {}),
            (f"{name}-transposed-stepped", fwd, (odd((4, 6), grad=True), 1, None), {}),
            (f"{name}-variant-auto", fwd, (t((2, 9), grad=True), -1, None), {"variant": "auto"}),
            (f"{name}_backward-rows", bwd, (t((5, 33)), sm(t((5, 33)), -1, log), -1, f32), {}),
            (f"{name}_backward-dim1", bwd, (t((4, 6, 5)), sm(t((4, 6, 5)), 1, log), 1, f32), {}),
            (f"{name}_backward-transposed", bwd, (t((4, 6), layout="transposed"), sm(t((4, 6)), 0, log), 0, f32), {}),
            (f"{name}_backward-f32-out-f16-in", bwd, (t((3, 40)), sm(t((3, 40)), -1, log), -1, f16), {}),
            (f"{name}_backward-f16", bwd, (t((3, 40), f16), sm(t((3, 40), f16), -1, log), -1, f16), {}),
            (f"{name}_backward-transposed-stepped", bwd, (odd((4, 6)), odd((4, 6), values=sm(t((4, 6)), 1, log)), 1, f32), {}),
            (f"{name}_backward-empty", bwd, (t((0, 3)), sm(t((0, 3)), 1, log), 1, f32), {}),
            (f"{name}_backward-grad", bwd, (t((5, 33), grad=True), sm(t((5, 33)), -1, log).requires_grad_(), -1, f32), {}),
            (f"{name}_backward-grad-f16-in", bwd, (t((3, 40), grad=True), sm(t((3, 40)), 0, log).requires_grad_(), 0, f16), {}),
        ]
    for approx in ("none", "tanh"):
        x = t((6, 33), grad=True)
        s += [
            (f"bias_gelu-{approx}", ops.bias_gelu.default, (x, random_values((33,), torch.float32, device).requires_grad_(), approx), {}),
            (
                f"bias_gelu-{approx}-transposed-f16",
                ops.bias_gelu.default,
                (t((4, 3, 8), f16, "transposed", grad=True), random_values((8,), f16, device).requires_grad_(), approx),
                {},
            ),
            (f"bias_gelu-{approx}-rank1", ops.bias_gelu.default, (t((17,), grad=True), random_values((17,), torch.float32, device).requires_grad_(), approx), {}),
            (f"bias_gelu_backward-{approx}", ops.bias_gelu_backward.default, (t((6, 33)), t((6, 33)), random_values((33,), torch.float32, device), approx), {}),
            (f"bias_gelu-{approx}-transposed-stepped", ops.bias_gelu.default, (odd((4, 6), grad=True), random_values((6,), torch.float32, device).requires_grad_(), approx), {}),
            (f"bias_gelu_backward-{approx}-transposed-stepped", ops.bias_gelu_backward.default, (t((4, 6)), odd((4, 6)), random_values((6,), torch.float32, device), approx), {}),
            (f"bias_gelu_backward-{approx}-grad", ops.bias_gelu_backward.default, (t((6, 33), grad=True), t((6, 33), grad=True), random_values((33,), torch.float32, device).requires_grad_(), approx), {}),
            (f"bias_gelu_backward-{approx}-3d", ops.bias_gelu_backward.default, (t((2, 5, 9), layout="transposed"), t((2, 5, 9)), random_values((9,), torch.float32, device), approx), {}),
        ]
    for row in TABLE:  # every pointwise op, at every value of its params
        if row.kind != "pointwise":
            continue
        fwd, bwd = getattr(ops, row.name).default, getattr(ops, row.backward).default
        for _, params in row.variants:
            v, suffix = tuple(params.values()), "".join("-" + p for p in params.values())
            name, bname = row.name + suffix, row.backward + suffix

            def saved(shape, dtype=f32, row=row, params=params):
                """What the backward reads: an input (scale 3), or the twin's output of one."""
                x = t(shape, dtype, scale=3.0)
                return row.torch_fn(x, **params).detach() if row.saves == "output" else x

            s += [
                (name, fwd, (t((5, 33), grad=True, scale=3.0), *v), {}),
                (f"{name}-transposed-bf16", fwd, (t((5, 33), bf16, "transposed", grad=True), *v), {}),
                (f"{name}-permuted-f64", fwd, (t((3, 4, 5), torch.float64, "permuted", grad=True), *v), {}),
                (f"{name}-scalar", fwd, (t((), grad=True), *v), {}),
                (f"{name}-transposed-stepped", fwd, (odd((3, 4, 6), grad=True), *v), {}),
                (bname, bwd, (t((5, 33)), saved((5, 33)), *v), {}),
                (f"{bname}-transposed-stepped", bwd, (odd((4, 6)), odd((4, 6), values=saved((4, 6))), *v), {}),
                (f"{bname}-stepped-saved", bwd, (t((4, 6)), odd((4, 6), values=saved((4, 6))), *v), {}),
                (f"{bname}-mixed-layouts", bwd, (t((5, 33), layout="transposed"), saved((5, 33)), *v), {}),
                (f"{bname}-grad", bwd, (t((5, 33), grad=True), saved((5, 33)).requires_grad_(), *v), {}),
            ]
            # the C++ side's derivative of the backward (`<backward>_grad(grad, saved, *params, order)`, what the
            # backward's own autograd calls), in builds that register one
            grad_op = getattr(ops, row.backward + "_grad", None)
            if grad_op is not None:
                gname = row.backward + "_grad" + suffix
                s += [
                    (gname, grad_op.default, (t((5, 33)), saved((5, 33)), *v, 2), {}),
                    (f"{gname}-order3", grad_op.default, (t((5, 33)), saved((5, 33)), *v, 3), {}),
                    # differentiable at order 2 (a third derivative) and 3 (the fourth and beyond: torch's twin)
                    (f"{gname}-grad", grad_op.default, (t((5, 33), grad=True), saved((5, 33)).requires_grad_(), *v, 2), {}),
                    (f"{gname}-order3-grad", grad_op.default,
                     (t((5, 33), grad=True), saved((5, 33)).requires_grad_(), *v, 3), {}),
                    (f"{gname}-transposed-stepped", grad_op.default, (odd((4, 6)), odd((4, 6), values=saved((4, 6))), *v, 2), {}),
                ]
    return s


_IDS = [name for name, *_ in _samples("meta")]


@pytest.mark.parametrize("index", range(len(_IDS)), ids=_IDS)
def test_opcheck(device, index):
    name, op, args, kwargs = _samples(device)[index]
    torch.library.opcheck(op, args, kwargs)


def test_every_op_is_opchecked():
    """The samples above cover every op of the library (a new op gets added here or fails)."""
    schemas = {s.name.split("::")[1] for s in torch._C._jit_get_all_schemas() if s.name.startswith("fastact::")}
    schemas.discard("explain")  # returns a str: nothing to check against a fake kernel
    covered = {op.name().split("::")[1].split(".")[0] for _, op, _, _ in _samples("cpu")}
    assert schemas <= covered, schemas - covered
