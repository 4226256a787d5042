"""Runs every fastact CUDA kernel once on small boundary shapes, for compute-sanitizer.

Every softmax variant forced (forward and backward, softmax and log_softmax) on each shape it
accepts, every elementwise op forward and backward, every dtype, aligned and misaligned inputs.
Checks each result against torch so that a run that is clean but wrong also fails.
Usage: python3 scripts/sanitize_cases.py [--quick] [--synccheck]
  --quick: float32 and bfloat16 only.
  --synccheck: without the cases that synccheck cannot run (SYNCCHECK_SKIPS).
"""

import sys

import torch

import fastact
from fastact._optable import BY_NAME, OPS

ops = torch.ops.fastact
VARIANTS = ("warp", "vec", "scalar", "long_row", "split", "strided", "grid")
TOL = {torch.float32: 1e-4, torch.float64: 1e-9, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def check(name, got, want, dtype):
    err = (got.double() - want.double()).abs().max().item() if got.numel() else 0.0
    if not err <= TOL[dtype] * max(1.0, want.double().abs().max().item() if want.numel() else 1.0):
        raise AssertionError(f"{name}: max error {err}")


def softmax_backward_reference(dy, want, dim, log):
    """torch's softmax / log_softmax backward in float64, from the float64 forward `want`."""
    f = torch.ops.aten._log_softmax_backward_data if log else torch.ops.aten._softmax_backward_data
    return f(dy.double(), want, dim, torch.float64)


def taken(call):
    """call(), or None where the forced variant cannot take the input ("cannot take"); other errors propagate."""
    try:
        return call()
    except RuntimeError as e:
        if "cannot take" in str(e):
            return None
        raise


# compute-sanitizer 2025.3's synccheck stops with "an illegal memory access" (and 0 synccheck errors) on
# any kernel whose CTAs push st.async values into the CTAs of a 16-CTA cluster while two CTAs of the
# kernel can share an SM: a 40-line kernel doing only that fails alike, passes with 1 CTA an SM or in
# clusters of 8, and is right in 3000 plain launches (bench/diag/synccheck_cluster16.cu). These
# cases run that way (the cached strided float / float64 backward, 2 columns x 512 threads x 16); the
# other three tools run them.
SYNCCHECK_SKIPS = {((16384, 64), 0)}


def synccheck_cannot_run(explanation):
    """SYNCCHECK_SKIPS' reason, read from a long_row plan: a 16-CTA cluster whose CTAs may share an SM (the
    forwards' shared-memory CTAs run two or three an SM; a backward's plan says how many)."""
    return "[16 CTA(s)" in explanation and ("in shared memory" in explanation or
                                            "at least two CTAs an SM" in explanation)


def softmax_cases(dtype, synccheck=False):
    dev = "cuda"
    shapes = [((3, 1), -1), ((5, 33), -1), ((4, 1024), -1), ((2, 1025), -1), ((2, 4104), -1),
              ((2, 70000), -1), ((5, 20011), -1), ((3, 37, 5), 1), ((2, 64, 130), 1),
              ((2, 64, 64), 1), ((2, 1024, 64), 1), ((2, 2048, 64), 1), ((3, 100, 40), 1), ((2, 257, 33), 1),
              ((2, 513, 33), 1), ((2, 1000, 33), 1), ((16385, 16), 0), ((65536, 16), 0), ((16384, 33), 0),
              ((65536, 100), 0), ((16384, 64), 0), ((2, 100, 65), 1), ((2, 513, 65), 1),
              ((265, 65, 131), 1), ((3, 2, 2056), 1), ((7, 1001), -1), ((2, 12288), -1), ((2, 8200), -1)]
    # rows: odd D (aligned: 128-bit bodies with head and tail elements; misaligned: element accesses);
    # strided: element accesses (257 x 33: lines narrowed to one CTA forward, streamed backward; 513 x 33:
    # the backward streamed in CTAs of 1024 threads in float and float64, 512 in 16-bit; 1000 x 33: the
    # float and float64 backwards streamed over a cluster of 4); 128-bit: a small CTA, half a line in 512
    # threads, a cluster, a partial tile, dim 0 of a tall matrix (narrow tiles over a cluster of 16), and
    # dim 0 of 65536 rows (one tile: the split mode, chunks of D through a workspace); dim 0 of 16384 x 33
    # and 65536 x 100: tiles of a whole outer index (33 columns in 512 threads, the last 17 idle; 100
    # elements, 25 or 50 vectors), split; dim 0 of 16384 x 64: cached tiles over 16-CTA clusters that
    # share SMs (float backward: 2 columns x 512 threads); 100 x 65 and 513 x 65 (16-bit: a whole line
    # of element accesses): the backward streamed at short D in 256-thread CTAs, the forward's 16 columns
    # over a cluster of 288-thread CTAs (the float backwards of 100 x 40 and 257 x 33 stream as well);
    # [265, 65, 131]: the staged mode (backwards of 2- and 4-byte elements, 16-bit forwards; staged_cases
    # adds misaligned grad_output, output and x); [3, 2, 2056]: tiles of one D-group a column, no scratch
    # (16-bit forward: 128 columns x 128 threads; the last tile partial); [7, 1001]: the warp kernel's element
    # rows at 2^10 with slots past the row filled, the last block of rows partial (16-bit auto backward: vec's
    # head and tail); [2, 4104] aligned, [2, 12288] and [2, 8200]: the 16-bit softmax backward in two passes (a unit
    # a thread, 544 threads past the row's 513 units; two units in 768 threads; 1025 units in 544 threads, some
    # holding one)
    for shape, dim in shapes:
        if synccheck and (shape, dim) in SYNCCHECK_SKIPS:
            continue
        for misaligned in (False, True):
            n = torch.Size(shape).numel()
            base = torch.randn(n + 1, device=dev, dtype=dtype)
            x = (base[1:] if misaligned else base[:n]).view(shape)
            for log in (False, True):
                fwd = ops.log_softmax if log else ops.softmax
                bwd = ops.log_softmax_backward if log else ops.softmax_backward
                ref_fn = torch.log_softmax if log else torch.softmax
                want = ref_fn(x.double(), dim)
                dy = torch.randn_like(x)
                for v in VARIANTS:
                    y = taken(lambda: fwd(x, dim, None, variant=v))
                    if y is None:
                        continue
                    check(f"{'log_' if log else ''}softmax {v} {shape} {dtype}", y, want, dtype)
                    # the backward caches two arrays: vec can take a forward row whose backward it cannot
                    dx = taken(lambda: bwd(dy, y, dim, dtype, variant=v))
                    if dx is None:
                        continue
                    check(f"{'log_' if log else ''}softmax_backward {v} {shape} {dtype}", dx,
                          softmax_backward_reference(dy, want, dim, log), dtype)


def shifted_cases(dtype):
    """16-bit forward rows whose input starts off the alignment by a different amount in each row (vec's input
    staged in shared memory and realigned; softmax_cases' misaligned dense rows of 1024 and 4104 take it at one
    shift): x[:, s:s + D] of [rows, s + D + pad], the last row's last chunk reaching past the storage where pad
    is 0."""
    for rows, d, start, pad in ((5, 4096, 1, 0), (3, 2056, 0, 3), (4, 8, 5, 0), (2, 32768, 7, 0)):
        base = torch.randn(rows, start + d + pad, device="cuda", dtype=dtype)
        x = base[:, start:start + d]
        for log in (False, True):
            fwd = ops.log_softmax if log else ops.softmax
            want = (torch.log_softmax if log else torch.softmax)(x.double(), -1)
            for v in ("auto", "vec"):
                check(f"{'log_' if log else ''}softmax shifted {v} [{rows}, {d}] of {start + d + pad} {dtype}",
                      fwd(x, -1, None, variant=v), want, dtype)


def fused_cast_cases(dtype, synccheck=False):
    """The dtype= cast of 16-bit rows into float, forward (vec's warp-paired float stores where a warp's units lie
    inside the row, plain in the warp holding its end and in the edge kernels: 264, 1000, 4096, 4104, 16384 and
    the odd 4095; long_row's clusters and the grid mode at 65544 and 262144) and backward (float grad_output and
    output into a 16-bit grad_input), every row variant. Under synccheck, not the auto and long_row plans that
    synccheck_cannot_run names, each direction on its own (a skipped forward hands torch's output to the backward).
    explain() does not see the cast: the forward's plan is the 16-bit one's (plan_cluster reads no output width);
    for the backward both the float and the 16-bit plans are read, and either one skips it."""
    for rows, d in ((5, 264), (3, 1000), (3, 4096), (2, 4104), (2, 16384), (3, 4095), (2, 65544), (2, 262144)):
        x = torch.randn(rows, d, device="cuda", dtype=dtype)
        for log in (False, True):
            fwd = ops.log_softmax if log else ops.softmax
            bwd = ops.log_softmax_backward if log else ops.softmax_backward
            torch_fwd = torch.log_softmax if log else torch.softmax
            want = torch_fwd(x.double(), -1)
            dy = torch.randn(rows, d, device="cuda", dtype=torch.float32)
            op = "log_softmax" if log else "softmax"
            skip_fwd = synccheck and synccheck_cannot_run(fastact.explain(op, x))
            skip_bwd = synccheck and any(synccheck_cannot_run(fastact.explain(op + "_backward", t))
                                         for t in (dy, dy.to(dtype)))
            for v in ("auto", "warp", "vec", "scalar", "long_row", "split", "grid"):
                cluster_plan = v in ("auto", "long_row")
                name = f"{'log_' if log else ''}softmax {v} [{rows}, {d}] {dtype} -> float32"
                if skip_fwd and cluster_plan:
                    y = torch_fwd(x, -1, dtype=torch.float32)
                else:
                    y = taken(lambda: fwd(x, -1, torch.float32, variant=v))
                    if y is None:
                        continue
                    check(name, y, want, torch.float32)
                if skip_bwd and cluster_plan:
                    continue
                dx = taken(lambda: bwd(dy, y, -1, dtype, variant=v))
                if dx is None:
                    continue
                check(name + " backward", dx, softmax_backward_reference(dy, want, -1, log), dtype)


def long_row_cases(dtype, synccheck=False):
    """long_row's clusters: the 128-bit forward that keeps part of each slice in shared memory
    (cp.async; 8 x 512 threads at 262144, the last CTA's slice partial at 262136, 8 x 256 at 131072; on a
    deep-memory device 16 x 256 in float, and the 16-bit rows past 131072 with the register part below; 16-bit
    rows of 2^20 and 2^19 + 8 with a register part as loaded besides, the last CTA of the latter with no slice),
    and the backward of rows of 262144 in the largest clusters (float: 16 CTAs of 1024 threads; the grid mode on a
    deep-memory device); its
    grid mode beyond a cluster (float rows of 2^20, and 2^20 + 1: 128-bit and element accesses). Under synccheck,
    not the plans synccheck_cannot_run names (16-bit rows of 2^20 and 2^19 + 8 forward; on a deep-memory device also
    the forwards of 262136 and 262144 in every dtype, over 16-CTA clusters)."""
    for rows, d in ((6, 262136), (3, 131072), (4, 262144), (3, 1 << 20), (2, (1 << 19) + 8), (2, (1 << 20) + 1)):
        x = torch.randn(rows, d, device="cuda", dtype=dtype)
        dy = torch.randn_like(x)
        for log in (False, True):
            fwd = ops.log_softmax if log else ops.softmax
            bwd = ops.log_softmax_backward if log else ops.softmax_backward
            want = (torch.log_softmax if log else torch.softmax)(x.double(), -1)
            name = "log_softmax" if log else "softmax"
            if synccheck and synccheck_cannot_run(fastact.explain(name, x)):
                continue
            y = fwd(x, -1, None, variant="long_row")
            check(f"{'log_' if log else ''}softmax long_row {rows}x{d} {dtype}", y, want, dtype)
            if d >= 262144 and not (synccheck and synccheck_cannot_run(fastact.explain(name + "_backward", y))):
                check(f"{'log_' if log else ''}softmax_backward long_row {rows}x{d} {dtype}",
                      bwd(dy, y, -1, dtype, variant="long_row"), softmax_backward_reference(dy, want, -1, log), dtype)


def staged_cases(dtype):
    """The strided staged mode (backwards of 2- and 4-byte elements, forwards of 16-bit ones; [265, 65, 131]
    dim 1: two tiles an outer index, 72 and 59 columns in 16-bit (forward: 2 thread groups a column), 68
    and 63 in float; forwards also at D = 120 and 900, 4 and 8 groups; 16-bit backwards at D = 257 and 600,
    the narrow tiles, 2 and 4 groups; backwards of 16-byte vectors off the 32-byte sector: float [264, 70, 300],
    2 groups, 16-bit inner 264 at D = 70, 100, 398, 400, 1 to 4 groups) with
    grad_output and output (x) off the 16-byte alignment, apart and together, and ending off it: the copies
    of the tensors' first and last chunks go element by element, inside the tensors."""
    shape, n = (265, 65, 131), 265 * 65 * 131
    x = torch.randn(shape, device="cuda", dtype=dtype)
    for log in (False, True):
        want = (torch.log_softmax if log else torch.softmax)(x.double(), 1)
        if dtype.itemsize == 2:
            fwd = ops.log_softmax if log else ops.softmax
            for offset in (0, 1, 3):
                xo = torch.empty(n + offset, device="cuda", dtype=dtype)[offset:].view(shape)
                xo.copy_(x)
                check(f"{'log_' if log else ''}softmax staged {offset} {dtype}", fwd(xo, 1, None), want, dtype)
            # 4 and 8 thread groups a column (2 above): 48 and 32 columns a tile
            for other in ((265, 120, 131), (60, 900, 131)):
                m = other[0] * other[1] * other[2]
                for offset in (0, 1):
                    xo = torch.randn(m + offset, device="cuda", dtype=dtype)[offset:].view(other)
                    check(f"{'log_' if log else ''}softmax staged {other} {offset} {dtype}", fwd(xo, 1, None),
                          (torch.log_softmax if log else torch.softmax)(xo.double(), 1), dtype)
        bwd = ops.log_softmax_backward if log else ops.softmax_backward
        for offsets in ((0, 0), (1, 0), (0, 3), (1, 1)):
            dy = torch.randn(n + offsets[0], device="cuda", dtype=dtype)[offsets[0]:].view(shape)
            y = torch.empty(n + offsets[1], device="cuda", dtype=dtype)[offsets[1]:].view(shape)
            y.copy_(want)
            check(f"{'log_' if log else ''}softmax_backward staged {offsets} {dtype}", bwd(dy, y, 1, dtype),
                  softmax_backward_reference(dy, y.double(), 1, log), dtype)
        if dtype.itemsize == 2:  # the narrow backward tiles: 2 and 4 thread groups a column
            for other in ((265, 257, 131), (60, 600, 131)):
                m = other[0] * other[1] * other[2]
                xs = torch.randn(other, device="cuda")
                for offsets in ((0, 0), (1, 3)):
                    dy = torch.randn(m + offsets[0], device="cuda", dtype=dtype)[offsets[0]:].view(other)
                    y = torch.empty(m + offsets[1], device="cuda", dtype=dtype)[offsets[1]:].view(other)
                    y.copy_(torch.log_softmax(xs, 1) if log else torch.softmax(xs, 1))
                    check(f"{'log_' if log else ''}softmax_backward staged {other} {offsets} {dtype}",
                          bwd(dy, y, 1, dtype), softmax_backward_reference(dy, y.double(), 1, log), dtype)
        # 16-byte vectors whose D-rows are not whole 32-byte sectors: float 64 x 2 groups; 16-bit 256 bytes x 1
        # group (D 70), 128 x 2 (D 100), 128 x 4 (D 398) and x 2 (D 400), the last two at the shared-memory bound
        vector_cases = ((264, 70, 264), (264, 100, 264), (100, 398, 264), (100, 400, 264))
        for other in ((264, 70, 300),) if dtype == torch.float32 else vector_cases:
            xs = torch.randn(other, device="cuda")
            dy = torch.randn(other, device="cuda", dtype=dtype)
            y = (torch.log_softmax(xs, 1) if log else torch.softmax(xs, 1)).to(dtype)
            check(f"{'log_' if log else ''}softmax_backward staged vector {other} {dtype}", bwd(dy, y, 1, dtype),
                  softmax_backward_reference(dy, y.double(), 1, log), dtype)


def prefetch_cases(dtype, synccheck=False, quick=False):
    """The cached strided forward that prefetches the tiles ahead into L2 (dispatch.h row strided-prefetch:
    inputs of at least the L2 size, float accumulation, D >= 8): dim 1 of [n, 1024, 2056] just past the L2
    size (the last tiles' counterparts ahead lie past the end and prefetch nothing) and dim 0 of [16384, m]
    (tiles over clusters of 16; not under synccheck, which stops on that forward as on the backward of
    SYNCCHECK_SKIPS, with the prefetch off as well, on the H100). A case whose plan is not cached
    (without clusters) is left out. On a deep-memory device the 16-bit dim-1 case runs in half lines without the
    prefetch (dispatch.h kStridedRawCtaThreads), checked all the same. 16-bit: also the long_row forward of rows of
    262144 in shared memory (dispatch.h row long-row-prefetch; the last rows' counterparts ahead lie past the end;
    on a deep-memory device with a register part as loaded besides, prefetched from four times the L2 size: the same
    row's deep entry)."""
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    deep = "memory depth deep" in fastact.explain("sigmoid", torch.randn(8, device="cuda"))
    cases = [((-(-l2 // (1024 * 2056 * dtype.itemsize)), 1024, 2056), 1)]
    if not synccheck:
        cases.append(((16384, -(-l2 // (16384 * dtype.itemsize * 8)) * 8), 0))
    for shape, dim in cases:
        x = torch.randn(shape, device="cuda", dtype=dtype)
        for log in (False, True):
            s = fastact.explain("log_softmax" if log else "softmax", x, dim)
            if ", cached" not in s:
                continue
            if "prefetched into L2" not in s and not (deep and dtype.itemsize == 2 and dim == 1):
                raise AssertionError(f"prefetch case {shape} {dtype}: {s}")
            want = (torch.log_softmax if log else torch.softmax)(x.double(), dim)
            check(f"{'log_' if log else ''}softmax prefetch {shape} {dtype}",
                  (ops.log_softmax if log else ops.softmax)(x, dim, None), want, dtype)
    if dtype.itemsize == 2:  # the long_row forward of 16-bit rows in shared memory (dispatch.h row long-row-prefetch)
        # On a deep-memory device these rows take the shape with a register part as loaded, prefetched from four
        # times the L2 size (dispatch.h row long-row-prefetch, deep): both sizes there, the smaller unprefetched (not
        # the larger under --quick, which sanitize.sh gives racecheck alone: the prefetch touches no shared memory,
        # and the smaller runs the same shared-memory code).
        for times in (1, 4) if deep and not quick else (1,):
            x = torch.randn(-(-times * l2 // (262144 * 2)), 262144, device="cuda", dtype=dtype)
            for log in (False, True):
                s = fastact.explain("log_softmax" if log else "softmax", x)
                if "in shared memory)" not in s or "global memory" in s:  # the cluster kernel only, not the grid mode
                    continue
                if synccheck and synccheck_cannot_run(s):  # deep: 16 x 128 CTAs that share SMs
                    continue
                if "prefetched into L2" not in s and not (deep and times == 1 and "the rest kept as loaded" in s):
                    raise AssertionError(f"long_row prefetch case {dtype}: {s}")
                want = (torch.log_softmax if log else torch.softmax)(x.double(), -1)
                check(f"{'log_' if log else ''}softmax long_row prefetch {tuple(x.shape)} {dtype}",
                      (ops.log_softmax if log else ops.softmax)(x, -1, None), want, dtype)
                del want
            del x


POINTWISE = [op for op in OPS if op.kind == "pointwise"]
BIAS = [op for op in OPS if op.kind == "bias"]


def check_pointwise(label, x, dy, dtype):
    """Every pointwise op of the table, at every value of its params, on x, and its backward with grad dy, against
    its torch twin in float64 (the backward: torch's derivative op at what the backward reads, x or fastact's y)."""
    for op in POINTWISE:
        for name, params in op.variants:
            y = getattr(fastact, op.name)(x, *params.values())
            check(f"{name} {label}", y, op.torch_fn(x.double(), **params), dtype)
            saved = y if op.saves == "output" else x
            want = op.torch_backward(dy.double(), saved.double(), **params)
            got = getattr(ops, op.backward)(dy, saved, *params.values())
            check(f"{op.backward} {name} {label}", got, want, dtype)


def check_bias(label, x, b, dy, dtype, variants=None):
    """Every bias op of the table (its default params, or each of its variants), forward and backward (dx and
    dbias), against float64 autograd of its pointwise twin of x + b."""
    for op in BIAS:
        f = BY_NAME[op.pointwise].torch_fn
        for name, params in (op.variants if variants == "all" else op.variants[:1]):
            xr, br = x.double().requires_grad_(), b.double().requires_grad_()
            want = f(xr + br, **params)
            check(f"{name} {label}", getattr(fastact, op.name)(x, b, *params.values()), want, dtype)
            gx, gb = torch.autograd.grad(want, (xr, br), dy.double())
            dx, db = getattr(ops, op.backward)(dy.contiguous(), x, b, *params.values())
            check(f"{op.backward} dx {name} {label}", dx, gx, dtype)
            check(f"{op.backward} dbias {name} {label}", db, gb, dtype)  # scaled by max |dbias|


def elementwise_cases(dtype):
    dev = "cuda"
    for n in (1, 7, 8, 9, 1000, 4099):
        for misaligned in (False, True):
            base = torch.randn(n + 1, device=dev, dtype=dtype)
            x = base[1:] if misaligned else base[:n]
            dy = torch.randn_like(x)
            check_pointwise(f"{n}", x, dy, dtype)
    # row views read in place (elementwise_rows_kernel): a chunk of the last dim (vector accesses where
    # the width divides the row) and x[:, 1:] (element accesses); the backward's dy a row view too. A thread's later
    # accesses step on by rows and columns (RowStep): 1032 columns wrap past one row end in 16-bit.
    for rows, cols in ((3, 8), (5, 33), (64, 1024), (9, 1032)):
        for view in ("chunk", "sliced"):
            base = torch.randn(rows, 2 * cols, device=dev, dtype=dtype)
            x = base[:, cols:] if view == "chunk" else base[:, 1 : cols + 1]
            dy = torch.randn(rows, 2 * cols, device=dev, dtype=dtype)[:, :cols]
            check_pointwise(f"{view} {rows}x{cols}", x, dy, dtype)
            b = torch.randn(cols, device=dev, dtype=dtype)
            check_bias(f"{view} {rows}x{cols}", x, b, dy, dtype)
    for rows, h in ((3, 8), (5, 33), (64, 1024), (1, 4100)):
        x = torch.randn(rows, h, device=dev, dtype=dtype)
        b = torch.randn(h, device=dev, dtype=dtype)
        dy = torch.randn_like(x)
        check_bias(f"{rows}x{h}", x, b, dy, dtype, variants="all")


def main():
    dtypes = [torch.float32, torch.bfloat16] if "--quick" in sys.argv else \
        [torch.float32, torch.float64, torch.float16, torch.bfloat16]
    synccheck = "--synccheck" in sys.argv
    for dtype in dtypes:
        softmax_cases(dtype, synccheck=synccheck)
        long_row_cases(dtype, synccheck=synccheck)
        if dtype.itemsize == 2:
            shifted_cases(dtype)
            fused_cast_cases(dtype, synccheck=synccheck)
        if dtype != torch.float64:
            prefetch_cases(dtype, synccheck=synccheck, quick="--quick" in sys.argv)
        if dtype.itemsize <= 4:
            staged_cases(dtype)
        elementwise_cases(dtype)
    torch.cuda.synchronize()
    print("sanitize_cases: all cases ran and matched torch")


if __name__ == "__main__":
    main()
