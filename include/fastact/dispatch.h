// The softmax dispatcher: which kernel variant (and which launch configuration) takes a softmax
// problem. Pure host C++ (no torch, no CUDA headers): a function of the problem's geometry, element
// sizes, pointer alignment and a few device properties. The kernels in include/fastact/softmax/ use
// the same constexpr helpers for their compile-time shapes, so host and device cannot disagree.
//
// The problem is softmax over D = dim_size of a tensor viewed as [outer, D, inner]:
//   inner == 1: rows of D contiguous elements; input row r starts at r * row_stride, outputs (and
//               every tensor of the backward) are dense (row stride D).
//   inner  > 1: columns of D elements at stride inner; every tensor dense [outer, D, inner].
//
// Variants (names are fixed: tests and benchmarks force them):
//   warp      inner == 1, D <= 1024 (512 for float64). A warp, or a power-of-two slice of one, per
//             row; several rows per warp for tiny rows; the row in registers with compile-time
//             indexing (templated on log2 of the padded row); shuffle reductions. 16-byte accesses
//             when aligned, element accesses otherwise. One HBM read.
//   vec       inner == 1, 16-byte aligned pointers, D and row_stride multiples of the vector width
//             (or D any length, the row stride equal to D modulo the width: each row's few elements
//             before its first and after its last aligned vector move one at a time, "edges"),
//             D <= one block's register cache (1024 threads x softmax_resident_elems: 32 forward
//             (16 float64); backward 16 float32, 32 16-bit, 8 float64). A block per row, 128-bit
//             loads/stores, the row in registers. One HBM read. The softmax backward of 16-bit rows of
//             2048-16384 instead reads dy and y twice, the second time from L1 / L2 (softmax_rows_two_pass).
//   scalar    inner == 1, anything: any alignment, any D, any row stride. A block per row with
//             element loads (coalesced across the block), the row in registers when it fits one
//             block (same capacity; 16 per thread for 16-bit backward); longer rows stream twice
//             (online max+sum, then write).
//   long_row  inner == 1, any D. sm_90 with clusters: the row split over a thread-block cluster
//             (2..16 CTAs), each CTA caching its slice in registers, the max and sum combined through
//             distributed shared memory: one HBM read. Rows with edges as `vec`. 16-bit forwards
//             keep the register cache as loaded (64 elements a thread). Forwards with 128-bit
//             accesses (no edges) and float arithmetic may instead keep part of each thread's slice
//             in shared memory, as loaded, so a CTA holds twice the elements and long rows run at
//             two or more CTAs per SM (softmax/long_row.cuh). Without clusters, beyond what a
//             cluster can cache, or for a backward whose cluster CTAs would run one an SM
//             (cluster_backward_yields_to_grid): the grid scheme below, where the caller provides a
//             workspace (the torch ops do) and the device's SMs can cache the row; else the split scheme.
//   grid      inner == 1, rows the device's SMs cache (added variant; long_row's mode beyond a cluster,
//             forceable for tests). The row over 2..sm_count CTAs anywhere on the device, each caching
//             its slice as long_row's clusters do (registers, and shared memory in the forwards with
//             128-bit accesses and float arithmetic); the (max, sum) partials meet in a zeroed
//             workspace in global memory (softmax_workspace_bytes): one HBM read, one launch.
//   split     inner == 1, any D (added variant; long_row's fallback, forceable for tests). Online
//             max+sum per chunk of a row, then one write pass: two reads, one write, never three.
//             Several CTAs per row when rows are few (two kernels; the per-chunk partials are parked
//             in the output's own memory, so no workspace), and rows grouped so that the second read
//             hits L2.
//   strided   inner > 1. Threads along the contiguous inner dim (16-byte vectors of inner when
//             aligned), several threads splitting D with a shared-memory combine, the tile of
//             columns cached in registers (one HBM read; on sm_90 a cluster splits long D), or
//             streamed twice when D is too long to cache (each tile's D split over a cluster where
//             the tiles alone leave the device short of threads; where even that does, D cut into
//             chunks, a CTA each, partials through the caller's workspace: the split mode). Backwards
//             of element accesses at short D (and 16-bit forwards, and 128-bit backwards whose D-rows
//             start off a 32-byte sector) instead copy each tile's D-rows to
//             shared memory in aligned 16-byte chunks and reduce each column there, over a thread or a
//             few thread groups (the staged mode). No transposing copy.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <string_view>

#include "fastact/memory_depth.h"

namespace fastact {

enum class SoftmaxVariant : int { kAuto = 0, kWarp, kVec, kScalar, kLongRow, kStrided, kSplit, kGrid };

inline constexpr int kNumSoftmaxVariants = 8;

inline const char* softmax_variant_name(SoftmaxVariant v) {
  switch (v) {
    case SoftmaxVariant::kAuto: return "auto";
    case SoftmaxVariant::kWarp: return "warp";
    case SoftmaxVariant::kVec: return "vec";
    case SoftmaxVariant::kScalar: return "scalar";
    case SoftmaxVariant::kLongRow: return "long_row";
    case SoftmaxVariant::kStrided: return "strided";
    case SoftmaxVariant::kSplit: return "split";
    case SoftmaxVariant::kGrid: return "grid";
  }
  return "?";
}

// "auto, warp, vec, scalar, long_row, strided, split, grid": for error messages.
inline const char* softmax_variant_names() { return "auto, warp, vec, scalar, long_row, strided, split, grid"; }

// false for an unknown name (the caller reports softmax_variant_names()).
inline bool softmax_variant_from_name(std::string_view name, SoftmaxVariant* out) {
  for (int i = 0; i < kNumSoftmaxVariants; ++i) {
    const auto v = static_cast<SoftmaxVariant>(i);
    if (name == softmax_variant_name(v)) {
      *out = v;
      return true;
    }
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// Compile-time shapes shared by host and device.

namespace softmax_detail {
constexpr int cmin(int a, int b) { return a < b ? a : b; }
constexpr int cmax(int a, int b) { return a > b ? a : b; }
}  // namespace softmax_detail

// Elements per 128-bit access, set by the narrower of the two element types (forward: input and
// output; backward: grad_input and grad_output/output), so the narrow tensor moves in 16-byte
// accesses and the wide one in 32-byte pairs: 4 float, 8 half/bfloat16 (also half in, float out), 2 double.
// (block.cuh's forward of aligned 16-bit rows into float swaps halves between lanes so that its float stores are
// whole 512-byte runs where a warp's units lie inside the row: WarpPairedStores.)
constexpr int softmax_vec_width(int in_bytes, int out_bytes) {
  return 16 / softmax_detail::cmin(in_bytes, out_bytes);
}

// Register bytes per thread for the cached row (block, cluster and strided kernels): 128 = 32
// registers. Why: at 1024 threads per block a thread has at most 64 registers; half hold the data,
// the rest addresses, the exp temporaries and the reductions (-Xptxas -v: the float32 / 16-bit row
// kernels do not spill; float64 and a few strided configurations spill a few dozen bytes to L1).
constexpr int kResidentRegBytes = 128;

// Elements per thread those kernels cache, for accesses of `vec` elements. Forward: accumulation
// values (exp(x - max) for softmax, so exp runs once per element), 4 or 8 bytes each. Backward:
// grad_output and output as loaded (raw, converted on use), two arrays; 16-bit elements pack two to a
// register in 128-bit vectors but take a register each with element accesses.
constexpr int softmax_resident_elems(bool backward, int vec, int out_bytes, int acc_bytes) {
  return backward ? kResidentRegBytes / (2 * (vec > 1 ? out_bytes : (out_bytes > 4 ? out_bytes : 4)))
                  : kResidentRegBytes / acc_bytes;
}

// Whether the long_row cluster forward keeps its register cache as loaded rather than converted to
// the accumulation type: 16-bit inputs in 128-bit accesses, float arithmetic. Why: the float cache
// holds 32 elements a thread, so a 16-bit CTA has half the bytes in flight that a float one has at the
// same registers, and its bandwidth follows the bytes in flight (H100, bench/NOTES.md thirteenth
// session: bf16 rows of 20000-65536 at 0.83-0.95 of the limit where float ran at 0.98). Kept as
// loaded, a thread caches 64 elements in the same 32 registers; softmax then computes exp twice per
// element (sum, then output), log_softmax nothing extra, as the warp and strided raw forwards.
constexpr bool softmax_resident_raw(bool backward, int vec, int in_bytes, int acc_bytes) {
  return !backward && vec > 1 && vec * in_bytes == 16 && in_bytes < acc_bytes;
}
// Elements a thread of that forward caches: kResidentRegBytes of loaded vectors.
constexpr int softmax_resident_raw_elems(int in_bytes) { return kResidentRegBytes / in_bytes; }

// Whether the strided forward caches its D-rows as loaded (16-bit inputs in 128-bit accesses) rather
// than converted to the accumulation type. Why: a raw 16-bit row takes half the registers, so a thread
// caches twice the D-rows and a tile needs half the threads (or half the cluster): on the H100 the
// converted bf16 cache ran at 0.51-0.56 of the limit (cluster 4) against float's 0.84 (cluster 2).
// Softmax then computes exp twice per element (sum, then output), log_softmax nothing extra.
constexpr bool softmax_strided_raw(bool backward, int vec, int in_bytes, int acc_bytes) {
  return !backward && vec > 1 && in_bytes < acc_bytes;
}

// Bytes of one value of the strided kernel's column all-reduce (ColumnScratch): (max, sum) pairs in
// the forward's streaming mode and in every float forward (one exchange of pairs, strided.cuh), else one
// accumulation value (the backward's sums; the float64 cached forward's max and then sum).
constexpr int softmax_strided_value_bytes(bool backward, bool streaming, int acc_bytes) {
  return !backward && (streaming || acc_bytes == 4) ? 2 * acc_bytes : acc_bytes;
}

// D-rows a thread of the strided kernel caches: the resident elements over the access width (raw
// 16-bit rows: kResidentRegBytes of loaded vectors); with element accesses half of them. Why: one-
// element loads down a column each need their own 64-bit address, and 32 of them do not fit the 64
// registers a 1024-thread block allows (ptxas spilled).
constexpr int softmax_strided_rows(bool backward, int vec, int in_bytes, int out_bytes, int acc_bytes) {
  return softmax_strided_raw(backward, vec, in_bytes, acc_bytes)
             ? kResidentRegBytes / (vec * in_bytes)
             : (vec > 1 ? softmax_resident_elems(backward, vec, out_bytes, acc_bytes) / vec
                        : softmax_resident_elems(backward, vec, out_bytes, acc_bytes) / 2);
}

// Accesses in flight per thread and array in the strided kernel's streaming loops: 64 bytes of
// registers per array (value_bytes: register bytes per element), at most 8. Why: four 16-byte float
// loads, as in `split`, without spilling the wide (double, or float written as half) cases; element
// accesses stop at 8 (each needs its own 64-bit address).
constexpr int softmax_stream_unroll(int vec, int value_bytes) {
  return 64 / (vec * value_bytes) > 8 ? 8 : (64 / (vec * value_bytes) > 1 ? 64 / (vec * value_bytes) : 1);
}

// Whether the warp forward keeps its rows as loaded rather than converted to the accumulation type:
// 16-bit inputs in 128-bit accesses where a lane reads several vectors (rows of 512 and 1024, and the packed rows
// of softmax_warp_packed: four accesses a lane). Why:
// half the registers (ptxas: 56 -> 32 at rows of 1024, so 16 blocks of 128 threads fit an SM instead
// of 9); softmax then computes exp twice per element, as the strided forward does. H100, 256 MB
// (bench/NOTES.md tenth session): softmax / log_softmax bf16 and f16 at 1024 183.6-183.8 -> 182.3-182.6
// us, torch.compile 182.2-182.3.
constexpr bool softmax_warp_raw(int vecs_per_lane, int vec, int in_bytes, int acc_bytes) {
  return vecs_per_lane > 1 && vec > 1 && in_bytes < acc_bytes && vec * in_bytes == 16;
}

// The warp kernel: rows up to this many elements. Why: the row lives in one warp's registers, 32
// accumulation values per lane at 1024 (64 for the backward's two arrays); beyond that a block per row
// spreads the registers over more threads and keeps more loads in flight per row. float64 halves it
// (two registers per value).
constexpr int kWarpMaxDim = 1024;
constexpr int softmax_warp_max_dim(int acc_bytes) { return acc_bytes == 8 ? kWarpMaxDim / 2 : kWarpMaxDim; }

// Threads per block of the warp kernel: 4 warps (but kWarpSmallBlockThreads for the forwards of
// softmax_warp_small_blocks). Why: small blocks let the scheduler fill an SM with up to 16 of them
// (2048 threads) and keep the tail of the grid short.
constexpr int kWarpBlockThreads = 128;
// The warp forward's smaller blocks (softmax_warp_small_blocks): 2 warps.
constexpr int kWarpSmallBlockThreads = 64;

// Whether the warp forward has a kernel of kWarpSmallBlockThreads threads for padded rows of 2^log2_elems elements
// accessed `vec` at a time, in_bytes in and out_bytes out: 16-bit in and out, 128-bit rows of 128 units padded (rows
// of 1024: a lane holds four accesses). launch.cuh instantiates these alone, and the dispatcher plans no others.
constexpr bool softmax_warp_small_blockable(int log2_elems, int vec, int in_bytes, int out_bytes) {
  return in_bytes == 2 && out_bytes == 2 && vec > 1 && (1 << log2_elems) / vec >= 128;
}

// 128-bit accesses per lane the warp kernel aims at (more where a row needs them: a row never spans
// more than a warp), forward and backward. Why 1: sweeps of lanes per row at D = 128 on the H100
// (bench/NOTES.md, sixth and ninth sessions), 256 MB tensors, in one process: float forward 183.5 us
// at 4 accesses (8 lanes a row), 181.5-181.8 at 2, 181.1-181.3 at 1 (torch 182.2-183.1); bf16
// forward 185.7 at 2, 182.9 at 1 (plain loads: softmax/warp.cuh); float backward 269.5 /
// 266.7-267.0 / 266.4-266.8; 16-bit backward 269.1 at 4, 267.7-269.2 at 2, 266.8-267.0 at 1 (the
// bench, against torch.compile's 266.9-268.1). More lanes a row cost more shuffles, but fewer
// accesses a lane let more rows start their loads at once.
constexpr int kWarpMinAccesses = 1;

// Elements a lane aims at in the warp kernel with element accesses: 8, but 4 in the backwards of float rows and of
// 16-bit rows of up to 16 (padded). Fewer elements a lane spread a row over more lanes, so each warp-wide load
// spans fewer rows and fewer sectors. Why (H100, 256 MB, us, 8 / 4 elements a lane, diag/wv, bench/NOTES.md
// thirty-first session): float log_softmax backward D = 5 348.2 / 265.3, 10 308.7 / 265.3, 33 283.0 / 264.3, 77
// 289.2 / 265.3 (torch 294.0, 290.6, 265.4, 267.8), softmax backward D = 5 315.7 / 265.1; bf16 log_softmax
// backward D = 5 483.8 / 290.2, 10 378.2 / 291.0, softmax backward D = 10 333.0 / 290.3. Not elsewhere: bf16
// backwards at D = 33 and 77 tie or lose (softmax 303.7 / 314.1, 285.0 / 295.2), forwards lose (bf16 D = 5 193.3 /
// 258.4), float64 was not measured. Rows of 256 and more hold 8 a lane whatever this says (a row spans one warp).
constexpr int softmax_warp_element_lane(bool backward, int out_bytes, int log2_elems) {
  return backward && (out_bytes == 4 || (out_bytes == 2 && log2_elems <= 4)) ? 4 : 8;
}

// 128-bit accesses a lane in the warp forward's packed plan (softmax_warp_packed): four, so that a lane holds three of
// a row of 24 units (float D = 96) or 12 (16-bit D = 96), and a warp four or eight such rows.
constexpr int kWarpPackedAccesses = 4;

// Whether the warp forward has a packed kernel for padded rows of 2^log2_elems elements accessed `vec` at a time: with
// 128-bit accesses, 4 to 32 units padded (below that kWarpPackedAccesses would not fit a row; above it a row fills the
// warp's lanes whatever its length). launch.cuh instantiates these, and the dispatcher plans only these.
constexpr bool softmax_warp_packable(int log2_elems, int vec) {
  return vec > 1 && (1 << log2_elems) / vec >= kWarpPackedAccesses && (1 << log2_elems) / vec <= 32;
}

// Per-lane work of the warp kernel for a padded row of 2^log2_elems elements accessed `vec` at a
// time: at least kWarpMinAccesses vectors (kWarpPackedAccesses where `packed`), or softmax_warp_element_lane
// elements with element access, and never fewer than elems / 32 (a row never spans more than a warp). out_bytes: the
// forward's output element, the backward's grad_output and output element.
constexpr int softmax_warp_elems_per_thread(int log2_elems, int vec, bool backward, int out_bytes, bool packed) {
  const int accesses = packed ? kWarpPackedAccesses : kWarpMinAccesses;
  const int aim = vec > 1 ? accesses * vec : softmax_warp_element_lane(backward, out_bytes, log2_elems);
  return softmax_detail::cmax((1 << log2_elems) / 32, softmax_detail::cmin(1 << log2_elems, aim));
}

// ---------------------------------------------------------------------------------------------
// Thresholds (each with why).

// Largest block of the resident kernels: the hardware limit.
constexpr int kResidentMaxThreads = 1024;
// With clusters available, `vec` stops at 512 threads per row and longer rows go to long_row.
// Why: a 1024-thread block owns all of an SM's registers, so nothing overlaps its load -> reduce ->
// store phases; two 512-thread CTAs of a cluster per SM interleave those phases (one loads while the
// other reduces or stores).
constexpr int kVecMaxThreadsWithClusters = 512;
// On a kDeep device (memory_depth.h: the H200) the 16-bit forward of aligned rows stops vec at 320 threads
// (D <= 10240), and long_row's clusters of two take the longer rows (softmax_vec_max_threads). Why (H200, 256 MB,
// bf16, us, seven rounds of bench/repro/softmax_bwd_plans_diag.py, bench/NOTES.md fiftieth session; vec -> long_row
// forced, torch.compile): D = 12288 164.2 -> 134.7 (294.1), 14336 157.1 -> 142.1 (288.9), 16384 150.3 -> 132.9
// (287.6), log_softmax 12288 166.3 -> 131.1, 16384 153.2 -> 132.2, float16 12288 162.9 -> 132.8; vec kept: 8192
// 139.0 against 154.9, 10240 146.5 against 152.0. The float forward keeps vec to 512 threads (16384: 132.7, long_row
// 133.5).
constexpr int kDeepVecForward16MaxThreads = 320;
// vec: 128-bit accesses a thread aims for (forward; backward, each of grad_output and output), fewer
// than its register cache holds, where that keeps a row within kVecMaxThreadsWithClusters threads.
// Why (H100, 256 MB, bench/NOTES.md fifth session): float forward at 4096 with 8 accesses a thread
// (128 threads) 184.7 us, with 4 (256 threads) 182.2; at 8192 184.5 -> 182.9; backward at 4096 with
// 4 accesses an array 267.4 -> 265.0 with 2 (float), bf16 267.8 -> 265.7. Fewer than that lost: bf16
// forward at 4096 with 2 accesses 182.3 -> 234.9, float with 2 at 2048 182.0 -> 227.5; 1024-thread
// rows lost everywhere (f32 forward at 16384: 187.1 -> 195.3).
constexpr int kVecForwardAccesses = 4;
constexpr int kVecBackwardAccesses = 2;
// long_row cluster CTAs, in the order tried: the smallest whose cluster the device fills (clusters of
// 16 count only where they hold >= 90% of the CTAs, or, on a deep-memory device, for the shared-memory kernel's
// small CTAs (kDeepClusterWideThreads); else only as the last resort before the two-read mode: plan_cluster).
// Why small first: more CTAs per SM overlap each other's load, reduce and store phases; on the H100, 8 x 256
// beat 4 x 512 at rows of 65536 (f32 205.0 vs 207.9 us, bf16 230.7 vs 239.2) and 4 x 512 beat 2 x 1024 (207.9
// vs 223.9, 239.2 vs 256.3). The backward starts at 512: its 4 x 512 and 8 x 512 clusters already run at 1.0 of
// the limit, and 256 was not measured there.
constexpr int kClusterThreads[] = {256, 512, kResidentMaxThreads};
constexpr int kClusterBackwardMinThreads = 512;
// long_row backward of 128-bit accesses, 2- or 4-byte grad_output and grad_input of the same type (the fused
// 16-bit grad_input's grid CTAs keep no shared memory; not measured): a 16-CTA cluster of CTAs too large for two an
// SM (more threads than cluster_backward_two_cta_threads: SoftmaxProblem::bwd_two_cta_threads, probed from the
// registers the compiler gave block.cuh's backward for these types and epilogue: nvcc 13.0 for sm_90 gives 53-56 in
// float (576 threads), 60 in 16-bit softmax and 57 in bf16 log_softmax (512), 55 in f16 log_softmax (576); without
// the probe, those of nvcc 13.0 by element size) but short of kResidentMaxThreads gives way
// to the grid mode, whose CTAs (at most kGridBwdSmemMaxThreads, part of the slice in shared memory) run two an SM.
// Such a cluster holds one CTA on each of 16 SMs with no other CTA there to overlap its load, reduce and store
// phases. Why (H100, 256 MB, us, softmax / log_softmax; bench/NOTES.md twenty-eighth session): the cluster plan
// against the grid variant forced, f32 rows of 151936 (16 x 608 threads) 288.1 / 314.4 -> 279.1 / 277.2, 163840
// (640) 284.9 / 309.1 -> 279.7 / 278.0, 200000 (800) 279.1 / 296.3 -> 279.5 / 278.1; bf16 270336 (16 x 544) 307.9 /
// 301.7 -> 276.7 / 278.1, 300000 (608) 300.8 / 294.9 -> 280.9 / 281.3; and the op before and after, f16 300000 (16
// x 608) 298.6 / 296.4 -> 281.5 / 281.3. The cluster stays where two CTAs fit (f32 140000, 16 x 576: 266.6 / 266.5
// against 280.0 / 278.4; f16 log_softmax 270336, 16 x 544: 266.0 against 277.9), at 1024 threads (f32 262144: 279.7
// / 276.4 against 280.1 / 278.6), and in 8-CTA clusters, which ran near the limit at 576-992 threads (f32 100000, 8
// x 800: 268.6 / 272.9 against 280.0 / 277.9 in the grid; bf16 200000, 8 x 800: 268.8 / 267.2 against 277.5 /
// 277.8).
// The two-CTA size where the probe is missing (a SoftmaxProblem built without it, or a query that failed): nvcc
// 13.0's for sm_90 by element size, as the rule took it before the probe.
constexpr int block_backward_two_cta_threads_unprobed(int out_bytes) { return out_bytes == 4 ? 576 : 512; }
inline int cluster_backward_two_cta_threads(int probed, int out_bytes) {
  return probed > 0 ? probed : block_backward_two_cta_threads_unprobed(out_bytes);
}
// long_row forward, 128-bit accesses, float arithmetic (softmax_cluster_smem_eligible): besides its
// registers a thread keeps kClusterSmemBytes of its slice in dynamic shared memory, as loaded
// (cp.async), so a CTA of at most kClusterSmemMaxThreads threads caches what a register-only CTA of
// twice the threads does, and rows beyond 8 x 256 x 32 elements run at two or more CTAs per SM
// instead of the one 1024-thread CTA that has nobody on its SM to overlap its phases with. Tried after
// the register-only 256-thread clusters (plan_cluster), small CTAs first. Why (H100, 256 MB,
// bench/NOTES.md tenth session; fraction of torch's copy in the same process): f32 262144 0.876 ->
// 0.956-0.968 (8 x 512; 16 x 256 0.976-0.989 where 16-wide clusters are allowed), 524288 0.795 ->
// 0.934 (16 x 512); bf16 262144 0.883 -> 0.928-0.938, 524288 0.784 -> 0.899, 131072 0.854 -> 0.941
// (8 x 256). At 65536 the register-only 8 x 256 stays ahead (f32 0.987 vs 0.983, bf16 0.950 vs 0.944).
constexpr int kClusterSmemBytes = 128;
constexpr int kClusterSmemMaxThreads = 512;
// Elements a thread of that kernel keeps in registers: 32-bit inputs the register cache (32 floats),
// 16-bit inputs none: all 64 elements raw in shared memory, exp computed twice. Why: the float cache
// takes a 16-bit CTA to 64 registers (two 512-thread CTAs per SM, against three at 40 registers):
// bf16 262144 0.906-0.916 against 0.928-0.938, 524288 0.824 against 0.899.
constexpr int softmax_cluster_smem_reg_elems(int in_bytes, int acc_bytes) {
  return in_bytes < acc_bytes ? 0 : kResidentRegBytes / acc_bytes;
}
// ... and in shared memory.
constexpr int softmax_cluster_smem_elems(int in_bytes) { return kClusterSmemBytes / in_bytes; }
// Which forwards that kernel takes: accesses whose input moves in 16-byte units (cp.async), float
// arithmetic.
constexpr bool softmax_cluster_smem_supported(int vec, int in_bytes, int acc_bytes) {
  return vec > 1 && vec * in_bytes == 16 && acc_bytes == 4;
}
// Whether that kernel also keeps a register part as loaded (softmax_resident_raw_elems, besides its shared-memory
// part) for 16-bit rows longer than the shared-memory part alone covers in a cluster (16 x 512 x 64 = 2^19):
// 128 elements a thread, 16 x 512 x 128 = 2^20, two CTAs an SM (on a deep-memory device, from 131072 on, before
// the shared-memory-only shapes: kDeepClusterWideThreads; the cast into float past 262144:
// long_row_deep_shapes). Tried after every other cluster shape at every cluster size (plan_cluster), so shorter
// rows keep theirs. Why: such rows otherwise leave the cluster
// for the grid mode (partials through global memory), which ran the H100's bf16 rows of 2^20 at 0.85-0.86 of
// the limit (wide report, bench/NOTES.md forty-seventh session); a cluster slice of 256 bytes a thread is the
// float [128, 524288] forward's (16 x 512, 32 registers and 32 in shared memory), which runs at 0.94. Measured
// there: 0.917-0.918. Without 16-CTA clusters (FASTACT_MAX_CLUSTER=8) the shape takes rows of 2^18-2^19 in
// 8-CTA clusters from the grid mode: not measured.
constexpr bool softmax_cluster_smem_raw_regs(bool backward, int vec, int in_bytes, int acc_bytes) {
  return softmax_cluster_smem_supported(vec, in_bytes, acc_bytes) && softmax_resident_raw(backward, vec, in_bytes,
                                                                                          acc_bytes);
}
// long_row forward in that kernel, 16-bit inputs (the slice all in shared memory): each thread asks L2 for the
// units its counterpart (the same thread of the same cluster rank) in the row this many rows on will load, the
// clusters the device runs at once over kLongRowPrefetchDivisor (as the strided forward's,
// kStridedPrefetchDivisor), once its own loads are out (long_row_prefetches says where). Why (H100,
// bench/NOTES.md thirty-fourth session, prefetch on against off, CUDA graphs): 256 MB bf16 rows of 151936 /
// 262144 / 524288 1.046 / 1.039 / 1.061x (f16 1.043 / 1.037 / 1.062x), 64 MB 1.022-1.059x; a whole resident
// count ahead lost 23-26% (256 MB), a half -12% to +3%, an eighth 1.01-1.04x. Not float inputs, whose slice is
// half in registers: 0.95-1.00x at a quarter or an eighth, less nearer; not the grid mode (rows of 2^20: 16-bit
// 1.02-1.03x at 256 MB but 0.94-0.95x at 64 MB; float and the backwards 0.85-0.93x); not inputs under the L2
// size (the strided rule's reason); not the 16-bit shape with a register part (softmax_cluster_smem_raw_regs: H100,
// report timing, two rounds each, bench/NOTES.md forty-seventh session: bf16 [128, 2^20] softmax 193.3 against
// 197.1 us, but log_softmax 202.0 against 197.4, 0.896 of the limit; [32, 2^20], 64 MB, 0.87-0.94x in a diag),
// except on a deep-memory device (kDeepRawPrefetchL2Multiple). There no 16-bit row up to 2^20 takes that kernel
// without a register part (kDeepClusterWideThreads), but for the cast into float to 262144 (long_row_deep_shapes),
// which takes the shared-memory-only shape and its prefetch as a standard device does.
constexpr int kLongRowPrefetchDivisor = 4;
// On a deep-memory device the 16-bit shape with a register part as loaded (softmax_cluster_smem_raw_regs) prefetches
// the rows ahead as the shared-memory-only one does, on inputs of at least this many times the L2 size. Why (H200,
// forced prefetch on against off at the dispatcher's plans, 4-5 rounds of CUDA events, bench/NOTES.md fifty-fourth
// session), us: 256 MB bf16 rows of 163840 (8 x 160) 141.3 -> 139.6, 262144 (16 x 128) 140.9 -> 140.3 (log_softmax
// 141.8 -> 138.7), 393216 log_softmax (16 x 192) 143.0 -> 142.6, 524288 (16 x 256) 152.6 -> 145.3; 1 GB of rows of
// 262144 538.9 -> 525.4; level within 0.5% at 139264 / 196608 (8 x 160 / 8 x 192) and f16 2^20 (16 x 512). Smaller
// inputs lose: 64 MB (rows of 262144 / 163840) 43.4 / 43.3 -> 44.6 / 44.1; 128 MB is level (75.2 -> 75.0).
constexpr int kDeepRawPrefetchL2Multiple = 4;
// long_row forward on a deep-memory device (memory_depth.h), the shared-memory cluster kernel (plan_cluster):
// - its CTAs of at most kDeepClusterWideThreads threads take clusters of 16 in the first pass. The probe's
//   wide_cluster_threads asks about CTAs of 512 and 1024 threads, whose 16-CTA clusters leave the H200's SMs idle;
//   smaller CTAs share SMs.
// - 16-bit rows past the register-only portable clusters (8 x 256 x 64 = 131072 elements) take the shape with a
//   register part as loaded (softmax_cluster_smem_raw_regs: 128 elements a thread; large inputs prefetched,
//   kDeepRawPrefetchL2Multiple), at the fewest threads of kDeepClusterRawThreads, before the shapes with shared
//   memory alone; a CTA at least kDeepClusterRawMinThreads threads with work. Those of up to
//   kDeepClusterWideThreads threads count clusters of 16 in the first pass (the 512-thread ones, rows past 2^19,
//   stay a last resort where wide_cluster_threads is 0).
// Why (H200, 256 MB, us, softmax unless named; session 53's diag of forced plans, bench/NOTES.md fifty-third
// session), the plan before -> after:
// - f32 8 x (D / 512) -> 16 x (D / 1024) threads (shared memory): 163840 137.3 -> 137.0, 196608 143.3 -> 136.8,
//   log_softmax 229376 142.1 -> 138.9, [256, 262144] 145.4 / 145.4 -> 142.9 / 144.0 (softmax / log_softmax);
// - bf16 8 (16 past 262144) CTAs in shared memory, prefetched -> the register part: 139264 8 x 288 157.0 -> 8 x 160
//   151.2, 163840 151.8 -> 8 x 160 143.3 (log_softmax 144.6 -> 141.2), 196608 152.0 -> 8 x 192 143.7 (f16 147.3 ->
//   141.7), [512, 262144] 161.7 / 154.7 -> 16 x 128 145.5 / 146.4 (8 x 256 148.3 / 146.9; f16 159.0 -> 144.5),
//   393216 16 x 384 162.4 -> 16 x 192 148.3 (log_softmax 155.6 -> 147.4), 524288 16 x 512 176.0 -> 16 x 256 153.6.
//   CTAs of 96 threads lost: 16 x 96 at 139264 / 163840 / 196608 ran 188.9 / 168.3 / 152.2.
// The forward of 16-bit rows into float (the dtype= cast) plans its clusters as a standard device does, up to
// rows of 262144 (long_row_deep_shapes): the shapes with a register part as loaded store their floats plain
// (long_row.cuh: with warp-paired stores ptxas spilled there), while the shared-memory-only shapes pair them
// (block.cuh WarpPairedStores). Why (H200, 256 MB of input, us, bench/repro/softmax_plans_ab.py, the deep class against
// FASTACT_MEMORY_DEPTH=standard, bench/NOTES.md fifty-sixth session): bf16 log_softmax [512, 262144] 16 x 128 with a
// register part 321.1, 8 x 512 in shared memory 215.3; softmax [1024, 131072] 204.2 in both (8 x 256 registers
// as loaded, paired); the register part's rows [883, 151936] 253.4 and [512, 262144] 309.7 against 202-204 for the
// paired shapes at 32768-131072.
constexpr int kDeepClusterWideThreads = 256;
constexpr int kDeepClusterRawThreads[] = {128, 256, 512};
constexpr int kDeepClusterRawMinThreads = 128;
// Portable cluster size limit; 16 needs the non-portable attribute and a device that schedules it
// (the CUDA side probes cudaOccupancyMaxActiveClusters: max_cluster, wide_cluster_threads).
constexpr int kMaxPortableCluster = 8;
constexpr int kMaxCluster = 16;

// split: threads per CTA and 16-byte (or element) accesses in flight per thread per iteration.
// Why: 256 threads x 4 x 16 B = 16 KB in flight per CTA, 8 CTAs per SM: far above the ~20 KB per SM
// that hides HBM latency at full bandwidth.
constexpr int kSplitThreads = 256;
constexpr int kSplitUnroll = 4;
// split: aim for this many CTAs per SM in each launch. Why: enough independent CTAs that every SM
// streams, and the tail of the grid is a small fraction.
constexpr int kSplitCtasPerSm = 4;
// split: a chunk is at least this many elements. Why: below that a CTA spends more time on its
// reductions and partial-combining than on streaming (8 elements per thread at 256 threads).
constexpr int64_t kSplitMinChunk = 2048;
// split: at most this many chunks per row. Why: every write-pass CTA reads all K partials of its
// row, and each stats CTA writes its partial K times (the parking scheme), so K^2 grows fast.
constexpr int64_t kSplitMaxChunks = 64;
// split: the rows of one (stats, write) launch pair read at most L2 / kL2ReuseDivisor bytes, so that
// the write pass re-reads them from L2, not HBM. Why a third: the output written meanwhile and the
// L2's two partitions leave roughly that much for reuse.
constexpr int kL2ReuseDivisor = 3;
// split: at most this many launch pairs per call. Why: each launch costs ~2-4 us of launch gap; past
// that, bigger groups (less L2 reuse) are cheaper than more launches.
constexpr int64_t kSplitMaxGroups = 128;
// Bytes of the parked partial of one chunk: a (max, sum) pair of the accumulation type, padded to 16.
constexpr int kSplitSlotBytes = 16;

// grid: threads per CTA, in the order tried (the first whose CTAs, at most sm_count of them, cache the
// row). Why 512 first: two CTAs an SM overlap each other's load, reduce and store phases, as in
// long_row's clusters (kVecMaxThreadsWithClusters). The forwards that keep part of the slice in shared
// memory stop at kClusterSmemMaxThreads.
constexpr int kGridThreads[] = {512, 1024};
// grid backward with 16-byte units of grad_output / output: besides its registers
// (softmax_resident_elems) a thread keeps kGridBwdSmemBytes of its slice of the two, as loaded, in
// dynamic shared memory (cp.async), in CTAs of at most kGridBwdSmemMaxThreads threads. Why (H100, rows
// of 524288 and 1048576, registers only: 0.79 of the limit): a row's CTAs wait for each other once, and
// the wait leaves HBM idle; more of the row a CTA, fewer CTAs and waits. 192 bytes x 512 threads is 96 KB
// a CTA, two CTAs an SM (of its 227 KB), as the register part (64 registers) allows.
constexpr int kGridBwdSmemBytes = 192;
constexpr int kGridBwdSmemMaxThreads = 512;
// Elements of each of grad_output and output a thread of that backward keeps in shared memory (0: the
// backward keeps registers only: element accesses, or units that are not 16 bytes).
constexpr int softmax_grid_bwd_smem_elems(int vec, int out_bytes) {
  return vec > 1 && vec * out_bytes == 16 ? kGridBwdSmemBytes / 2 / out_bytes : 0;
}

// Blocks per launch at most (every softmax kernel). The row kernels launch again for the rest (each
// takes the index of its first work item); the grid mode, one ticket space, takes at most this many
// CTAs (plan_grid). Below 2^31 - 1 and a multiple of every cluster size.
constexpr int64_t kMaxGridBlocks = int64_t(1) << 30;
// grid: how long a CTA waits for the rest of its row before it gives up and leaves its part of the
// output to the launch's last CTA (softmax/grid.cuh). Why a bound: other kernels running at the same
// time (other streams; other processes under MPS) may hold the SMs that the row's missing CTAs need
// and wait themselves. Why 4 ms: a row's CTAs start within microseconds of each other when the device
// is theirs, and a device time-sliced between processes switches every few milliseconds at most.
// FASTACT_GRID_WAIT_US overrides it (tests set 0: every CTA that would wait gives up).
constexpr int64_t kGridWaitNs = 4000000;

// The zeroed workspace of a grid plan: a 16-byte header (the task ticket, 8 bytes; the count of CTAs
// finished and of CTAs that gave up, 4 bytes each), one arrival counter per row (4 bytes; the array
// padded to 16), one 16-byte slot per (row, CTA) for the partials, and the list of the tasks (row *
// CTAs + rank, 4 bytes each) whose CTA gave up.
struct SoftmaxGridWorkspace {
  int64_t arrived = 0;    // byte offset of the counters
  int64_t slots = 0;      // byte offset of the slots
  int64_t gave_up = 0;    // byte offset of the list
  int64_t bytes = 0;      // total
};
inline SoftmaxGridWorkspace softmax_grid_workspace(int64_t rows, int64_t ctas) {
  SoftmaxGridWorkspace w;
  w.arrived = 16;
  w.slots = w.arrived + (rows * 4 + 15) / 16 * 16;
  w.gave_up = w.slots + rows * ctas * 16;
  w.bytes = w.gave_up + rows * ctas * 4;
  return w;
}

// strided: contiguous bytes of one D-row that a block's threads read side by side: a 128-byte line.
// Why: smaller pieces waste DRAM bursts; larger ones leave fewer threads to split D.
constexpr int kStridedRowBytes = 128;
constexpr int kStridedMaxThreads = 1024;
// strided: for short D, widen the tile (more columns) until a block has this many threads.
// Why: tiny blocks cap the resident threads per SM at 32 blocks x 32 threads.
constexpr int kStridedMinThreads = 128;
// strided forward of 4-byte inputs in element accesses, short D, inner of at least a whole 128-byte
// line: widen to this many threads instead. Why (H100, f32 [*, D, 1023] and [*, D, 49] dim 1, forced
// shapes, fraction of the limit, each on three allocations of the tensor; bench/NOTES.md nineteenth
// session): one 128-byte line a D-row in small CTAs ran at 0.63-0.78 (inner 1023, D = 32 / 48 / 64 /
// 128: 128 x 64 0.78, 96 x 32 0.69, 128 x 32 0.68, 256 x 32 0.68) or between 0.69 and 0.89 with where
// the tensor lay (D = 100, 224 x 32); widened to 512 threads (2-16 lines a D-row) 0.87-0.95 on every
// allocation (512 x 256 0.94, 384 x 128 0.89, 512 x 128 0.92, 512 x 64 0.90, D = 100 448 x 64 0.87);
// inner 49 0.62-0.86 -> 0.65-0.95 (0.65: one allocation at D = 128). Not for narrower inners: inner 3
// lost (D = 100 0.78-0.84 -> 0.39) and inner 13 was mixed (D = 32 0.87 -> 0.81, D = 128 0.67 -> 0.82).
constexpr int kStridedMinFloatElementThreads = 512;
// strided, D too long to cache: threads per block of the streaming (two-read) mode. With clusters, a
// streamed launch whose CTAs (one a tile) would hold fewer threads than the device does
// (sm_count x kSmMaxThreads) splits each tile's D over a cluster: the smallest that fills the device, at
// most cluster_cap (strided_stream_cluster; 8 at 512 threads on the H100). Why (H100, dim 0 of tall
// matrices, 8-32 tiles, each plan forced on the same tensors, two allocations, fraction of the limit;
// bench/NOTES.md twentieth session): f32 [65536, 1024] forward 0.32 -> 0.47-0.52, backward 0.47 ->
// 0.54; bf16 [65536, 2048] 0.17 -> 0.41-0.44 / 0.43 -> 0.53; f32 [262144, 256] 0.09 -> 0.48 / 0.17
// -> 0.57. Where the tiles already half fill the device (f32 [8, 40000, 1024] dim 1, 256 tiles:
// cluster 4) within 2% of no cluster. Those dim-0 shapes, whose cluster still leaves the device short,
// now take the split mode below where the caller provides a workspace (the torch ops do); the cluster
// serves where it fills the device ([8, 40000, 1024]) and callers without a workspace.
constexpr int kStridedStreamThreads = 512;
// strided, streamed, where even the cluster of strided_stream_cluster leaves the device short of threads
// (a few tiles of a very long D: dim 0 of [1048576, 64]) and the caller provides a workspace: the split
// mode, D cut into chunks of at least kStridedSplitMinRows rows a D-group, a CTA each, as many as fill
// the device kStridedSplitWaves times (strided_split_chunks). Why (H100, twentieth session, each plan
// forced on the same tensors, two allocations, fraction of the limit): f32 [1048576, 64] dim 0 (2
// tiles) streamed over a cluster of 8 0.18 -> split 0.45-0.56 forward (256 chunks; 1024: 0.39-0.47,
// 2048: 0.22), 0.31 -> 0.55 backward; [4194304, 16] 0.10 -> 0.56-0.59; bf16 [1048576, 128] 0.09 -> 0.35-
// 0.39 (512 chunks; 1024: 0.22); [2000000, 33] (element accesses) 0.05 -> 0.22; f32 [65536, 1024] (32
// tiles) 0.47-0.52 -> 0.53-0.57 forward, 0.53 -> 0.55 backward; [262144, 256] (8 tiles) 0.47-0.49 ->
// 0.46-0.56 forward, 0.56-0.57 -> 0.53-0.54 backward. The best counts came to one or two fills of the
// device: each apply CTA folds all of its tile's partials, so more chunks cost L2 traffic.
// strided, with clusters available: a tile needing more than 512 threads is split over a cluster.
// Why: as kVecMaxThreadsWithClusters (two CTAs per SM overlap each other's reductions).
constexpr int kStridedClusterAbove = 512;
// strided: before splitting a tile over a cluster, try half a line (64 bytes of each D-row) in one
// CTA of at most kStridedClusterAbove threads. Why (H100, [32, 1024, 2048] dim 1, forward): the
// cluster's barriers cost more than the narrower line: float 8 columns x 512 threads x cluster 2
// 220 us -> 4 columns x 512 threads 201 us (0.82 -> 0.90 of the limit), bf16 147 -> 117 us; one
// 1024-thread CTA of 8 columns was in between (210 / 144 us) and 32-byte pieces lost again
// (2 columns: 234 / 125 us). bench/NOTES.md, fifth session. With the push exchange instead of the
// barrier (seventh session) the full line in a cluster caught up but did not win for bf16 (512 x 8 x 2:
// 119 us against 108); float gained 2.5% at 128 threads x 8 columns x cluster 8 (196 against 201),
// so the half line stays. Only where clusters exist (sm_90), the case measured: without them a tile
// that needs more than 1024 threads streams, as before.
constexpr int kStridedMinRowBytes = 64;
// strided: the narrowest lines a tile takes, measured on the H100 with the kernel at forced shapes
// (threads x columns x cluster, fraction of the limit; bench/NOTES.md, seventeenth session).
// - Forwards with element accesses (inner not a multiple of the vector width) halve their line while
//   that keeps the tile in one CTA, down to kStridedMinElementColumns columns (half a warp a D-row), or
//   to kStridedMinRowBytes where that is narrower (float64, as for vectors); with clusters only:
//   [510, 257, 1023] bf16 dim 1 288 x 16 x 1 (16 columns, 32 bytes) 0.504 against 288 x 32 x 2 0.446
//   and the whole line 320 x 64 x 4 0.385; float [255, 257, 1023] 288 x 16 x 1 (64 bytes) 0.75-0.80.
//   Not 8 columns: float [127, 513, 1023] 288 x 8 x 1 0.507 against 288 x 32 x 4 0.690.
// - Tiles whose D is too long for a line's tile in the clusters tried first (dim 0 of a tall matrix)
//   narrow over the largest cluster the device runs (16 on the H100), CTAs of kStridedClusterAbove
//   threads, down to kStridedSectorBytes (and kStridedMinElementColumns), before streaming: dim 0 of
//   [16384, 4096] f32 / [16384, 8192] bf16, forward 512 x 4 x 16 0.748 / 0.711 against streaming's
//   0.611 / 0.559; backward 512 x 2 x 16 0.657 / 0.667 against 0.569 / 0.573.
constexpr int kStridedMinElementColumns = 16;
// strided backward with element accesses, streamed (strided_element_stream_shape): each thread's share
// of its column, in bytes of grad_output (and as many of output), that the launch shape aims at; CTAs
// of kStridedElementStreamThreads. Why (H100, [*, D, 1023] dim 1, forced streaming shapes threads x
// columns, fraction of the limit; bench/NOTES.md seventeenth session): the best shape's share was
// 50-88 bytes at every D, ~64 at most, and at equal shares the columns nearer 32 won: float D = 257
// 512 x 32 (68 bytes) 0.853, 400 1024 x 32 (52) 0.770 against 512 x 16 (52) 0.755, 513 1024 x 32
// (68) 0.808 against 512 x 16 0.745, 700 1024 x 32 (88) 0.778 against 512 x 16 0.659, 1000 1024 x 16
// (64) 0.723 against 1024 x 32 (128) 0.562; bf16 257 512 x 64 (66) 0.609, 400 512 x 32 (50) 0.548
// against 1024 x 64 (50) 0.464, 700 512 x 32 (88) 0.538 against 1024 x 64 0.500, 1000 1024 x 32 (64)
// 0.523 against 512 x 16 0.485, 2000 1024 x 16 (64) 0.468. The whole line in 512 threads (the rule
// before) ran float D = 513 at 0.544, 700 at 0.515; at float D = 2000 no shape fits L2 and the cached
// plan (0.512) beats streaming (1024 x 16, 128 bytes: below 0.47). This rule against the one before,
// on the H100 (nineteenth session): float D = 400 / 513 / 700 / 1000 / 1400 0.70 / 0.54 / 0.52 / 0.58
// / 0.48 -> 0.77 / 0.81 / 0.76 / 0.73 / 0.65; bf16 513 / 1000 / 2000 0.50 / 0.35 / 0.40 -> 0.60 / 0.53
// / 0.47; float64 513 0.53 -> 0.85; float [*, 1600, 13] 0.46 -> 0.70.
// With clusters the same share may also come from splitting D over a cluster (each CTA streams its
// slice): shapes without a cluster first, so a cluster is taken only where it comes strictly closer
// to the target or to 32 columns. H100, twentieth session, each plan forced on the same tensors, two
// allocations: float [65, 1000, 1023] 1024 x 16 x 1 (64 bytes, 0.72) -> 512 x 32 x 4 (64 bytes,
// 0.77-0.78); [46, 1400, 1023] 1024 x 16 x 1 (88 bytes, 0.65) -> 512 x 32 x 4 (88 bytes, 0.73); [33,
// 2000, 1023], cached before (no shape without a cluster fits L2), 512 x 32 x 16 cached 0.53 -> 512 x
// 32 x 8 0.72-0.73; bf16 [65, 2000, 1023] 1024 x 16 x 1 (126 bytes, 0.48) -> 512 x 32 x 4 (64 bytes,
// 0.51-0.57); float64 [21, 1500, 1023] cached 0.71-0.78 -> 512 x 16 x 8 0.75.
// Short D (twenty-fourth session): element backwards whose inner holds a whole line stream at every D
// where a shape fits L2, not only where the cached tile needs more than one CTA; shapes without a cluster
// also try CTAs of kStridedElementStreamWideThreads threads and columns up to two lines
// (kStridedElementStreamWideLines). Why (H100,
// [*, D, 1023] dim 1, 805 MB moved, every cached and streamed shape forced on the same tensors, µs; the
// plan before -> the plan now (the best shape where another); torch.compile): float D = 64 256 x 32
// cached 316.8 -> 256 x 64 303.0 (345.0); D = 100 416 x 32 cached 383.3 -> 256 x 32 311.4 (281.0); D =
// 160 512 x 32 streamed 368.9 -> 256 x 32 324.1 (512 x 64 316.5; 306.0); bf16 D = 64 512 x 64 cached
// 495.2 -> 256 x 128 381.8 (292.8); D = 100 512 x 64 streamed 511.7 -> 256 x 64 443.3 (256 x 128 415.7,
// a share past the L2 bound; 371.8); D = 160 512 x 64 streamed 462.0 -> 256 x 64 381.0 (558.7); D = 257
// 512 x 64 streamed 419.1 -> 256 x 32 396.8 (447.8). The best cached shape lost to the best streamed
// one at every D measured (64 to 257, both dtypes), by 4-27%.
constexpr int kStridedElementStreamBytes = 64;
constexpr int kStridedElementStreamThreads[] = {512, 1024};
constexpr int kStridedElementStreamWideThreads = 256;  // tried first, without a cluster
constexpr int kStridedElementStreamWideLines = 2;
// ... for D of at least this many rows (the shortest measured), 2- and 4-byte elements (float64 not
// measured): shorter D keeps the cached plans, whose one read then holds few rows a thread. Measured on
// the H100 only; other devices (and clusters turned off) take the same shapes by the same L2 bound.
constexpr int64_t kStridedElementStreamMinRows = 64;
// strided forward of 16-bit inputs with element accesses whose tile of kStridedMinElementColumns
// columns needs more than one CTA: those 16 columns over the smallest cluster whose CTAs hold at most
// this many threads, instead of the whole line over a cluster. Why (H100, bf16 [*, D, 1023] dim 1,
// forced shapes, µs; twenty-fourth session): D = 513 64 x 320 x 8 (the plan before) 483.5 -> 16 x 288
// x 2 404.2 (16 x 160 x 4 426.7; torch.compile 449.3); D = 700 64 x 384 x 8 490.2 -> 16 x 192 x 4
// 382.8 (16 x 352 x 2 411.1; torch.compile 436.5). The bound sits between the two measured optima
// (288 and 192 threads) and the shapes that lost (352, 160). Clusters of up to 8 (longer D keeps the
// line over a cluster). The rule's plans in the report's timing (bench/results/*-s24-strided-*): D =
// 513 403.8, 700 383.3, and, not in the sweep, 1000 436.6 -> 354.5 (16 x 256 x 4), 2000 506.2 -> 379.1
// (16 x 256 x 8); torch.compile 450.0, 436.2, 570.4, 535.3.
constexpr int kStridedElementClusterThreads = 320;
constexpr int kStridedSplitMinRows = 16;
constexpr int kStridedSplitWaves = 1;
// strided, streamed (and split): where a line does not divide an outer index's column vectors and
// those are at most kStridedWholeOuterUnits, a tile is all of them (not a power of two: softmax/
// strided.cuh's AnyColumns) in kStridedStreamThreads threads (the threads past the last whole D-group
// idle), so that the tile's D-rows lie end to end and its D-groups read one contiguous run. With
// lines, the tile past the last whole line holds the rest (dim 0 of [N, 33]: a tile of 1 column, a
// 32-byte sector per 4-byte element) and misaligned lines touch an extra sector. Why (H100, forced
// shapes, fraction of the limit; bench/NOTES.md, twenty-first session): dim 0 f32 [2000000, 33] split
// 512 x 32 0.22 -> 512 x 33 0.46 (bwd 0.24 -> 0.48; torch.compile 0.34), bf16 0.14 -> 0.33, f32
// [1000000, 100] (25 vectors) 0.29 -> 0.53, [4000000, 3] 0.18 -> 0.43, [1000000, 65] 0.24 -> 0.44,
// [8000000, 7] 0.19 -> 0.47; dim 1 of f32 [4, 65536, 33] 0.29 -> 0.40 (bwd 0.31 -> 0.46). Two outer
// indices a tile (66 columns) ran at 0.33. Cached plans keep lines: there whole outer indices won at
// [10240, 512, 13] (0.57 -> 0.70) but lost at inner 49 and 1023.
constexpr int kStridedWholeOuterUnits = 128;
// Threads an SM holds at most: 2048 on sm_80 and sm_90 (fewer elsewhere, which only makes the L2 check
// of strided_element_stream_shape stricter).
constexpr int kSmMaxThreads = 2048;
constexpr int kStridedSectorBytes = 32;
// strided forward with raw 16-bit rows (softmax_strided_raw), clusters available: whole lines, CTAs of
// at most kStridedRawCtaThreads threads, and clusters of the smallest CTAs first
// (kStridedRawClusterThreads). Why (H100, bf16 [*, D, 2048] dim 1, the one-exchange raw forward of the
// eleventh session, forced shapes, fraction of torch's copy in one process; bench/NOTES.md): D = 256:
// 128 x 4 x 1 0.940 -> 256 x 8 x 1 0.965; 512: 256 x 4 x 1 0.938, 512 x 8 x 1 0.953 -> 256 x 8 x 2
// 0.965; 1024: 512 x 4 x 1 0.915, 512 x 8 x 2 0.938 -> 256 x 8 x 4 0.956; 2048: 256 x 4 x 4 0.903 ->
// 256 x 8 x 8 0.938; 4096: 256 x 4 x 8 0.883, 256 x 8 x 16 0.878 (log_softmax 0.902). With the
// earlier kernel (a max exchange, then a sum exchange) half lines had won at every D (tenth session).
// float keeps the half-line rule above (kStridedMinRowBytes).
constexpr int kStridedRawCtaThreads = 256;
constexpr int kStridedRawClusterThreads[] = {256, kStridedClusterAbove, kStridedMaxThreads};
// strided cached forward of vector accesses on a deep-memory device (memory_depth.h; strided_deep_forward):
// - float accumulation from float inputs (not raw) takes the raw rows' shapes above (whole lines, CTAs of at
//   most kStridedRawCtaThreads, clusters of the smallest CTAs first), not float's own rule (CTAs of up to 512
//   threads, half lines where a whole one would need a cluster);
// - raw 16-bit rows whose whole line needs more than one CTA of kStridedRawCtaThreads take half lines
//   (kStridedMinRowBytes) where those fit a cluster of at most kMaxPortableCluster such CTAs (D <= 4096, the
//   range measured), and then no L2 prefetch.
// Why (H200, [32, 1024, 2048] dim 1, the plans forced in one process, µs, fraction of the limit; bench/NOTES.md
// fifty-second session): f32 softmax 512 x 4 cols x 1 prefetched (the plan before) 157.6 (0.82), without the
// prefetch 146.9; whole lines 256 x 8 x 4 133.4 (0.97), 128 x 8 x 8 133.4, 512 x 8 x 2 134.8, 1024 x 8 x 1 140.8;
// log_softmax alike (157.9 -> 133.7). bf16 (the tensor half as large: a copy of its bytes reaches ~0.88 of the
// limit): 256 x 8 x 4 prefetched (the plan before) 86.2 (0.75), without the prefetch 84.4; half lines 256 x 4 x 2
// 84.1 prefetched, 79.3 (0.82) without; log_softmax 84.5 -> 77.5. The prefetch lost in every bf16 plan tried
// (0.5-10%) and gained 1-1.5% in float's whole lines, as on the H100 (thirty-third session).
// strided forward, cached mode: each thread asks L2 for the D-rows its counterpart in the tile this many
// tiles on will load: the tiles the device runs at once over kStridedPrefetchDivisor (softmax/strided.cuh
// strided_prefetch_ahead). Why (H100, 256 MB, distances forced as multiples of the resident tiles, fraction
// of the limit, bench/NOTES.md thirty-third session): a quarter, 0 -> 1/4: dim 0 of f32 [16384, 4096]
// 0.751 -> 0.807, bf16 [16384, 8192] 0.727 -> 0.770; [32, 1024, 2048] dim 1 f32 0.902 -> 0.926 (bf16 0.953
// -> 0.949); f32 [262, 1000, 256] 0.918 -> 0.932; bf16 [8192, 16, 1024] 0.945 -> 0.957; the cells at the
// limit 0.986-0.991 -> 0.996-0.998. A whole resident count ahead lost 25-30% everywhere (0.99 -> 0.72: the
// lines were gone from L2 before their loads), a half 0-3% where the quarter gained, an eighth less than the
// quarter. Only where it paid (strided_prefetches; prefetch on against off over 232 cached forwards of 8, 64
// and 256 MB, four dtypes): inputs of at least the L2 size (8 MB: 0.86-1.15, geometric mean 0.97-0.99, the
// repeated calls' input already in L2), float accumulation (float64 0.998-1.000), D >= kStridedPrefetchMinRows
// (D = 3 lost 3-5% in 16-bit, [*, 3, 50176]; D = 4, dim 0 of [4, n], gained 1-2%; D = 5 to 7 were not
// measured: 8 keeps a margin above the loss). Those cells: geometric mean 1.017 over 96, dim 0 of
// [1000, 16777] / [16384, 4096] f32 1.07-1.09, the lowest 0.947 (log_softmax f32 [1337, 64, 196], its softmax
// 0.981). Not in the backward: no gain at any distance, and dim 0 of [16384, 4096] lost 19% at every one. Not with
// element accesses (thirty-fourth session, on against off, f32 dim 1 of D = 64-1000 over inner 1023 / 197 / 49):
// geometric mean 0.978 at 256 MB, 0.964 at 64 MB, D = 257 down to 0.82; only D = 700 gained (1.01-1.05).
constexpr int kStridedPrefetchDivisor = 4;
constexpr int64_t kStridedPrefetchMinRows = 8;
// strided: dynamic shared memory per block (reduction buffers): stays under the default 48 KB.
constexpr int kStridedMaxSmem = 48 * 1024;
// strided backward, staged mode (softmax/staged.cuh): element backwards of 2- or 4-byte grad_output at
// short D copy each tile's D-rows to shared memory in aligned 16-byte chunks (cp.async: all of a tile's
// loads in flight at once, holding no registers) and reduce a column a thread from there: one HBM read,
// no exchange between threads. The modes before: the cached one holds few D-rows a thread and exchanges
// partial dots through shared memory; the streamed one reads twice (ncu, bf16 [2050, 64, 1023]: 30.9 M L2
// read sectors for 537 MB, DRAM at 62%); a one-pass kernel of element loads into registers (a diag
// sweep of rows x threads x D-groups) at best 309.7 us there, 64 registers and half occupancy, where
// torch.compile's (40 registers) took 290.1 with L2 at 98% of its throughput and DRAM at 82%. The
// copies do not cut L2 sectors (25.7 M against torch.compile's 24.9 M: a warp's element loads of an
// unaligned D-row touch half again as many sectors as they use, and so, measured, do the chunk
// copies), but the prototype ran at L2 89%, DRAM 81%, 290.75 us. The tile: the widest power of two of
// columns whose D-row segment is at most kStridedStagedRowBytes and at least kStridedStagedMinRowBytes
// (not past the inner's largest power of two), within kStridedStagedMaxSmem for both arrays (two CTAs
// an SM on the H100's 228 KB), then evened out over the inner (strided_staged_shape), in CTAs of
// kStridedStagedThreads; from kStridedStagedMinRows rows, where the tiles fill two
// CTAs an SM. Why (H100, [*, D, 1023] dim 1, 805 MB moved, a prototype of this kernel at forced tiles on
// the same tensors, µs; the plan before (streamed, strided_element_stream_shape) -> staged at the tile
// this rule picks; torch.compile; twenty-fifth session): float D = 64 303.2 -> 282.8 (128 columns;
// 347.8); D = 100 311.6 -> 287.8 (128; 280.0); D = 160 325.0 -> 303.9 (64; 309.7); bf16 D = 64 383.0 ->
// 293.0 (256; 292.8); D = 100 443.7 -> 298.3 (256; 372.4); D = 160 380.9 -> 310.2 (128; 539.2). The
// library's kernel, same tensors: float D = 100 291.0, D = 160 303.9; bf16 D = 64 290.1, D = 160 309.0.
// Wider tiles lost or tied (one CTA an SM: bf16 D = 160 256 columns 366.3, float D = 64 256 columns
// 293.1, float D = 100 289.2), narrower ones lost (more partial chunks: float D = 100 64 columns 319.1);
// 128-thread CTAs by 0-8%; staging grad_input through shared memory for 16-byte stores by 4-30% (a
// second barrier, and the write pass after it). At D = 257 (past the shared-memory bound even at 256
// bytes a D-row) the streamed plan wins (bf16 393.9 against 453.3 staged, float 323.7 against 441.5).
// Measured on the H100 only, so sm_90 only.
constexpr int kStridedStagedThreads = 256;
constexpr int kStridedStagedChunkBytes = 16;  // a cp.async copy, and the alignment the copies start from
constexpr int kStridedStagedRowBytes = 512;
constexpr int kStridedStagedMinRowBytes = 256;
constexpr int kStridedStagedMaxSmem = 113 * 1024;
constexpr int64_t kStridedStagedMinRows = 64;
constexpr int kStridedStagedCtasPerSm = 2;
// strided backward, staged mode, 16-bit grad_output past the tiles above (D > 212 in bf16: no tile of
// kStridedStagedMinRowBytes a D-row fits): the first of these narrower tiles whose two arrays and the groups'
// partial dots fit kStridedStagedMaxSmem, its columns split over thread groups (softmax/staged.cuh; as the
// forward). 128 bytes a D-row and 2 groups up to D = 400 in bf16, 64 bytes and 4, 2, 1 groups up to 723. Why
// (H100, bf16 [*, D, inner] dim 1, 805 MB moved, this kernel at forced tiles against the plan before, the
// streamed one, µs at inner 1023 / 300 / 2500; twenty-seventh session): D = 213 128 x 2 groups 344.7 / 318.1
// / 319.8 against 427.4 / 432.7 / 429.3; D = 257 380.9 / 341.6 / 342.0 against 395.8 / 399.2 / 393.8; D = 300
// 326.0 / 324.5 / 315.6 against 393.4 / 396.0 / 390.5; D = 400 325.3 / 325.3 / 324.6 against 481.4 / 479.5 /
// 476.0; D = 500 64 x 4 355.8 / 352.4 / 348.2 against 429.8 / 427.4 / 427.7; D = 700 374.9 / 355.0 / 354.7
// against 442.1 / 446.0 / 437.7; D = 721 64 x 2 382.1 / 398.3 / 385.5 against 504.1 / 504.8 / 511.2. The best
// shape at single points was up to 12% faster (D = 257: 64 x 1 at inner 300, 32 x 8 at 1023) but no other
// held at every inner. Within the tiles above, groups gained 0-4% at D = 160 and lost at 64-100 and 212:
// those keep one (the vector float backward's 2 groups: kStridedStagedVecBackwardColumns). Float past its
// tiles: staged lost to the streamed plan (D = 257, 700: 329.5 / 364.5
// against 319.4 / 344.1).
struct StagedBackwardShape {
  int row_bytes;
  int groups;
};
// A staged tile by D (kStridedStagedVec16BackwardShapes, kStridedStagedForwardShapes).
struct StagedTileByDim {
  int max_dim;  // for D up to this
  int row_bytes;
  int groups;
};
// The first row of `table` that takes D = dim, or null past its last.
template <size_t N>
constexpr const StagedTileByDim* staged_tile_by_dim(const StagedTileByDim (&table)[N], int64_t dim) {
  for (const StagedTileByDim& t : table)
    if (dim <= t.max_dim) return &t;
  return nullptr;
}
constexpr StagedBackwardShape kStridedStagedNarrowBackwardShapes[] = {{128, 2}, {64, 4}, {64, 2}, {64, 1}};
// strided backward, staged mode for 128-bit float columns (vector-aligned, inner a multiple of 4; float grad_input too:
// the fused 16-bit grad_input was not measured) whose D-rows start in the middle of a 32-byte sector (inner x 4 bytes
// not a multiple of kStridedSectorBytes): the cached vector plan's 128-byte line of a D-row then touches five sectors
// for four, and the staged copies of wider tiles (256 bytes a D-row) waste less of them. One shape:
// kStridedStagedVecBackwardColumns with 2 groups, up to the D that fits kStridedStagedMaxSmem (D = 211). Why (H100, f32
// [*, D, inner] dim 1, 805 MB moved; twenty-eighth session): a sweep of the staged kernel at forced tiles against the
// cached plan (64 x 2 among the best at D = 64-160, inners 300 and 2500), then this rule against the plan before (the
// op, both builds in one run, µs, softmax / log_softmax): inner 300 D = 64 300.4 / 317.0 -> 280.0 / 280.7, D = 128
// 308.8 / 303.3 -> 280.7 / 280.6, D = 160 295.2 / 294.4 -> 280.9 / 280.4, D = 211 292.5 / 287.3 -> 285.3 / 284.6; inner
// 2500 D = 64 299.4 / 302.2 -> 274.6 / 275.0, D = 128 297.9 / 287.9 -> 275.2 / 274.9; inner 1020 D = 64 308.2 / 293.0
// -> 276.2 / 275.7; inner 4100 D = 128 290.8 / 291.6 -> 273.2 / 272.8. Where the D-rows start on a sector, though off
// the line (inner 1000: 4000 bytes), the cached plan runs at 0.99 of the limit and staged tiles lost 1.5-2.6% at every
// D of 64-144 (twenty-ninth session, softmax, 273.5-274.8 against 278.3-280.9); at the other inners of that sweep (300,
// 1020, 2500, 4100) they won by 0.5-11% at every D. Where the D-rows are whole lines (inner 1024, 4096) the cached plan
// runs at 0.99-1.0 of the limit and staged tiles lost 1-2% in the sweep; at D = 212 (past this tile; 32 columns fit)
// the plan won or tied (inner 300: 286.1 against 290.8). 16-bit: the table below.
constexpr int64_t kStridedStagedVecBackwardColumns = 64;
constexpr int kStridedStagedVecBackwardGroups = 2;
// The same for 16-bit columns (2-byte grad_output and grad_input, inner = 8 mod 16): the tile's D-row bytes and groups
// by D; past the last D the cached plan. Why (H100, bf16 [*, D, inner] dim 1, softmax, 805 MB moved, twenty-ninth
// session: the staged kernel at forced tiles against the op's cached plan at inners 264, 520, 1000, 2056, D 64-300,
// us): D = 64 256 bytes x 1 group 285.6 / 277.1 / 279.5 / 277.6 against 322.8 / 310.2 / 310.7 / 302.6; D = 96 128 x 2
// 287.2 / 278.8 / 282.3 / 278.6 against 310.7 / 298.3 / 291.1 / 285.4; D = 128 287.8 / 291.1 / 287.7 / 289.2 against
// 321.0 / 294.4 / 304.0 / 304.8. Then the rule through the op against the plan before (both builds in one run,
// softmax): D = 64 -> 299.1 / 297.3 / 280.2 / 277.9 against 323.9 / 313.0 / 307.9 / 301.5, D = 80 304.1 / 306.5 / 278.6
// / 277.7 against 314.4 / 307.2 / 302.6 / 287.9, D = 96 288.6 / 279.0 / 283.5 / 279.5 against 312.4 / 306.1 / 292.5 /
// 298.0, D = 128 298.7 / 289.2 / 289.5 / 291.1 against 324.1 / 310.2 / 307.1 / 293.3 (log_softmax and float16 alike).
// At D = 160 it lost 5-8% at inners 264 and 2056 (the op evens inner 264 into 56-column tiles; the sweep's 64-column
// tiles ran 288.2 there), so the table stops at 128. At D = 212 the plan (448 threads) won by 1-2.7% but at 264. At
// inner 1008 (whole sectors) the plan runs at 0.99 and every staged tile lost. Past D = 128 (a second sweep, the op's
// evened tiles, us at the four inners): D = 136-256 the plan held or the tiles split (D = 200: plan 291.8 / 281.9 /
// 280.8 / 280.1, best tile 286.4 / 284.4 / 283.3 / 280.7); at D = 300 the cached plan drops to 4 columns and 128 bytes
// x 4 groups won at every inner (297.7 / 290.3 / 288.2 / 287.3 against 330.9 / 315.5 / 305.9 / 303.5), and x 2 groups
// where 4 no longer fit (D = 400: 303.6 / 291.3 / 300.0 / 292.3 against 312.5 / 307.0 / 306.7 / 306.1). Through the op
// against the plan before (softmax, both builds in one run): D = 300 296.6 / 290.7 / 289.4 / 287.4 against 331.7 /
// 324.2 / 312.9 / 304.9 (log_softmax and float16 alike), D = 350 294.9 / 295.3 / 294.0 / 292.2 against 306.6 / 299.9 /
// 297.1 / 294.2, D = 398 302.6 / 296.3 / 297.8 / 295.4 against 320.6 / 312.3 / 304.6 / 309.7, D = 400 304.9 / 291.6 /
// 299.1 / 294.1 against 319.5 / 313.5 / 309.1 / 312.3; but D = 257 lost 2-6% (338.3 / 311.3 / 307.4 / 309.7 against
// 318.5 / 299.6 / 301.0 / 295.8), so the cached plan keeps D up to 299 (257-299 not measured between). (A row of 0
// bytes: the cached plan; 398 and 400: the largest D whose tile of 4 and 2 groups fits kStridedStagedMaxSmem.)
constexpr StagedTileByDim kStridedStagedVec16BackwardShapes[] = {
    {95, 256, 1}, {128, 128, 2}, {299, 0, 0}, {398, 128, 4}, {400, 128, 2}};
// strided forward, staged mode: the same copies of x's D-rows (one array), then G thread groups a column
// fold every G-th D-row each into a running (max, sum) from shared memory, combine the G pairs there and
// write the outputs (softmax/staged.cuh). For 16-bit x and y only: element loads of 2 bytes move 64 bytes
// a warp instruction, and the cached plans reach about half the limit there (float's cached plans run at
// 0.66-0.89 of it, and a sweep of this kernel gained 5% at best, D = 257-400). The tile (D-row bytes and
// groups): measured, kStridedStagedForwardShapes up to D = 256; past it the widest of 256, 128, 64 bytes a
// D-row whose tile fits kStridedStagedForwardMaxSmem (two CTAs an SM), G = kStridedStagedThreads / columns.
// Why: the kernel is bound by issue and memory latency by turns, and which tile overlaps them best
// varies with D by up to 40% in no monotone way; the table holds the shape that was fastest, or within 4%
// of it, at every inner tried. H100, bf16 [*, D, inner] dim 1, 537 MB moved, this kernel at forced tiles,
// us at inner 1023 / 300 / 2500 (777 for D = 80, 128, 200, 300), then the next best; twenty-seventh session:
//   D = 64: 128 columns x 2 groups 221.8 / 255.8 / 224.8 (128 x 1 235.7 / 272.3 / 240.4; 256 x 1 249.6);
//   D = 80: 64 x 2 236.6 / 246.1 (128 x 2 266.4 / 229.9);
//   D = 100: 64 x 2 231.3 / 242.7 / 232.7 (256 x 1 254.6 / 288.5 / 254.2);
//   D = 128: 64 x 4 233.7 / 242.5 (256 x 1 247.4 / 265.2);
//   D = 160: 32 x 4 256.4 / 259.6 / 249.4 (32 x 2 242.4 / 253.8 / 242.9, but at D = 200 / 777 335.3);
//   D = 200: 32 x 4 248.1 / 250.7 (128 x 1 241.6 / 306.3);
//   D = 257: 128 x 2 269.3 / 253.3 / 238.3 (128 x 1 259.7 / 316.2 / 265.0);
//   D = 300: 128 x 2 242.0 / 261.5; D = 400: 128 x 2 247.9 / 281.6 / 242.8; D = 500: 64 x 4 329.8 / 351.2
//   (64 x 2 324.7 / 342.4); D = 700: 64 x 4 293.5 / 251.1 / 276.4; D = 850: 32 x 8 372.0 / 390.3 (32 x 4
//   368.6 / 386.4); D = 1000: 32 x 8 301.6 / 266.9 / 282.1; D = 1200: 32 x 8 322.8 / 362.9 (32 x 4 339.3 /
//   333.9).
// The plans before (the first staged forward, three passes, a thread a column, 75 KB tiles; the cached
// plan past D = 282): D = 64 245.6, D = 100 243.8, D = 257 265.4, D = 700 383.2; torch.compile 223.2,
// 430.7, 516.9, 435.7.
constexpr StagedTileByDim kStridedStagedForwardShapes[] = {{79, 256, 2}, {111, 128, 2}, {143, 128, 4}, {256, 64, 4}};
constexpr int kStridedStagedForwardMaxSmem = 113 * 1024;  // 2 x (113 + the 1 KB reserved a block) = 228 KB
constexpr int kStridedStagedForwardMinRowBytes = 64;

// Bytes of the staged mode's shared memory: the D-rows of a tile of `arrays` arrays (the backward's
// grad_output and output, the forward's x), `columns` elements and a chunk of slack each (a segment's
// first chunk starts up to 15 bytes before it).
inline int64_t softmax_strided_staged_smem_bytes(int64_t dim, int64_t columns, int elem_bytes, int arrays) {
  return arrays * dim * (columns + kStridedStagedChunkBytes / elem_bytes) * elem_bytes;
}

// Bytes of a staged forward's shared memory: x's tile, then with groups > 1 the groups' (max, sum) partials
// (float pairs, groups x columns).
inline int64_t softmax_strided_staged_forward_smem_bytes(int64_t dim, int64_t columns, int elem_bytes, int groups) {
  return softmax_strided_staged_smem_bytes(dim, columns, elem_bytes, 1) + (groups > 1 ? groups * columns * 8 : 0);
}

// Bytes of a staged backward's shared memory: both arrays' tiles, then with groups > 1 the groups' partial
// dots (groups x columns float accumulators).
inline int64_t softmax_strided_staged_backward_smem_bytes(int64_t dim, int64_t columns, int elem_bytes, int groups) {
  return softmax_strided_staged_smem_bytes(dim, columns, elem_bytes, 2) + (groups > 1 ? groups * columns * 4 : 0);
}

// The staged mode's tiles: ceil(inner / columns) of each outer index (the last may be narrower). The
// dispatcher and the launcher (softmax/staged.cuh) count them alike.
inline int64_t softmax_strided_staged_tiles(int64_t outer, int64_t inner, int64_t columns) {
  return outer * ((inner + columns - 1) / columns);
}

// Bytes of the strided kernel's reduction buffers (ColumnScratch in softmax/common.cuh): two
// mbarriers, then values of `value_bytes` red[2][R][C * L + 1], res[2][C][L], cta[2][cluster][C][L];
// R = threads / 32 when C < 32 is a power of two (column_warp_levels), else threads / C. With one D-group
// (R = 1, C >= 32) in one CTA the threads hold their columns' folds already: the barriers alone. Why it
// matters: the buffers of 128 16-bit forward column vectors (8 KB of pairs a row of red) were 49 KB,
// over kStridedMaxSmem, so short-D tiles stopped at 64 threads, nine CTAs an SM by shared memory.
constexpr int kColumnBarrierBytes = 16;
inline int64_t softmax_strided_smem_bytes(int64_t threads, int64_t columns, int lanes, int64_t cluster,
                                          int64_t value_bytes) {
  const bool warp_levels = columns < 32 && (columns & (columns - 1)) == 0;
  const int64_t reps = warp_levels ? threads / 32 : threads / columns;
  if (!warp_levels && reps == 1 && cluster == 1) return kColumnBarrierBytes;  // one D-group: no exchange
  const int64_t cl = columns * lanes;
  return kColumnBarrierBytes + (2 * reps * (cl + 1) + 2 * cl + 2 * cluster * cl) * value_bytes;
}

// The column tiles of a strided launch: outer x inner / vec column vectors, `columns` a tile (the last
// may be partial). The dispatcher and the launchers (softmax/strided.cuh) count them alike.
inline int64_t softmax_strided_tiles(int64_t outer, int64_t inner, int vec, int64_t columns) {
  return (outer * (inner / vec) + columns - 1) / columns;
}

// ---------------------------------------------------------------------------------------------

struct SoftmaxProblem {
  int64_t outer = 1;
  int64_t dim_size = 1;    // D
  int64_t inner = 1;
  int64_t row_stride = 1;  // input elements between rows when inner == 1 (== dim_size when dense)
  int in_bytes = 4;        // forward: input element; backward: grad_input element
  int out_bytes = 4;       // forward: output element; backward: grad_output and output element
  int acc_bytes = 4;       // accumulation type: 4 (float) or 8 (double)
  bool backward = false;
  // Every pointer is aligned to its 128-bit access: W * sizeof(its element), W = softmax_vec_width.
  bool aligned = false;
  // Forward: the output pointer is (the input's may not be: softmax_rows_shift_vectorizable). Backward: as aligned.
  bool out_aligned = false;
  int sm_count = 132;
  int cc_major = 9;
  int max_cluster = 1;     // largest cluster the device schedules for these kernels (1: none)
  int wide_cluster_threads = 0;  // see SoftmaxDeviceProps
  int64_t l2_bytes = 50 << 20;
  bool prefetch = true;  // see SoftmaxDeviceProps
  // Backward: the largest CTA (threads, a multiple of 32) of which two of block.cuh's backward kernel of 128-bit
  // accesses for these element types and epilogue fit an SM, as the CUDA occupancy query gives it for the
  // registers the compiler chose (softmax/launch.cuh block_backward_two_cta_threads); 0: not probed
  // (cluster_backward_two_cta_threads then takes block_backward_two_cta_threads_unprobed).
  int bwd_two_cta_threads = 0;
  // The caller hands the launcher a workspace of softmax_workspace_bytes(plan, outer) bytes, zeroed
  // for grid plans (the torch ops do: csrc/cuda/softmax_ops.cpp). Without one, no plan needs it (no
  // grid mode, no strided split mode).
  bool workspace = false;
  // Backward: whether the epilogue's summed term reads the output (math.h kTermUsesOutput: softmax yes, log_softmax
  // no); softmax_rows_two_pass takes only the former. The launchers set it from the epilogue; a problem built
  // without it plans as log_softmax's (no two passes), as before the field existed.
  bool term_uses_output = false;
  // The device's memory depth (memory_depth.h): the rules that read it say "deep-memory device" (the vec, warp,
  // strided and long_row plans; grep kDeep).
  MemoryDepth memory_depth = MemoryDepth::kStandard;
};

// What the dispatcher needs of the device (read once per device: softmax_device_props in
// softmax/launch.cuh).
struct SoftmaxDeviceProps {
  int sm_count = 0;
  int cc_major = 0;
  int max_cluster = 1;  // largest cluster the device schedules for these kernels: 1 (none), 8 or 16
  // Largest block (512 or 1024 threads; 0: neither) at which clusters of 16 still fill the device
  // (hold >= 90% of the CTAs it holds without clusters). Below it, 16 is used like 8; above it, only
  // when no smaller cluster caches the row (a cluster that leaves SMs idle still beats two passes); on a
  // deep-memory device also the long_row shared-memory kernel's CTAs of up to kDeepClusterWideThreads.
  int wide_cluster_threads = 0;
  int64_t l2_bytes = 0;
  bool prefetch = true;  // the L2 prefetches of the strided and long-row forwards allowed (FASTACT_PREFETCH=0: not)
  MemoryDepth memory_depth = MemoryDepth::kStandard;  // memory_depth.cuh device_memory
};

enum class SoftmaxMode : int { kWarp, kResident, kSplit, kStrided, kGrid };

// How a variant runs a problem. Filled by plan_softmax; read by the launchers and by explain.
struct SoftmaxPlan {
  SoftmaxVariant variant = SoftmaxVariant::kAuto;
  SoftmaxMode mode = SoftmaxMode::kWarp;
  int vec = 1;             // elements per access: softmax_vec_width (128-bit) or 1
  int threads = 0;         // per block
  int cluster = 1;         // CTAs per row (resident) or per tile (strided); 1: no cluster
  int warp_log2 = 0;       // warp: log2 of the padded row
  int64_t chunks = 1;      // split: chunks (CTAs) per row; 1: one kernel, a block per row. grid: CTAs per row.
                           // strided (streaming): chunks of D per tile, a CTA each; > 1: the split mode
  int64_t group_rows = 0;  // split with chunks > 1: rows per (stats, write) launch pair
  int64_t workspace_bytes = 0;  // strided split mode: bytes of the partials (softmax_workspace_bytes)
  int columns = 0;         // strided: column vectors per block
  int groups = 1;          // strided staged: thread groups a column, each folding every groups-th D-row
  bool streaming = false;  // strided: D too long to cache, read twice
  bool staged = false;     // strided: tiles through shared memory in 16-byte chunks (softmax/staged.cuh)
  bool prefetch = false;   // L2 prefetch of the work ahead: strided cached / long_row 16-bit shared-memory forwards
  bool edges = false;      // vec, long_row resident: rows off the 128-bit alignment (softmax_rows_edge_vectorizable)
  bool raw = false;        // long_row resident forward: the register cache kept as loaded (softmax_resident_raw;
                           // with smem_elems, beside the shared-memory part: softmax_cluster_smem_raw_regs)
  bool shifted = false;    // vec forward: the input's rows staged and realigned (softmax_rows_shift_vectorizable)
  bool two_pass = false;   // vec backward: dy and y read again after the row's all-reduce (softmax_rows_two_pass)
  bool one_unit = false;   // vec backward: one unit of dy and y a thread, the kernel sized for it
                           // (softmax_vec_backward_one_unit)
  bool full_cache = false;  // vec: the whole register cache a thread where kVec*Accesses would halve it
                            // (softmax_vec_full_cache; a deep-memory device)
  bool packed = false;  // warp forward: kWarpPackedAccesses 128-bit accesses a lane, several rows a warp
                        // (softmax_warp_packed; a deep-memory device)
  int elems_per_thread = 0;  // cached elements per thread (resident, strided, warp)
  int smem_elems = 0;        // long_row resident forward, grid: of elems_per_thread, those in shared memory
  const char* why = "";    // auto: why this variant (static text)
};

inline int softmax_vec_width(const SoftmaxProblem& p) { return softmax_vec_width(p.in_bytes, p.out_bytes); }

// The forward of 16-bit inputs into a float output: the ops' dtype= cast (csrc/common.h fused_softmax_cast), whose
// float stores block.cuh pairs across lanes (WarpPairedStores); the rules that read this plan for those stores.
inline bool softmax_forward_widens(const SoftmaxProblem& p) {
  return !p.backward && p.in_bytes == 2 && p.out_bytes == 4;
}

// Rows (inner == 1) can move in 128-bit accesses.
inline bool softmax_rows_vectorizable(const SoftmaxProblem& p) {
  const int w = softmax_vec_width(p);
  return p.aligned && p.inner == 1 && p.dim_size % w == 0 && (p.row_stride % w == 0 || p.outer == 1);
}
// Rows (inner == 1) whose D is not a multiple of the vector width can still move in 128-bit accesses
// once each row's head (the elements before its first aligned vector) and tail (after its last) are
// taken apart, if row r of every tensor starts at the same offset from the alignment: every base
// pointer aligned and the input's row stride equal to D modulo the width (the outputs are dense), so
// row r starts (r * D) % width elements past an aligned address in each. Why: element accesses ran at
// 0.48-0.65 of the limit on bf16 rows of 30522 and 50257 (vocabulary sizes) on the H100, up to 1.5x
// slower than torch (bench/NOTES.md, thirteenth session). The resident kernels (vec, long_row's
// clusters) take such rows (block.cuh's RowEdges); warp and split keep element accesses.
inline bool softmax_rows_edge_vectorizable(const SoftmaxProblem& p) {
  const int w = softmax_vec_width(p);
  return p.aligned && p.inner == 1 && p.dim_size % w != 0 && (p.outer == 1 || (p.row_stride - p.dim_size) % w == 0);
}

// The forward kernel that realigns the input's rows (block.cuh's ShiftedRow) takes 16-bit inputs and outputs in
// 16-byte units.
constexpr bool softmax_rows_shift_supported(int vec, int in_bytes, int out_bytes) {
  return vec == 8 && in_bytes == 2 && out_bytes == 2;
}
// 16-bit forward rows that neither of the above moves in 128-bit accesses, because the input's rows start off the
// alignment each by its own amount (a row stride off the vector width, as x[:, 1:] or x[:, :n] of a wider tensor,
// or an input off the alignment whose rows the output does not share), into an aligned output whose rows the
// vector width divides: vec stages the aligned 16-byte chunks under its units in shared memory (cp.async) and
// builds each unit from two of them by a funnel shift, then reduces and stores as for aligned rows. Rows the
// vec kernel caches in one block and the warp kernel does not take (softmax_warp_max_dim); element accesses
// elsewhere. Why (H100, 256 MB, bench/NOTES.md thirty-fifth session; us, this path against the element accesses
// of scalar, the plan before, and vec on an aligned copy): bf16 [32768, 4096] of rows 4097 apart 185.3 / 256.3 /
// 180.0 (0.977 of the limit against 0.70), rows of 2048 185.8 / 255.1, 8192 191.6 / 265.5, 16384 205.4 / 278.7,
// 1032 262.7 / 422.1 (aligned 219.8), dense rows one element off 186.8 / 256.2; float16 alike. Float rows stay in
// element accesses: those ran at 0.97 there (4-byte accesses move twice the bytes an instruction).
inline bool softmax_rows_shift_vectorizable(const SoftmaxProblem& p) {
  const int w = softmax_vec_width(p);
  return !p.backward && p.inner == 1 && softmax_rows_shift_supported(w, p.in_bytes, p.out_bytes) && p.out_aligned &&
         p.dim_size % w == 0 && !softmax_rows_vectorizable(p) && !softmax_rows_edge_vectorizable(p);
}

// Rows that leave the warp kernel for vec, which moves them in 128-bit accesses. Backwards: 16-bit rows off the vector
// width longer than kWarpBackwardMaxDim (the warp kernel reads those element by element; vec takes 128-bit bodies
// and head / tail elements, softmax_rows_edge_vectorizable), and aligned rows of any 16-bit or float dtype from
// kVecBackwardMinAlignedDim, of float alone from kVecBackwardMinAlignedFloatDim (both kernels 128-bit there). Float
// rows off the width stay: at 577 the float vec backward of such rows was 7% slower. Why (H100, 256 MB, us, warp /
// vec):
// - 16-bit rows off the width (bench/NOTES.md thirty-first session): softmax backward bf16 D = 769 272.8 / 263.4,
//   1023 272.9 / 265.4, f16 alike; log_softmax bf16 833 278.8 / 276.5, 1023 278.0 / 264.2 (at 769 278.5 / 283.9,
//   the one cell vec loses); at 577 and below warp wins (276.3 / 295.8).
// - Aligned rows (fortieth session, the report's timing, two runs of bench/repro/softmax_bwd_line_sweep.py,
//   bench/results/h100-2026-11-27-s40-bwd-sweep-*): from 888 to 1024 vec led in every cell, 0.2-1.4% (rows of 1024: softmax bf16
//   267.6 / 266.9, f32 267.8 / 266.9; log_softmax bf16 267.6 / 263.9, f16 267.4 / 265.2; rows of 888 log_softmax
//   bf16 268.7 / 268.2), and the bar report had it ahead of torch.compile at 1024 where warp had tied; at 640-776
//   vec led in float (up to 1.4%) and the 16-bit softmax, but lost the bf16 log_softmax (640 267.6 / 288.0, 768
//   267.3 / 272.3, 776 268.4 / 275.3) and the f16 one at 640 (267.3 / 276.7). The line sits at 896, on the safe
//   side of a crossover between 777 and 888. Backwards of mixed widths (a 16-bit y and dy into a float dx, or the
//   reverse) follow the same line: vec takes them, their timing is unmeasured.
// - Float rows (float y, dy and dx) leave from kVecBackwardMinAlignedFloatDim = 512 (forty-first session, the same
//   sweep, bench/results/h100-2026-11-27-s41-bwd-sweep.txt): vec led softmax / log_softmax at 512 (267.4 / 267.1,
//   267.3 / 266.6), 640 (267.8 / 266.4, 267.4 / 265.5), 768 and 776 (up to 1.1%); at 256 they tied (267.1 / 267.2).
// The forwards stay: bf16 gains as much from 769 (1023: 195.1 / 181.6), but the f16 vec forward is slower there
// (769: 200.5 / 222.4; 1023: 195.1 / 190.7), and SoftmaxProblem does not tell the two apart.
// On a kDeep device (memory_depth.h: the H200) the float forward of aligned rows leaves warp from
// kDeepVecForwardMinFloatDim too: vec's block of one warp a row, which keeps the whole register cache there
// (softmax_vec_full_cache: 32 threads of 4-8 units). Why (H200, 256 MB, us, seven rounds of
// bench/repro/softmax_bwd_plans_diag.py, bench/NOTES.md fifty-first session; warp -> vec at 32 threads, torch.compile):
// softmax D = 512 132.3 -> 130.7 (129.8), 1024 132.1 -> 131.0 (130.0), log_softmax 1024 132.8 -> 131.2 (131.3). The
// 16-bit forwards stay: vec at 32 threads of 4 units lost at 1024 (bf16 136.1 against warp's 132.8, log_softmax 138.4
// against 132.4), and the warp kernel's plain loads in place of .cg changed nothing (within 0.1%).
// The forward of aligned 16-bit rows into float (the dtype= cast) leaves warp on a kDeep device from
// kDeepVecForwardMinCastDim: vec's block of one warp a row, 4 units a thread, whose float stores are whole 512-byte
// runs (block.cuh WarpPairedStores); the warp kernel stores each lane's 32 bytes of a unit as two 16-byte halves,
// half of each sector an instruction. Why (H200, 256 MB of input, us, three rounds of
// bench/repro/softmax_bwd_plans_diag.py, bench/NOTES.md fifty-sixth session): bf16 D = 1024 warp 248.1, vec 32 x 4
// 197.6, torch.compile 197.2. At 256 warp stays (197.0, torch.compile 198.5; vec's one unit a thread 391.7).
constexpr int kWarpBackwardMaxDim = 768;
constexpr int kVecBackwardMinAlignedDim = 896;
constexpr int kVecBackwardMinAlignedFloatDim = 512;
constexpr int kDeepVecForwardMinFloatDim = 512;
constexpr int kDeepVecForwardMinCastDim = 1024;
inline bool softmax_rows_leave_warp(const SoftmaxProblem& p) {
  const bool is_float = p.in_bytes == 4 && p.out_bytes == 4 && p.acc_bytes == 4;
  if (!p.backward) {
    if (p.memory_depth != MemoryDepth::kDeep || !softmax_rows_vectorizable(p)) return false;
    if (is_float) return p.dim_size >= kDeepVecForwardMinFloatDim;
    return softmax_forward_widens(p) && p.dim_size >= kDeepVecForwardMinCastDim;
  }
  if (softmax_rows_vectorizable(p)) {
    return p.dim_size >= (is_float ? kVecBackwardMinAlignedFloatDim : kVecBackwardMinAlignedDim);
  }
  return p.dim_size > kWarpBackwardMaxDim && p.in_bytes == 2 && p.out_bytes == 2 && softmax_rows_edge_vectorizable(p);
}

// Softmax backwards of aligned 16-bit rows of kTwoPassMinDim to kTwoPassMaxDim elements run vec in two passes over the
// row (block.cuh softmax_block_bwd_two_pass_kernel): the thread's units of dy and y loaded and summed with an L1 / L2
// evict_last policy, the row's all-reduce, then loaded again with evict_first (from L1 or L2) and written, nothing
// held across the all-reduce; one unit a thread up to kResidentMaxThreads threads, then two (softmax_two_pass_units).
// That is torch.compile's kernel for these rows (inductor's looped reduction with Triton's eviction policies, XBLOCK
// 1: 16 warps at D = 4096, 32 at 16384; bench/results/h100-2026-11-27-s41-inductor-kernels.txt). Why (H100, 256 MB,
// bf16, us, seven interleaved rounds of bench/repro/softmax_bwd_diag.py, bench/NOTES.md forty-first session): softmax
// backward D = 4096 library 266.08 (256 threads x 2 units in registers), two passes at 512 x 1 265.04, torch.compile
// 264.99; D = 16384 267.71 (512 x 4) against 265.47 at 1024 x 2, torch.compile 265.62. The same passes with plain
// loads lost 3.7% / 2.6%, and at the library's shapes (256 x 2, 512 x 4: eight CTAs an SM) 6% / 9%. Not log_softmax,
// whose term reads only dy: its two passes lost there (4096: 267.3 against the library's 265.0; 16384: 268.5 against
// 266.7). float16 and D = 8192 measured since (forty-second session: bf16 [16384, 8192] 265.4 -> 263.9, torch.compile
// 268.1; f16 as bf16 at 4096 and 16384); float rows stay (the library's float backward already led
// torch.compile's two passes: f32 [16384, 4096] 265.7 against 275.0 us); so do devices before sm_80, where the
// policies are plain loads (load_vector_evict), which lost.
// The lower end, 2048 (forty-second session): the wide grid had the resident plan 0.6% / 1.1% behind torch.compile on
// bf16 rows of 2048 / 3072 (266.6 / 264.9, 266.0 / 263.0 us); shorter rows (warp, or vec with a unit or two a
// thread) are within 0.2% of it at 512-1024.
// The upper end, 16384 (sessions 43-44, branch s43-two-pass-32k, bench/repro/two_pass_l1_diag.cu there): at bf16
// [4096, 32768] long_row took 271.2 us in the diag (267.8 in the report, torch.compile 266.7); 1024 threads x 4
// units, each pass's loads in one wave (54 registers: a CTA an SM, the row in L1, as torch.compile's kernel), 270.8;
// two units over a 2-CTA cluster a row 283.0 (report 280.1). Nothing past 16384 beats long_row by more than noise.
constexpr int kTwoPassMinDim = 2048;
constexpr int kTwoPassMaxDim = 16384;
inline bool softmax_rows_two_pass(const SoftmaxProblem& p) {
  return p.backward && p.term_uses_output && p.cc_major >= 8 && p.inner == 1 && p.in_bytes == 2 && p.out_bytes == 2 &&
         softmax_rows_vectorizable(p) && p.dim_size >= kTwoPassMinDim && p.dim_size <= kTwoPassMaxDim;
}
// Units of dy (and of y) a thread of that kernel moves in each pass: 1 while a CTA of kResidentMaxThreads threads holds
// the row that way, else 2; 0 where the row is longer than that (no two-pass plan).
// On a kDeep device one unit a pass only up to kVecMaxThreadsWithClusters threads (D <= 4096 at 16 bits), two beyond.
// Why (H200, 256 MB, bf16, us, seven rounds of bench/repro/softmax_bwd_plans_diag.py, bench/NOTES.md fiftieth
// session): D = 6144 one unit at 768 threads 208.3, two at 384 188.8, torch.compile 189.5; D = 8192 one unit at 1024
// threads 193.3, two at 512 189.5, torch.compile 189.3. D = 4096 keeps one unit at 512 threads (185.4, two at 256:
// 191.9); D = 12288 already took two units (768 threads, 185.5 against torch.compile's 194.3).
inline int softmax_two_pass_units(int64_t dim, int vec, MemoryDepth depth) {
  const int one_unit_threads = depth == MemoryDepth::kDeep ? kVecMaxThreadsWithClusters : kResidentMaxThreads;
  if (dim <= int64_t(one_unit_threads) * vec) return 1;
  if (dim <= int64_t(kResidentMaxThreads) * 2 * vec) return 2;
  return 0;
}

// On a kDeep device (memory_depth.h: the H200) the aligned 16-bit vec backward runs one unit of dy and of y a thread,
// in block.cuh's backward kernel with a register cache of one unit (26 registers where the two-unit plan's kernel,
// sized for the longest row, takes 57: twice the resident threads an SM, 2048 against 1024), wherever the row then takes at most
// kVecMaxThreadsWithClusters threads (D <= 4096); softmax's two passes (softmax_rows_two_pass) keep rows of 2048 and
// more. Why (H200, 256 MB, bf16, us, five rounds of bench/repro/softmax_bwd_diag.py, bench/NOTES.md forty-fifth
// session): log_softmax backward D = 1024: library (64 threads x 2 units) 195.1, one unit (128 threads) 186.8,
// torch.compile 187.1; D = 4096: library (256 x 2) 204.5, one unit (512) 187.2, torch 194.1, torch.compile 209.8.
// softmax's backward at D = 1024 (186.8 on the H200 with two units) takes the same plan, not timed apart there. The
// H100 (kStandard) keeps two units: one lost 0.3-1% on it (forty-fifth session, the report's cells with each class
// forced: log_softmax bf16 D = 1024 264.1 -> 266.6-266.8, D = 4096 265.1 -> 265.8-266.0; softmax level).
inline bool softmax_vec_backward_one_unit(const SoftmaxProblem& p, int vec) {
  return p.backward && p.memory_depth == MemoryDepth::kDeep && vec > 1 && p.in_bytes == 2 && p.out_bytes == 2 &&
         p.inner == 1 && softmax_rows_vectorizable(p) && (p.dim_size + vec - 1) / vec <= kVecMaxThreadsWithClusters;
}

// On a kDeep device (memory_depth.h: the H200) vec keeps the register cache its kernel is compiled for, all of it a
// thread (fewer threads, more bytes in flight each), where kVecForwardAccesses / kVecBackwardAccesses would halve it:
// the float forward (8 units a thread, not 4) and log_softmax's backward (4 units of dy and of y, not 2; where the
// 16-bit one-unit plan, softmax_vec_backward_one_unit, does not take the row). Why (H200, 256 MB, us, seven rounds of
// bench/repro/softmax_bwd_plans_diag.py, bench/NOTES.md fiftieth session; halved -> full, torch.compile):
//   f32 forward D = 3072 135.6 -> 130.1 (242.6), 4096 134.6 -> 131.1 (162.0), 6144 158.7 -> 130.8 (164.7), 8192 log
//   146.9 -> 131.2 (140.2); 2048 level (130.9 / 130.7);
//   log_softmax backward bf16 D = 5120 209.7 -> 188.0 (218.1), 6144 226.2 -> 187.8 (202.7), 8192 213.1 -> 188.9
//   (188.9), f16 8192 214.2 -> 189.1 (188.9); f32 3072 204.3 -> 188.5 (186.9), 3584 193.6 -> 188.4 (188.9), and
//   the cost where the halved plan ran well: f32 2048 186.5 -> 188.9 (189.8), 2560 186.3 -> 188.6 (190.8), 4096
//   187.4 -> 188.8 (189.5).
// log_softmax's term does not read y, and without LoadDependence (common.cuh: 16-bit outputs) ptxas issues y's loads
// after the row's reduction, so a thread waits on two latencies with half its cache in flight each time; float's
// halved plan lost only at CTA sizes that leave an SM short of threads (384 and 448 threads: 768 and 896 resident).
// softmax's float backward keeps the halved plan (3072: 186.9 against the full cache's 188.6; 4096: 186.9 / 188.8).
inline bool softmax_vec_full_cache(const SoftmaxProblem& p) {
  if (p.memory_depth != MemoryDepth::kDeep || p.in_bytes != p.out_bytes || p.out_bytes > 4) return false;
  return p.backward ? !p.term_uses_output : p.out_bytes == 4;
}

// On a kDeep device (memory_depth.h: the H200) the warp forward of 128-bit rows whose units (D / vec) are not a power
// of two and pad to at most a warp's lanes takes kWarpPackedAccesses accesses a lane (softmax_warp_packable), so a
// row of 24 units spans 8 lanes with three accesses each and a warp takes four rows, not one over 24 of its 32 lanes.
// Why: a warp's loads in flight. The one-access plan pads the row to 32 units and leaves a quarter of the lanes idle,
// so each warp has 384 bytes in flight, not the 512 of a row of 128 floats, and with an SM's 64 warps the H200 fell
// short of its memory's depth. H200, 256 MB, us, seven rounds of bench/repro/softmax_bwd_plans_diag.py (bench/NOTES.md
// fifty-first session), one access a lane -> packed (torch.compile): float D = 96 142.8 -> 131.7 (132.4),
// log_softmax 144.2 -> 132.1 (140.8; torch 134.0); bf16 D = 96 147.8 -> 132.1 (179.0), log_softmax 164.1 -> 132.3
// (179.5); float D = 48 142.3 -> 131.3 (130.0); bf16 D = 200 148.4 -> 141.3 (178.3). Rows of a power of two units
// fill their lanes and stay: float D = 128 130.0 -> 132.7 packed, bf16 log_softmax D = 64 135.2 -> 165.9. The
// backward, which keeps two arrays in flight, ran at the limit at D = 96 (187.1-187.4) and is not packed; the H100
// (a standard device) was not measured, and its rows of 96 ran at 0.96-0.99 of its limit.
inline bool softmax_warp_packed(const SoftmaxProblem& p, int vec, int log2_elems) {
  if (p.backward || p.memory_depth != MemoryDepth::kDeep || !softmax_warp_packable(log2_elems, vec)) return false;
  const int64_t units = p.dim_size / vec;
  return (units & (units - 1)) != 0;
}

// On a kDeep device (memory_depth.h: the H200) the warp forward of 16-bit 128-bit rows of 1024 (padded) runs blocks of
// kWarpSmallBlockThreads (two rows a block, not four). Why (H200, 256 MB, us, five rounds of
// bench/repro/softmax_bwd_plans_diag.py with the block size patched, bench/NOTES.md fifty-first session; 128 -> 64
// threads, torch.compile): bf16 D = 1024 132.2 -> 130.1 (128.8-129.5), log_softmax 132.1 -> 130.0 (128.8-128.9): an
// SM's block slots free as each smaller block retires rather than when the slowest of four rows does. Not below: bf16
// log_softmax D = 128 ran 134.9 -> 162.9 at 64 threads (a block moves 1 KB there; the launch rate of 2^18 blocks sets
// the pace). The float rows of 512-1024 take vec on deep devices (softmax_rows_leave_warp), whose one-warp blocks
// gained the same way.
inline bool softmax_warp_small_blocks(const SoftmaxProblem& p, int vec, int log2_elems) {
  return !p.backward && p.memory_depth == MemoryDepth::kDeep &&
         softmax_warp_small_blockable(log2_elems, vec, p.in_bytes, p.out_bytes);
}

// The most threads a vec CTA takes where clusters are available (kVecMaxThreadsWithClusters; kDeepVecForward16MaxThreads
// for the 16-bit forward of aligned rows on a deep-memory device); longer rows go to long_row.
inline int softmax_vec_max_threads(const SoftmaxProblem& p) {
  const bool deep16 = p.memory_depth == MemoryDepth::kDeep && !p.backward && p.in_bytes == 2 && p.out_bytes == 2;
  return deep16 && softmax_rows_vectorizable(p) ? kDeepVecForward16MaxThreads : kVecMaxThreadsWithClusters;
}

// Columns (inner > 1) can move in 128-bit accesses along inner.
inline bool softmax_columns_vectorizable(const SoftmaxProblem& p) {
  return p.aligned && p.inner > 1 && p.inner % softmax_vec_width(p) == 0;
}

inline int softmax_resident_elems(const SoftmaxProblem& p, int vec) {
  return softmax_resident_elems(p.backward, vec, p.out_bytes, p.acc_bytes);
}

// Largest row one block caches (vec: vec = 128-bit width; scalar: vec = 1).
inline int64_t softmax_block_capacity(const SoftmaxProblem& p, int vec) {
  return int64_t(kResidentMaxThreads) * softmax_resident_elems(p, vec);
}

inline bool softmax_ptr_aligned(const void* ptr, int64_t bytes) {
  return reinterpret_cast<std::uintptr_t>(ptr) % static_cast<std::uintptr_t>(bytes) == 0;
}

// The dispatcher's view of a forward call: x (in_bytes elements) -> y (out_bytes). A null pointer
// counts as aligned (a tensor about to be allocated).
inline SoftmaxProblem softmax_forward_problem(const void* x, int in_bytes, const void* y, int out_bytes, int acc_bytes,
                                              int64_t outer, int64_t dim, int64_t inner, int64_t row_stride,
                                              const SoftmaxDeviceProps& dev) {
  SoftmaxProblem p;
  p.outer = outer;
  p.dim_size = dim;
  p.inner = inner;
  p.row_stride = row_stride;
  p.in_bytes = in_bytes;
  p.out_bytes = out_bytes;
  p.acc_bytes = acc_bytes;
  p.backward = false;
  const int w = softmax_vec_width(in_bytes, out_bytes);
  p.out_aligned = softmax_ptr_aligned(y, int64_t(w) * out_bytes);
  p.aligned = softmax_ptr_aligned(x, int64_t(w) * in_bytes) && p.out_aligned;
  p.sm_count = dev.sm_count;
  p.cc_major = dev.cc_major;
  p.max_cluster = dev.max_cluster;
  p.wide_cluster_threads = dev.wide_cluster_threads;
  p.l2_bytes = dev.l2_bytes;
  p.prefetch = dev.prefetch;
  p.memory_depth = dev.memory_depth;
  return p;
}

// The dispatcher's view of a backward call: grad_output and output (out_bytes) -> grad_input
// (in_bytes), all dense (row stride D).
inline SoftmaxProblem softmax_backward_problem(const void* grad_output, const void* output, int out_bytes,
                                               const void* grad_input, int in_bytes, int acc_bytes, int64_t outer,
                                               int64_t dim, int64_t inner, const SoftmaxDeviceProps& dev) {
  SoftmaxProblem p = softmax_forward_problem(grad_output, out_bytes, output, out_bytes, acc_bytes, outer, dim, inner,
                                             dim, dev);
  p.in_bytes = in_bytes;
  p.backward = true;
  const int w = softmax_vec_width(in_bytes, out_bytes);
  p.aligned = softmax_ptr_aligned(grad_output, int64_t(w) * out_bytes) &&
              softmax_ptr_aligned(output, int64_t(w) * out_bytes) &&
              softmax_ptr_aligned(grad_input, int64_t(w) * in_bytes);
  p.out_aligned = p.aligned;
  return p;
}

namespace softmax_detail {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }
inline int64_t pow2_ceil(int64_t a) {
  int64_t p = 1;
  while (p < a) p *= 2;
  return p;
}
inline int64_t pow2_floor(int64_t a) {
  int64_t p = 1;
  while (p * 2 <= a) p *= 2;
  return p;
}
inline int log2_ceil(int64_t a) {
  int l = 0;
  while ((int64_t(1) << l) < a) ++l;
  return l;
}
inline bool clusters_available(const SoftmaxProblem& p) { return p.cc_major >= 9 && p.max_cluster >= 2; }

// The long_row forward may keep part of the slice in shared memory (kClusterSmemBytes).
inline bool softmax_cluster_smem_eligible(const SoftmaxProblem& p, int vec) {
  return !p.backward && softmax_cluster_smem_supported(vec, p.in_bytes, p.acc_bytes);
}

// One block per row, the row in registers (vec, scalar).
inline SoftmaxPlan plan_block(const SoftmaxProblem& p, SoftmaxVariant v, int vec, bool edges = false) {
  SoftmaxPlan s;
  s.variant = v;
  s.mode = SoftmaxMode::kResident;
  s.vec = vec;
  s.edges = edges;
  s.elems_per_thread = softmax_resident_elems(p, vec);
  s.threads = int(round_up(ceil_div(p.dim_size, s.elems_per_thread), 32));
  s.cluster = 1;
  if (v == SoftmaxVariant::kVec) {  // fewer accesses a thread (kVecForwardAccesses), where it fits
    const int e = (p.backward ? kVecBackwardAccesses : kVecForwardAccesses) * vec;
    const int64_t t = round_up(ceil_div(p.dim_size, e), 32);
    if (e < s.elems_per_thread && t <= kVecMaxThreadsWithClusters) {
      if (softmax_vec_full_cache(p)) {
        s.full_cache = true;
      } else {
        s.elems_per_thread = e;
        s.threads = int(t);
      }
    }
    const int u =
        vec > 1 && !edges && softmax_rows_two_pass(p) ? softmax_two_pass_units(p.dim_size, vec, p.memory_depth) : 0;
    if (u > 0) {
      s.two_pass = true;
      s.elems_per_thread = u * vec;
      s.threads = int(round_up(ceil_div(p.dim_size, s.elems_per_thread), 32));
    } else if (!edges && softmax_vec_backward_one_unit(p, vec)) {
      s.one_unit = true;
      s.full_cache = false;
      s.elems_per_thread = vec;
      s.threads = int(round_up(ceil_div(p.dim_size, vec), 32));
    }
  }
  return s;
}

// Largest cluster of `threads`-thread CTAs the dispatcher uses: 16 only where such clusters fill the
// device (wide_cluster_threads), unless `any_size`: a last resort, or CTAs a caller knows share SMs in such
// clusters (plan_cluster's deep shared-memory ones, kDeepClusterWideThreads).
inline int cluster_cap(const SoftmaxProblem& p, int threads, bool any_size) {
  const int cap = p.max_cluster < kMaxCluster ? p.max_cluster : kMaxCluster;
  if (cap <= kMaxPortableCluster || any_size || threads <= p.wide_cluster_threads) return cap;
  return kMaxPortableCluster;
}

// Whether a long_row cluster forward (smem_slice: in the shared-memory kernel; raw_regs: with a register part as
// loaded, softmax_cluster_smem_raw_regs) prefetches the rows ahead into L2 (kLongRowPrefetchDivisor says why).
inline bool long_row_prefetches(const SoftmaxProblem& p, bool smem_slice, bool raw_regs) {
  if (!p.prefetch || p.backward || !smem_slice || softmax_cluster_smem_reg_elems(p.in_bytes, p.acc_bytes) != 0)
    return false;
  const int64_t bytes = p.outer * p.dim_size * p.in_bytes;
  if (raw_regs)  // a register part besides: deep-memory devices, large inputs (kDeepRawPrefetchL2Multiple)
    return p.memory_depth == MemoryDepth::kDeep && bytes >= kDeepRawPrefetchL2Multiple * p.l2_bytes;
  return bytes >= p.l2_bytes;
}

// Whether plan_cluster takes a deep-memory device's shapes (kDeepClusterWideThreads): on such a device, but not for
// the forward of 16-bit rows into float that a portable cluster of the shared-memory shape holds (8 x 512 x 64 =
// 262144 elements; see there). Longer such rows, whose standard shapes would be 16-CTA clusters of 288-512 threads,
// keep the deep ones (not measured).
inline bool long_row_deep_shapes(const SoftmaxProblem& p) {
  if (p.memory_depth != MemoryDepth::kDeep) return false;
  return !softmax_forward_widens(p) || p.dim_size > int64_t(kMaxPortableCluster) * kClusterSmemMaxThreads *
                                                        softmax_cluster_smem_elems(p.in_bytes);
}

// The row over a cluster; false when no cluster the device takes can cache it. Prefers clusters that
// fill the device, small CTAs first (kClusterThreads); then any cluster the device schedules. Where
// the forward can keep part of the slice in shared memory, those CTAs (at most kClusterSmemMaxThreads
// threads) come right after the register-only 256-thread ones and replace the larger ones. Rows with
// edges (block.cuh's RowEdges) take only the register-only CTAs. 16-bit forwards keep the register
// cache as loaded (softmax_resident_raw: twice the elements a thread); their rows past every shape before
// take the shared-memory CTAs with such a register part besides (softmax_cluster_smem_raw_regs). On a deep-memory
// device those come right after the register-only CTAs, from 128 threads, and the shared-memory CTAs of up to
// kDeepClusterWideThreads threads take clusters of 16 in the first pass (kDeepClusterWideThreads says why).
inline bool plan_cluster(const SoftmaxProblem& p, int vec, bool edges, SoftmaxPlan* out) {
  if (!clusters_available(p)) return false;
  const bool with_smem = !edges && softmax_cluster_smem_eligible(p, vec);
  const bool raw = softmax_resident_raw(p.backward, vec, p.in_bytes, p.acc_bytes);
  const int reg_e = raw ? softmax_resident_raw_elems(p.in_bytes) : softmax_resident_elems(p, vec);
  const int smem_e = with_smem ? softmax_cluster_smem_elems(p.in_bytes) : 0;
  const int smem_total = with_smem ? softmax_cluster_smem_reg_elems(p.in_bytes, p.acc_bytes) + smem_e : 0;
  const bool raw_regs = with_smem && softmax_cluster_smem_raw_regs(p.backward, vec, p.in_bytes, p.acc_bytes);
  const bool deep = long_row_deep_shapes(p);
  // (threads, whether part of the slice is in shared memory, whether the shared-memory kernel also keeps
  // registers as loaded), in the order tried.
  struct Shape {
    int threads;
    bool smem;
    bool raw_regs;
  };
  Shape shapes[3 * (sizeof(kClusterThreads) / sizeof(int)) + sizeof(kDeepClusterRawThreads) / sizeof(int)];
  int n = 0;
  for (int t : kClusterThreads) {
    if (p.backward && t < kClusterBackwardMinThreads) continue;
    if (!with_smem || t < kClusterSmemMaxThreads) shapes[n++] = {t, false, false};
  }
  if (raw_regs && deep) {
    for (int t : kDeepClusterRawThreads) shapes[n++] = {t, true, true};
  }
  if (with_smem) {
    for (int t : kClusterThreads) {
      if (t <= kClusterSmemMaxThreads) shapes[n++] = {t, true, false};
    }
  }
  if (raw_regs && !deep) {
    for (int t : kClusterThreads) {
      if (t <= kClusterSmemMaxThreads) shapes[n++] = {t, true, true};
    }
  }
  for (bool last_resort : {false, true}) {
    for (int i = 0; i < n; ++i) {
      const int t = shapes[i].threads;
      const int e = shapes[i].raw_regs ? reg_e + smem_e : shapes[i].smem ? smem_total : reg_e;
      int64_t s = pow2_ceil(ceil_div(p.dim_size, int64_t(t) * e));
      if (s < 2) s = 2;  // long_row always runs as a cluster here (tests force it on short rows too)
      const bool deep_wide = deep && shapes[i].smem && t <= kDeepClusterWideThreads;
      if (s > cluster_cap(p, t, last_resort || deep_wide)) continue;
      // Raw 16-bit register CTAs stop at portable clusters (8 x 256 x 64 = 131072 elements) where the
      // shared-memory CTAs can take the row: those keep as many elements a thread at 40 registers
      // (three 512-thread CTAs an SM), the plan of the 262144 bar cells (0.92-0.93, tenth session).
      if (raw && with_smem && !shapes[i].smem && s > kMaxPortableCluster) continue;
      // The shapes with a register part besides shared memory only where no other shape takes the row at any
      // cluster size (softmax_cluster_smem_raw_regs): in the first pass, where 16-CTA clusters may not count (a
      // device whose clusters of 16 leave SMs idle, as the H100's do), they would take rows of 2^18-2^19 in 8-CTA
      // clusters from the 16 x 512 shared-memory shape. On a deep-memory device they come first of the
      // shared-memory shapes and count in the first pass (kDeepClusterWideThreads says why).
      if (shapes[i].raw_regs && !last_resort && !deep) continue;
      // Balance: the fewest threads that still cache the row over s CTAs.
      const int64_t threads = ceil_div(ceil_div(p.dim_size, s), e);
      if (shapes[i].raw_regs && deep && threads < kDeepClusterRawMinThreads) continue;
      SoftmaxPlan plan;
      plan.variant = SoftmaxVariant::kLongRow;
      plan.mode = SoftmaxMode::kResident;
      plan.vec = vec;
      plan.edges = edges;
      plan.raw = raw && (!shapes[i].smem || shapes[i].raw_regs);
      plan.elems_per_thread = e;
      plan.smem_elems = shapes[i].smem ? smem_e : 0;
      plan.prefetch = long_row_prefetches(p, shapes[i].smem, shapes[i].raw_regs);
      plan.cluster = int(s);
      plan.threads = int(round_up(threads, 32));
      *out = plan;
      return true;
    }
  }
  return false;
}

// Online max+sum per chunk, then a write pass.
inline SoftmaxPlan plan_split(const SoftmaxProblem& p, SoftmaxVariant v, int vec, bool one_block_per_row) {
  SoftmaxPlan s;
  s.variant = v;
  s.mode = SoftmaxMode::kSplit;
  s.vec = vec;
  s.threads = kSplitThreads;
  s.chunks = 1;
  s.group_rows = p.outer;
  const int64_t d = p.dim_size;
  // Rows whose input fits the L2 reuse budget, read by one launch pair.
  const int64_t row_bytes = d * (p.backward ? 2 * p.out_bytes : p.in_bytes);
  const int64_t budget = p.l2_bytes / kL2ReuseDivisor;
  int64_t group = budget / (row_bytes > 0 ? row_bytes : 1);
  if (group < 1) group = 1;
  if (group > p.outer) group = p.outer;
  if (ceil_div(p.outer, group) > kSplitMaxGroups) group = ceil_div(p.outer, kSplitMaxGroups);
  // Chunks per row: enough CTAs per launch for every SM, chunks no shorter than kSplitMinChunk.
  int64_t k = ceil_div(int64_t(kSplitCtasPerSm) * p.sm_count, group);
  if (k > kSplitMaxChunks) k = kSplitMaxChunks;
  if (k > d / kSplitMinChunk) k = d / kSplitMinChunk;
  // The parking scheme needs each chunk's output bytes to hold 16 bytes of alignment slack plus K
  // partials; the smallest chunk has floor(units / k) units of `vec` elements.
  const int dst_bytes = p.backward ? p.in_bytes : p.out_bytes;
  const int64_t units = d / vec;
  while (k > 1 && (units / k) * vec * dst_bytes < int64_t(kSplitSlotBytes) * (k + 1)) --k;
  if (one_block_per_row || k < 2) {
    s.chunks = 1;
    s.group_rows = p.outer;
  } else {
    s.chunks = k;
    s.group_rows = group;
  }
  return s;
}

// Whether a long_row backward's cluster plan `s` gives way to the grid mode (cluster_backward_two_cta_threads). On a
// deep-memory device the 16-CTA cluster of kResidentMaxThreads threads (one CTA an SM) does too. Why (H200, 256 MB,
// us, session 53's diag): f32 [256, 262144] softmax / log_softmax 16 x 1024 229.0 / 231.9 against the grid's 13 x 512
// 212.6 / 214.0; bf16 softmax [256, 524288] 233.1 against 212.9 (the H100 had them level: the comment above
// block_backward_two_cta_threads_unprobed). Not measured: the 16-bit log_softmax and f16 ones.
inline bool cluster_backward_yields_to_grid(const SoftmaxProblem& p, const SoftmaxPlan& s) {
  if (!p.backward || s.vec == 1 || s.edges || p.in_bytes != p.out_bytes || (p.out_bytes != 2 && p.out_bytes != 4))
    return false;
  const bool deep = p.memory_depth == MemoryDepth::kDeep;  // cluster CTAs are at most kResidentMaxThreads
  return s.cluster > kMaxPortableCluster &&
         s.threads > cluster_backward_two_cta_threads(p.bwd_two_cta_threads, p.out_bytes) &&
         (deep || s.threads < kResidentMaxThreads);
}

// long_row beyond a cluster, or in place of one (cluster_backward_yields_to_grid) (grid.cuh): the row over `chunks`
// CTAs of `threads` threads anywhere on the device, each caching elems_per_thread elements a thread as long_row's
// clusters do (registers; the forwards with 128-bit accesses and float arithmetic also shared memory: smem_elems),
// the backwards with 16-byte units of grad_output and output kGridBwdSmemBytes more in shared memory. False where
// no CTA size of kGridThreads caches the row in at most sm_count CTAs: a row's CTAs wait for each other, so the
// device must hold all of them at once, and one CTA an SM always fits (grid_sync.cuh). `forced` (the variant named
// by a test): at least two CTAs, so that short rows exchange too.
inline bool plan_grid(const SoftmaxProblem& p, SoftmaxVariant v, int vec, bool forced, SoftmaxPlan* out) {
  if (!p.workspace || p.inner != 1 || p.sm_count < 2) return false;
  // Elements a thread keeps, and of them those in shared memory (forward: long_row's shared-memory
  // clusters' slice; backward: kGridBwdSmemBytes of grad_output and output).
  int e = softmax_resident_elems(p, vec), smem_e = 0, max_threads = kResidentMaxThreads;
  if (!p.backward && softmax_cluster_smem_eligible(p, vec)) {
    smem_e = softmax_cluster_smem_elems(p.in_bytes);
    e = softmax_cluster_smem_reg_elems(p.in_bytes, p.acc_bytes) + smem_e;
    max_threads = kClusterSmemMaxThreads;
  } else if (p.backward && softmax_grid_bwd_smem_elems(vec, p.out_bytes) > 0) {
    smem_e = softmax_grid_bwd_smem_elems(vec, p.out_bytes);
    e += smem_e;
    max_threads = kGridBwdSmemMaxThreads;
  }
  for (int t : kGridThreads) {
    if (t > max_threads) break;
    int64_t g = ceil_div(p.dim_size, int64_t(t) * e);
    if (forced && g < 2) g = 2;
    if (g > p.sm_count || p.outer * g > kMaxGridBlocks) continue;
    SoftmaxPlan s;
    s.variant = v;
    s.mode = SoftmaxMode::kGrid;
    s.vec = vec;
    s.elems_per_thread = e;
    s.smem_elems = smem_e;
    s.chunks = g;
    // Balance: the fewest threads that still cache the row over g CTAs.
    s.threads = int(round_up(ceil_div(ceil_div(p.dim_size, g), e), 32));
    *out = s;
    return true;
  }
  return false;
}

// The columns of a strided tile's line: a 128-byte line of one D-row (kStridedRowBytes), at most the
// column vectors of one outer index (so a block's line is contiguous), a power of two.
inline int64_t strided_line_columns(const SoftmaxProblem& p, int vec) {
  const int load_bytes = p.backward ? p.out_bytes : p.in_bytes;
  int64_t c = kStridedRowBytes / (int64_t(vec) * load_bytes);
  if (c < 1) c = 1;
  const int64_t c_cap = pow2_floor(p.inner / vec);
  return c > c_cap ? c_cap : c;
}

struct StridedStreamShape {
  int threads = 0;
  int columns = 0;
  int cluster = 1;
};

// Whether an element backward streams at any D where a shape fits L2, in the wider set of shapes
// (kStridedElementStreamWideThreads, kStridedElementStreamWideLines): its inner holds a whole line of 2- or 4-byte elements and D has at
// least kStridedElementStreamMinRows rows.
inline bool strided_element_stream_wide(const SoftmaxProblem& p, int64_t line) {
  return p.backward && line * p.out_bytes == kStridedRowBytes && p.out_bytes <= 4 &&
         p.dim_size >= kStridedElementStreamMinRows;
}

// Threads the device holds with every SM full (kSmMaxThreads each).
inline int64_t device_threads(const SoftmaxProblem& p) { return int64_t(p.sm_count) * kSmMaxThreads; }

// The streamed launch shape of a backward with element accesses (plan_strided says which), or false
// where it should not stream. Each thread's share of its column, ceil(D / G) D-rows of grad_output and
// as many of output (G = threads / columns D-groups), closest to kStridedElementStreamBytes bytes of
// each; of shapes equally close, the one whose columns are nearest a warp's 32, so that a warp reads
// one D-row; then the first tried. The order tried: without a cluster, narrower columns first (a power
// of two from kStridedMinElementColumns, or the whole line if narrower, up to kStridedElementStreamWideLines
// lines within one outer index, where `wide`; else up to the line), CTAs of
// kStridedElementStreamWideThreads (where `wide`), 512 then 1024 threads at each; then, where clusters
// exist, D split over a cluster of 2 up to cluster_cap CTAs (a thread's share is then ceil(D / (G x
// cluster)) D-rows) of 512 threads before 1024, smaller clusters first, columns up to the line. So a cluster is taken only where it comes strictly closer, and of
// equal cluster shapes the smaller CTAs. Only shapes whose tiles in flight fit L2, every SM full
// (kSmMaxThreads threads, each its share of both arrays): a tile's second read then comes from there.
// None fits: false (the plan caches).
inline bool strided_element_stream_shape(const SoftmaxProblem& p, int64_t line, bool wide, StridedStreamShape* out) {
  const int64_t target = kStridedElementStreamBytes;
  const int64_t wide_cap = pow2_floor(p.inner);  // a tile's columns stay within one outer index
  const int64_t widest =
      !wide ? line : (line * kStridedElementStreamWideLines < wide_cap ? line * kStridedElementStreamWideLines : wide_cap);
  int64_t best_hi = 0, best_lo = 1, best_dist = 0;
  bool found = false;
  const int64_t narrowest = line < kStridedMinElementColumns ? line : kStridedMinElementColumns;
  auto consider = [&](int cl, int64_t cols, int threads) {
    if (cols > threads) return;
    const int64_t groups = int64_t(threads / cols) * cl;  // D-groups over the cluster
    if (cl > 1 && groups > p.dim_size) return;           // threads without a D-row
    const int64_t bytes = ceil_div(p.dim_size, groups) * p.out_bytes;  // a thread's share, one array
    if (device_threads(p) * bytes * 2 > p.l2_bytes) return;
    // Closeness to the target as the ratio hi / lo >= 1; then columns nearest 32 (log2 distance).
    const int64_t hi = bytes > target ? bytes : target;
    const int64_t lo = bytes > target ? target : bytes;
    const int64_t l2c = log2_ceil(cols);
    const int64_t dist = l2c > 5 ? l2c - 5 : 5 - l2c;
    if (!found || hi * best_lo < best_hi * lo || (hi * best_lo == best_hi * lo && dist < best_dist)) {
      found = true;
      best_hi = hi;
      best_lo = lo;
      best_dist = dist;
      if (out) *out = {threads, int(cols), cl};
    }
  };
  for (int64_t cols = narrowest; cols <= widest; cols *= 2) {
    if (wide) consider(1, cols, kStridedElementStreamWideThreads);
    for (int threads : kStridedElementStreamThreads) consider(1, cols, threads);
  }
  if (clusters_available(p)) {
    for (int threads : kStridedElementStreamThreads)
      for (int cl = 2; cl <= cluster_cap(p, threads, false); cl *= 2)
        for (int64_t cols = narrowest; cols <= line; cols *= 2) consider(cl, cols, threads);
  }
  return found;
}

// The staged tile: its columns and thread groups a column.
struct StagedShape {
  int64_t columns = 0;  // 0: not staged
  int groups = 1;
};

// The staged tile (kStridedStagedThreads and, for forwards, kStridedStagedForwardShapes say why), or no
// columns where the strided kernel does not stage: element accesses (and the 128-bit backwards of
// kStridedStagedVecBackwardColumns and kStridedStagedVec16BackwardShapes), sm_90 (measured there only; later
// devices may allow less shared memory a block than the launcher asks for), D of at least kStridedStagedMinRows;
// backwards of 2- or 4-byte grad_output, forwards of 16-bit x and y. The width W:
//   128-bit backward whose D-rows start off a 32-byte sector: float kStridedStagedVecBackwardColumns and
//     kStridedStagedVecBackwardGroups where that tile fits kStridedStagedMaxSmem, 16-bit
//     kStridedStagedVec16BackwardShapes up to its last D;
//   backward: the widest power of two of at most kStridedStagedRowBytes a D-row whose tile (both arrays)
//     fits kStridedStagedMaxSmem, if that is still at least kStridedStagedMinRowBytes a D-row, one group;
//     else, for 16-bit grad_output where even that many bytes a D-row do not fit, the first of
//     kStridedStagedNarrowBackwardShapes that fits;
//   forward: kStridedStagedForwardShapes' D-row bytes and groups up to its last D; past it the widest of
//     256, 128, 64 bytes a D-row whose tile, with its groups' partials, fits kStridedStagedForwardMaxSmem,
//     kStridedStagedThreads / W groups;
// W at most the inner's largest power of two (a forward, or a vector backward, whose W that cuts does not stage).
// The inner's ceil(inner / W) tiles are then evened out (the columns: ceil(inner / tiles), rounded up to a 16-byte
// chunk's elements), so that an inner of 129 takes two tiles of 72 and 57 rather than 128 and 1. Last, tiles for
// kStridedStagedCtasPerSm CTAs on every SM.
inline StagedShape strided_staged_shape(const SoftmaxProblem& p, int vec) {
  if (p.cc_major != 9 || p.dim_size < kStridedStagedMinRows) return {};
  if (p.backward ? p.out_bytes > 4 : p.in_bytes != 2 || p.out_bytes != 2) return {};
  const int bytes = p.backward ? p.out_bytes : p.in_bytes;  // what is staged: grad_output and output, or x
  const int64_t cap = pow2_floor(p.inner);
  int64_t w = 0;
  int groups = 1;
  if (vec != 1) {  // 128-bit backward off the sector: kStridedStagedVec(16)Backward*
    if (!p.backward || p.in_bytes != p.out_bytes || p.inner * p.out_bytes % kStridedSectorBytes == 0) return {};
    if (p.out_bytes == 4) {
      w = kStridedStagedVecBackwardColumns;
      groups = kStridedStagedVecBackwardGroups;
    } else {
      const StagedTileByDim* t = staged_tile_by_dim(kStridedStagedVec16BackwardShapes, p.dim_size);
      if (t == nullptr || t->row_bytes == 0) return {};  // past the table, or its cached-plan row
      w = t->row_bytes / bytes;
      groups = t->groups;
    }
    if (softmax_strided_staged_backward_smem_bytes(p.dim_size, w, bytes, groups) > kStridedStagedMaxSmem) return {};
  } else if (p.backward) {
    w = std::min<int64_t>(kStridedStagedRowBytes / bytes, cap);
    while (w * bytes >= kStridedStagedMinRowBytes &&
           softmax_strided_staged_smem_bytes(p.dim_size, w, bytes, 2) > kStridedStagedMaxSmem)
      w /= 2;
    if (w * bytes < kStridedStagedMinRowBytes) {
      // 16-bit, where shared memory (not the inner) stops the wide tiles: the narrow ones, with groups.
      if (bytes != 2 ||
          softmax_strided_staged_smem_bytes(p.dim_size, kStridedStagedMinRowBytes / bytes, bytes, 2) <=
              kStridedStagedMaxSmem)
        return {};
      w = 0;
      for (const StagedBackwardShape& n : kStridedStagedNarrowBackwardShapes) {
        if (softmax_strided_staged_backward_smem_bytes(p.dim_size, n.row_bytes / bytes, bytes, n.groups) <=
            kStridedStagedMaxSmem) {
          w = n.row_bytes / bytes;
          groups = n.groups;
          break;
        }
      }
      if (w == 0) return {};
    }
  } else {
    if (const StagedTileByDim* t = staged_tile_by_dim(kStridedStagedForwardShapes, p.dim_size)) {
      w = t->row_bytes / bytes;
      groups = t->groups;
    } else {
      for (w = 256 / bytes; w * bytes >= kStridedStagedForwardMinRowBytes; w /= 2) {
        groups = int(kStridedStagedThreads / w);
        if (softmax_strided_staged_forward_smem_bytes(p.dim_size, w, bytes, groups) <= kStridedStagedForwardMaxSmem)
          break;
      }
      if (w * bytes < kStridedStagedForwardMinRowBytes) return {};
    }
  }
  if (w > cap) return {};  // the wide backward tiles are capped above
  const int64_t chunk = kStridedStagedChunkBytes / bytes;
  const int64_t cols = round_up(ceil_div(p.inner, ceil_div(p.inner, w)), chunk);  // <= w
  if (softmax_strided_staged_tiles(p.outer, p.inner, cols) < int64_t(kStridedStagedCtasPerSm) * p.sm_count) return {};
  return {cols, groups};
}

// The chunks of D per tile of the split mode (kStridedStreamThreads says when): enough (tile, chunk)
// CTAs of `threads` for kStridedSplitWaves device fills, at most one per kStridedSplitMinRows D-rows a
// D-group; < 2: no split.
inline int64_t strided_split_chunks(const SoftmaxProblem& p, int64_t tiles, int64_t threads, int64_t cols) {
  const int64_t want = ceil_div(kStridedSplitWaves * device_threads(p), tiles * threads);
  const int64_t most = p.dim_size / (int64_t(kStridedSplitMinRows) * (threads / cols));
  return want < most ? want : most;
}

// The cluster of a streamed launch of `tiles` tiles in CTAs of `threads` (kStridedStreamThreads says
// why): 1 where the CTAs fill the device, else the smallest power of two that does, at most
// cluster_cap and at most what leaves every CTA of the cluster a D-row a thread.
inline int strided_stream_cluster(const SoftmaxProblem& p, int64_t tiles, int64_t threads, int64_t cols) {
  if (!clusters_available(p)) return 1;
  const int64_t groups = threads / cols;
  const int cap = cluster_cap(p, int(threads), false);
  int cl = 1;
  while (cl < cap && tiles * threads * cl < device_threads(p) && int64_t(cl) * 2 * groups <= p.dim_size) cl *= 2;
  return cl;
}

// Whether a cached strided forward of `vec`-element accesses prefetches the tiles ahead into L2
// (kStridedPrefetchDivisor says why).
inline bool strided_prefetches(const SoftmaxProblem& p, int vec) {
  return p.prefetch && !p.backward && p.acc_bytes == 4 && vec > 1 && p.dim_size >= kStridedPrefetchMinRows &&
         p.outer * p.dim_size * p.inner * p.in_bytes >= p.l2_bytes;
}

// Whether a strided cached forward of `vec`-element accesses (vec > 1: vector accesses) takes the deep-memory
// shapes (kStridedRawCtaThreads says which and why).
inline bool strided_deep_forward(const SoftmaxProblem& p, int vec) {
  return p.memory_depth == MemoryDepth::kDeep && !p.backward && vec > 1 && p.acc_bytes == 4 && clusters_available(p);
}

inline SoftmaxPlan plan_strided(const SoftmaxProblem& p) {
  SoftmaxPlan s;
  s.variant = SoftmaxVariant::kStrided;
  s.mode = SoftmaxMode::kStrided;
  s.vec = softmax_columns_vectorizable(p) ? softmax_vec_width(p) : 1;
  const int kv = softmax_strided_rows(p.backward, s.vec, p.in_bytes, p.out_bytes, p.acc_bytes);  // D-rows cached per thread
  s.elems_per_thread = kv * s.vec;
  const int load_bytes = p.backward ? p.out_bytes : p.in_bytes;
  const int64_t inner_units = p.inner / s.vec;
  const int64_t total_cols = p.outer * inner_units;
  int64_t c = strided_line_columns(p, s.vec);  // columns per block
  const int64_t d = p.dim_size;
  const int64_t g_needed = ceil_div(d, kv);  // D-groups (threads per column) that cache a column
  auto smem_ok = [&](int64_t threads, int64_t cols, int64_t cluster, bool streaming) {
    const int value_bytes = softmax_strided_value_bytes(p.backward, streaming, p.acc_bytes);
    return softmax_strided_smem_bytes(threads, cols, s.vec, cluster, value_bytes) <= kStridedMaxSmem;
  };
  auto threads_for = [](int64_t cols, int64_t groups) { return round_up(cols * groups, cols > 32 ? cols : 32); };
  const int single_cap = clusters_available(p) ? kStridedClusterAbove : kStridedMaxThreads;
  const int64_t c_line = c;
  const bool elements = s.vec == 1;
  auto streamed = [&](int64_t cols, int64_t threads, int cl) {
    s.columns = int(cols);
    s.threads = int(threads);
    s.cluster = cl;
    s.streaming = true;
    return s;
  };
  // Streaming where D is too long to cache (and element backwards for which strided_element_stream_shape
  // finds no shape): whole lines (or whole outer indices: kStridedWholeOuterUnits) in
  // kStridedStreamThreads, over a cluster where the tiles alone leave the device short of threads
  // (strided_stream_cluster). Where even that leaves the device short of threads, the split mode
  // (kStridedSplitMinRows).
  auto stream = [&] {
    const bool whole = inner_units % c_line != 0 && inner_units <= kStridedWholeOuterUnits &&
                       smem_ok(kStridedStreamThreads, inner_units, 1, true);
    const int64_t cols = whole ? inner_units : c_line;
    const int64_t threads = whole ? kStridedStreamThreads : threads_for(c_line, ceil_div(kStridedStreamThreads, c_line));
    const int64_t tiles = softmax_strided_tiles(p.outer, p.inner, s.vec, cols);
    int cl = strided_stream_cluster(p, tiles, threads, cols);
    while (cl > 1 && !smem_ok(threads, cols, cl, true)) cl /= 2;
    if (p.workspace && p.sm_count > 0 && tiles > 0 && tiles * threads * cl < device_threads(p)) {
      const int64_t chunks = strided_split_chunks(p, tiles, threads, cols);
      if (chunks >= 2 && smem_ok(threads, cols, 1, true)) {
        streamed(cols, threads, 1);
        s.chunks = chunks;
        s.workspace_bytes = tiles * chunks * cols * s.vec * softmax_strided_value_bytes(p.backward, true, p.acc_bytes);
        return s;
      }
    }
    return streamed(cols, threads, cl);
  };
  // Raw 16-bit rows with clusters: whole lines in CTAs of at most kStridedRawCtaThreads; on a deep-memory device
  // the float forward too, and the raw rows half lines where a whole one needs a cluster (strided_deep_forward), not
  // prefetched.
  const bool raw = clusters_available(p) && softmax_strided_raw(p.backward, s.vec, p.in_bytes, p.acc_bytes);
  const bool deep = strided_deep_forward(p, s.vec);
  const bool small_ctas = raw || deep;
  const bool half_lines = raw && deep && c * s.vec * load_bytes == kStridedRowBytes &&
                          c * g_needed > kStridedRawCtaThreads &&
                          pow2_ceil(ceil_div(c / 2 * g_needed, kStridedRawCtaThreads)) <=
                              std::min(kMaxPortableCluster, cluster_cap(p, kStridedRawCtaThreads, false));
  auto cached = [&](int64_t cols, int64_t cl, int64_t threads) {
    s.columns = int(cols);
    s.cluster = int(cl);
    s.threads = int(threads);
    s.streaming = false;
    s.prefetch = strided_prefetches(p, s.vec) && !half_lines;
    return s;
  };
  // Element accesses at short D: staged (strided_staged_shape; backwards, and 16-bit forwards); also 128-bit
  // backwards whose D-rows start off a 32-byte sector. The staged kernel copies 16-byte chunks from
  // any alignment: the plan takes element accesses.
  if (const StagedShape staged = strided_staged_shape(p, s.vec); staged.columns > 0) {
    s.vec = 1;
    s.columns = int(staged.columns);
    s.groups = staged.groups;
    s.threads = kStridedStagedThreads;
    s.cluster = 1;
    s.streaming = false;
    s.staged = true;
    s.elems_per_thread = 0;
    return s;
  }
  // Other backwards with element accesses: streamed where strided_element_stream_shape finds a shape
  // whose tiles in flight fit L2 (kStridedElementStreamBytes says why): rather than split a tile that
  // needs more than one CTA over a cluster, and at any D where strided_element_stream_wide (short D too).
  if (elements && p.backward) {
    const bool wide = strided_element_stream_wide(p, c_line);
    StridedStreamShape e;
    if ((wide || c * g_needed > single_cap) && strided_element_stream_shape(p, c_line, wide, &e) &&
        smem_ok(e.threads, e.columns, e.cluster, true))
      return streamed(e.columns, e.threads, e.cluster);
  }
  const bool whole_line = c_line * load_bytes == kStridedRowBytes;
  if (half_lines) c /= 2;
  if (c * g_needed > (small_ctas ? kStridedRawCtaThreads : single_cap)) {
    if (!small_ctas && clusters_available(p)) {
      // Narrower lines in one CTA rather than a cluster (kStridedMinRowBytes; element accesses also
      // down to kStridedMinElementColumns where that is narrower).
      auto narrow_ok = [&](int64_t cols) {
        return cols * s.vec * load_bytes >= kStridedMinRowBytes || (elements && cols >= kStridedMinElementColumns);
      };
      int64_t h = c;
      while (h * g_needed > kStridedClusterAbove && narrow_ok(h / 2)) h /= 2;
      if (h * g_needed <= kStridedClusterAbove) c = h;
      // 16-bit element forwards whose inner holds a whole line: kStridedMinElementColumns columns over
      // the smallest cluster of CTAs of at most kStridedElementClusterThreads threads (which says why).
      if (elements && !p.backward && p.in_bytes == 2 && whole_line && h * g_needed > kStridedClusterAbove &&
          h == kStridedMinElementColumns) {
        for (int64_t cl = 2; cl <= cluster_cap(p, kStridedElementClusterThreads, false) && cl <= kMaxPortableCluster;
             cl *= 2) {
          const int64_t threads = threads_for(h, ceil_div(g_needed, cl));
          if (threads <= kStridedElementClusterThreads && smem_ok(threads, h, cl, false)) return cached(h, cl, threads);
        }
      }
    }
  }
  if (c * g_needed <= (small_ctas ? kStridedRawCtaThreads : single_cap)) {
    // Short D: widen the tile (more columns) until a block has kStridedMinThreads threads
    // (kStridedMinFloatElementThreads for forwards of 4-byte inputs in element accesses whose outer
    // index holds a whole line).
    const bool float_elements = elements && !p.backward && load_bytes == 4 && p.acc_bytes == 4 &&
                                c_line * load_bytes == kStridedRowBytes;
    const int64_t min_threads = float_elements ? kStridedMinFloatElementThreads : kStridedMinThreads;
    while (c * 2 * g_needed <= min_threads && c * 2 <= pow2_ceil(total_cols) &&
           smem_ok(threads_for(c * 2, g_needed), c * 2, 1, false))
      c *= 2;
    return cached(c, 1, threads_for(c, g_needed));
  }
  if (!clusters_available(p)) return stream();
  for (int t : kStridedRawClusterThreads) {
    if (!small_ctas && t < kStridedClusterAbove) continue;  // float: 512 threads first, as measured (H100)
    // >= 2 at the first size tried: c * g_needed exceeds the single-CTA cap above
    const int64_t cl = pow2_ceil(ceil_div(c * g_needed, t));
    if (cl > cluster_cap(p, t, false)) continue;
    const int64_t threads = threads_for(c, ceil_div(g_needed, cl));
    if (smem_ok(threads, c, cl, false)) return cached(c, cl, threads);
  }
  // D too long for those: narrower tiles over the largest cluster (kStridedSectorBytes,
  // kStridedMinElementColumns). Not for element backwards, which stream whole lines here (no shape of
  // strided_element_stream_shape fits L2; H100, bf16 [65, 2000, 1023] dim 1, before that rule took it:
  // 512 x 32 x 16 0.329 of the limit against whole-line streaming's 0.397).
  if (elements && p.backward) return stream();
  const int64_t groups = ceil_div(g_needed, cluster_cap(p, kStridedClusterAbove, true));  // per CTA
  int64_t n = c_line;
  while (n > 1 && n * groups > kStridedClusterAbove) n /= 2;
  if (n * groups <= kStridedClusterAbove && n * s.vec * load_bytes >= kStridedSectorBytes &&
      (!elements || n >= kStridedMinElementColumns)) {
    const int64_t cl = pow2_ceil(ceil_div(n * g_needed, kStridedClusterAbove));
    const int64_t threads = threads_for(n, ceil_div(g_needed, cl));
    if (smem_ok(threads, n, cl, false)) return cached(n, cl, threads);
  }
  return stream();
}

}  // namespace softmax_detail

// nullptr if `v` can run `p`, else why not (static text; the caller adds the sizes).
inline const char* softmax_variant_rejects(SoftmaxVariant v, const SoftmaxProblem& p) {
  const bool rows = p.inner == 1;
  switch (v) {
    case SoftmaxVariant::kAuto:
      return nullptr;
    case SoftmaxVariant::kWarp:
      if (!rows) return "inner > 1 (the softmax dim is not the innermost in memory); only 'strided' takes it";
      if (p.dim_size > softmax_warp_max_dim(p.acc_bytes))
        return "D exceeds the warp variant's limit (1024 elements; 512 for float64)";
      return nullptr;
    case SoftmaxVariant::kVec:
      if (!rows) return "inner > 1 (the softmax dim is not the innermost in memory); only 'strided' takes it";
      if (!softmax_rows_vectorizable(p) && !softmax_rows_edge_vectorizable(p) && !softmax_rows_shift_vectorizable(p))
        return "it needs 16-byte aligned pointers and an input row stride equal to the row length modulo the "
               "128-bit vector width, so that every tensor's rows start at the same offset from that alignment "
               "(or, forward, 16-bit rows the vector width divides into an aligned output) ('scalar' takes any "
               "layout)";
      if (p.dim_size > softmax_block_capacity(p, softmax_vec_width(p)))
        return "the row does not fit one block's registers (1024 threads x 32 elements forward, x 8-32 "
               "backward); 'long_row' takes it";
      return nullptr;
    case SoftmaxVariant::kScalar:
    case SoftmaxVariant::kLongRow:
    case SoftmaxVariant::kSplit:
      if (!rows) return "inner > 1 (the softmax dim is not the innermost in memory); only 'strided' takes it";
      return nullptr;
    case SoftmaxVariant::kStrided:
      if (rows)
        return "inner == 1 (the softmax dim is contiguous); 'warp', 'vec', 'scalar', 'long_row', 'split' "
               "and 'grid' take it";
      return nullptr;
    case SoftmaxVariant::kGrid: {
      if (!rows) return "inner > 1 (the softmax dim is not the innermost in memory); only 'strided' takes it";
      if (!p.workspace) return "it needs a workspace from the caller (the torch ops provide one)";
      SoftmaxPlan s;
      if (!softmax_detail::plan_grid(p, v, softmax_rows_vectorizable(p) ? softmax_vec_width(p) : 1, true, &s))
        return "the row is longer than one CTA an SM caches ('long_row' and 'split' take it)";
      return nullptr;
    }
  }
  return "unknown variant";
}

// The launch plan of variant `v` (not kAuto) on `p`; `v` must not reject `p`.
inline SoftmaxPlan plan_softmax(SoftmaxVariant v, const SoftmaxProblem& p) {
  using namespace softmax_detail;
  const int w = softmax_vec_width(p);
  const int row_vec = softmax_rows_vectorizable(p) ? w : 1;
  const bool edges = softmax_rows_edge_vectorizable(p);  // D % w != 0, so row_vec == 1; resident kernels only
  switch (v) {
    case SoftmaxVariant::kWarp: {
      SoftmaxPlan s;
      s.variant = v;
      s.mode = SoftmaxMode::kWarp;
      s.vec = row_vec;
      s.warp_log2 = log2_ceil(p.dim_size);
      s.threads = softmax_warp_small_blocks(p, s.vec, s.warp_log2) ? kWarpSmallBlockThreads : kWarpBlockThreads;
      s.packed = softmax_warp_packed(p, s.vec, s.warp_log2);
      s.elems_per_thread = softmax_warp_elems_per_thread(s.warp_log2, s.vec, p.backward, p.out_bytes, s.packed);
      return s;
    }
    case SoftmaxVariant::kVec: {
      SoftmaxPlan s = plan_block(p, v, w, edges);
      s.shifted = softmax_rows_shift_vectorizable(p);
      return s;
    }
    case SoftmaxVariant::kScalar:
      if (p.dim_size <= softmax_block_capacity(p, 1)) return plan_block(p, v, 1);
      return plan_split(p, v, 1, /*one_block_per_row=*/true);
    case SoftmaxVariant::kLongRow: {
      SoftmaxPlan s;
      if (plan_cluster(p, edges ? w : row_vec, edges, &s)) {
        SoftmaxPlan g;
        if (cluster_backward_yields_to_grid(p, s) && plan_grid(p, v, row_vec, false, &g)) return g;
        return s;
      }
      if (plan_grid(p, v, row_vec, false, &s)) return s;
      return plan_split(p, v, row_vec, false);
    }
    case SoftmaxVariant::kGrid: {
      SoftmaxPlan s;
      if (plan_grid(p, v, row_vec, true, &s)) return s;
      return SoftmaxPlan{};  // rejected (softmax_variant_rejects)
    }
    case SoftmaxVariant::kSplit:
      return plan_split(p, v, row_vec, false);
    case SoftmaxVariant::kStrided:
      return plan_strided(p);
    case SoftmaxVariant::kAuto:
      break;
  }
  return SoftmaxPlan{};
}

// Whether strided plan `s` is the streamed element backward of strided_element_stream_shape.
inline bool strided_element_streams(const SoftmaxProblem& p, const SoftmaxPlan& s) {
  using namespace softmax_detail;
  StridedStreamShape e;
  const int64_t line = strided_line_columns(p, 1);
  return s.vec == 1 && p.backward && s.streaming &&
         strided_element_stream_shape(p, line, strided_element_stream_wide(p, line), &e) && e.threads == s.threads &&
         e.columns == s.columns && e.cluster == s.cluster;
}

// The dispatcher: the variant for `p`, with its plan and (in plan.why) the reason.
inline SoftmaxPlan choose_softmax(const SoftmaxProblem& p) {
  using namespace softmax_detail;
  SoftmaxPlan s;
  if (p.inner > 1) {
    s = plan_softmax(SoftmaxVariant::kStrided, p);
    s.why = s.staged ? "the softmax dim is not innermost; element accesses (or a 128-bit backward whose D-rows "
                       "start off a 32-byte sector) at short D: each tile's "
                       "D-rows copied to shared memory in aligned 16-byte chunks, a column a thread or a few "
                       "thread groups: one read"
            : !s.streaming ? "the softmax dim is not innermost: threads along inner, D split over threads "
                           "(and a cluster) with the tile cached: one read"
            : strided_element_streams(p, s)
                ? "the softmax dim is not innermost; a backward of element accesses, streamed in the shape "
                  "whose tiles in flight fit L2: two reads, the second mostly from L2"
            : s.chunks > 1
                ? "the softmax dim is not innermost; D too long to cache, and too few tiles of columns to fill "
                  "the device: D split into chunks, a CTA each, partials through a workspace, two reads"
                : "the softmax dim is not innermost; D too long to cache a tile of columns: two reads";
    return s;
  }
  if (p.dim_size <= softmax_warp_max_dim(p.acc_bytes) && !softmax_rows_leave_warp(p)) {
    s = plan_softmax(SoftmaxVariant::kWarp, p);
    s.why = "short rows: a warp (or part of one) per row, the row in registers";
    return s;
  }
  const bool vectorizable =
      softmax_rows_vectorizable(p) || softmax_rows_edge_vectorizable(p) || softmax_rows_shift_vectorizable(p);
  const int block_threads = clusters_available(p) ? softmax_vec_max_threads(p) : kResidentMaxThreads;
  const int64_t elems = softmax_resident_elems(p, vectorizable ? softmax_vec_width(p) : 1);
  const int64_t block_cap = int64_t(block_threads) * elems;
  if (p.dim_size <= block_cap) {
    if (vectorizable) {
      s = plan_softmax(SoftmaxVariant::kVec, p);
      s.why = s.edges     ? "the row fits one block's registers; aligned bases, rows off the vector width: 128-bit "
                            "accesses, each row's head and tail elements one at a time"
              : s.shifted ? "the row fits one block's registers; 16-bit input rows off the alignment, an aligned "
                            "output: 128-bit accesses, the input staged in shared memory in aligned 16-byte "
                            "chunks and realigned"
                          : "the row fits one block's registers; aligned: 128-bit accesses";
    } else {
      s = plan_softmax(SoftmaxVariant::kScalar, p);
      s.why = "the row fits one block's registers; not 16-byte aligned (or D / row stride not a multiple "
              "of the vector width): element accesses";
    }
    return s;
  }
  s = plan_softmax(SoftmaxVariant::kLongRow, p);
  s.why = s.mode == SoftmaxMode::kGrid
              ? "the row is longer than a cluster caches (or no clusters, or a backward whose cluster CTAs would "
                "run one an SM): split over CTAs anywhere on the device, each caching its slice, combined "
                "through global memory: one read"
          : s.mode != SoftmaxMode::kResident
              ? "the row is longer than the device caches (or no workspace): online max+sum per chunk, then "
                "a write pass"
          : s.smem_elems > 0
              ? "the row is longer than one block caches: split over a thread-block cluster, cached in "
                "registers and shared memory, combined through distributed shared memory: one read"
          : p.dim_size <= int64_t(kVecMaxThreadsWithClusters) * elems
              ? "a 16-bit forward row past 320 threads of one block on a deep-memory device: "
                "split over a thread-block cluster, cached in registers, combined through distributed shared "
                "memory: one read"
              : "the row is longer than one block caches: split over a thread-block cluster, cached in "
                "registers, combined through distributed shared memory: one read";
  return s;
}

// Bytes of the workspace the launcher needs for `s` on `outer` rows (0: none): grid plans (zeroed), and
// strided split plans (any contents; the size plan_strided computed for the problem's shape, which the
// launcher checks).
inline bool softmax_workspace_zeroed(const SoftmaxPlan& s) { return s.mode == SoftmaxMode::kGrid; }
inline int64_t softmax_workspace_bytes(const SoftmaxPlan& s, int64_t outer) {
  if (s.mode == SoftmaxMode::kStrided) return s.workspace_bytes;
  return s.mode == SoftmaxMode::kGrid ? softmax_grid_workspace(outer, s.chunks).bytes : 0;
}

// explain's note on a cluster backward of 128-bit accesses whose two-CTA size was probed
// (SoftmaxProblem::bwd_two_cta_threads): whether other CTAs share its SMs.
inline const char* resident_backward_occupancy(const SoftmaxProblem& p, const SoftmaxPlan& s) {
  if (!p.backward || p.bwd_two_cta_threads <= 0 || s.cluster == 1 || s.vec == 1 || s.edges) return "";
  return s.threads <= cluster_backward_two_cta_threads(p.bwd_two_cta_threads, p.out_bytes) ? ", at least two CTAs an SM"
                                                                                            : ", one CTA an SM";
}

// "variant=vec: D=4096, outer=8, inner=1: <why>; <configuration>"
inline std::string softmax_explain(const SoftmaxProblem& p, const SoftmaxPlan& s) {
  char buf[512];
  const char* access = s.vec == 1 ? "element accesses"
                       : s.edges  ? "128-bit accesses, head and tail elements one at a time"
                       : s.shifted ? "128-bit accesses, the input's rows staged in shared memory and realigned"
                                  : "128-bit accesses";
  int n = std::snprintf(buf, sizeof(buf), "variant=%s: D=%lld, outer=%lld, inner=%lld", softmax_variant_name(s.variant),
                        static_cast<long long>(p.dim_size), static_cast<long long>(p.outer),
                        static_cast<long long>(p.inner));
  std::string out(buf, n > 0 ? size_t(n) : 0);
  if (s.why && *s.why) {
    out += ": ";
    out += s.why;
  }
  switch (s.mode) {
    case SoftmaxMode::kWarp:
      n = std::snprintf(buf, sizeof(buf), " [%d lanes per row, %d elements per lane, %s%s]",
                        (1 << s.warp_log2) / s.elems_per_thread, s.elems_per_thread, access,
                        s.packed                           ? ", rows packed several a warp (a deep-memory device)"
                        : s.threads == kWarpSmallBlockThreads ? ", blocks of two warps (a deep-memory device)"
                                                               : "");
      break;
    case SoftmaxMode::kResident:
      if (s.smem_elems > 0) {
        n = std::snprintf(buf, sizeof(buf),
                          " [%d CTA(s) x %d threads x %d elements per row (%s%d in shared memory), %s%s]", s.cluster,
                          s.threads, s.elems_per_thread, s.raw ? "the rest kept as loaded, " : "", s.smem_elems, access,
                          s.prefetch ? ", the rows ahead prefetched into L2" : "");
      } else {
        n = std::snprintf(buf, sizeof(buf), " [%d CTA(s) x %d threads x %d elements per row%s, %s%s%s]", s.cluster,
                          s.threads, s.elems_per_thread, s.raw ? " (kept as loaded)" : "", access,
                          s.two_pass   ? ", two passes: dy and y loaded again after the all-reduce (L1 / L2 evict_last, "
                                         "then evict_first)"
                          : s.one_unit   ? ", one unit a thread (a deep-memory device)"
                          : s.full_cache ? ", the whole register cache a thread (a deep-memory device)"
                                         : "",
                          resident_backward_occupancy(p, s));
      }
      break;
    case SoftmaxMode::kSplit:
      n = std::snprintf(buf, sizeof(buf), " [%lld chunk(s) per row, %lld rows per launch pair, %d threads, %s]",
                        static_cast<long long>(s.chunks), static_cast<long long>(s.group_rows), s.threads, access);
      break;
    case SoftmaxMode::kStrided:
      if (s.staged) {
        n = std::snprintf(buf, sizeof(buf), " [%d column(s) x %d threads per CTA, cluster %d, staged in shared "
                          "memory, %d thread group(s) a column, 16-byte copies in, element stores out]", s.columns,
                          s.threads, s.cluster, s.groups);
      } else if (s.chunks > 1) {
        n = std::snprintf(buf, sizeof(buf), " [%d column(s) x %d threads per CTA, cluster %d, streamed twice, %lld "
                          "chunks of D, %s]", s.columns, s.threads, s.cluster, static_cast<long long>(s.chunks), access);
      } else {
        n = std::snprintf(buf, sizeof(buf), " [%d column(s) x %d threads per CTA, cluster %d, %s, %s]", s.columns,
                          s.threads, s.cluster,
                          s.streaming  ? "streamed twice"
                          : s.prefetch ? "cached, the tiles ahead prefetched into L2"
                                       : "cached",
                          access);
      }
      break;
    case SoftmaxMode::kGrid:
      n = std::snprintf(buf, sizeof(buf),
                        " [%lld CTA(s) x %d threads x %d elements per row (%d in shared memory), partials through "
                        "global memory, %s]",
                        static_cast<long long>(s.chunks), s.threads, s.elems_per_thread, s.smem_elems, access);
      break;
  }
  if (n > 0) out.append(buf, size_t(n));
  return out;
}

}  // namespace fastact
