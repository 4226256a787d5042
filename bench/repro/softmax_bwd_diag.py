"""Times softmax_bwd_diag.cu's variants of the softmax kernels against torch and torch.compile in one process
(diagnostic, not part of the library; bench/NOTES.md, fortieth session).

    python3 bench/repro/softmax_bwd_diag.py [--rounds 9] [--reps 40] [--build DIR | --prebuilt DIR]
                                            [--parts 0,1,2,6,3,4,5,9,7,8,10] [--ops softmax,log_softmax]
                                            [--deadline S] [--no-compile] [--no-replay] [--dry-run]

The cells: the bar report's softmax / log_softmax cells that tie torch.compile at the memory limit, backward first
(16-bit [131072, 1024], [32768, 4096], [8192, 16384]; f32 [65536, 1024]), then the forwards (f32 [16384, 4096],
16-bit [131072, 1024], f32 [65536, 1024]); 256 MB-class tensors, rows = 256 MB / (D x itemsize), inputs from the
bench's own make_inputs (same seed, so the report's values). One shared library a (direction, dtype, D): built
with nvcc -arch=sm_90 into DIR, all parts at once, unless --prebuilt names a folder that holds them.

For each cell:
  1. the bench's own bench_case (every row of the report: fastact, its forced variants, torch, torch.compile
     compiled as the report compiles it), timed as the report times it, outputs not verified: the report's
     figures reproduced in this process, and with them the order effect (the fastact row, timed first, against
     the same plan forced, timed second; since the fortieth session bench_case rotates the rows over rounds);
  2. every row checked against fastact's own op: the diag's variants bitwise where they give each thread the
     library's elements in the library's order ("exact"), within float rounding where they sum in another order
     (no larger than fastact's own difference from torch's result);
  3. rounds: every row (fastact's op, the same plan forced and the alternative, torch, torch.compile twice — the
     second its noise floor — and each variant) timed by CUDA events around each of `reps` back-to-back calls
     after warm-up, the median; rounds interleave the rows in a rotated order. Every variant writes a fresh
     torch.empty_like output, as the ops do, so that every row's output is the same cached block.
Prints per cell: the dispatcher's plan, then for each row the median over rounds of its round medians, its ratio
to torch.compile (median and range over rounds), the rounds it was behind, its ratio to fastact's op, the kernel's
registers / spill bytes / threads / CTAs an SM, and the check; then a summary of the best variant per cell.
--deadline S: no cell starts after S seconds from the start (the summary still prints).
"""
import argparse
import ctypes
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "bench/repro/softmax_bwd_diag.cu"
NUM_PARTS = 11
# Backward cells first (the misses), f32 [65536, 1024] before the float16 repeats; then the forwards.
DEFAULT_PARTS = (0, 1, 2, 6, 3, 4, 5, 9, 7, 8, 10)
DTYPE_NAMES = ("bf16", "f16", "f32")
BAD_SHAPE, PLAN_DIFFERS = 1000, 1001  # softmax_bwd_diag.cu's codes besides cudaError_t


def nvcc():
    for c in (shutil.which("nvcc"), os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"),
              "/usr/local/cuda/bin/nvcc"):
        if c and os.path.exists(c):
            return c
    sys.exit("nvcc not found")


def lib_path(folder, part):
    return Path(folder) / f"libsmdiag_{part}.so"


def start_build(folder, parts, jobs):
    """Starts nvcc for the parts (at most `jobs` at once) and returns a function that starts the rest and waits for
    all. Each part's ptxas report (-Xptxas -v: registers and spills of every kernel) goes to DIR/part<N>.log."""
    folder.mkdir(parents=True, exist_ok=True)
    queue, procs = list(parts), {}

    def fill():
        while queue and sum(p.poll() is None for p, _ in procs.values()) < jobs:
            part = queue.pop(0)
            lib = lib_path(folder, part)
            if lib.exists():
                lib.unlink()
            cmd = [nvcc(), "-std=c++17", "-O3", "-arch=sm_90", "--expt-relaxed-constexpr", f"-I{ROOT / 'include'}",
                   "-Xcompiler", "-fPIC", "-shared", "-Xptxas", "-v", f"-DDIAG_PART={part}", "-o", str(lib), str(SRC)]
            log = open(folder / f"part{part}.log", "w")
            procs[part] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log)

    def wait():
        while True:
            fill()
            if not queue and all(p.poll() is not None for p, _ in procs.values()):
                break
            time.sleep(0.1)
        failed = [part for part, (p, _) in procs.items() if p.wait() != 0]
        for _, log in procs.values():
            log.close()
        for part in failed:
            print(open(folder / f"part{part}.log").read()[-3000:])
        if failed:
            sys.exit(f"nvcc failed for parts {failed}")

    fill()
    return wait


class Lib:
    """One part's shared library: its shape and variants."""

    def __init__(self, path):
        self.dll = ctypes.CDLL(str(path))
        d = self.dll
        d.diag_part.argtypes = [ctypes.POINTER(ctypes.c_int)]
        d.diag_variants.restype = ctypes.c_int
        d.diag_variant_name.argtypes = [ctypes.c_int]
        d.diag_variant_name.restype = ctypes.c_char_p
        d.diag_variant_exact.argtypes = [ctypes.c_int]
        d.diag_launch.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                  ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
        d.diag_variant_info.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                                        ctypes.POINTER(ctypes.c_int)]
        d.diag_plan.argtypes = [ctypes.c_int, ctypes.c_int64]
        d.diag_plan.restype = ctypes.c_char_p
        info = (ctypes.c_int * 3)()
        d.diag_part(info)
        self.backward = bool(info[0])
        self.dtype_name = DTYPE_NAMES[info[1]]
        self.dim = info[2]
        self.names = [d.diag_variant_name(v).decode() for v in range(d.diag_variants())]
        self.exact = [bool(d.diag_variant_exact(v)) for v in range(len(self.names))]

    def info(self, v, log, rows):
        out = (ctypes.c_int * 4)()
        rc = self.dll.diag_variant_info(v, log, rows, self.dim, out)
        return None if rc else tuple(out)  # regs, local bytes, threads, CTAs an SM


def time_row(call, reps, warmup=3):
    """Median us of `reps` back-to-back calls, each between two CUDA events, after `warmup` calls: the report's own
    timer (fastact.bench.time_call) with the count fixed."""
    import fastact.bench as fb

    return fb.time_call(call, "cuda", fb.Timing(0.0, reps, reps, warmup)) * 1e6


def forced_rows(lib):
    """The library's variants forced through the op: the plan auto picks (the order effect's control) and the
    alternative at this D (a block a row where a warp takes it; the cluster kernel where vec does)."""
    return ("warp", "vec") if lib.dim <= 1024 else ("vec", "long_row")


def check(torch, fb, out, ref, torch_ref, base_maxd, exact):
    """'bitwise' when out equals fastact's result. Else, for a variant that sums in another order ('reorders'),
    'rounding' when it is as close to torch's result as the bench requires and no further from fastact's than
    twice fastact's own max |d| from torch's, or 4 eps of the dtype at the largest |value|; else 'MISMATCH'."""
    kind = "exact" if exact else "reorders"
    if torch.equal(out, ref):
        return f"{kind}: bitwise"
    d = (out.float() - ref.float()).abs()
    maxd, ndiff = d.max().item(), int((out != ref).sum().item())
    mis = fb.mismatch(out, torch_ref)
    tol = max(2 * base_maxd, 4 * torch.finfo(out.dtype).eps * ref.float().abs().max().item())
    ok = (not exact) and mis <= fb.MATCH_TOL[out.dtype] and maxd <= tol
    return f"{kind}: {'rounding' if ok else 'MISMATCH'} max|d| {maxd:.3g} ({ndiff} differ), vs torch {mis:.2g}"


def run_cell(torch, fb, fastact, lib, op, args, compiler, summary):
    dev = torch.device("cuda")
    dtype = fb.DTYPES[lib.dtype_name]
    direction = "bwd" if lib.backward else "fwd"
    rows_n = fb._rows(fb.FULL_CLASS_BYTES, lib.dim, dtype.itemsize)
    case = fb.Case(op, direction, dtype, (rows_n, lib.dim))
    log = int(op == "log_softmax")
    title = f"{op} {direction} {lib.dtype_name} [{rows_n}, {lib.dim}]"
    print(f"\n== {title} ==", flush=True)

    # 1. The bench's own cell, as the report times it (every row, no verification).
    if not args.no_replay:
        r = fb.bench_case(case, dev, compiler, variants=True, verify=False)
        rows = r["rows"]
        print("  bench_case replay (report order, report timing; us median / min): " + "  ".join(
            f"{n} {v['seconds'] * 1e6:.1f}/{v['min_s'] * 1e6:.1f}" for n, v in rows.items()), flush=True)

    # 2. Inputs (make_inputs: the report's), rows, checks.
    inputs = fb.make_inputs(case, dev)
    like = inputs["y"] if lib.backward else inputs["x"]
    a, b = (inputs["dy"], inputs["y"]) if lib.backward else (inputs["x"], None)
    explain_op = op + "_backward" if lib.backward else op
    print(f"  fastact.explain: {fastact.explain(explain_op, like, -1)}", flush=True)
    print(f"  diag's dispatcher: {lib.dll.diag_plan(log, rows_n).decode()}", flush=True)
    calls, exact, info = {}, {}, {}
    calls["fastact"] = fb.prepare(case, "fastact", inputs, dev)[0]
    for v in forced_rows(lib):
        try:
            calls[f"fastact[{v}]"] = fb.prepare(case, f"fastact[{v}]", inputs, dev)[0]
            exact[f"fastact[{v}]"] = v == forced_rows(lib)[0]
        except (fb.Skip, RuntimeError) as e:
            print(f"  fastact[{v}] skipped: {e}")
    calls["torch"] = fb.prepare(case, "torch", inputs, dev)[0]
    if compiler is not None:
        calls["torch.compile"] = fb.prepare(case, "torch.compile", inputs, dev, compiler)[0]
        calls["torch.compile (again)"] = calls["torch.compile"]
    stream = torch.cuda.current_stream().cuda_stream
    a_ptr, b_ptr = a.data_ptr(), (0 if b is None else b.data_ptr())
    for v, name in enumerate(lib.names):
        def call(v=v, name=name):
            out = torch.empty_like(like)
            rc = lib.dll.diag_launch(v, log, a_ptr, b_ptr, out.data_ptr(), rows_n, lib.dim, stream)
            if rc:
                why = {BAD_SHAPE: "not this D", PLAN_DIFFERS: "the dispatcher's plan is not the one assumed"}
                raise RuntimeError(f"{name}: {why.get(rc, f'CUDA error {rc}')}")
            return out
        try:
            call()
            torch.cuda.synchronize()
        except RuntimeError as e:
            print(f"  skipped {e}")
            continue
        calls[name] = call
        exact[name] = lib.exact[v]
        info[name] = lib.info(v, log, rows_n)
    ref = calls["fastact"]()
    torch_ref = calls["torch"]()
    base_maxd = (ref.float() - torch_ref.float()).abs().max().item()
    checks = {"torch": f"fastact vs torch: max|d| {base_maxd:.3g}, {fb.mismatch(ref, torch_ref):.2g}"}
    for name, is_exact in exact.items():
        out = calls[name]()
        checks[name] = check(torch, fb, out, ref, torch_ref, base_maxd, is_exact)
        del out
    if "torch.compile" in calls:
        out = calls["torch.compile"]()
        checks["torch.compile"] = f"vs torch {fb.mismatch(out, torch_ref):.2g}"
        del out
    del ref, torch_ref
    torch.cuda.synchronize()
    torch.cuda.empty_cache()

    # 3. Rounds.
    names = list(calls)
    times = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            times[n].append(time_row(calls[n], args.reps))
    base_name = "torch.compile" if "torch.compile" in times else "torch"
    base = times[base_name]
    print(f"  {args.rounds} rounds x {args.reps} calls, us (median of round medians); ratios per round; "
          f"behind: rounds slower than {base_name}", flush=True)
    print(f"  {'row':46s} {'us':>7s}  {'/' + base_name:>14s} {'[min, max]':>16s} {'behind':>6s} {'/fastact':>8s} "
          f"{'regs':>4s} {'lmem':>4s} {'thr':>4s} {'CTA/SM':>6s}  check")
    fa = times["fastact"]
    for n in names:
        ratios = [t / b for t, b in zip(times[n], base)]
        rf = statistics.median(t / f for t, f in zip(times[n], fa))
        i = info.get(n)
        inf = f"{i[0]:4d} {i[1]:4d} {i[2]:4d} {i[3]:6d}" if i else f"{'':4s} {'':4s} {'':4s} {'':6s}"
        print(f"  {n:46s} {statistics.median(times[n]):7.2f}  {statistics.median(ratios):14.4f} "
              f"[{min(ratios):.4f}, {max(ratios):.4f}] {sum(x > 1 for x in ratios):3d}/{len(ratios):<2d} {rf:8.4f} "
              f"{inf}  {checks.get(n, '')}", flush=True)
    variants = [n for n in names if n in info or n.startswith("fastact[")]
    best = min(variants, key=lambda n: statistics.median(times[n]))
    summary.append((title, statistics.median(fa), statistics.median(base), base_name, best,
                    statistics.median(times[best]), sum(t > b for t, b in zip(times[best], base))))
    del calls, inputs, a, b, like
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--build", default="/tmp/softmax_bwd_diag", help="where to build the libraries")
    ap.add_argument("--prebuilt", default=None, help="a folder with libsmdiag_<part>.so already built")
    ap.add_argument("--parts", default=",".join(map(str, DEFAULT_PARTS)))
    ap.add_argument("--ops", default="softmax,log_softmax")
    ap.add_argument("--jobs", type=int, default=min(NUM_PARTS, os.cpu_count() or 1))
    ap.add_argument("--deadline", type=float, default=None, help="seconds from the start after which no cell starts")
    ap.add_argument("--no-compile", action="store_true", help="no torch.compile rows (torch eager is the base)")
    ap.add_argument("--no-replay", action="store_true", help="skip the bench_case replay of each cell")
    ap.add_argument("--dry-run", action="store_true", help="list the cells and variants (no GPU needed)")
    args = ap.parse_args()
    t0 = time.monotonic()
    parts = [int(p) for p in args.parts.split(",")]
    if any(p < 0 or p >= NUM_PARTS for p in parts):
        sys.exit(f"--parts: 0..{NUM_PARTS - 1}")
    ops = args.ops.split(",")
    folder = Path(args.prebuilt or args.build)
    wait = (lambda: None) if args.prebuilt else start_build(folder, parts, args.jobs)
    import torch  # noqa: E402 (while nvcc runs)

    import fastact  # noqa: E402
    import fastact.bench as fb  # noqa: E402

    wait()
    print(f"libraries ready in {time.monotonic() - t0:.1f} s ({'prebuilt' if args.prebuilt else 'built'}: {folder})",
          flush=True)
    libs = {p: Lib(lib_path(folder, p)) for p in parts}
    if args.dry_run:
        for p, lib in libs.items():
            dtype = fb.DTYPES[lib.dtype_name]
            rows = fb._rows(fb.FULL_CLASS_BYTES, lib.dim, dtype.itemsize)
            for op in ops:
                case = fb.Case(op, "bwd" if lib.backward else "fwd", dtype, (rows, lib.dim))
                print(f"part {p}: {case.name}: forced {forced_rows(lib)}; {len(lib.names)} variants")
            for name, ex in zip(lib.names, lib.exact):
                print(f"    {'exact   ' if ex else 'reorders'} {name}")
        return
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    compiler = None if args.no_compile else fb.Compiler(None)
    summary = []
    last = 0.0
    for p in parts:
        for op in ops:
            now = time.monotonic() - t0
            if args.deadline is not None and now + last > args.deadline:
                print(f"\n(deadline: part {p} {op} and the rest not run, {now:.0f} s elapsed)", flush=True)
                break
            run_cell(torch, fb, fastact, libs[p], op, args, compiler, summary)
            last = time.monotonic() - t0 - now
        else:
            continue
        break
    print("\n== summary: fastact's op and the fastest library row (variant or forced) against the base ==")
    for title, fa, base, base_name, best, best_t, behind in summary:
        print(f"  {title:40s} fastact {fa:7.2f} ({fa / base:.4f})  {base_name} {base:7.2f}  best {best} "
              f"{best_t:7.2f} ({best_t / base:.4f}, behind {behind}/{args.rounds})")
    print(f"total {time.monotonic() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
