"""pytest configuration of the fastact suite: devices, dtypes, seeding, markers, hypothesis profile.

Devices: every device-parametrised test runs on "cpu" and on "cuda"; the cuda case skips where
torch.cuda.is_available() is False (the only GPU query made outside a test body).

Markers (see also pyproject.toml): `cuda`, `huge`, `slow` (torch.compile with inductor and
multi-process tests: a few minutes in all on two cores; deselect with `-m "not slow"`), and
`gpu_memory(gib)`: the test needs that much GPU memory at once (see _gpu_memory below).

Hypothesis: profile "fastact" (default) derandomises, so CI sees the same examples every run; set
HYPOTHESIS_PROFILE=explore for fresh random examples, and FASTACT_HYPOTHESIS_EXAMPLES=N to scale
the example counts of tests/test_properties.py.
"""

import contextlib
import fcntl
import os
import tempfile
import time
import zlib

import pytest
import torch
from hypothesis import HealthCheck, settings

from fastact_testing import DEVICES, DTYPE_IDS, FLOAT_DTYPES

_common = dict(
    deadline=None,
    database=None,  # nothing written into the work tree
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
settings.register_profile("fastact", derandomize=True, **_common)
settings.register_profile("explore", derandomize=False, **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fastact"))


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: long-running (torch.compile with inductor, multi-process); deselect with -m 'not slow'"
    )
    config.addinivalue_line(
        "markers", "gpu_memory(gib): needs gib GiB of GPU memory at once; run one at a time across pytest-xdist workers"
    )


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture(params=FLOAT_DTYPES, ids=[DTYPE_IDS[d] for d in FLOAT_DTYPES])
def dtype(request):
    return request.param


@pytest.fixture(autouse=True)
def _seed(request):
    """A fixed seed per test (from its id): reproducible, and different inputs for different tests."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    yield


# FASTACT_TEST_LOG=DIR (scripts/gpu.sh sets it): one line per test as it finishes ("seconds
# outcome phase nodeid") goes to DIR/times-<pid>.txt and the report of each failure to
# DIR/failures-<pid>.txt (under pytest-xdist by the controller, which sees every worker's
# reports), so a run cut short by a time limit still says what ran, how long it took and what
# failed.
_TEST_LOG = os.environ.get("FASTACT_TEST_LOG")


def pytest_runtest_logreport(report):
    if not _TEST_LOG or os.environ.get("PYTEST_XDIST_WORKER"):  # logged once, by the controller
        return
    if not (report.when == "call" or report.outcome == "failed"):
        return
    os.makedirs(_TEST_LOG, exist_ok=True)
    with open(os.path.join(_TEST_LOG, f"times-{os.getpid()}.txt"), "a") as f:
        f.write(f"{report.duration:.3f} {report.outcome} {report.when} {report.nodeid}\n")
    if report.failed:
        with open(os.path.join(_TEST_LOG, f"failures-{os.getpid()}.txt"), "a") as f:
            f.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext[-6000:]}\n")


# GPU memory under pytest-xdist. scripts/gpu.sh runs 16 workers on one GPU; each keeps a CUDA context and a caching
# allocator, and a test that needs many GiB at once (its own tensors or a subprocess's) can find the device full of
# other workers' cached blocks: on an 80 GB H100 four tests failed with CUDA out of memory that way, while a 141 GB
# H200 had room. Two rules keep the suite's peak inside any GPU it supports:
#   - a worker gives its cached blocks back after a test that left more than _CACHE_KEEP reserved, so idle workers
#     hold at most that much each;
#   - a test marked gpu_memory(gib) runs alone among the memory-hungry ones (an exclusive lock shared by the workers
#     of one machine), first waits until that much is free, and skips, with the reason, on a GPU that has less in all.
_CACHE_KEEP = 1 << 30
_LOCK_PATH = os.path.join(tempfile.gettempdir(), f"fastact-gpu-memory-{os.getuid()}.lock")
_FREE_WAIT_S = 600


@contextlib.contextmanager
def _exclusive(path):
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _wait_for_free(need):
    deadline = time.monotonic() + _FREE_WAIT_S
    while True:
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info()
        if free >= need or time.monotonic() > deadline:
            return free
        time.sleep(2)


@pytest.fixture(autouse=True)
def _gpu_memory(request):
    marker = request.node.get_closest_marker("gpu_memory")
    if marker is None or not torch.cuda.is_available():
        yield
        if torch.cuda.is_initialized() and torch.cuda.memory_reserved() > _CACHE_KEEP:
            torch.cuda.empty_cache()
        return
    need = int(marker.args[0] * (1 << 30))
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    if total < need:
        pytest.skip(f"needs {marker.args[0]} GiB of GPU memory; this GPU has {total / (1 << 30):.0f} GiB")
    with _exclusive(_LOCK_PATH):
        free = _wait_for_free(need)
        if free < need:
            pytest.fail(f"needs {marker.args[0]} GiB of GPU memory; {free / (1 << 30):.1f} GiB stayed free for "
                        f"{_FREE_WAIT_S} s while other workers held the rest")
        yield
        torch.cuda.empty_cache()
