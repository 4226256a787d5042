"""CUDA only, every op in the caller's runtime: device checks, the caller's stream, CUDA graph capture and replay
(forced variants and the staged modes included), torch.compile(mode="reduce-overhead"), and a second GPU (a tensor
on a device other than the current one gets its own device's plan, workspace and cluster attributes)."""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import fastact  # noqa: E402
from cuda_testing import VARIANTS, _call, _is_staged, _plan, make_class  # noqa: E402
from fastact_testing import (  # noqa: E402
    ALL_OPS,
    POINTWISE_OPS,
    SOFTMAX_OPS,
    assert_close,
    bias_for,
    check_op,
    make_tensor,
    random_values,
    softmax_backward_ref,
)

pytestmark = pytest.mark.cuda
ops = torch.ops.fastact


def test_device_mismatch():
    x = make_tensor((4, 6), torch.float32, "cuda")
    b = random_values((6,), torch.float32, "cpu")
    with pytest.raises(RuntimeError, match="bias_gelu"):
        fastact.bias_gelu(x, b)
    with pytest.raises(RuntimeError, match="bias_gelu"):
        fastact.bias_gelu(x.cpu(), b.cuda())
    y = torch.softmax(x, -1)
    with pytest.raises(RuntimeError, match="softmax_backward"):
        ops.softmax_backward(y, y.cpu(), -1, torch.float32)
    for op in POINTWISE_OPS:  # the saved tensor on the CPU, and the gradient
        bwd, v = getattr(ops, op.row.backward), tuple(op.params.values())
        with pytest.raises(RuntimeError, match=op.row.backward):
            bwd(y, y.cpu(), *v)
        with pytest.raises(RuntimeError, match=op.row.backward):
            bwd(y.cpu(), y, *v)
    with pytest.raises(RuntimeError, match="bias_gelu_backward"):
        ops.bias_gelu_backward(y, y, b)
    torch.testing.assert_close(fastact.softmax(x), torch.softmax(x, -1))


def _side_stream_case(op, shape, dim, dtype):
    """Runs op forward and backward on a side stream whose input is produced on that stream after a
    long sleep; a kernel issued on any other stream would read the NaN the input held before."""
    s = torch.cuda.Stream()
    src = make_tensor(shape, dtype, "cuda")
    gsrc = make_tensor(shape, dtype, "cuda")
    b = bias_for(src) if op.takes_bias else None
    s.wait_stream(torch.cuda.current_stream())  # the inputs above were made on the default stream
    with torch.cuda.stream(s):
        x = torch.full(shape, float("nan"), dtype=dtype, device="cuda")
        g = torch.full(shape, float("nan"), dtype=dtype, device="cuda")
        torch.cuda._sleep(100_000_000)  # ~0.05-0.1 s of GPU time on stream s
        x.copy_(src)
        g.copy_(gsrc)
        x.requires_grad_()
        y = op.fastact(x, dim=dim, bias=b)
        y.backward(g)
        x_ref = x.detach().double().requires_grad_()
        y_ref = op.torch(x_ref, dim=dim, bias=b.double() if b is not None else None)
        y_ref.backward(g.double())
        done = torch.cuda.Event()
        done.record(s)
    done.synchronize()  # the stream's work only, not the device
    assert_close(y, y_ref, msg=f"{op} on a side stream")
    assert_close(x.grad, x_ref.grad, msg=f"{op} grad on a side stream")


@pytest.mark.parametrize("op", ALL_OPS, ids=str)
@pytest.mark.parametrize("shape,dim", [((64, 1024), -1), ((4, 70000), -1), ((16, 300, 8), 1)], ids=str)
def test_side_stream(op, shape, dim):
    if not op.takes_dim and dim != -1:
        pytest.skip("elementwise op: one case is enough")
    _side_stream_case(op, shape, dim, torch.float32)


@pytest.mark.parametrize("variant", VARIANTS)
def test_side_stream_forced_variants(variant):
    for cls, d in [("rows", 512), ("rows", 4096), ("misaligned", 1025), ("rows", 65536), ("strided_33", 129)]:
        x0, dim = make_class(cls, d, torch.float16)
        if _call(lambda: ops.softmax(x0, dim, None, variant=variant))[1] is not None:
            continue
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            x = torch.full_like(x0, float("nan"))
            torch.cuda._sleep(50_000_000)
            x.copy_(x0)
            y = ops.softmax(x, dim, None, variant=variant)
            dx = ops.softmax_backward(x, y, dim, torch.float16, variant=variant)
            ev = torch.cuda.Event()
            ev.record(s)
        ev.synchronize()
        ref = torch.softmax(x0.double(), dim)
        assert_close(y, ref, msg=f"{variant} {cls} {d}")
        assert_close(dx, softmax_backward_ref(x0, y, dim, False), msg=f"{variant} {cls} {d} backward")


def _graph_step(x, b, xh, weights):
    outs = [
        fastact.softmax(x, -1),
        fastact.log_softmax(x, 0),
        fastact.bias_gelu(x, b),
        fastact.softmax(xh, -1, dtype=torch.float32),
        fastact.log_softmax(x[:, 1:], -1),
    ] + [op.fastact(x) for op in POINTWISE_OPS]  # every pointwise op at every value of its params
    loss = sum((o.float() * w).sum() for o, w in zip(outs, weights))
    grads = torch.autograd.grad(loss, (x, b, xh))
    return [o.detach() for o in outs] + list(grads)


def test_cuda_graph_capture_and_replay():
    x = make_tensor((96, 1031), torch.float32, "cuda").requires_grad_()
    b = random_values((1031,), torch.float32, "cuda").requires_grad_()
    xh = make_tensor((96, 1031), torch.bfloat16, "cuda").requires_grad_()
    n_out = 5 + len(POINTWISE_OPS)  # _graph_step's outputs, before the gradients
    weights = [random_values(o.shape, torch.float32, "cuda") for o in _graph_step(x, b, xh, [1.0] * n_out)[:n_out]]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside the capture, as torch's docs do
        for _ in range(3):
            _graph_step(x, b, xh, weights)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = _graph_step(x, b, xh, weights)
    for trial in range(3):
        with torch.no_grad():
            x.copy_(make_tensor(tuple(x.shape), torch.float32, "cuda", scale=1 + trial))
            b.copy_(random_values(tuple(b.shape), torch.float32, "cuda"))
            xh.copy_(make_tensor(tuple(xh.shape), torch.bfloat16, "cuda"))
        graph.replay()
        eager = _graph_step(x, b, xh, weights)
        for i, (r, e) in enumerate(zip(static, eager)):
            assert torch.equal(r, e), f"replay {trial}: output {i} differs from eager"


def test_cuda_graph_forced_variants():
    cases = [(v, cls, d) for v in VARIANTS for cls, d in [("rows", 256), ("rows", 4096), ("misaligned", 1025), ("rows", 65536), ("strided_2", 100)]]
    inputs = {}
    for v, cls, d in cases:
        x, dim = make_class(cls, d, torch.float16)
        y, refusal = _call(lambda: ops.log_softmax(x, dim, None, variant=v))
        if refusal is None and _call(lambda: ops.log_softmax_backward(x, y, dim, torch.float16, variant=v))[1] is None:
            inputs[(v, cls, d)] = (x, dim)
    assert inputs
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for (v, _, _), (x, dim) in inputs.items():
            ops.log_softmax(x, dim, None, variant=v)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = {k: ops.log_softmax(x, dim, None, variant=k[0]) for k, (x, dim) in inputs.items()}
        grads = {k: ops.log_softmax_backward(x, outs[k], dim, torch.float16, variant=k[0]) for k, (x, dim) in inputs.items()}
    for (x, _) in inputs.values():
        with torch.no_grad():
            x.copy_(torch.randn_like(x, dtype=torch.float32).to(x.dtype))
    graph.replay()
    for k, (x, dim) in inputs.items():
        assert torch.equal(outs[k], ops.log_softmax(x, dim, None, variant=k[0])), k
        assert torch.equal(grads[k], ops.log_softmax_backward(x, outs[k], dim, torch.float16, variant=k[0])), k


def test_cuda_graph_staged_backward():
    """The strided backward's staged mode captured in a CUDA graph and replayed on new values (both ops,
    grad_output off the 16-byte alignment): the same bits as eager."""
    shape = (264, 100, 300)
    y = make_tensor(shape, torch.bfloat16, "cuda")
    g = make_tensor(shape, torch.bfloat16, "cuda", "offset")
    if not _is_staged("softmax", y, backward=True):
        pytest.skip("auto does not stage this shape here (the staged mode is planned on sm_90)")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for log in (False, True):
            (ops.log_softmax_backward if log else ops.softmax_backward)(g, y, 1, torch.bfloat16)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [(ops.log_softmax_backward if log else ops.softmax_backward)(g, y, 1, torch.bfloat16)
                for log in (False, True)]
    for trial in range(2):
        with torch.no_grad():
            y.copy_(torch.softmax(torch.randn(shape, device="cuda"), 1).to(torch.bfloat16))
            g.copy_(make_tensor(shape, torch.bfloat16, "cuda", scale=1 + trial))
        graph.replay()
        for log, out in zip((False, True), outs):
            eager = (ops.log_softmax_backward if log else ops.softmax_backward)(g, y, 1, torch.bfloat16)
            assert torch.equal(out, eager), f"replay {trial}, log_softmax {log}"


def test_cuda_graph_staged_forward():
    """The strided forward's staged mode captured in a CUDA graph and replayed on new values (both ops, x
    off the 16-byte alignment): the same bits as eager."""
    shape = (264, 100, 300)
    x = make_tensor(shape, torch.bfloat16, "cuda", "offset")
    if not _is_staged("softmax", x):
        pytest.skip("auto does not stage this shape here (the staged mode is planned on sm_90)")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for log in (False, True):
            (ops.log_softmax if log else ops.softmax)(x, 1, None)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [(ops.log_softmax if log else ops.softmax)(x, 1, None) for log in (False, True)]
    for trial in range(2):
        with torch.no_grad():
            x.copy_(make_tensor(shape, torch.bfloat16, "cuda", scale=1 + trial))
        graph.replay()
        for log, out in zip((False, True), outs):
            eager = (ops.log_softmax if log else ops.softmax)(x, 1, None)
            assert torch.equal(out, eager), f"replay {trial}, log_softmax {log}"


def _compile_fn(x, b, xh):
    return (
        fastact.softmax(x, -1),
        fastact.log_softmax(x, 0),
        fastact.bias_gelu(x, b, "none"),
        fastact.softmax(xh, 1, dtype=torch.float32),
    ) + tuple(op.fastact(x) for op in POINTWISE_OPS)


@pytest.mark.slow
def test_compile_reduce_overhead():
    torch._dynamo.reset()
    compiled = torch.compile(_compile_fn, mode="reduce-overhead", fullgraph=True)
    for step in range(4):
        torch.compiler.cudagraph_mark_step_begin()
        x = make_tensor((64, 257), torch.float32, "cuda").requires_grad_()
        b = random_values((257,), torch.float32, "cuda").requires_grad_()
        xh = make_tensor((64, 257), torch.bfloat16, "cuda").requires_grad_()
        outs = compiled(x, b, xh)
        loss = sum(o.float().sum() * (i + 1) for i, o in enumerate(outs))
        loss.backward()
        got = [o.detach().clone() for o in outs] + [x.grad.clone(), b.grad.clone(), xh.grad.clone()]
        xe, be, xhe = (t.detach().requires_grad_() for t in (x, b, xh))
        oute = _compile_fn(xe, be, xhe)
        sum(o.float().sum() * (i + 1) for i, o in enumerate(oute)).backward()
        want = [o.detach() for o in oute] + [xe.grad, be.grad, xhe.grad]
        for i, (g_, w_) in enumerate(zip(got, want)):
            assert_close(g_, w_, msg=f"step {step} output {i}")
    torch._dynamo.reset()


@pytest.mark.parametrize("op", ALL_OPS, ids=str)
def test_second_gpu(op):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    with torch.cuda.device(0):
        x = make_tensor((33, 1025), torch.float16, "cuda:1")
        for dim in (-1, 0) if op.takes_dim else (None,):
            y = check_op(op, x, dim=dim, bias=bias_for(x) if op.takes_bias else None)
            assert y.device == torch.device("cuda:1")
        assert isinstance(fastact.explain("softmax", x), str)
    # and with cuda:1 current while the tensor is on cuda:0
    with torch.cuda.device(1):
        x = make_tensor((33, 1025), torch.float32, "cuda:0")
        y = check_op(op, x, bias=bias_for(x) if op.takes_bias else None)
        assert y.device == torch.device("cuda:0")


@pytest.mark.parametrize("variant", VARIANTS)
def test_second_gpu_forced_variants(variant):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    with torch.cuda.device(0):
        # (4, 262144): long_row's shared-memory forward, whose dynamic shared memory limit is set per device
        for shape, dim in [((64, 512), -1), ((8, 4096), -1), ((4, 65536), -1), ((4, 262144), -1), ((8, 100, 3), 1)]:
            x = make_tensor(shape, torch.float32, "cuda:1")
            y, refusal = _call(lambda: ops.softmax(x, dim, None, variant=variant))
            if refusal is None:
                assert y.device == x.device
                assert_close(y, torch.softmax(x.double(), dim), msg=f"{variant} {shape}")



# Softmax shapes whose plans keep per-device state or take a workspace where clusters run (forward; the backward of
# each shape runs through check_op): long rows (the grid mode: partials in a zeroed workspace), dim 0 of tall
# matrices (tiles cached over clusters, sizes beyond 8 needing a per-function attribute; the split mode), streamed
# over a cluster, whole outer indices as tiles.
_SECOND_GPU_SHAPES = [((4, 1 << 20), -1), ((16384, 64), 0), ((66, 16384, 33), 1), ((1048576, 64), 0),
                      ((65536, 33), 0)]


@pytest.mark.parametrize("shape,dim", _SECOND_GPU_SHAPES, ids=lambda v: str(v) if isinstance(v, tuple) else None)
@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=str)
def test_second_gpu_plans(op, shape, dim):
    """Each shape above on cuda:1 while cuda:0 is current, and on cuda:0 while cuda:1 is: the plan is the one the
    tensor's device gets when it is current (its properties, not the current device's), and the workspace and
    cluster attributes are those of the tensor's device (right results, forward and backward)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    for current, where in ((0, "cuda:1"), (1, "cuda:0")):
        x = make_tensor(shape, torch.float32, where)
        with torch.cuda.device(x.device):
            own = _plan(fastact.explain(op.name, x, dim))
        with torch.cuda.device(current):
            s = fastact.explain(op.name, x, dim)
            assert _plan(s) == own, s
            y = check_op(op, x, dim=dim, note=f"current cuda:{current}; {s}")
            assert y.device == x.device
