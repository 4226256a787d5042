"""The softmax dispatcher (include/fastact/dispatch.h, pure host C++) on modelled devices, without a GPU.

test_golden_plans pins every plan of tests/host/dispatch_golden.txt.gz (docs/dispatch.md says how to change one).
tests/host/dispatch_plans.cpp, built here with the host compiler, prints softmax_explain for problems given on
stdin and a device given on its command line: the plans a deep-memory device (the H200) and a standard one (the
H100) get for the dtype= cast's rows. The GPU tests (test_cuda_*.py) run whatever plans the real device gets and
check what every plan must satisfy, not where the rows draw their lines.
"""

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# (sm_count, max_cluster, wide_cluster_threads, L2 MiB): the H200's (and H100's) as probed, and the variations
# the cluster rules read: 16-CTA clusters of 512 threads counted as filling the device, and no 16-CTA clusters.
DEVICES = {"sm90": (132, 16, 0, 50), "sm90-wide512": (132, 16, 512, 50), "sm90-cluster8": (132, 8, 0, 50)}


@pytest.fixture(scope="module")
def plans_tool(tmp_path_factory):
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    exe = tmp_path_factory.mktemp("dispatch") / "dispatch_plans"
    subprocess.run([cxx, "-std=c++17", "-O1", f"-I{ROOT / 'include'}", "-o", str(exe),
                    str(ROOT / "tests/host/dispatch_plans.cpp")], check=True, capture_output=True, timeout=300)
    return exe


def plans(tool, device, problems, log=False):
    """softmax_explain of each problem (depth, in_bytes, out_bytes, backward, outer, dim), softmax's (log:
    log_softmax's), float accumulation, rows (inner 1), aligned, on DEVICES[device]."""
    lines = "".join(f"{d} {i} {o} 4 {int(b)} {int(log)} {outer} {dim} 1 1\n" for d, i, o, b, outer, dim in problems)
    out = subprocess.run([str(tool), *map(str, DEVICES[device])], input=lines, capture_output=True, text=True,
                         check=True, timeout=60)
    got = out.stdout.splitlines()
    assert len(got) == len(problems), out.stdout
    return got


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("depth", ["standard", "deep"])
def test_cast_forward_plans(plans_tool, device, depth):
    """The forward of bf16 rows into float (the dtype= cast; dispatch.h's rows vec-fwd-deep-cast and
    cluster-deep-shapes): rows of 1024 in vec on a deep device, in warp on a standard one, 1016 in warp on both;
    block.cuh's register clusters kept as loaded to 131072; long_row.cuh's shared-memory clusters without a
    register part from 139264 to 262144 in both classes; past that, the deep class's register part."""
    dims = (1016, 1024, 65544, 131072, 139264, 262144, 524288)
    got = dict(zip(dims, plans(plans_tool, device, [(depth, 2, 4, False, 5, d) for d in dims])))
    assert got[1016].startswith("variant=warp"), got[1016]
    assert got[1024].startswith("variant=vec" if depth == "deep" else "variant=warp"), got[1024]
    for d in (65544, 131072):
        assert "(kept as loaded)" in got[d] and "in shared memory" not in got[d], got[d]
    for d in (139264, 262144):
        assert "in shared memory" in got[d] and "kept as loaded" not in got[d], got[d]
    if depth == "deep":
        assert "the rest kept as loaded" in got[524288], got[524288]


@pytest.mark.parametrize("device", DEVICES)
def test_deep_rules_keep_to_the_cast(plans_tool, device):
    """The cast's rules change no other problem's plan on a deep device: bf16 -> bf16 rows of 1024 stay in warp and
    those of 139264 keep the register part as loaded; float rows of 1024 take vec (row vec-fwd-deep-f32); the
    fused backward (float dy and y into bf16 dx) leaves warp from 896 (row vec-bwd-aligned), not 768."""
    got = plans(plans_tool, device, [("deep", 2, 2, False, 5, 1024), ("deep", 2, 2, False, 5, 139264),
                                     ("deep", 4, 4, False, 5, 1024), ("deep", 2, 4, True, 5, 768),
                                     ("deep", 2, 4, True, 5, 1024)])
    bf16_1024, bf16_139264, f32_1024, bwd_768, bwd_1024 = got
    assert bf16_1024.startswith("variant=warp"), bf16_1024
    assert "the rest kept as loaded" in bf16_139264, bf16_139264
    assert f32_1024.startswith("variant=vec"), f32_1024
    assert bwd_768.startswith("variant=warp"), bwd_768
    assert bwd_1024.startswith("variant=vec"), bwd_1024


GOLDEN = ROOT / "tests/host/dispatch_golden.txt.gz"


def test_golden_plans(tmp_path):
    """Every plan in tests/host/dispatch_golden.txt.gz (the bench grids' problems and seeded random ones on the
    modelled H100, H200 and A100 and variants of them: tests/host/make_dispatch_golden.py) is still what the
    dispatcher plans: auto's choice and every forced variant's plan, field by field. A change of plans is a
    measured decision (docs/dispatch.md): regenerate the file with the script and say which cells changed."""
    import gzip

    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    exe = tmp_path / "dispatch_golden"
    subprocess.run([cxx, "-std=c++17", "-O1", f"-I{ROOT / 'include'}", "-o", str(exe),
                    str(ROOT / "tests/host/dispatch_golden.cpp")], check=True, capture_output=True, timeout=600)
    with gzip.open(GOLDEN, "rt") as f:
        want = f.read().splitlines()
    problems = [w.split(" | ", 1)[0] for w in want]
    out = subprocess.run([str(exe)], input="".join(p + "\n" for p in problems), capture_output=True, text=True,
                         check=True, timeout=600)
    got = out.stdout.splitlines()
    assert len(got) == len(want), (len(got), len(want))
    diffs = [(w, g) for w, g in zip(want, got) if w != g]
    shown = "\n".join(f"problem: {w.split(' | ')[0]}\n  golden:  {w.split(' | ')[1]}\n  now:     {g.split(' | ')[1]}"
                      for w, g in diffs[:20])
    assert not diffs, (f"{len(diffs)} of {len(want)} problems plan differently (first 20; fields: "
                       f"tests/host/dispatch_golden.cpp):\n{shown}")
