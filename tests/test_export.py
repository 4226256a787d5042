"""Scripting and export of models that use fastact: torch.jit.script of every fastact.nn module,
torch.jit.trace, torch.export.export, and torch.onnx.export with both exporters (TorchScript-based,
dynamo=False; torch.export-based, dynamo=True), whose ONNX graphs must hold the standard nodes
(Softmax, LogSoftmax, Gelu or its formula, Sigmoid, Cast) and run in onnxruntime like torch.

The ONNX tests skip where onnx / onnxruntime (and onnxscript, for dynamo=True) are not installed."""

import copy
import io
import math
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import fastact
import fastact.nn as fnn
import fastact.onnx  # noqa: F401  (what import fastact does; test_export_needs_only_import_fastact checks that)
from fastact._optable import OPS as TABLE
from fastact_testing import assert_close, make_tensor

pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:`torch.jit.trace_method` is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:`torch.jit.save` is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning"),
    pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export:DeprecationWarning"),
]

# the ops TinyGPT below uses (test_onnx_export_op takes every pointwise row of the table)
FASTACT_OPS = {"softmax", "log_softmax", "gelu", "bias_gelu", "sigmoid"}
POINTWISE = [op for op in TABLE if op.kind == "pointwise"]


def _module_cases():
    """(id, constructor): every fastact.nn module and argument form."""
    return [
        ("Softmax1", lambda: fnn.Softmax(1)),
        ("Softmax-1", lambda: fnn.Softmax(dim=-1)),
        ("LogSoftmax0", lambda: fnn.LogSoftmax(0)),
        ("LogSoftmax-1", lambda: fnn.LogSoftmax(-1)),
        ("BiasGELU", lambda: fnn.BiasGELU(33)),
        ("BiasGELU-none", lambda: fnn.BiasGELU(33, approximate="none")),
    ] + [  # every pointwise row's module at every value of its params (GELU, GELU-tanh, Sigmoid, ...)
        (op.module if i == 0 else "-".join([op.module, *params.values()]),
         lambda op=op, v=tuple(params.values()): getattr(fnn, op.module)(*v))
        for op in POINTWISE for i, (_, params) in enumerate(op.variants)
    ]


MODULE_CASES = _module_cases()


def _build(make, device, dtype):
    m = make().to(device=device, dtype=dtype)
    if isinstance(m, fnn.BiasGELU):
        with torch.no_grad():
            m.bias.copy_(make_tensor((m.features,), dtype, device))
    return m


# ---------------------------------------------------------------------------------------------
# torch.jit.script


@pytest.mark.parametrize("make", [c for _, c in MODULE_CASES], ids=[i for i, _ in MODULE_CASES])
def test_script_module_matches_eager(device, dtype, make):
    """The scripted module runs the registered op: the same kernel, so the same bits, forward and
    backward (bias included)."""
    m = _build(make, device, dtype)
    s = torch.jit.script(m)
    kinds = {n.kind() for n in s.graph.nodes()} | {n.kind() for n in s.inlined_graph.nodes()}
    assert any(k.startswith("fastact::") for k in kinds), kinds
    x = make_tensor((4, 5, 33), dtype, device, "transposed", scale=2.0)
    x_e, x_s = x.detach().requires_grad_(), x.detach().requires_grad_()
    y_e, y_s = m(x_e), s(x_s)
    assert torch.equal(y_e, y_s) and y_e.dtype == y_s.dtype
    g = make_tensor(tuple(y_e.shape), dtype, device)
    params = list(m.parameters())
    grads_e = torch.autograd.grad(y_e, [x_e, *params], g)
    grads_s = torch.autograd.grad(y_s, [x_s, *s.parameters()], g)
    for a, b in zip(grads_e, grads_s):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["Softmax", "LogSoftmax"])
def test_script_implicit_dim(name):
    """dim=None compiles too: torch's implicit dim and its warning inside TorchScript."""
    s = torch.jit.script(getattr(fnn, name)())
    for x in (torch.randn(3, 4, 5, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            y = s(x)
        assert any("Implicit dimension choice for" in str(i.message) for i in w)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.testing.assert_close(y, getattr(torch.nn, name)()(x), rtol=0, atol=1e-15)


def test_script_save_load(tmp_path):
    """A scripted model saves and loads (the ops are found by name when fastact is imported)."""
    m = torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), fnn.BiasGELU(16), fnn.GELU("tanh"),
                            torch.nn.Linear(16, 6), fnn.Sigmoid(), fnn.LogSoftmax(-1), fnn.Softmax(0)).double()
    with torch.no_grad():
        m[1].bias.normal_()
    path = tmp_path / "m.pt"
    torch.jit.save(torch.jit.script(m), str(path))
    loaded = torch.jit.load(str(path))
    x = torch.randn(5, 8, dtype=torch.float64)
    assert torch.equal(loaded(x), m(x))
    code = loaded.code + "".join(c.code for c in loaded.children())
    assert all(f"fastact.{op}" in code for op in ("bias_gelu", "gelu", "sigmoid", "log_softmax", "softmax"))


# ---------------------------------------------------------------------------------------------
# A small GPT-like model that uses every fastact op, as functions and as modules.


class TinyGPT(torch.nn.Module):
    def __init__(self, vocab=13, d=16, heads=2, max_len=32):
        super().__init__()
        self.heads = heads
        self.emb = torch.nn.Embedding(vocab, d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.attn = fnn.Softmax(dim=-1)
        self.proj = torch.nn.Linear(d, d)
        self.fc = torch.nn.Linear(d, 4 * d, bias=False)
        self.act = fnn.BiasGELU(4 * d)  # tanh
        self.fc2 = torch.nn.Linear(4 * d, d)
        self.gate = fnn.Sigmoid()
        self.gelu = fnn.GELU()
        self.bias2 = torch.nn.Parameter(torch.randn(d))
        self.head = torch.nn.Linear(d, vocab)
        self.log_probs = fnn.LogSoftmax(dim=-1)
        self.register_buffer("causal", torch.ones(max_len, max_len, dtype=torch.bool).tril())
        with torch.no_grad():
            self.act.bias.normal_()

    def forward(self, tokens):
        b, t = tokens.shape
        h = self.emb(tokens)
        q, k, v = (z.reshape(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(h).chunk(3, dim=-1))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        a = self.attn(scores.masked_fill(~self.causal[:t, :t], -1e9)) @ v
        h = h + self.proj(a.transpose(1, 2).reshape(b, t, -1))
        h = h + self.fc2(self.act(self.fc(h))) * self.gate(h)
        h = self.gelu(h) + fastact.gelu(h, "tanh") + fastact.bias_gelu(h, self.bias2, "none")
        logits = self.head(h)
        return (
            self.log_probs(logits),
            fastact.softmax(logits, 1),  # a dim that is not the last
            fastact.log_softmax(logits, -1, dtype=torch.float64),
            # 16-bit in, widened first; from the embedding, which every run rounds to the same halves
            fastact.softmax(self.emb(tokens).half(), -1, dtype=torch.float32),
            fastact.sigmoid(logits),
        )


def _tiny_gpt(device, dtype=torch.float32):
    return TinyGPT().to(device=device, dtype=dtype).eval()


def _tokens(device, b=2, t=7):
    return torch.randint(0, 13, (b, t), device=device)


def _check_against_reference(outs, model, tokens, msg):
    """Each output against the model in float64 (the ONNX or traced run as `actual`, fastact's eager
    float32 run as torch's error)."""
    ref_model = TinyGPT().to(tokens.device).double().eval()
    ref_model.load_state_dict(model.state_dict())
    with torch.no_grad():
        ref, eager = ref_model(tokens), model(tokens)
    assert len(outs) == len(ref)
    for i, (o, r, e) in enumerate(zip(outs, ref, eager)):
        o = torch.as_tensor(o).to(e.device)
        assert o.dtype == e.dtype, f"{msg} output {i}: dtype {o.dtype} != {e.dtype}"
        assert_close(o, r, dtype=e.dtype, torch_actual=e, msg=f"{msg} output {i}")


# ---------------------------------------------------------------------------------------------
# torch.jit.trace and torch.export


def test_script_model(device):
    model = _tiny_gpt(device, torch.float64)
    tokens = _tokens(device)
    s = torch.jit.script(model)
    for a, b in zip(s(tokens), model(tokens)):
        assert torch.equal(a, b)


def test_trace_model(device):
    model = _tiny_gpt(device)
    traced = torch.jit.trace(model, (_tokens(device),))
    kinds = {n.kind() for n in traced.inlined_graph.nodes()}
    assert {f"fastact::{op}" for op in FASTACT_OPS} <= kinds, kinds
    tokens = _tokens(device)  # other values than the traced ones
    with torch.no_grad():
        for a, b in zip(traced(tokens), model(tokens)):
            if device == "cuda":
                # TorchScript's executor fuses the traced graph's CUDA elementwise ops (the masked_fill, adds,
                # scaling), which rounds differently from the eager ops: equal to float32 rounding, not to the bit;
                # float32's tolerance for every output, the float64 log_softmax of float32 logits too (on the H100,
                # torch 2.11: one element of 182 3.1e-7 apart there).
                torch.testing.assert_close(a, b, rtol=1.3e-6, atol=1e-5)
            else:
                assert torch.equal(a, b)


def test_torch_export_model(device):
    """torch.export keeps the fastact ops (they have fake kernels), also through the default
    run_decompositions (so AOTInductor and other backends get the fastact kernels), and with a
    dynamic batch size."""
    model = _tiny_gpt(device)
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(model, (_tokens(device),), dynamic_shapes=({0: batch},))
    for program in (ep, ep.run_decompositions()):
        targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
        assert {f"fastact.{op}.default" for op in FASTACT_OPS} <= targets, targets
        for b in (1, 5):
            tokens = _tokens(device, b=b)
            with torch.no_grad():
                for x, y in zip(program.module()(tokens), model(tokens)):
                    assert torch.equal(x, y)


# ---------------------------------------------------------------------------------------------
# torch.onnx.export


def _onnx_deps(dynamo):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    if dynamo:
        pytest.importorskip("onnxscript")
    return onnx, ort


def _export(model, args, dynamo, opset, **kwargs):
    """The ModelProto torch.onnx.export makes."""
    onnx, _ = _onnx_deps(dynamo)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporters' deprecation and progress warnings
        if dynamo:
            return torch.onnx.export(model, args, dynamo=True, opset_version=opset, verbose=False, **kwargs).model_proto
        f = io.BytesIO()
        torch.onnx.export(model, args, f, dynamo=False, opset_version=opset, **kwargs)
    return onnx.load_from_string(f.getvalue())


def _run_onnx(model_proto, *inputs):
    _, ort = _onnx_deps(False)
    sess = ort.InferenceSession(model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {i.name: x.cpu().numpy() for i, x in zip(sess.get_inputs(), inputs)}
    return [torch.from_numpy(o) for o in sess.run(None, feeds)]


def _op_types(model_proto):
    return [n.op_type for n in model_proto.graph.node] + [n.op_type for f in model_proto.functions for n in f.node]


def _producers(model_proto):
    return {out: n for n in model_proto.graph.node for out in n.output}


def _check_standard_nodes(model_proto, opset, *, dtype_cast=True):
    """Standard ONNX only: no node in a custom domain; Softmax, LogSoftmax, Sigmoid; Gelu from
    opset 20 (bias_gelu as Add + Gelu), its Erf and Tanh formulas before; dtype= as Cast + op."""
    types = set(_op_types(model_proto))
    domains = {n.domain for n in model_proto.graph.node} | {n.domain for f in model_proto.functions for n in f.node}
    assert domains <= {"", "ai.onnx"}, domains
    assert not any("fastact" in t for t in types), types
    assert {"Softmax", "LogSoftmax", "Sigmoid"} <= types, types
    producers = _producers(model_proto)
    if opset >= 20:
        assert "Gelu" in types and "Erf" not in types and "Tanh" not in types, types
        gelus = [n for n in model_proto.graph.node if n.op_type == "Gelu"]
        assert {a.s.decode() for n in gelus for a in n.attribute if a.name == "approximate"} >= {"tanh"}
        assert any(producers.get(n.input[0]) is not None and producers[n.input[0]].op_type == "Add" for n in gelus)
    else:
        assert "Gelu" not in types and {"Erf", "Tanh"} <= types, types
    if dtype_cast:  # softmax(x, dtype=): the Cast comes first, then the op
        casts_in = [n for n in model_proto.graph.node if n.op_type in ("Softmax", "LogSoftmax")
                    and producers.get(n.input[0]) is not None and producers[n.input[0]].op_type == "Cast"]
        assert {n.op_type for n in casts_in} == {"Softmax", "LogSoftmax"}, [n.op_type for n in casts_in]


EXPORTERS = [
    pytest.param(False, 11, id="torchscript-opset11"),
    pytest.param(False, 17, id="torchscript-opset17"),
    pytest.param(False, 20, id="torchscript-opset20"),
    pytest.param(True, 18, id="dynamo-opset18"),
    pytest.param(True, 20, id="dynamo-opset20"),
]


@pytest.mark.parametrize("dynamo,opset", EXPORTERS)
def test_onnx_export_model(device, dynamo, opset):
    model = _tiny_gpt(device)
    # TorchScript's exporter folds constants by running torch ops on the initializers: on CUDA it slices the model's
    # CUDA mask buffer with CPU index constants and fails ("Expected all tensors to be on the same device", torch
    # 2.11, with torch's own softmax as with fastact's), so on CUDA that exporter runs without folding.
    kwargs = {"do_constant_folding": False} if device == "cuda" and not dynamo else {}
    proto = _export(model, (_tokens(device),), dynamo, opset, **kwargs)
    _check_standard_nodes(proto, opset)
    for b, t in ((2, 7),):  # the exported shapes (both exporters fix them without dynamic axes)
        tokens = _tokens(device, b, t)
        _check_against_reference(_run_onnx(proto, tokens), model, tokens, f"onnxruntime, {b}x{t}")


def test_onnx_export_plain_call(tmp_path):
    """torch.onnx.export(model, args, f) and nothing else: torch's default exporter and opset."""
    _onnx_deps(True)
    onnx = pytest.importorskip("onnx")
    model, tokens = _tiny_gpt("cpu"), _tokens("cpu")
    path = tmp_path / "tiny_gpt.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (tokens,), path)
    proto = onnx.load(str(path))
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    _check_standard_nodes(proto, opset)
    _check_against_reference(_run_onnx(proto, tokens), model, tokens, "onnxruntime")


def test_onnx_export_dynamic_batch():
    """dynamo=True with a dynamic batch size: the ONNX model runs other batch sizes."""
    model = _tiny_gpt("cpu")
    batch = torch.export.Dim("batch", min=1, max=64)
    proto = _export(model, (_tokens("cpu"),), True, 20, dynamic_shapes=({0: batch},))
    for b in (1, 5):
        tokens = _tokens("cpu", b=b)
        _check_against_reference(_run_onnx(proto, tokens), model, tokens, f"onnxruntime, batch {b}")


class Ops(torch.nn.Module):
    """One fastact op (or module) on one input: what the model does not cover (ranks, dims)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


OP_CASES = [
    ("softmax-0d", lambda x: fastact.softmax(x, 0), ()),
    ("log_softmax-0d", lambda x: fastact.log_softmax(x, -1), ()),
    ("softmax-1d", lambda x: fastact.softmax(x, 0), (9,)),
    ("softmax-dim0-3d", lambda x: fastact.softmax(x, 0), (3, 4, 5)),
    ("log_softmax-dim1-4d", lambda x: fastact.log_softmax(x, 1), (2, 3, 4, 5)),
    ("softmax-dtype-f64", lambda x: fastact.softmax(x, 1, dtype=torch.float64), (3, 4, 5)),
    ("Softmax-implicit-3d", fnn.Softmax(), (3, 4, 5)),  # dim 0
    ("LogSoftmax-implicit-2d", fnn.LogSoftmax(), (3, 4)),  # dim 1
    ("BiasGELU-none", fnn.BiasGELU(6, "none"), (4, 6)),
    # float16 (onnxruntime's CPU kernels have no bfloat16): GELU's formula computed in float
    ("gelu-f16", lambda x: fastact.gelu(x), (4, 6), torch.float16),
    ("BiasGELU-tanh-f16", fnn.BiasGELU(6), (4, 6), torch.float16),
    ("softmax-f16", lambda x: fastact.softmax(x, -1), (4, 6), torch.float16),
] + [  # every pointwise row at every value of its params, as a function and as its module
    case for op in POINTWISE for label, params in op.variants for case in (
        (label, lambda x, f=getattr(fastact, op.name), v=tuple(params.values()): f(x, *v), (3, 4, 5)),
        (f"{op.module}-{label}", getattr(fnn, op.module)(*params.values()), (4, 6)))
]


@pytest.mark.parametrize("dynamo,opset", [EXPORTERS[0], EXPORTERS[3]])  # the model covers the rest
@pytest.mark.parametrize("case", OP_CASES, ids=[c[0] for c in OP_CASES])
def test_onnx_export_op(case, dynamo, opset):
    _, fn, shape, *dtype = case
    dtype = dtype[0] if dtype else torch.float32
    m = copy.deepcopy(Ops(fn)).to(dtype).eval()
    if isinstance(m.fn, fnn.BiasGELU):
        with torch.no_grad():
            m.fn.bias.normal_()
    x = make_tensor(shape, dtype, "cpu", scale=3.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dim=None's deprecation warning
        proto = _export(m, (x,), dynamo, opset)
        expected = m(x)
        ref = copy.deepcopy(m).double()(x.double())
    assert not any("fastact" in t for t in _op_types(proto))
    (y,) = _run_onnx(proto, x)
    assert y.dtype == expected.dtype and y.shape == expected.shape
    assert_close(y, ref, dtype=expected.dtype, torch_actual=expected)


# ---------------------------------------------------------------------------------------------
# Registration: lazy, and with no step for the user


def _python(code):
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(fastact.__file__))  # this fastact, not an installed one
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


@pytest.mark.slow
@pytest.mark.parametrize("order", ["fastact-first", "torch.onnx-first"])
def test_export_needs_only_import_fastact(order):
    """A fresh interpreter that imports fastact (before or after torch.onnx) exports with both
    exporters: the ops are registered with no call from the user. ``import fastact`` itself loads
    neither torch.onnx nor onnxscript (tens of milliseconds and seconds)."""
    _onnx_deps(True)
    imports = {
        "fastact-first": """
            import sys, fastact
            loaded = sorted(m for m in sys.modules if m == "torch.onnx" or m.startswith("onnxscript"))
            print("loaded-by-import-fastact", loaded)
            import torch.onnx
        """,
        "torch.onnx-first": "import torch.onnx\nimport fastact\n",
    }[order]
    out = _python(textwrap.dedent(imports) + textwrap.dedent("""
        import io, warnings, onnx, torch
        class M(torch.nn.Module):
            def forward(self, x):
                return fastact.softmax(fastact.gelu(x) + fastact.sigmoid(x), -1)
        for dynamo in (False, True):
            f = io.BytesIO()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(M(), (torch.randn(3, 4),), f, dynamo=dynamo)
            op_types = sorted({n.op_type for n in onnx.load_from_string(f.getvalue()).graph.node})
            print("dynamo" if dynamo else "torchscript", op_types)
    """))
    lines = dict(line.split(" ", 1) for line in out.strip().splitlines() if line.split(" ", 1)[0] in
                 ("torchscript", "dynamo", "loaded-by-import-fastact"))
    for exporter in ("torchscript", "dynamo"):
        assert "Softmax" in lines[exporter] and "Sigmoid" in lines[exporter] and "fastact" not in lines[exporter], out
    if order == "fastact-first":
        assert lines["loaded-by-import-fastact"] == "[]", out


def test_registration_failure_warns_not_raises():
    """Whatever goes wrong registering, torch.onnx still imports; the user gets a RuntimeWarning."""
    import fastact.onnx as fonnx

    def broken():
        raise ValueError("no such registry")

    with pytest.warns(RuntimeWarning, match="could not register the fastact ops"):
        fonnx._register("a test registry", broken)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        fonnx._register("a test registry", broken)  # once only
    assert w == []
