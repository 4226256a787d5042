"""pytest-benchmark comparisons of fastact against torch and torch.compile.

    pytest bench/ --benchmark-only                       # the device's default grid
    pytest bench/ --benchmark-only --fastact-grid quick --fastact-no-compile -k softmax
    pytest bench/ --benchmark-only --fastact-shapes irregular   # odd row lengths, a sliced view

One benchmark group per (op, direction, dtype, shape); its rows are ``fastact`` (fastact's own
dispatch), ``fastact[<variant>]`` for every forced softmax variant that takes the input (CUDA only;
the others skip), ``torch`` (eager) and ``torch.compile`` (compiled once per case, outside the
timing). Plus one group per op for the per-call overhead on a small tensor (test_bench_overhead.py).

The cases, byte counts, inputs, implementations, timers and the bandwidth limit all come from
``fastact.bench`` (the report, ``python -m fastact.bench``), so both measure the same things the same
way. Each result's ``extra_info`` (``--benchmark-json``) holds the bytes, GB/s and the fraction of
the limit, which is measured once per session; a summary of them is printed at the end.

Timing: pytest-benchmark times each round with ``time.perf_counter``; on CUDA the timed call is the
op followed by ``torch.cuda.synchronize()``, warm-up rounds excluded. The GB/s in ``extra_info`` come
from CUDA events around back-to-back calls on CUDA (the report's method: no sync or launch latency
in the figure; ``gbps_wall`` has the synchronised wall-time figure) and from pytest-benchmark's
median on CPU.
"""

import pathlib
import sys

import pytest
import torch

try:
    import fastact.bench as fb
except ModuleNotFoundError:
    # Built in place but not installed: take the package from the repository root.
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    import fastact.bench as fb

_SUMMARY = pytest.StashKey[list]()


def pytest_addoption(parser):
    g = parser.getgroup("fastact", "fastact benchmarks (bench/)")
    g.addoption("--fastact-device", choices=("cuda", "cpu"), default=None,
                help="device to benchmark (default: cuda if available, else cpu)")
    g.addoption("--fastact-grid", choices=("quick", "full"), default=None,
                help="case grid of fastact.bench (default: full on CUDA, quick on CPU)")
    g.addoption("--fastact-shapes", choices=fb.GRIDS, default="bar",
                help="bar: the performance bar's shapes (default); irregular: odd row lengths and a sliced view; "
                     "wide: row lengths across the range, other dims, chunk views; all")
    g.addoption("--fastact-no-compile", action="store_true", help="no torch.compile rows")
    g.addoption("--fastact-compile-budget", type=float, default=None, metavar="S",
                help="stop compiling after S seconds of compilation in all; later cases skip torch.compile")
    g.addoption("--fastact-no-variants", action="store_true", help="no forced softmax variant rows")
    g.addoption("--fastact-ops", default=None, help=f"comma-separated subset of {','.join(fb.OPS)}")


def _settings(config):
    device = config.getoption("--fastact-device") or ("cuda" if torch.cuda.is_available() else "cpu")
    grid = config.getoption("--fastact-grid") or ("full" if device == "cuda" else "quick")
    ops = tuple(config.getoption("--fastact-ops").split(",")) if config.getoption("--fastact-ops") else fb.OPS
    return device, grid, ops


def pytest_configure(config):
    config.stash[_SUMMARY] = []
    device, _, ops = _settings(config)
    if device == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("--fastact-device cuda: CUDA is not available")
    bad = [o for o in ops if o not in fb.OPS]
    if bad:
        raise pytest.UsageError(f"--fastact-ops: unknown {bad}; choose from {fb.OPS}")


def pytest_generate_tests(metafunc):
    device, grid, ops = _settings(metafunc.config)
    if "case_impl" in metafunc.fixturenames:
        compile_ = not metafunc.config.getoption("--fastact-no-compile")
        variants = not metafunc.config.getoption("--fastact-no-variants")
        # Case-major order: the rows of one case run one after another, on the same inputs.
        params = [pytest.param((c, n), id=f"{c.name}-{n}")
                  for c in fb.cases(grid, device, metafunc.config.getoption("--fastact-shapes")) if c.op in ops
                  for n in fb.impl_names(c, device, compile=compile_, variants=variants)]
        metafunc.parametrize("case_impl", params)
    if "overhead_impl" in metafunc.fixturenames:
        params = [pytest.param((c, n), id=f"{c.op}-{n}")
                  for c in fb.overhead_cases() if c.op in ops for n in ("fastact", "torch")]
        metafunc.parametrize("overhead_impl", params)


@pytest.fixture(scope="session")
def fastact_device(pytestconfig):
    device = torch.device(_settings(pytestconfig)[0])
    if device.type == "cpu":
        fb.keep_cpu_allocations()  # outputs reuse memory, as under CUDA's caching allocator
    return device


@pytest.fixture(scope="session")
def timing(pytestconfig, fastact_device):
    return fb.timing_for(fastact_device, _settings(pytestconfig)[1])


@pytest.fixture(scope="session")
def bandwidth_limit(pytestconfig, fastact_device, timing):
    """The device's measured limit (fastact.bench.measure_limit), once per session."""
    grid = _settings(pytestconfig)[1]
    limit = fb.measure_limit(fastact_device, fb.limit_bytes(grid, fastact_device.type), timing)
    sys.stderr.write(f"\nfastact bench: limit {limit['limit_gbps']:.1f} GB/s (copy {limit['copy_gbps']:.1f}, "
                     f"mul {limit['mul_gbps']:.1f})\n")
    return limit


@pytest.fixture(scope="session")
def compiler(pytestconfig):
    """One fastact.bench.Compiler for the session: a compiled function per (op, direction, dtype),
    static shapes, each compiled on its first call in fb.prepare (outside the timing)."""
    return fb.Compiler(pytestconfig.getoption("--fastact-compile-budget"))


class _Inputs:
    """Inputs of the current case only: rows of one case share them, and the previous case's
    tensors are freed before the next case's are made (256 MB-class tensors on the GPU)."""

    def __init__(self, device):
        self.device, self.case, self.inputs = device, None, None

    def get(self, case):
        if case != self.case:
            self.case, self.inputs = None, None
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            self.inputs, self.case = fb.make_inputs(case, self.device), case
        return self.inputs


@pytest.fixture(scope="session")
def case_inputs(fastact_device):
    return _Inputs(fastact_device)


@pytest.fixture(scope="session")
def summary(pytestconfig):
    return pytestconfig.stash[_SUMMARY]


def pytest_terminal_summary(terminalreporter, config):
    rows = config.stash.get(_SUMMARY, [])
    if not rows:
        return
    tr = terminalreporter
    tr.section("fastact: bandwidth (minimum bytes / median time) and fraction of the measured limit")
    tr.write_line(f"{'group':<44} {'implementation':<18} {'time us':>10} {'GB/s':>9} {'of limit':>8}")
    for group, name, info in rows:
        if "gbps" in info:
            tr.write_line(f"{group:<44} {name:<18} {info['time_us']:>10.1f} {info['gbps']:>9.1f} "
                          f"{info['fraction']:>8.3f}")
        else:
            tr.write_line(f"{group:<44} {name:<18} {info['us_per_call']:>10.2f}   (host time per call)")
