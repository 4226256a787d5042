"""The price of fastact.apply's mechanisms without fastact (no extension needed: runs on a machine where fastact is
not built): transformers BERT-base and GPT-2 small (b8x512, eager attention) training steps, four ways, alternated,
median of --steps: torch; a do-nothing TorchFunctionMode around each attention module (what apply's mode costs
before it routes anything); the GELU modules replaced by a plain nn.Module that calls F.gelu (what a swapped
module's Python forward costs); both. Host ms (from the step's call to its return) and CUDA ms a step.

    python bench/diag/mode_cost_torch_only.py [--dtype bf16|f32] [--steps 20]
"""

import argparse
import copy
import statistics
import time

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode


class EmptyMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class PlainGELU(torch.nn.Module):
    def __init__(self, approximate):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, approximate=self.approximate)


def build(name):
    import transformers as tr
    if name == "bert":
        cfg = tr.BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attn_implementation="eager")
        return tr.BertForMaskedLM(cfg), "BertSelfAttention", ("GELUActivation",), "none"
    cfg = tr.GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager")
    return tr.GPT2LMHeadModel(cfg), "GPT2Attention", ("NewGELUActivation",), "tanh"


def around(modules, mode):
    """`mode` entered around each module's forward (hooks that return None: the arguments and outputs stay)."""
    for m in modules:
        m.register_forward_pre_hook(lambda mod, args: (mode.__enter__(), None)[1])
        m.register_forward_hook(lambda mod, args, out: (mode.__exit__(None, None, None), None)[1], always_call=True)


def with_mode(model, cls):
    around([m for m in model.modules() if type(m).__name__ == cls], EmptyMode())
    return model


def with_plain_gelu(model, classes, approximate):
    for parent in list(model.modules()):
        for n, child in list(parent.named_children()):
            if type(child).__name__ in classes:
                setattr(parent, n, PlainGELU(approximate))
    return model


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="bf16", choices=("bf16", "f32"))
    p.add_argument("--steps", type=int, default=20)
    a = p.parse_args()
    dev = torch.device("cuda")
    for name in ("bert", "gpt2"):
        torch.manual_seed(0)
        base, attn, gelus, approx = build(name)
        base = base.to(dev).train()
        if a.dtype == "bf16":
            base = base.to(torch.bfloat16)
        variants = {"torch": base, "mode": with_mode(copy.deepcopy(base), attn),
                    "plain gelu": with_plain_gelu(copy.deepcopy(base), gelus, approx),
                    "both": with_mode(with_plain_gelu(copy.deepcopy(base), gelus, approx), attn)}
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, base.config.vocab_size, (8, 512), generator=g).to(dev)
        mask = torch.ones(8, 512, dtype=torch.long, device=dev)
        mask[-1, 384:] = 0
        inputs = {"input_ids": ids, "attention_mask": mask, "labels": ids}

        def step_of(m):
            def step():
                m.zero_grad(set_to_none=True)
                m(**inputs).loss.backward()
            return step

        runs = {k: step_of(m) for k, m in variants.items()}
        for _ in range(3):
            for f in runs.values():
                f()
        torch.cuda.synchronize()
        host, dev_ms = {k: [] for k in runs}, {k: [] for k in runs}
        for _ in range(a.steps):
            for k, f in runs.items():
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                t0 = time.perf_counter()
                f()
                host[k].append((time.perf_counter() - t0) * 1e3)
                e.record()
                e.synchronize()
                dev_ms[k].append(s.elapsed_time(e))
        print(f"{name} {a.dtype}: " + ", ".join(
            f"{k} {statistics.median(dev_ms[k]):.2f} ms (host {statistics.median(host[k]):.2f})" for k in runs),
            flush=True)
        del variants, runs, base
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
