"""Writes tests/host/dispatch_golden.txt.gz: every plan the softmax dispatcher makes for the bench grids and for
seeded random problems on modelled devices (tests/host/dispatch_golden.cpp prints them). Run it only where a change of
plans is intended and measured (docs/dispatch.md says how); tests/test_dispatch_host.py checks the file against the
dispatcher in CI.

    PYTHONPATH=. python tests/host/make_dispatch_golden.py [--check]

The problems: each (outer, D, inner) geometry of the report's grids (fastact.bench: bar, irregular, wide; full and
quick) and of bench/audit.py's sweep (8 and 64 MB), in every dtype pairing (float, double, half, bfloat16, and the
fused 16-bit -> float cast), forward and backward, softmax and log_softmax, on the three modelled devices; row
lengths at and around each line the dispatcher draws (BOUNDARY_DIMS), rows and columns, likewise; then
RANDOM_PROBLEMS random problems (any layout, alignment, dtype pairing, probed backward CTA size, workspace or none) on
the three, and RANDOM_EXTRA more on each of the device variants the cluster, prefetch and compute-capability rules
read.
"""
from __future__ import annotations

import argparse
import gzip
import math
import pathlib
import random
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests/host/dispatch_golden.txt.gz"
SOURCE = ROOT / "tests/host/dispatch_golden.cpp"

# sm_count cc_major max_cluster wide_cluster_threads l2_mib prefetch deep
DEVICES = {
    "h100": (132, 9, 16, 0, 50, 1, 0),  # sm_90, standard memory depth, as probed (clusters of 16, none "wide")
    "h200": (132, 9, 16, 0, 50, 1, 1),  # sm_90, the deep memory class
    "a100": (108, 8, 1, 0, 40, 1, 0),   # sm_80: no clusters
}
EXTRA_DEVICES = {
    "h100-wide512": (132, 9, 16, 512, 50, 1, 0),  # clusters of 16 counted as filling the device at 512 threads
    "h100-cluster8": (132, 9, 8, 0, 50, 1, 0),    # FASTACT_MAX_CLUSTER=8
    "h100-noclusters": (132, 9, 1, 0, 50, 1, 0),  # FASTACT_MAX_CLUSTER=1
    "h100-noprefetch": (132, 9, 16, 0, 50, 0, 0),  # FASTACT_PREFETCH=0
    "h200-cluster8": (132, 9, 8, 0, 50, 1, 1),
    "sm100-deep": (148, 10, 16, 1024, 126, 1, 1),  # a later device: clusters, but not sm_90's staged mode
    "small-sm90": (66, 9, 16, 0, 25, 1, 0),
}
RANDOM_PROBLEMS = 3000
RANDOM_EXTRA = 300
SEED = 63

# (in_bytes, out_bytes, acc_bytes): forward x -> y; backward grad_input <- grad_output, output.
PAIRINGS = ((4, 4, 4), (8, 8, 8), (2, 2, 4), (2, 4, 4))  # half and bfloat16 plan alike (element sizes only)

# bench/audit.py's sweep (its ROW_D and STRIDED at the time of writing; its sizes 8 and 64 MB).
AUDIT_ROW_D = (2, 5, 10, 33, 77, 100, 197, 257, 384, 577, 1000, 1500, 2304, 5000, 10000, 30522, 50257, 100000,
               151936, 200000)
AUDIT_STRIDED = ((3, 50176), (19, 4096), (21, 1024), (64, 196), (150, 1024), (1000, 49), (8, 7), (2, 65536),
                 (512, 512), (4, 0), (64, 0), (1000, 0), (8192, 0))
AUDIT_SIZES = (8 << 20, 64 << 20)


def grid_geometries():
    """(outer, D, inner, row_stride, x offset in elements) of every softmax-family cell of the grids."""
    from fastact import bench as B

    geoms = set()
    for grid in ("bar", "irregular", "wide"):
        for mode in ("full", "quick"):
            for c in B.cases(mode, "cuda", grid):
                if c.op not in B.SOFTMAX_OPS:
                    continue
                dim = c.dim % len(c.shape)
                outer, d, inner = math.prod(c.shape[:dim]), c.shape[dim], math.prod(c.shape[dim + 1:])
                sliced = c.view == "sliced"
                geoms.add((outer, d, inner, d + 1 if sliced else d, 1 if sliced else 0))
    for size in AUDIT_SIZES:
        for item in (4, 2):
            for d in AUDIT_ROW_D:
                geoms.add((max(1, size // (d * item)), d, 1, d, 0))
            for c, inner in AUDIT_STRIDED:
                if inner == 0:
                    geoms.add((1, c, max(1, size // (c * item)), c, 0))
                else:
                    geoms.add((max(1, size // (c * inner * item)), c, inner, c, 0))
            for s in (128, 512):  # dim -2 of [N, s, s]
                geoms.add((max(1, size // (s * s * item)), s, s, s, 0))
    return sorted(geoms)


def line(dev, in_b, out_b, acc, bwd, log, outer, d, inner, stride, offs, two_cta, ws):
    return " ".join(map(str, (*dev, in_b, out_b, acc, int(bwd), int(log), outer, d, inner, stride, *offs, two_cta,
                              int(ws))))


def grid_problems():
    out = []
    for outer, d, inner, stride, x_off in grid_geometries():
        for dev in DEVICES.values():
            for in_b, out_b, acc in PAIRINGS:
                for log in (False, True):
                    # forward: x (maybe a sliced view, x_off elements past the alignment) -> dense y
                    out.append(line(dev, in_b, out_b, acc, False, log, outer, d, inner, stride,
                                    (x_off * in_b, 0, 0), 0, True))
                    # backward: dense grad_output, output -> grad_input (grad_input in in_b)
                    out.append(line(dev, in_b, out_b, acc, True, log, outer, d, inner, d, (0, 0, 0), 0, True))
    return out


# Row lengths at and around every line the dispatcher draws (warp and vec limits, the backwards' crossovers, the
# two-pass and one-unit ranges, block and cluster capacities, the staged tables' rows), each at -8, -1, 0, +1, +8.
BOUNDARY_DIMS = (8, 16, 32, 64, 79, 80, 95, 96, 111, 112, 128, 143, 144, 160, 211, 212, 256, 299, 300, 320, 398, 400,
                 512, 576, 768, 896, 1024, 2048, 2560, 4096, 8192, 10240, 12288, 16384, 20480, 32768, 65536, 131072,
                 163840, 262144, 327680, 524288, 1048576, 2097152)
# Inners of the strided rules: element accesses (odd), whole lines or not, D-rows on or off a 32-byte sector.
BOUNDARY_INNERS = (1, 2, 33, 264, 300, 1000, 1008, 1023, 2048)
BOUNDARY_BYTES = (8 << 20, 256 << 20)  # under and past the L2 size: the prefetch rules


def boundary_problems():
    out = []
    dims = sorted({max(1, t + k) for t in BOUNDARY_DIMS for k in (-8, -1, 0, 1, 8)})
    for d in dims:
        for inner in BOUNDARY_INNERS:
            if inner > 1 and d > 4096:
                continue
            for size in BOUNDARY_BYTES:
                outer = max(1, size // (4 * d * inner))
                for dev in DEVICES.values():
                    for in_b, out_b, acc in PAIRINGS:
                        for log in (False, True):
                            out.append(line(dev, in_b, out_b, acc, False, log, outer, d, inner, d, (0, 0, 0), 0, True))
                            out.append(line(dev, in_b, out_b, acc, True, log, outer, d, inner, d, (0, 0, 0), 0, True))
    return out


def log_uniform(rng, lo, hi):
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def random_dim(rng):
    r = rng.random()
    if r < 0.25:  # near a power of two
        return max(1, (1 << rng.randint(0, 21)) + rng.choice((-1, 0, 0, 1)))
    if r < 0.45:  # a multiple of the vector widths
        return 8 * log_uniform(rng, 1, 1 << 17)
    if r < 0.6:  # near the measured lines (warp, vec, two-pass, clusters, staged tables)
        base = rng.choice((32, 64, 79, 80, 95, 96, 111, 112, 128, 143, 144, 212, 213, 256, 257, 299, 300, 398, 400,
                           401, 512, 576, 768, 769, 776, 888, 896, 1024, 2048, 4096, 10240, 12288, 16384, 65536,
                           131072, 139264, 262144, 524288, 1048576))
        return max(1, base + rng.randint(-8, 8))
    return log_uniform(rng, 1, 1 << 21)


def random_problem(rng, dev):
    in_b, out_b, acc = rng.choice(PAIRINGS + ((4, 4, 4), (2, 2, 4)))
    bwd, log = rng.random() < 0.5, rng.random() < 0.5
    d = random_dim(rng)
    inner = 1 if rng.random() < 0.55 else (rng.choice((2, 3, 4, 7, 8, 13, 16, 49, 64, 196, 256, 264, 300, 520, 1000,
                                                       1008, 1020, 1023, 1024, 2048, 2056, 2500, 4096, 4100, 50176))
                                           if rng.random() < 0.5 else log_uniform(rng, 2, 1 << 16))
    total = log_uniform(rng, 1, 1 << 28)  # elements
    outer = max(1, total // (d * inner))
    stride = d
    if not bwd and inner == 1 and rng.random() < 0.2:
        stride = d + rng.choice((1, 2, 3, 4, 7, 8, 16, 100))
    def off(elem):
        return 0 if rng.random() < 0.8 else elem * rng.choice((1, 2, 3, 4, 5, 7))
    offs = (off(in_b), off(out_b), 0) if not bwd else (off(out_b), off(out_b), off(in_b))
    two_cta = rng.choice((0, 0, 512, 544, 576, 608, 1024)) if bwd else 0
    ws = rng.random() < 0.9
    return line(dev, in_b, out_b, acc, bwd, log, outer, d, inner, stride, offs, two_cta, ws)


def random_problems():
    rng = random.Random(SEED)
    out = []
    for _ in range(RANDOM_PROBLEMS):
        state = rng.getstate()
        for dev in DEVICES.values():  # the same problem on each device
            rng.setstate(state)
            out.append(random_problem(rng, dev))
    for dev in EXTRA_DEVICES.values():
        for _ in range(RANDOM_EXTRA):
            out.append(random_problem(rng, dev))
    return out


def build(exe):
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        raise RuntimeError("no host C++ compiler")
    subprocess.run([cxx, "-std=c++17", "-O1", f"-I{ROOT / 'include'}", "-o", str(exe), str(SOURCE)], check=True,
                   timeout=600)


def run(exe, problems):
    out = subprocess.run([str(exe)], input="".join(p + "\n" for p in problems), capture_output=True, text=True,
                         check=True, timeout=600)
    return out.stdout.splitlines()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(GOLDEN))
    a = ap.parse_args(argv)
    problems = grid_problems() + boundary_problems() + random_problems()
    with tempfile.TemporaryDirectory() as tmp:
        exe = pathlib.Path(tmp) / "dispatch_golden"
        build(exe)
        lines = run(exe, problems)
    assert len(lines) == len(problems)
    data = "".join(l + "\n" for l in lines).encode()
    with open(a.out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, filename="", mtime=0) as f:
        f.write(data)  # no name or time in the header: the same plans give the same bytes
    print(f"{a.out}: {len(lines)} problems ({len(grid_problems())} from the grids, {len(boundary_problems())} at the "
          f"dispatcher's lines)", file=sys.stderr)


if __name__ == "__main__":
    main()
