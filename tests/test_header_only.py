"""The header-only library on its own: include/ built by nvcc without torch, with CUDA's own 16-bit types.

The torch adapter instantiates every kernel with c10::Half / c10::BFloat16, so the rest of the suite never
runs include/ with __half / __nv_bfloat16, whose conversions are the header's own (softmax/common.cuh
ElementConvert / ElementMax). tests/cuda/header_only_16bit.cu checks softmax and log_softmax, forward and
backward, auto and every forced variant that takes each shape, against a float64 host reference with
NaN-poisoned outputs. Needs a CUDA device and nvcc (compiling it takes about a minute).
"""

import pathlib
import shutil
import subprocess
import time

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_headers_read_no_environment():
    """include/ is configured by its caller (include/fastact/runtime_options.h): fastact reads its FASTACT_*
    variables in csrc/runtime_options.h, once, and a program built on the headers alone is not steered by them."""
    readers = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "include").rglob("*")) if p.is_file()
               for n, line in enumerate(p.read_text().splitlines(), 1) if "getenv" in line.split("//")[0]]
    assert not readers, readers


def _nvcc():
    found = shutil.which("nvcc")
    if found:
        return found
    from torch.utils.cpp_extension import CUDA_HOME

    candidate = pathlib.Path(CUDA_HOME or "/usr/local/cuda", "bin", "nvcc")
    return str(candidate) if candidate.exists() else None


def _targets(nvcc):
    """The real architectures nvcc can build for (sm_XY), or None where it cannot say."""
    out = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True, timeout=60)
    return set(out.stdout.split()) if out.returncode == 0 else None


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.gpu_memory(4)  # a few MB itself, but a separate process: other workers' cached blocks must leave room
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_header_only_16bit_softmax(tmp_path):
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found")
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    targets = _targets(nvcc)
    if targets is not None and arch not in targets:
        pytest.skip(f"this nvcc cannot build for the device ({arch})")
    exe = tmp_path / "header_only_16bit"
    build = subprocess.run(
        [nvcc, "-std=c++17", "-O3", f"-arch={arch}", "--expt-relaxed-constexpr",
         f"-I{ROOT / 'include'}", str(ROOT / "tests" / "cuda" / "header_only_16bit.cu"), "-o", str(exe)],
        capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stderr[-4000:]
    # The program needs a few MB of device memory, but under pytest-xdist the other workers' caching allocators
    # may hold the rest of the device for a while (the H100 suite once failed its first cudaMalloc so): this
    # process gives back its own cache and the run is retried a few times before an out-of-memory counts.
    torch.cuda.empty_cache()
    attempts = 4
    for attempt in range(attempts):
        run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
        if "CUDA out of memory" not in run.stdout or attempt == attempts - 1:
            break
        time.sleep(15)
    if "driver version is insufficient" in run.stdout:
        pytest.skip("the driver is older than this nvcc's runtime")
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    assert run.returncode == 0 and summary.endswith(" 0 failed"), run.stdout[-4000:] + run.stderr[-2000:]
