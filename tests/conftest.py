"""pytest configuration of the fastact suite: devices, dtypes, seeding, markers, hypothesis profile.

Devices: every device-parametrised test runs on "cpu" and on "cuda"; the cuda case skips where
torch.cuda.is_available() is False (the only GPU query made outside a test body).

Markers (see also pyproject.toml): `cuda`, `huge`, and `slow` (torch.compile with inductor and
multi-process tests: a few minutes in all on two cores; deselect with `-m "not slow"`).

Hypothesis: profile "fastact" (default) derandomises, so CI sees the same examples every run; set
HYPOTHESIS_PROFILE=explore for fresh random examples, and FASTACT_HYPOTHESIS_EXAMPLES=N to scale
the example counts of tests/test_properties.py.
"""

import os
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
