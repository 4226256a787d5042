"""Bandwidth benchmarks: every case of fastact.bench's grid, every implementation (see conftest.py)."""

import time

import fastact.bench as fb  # conftest.py makes it importable from a source tree
import pytest
import torch


def estimate_seconds(call, device):
    t0 = time.perf_counter()
    call()
    fb.sync(device)
    return max(time.perf_counter() - t0, 1e-7)


def test_bandwidth(benchmark, case_impl, fastact_device, timing, bandwidth_limit, compiler, case_inputs, summary):
    case, name = case_impl
    benchmark.group = case.group
    inputs = case_inputs.get(case)
    try:
        call, first = fb.prepare(case, name, inputs, fastact_device, compiler)  # compiles, warms up
    except fb.Skip as e:
        pytest.skip(str(e))
    cuda = fastact_device.type == "cuda"
    est = estimate_seconds(call, fastact_device)
    rounds = int(min(timing.max_reps, max(timing.min_reps, timing.target_s / est)))

    if cuda:

        def timed():
            call()
            torch.cuda.synchronize(fastact_device)
    else:
        timed = call

    benchmark.pedantic(timed, rounds=rounds, warmup_rounds=timing.warmup, iterations=1)

    stats = benchmark.stats.stats if benchmark.stats is not None else None  # None: --benchmark-disable
    limit = bandwidth_limit["limit_gbps"]
    info = {"op": case.op, "direction": case.direction, "dtype": case.dtype_name, "shape": list(case.shape),
            "dim": case.dim, "implementation": name, "bytes": case.nbytes, "limit_gbps": limit,
            "first_call_s": first}
    if cuda or stats is None:
        seconds = fb.time_call(call, fastact_device, timing)
        info["timing"] = "cuda events, median" if cuda else "perf_counter, median"
        if stats is not None:
            info["gbps_wall"] = case.nbytes / stats.median / 1e9
    else:
        seconds = stats.median
        info["timing"] = "pytest-benchmark median (perf_counter)"
    info.update(fb.figures(case, seconds, limit))
    benchmark.extra_info.update(info)
    summary.append((case.group, name, info))
