"""Where BERT's extra host time under fastact.apply goes on CUDA (issue 62: BERT bf16 0.90x torch,
+3.4 ms of host time per step that GPT-2 does not show).

Times one BERT-base training step (8x512, eager attention) four ways, alternated: torch; only the
GELU modules swapped (``apply(functional=False)``); the swaps with fastact's mode around the attentions
(how ``apply`` routed the attention softmax before it copied the attention's functions); ``apply``. Prints each one's median CUDA and host ms per step, the allocator's cudaMalloc / cudaFree during them,
then the host (CPU self) time per op name (and per CUDA runtime call) that differs most between torch and ``apply``, and any synchronisation the fastact step
makes (``torch.cuda.set_sync_debug_mode``).

    python bench/diag/bert_host.py [--dtype f32|bf16] [--steps 20]
"""

import argparse
import copy
import statistics
import warnings

import torch

from mode_cost_torch_only import around  # this folder's: the script's own is first on sys.path

import fastact
from fastact.bench_models import SIZES, build, make_inputs, step_fn, time_steps
from fastact.patch import FastActMode, _calling_modules


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="bf16", choices=("f32", "bf16"))
    p.add_argument("--steps", type=int, default=20)
    a = p.parse_args()
    dev = torch.device("cuda")
    size = SIZES[("bert", "full")]
    torch.manual_seed(0)
    base = build("bert", size, dev)
    if a.dtype == "bf16":
        base = base.to(torch.bfloat16)
    swaps = fastact.apply(copy.deepcopy(base), functional=False)[0]
    both = fastact.apply(copy.deepcopy(base))[0]
    mode_only = fastact.apply(copy.deepcopy(base), functional=False)[0]
    around(_calling_modules(mode_only), FastActMode())
    inputs = make_inputs("bert", size, dev)
    runs = {k: step_fn(m, inputs, "bf16" if a.dtype == "bf16" else "f32", dev)
            for k, m in (("torch", base), ("swaps", swaps), ("swaps+mode", mode_only), ("apply", both))}
    before = torch.cuda.memory_stats()
    times, host = time_steps(runs, dev, a.steps, 3)
    after = torch.cuda.memory_stats()
    # cudaMalloc / cudaFree during the timed steps (a cudaFree synchronises): allocator churn between the two models
    print("allocator during the timed steps: " + ", ".join(
        f"{k} +{after.get(k, 0) - before.get(k, 0)}" for k in ("segment.all.allocated", "segment.all.freed",
                                                              "num_alloc_retries", "num_device_alloc", "num_device_free")))
    print(f"BERT {a.dtype} {size.text()}: median per step")
    for k in runs:
        print(f"  {k:10s} cuda {statistics.median(times[k]) * 1e3:7.2f} ms   host {statistics.median(host[k]) * 1e3:7.2f} ms")

    from torch.profiler import ProfilerActivity, profile
    self_ms = {}
    for k in runs:
        runs[k]()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                runs[k]()
            torch.cuda.synchronize()
        self_ms[k] = {e.key: (e.self_cpu_time_total / 3e3, e.count // 3) for e in prof.key_averages()}
    for k in ("swaps", "swaps+mode", "apply"):
        keys = sorted(set(self_ms["torch"]) | set(self_ms[k]),
                      key=lambda n: -abs(self_ms[k].get(n, (0, 0))[0] - self_ms["torch"].get(n, (0, 0))[0]))
        print(f"host self time per step, ms (calls), torch against {k}: the 20 ops that changed most")
        for n in keys[:20]:
            t, f = self_ms["torch"].get(n, (0.0, 0)), self_ms[k].get(n, (0.0, 0))
            print(f"  {n[:60]:60s} {t[0]:8.3f} ({t[1]:4d}) {f[0]:8.3f} ({f[1]:4d}) {f[0] - t[0]:+8.3f}")
        tt, ft = (sum(v[0] for v in self_ms[x].values()) for x in ("torch", k))
        print(f"  {'all':60s} {tt:8.3f}        {ft:8.3f}        {ft - tt:+8.3f}")

    # Host microseconds per call on small CUDA tensors (the GPU idle): what one op costs the host.
    import time
    import torch.nn.functional as F
    x = torch.randn(8, 512, device=dev, dtype=torch.bfloat16 if a.dtype == "bf16" else torch.float32,
                    requires_grad=True)
    g = torch.ones_like(x)
    mode = fastact.patch()

    def in_mode(f):
        def run():
            with mode:
                f()
        return run

    calls = {"F.gelu fwd+bwd": lambda: F.gelu(x).backward(g),
             "fastact.gelu fwd+bwd": lambda: fastact.gelu(x).backward(g),
             "F.softmax fwd+bwd": lambda: F.softmax(x, -1).backward(g),
             "fastact.softmax fwd+bwd": lambda: fastact.softmax(x, -1).backward(g),
             "F.softmax fwd+bwd in mode": in_mode(lambda: F.softmax(x, -1).backward(g)),
             "matmul fwd": lambda: torch.matmul(x, x.T),
             "matmul fwd in mode": in_mode(lambda: torch.matmul(x, x.T)),
             "F.gelu fwd": lambda: F.gelu(x),
             "fastact.gelu fwd": lambda: fastact.gelu(x)}
    print("host us per call (best of 5 x 500, small tensors)")
    for k, f in calls.items():
        best = 1e9
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(500):
                f()
            best = min(best, (time.perf_counter() - t0) / 500)
            torch.cuda.synchronize()
        print(f"  {k:28s} {best * 1e6:8.2f}")

    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        runs["apply"]()
    torch.cuda.set_sync_debug_mode(0)
    print(f"synchronisations in one fastact step: {len(w)}")
    for x in w[:5]:
        print("  ", str(x.message)[:200])


if __name__ == "__main__":
    main()
