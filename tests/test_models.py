"""fastact in real models: `fastact.patch()` (torch's functions routed to fastact) and
`fastact.apply(model)` (activation modules swapped, the forward run inside the mode).

Models: Hugging Face transformers GPT-2 and BERT built from small configs (random weights, nothing
downloaded; eager attention, so the attention softmax is an `F.softmax` call) and plain torch
models. Each runs forward and backward three times from the same weights: torch in float64 (the
reference), torch in the tested dtype and fastact in the tested dtype. Logits and every parameter's
gradient must meet the suite's rule (fastact_testing.assert_close: the dtype's tolerance plus twice
torch's own error against float64), and OpCounter must show fastact's kernels ran, forward and
backward, for the softmax and the GELU of every layer. The transformers tests skip only where
transformers is not installed.
"""

import copy
import functools
import pickle
import warnings

import pytest
import torch
import torch.nn.functional as F

import fastact
from fastact._optable import OPS as TABLE
from fastact.patch import FastActMode, OpCounter
from fastact_testing import assert_close, dtype_id

POINTWISE = [op for op in TABLE if op.kind == "pointwise"]

MODEL_DTYPES = [torch.float32, torch.bfloat16]
N_LAYER = 2


def _transformers():
    return pytest.importorskip("transformers")


def gpt2(dtype_init=torch.float32):
    tr = _transformers()
    cfg = tr.GPT2Config(n_layer=N_LAYER, n_embd=64, n_head=4, vocab_size=1000, n_positions=64,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                        attn_implementation="eager")
    return tr.GPT2LMHeadModel(cfg)


def bert():
    tr = _transformers()
    cfg = tr.BertConfig(num_hidden_layers=N_LAYER, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                        vocab_size=1000, max_position_embeddings=64, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, attn_implementation="eager")
    return tr.BertForMaskedLM(cfg)


def token_inputs(device, batch=3, seq=24):
    """Token ids and an attention mask whose last sequence is padded (a masked softmax)."""
    ids = torch.randint(0, 1000, (batch, seq), device=device)
    mask = torch.ones(batch, seq, dtype=torch.long, device=device)
    mask[-1, seq // 2:] = 0
    return dict(input_ids=ids, attention_mask=mask)


def run_step(model, inputs, weight):
    """Forward, then backward of a random linear function of the logits: (logits, {name: grad}),
    the float inputs' gradients under their own names."""
    model.zero_grad(set_to_none=True)
    out = model(**inputs)
    logits = out.logits if hasattr(out, "logits") else out
    (logits.to(weight.dtype) * weight).sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    grads.update({f"input {k}": v.grad for k, v in inputs.items() if v.requires_grad})
    return logits.detach(), grads


def compare(base, inputs, dtype, device, *, float_input=None):
    """Runs `base` (float32 weights) as the float64 reference, as torch in `dtype` and with fastact
    applied in `dtype`; checks logits and gradients (of the parameters, and of `float_input` where
    the model takes a float tensor). Returns the OpCounter counts of the fastact run, apply's
    `replaced` and the fastact model. The torch run's OpCounter must count nothing."""
    base = base.to(device).train()
    ref_model = copy.deepcopy(base).to(dtype).to(torch.float64)  # the tested dtype's weights, exactly
    torch_model = copy.deepcopy(base).to(dtype)
    fast_model, replaced = fastact.apply(copy.deepcopy(base).to(dtype))

    def cast(d):
        if float_input is None:
            return inputs
        return {**inputs, float_input: inputs[float_input].detach().to(d, copy=True).requires_grad_()}

    with torch.no_grad():
        out = torch_model(**cast(dtype))
    weight = torch.randn((out.logits if hasattr(out, "logits") else out).shape, dtype=torch.float64, device=device)

    ref_logits, ref_grads = run_step(ref_model, cast(torch.float64), weight)
    with OpCounter() as torch_count:
        torch_logits, torch_grads = run_step(torch_model, cast(dtype), weight)
    with OpCounter() as count:
        fast_logits, fast_grads = run_step(fast_model, cast(dtype), weight)

    msg = f"{type(base).__name__} {dtype_id(dtype)} on {device}"
    assert fast_logits.dtype == torch_logits.dtype
    assert_close(fast_logits, ref_logits, torch_actual=torch_logits, msg=f"{msg}: logits")
    assert fast_grads.keys() == torch_grads.keys() == ref_grads.keys()
    assert len(fast_grads) == len(list(base.parameters())) + (float_input is not None)
    for name, g in fast_grads.items():
        assert_close(g, ref_grads[name], torch_actual=torch_grads[name], msg=f"{msg}: grad of {name}")
    assert sum(torch_count.counts.values()) == 0, torch_count.counts
    return count.counts, replaced, fast_model


@pytest.mark.parametrize("dtype", MODEL_DTYPES, ids=dtype_id)
def test_gpt2(device, dtype):
    counts, replaced, model = compare(gpt2(), token_inputs(device), dtype, device)
    assert replaced == {"NewGELUActivation": N_LAYER}  # GPT-2's gelu_new is the tanh GELU
    assert all(type(b.mlp.act) is fastact.nn.GELU and b.mlp.act.approximate == "tanh" for b in model.transformer.h)
    # One attention softmax (F.softmax through apply's copies) and one MLP GELU per layer, each with its backward.
    assert counts == {"softmax": N_LAYER, "softmax_backward": N_LAYER, "gelu": N_LAYER, "gelu_backward": N_LAYER}
    assert model.fastact_mode.counts == {"softmax": N_LAYER} and not model.fastact_mode.fallbacks


@pytest.mark.parametrize("dtype", MODEL_DTYPES, ids=dtype_id)
def test_bert(device, dtype):
    counts, replaced, model = compare(bert(), token_inputs(device), dtype, device)
    # GELUActivation (F.gelu) in every layer's intermediate and in the MLM head's transform.
    assert replaced == {"GELUActivation": N_LAYER + 1}
    assert counts == {"softmax": N_LAYER, "softmax_backward": N_LAYER,
                      "gelu": N_LAYER + 1, "gelu_backward": N_LAYER + 1}


def llama():
    tr = _transformers()
    cfg = tr.LlamaConfig(num_hidden_layers=N_LAYER, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=128, vocab_size=1000, max_position_embeddings=64, attn_implementation="eager")
    return tr.LlamaForCausalLM(cfg)


@pytest.mark.parametrize("dtype", MODEL_DTYPES, ids=dtype_id)
def test_llama(device, dtype):
    """Llama's attention forward is wrapped by transformers' kernel decorator (which reads self.forward) and its
    eager attention takes softmax's dtype=float32; its MLP's SiLU is swapped."""
    counts, replaced, model = compare(llama(), token_inputs(device), dtype, device)
    assert counts == {"softmax": N_LAYER, "softmax_backward": N_LAYER, "silu": N_LAYER, "silu_backward": N_LAYER}
    assert replaced in ({"SiLUActivation": N_LAYER}, {"SiLU": N_LAYER})  # older transformers: torch's nn.SiLU
    assert model.fastact_mode.counts == {"softmax": N_LAYER} and not model.fastact_mode.fallbacks
    assert {type(m).__name__ for m in model.modules() if getattr(type(m), "_fastact_routes", None)} == {"LlamaAttention"}
    assert not any(m._forward_pre_hooks for m in model.modules())  # no mode anywhere


@pytest.mark.parametrize("make,attention,methods", [(lambda: gpt2(), "GPT2Attention", {"forward", "_upcast_and_reordered_attn"}),
                                                    (lambda: bert(), "BertSelfAttention", {"forward"})],
                         ids=["gpt2", "bert"])
def test_apply_routes_attention_without_the_mode(make, attention, methods):
    """The attentions reach F.softmax as `nn.functional.softmax` (in transformers' eager_attention_forward, and in
    GPT-2's _upcast_and_reordered_attn method): apply gives them copies of those functions that call fastact, so no
    module of the model runs inside the mode and no torch call pays for it; every layer's softmax routes."""
    model, _ = fastact.apply(make())
    modes = []

    def seen(module, args, output):
        modes.append(torch._C._is_torch_function_mode_enabled())

    for m in model.modules():
        m.register_forward_hook(seen)
    with torch.no_grad():
        model(**token_inputs("cpu"))
    assert len(modes) > 3 * N_LAYER and not any(modes)
    attentions = [m for m in model.modules() if type(m).__name__ == attention]
    assert len(attentions) == N_LAYER
    assert {m for m in model.modules() if getattr(type(m), "_fastact_routes", None)} == set(attentions)
    assert all(set(type(m)._fastact_routes) == methods and type(m).__name__ == attention for m in attentions)
    assert model.fastact_mode.counts == {"softmax": N_LAYER} and not model.fastact_mode.fallbacks
    # the class, and a model that was not applied, are untouched
    with OpCounter() as count, torch.no_grad():
        make()(**token_inputs("cpu"))
    assert not count.counts


@pytest.mark.parametrize("make", [gpt2, bert], ids=["gpt2", "bert"])
def test_applied_transformers_model_under_torch_compile(make):
    """dynamo traces the copied attention functions (whose globals are no module's own): every layer's softmax is
    fastact's in the graph, none is torch's, and the logits are the eager applied model's."""
    torch._dynamo.reset()
    model, _ = fastact.apply(make().eval())
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    inputs = token_inputs("cpu")
    with torch.no_grad():
        y = torch.compile(model, backend=backend)(**inputs).logits
        torch.testing.assert_close(y, model(**inputs).logits)
    targets = [str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    assert sum(t == "fastact.softmax.default" for t in targets) == N_LAYER
    assert not [t for t in targets if "softmax" in t and "fastact" not in t]
    torch._dynamo.reset()


def _helper_softmax(x):
    return F.softmax(x, dim=-1)


def _decorate(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    return wrapper


class _Globals(torch.nn.Module):
    """Reaches each routed function through a module global: a helper, torch, F, torch.nn.functional."""

    @_decorate
    def forward(self, x):
        return _helper_softmax(x) + torch.sigmoid(x) + F.gelu(x, approximate="tanh") + torch.nn.functional.silu(x)


class _TensorMethod(torch.nn.Module):
    def forward(self, x):
        return x.softmax(-1)


class _Held(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.act = F.gelu

    def forward(self, x):
        return self.act(x)


class _TorchFunctionThatCalls(torch.nn.Module):
    def forward(self, x):
        return F.sigmoid(x)  # F.sigmoid is Python calling Tensor.sigmoid: only the mode reaches that


class _Deep(torch.nn.Module):
    def forward(self, x):
        return _three(x)


class _Mixed(torch.nn.Module):
    def forward(self, x):
        return _helper_softmax(x) + _three(x)


def _three(x):
    return _two(x)


def _two(x):
    return _one(x)


def _one(x):
    return _helper_softmax(x)


@pytest.mark.parametrize("cls,copied,routes", [
    (_Globals, True, {"softmax": 1, "sigmoid": 1, "gelu": 1, "silu": 1}),
    (_TensorMethod, False, {"softmax": 1}),
    (_Held, False, {"gelu": 1}),
    (_TorchFunctionThatCalls, False, {"sigmoid": 1}),
    # F.softmax four calls deep: no module found, so the mode runs around the whole model
    (_Deep, False, {"softmax": 1}),
    # found (one call deep), but another path reaches F.softmax beyond the copies' depth: the mode
    (_Mixed, False, {"softmax": 2}),
], ids=lambda v: v.__name__ if isinstance(v, type) else None)
def test_apply_copies_only_what_the_bytecode_shows(cls, copied, routes):
    """A module reaching the routed functions only through module globals gets copies (no mode); any other way
    (a Tensor method, a function held in an attribute, a torch function that calls one, a call deeper than the
    search) keeps the mode, which routes the call all the same; results are torch's."""
    model, _ = fastact.apply(torch.nn.Sequential(cls()))
    entered = []
    model[0].register_forward_pre_hook(lambda m, a: entered.append(torch._C._is_torch_function_mode_enabled()))
    x = torch.randn(3, 8)
    with OpCounter() as count:
        y = model(x)
    torch.testing.assert_close(y, cls()(x))
    assert bool(getattr(type(model[0]), "_fastact_routes", None)) == copied and entered == [not copied]
    assert model.fastact_mode.counts == routes and count.counts == routes


class _Parent(torch.nn.Module):
    def helper(self, x):
        return F.softmax(x, dim=-1)


class _Super(_Parent):
    def helper(self, x):
        return super().helper(x) * 2  # the parent's helper: only the mode reaches it

    def forward(self, x):
        return F.gelu(self.helper(x))


class _ThroughType(torch.nn.Module):
    @staticmethod
    def _attn(x):
        return F.softmax(x, dim=-1)

    def forward(self, x):
        return type(self)._attn(x)  # the subclass's copy


class _ThroughClassName(torch.nn.Module):
    @staticmethod
    def _attn(x):
        return F.softmax(x, dim=-1)

    def forward(self, x):
        return _ThroughClassName._attn(x) + F.gelu(x)  # the original class's


class _Property(torch.nn.Module):
    @property
    def scale(self):
        return F.softmax(torch.ones(8), -1)

    def forward(self, x):
        return F.gelu(x) * self.scale


class _InnerDeep(torch.nn.Module):
    def forward(self, x):
        return _three(x)


class _OuterOfDeep(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _InnerDeep()

    def forward(self, x):
        return F.gelu(self.inner(x))  # the submodule's softmax ran inside this forward's mode


_ACTS = {"gelu": F.gelu}


class _Table(torch.nn.Module):
    def forward(self, x):
        return _ACTS["gelu"](x) + F.softmax(x, -1)


class _Identity(torch.nn.Module):
    def forward(self, x):
        fn = _ACTS["gelu"]
        return F.softmax(x, -1) + (1.0 if fn is F.gelu else 0.0)  # F.gelu as a value: torch's own object


class _Default(torch.nn.Module):
    def forward(self, x, act=lambda t: F.softmax(t, -1)):
        return act(F.gelu(x))


_CALLS = 0


class _WritesGlobals(torch.nn.Module):
    def forward(self, x):
        global _CALLS
        _CALLS += 1
        return F.softmax(x, -1)


@pytest.mark.parametrize("cls,copied,routes", [
    (_Super, False, {"softmax": 1, "gelu": 1}),
    (_ThroughType, True, {"softmax": 1}),
    (_ThroughClassName, False, {"softmax": 1, "gelu": 1}),
    (_Property, False, {"softmax": 1, "gelu": 1}),
    (_OuterOfDeep, False, {"softmax": 1, "gelu": 1}),
    (_Table, False, {"softmax": 1, "gelu": 1}),
    (_Identity, False, {"softmax": 1}),
    (_Default, False, {"softmax": 1, "gelu": 1}),
    (_WritesGlobals, False, {"softmax": 1}),
], ids=lambda v: v.__name__ if isinstance(v, type) else None)
def test_apply_keeps_the_mode_where_copies_would_miss(cls, copied, routes):
    """Each way a copy of the forward would miss a routed call or change what the code does keeps the mode, which
    routes what torch's functions would have run: the counts are the mode's, the results torch's."""
    test_apply_copies_only_what_the_bytecode_shows(cls, copied, routes)


def test_applied_module_copies_and_replicas_use_their_own_weights():
    """The copies live in a subclass (the module's class is swapped, as torch.nn.utils.parametrize does), so a shallow
    copy or a DataParallel replica runs its own parameters; an instance method set by the user wins over them (the
    mode there); pickling an applied model fails instead of silently dropping the routes."""
    model, _ = fastact.apply(torch.nn.Sequential(torch.nn.Linear(8, 8), _Globals()))
    twin = copy.copy(model[1])
    assert type(twin) is type(model[1]) and type(model[1]).__name__ == "_Globals"
    replica = model._replicate_for_data_parallel()
    with torch.no_grad():
        replica[0].weight.mul_(3)
    x = torch.randn(2, 8)
    torch.testing.assert_close(replica(x), _Globals()(replica[0](x)))
    own = _Globals()
    own.forward = lambda x: F.softmax(x, -1)
    applied, _ = fastact.apply(torch.nn.Sequential(own))
    assert type(applied[0]) is _Globals
    with OpCounter() as count:
        applied(x)
    assert count.counts == {"softmax": 1} and applied.fastact_mode.counts == {"softmax": 1}
    with pytest.raises(Exception, match="_Globals"):
        pickle.dumps(model)


class _Implicit(torch.nn.Module):
    def forward(self, x):
        return F.softmax(x)


def test_apply_copies_warn_and_nest_as_torch():
    """A copied forward's F.softmax(x) (the implicit dim) warns at the caller's line, as torch's; applying a model
    that holds an applied one copies nothing more, and the copies keep counting into the first apply's mode."""
    x = torch.randn(2, 3, 4)

    def warned(m):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            y = m(x)
        return y, [(i.category, i.filename, i.lineno) for i in w]

    y_ref, w_ref = warned(_Implicit())
    model, _ = fastact.apply(torch.nn.Sequential(_Implicit()))
    y, w = warned(model)
    assert type(model[0])._fastact_routes == ("forward",) and model.fastact_mode.counts == {"softmax": 1}
    assert w == w_ref != []
    torch.testing.assert_close(y, y_ref)
    routed = type(model[0])
    outer, _ = fastact.apply(torch.nn.Sequential(model, torch.nn.Softmax(-1)))
    assert type(model[0]) is routed
    with OpCounter() as count:
        warned(outer)
    assert count.counts == {"softmax": 2}
    assert model.fastact_mode.counts == {"softmax": 2} and not outer.fastact_mode.counts


def test_applied_model_deepcopies():
    """A deep copy of an applied model runs its own weights through the copied forwards (bound to the copy)."""
    model, _ = fastact.apply(torch.nn.Sequential(torch.nn.Linear(8, 8), _Globals()))
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin[0].weight.mul_(2)
    x = torch.randn(3, 8)
    with OpCounter() as count:
        y = twin(x)
    assert type(twin[1]) is type(model[1]) and count.counts["softmax"] == 1
    torch.testing.assert_close(y, _Globals()(twin[0](x)))


@pytest.mark.parametrize("dtype", MODEL_DTYPES, ids=dtype_id)
def test_gpt2_under_patch_only(device, dtype):
    """No apply: the context manager alone reaches the attention softmax, and NewGELU's tanh
    formula stays torch's (it is no F.gelu call), so only softmax routes."""
    base = gpt2().to(device).to(dtype)
    inputs = token_inputs(device)
    ref = copy.deepcopy(base)
    with torch.no_grad(), OpCounter() as count, fastact.patch() as mode:
        y = base(**inputs).logits
    y_ref = ref(**inputs).logits
    assert count.counts == {"softmax": N_LAYER} and mode.counts == {"softmax": N_LAYER}
    assert_close(y, ref.to(torch.float64)(**inputs).logits, torch_actual=y_ref, msg="gpt2 under patch()")


class PlainNet(torch.nn.Module):
    """Every torch activation module fastact swaps, and functional calls that only the mode reaches."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(48, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.GELU(approximate="tanh"),
            torch.nn.Linear(64, 32), torch.nn.Sigmoid(), torch.nn.Linear(32, 40))
        self.attn = torch.nn.Softmax(dim=1)
        self.out = torch.nn.LogSoftmax(dim=-1)

    def forward(self, x):
        h = self.body(x)                      # [B, 40]
        a = self.attn(h.view(-1, 5, 8))       # softmax over a middle dim: the strided kernels
        h = h + a.reshape(h.shape) + torch.sigmoid(h) * F.gelu(h, approximate="tanh")
        return self.out(h + F.softmax(h, dim=-1))


def test_plain_torch_model(device, dtype):
    inputs = dict(x=torch.randn(16, 48, device=device))
    counts, replaced, model = compare(PlainNet(), inputs, dtype, device, float_input="x")
    assert replaced == {"GELU": 2, "Sigmoid": 1, "Softmax": 1, "LogSoftmax": 1}
    assert [type(m) for m in model.body] == [torch.nn.Linear, fastact.nn.GELU, torch.nn.Linear, fastact.nn.GELU,
                                           torch.nn.Linear, fastact.nn.Sigmoid, torch.nn.Linear]
    assert model.body[3].approximate == "tanh" and model.attn.dim == 1 and model.out.dim == -1
    assert counts == {"gelu": 3, "gelu_backward": 3, "sigmoid": 2, "sigmoid_backward": 2, "softmax": 2,
                      "softmax_backward": 2, "log_softmax": 1, "log_softmax_backward": 1}
    assert model.fastact_mode.counts == {"gelu": 1, "sigmoid": 1, "softmax": 1}


def test_apply_without_functional_and_twice():
    model = PlainNet()
    model, replaced = fastact.apply(model, functional=False)
    assert sum(replaced.values()) == 5 and getattr(model, "fastact_mode", None) is None
    with OpCounter() as count:
        model(torch.randn(4, 48))
    # The modules only: the functional sigmoid, gelu and softmax in forward stay torch's.
    assert count.counts == {"gelu": 2, "sigmoid": 1, "softmax": 1, "log_softmax": 1}
    model, replaced = fastact.apply(model)
    model, again = fastact.apply(model)
    assert not replaced and not again
    with OpCounter() as count:
        model(torch.randn(4, 48))
    assert count.counts == {"gelu": 3, "sigmoid": 2, "softmax": 2, "log_softmax": 1}
    assert model.fastact_mode.counts == {"gelu": 1, "sigmoid": 1, "softmax": 1}


def test_apply_keeps_hooks_and_leaves_what_it_cannot_match():
    seen = []
    act = torch.nn.GELU()
    handle = act.register_forward_hook(lambda m, i, o: seen.append(o.shape))

    class MyGELU(torch.nn.GELU):  # a subclass may change the math: never swapped
        def forward(self, x):
            return super().forward(x) * 2

    model = torch.nn.Sequential(act, MyGELU(), torch.nn.Softmax(dim=None), torch.nn.ReLU())
    model.eval()
    ref = torch.nn.Sequential(torch.nn.GELU(), MyGELU(), torch.nn.Softmax(dim=None), torch.nn.ReLU())  # no hook
    model, replaced = fastact.apply(model)
    assert replaced == {"GELU": 1, "Softmax": 1}
    assert type(model[0]) is fastact.nn.GELU and not model[0].training
    assert type(model[1]) is MyGELU and type(model[3]) is torch.nn.ReLU
    assert type(model[2]) is fastact.nn.Softmax and model[2].dim is None
    x = torch.randn(2, 3)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        y = model(x)  # the implicit dim (1 for a 2-d input) and its warning, as torch's module
    assert seen == [torch.Size([2, 3])]
    with warnings.catch_warnings(record=True) as w_torch:
        warnings.simplefilter("always")
        torch.testing.assert_close(y, ref(x))
    assert [(m.category, m.filename) for m in w] == [(m.category, m.filename) for m in w_torch] != []
    handle.remove()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model(x)
    assert len(seen) == 1


def test_apply_leaves_the_mode_stack_clean_on_error():
    class Boom(torch.nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    class Probe(torch.nn.Module):
        def forward(self, x):
            self.depth = torch._C._len_torch_function_stack()
            return F.softmax(x, -1)

    model, _ = fastact.apply(torch.nn.Sequential(torch.nn.GELU(), Boom()))
    depth = torch._C._len_torch_function_stack()
    with pytest.raises(ValueError, match="boom"):
        model(torch.randn(3))
    assert torch._C._len_torch_function_stack() == depth
    # A pre-hook that raises before apply's has run: apply's always-called exit hook pops nothing.
    def refuse(module, args):
        raise ValueError("refused")

    failing, _ = fastact.apply(torch.nn.Sequential(torch.nn.Softmax(-1)))
    handle = failing.register_forward_pre_hook(refuse, prepend=True)
    with pytest.raises(ValueError, match="refused"), fastact.patch():
        failing(torch.randn(3))
    assert torch._C._len_torch_function_stack() == depth
    handle.remove()
    failing.append(Probe())
    failing(torch.randn(3))  # and the next call enters the mode as ever
    assert failing.fastact_mode.counts == {"softmax": 1} and failing[-1].depth == depth + 1
    # Nested: an applied model called inside patch() and inside another applied model runs one mode.
    inner, _ = fastact.apply(torch.nn.Sequential(torch.nn.Linear(3, 3)))
    outer, _ = fastact.apply(torch.nn.Sequential(inner, torch.nn.Softmax(dim=-1)))

    inner.append(Probe())
    with OpCounter() as count:
        outer(torch.randn(2, 3))
    assert inner[-1].depth == depth + 1 and count.counts["softmax"] == 2
    assert torch._C._len_torch_function_stack() == depth


def test_transformers_activation_classes():
    """Only the classes whose forward is exactly an erf or tanh GELU (or SiLU) are swapped, each to the right
    approximation, and the swapped module computes what the original did."""
    act = _transformers().activations
    x = torch.randn(257, dtype=torch.float64) * 4
    expect = {
        "GELUActivation": "none", "NewGELUActivation": "tanh", "FastGELUActivation": "tanh",
        "AccurateGELUActivation": "tanh", "GELUTanh": "tanh",
    }
    for name, approximate in expect.items():
        for kwargs in ({}, {"use_gelu_python": True} if name == "GELUActivation" else None,
                       {"use_gelu_tanh_python": True} if name == "GELUTanh" else None):
            if kwargs is None:
                continue
            original = getattr(act, name)(**kwargs)
            model, replaced = fastact.apply(torch.nn.Sequential(copy.deepcopy(original)), functional=False)
            assert replaced == {name: 1}, (name, kwargs)
            assert type(model[0]) is fastact.nn.GELU and model[0].approximate == approximate
            torch.testing.assert_close(model[0](x), original(x), rtol=1e-12, atol=1e-12)
    if hasattr(act, "SiLUActivation"):
        model, replaced = fastact.apply(torch.nn.Sequential(act.SiLUActivation()), functional=False)
        assert replaced == {"SiLUActivation": 1} and type(model[0]) is fastact.nn.SiLU
        torch.testing.assert_close(model[0](x), act.SiLUActivation()(x), rtol=1e-12, atol=1e-12)
    for name in ("QuickGELUActivation", "MishActivation", "LinearActivation"):
        model, replaced = fastact.apply(torch.nn.Sequential(getattr(act, name)()), functional=False)
        assert not replaced and type(model[0]) is getattr(act, name)
    clipped = act.ClippedGELUActivation(-1.0, 1.0)
    assert not fastact.apply(torch.nn.Sequential(clipped), functional=False)[1]


# ----------------------------------------------------------------------------------------------
# The mode, function by function


ROUTED = [
    ("softmax", lambda x: F.softmax(x, -1), lambda x: x.softmax(-1)),
    ("softmax", lambda x: F.softmax(x, 1, 3, torch.float64), lambda x: torch.softmax(x.double(), 1)),
    ("softmax", lambda x: torch.softmax(x, 0), lambda x: x.softmax(0)),
    ("softmax", lambda x: torch.softmax(x, dim=2, dtype=torch.float32), lambda x: x.float().softmax(2)),
    ("softmax", lambda x: x.softmax(dim=-2), lambda x: torch.softmax(x, -2)),
    ("log_softmax", lambda x: F.log_softmax(x, dim=1), lambda x: torch.log_softmax(x, 1)),
    ("log_softmax", lambda x: torch.log_softmax(x, -1, torch.float64), lambda x: x.double().log_softmax(-1)),
    ("log_softmax", lambda x: x.log_softmax(0), lambda x: torch.log_softmax(x, 0)),
    ("gelu", lambda x: F.gelu(x), lambda x: torch._C._nn.gelu(x)),
    ("gelu", lambda x: F.gelu(x, approximate="tanh"), lambda x: torch._C._nn.gelu(x, approximate="tanh")),
    ("sigmoid", lambda x: torch.sigmoid(x), lambda x: x.sigmoid()),
    ("sigmoid", lambda x: x.sigmoid(), lambda x: torch.sigmoid(x)),
    ("sigmoid", lambda x: F.sigmoid(x), lambda x: torch.sigmoid(x)),
] + [  # every routed torch function of every pointwise row of the op table, at every value of the op's params
    (op.name, lambda x, fn=fn, params=params: fn(x, **params), lambda x, op=op, params=params: op.torch_fn(x, **params))
    for op in POINTWISE for fn, _ in op.routes for _, params in op.variants
]


@pytest.mark.parametrize("layout", ["offset", "permuted"])
@pytest.mark.parametrize("case", range(len(ROUTED)))
def test_patch_routes(device, dtype, case, layout):
    """Each routed call runs fastact's op and gives torch's values, dtype and layout (its strides: torch's softmax
    returns a contiguous tensor whatever the input's layout, so code that views the result keeps working)."""
    op, call, reference = ROUTED[case]
    if layout == "offset":
        x = (torch.randn(5, 7, 33, device=device) * 3).to(dtype)[:, :, 1:]  # a view with an offset
    else:
        x = (torch.randn(32, 5, 7, device=device) * 3).to(dtype).permute(1, 2, 0)  # dense, not contiguous
    with OpCounter() as count, fastact.patch() as mode:
        y = call(x)
    assert mode.counts == {op: 1} and not mode.fallbacks
    assert count.counts == {op: 1}
    y_torch = reference(x)
    assert y.dtype == y_torch.dtype and y.shape == y_torch.shape and y.stride() == y_torch.stride()
    assert_close(y, reference(x.double()), y_torch.dtype, torch_actual=y_torch, msg=f"case {case}")


class _ViewsTheSoftmax(torch.nn.Module):
    """Code written against torch's layout: torch's softmax of a transposed input is contiguous, so it views."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(6, 6)
        self.norm = torch.nn.Softmax(dim=0)

    def forward(self, x):
        h = self.proj(x).transpose(0, 1)
        return F.softmax(h, -1).view(-1) + torch.log_softmax(h, 0).view(-1) + self.norm(h).view(-1)


def test_patch_and_apply_keep_torch_layout():
    """A model that views its softmax's result runs under patch() and after apply() as under torch."""
    model, x = _ViewsTheSoftmax(), torch.randn(4, 6)
    want = model(x)
    with OpCounter() as count, fastact.patch():
        assert_close(model(x), want.double(), torch.float32, torch_actual=want)
    assert count.counts == {"softmax": 2, "log_softmax": 1}
    applied, replaced = fastact.apply(copy.deepcopy(model))
    assert replaced == {"Softmax": 1}
    with OpCounter() as count:
        assert_close(applied(x), want.double(), torch.float32, torch_actual=want)
    assert count.counts == {"softmax": 2, "log_softmax": 1}


def test_patch_implicit_dim_warns_at_the_caller():
    x = torch.randn(2, 3, 4)
    for fn in (F.softmax, F.log_softmax):
        with warnings.catch_warnings(record=True) as w_torch:
            warnings.simplefilter("always")
            y_torch = fn(x)
        with warnings.catch_warnings(record=True) as w, fastact.patch() as mode:
            warnings.simplefilter("always")
            y = fn(x)  # the warning must point at this line, as torch's does
        assert mode.counts == {fn.__name__: 1}
        assert [(m.category, m.filename) for m in w] == [(m.category, m.filename) for m in w_torch]
        assert w[0].filename == __file__ and w[0].lineno == w_torch[0].lineno + 3
        torch.testing.assert_close(y, y_torch)


def same_as_torch(call):
    """call() inside fastact.patch() gives what it gives outside: the same values or the same
    exception type. Returns the mode."""
    try:
        expected = call()
    except Exception as e:  # noqa: BLE001 (any error torch raises must be raised the same)
        expected = e
    with fastact.patch() as mode:
        if isinstance(expected, Exception):
            with pytest.raises(type(expected)):
                call()
        else:
            torch.testing.assert_close(call(), expected, rtol=0, atol=0)
    return mode


FALLBACKS = [
    ("sigmoid", lambda: torch.sigmoid(torch.linspace(-3, 3, 12, dtype=torch.complex64))),    # complex
    ("sigmoid", lambda: torch.arange(6).sigmoid()),                                           # integer
    ("softmax", lambda: torch.softmax(torch.arange(6).reshape(2, 3), 1, dtype=torch.float32)),
    ("softmax", lambda: torch.softmax(torch.arange(6).reshape(2, 3), 1)),                     # torch's error
    ("log_softmax", lambda: F.log_softmax(torch.ones(2, 3, dtype=torch.complex64), 1)),
    ("softmax", lambda: torch.softmax(torch.linspace(-2, 2, 12).reshape(3, 4).to_sparse(), 1)),
    ("softmax", lambda: torch.softmax(torch.ones(2, 3), 1, out=torch.empty(2, 3))),           # out=
    ("sigmoid", lambda: torch.sigmoid(torch.ones(2, 3), out=torch.empty(2, 3))),
    ("gelu", lambda: F.gelu(torch.ones(3), approximate="erf")),                               # torch's error
    ("softmax", lambda: F.softmax(torch.ones(3), 0, 3, torch.int32)),                         # torch's error
]


def _pointwise_fallbacks(op, fn, signature):
    """The calls of a routed torch function that fastact leaves to torch: complex and integer inputs, `out=`,
    `inplace=True` (where the function takes them)."""
    out = [(op.name, lambda: fn(torch.linspace(-3, 3, 12, dtype=torch.complex64))),
           (op.name, lambda: fn(torch.arange(6)))]
    if "out=" in signature:
        out.append((op.name, lambda: fn(torch.ones(2, 3), out=torch.empty(2, 3))))
    if "inplace=" in signature:
        out.append((op.name, lambda: fn(torch.linspace(-3, 3, 6).reshape(2, 3), inplace=True)))  # the same each call
    return out


FALLBACKS += [case for op in POINTWISE for fn, signature in op.routes for case in _pointwise_fallbacks(op, fn, signature)]


@pytest.mark.parametrize("case", range(len(FALLBACKS)))
def test_patch_falls_back_to_torch(case):
    """What fastact does not take runs torch's function: the same result, or torch's own error."""
    op, call = FALLBACKS[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # named tensors and sparse softmax warn
        mode = same_as_torch(call)
    assert not mode.counts and mode.fallbacks == {op: 1}


@pytest.mark.parametrize("op", [op for op in TABLE if op.torch_module is not None], ids=lambda op: op.name)
def test_apply_swaps_every_twin_module(op):
    """fastact.apply swaps each torch module that has a fastact twin in the op table, with its arguments; the
    swapped model computes what torch's does."""
    twin = op.torch_module(-1) if op.kind == "softmax" else op.torch_module()
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), twin)
    ref = copy.deepcopy(model)
    model, replaced = fastact.apply(model, functional=False)
    assert replaced == {op.torch_module.__name__: 1} and type(model[1]) is getattr(fastact.nn, op.module)
    assert repr(model[1]) == repr(twin).replace(op.torch_module.__name__, op.module, 1)
    x = torch.randn(4, 8)
    with OpCounter() as count:
        y = model(x)
    assert count.counts == {op.name: 1}
    assert_close(y, copy.deepcopy(ref).double()(x.double()), torch.float32, torch_actual=ref(x))


def test_patch_bad_arguments_raise_torch_errors():
    x = torch.randn(2, 3)
    for call in (lambda: torch.softmax(x), lambda: F.gelu(x, "tanh", 1), lambda: x.sigmoid(1),
                 lambda: F.softmax(x, dim=1, bogus=2), lambda: torch.softmax(x, 5)):
        same_as_torch(call)


def test_patch_nested_and_inside_other_modes():
    x = torch.randn(3, 8)
    with OpCounter() as count, fastact.patch() as outer, torch.device("cpu"), fastact.patch() as inner:
        y = F.softmax(x, -1)
        z = F.gelu(x)
    # The innermost mode routes; the outer one sees fastact's registered op (not a routed function)
    # and passes it through: each call runs fastact once.
    assert inner.counts == {"softmax": 1, "gelu": 1} and not outer.counts
    assert count.counts == {"softmax": 1, "gelu": 1}
    torch.testing.assert_close(y, x.softmax(-1))
    torch.testing.assert_close(z, F.gelu(x))
    assert isinstance(inner, FastActMode)


def test_bench_models_runs():
    """The model benchmark's machinery on a tiny size: both models step, fastact's ops run in its
    steps (the softmax and GELU of every layer, forward and backward), the profile sees them."""
    _transformers()
    from fastact import bench_models

    size = bench_models.Size(batch=1, seq=16, layers=2, hidden=32, heads=2, vocab=100)
    rows, prof = [], []
    for model, precision in (("gpt2", "amp-bf16"), ("bert", "f32")):
        r, p = bench_models.run_models("cpu", size=size, models=(model,), precisions=(precision,), steps=2, warmup=1,
                                       profile=True)
        rows += r
        prof += p
    assert [(r["model"], r["dtype"]) for r in rows] == [("gpt2", "amp-bf16"), ("bert", "f32")]
    for r in rows:
        assert r["torch_ms"] > 0 and r["fastact_ms"] > 0 and r["speedup"] == r["torch_ms"] / r["fastact_ms"]
        gelus = 2 if r["model"] == "gpt2" else 3  # BERT's MLM head has a GELU too
        assert r["fastact_ops_per_step"] == {"softmax": 2, "softmax_backward": 2, "gelu": gelus,
                                             "gelu_backward": gelus}, r
    fast_lines = [line for line in prof if line.strip().startswith("fastact ")]
    assert len(fast_lines) == 2 and all("fastact::softmax " in line and "fastact::gelu " in line for line in fast_lines)
    torch_lines = [line for line in prof if line.strip().startswith("torch ")]
    assert len(torch_lines) == 2 and all("aten::_softmax " in line and "fastact" not in line for line in torch_lines)
    table = bench_models.format_models(rows)
    assert len(table) == 3 + len(rows) and all(f"{r['speedup']:.2f}x" in line for r, line in zip(rows, table[3:]))


def test_apply_under_torch_compile():
    """torch.compile traces through the mode that apply enters: the graph holds fastact's ops for the
    swapped modules and the functional calls alike, with no graph break, and computes what torch does."""
    torch._dynamo.reset()
    model = PlainNet()
    ref = copy.deepcopy(model)
    model, _ = fastact.apply(model)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    x = torch.randn(4, 48)
    y = torch.compile(model, backend=backend, fullgraph=True)(x)
    targets = [str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    acts = sorted(t for t in targets if any(a in t for a in ("softmax", "gelu", "sigmoid")))
    assert len(graphs) == 1 and acts == ["fastact.gelu.default"] * 3 + ["fastact.log_softmax.default"] + [
        "fastact.sigmoid.default"] * 2 + ["fastact.softmax.default"] * 2, acts
    torch.testing.assert_close(y, ref(x))
    torch._dynamo.reset()
