"""What fastact.apply costs a training step's host time, on any device: transformers GPT-2 and BERT too small to
compute (12 layers, hidden 64, 8 tokens), so a step is all host time (one CPU thread). Five ways, alternated,
median ms a step: torch; the module swaps alone (apply(functional=False)); the swaps with a do-nothing
TorchFunctionMode around the modules whose forwards apply routes (torch's own price of a mode); the swaps with
fastact's mode there (how apply routed them before it copied their functions); apply.

    python bench/diag/apply_host_cost.py [--steps 100] [--device cpu|cuda]
"""

import argparse
import copy
import statistics

import torch
from mode_cost_torch_only import EmptyMode, around  # this folder's: the script's own is first on sys.path

import fastact
from fastact.bench_models import Size, build, make_inputs, step_fn, time_steps
from fastact.patch import FastActMode, _calling_modules


def with_mode(model, mode):
    """The mode around the forwards apply would choose."""
    around(_calling_modules(model), mode)
    return model


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    a = p.parse_args()
    torch.set_num_threads(1)
    dev = torch.device(a.device)
    size = Size(batch=1, seq=8, layers=12, hidden=64, heads=4, vocab=128)
    for name in ("bert", "gpt2"):
        base = build(name, size, dev)
        swaps = lambda: fastact.apply(copy.deepcopy(base), functional=False)[0]  # noqa: E731
        variants = {"torch": base, "swaps": swaps(), "swaps+empty mode": with_mode(swaps(), EmptyMode()),
                    "swaps+fastact mode": with_mode(swaps(), FastActMode()),
                    "apply": fastact.apply(copy.deepcopy(base))[0]}
        inputs = make_inputs(name, size, dev)
        runs = {k: step_fn(m, inputs, "f32", dev) for k, m in variants.items()}
        times, host = time_steps(runs, dev, a.steps, 5)
        per = host if host is not None else times
        print(f"{name} ({size.text()}), host ms a step: "
              + ", ".join(f"{k} {statistics.median(v) * 1e3:.2f}" for k, v in per.items()))


if __name__ == "__main__":
    main()
