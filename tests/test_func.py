"""torch.func transforms and forward-mode AD over fastact's ops (fastact/_functorch.py), on every device.

Each transform of a function built on a fastact op is checked against the same transform of the torch
op: float64 to rounding, 16-bit dtypes against float64 with torch's own error as the bound. vmap runs
each op once over the whole batch (no per-sample fallback, whose performance warning must not appear)."""

import warnings

import pytest
import torch
import torch.autograd.forward_ad as fwAD

import fastact
from fastact_testing import ALL_OPS, assert_close, dtype_id, make_tensor

tf = torch.func

# torch's forward-mode AD (jvp, jacfwd, hessian) warns of its own use of torch.jit.script
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")


def _fns(op, dim, bias):
    """(fastact's function, torch's) of one tensor, for op over dim (with a fixed bias)."""
    kw = dict(dim=dim) if op.takes_dim else {}
    if op.takes_bias:
        kw["bias"] = bias
    return (lambda t: op.fastact(t, **kw)), (lambda t: op.torch(t, **kw))


# Each transform of f, as a function of x, given fixed weights w (x's shape) that make outputs scalar
# where a transform needs it.
TRANSFORMS = {
    "grad": lambda f, w: tf.grad(lambda t: (f(t) * w).sum()),
    "vjp": lambda f, w: (lambda t: tf.vjp(f, t)[1](w)[0]),
    "jvp": lambda f, w: (lambda t: tf.jvp(f, (t,), (w,))[1]),
    "jacrev": lambda f, w: tf.jacrev(f),
    "jacfwd": lambda f, w: tf.jacfwd(f),
    "hessian": lambda f, w: tf.hessian(lambda t: (f(t) * w).sum()),
    "grad-of-grad": lambda f, w: tf.grad(lambda t: (tf.grad(lambda u: (f(u) * w).sum())(t) ** 2).sum()),
    "vmap": lambda f, w: tf.vmap(f),
    "vmap-dim1": lambda f, w: tf.vmap(f, in_dims=1, out_dims=1),
    "vmap-of-grad": lambda f, w: tf.vmap(tf.grad(lambda t: (f(t) * w[0]).sum())),
    "vmap-of-vmap": lambda f, w: tf.vmap(tf.vmap(f)),
}


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("op", ALL_OPS, ids=str)
def test_func_transforms_match_torch(device, op, transform):
    """float64: every transform of every op equals torch's to rounding; vmap without the fallback."""
    shape = (3, 4, 5) if transform == "vmap-of-vmap" else (4, 5)
    x = make_tensor(shape, torch.float64, device)
    w = make_tensor(shape, torch.float64, device)
    # per sample (under vmap) the tensor has one dim fewer: softmax over its last dim
    dim = -1 if transform.startswith("vmap") else 0
    bias = make_tensor((4,) if transform == "vmap-dim1" else (5,), torch.float64, device)
    fa, ft = _fns(op, dim, bias)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*performance drop.*")  # the per-sample fallback
        got = TRANSFORMS[transform](fa, w)(x)
    want = TRANSFORMS[transform](ft, w)(x)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12, msg=lambda m: f"{op} {transform}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("op", ALL_OPS, ids=str)
def test_func_grad_and_vmap_low_precision(device, op, dtype):
    """torch.func.grad and vmap in every floating dtype: outputs and gradients in the input's dtype,
    against float64 with torch's own error (the same transform of the torch op) as the bound."""
    x = make_tensor((6, 33), dtype, device)
    w = make_tensor((6, 33), dtype, device)
    bias = make_tensor((33,), dtype, device)
    fa, ft = _fns(op, -1, bias)
    _, f64 = _fns(op, -1, bias.double())
    for name in ("grad", "vmap"):
        got = TRANSFORMS[name](fa, w)(x)
        assert got.dtype == dtype, (name, got.dtype)
        assert_close(got, TRANSFORMS[name](f64, w.double())(x.double()), dtype,
                     torch_actual=TRANSFORMS[name](ft, w)(x), msg=f"{op} {name} {dtype_id(dtype)}")


@pytest.mark.parametrize("op", [o for o in ALL_OPS if o.takes_dim], ids=str)
def test_func_fused_dtype(device, op):
    """softmax's dtype= under grad and jvp: a bfloat16 input, float32 outputs, bfloat16 gradient."""
    x = make_tensor((5, 40), torch.bfloat16, device)
    w = make_tensor((5, 40), torch.float32, device)
    fa = lambda t: op.fastact(t, dim=1, dtype=torch.float32)  # noqa: E731
    ft = lambda t: op.torch(t, dim=1, dtype=torch.float32)  # noqa: E731
    g, gt = (tf.grad(lambda t: (f(t) * w).sum())(x) for f in (fa, ft))
    assert g.dtype == torch.bfloat16
    assert_close(g.float(), gt.float(), torch.bfloat16, msg=f"{op} grad, dtype=float32")
    t = make_tensor((5, 40), torch.bfloat16, device)
    y, yt = (tf.jvp(f, (x,), (t,)) for f in (fa, ft))
    assert y[0].dtype == y[1].dtype == torch.float32
    assert_close(y[1], yt[1], torch.bfloat16, msg=f"{op} jvp, dtype=float32")


def test_func_vmap_bias_gelu_batched_bias(device):
    """bias_gelu under vmap with a bias per sample (alone, or with x batched too): gelu(x + bias)."""
    x = make_tensor((4, 6), torch.float64, device)
    xs = make_tensor((3, 4, 6), torch.float64, device)
    bs = make_tensor((3, 6), torch.float64, device)
    ref = lambda x_, b_: torch.nn.functional.gelu(x_ + b_, approximate="tanh")  # noqa: E731
    torch.testing.assert_close(tf.vmap(lambda b: fastact.bias_gelu(x, b))(bs), ref(x, bs[:, None]))
    torch.testing.assert_close(tf.vmap(fastact.bias_gelu)(xs, bs), ref(xs, bs[:, None]))
    g = tf.grad(lambda b: (fastact.bias_gelu(x, b) ** 2).sum())(bs[0])
    torch.testing.assert_close(g, tf.grad(lambda b: (ref(x, b) ** 2).sum())(bs[0]))


@pytest.mark.parametrize("op", ALL_OPS, ids=str)
def test_forward_ad_matches_torch(device, op):
    """torch.autograd.forward_ad on the public functions: torch's tangents (the input's, and for
    bias_gelu the bias's too)."""
    x, t = make_tensor((4, 7), torch.float64, device), make_tensor((4, 7), torch.float64, device)
    b, tb = make_tensor((7,), torch.float64, device), make_tensor((7,), torch.float64, device)
    for with_bias_tangent in (False, True) if op.takes_bias else (False,):
        outs = []
        for f in (op.fastact, op.torch):
            with fwAD.dual_level():
                kw = dict(dim=0) if op.takes_dim else {}
                if op.takes_bias:
                    kw["bias"] = fwAD.make_dual(b, tb) if with_bias_tangent else b
                y = f(fwAD.make_dual(x, t), **kw)
                outs.append(fwAD.unpack_dual(y))
        torch.testing.assert_close(outs[0].primal, outs[1].primal)
        torch.testing.assert_close(outs[0].tangent, outs[1].tangent, rtol=1e-10, atol=1e-12)


def test_func_grad_of_compiled_function(device):
    """A transform of a compiled function: right results (dynamo breaks the graph at the fastact calls and
    runs them eagerly; README: the other order is not supported yet)."""
    x = make_tensor((4, 9), torch.float64, device)
    w = make_tensor((4, 9), torch.float64, device)
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: (fastact.gelu(fastact.softmax(t, 0)) * w).sum(), backend="aot_eager")
    got = tf.grad(compiled)(x)
    want = tf.grad(lambda t: (torch.nn.functional.gelu(torch.softmax(t, 0)) * w).sum())(x)
    torch._dynamo.reset()
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_func_compiled_vmap(device):
    """torch.compile(fullgraph=True) of a vmapped function (the README's supported order)."""
    x = make_tensor((3, 4, 9), torch.float64, device)
    torch._dynamo.reset()
    compiled = torch.compile(tf.vmap(lambda t: fastact.sigmoid(fastact.softmax(t, 0))), backend="aot_eager", fullgraph=True)
    got = compiled(x)
    torch._dynamo.reset()
    torch.testing.assert_close(got, torch.sigmoid(torch.softmax(x, 1)), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("op", ALL_OPS, ids=str)
def test_func_direct_op_call_says_how(device, op):
    """torch.ops.fastact.* called directly under a transform (torch refuses the C++ autograd Function
    there): the error names the public functions."""
    x = make_tensor((4, 9), torch.float64, device)
    b = make_tensor((9,), torch.float64, device)
    name = op.name
    f, v = getattr(torch.ops.fastact, name), tuple(op.params.values())
    if op.takes_dim:
        call = lambda t: f(t, -1)  # noqa: E731
    elif op.takes_bias:
        call = lambda t: f(t, b, *v)  # noqa: E731
    else:
        call = lambda t: f(t, *v)  # noqa: E731
    with pytest.raises(RuntimeError, match=f"fastact::{name}: under torch.func transforms .* public functions"):
        tf.grad(lambda t: call(t).sum())(x)
    # a backward op called directly on tensors that carry a transform's gradient
    y = torch.softmax(x, -1)
    with pytest.raises(RuntimeError, match="fastact::softmax_backward: under torch.func transforms"):
        tf.grad(lambda t: torch.ops.fastact.softmax_backward(t, y, -1, torch.float64).sum())(x)


@pytest.mark.parametrize("op", [o for o in ALL_OPS if o.takes_dim], ids=str)
def test_func_vmap_zero_dim_samples(device, op):
    """vmap over a 1-d tensor: each sample is 0-d (softmax over its one element), in and out of grad;
    a dim a 0-d tensor does not have raises IndexError as torch does."""
    x = make_tensor((6,), torch.float64, device)
    x[0] = float("inf")
    for dim in (0, -1):
        got = tf.vmap(lambda t: op.fastact(t, dim=dim))(x)
        torch.testing.assert_close(got, tf.vmap(lambda t: op.torch(t, dim=dim))(x), equal_nan=True)
        g = tf.vmap(tf.grad(lambda t: op.fastact(t, dim=dim)))(x[1:])
        torch.testing.assert_close(g, tf.vmap(tf.grad(lambda t: op.torch(t, dim=dim)))(x[1:]))
    with pytest.raises(IndexError):
        tf.vmap(lambda t: op.fastact(t, dim=1))(x)


@pytest.mark.parametrize("op", [o for o in ALL_OPS if o.takes_dim], ids=str)
def test_func_vmap_dim_out_of_range(device, op):
    """A dim the sample does not have raises IndexError under vmap (the batch dim is not a softmax dim),
    naming the sample's rank."""
    x = make_tensor((3, 4, 5), torch.float64, device)
    for dim in (-3, 2):
        with pytest.raises(IndexError, match=f"dim {dim} out of range for a tensor of 2 dims"):
            tf.vmap(lambda t: op.fastact(t, dim=dim))(x)
        with pytest.raises(IndexError):
            tf.vmap(lambda t: op.torch(t, dim=dim))(x)
    with pytest.raises(IndexError, match="dim -2 out of range for a tensor of 1 dims"):
        tf.vmap(tf.vmap(lambda t: op.fastact(t, dim=-2)))(x)


def test_func_vmap_batched_bias_checks(device):
    """With a bias per sample, bias_gelu under vmap checks each sample as the kernel does: where eager
    bias_gelu raises, so does vmap (no broadcasting or promotion by x + bias)."""
    x = make_tensor((4, 5), torch.float32, device)
    bad = {
        "shape": make_tensor((3, 1), torch.float32, device),
        "rank": make_tensor((3, 1, 5), torch.float32, device),
        "dtype": make_tensor((3, 5), torch.float64, device),
    }
    for name, bias in bad.items():
        with pytest.raises(RuntimeError, match="bias_gelu: expected"):
            fastact.bias_gelu(x, bias[0])
        with pytest.raises(RuntimeError, match="bias_gelu: expected"):
            tf.vmap(fastact.bias_gelu, in_dims=(None, 0))(x, bias)
    with pytest.raises(RuntimeError, match="bias_gelu: expected a floating point"):
        tf.vmap(fastact.bias_gelu, in_dims=(None, 0))(x.long(), bad["dtype"])
    # 0-d samples of x with a per-sample bias: eager raises for a 0-d input, and so does vmap
    with pytest.raises(RuntimeError, match="at least 1 dim"):
        tf.vmap(fastact.bias_gelu)(make_tensor((3,), torch.float64, device), make_tensor((3, 3), torch.float64, device))


def test_func_functionalize(device):
    """functionalize alone is not a differentiating transform: the ops run as they are under it (torch
    has no functionalize rule for Python autograd Functions)."""
    x = make_tensor((4, 5), torch.float32, device)
    b = make_tensor((5,), torch.float32, device)
    f = lambda t: fastact.softmax(fastact.bias_gelu(t, b), 0) + fastact.sigmoid(t)  # noqa: E731
    torch.testing.assert_close(tf.functionalize(f)(x), f(x))
