"""Per-call overhead: every op, forward, on a small float32 tensor (fastact.bench.OVERHEAD_SHAPE),
fastact against torch. Each round is the wall time of fastact.bench.OVERHEAD_CALLS back-to-back
calls (no synchronisation between them; on CUDA one synchronize after the round, outside the
timing), reported per call: the host's cost of a call (argument handling, dispatch, allocation,
launch), which is what small tensors pay."""

import fastact.bench as fb  # conftest.py makes it importable from a source tree


def test_overhead(benchmark, overhead_impl, fastact_device, summary):
    case, name = overhead_impl
    benchmark.group = f"overhead {case.op} fwd {case.dtype_name} {case.shape_name}"
    inputs = fb.make_inputs(case, fastact_device)
    call, _ = fb.prepare(case, name, inputs, fastact_device)
    benchmark.pedantic(call, rounds=20, warmup_rounds=1, iterations=fb.OVERHEAD_CALLS,
                       teardown=lambda: fb.sync(fastact_device))
    if benchmark.stats is not None:
        us = benchmark.stats.stats.median * 1e6
        benchmark.extra_info.update({"op": case.op, "implementation": name, "us_per_call": us,
                                     "calls_per_round": fb.OVERHEAD_CALLS})
        summary.append((benchmark.group, name, {"us_per_call": us}))
