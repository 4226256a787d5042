"""Model-level benchmark: a training step (forward + backward) of Hugging Face transformers GPT-2 and
BERT with and without fastact (``fastact.apply(model)``: the GELU modules swapped and the eager
attention's ``F.softmax`` routed to fastact through copies of its functions), in float32, bfloat16 weights and
bfloat16 autocast over float32 weights.

    python -m fastact.bench_models                      # the device's default sizes
    python -m fastact.bench_models --device cuda --out DIR --profile

Models are built from configs (random weights, nothing downloaded) with eager attention. On CUDA the
real sizes (GPT-2 small, 124M; BERT base, 110M); on the CPU smaller ones of the same shape classes
(``--size full`` for the real ones). The torch and the fastact model share one state_dict; their
steps alternate (torch, fastact, torch, ...) so a load change on a shared machine hits both alike;
each figure is the median of ``--steps`` steps after ``--warmup`` (CUDA events on a GPU).

``--profile`` runs torch.profiler over a few steps of each configuration and prints, per step, the
self time of the ops whose time differs most between torch and fastact (the activation ops and
anything else that changed: casts, copies), so a slower configuration shows where its time went.
Needs transformers (``pip install transformers``).
"""

import argparse
import bisect
import copy
import dataclasses
import json
import os
import re
import statistics
import sys
import time

import torch

import fastact


@dataclasses.dataclass(frozen=True)
class Size:
    batch: int
    seq: int
    layers: int
    hidden: int
    heads: int
    vocab: int

    def text(self):
        return f"{self.layers}L h{self.hidden} {self.heads}H v{self.vocab} b{self.batch}x{self.seq}"


# CUDA: GPT-2 small and BERT base as published. The CPU sizes keep the attention's [B, H, S, S]
# softmax and the MLP's [B, S, 4H] GELU (each 2 x 4 x 256 x 256 = 2 x 256 x 1024 elements) at sizes a
# 2-core machine steps through in 0.1 to 1.3 s (one thread, load average 5), so twenty steps of each
# configuration fit in minutes.
SIZES = {
    ("gpt2", "full"): Size(batch=8, seq=512, layers=12, hidden=768, heads=12, vocab=50257),
    ("bert", "full"): Size(batch=8, seq=512, layers=12, hidden=768, heads=12, vocab=30522),
    ("gpt2", "small"): Size(batch=2, seq=256, layers=2, hidden=256, heads=4, vocab=4096),
    ("bert", "small"): Size(batch=2, seq=256, layers=2, hidden=256, heads=4, vocab=4096),
}
MODELS = ("gpt2", "bert")
# f32: float32 weights and activations; bf16: the model cast to bfloat16; amp-bf16: float32 weights
# under torch.autocast(dtype=bfloat16), where torch (and fastact, csrc/autocast.cpp) run the CUDA
# softmax in float32 (a bfloat16 input, a float32 output).
PRECISIONS = ("f32", "bf16", "amp-bf16")
# The ops that compute an activation or its gradient, in torch and in fastact.
ACTIVATION_OPS = re.compile(r"softmax|gelu|sigmoid")


def build(model, size, device):
    """The transformers model with eager attention and no dropout (the step's work is the same every
    time), float32, in training mode."""
    import transformers as tr

    if model == "gpt2":
        cfg = tr.GPT2Config(n_layer=size.layers, n_embd=size.hidden, n_head=size.heads, vocab_size=size.vocab,
                            n_positions=max(1024, size.seq), resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                            bos_token_id=0, eos_token_id=0, attn_implementation="eager")
        m = tr.GPT2LMHeadModel(cfg)
    elif model == "bert":
        cfg = tr.BertConfig(num_hidden_layers=size.layers, hidden_size=size.hidden, num_attention_heads=size.heads,
                            intermediate_size=4 * size.hidden, vocab_size=size.vocab,
                            max_position_embeddings=max(512, size.seq), hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0, attn_implementation="eager")
        m = tr.BertForMaskedLM(cfg)
    else:
        raise ValueError(f"unknown model {model!r}")
    return m.to(device).train()


def make_inputs(model, size, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, size.vocab, (size.batch, size.seq), generator=g)
    # A padded tail on the last sequence, as in a real batch: the mask is added before the softmax.
    mask = torch.ones(size.batch, size.seq, dtype=torch.long)
    mask[-1, size.seq * 3 // 4:] = 0
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "labels": ids.to(device)}


def step_fn(model, inputs, precision, device):
    amp = precision == "amp-bf16"

    def step():
        model.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = model(**inputs).loss
        loss.backward()

    return step


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(steps, device, n, warmup):
    """Alternates the steps in `steps` (name -> callable) n times after `warmup` rounds; returns the
    seconds of each step by name, and on CUDA the host's seconds per step too (from the call to its
    return, the kernels queued but not waited for: a step whose host time reaches its CUDA time is
    bound by the host's launches, and per-call Python costs show in it one for one)."""
    for _ in range(warmup):
        for f in steps.values():
            f()
    sync(device)
    times = {name: [] for name in steps}
    host = {name: [] for name in steps}
    for _ in range(n):
        for name, f in steps.items():
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                t0 = time.perf_counter()
                f()
                host[name].append(time.perf_counter() - t0)
                end.record()
                end.synchronize()
                times[name].append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                f()
                times[name].append(time.perf_counter() - t0)
    return times, (host if device.type == "cuda" else None)


def profile_ops(steps, device, rounds=2):
    """Self time per op name per step, ms, and calls per step, for each step in `steps` (name ->
    callable), from one profiler session over `rounds` alternating rounds: a load change on a shared
    machine falls on every step alike. CPU ops are attributed to the step whose record_function
    scope holds them; on CUDA the time is the device time of the kernels each op launched."""
    from torch.profiler import ProfilerActivity, profile, record_function

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    for f in steps.values():
        f()
    sync(device)
    tag = "fastact-bench-step:"
    with profile(activities=acts) as prof:
        for _ in range(rounds):
            for name, f in steps.items():
                with record_function(tag + name):
                    f()
        sync(device)
    # Each op goes to the step whose scope's time range holds its start: backward ops run on
    # autograd's worker threads (one per CUDA device), outside the scope's parent chain, but within
    # its time, since a step returns only when its backward is done.
    events = prof.events()
    scopes = sorted((e.time_range.start, e.time_range.end, e.name[len(tag):]) for e in events
                    if e.name.startswith(tag))
    starts = [s for s, _, _ in scopes]
    out = {name: {} for name in steps}
    for e in events:
        if e.device_type != torch.autograd.DeviceType.CPU or e.name.startswith(tag):
            continue
        i = bisect.bisect_right(starts, e.time_range.start) - 1
        if i < 0 or e.time_range.start > scopes[i][1]:
            continue
        t = e.self_device_time_total if device.type == "cuda" else e.self_cpu_time_total
        ms, n = out[scopes[i][2]].get(e.name, (0.0, 0))
        out[scopes[i][2]][e.name] = (ms + t / 1e3 / rounds, n + 1)
    return {name: {k: (ms, n // rounds) for k, (ms, n) in ops.items()} for name, ops in out.items()}


def format_profile(name, torch_ops, fast_ops, top=12):
    """The ops whose self time per step differs most between the two runs, then the totals."""
    keys = set(torch_ops) | set(fast_ops)
    rows = sorted(keys, key=lambda k: -abs(fast_ops.get(k, (0, 0))[0] - torch_ops.get(k, (0, 0))[0]))[:top]
    lines = [f"  {name}: self time per step, ms (calls); the {top} ops that changed most",
             f"    {'op':<52} {'torch':>14} {'fastact':>14} {'diff':>8}"]
    for k in rows:
        t, f = torch_ops.get(k, (0.0, 0)), fast_ops.get(k, (0.0, 0))
        lines.append(f"    {k[:52]:<52} {t[0]:8.3f} ({t[1]:3d}) {f[0]:8.3f} ({f[1]:3d}) {f[0] - t[0]:+8.3f}")
    tt, ft = sum(v[0] for v in torch_ops.values()), sum(v[0] for v in fast_ops.values())
    lines.append(f"    {'all ops':<52} {tt:14.3f} {ft:14.3f} {ft - tt:+8.3f}")
    lines.append("    the activation ops (each run's own):")
    for label, ops in (("torch", torch_ops), ("fastact", fast_ops)):
        act = sorted((k for k in ops if ACTIVATION_OPS.search(k)), key=lambda k: -ops[k][0])
        lines.append(f"      {label:<8} {sum(ops[k][0] for k in act):8.3f} ms: "
                     + ", ".join(f"{k} {ops[k][0]:.3f} ({ops[k][1]})" for k in act))
    return lines


def fastact_ops_per_step(step):
    from fastact.patch import OpCounter

    with OpCounter() as c:
        step()
    return dict(c.counts)


def bench(model_name, precision, size, device, *, steps=20, warmup=3, profile=False):
    """One configuration: torch and fastact steps from the same weights. Returns a row dict (and the
    profile's lines when asked)."""
    torch.manual_seed(0)
    base = build(model_name, size, device)
    if precision == "bf16":
        base = base.to(torch.bfloat16)
    fast, replaced = fastact.apply(copy.deepcopy(base))
    inputs = make_inputs(model_name, size, device)
    runs = {"torch": step_fn(base, inputs, precision, device), "fastact": step_fn(fast, inputs, precision, device)}
    counts = fastact_ops_per_step(runs["fastact"])
    times, host = time_steps(runs, device, steps, warmup)
    t_ms, f_ms = (statistics.median(times[k]) * 1e3 for k in ("torch", "fastact"))
    row = {"model": model_name, "dtype": precision, "device": device.type, "size": size.text(),
           "torch_ms": t_ms, "fastact_ms": f_ms, "speedup": t_ms / f_ms,
           "torch_spread_ms": [min(times["torch"]) * 1e3, max(times["torch"]) * 1e3],
           "fastact_spread_ms": [min(times["fastact"]) * 1e3, max(times["fastact"]) * 1e3],
           "steps": steps, "replaced": dict(replaced), "fastact_ops_per_step": counts}
    if host is not None:
        row.update(torch_host_ms=statistics.median(host["torch"]) * 1e3,
                   fastact_host_ms=statistics.median(host["fastact"]) * 1e3)
    lines = []
    if profile:
        ops = profile_ops(runs, device)
        lines = format_profile(f"{model_name} {precision} on {device.type}", ops["torch"], ops["fastact"])
    del base, fast, runs
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row, lines


def run_models(device, *, size="auto", models=MODELS, precisions=PRECISIONS, steps=20, warmup=3, profile=False,
               log=sys.stderr):
    """Every (model, precision) configuration on `device`: returns (rows, profile lines). `size` is
    "auto", "full", "small" or a Size for every model."""
    device = torch.device(device)
    if size == "auto":
        size = "full" if device.type == "cuda" else "small"
    rows, prof = [], []
    for m in models:
        for p in precisions:
            t0 = time.perf_counter()
            s = size if isinstance(size, Size) else SIZES[(m, size)]
            row, lines = bench(m, p, s, device, steps=steps, warmup=warmup, profile=profile)
            rows.append(row)
            prof += lines
            host = (f" (host {row['torch_host_ms']:.2f} / {row['fastact_host_ms']:.2f} ms)"
                    if "torch_host_ms" in row else "")
            print(f"[models] {m} {p} {device.type} ({row['size']}): torch {row['torch_ms']:.2f} ms, "
                  f"fastact {row['fastact_ms']:.2f} ms, {row['speedup']:.2f}x{host} "
                  f"({time.perf_counter() - t0:.0f} s)", file=log, flush=True)
    return rows, prof


def report(device):
    """For ``python -m fastact.bench --models``: (rows, table lines) of every configuration at the
    device's default sizes; (None, a line saying why) where transformers is not installed, so the
    rest of the report still comes out."""
    try:
        import transformers  # noqa: F401
    except ImportError as e:
        return None, ["", f"models: skipped, transformers is not installed ({e}); pip install transformers"]
    rows = run_models(device)[0]
    return rows, format_models(rows)


def format_models(rows):
    """The models table; on CUDA with the host's time per step (torch / fastact) at the end."""
    lines = ["", "models: a training step (forward + backward), median ms; fastact = fastact.apply(model)",
             f"  {'model':<6} {'dtype':<9} {'device':<6} {'size':<30} {'torch ms':>10} {'fastact ms':>11} {'speed-up':>9}"
             + ("  host ms (torch / fastact)" if any("torch_host_ms" in r for r in rows) else "")]
    for r in rows:
        lines.append(f"  {r['model']:<6} {r['dtype']:<9} {r['device']:<6} {r['size']:<30} {r['torch_ms']:10.2f} "
                     f"{r['fastact_ms']:11.2f} {r['speedup']:8.2f}x"
                     + (f"  {r['torch_host_ms']:.2f} / {r['fastact_host_ms']:.2f}" if "torch_host_ms" in r else ""))
    return lines


def mode_overhead(device, calls=100, blocks=200):
    """Per-call cost of FastActMode on a torch op it does not route (an add) and on one it routes (a
    small softmax): microseconds per call with and without the mode, the best of `blocks` blocks of
    `calls` calls (short blocks: on a shared machine most escape preemption)."""
    device = torch.device(device)
    x = torch.randn(8, 64, device=device)

    def per_call(f):
        best = float("inf")
        for _ in range(blocks):
            sync(device)
            t0 = time.perf_counter()
            for _ in range(calls):
                f()
            sync(device)
            best = min(best, (time.perf_counter() - t0) / calls * 1e6)
        return best

    add = lambda: x + x  # noqa: E731
    sm = lambda: torch.nn.functional.softmax(x, -1)  # noqa: E731
    gelu = lambda: torch.nn.functional.gelu(x)  # noqa: E731
    res = {"add_us": per_call(add), "F.softmax_us": per_call(sm), "fastact.softmax_us": per_call(
        lambda: fastact.softmax(x, -1)), "F.gelu_us": per_call(gelu), "fastact.gelu_us": per_call(lambda: fastact.gelu(x))}
    with fastact.patch():
        res["add_under_mode_us"] = per_call(add)
        res["F.softmax_under_mode_us"] = per_call(sm)
        res["F.gelu_under_mode_us"] = per_call(gelu)
    return res


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m fastact.bench_models", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda if available, else cpu")
    p.add_argument("--size", choices=("auto", "full", "small"), default="auto",
                   help="full: GPT-2 small / BERT base; small: 4 layers, hidden 256; auto (default): full on "
                        "CUDA, small on the CPU")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {','.join(MODELS)}")
    p.add_argument("--dtypes", default=",".join(PRECISIONS), help=f"comma-separated subset of {','.join(PRECISIONS)}")
    p.add_argument("--steps", type=int, default=20, help="timed steps per implementation (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    p.add_argument("--profile", action="store_true", help="also profile each configuration and print the ops "
                                                          "whose time differs most between torch and fastact")
    p.add_argument("--mode-overhead", action="store_true", help="also time fastact.patch()'s per-call cost")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="CPU: torch.set_num_threads(N) first (fastact's oneTBB arena follows it)")
    p.add_argument("--out", default=None, help="folder for models.json (default: none written)")
    args = p.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dev == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: CUDA is not available")
    models = tuple(m for m in args.models.split(",") if m)
    precisions = tuple(d for d in args.dtypes.split(",") if d)
    bad = [m for m in models if m not in MODELS] + [d for d in precisions if d not in PRECISIONS]
    if bad:
        p.error(f"unknown {bad}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    name = torch.cuda.get_device_name() if dev == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"fastact {fastact.__version__} bench_models: {name}, torch {torch.__version__}"
          + (f", load average {load:.2f}" if load is not None else ""), flush=True)
    t0 = time.perf_counter()
    rows, prof = run_models(dev, size=args.size, models=models, precisions=precisions, steps=args.steps,
                            warmup=args.warmup, profile=args.profile)
    lines = format_models(rows)
    if prof:
        lines += ["", "profile (self time per step; CUDA: device time)"] + prof
    overhead = mode_overhead(dev) if args.mode_overhead else None
    if overhead:
        lines += ["", "fastact.patch() per call (us): " + ", ".join(f"{k[:-3]} {v:.2f}" for k, v in overhead.items())]
    print("\n".join(lines), flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "models.json")
        with open(path, "w") as f:
            json.dump({"device": name, "torch": torch.__version__, "load_average": load, "models": rows,
                       "profile": prof, "mode_overhead": overhead}, f, indent=1)
        print(f"wrote {path}")
    print(f"total {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
