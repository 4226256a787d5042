// The softmax kernels' compile-time shapes and buffer sizes: the one place host (dispatch.h) and device
// (softmax/*.cuh) read them, so the two cannot disagree. Capacities only; which shape a problem gets is dispatch.h's.
// docs/dispatch.md gives the measurements behind the numbers that were tuned ("[name]" points there).
#pragma once

#include <cstdint>

namespace fastact {

namespace softmax_detail {
constexpr int cmin(int a, int b) { return a < b ? a : b; }
constexpr int cmax(int a, int b) { return a > b ? a : b; }
}  // namespace softmax_detail

// Elements per 128-bit access, set by the narrower element type (forward: x and y; backward: grad_input and
// grad_output/output), so the narrow tensor moves in 16-byte accesses and the wide one in 32-byte pairs.
constexpr int softmax_vec_width(int in_bytes, int out_bytes) { return 16 / softmax_detail::cmin(in_bytes, out_bytes); }

// Register bytes a thread of the block, cluster and strided kernels caches: 32 of the 64 registers a thread of a
// 1024-thread block has; the rest hold addresses, exp temporaries and reductions.
constexpr int kResidentRegBytes = 128;
constexpr int kResidentMaxThreads = 1024;  // the hardware's largest block

// Elements a thread caches. Forward: accumulation values (exp computed once). Backward: grad_output and output as
// loaded, two arrays; 16-bit elements pack two a register in 128-bit vectors, one with element accesses.
constexpr int softmax_resident_elems(bool backward, int vec, int out_bytes, int acc_bytes) {
  return backward ? kResidentRegBytes / (2 * (vec > 1 ? out_bytes : (out_bytes > 4 ? out_bytes : 4)))
                  : kResidentRegBytes / acc_bytes;
}
// The cluster forward of 16-bit inputs in 128-bit accesses keeps its cache as loaded (twice the elements in the same
// registers; softmax computes exp twice) [long-row-raw].
constexpr bool softmax_resident_raw(bool backward, int vec, int in_bytes, int acc_bytes) {
  return !backward && vec > 1 && vec * in_bytes == 16 && in_bytes < acc_bytes;
}
constexpr int softmax_resident_raw_elems(int in_bytes) { return kResidentRegBytes / in_bytes; }

// The strided forward caches 16-bit 128-bit D-rows as loaded [strided-raw].
constexpr bool softmax_strided_raw(bool backward, int vec, int in_bytes, int acc_bytes) {
  return !backward && vec > 1 && in_bytes < acc_bytes;
}
// Bytes of one value of the strided column all-reduce: (max, sum) pairs in streaming and float forwards.
constexpr int softmax_strided_value_bytes(bool backward, bool streaming, int acc_bytes) {
  return !backward && (streaming || acc_bytes == 4) ? 2 * acc_bytes : acc_bytes;
}
// D-rows a strided thread caches; element accesses half (each needs a 64-bit address: ptxas spilled at 32).
constexpr int softmax_strided_rows(bool backward, int vec, int in_bytes, int out_bytes, int acc_bytes) {
  return softmax_strided_raw(backward, vec, in_bytes, acc_bytes)
             ? kResidentRegBytes / (vec * in_bytes)
             : (vec > 1 ? softmax_resident_elems(backward, vec, out_bytes, acc_bytes) / vec
                        : softmax_resident_elems(backward, vec, out_bytes, acc_bytes) / 2);
}
// Accesses in flight per thread and array in the strided streaming loops: 64 register bytes, at most 8.
constexpr int softmax_stream_unroll(int vec, int value_bytes) {
  return 64 / (vec * value_bytes) > 8 ? 8 : (64 / (vec * value_bytes) > 1 ? 64 / (vec * value_bytes) : 1);
}

// The warp kernel: rows up to kWarpMaxDim (float64 half) in one warp's registers, blocks of kWarpBlockThreads
// (kWarpSmallBlockThreads where the dispatcher says [warp-small-blocks]).
constexpr int kWarpMaxDim = 1024;
constexpr int softmax_warp_max_dim(int acc_bytes) { return acc_bytes == 8 ? kWarpMaxDim / 2 : kWarpMaxDim; }
constexpr int kWarpBlockThreads = 128;      // up to 16 blocks an SM; a short tail of the grid
constexpr int kWarpSmallBlockThreads = 64;
constexpr int kWarpMinAccesses = 1;         // 128-bit accesses a lane aims at [warp-lanes]
constexpr int kWarpPackedAccesses = 4;      // ... in the packed plan [warp-packed]
// The warp forward keeps 16-bit rows as loaded where a lane reads several 128-bit vectors [warp-raw].
constexpr bool softmax_warp_raw(int vecs_per_lane, int vec, int in_bytes, int acc_bytes) {
  return vecs_per_lane > 1 && vec > 1 && in_bytes < acc_bytes && vec * in_bytes == 16;
}
// The instantiated small-block kernels: 16-bit in and out, 128-bit rows of at least 128 units padded.
constexpr bool softmax_warp_small_blockable(int log2_elems, int vec, int in_bytes, int out_bytes) {
  return in_bytes == 2 && out_bytes == 2 && vec > 1 && (1 << log2_elems) / vec >= 128;
}
// The instantiated packed kernels: 128-bit rows of 4 to 32 units padded.
constexpr bool softmax_warp_packable(int log2_elems, int vec) {
  return vec > 1 && (1 << log2_elems) / vec >= kWarpPackedAccesses && (1 << log2_elems) / vec <= 32;
}
// Elements a lane holds with element accesses: 4 in the backwards of float rows and 16-bit rows of up to 16 padded,
// else 8 [warp-element-lane].
constexpr int softmax_warp_element_lane(bool backward, int out_bytes, int log2_elems) {
  return backward && (out_bytes == 4 || (out_bytes == 2 && log2_elems <= 4)) ? 4 : 8;
}
// Per-lane elements of a padded row of 2^log2_elems: the accesses aimed at, never fewer than elems / 32.
constexpr int softmax_warp_elems_per_thread(int log2_elems, int vec, bool backward, int out_bytes, bool packed) {
  const int accesses = packed ? kWarpPackedAccesses : kWarpMinAccesses;
  const int aim = vec > 1 ? accesses * vec : softmax_warp_element_lane(backward, out_bytes, log2_elems);
  return softmax_detail::cmax((1 << log2_elems) / 32, softmax_detail::cmin(1 << log2_elems, aim));
}

// Clusters: 8 CTAs portable; 16 needs the non-portable attribute and a device that schedules it (probed).
constexpr int kMaxPortableCluster = 8;
constexpr int kMaxCluster = 16;
// The long_row forward that keeps kClusterSmemBytes of a thread's slice in shared memory (cp.async, as loaded), in
// CTAs of at most kClusterSmemMaxThreads: 128-bit input units, float arithmetic [long-row-smem].
constexpr int kClusterSmemBytes = 128;
constexpr int kClusterSmemMaxThreads = 512;
constexpr bool softmax_cluster_smem_supported(int vec, int in_bytes, int acc_bytes) {
  return vec > 1 && vec * in_bytes == 16 && acc_bytes == 4;
}
// Its register part: float inputs the float cache, 16-bit inputs none (all 64 elements in shared memory).
constexpr int softmax_cluster_smem_reg_elems(int in_bytes, int acc_bytes) {
  return in_bytes < acc_bytes ? 0 : kResidentRegBytes / acc_bytes;
}
constexpr int softmax_cluster_smem_elems(int in_bytes) { return kClusterSmemBytes / in_bytes; }
// ... with a register part kept as loaded besides (16-bit rows past 2^19) [long-row-raw-regs].
constexpr bool softmax_cluster_smem_raw_regs(bool backward, int vec, int in_bytes, int acc_bytes) {
  return softmax_cluster_smem_supported(vec, in_bytes, acc_bytes) && softmax_resident_raw(backward, vec, in_bytes,
                                                                                          acc_bytes);
}
constexpr int kLongRowPrefetchDivisor = 4;  // prefetch distance: the clusters in flight over this [long-row-prefetch]

// split: 256 threads x 4 16-byte accesses in flight, 8 CTAs an SM: far above what hides HBM latency.
constexpr int kSplitThreads = 256;
constexpr int kSplitUnroll = 4;
constexpr int kSplitSlotBytes = 16;  // a parked (max, sum) partial, padded

// grid backward with 16-byte units: kGridBwdSmemBytes of the slice of dy and y in shared memory, CTAs of at most
// kGridBwdSmemMaxThreads (96 KB, two CTAs an SM) [grid-bwd-smem].
constexpr int kGridBwdSmemBytes = 192;
constexpr int kGridBwdSmemMaxThreads = 512;
constexpr int softmax_grid_bwd_smem_elems(int vec, int out_bytes) {
  return vec > 1 && vec * out_bytes == 16 ? kGridBwdSmemBytes / 2 / out_bytes : 0;
}
// Blocks a launch at most (every softmax kernel): below 2^31 - 1, a multiple of every cluster size.
constexpr int64_t kMaxGridBlocks = int64_t(1) << 30;
// grid: how long a CTA waits for the rest of its row before it leaves its part to the launch's last CTA (other
// kernels may hold the SMs the row needs); a time-sliced device switches within milliseconds [grid-wait].
constexpr int64_t kGridWaitNs = 4000000;

// The zeroed workspace of a grid plan: a 16-byte header (task ticket; CTAs finished, CTAs that gave up), a 4-byte
// arrival counter a row (padded to 16), a 16-byte partial a (row, CTA), the list of tasks whose CTA gave up.
struct SoftmaxGridWorkspace {
  int64_t arrived = 0, slots = 0, gave_up = 0, bytes = 0;  // byte offsets, and the total
};
inline SoftmaxGridWorkspace softmax_grid_workspace(int64_t rows, int64_t ctas) {
  SoftmaxGridWorkspace w;
  w.arrived = 16;
  w.slots = w.arrived + (rows * 4 + 15) / 16 * 16;
  w.gave_up = w.slots + rows * ctas * 16;
  w.bytes = w.gave_up + rows * ctas * 4;
  return w;
}

// strided: threads a block at most, reduction buffers under the default 48 KB of dynamic shared memory, and the
// prefetch distance (the tiles in flight over kStridedPrefetchDivisor) [strided-prefetch].
constexpr int kStridedMaxThreads = 1024;
constexpr int kStridedMaxSmem = 48 * 1024;
constexpr int kStridedPrefetchDivisor = 4;
// strided staged mode (softmax/staged.cuh): CTAs of 256 threads, 16-byte cp.async chunks, tiles within 113 KB (two
// CTAs an SM of the H100's 228 KB) [strided-staged].
constexpr int kStridedStagedThreads = 256;
constexpr int kStridedStagedChunkBytes = 16;
constexpr int kStridedStagedMaxSmem = 113 * 1024;
constexpr int kStridedStagedForwardMaxSmem = 113 * 1024;

// Staged shared memory: `arrays` tiles of dim D-rows of `columns` elements and a chunk of slack each.
inline int64_t softmax_strided_staged_smem_bytes(int64_t dim, int64_t columns, int elem_bytes, int arrays) {
  return arrays * dim * (columns + kStridedStagedChunkBytes / elem_bytes) * elem_bytes;
}
// ... the forward's x tile, then the groups' (max, sum) float pairs.
inline int64_t softmax_strided_staged_forward_smem_bytes(int64_t dim, int64_t columns, int elem_bytes, int groups) {
  return softmax_strided_staged_smem_bytes(dim, columns, elem_bytes, 1) + (groups > 1 ? groups * columns * 8 : 0);
}
// ... the backward's two tiles, then the groups' float partial dots.
inline int64_t softmax_strided_staged_backward_smem_bytes(int64_t dim, int64_t columns, int elem_bytes, int groups) {
  return softmax_strided_staged_smem_bytes(dim, columns, elem_bytes, 2) + (groups > 1 ? groups * columns * 4 : 0);
}
// Staged tiles: ceil(inner / columns) of each outer index.
inline int64_t softmax_strided_staged_tiles(int64_t outer, int64_t inner, int64_t columns) {
  return outer * ((inner + columns - 1) / columns);
}

// The strided kernel's reduction buffers (ColumnScratch, softmax/common.cuh): two mbarriers, then values of
// value_bytes red[2][R][C * L + 1], res[2][C][L], cta[2][cluster][C][L]; R = threads / 32 where C < 32 is a power of
// two, else threads / C. One D-group in one CTA: the barriers alone.
constexpr int kColumnBarrierBytes = 16;
inline int64_t softmax_strided_smem_bytes(int64_t threads, int64_t columns, int lanes, int64_t cluster,
                                          int64_t value_bytes) {
  const bool warp_levels = columns < 32 && (columns & (columns - 1)) == 0;
  const int64_t reps = warp_levels ? threads / 32 : threads / columns;
  if (!warp_levels && reps == 1 && cluster == 1) return kColumnBarrierBytes;
  const int64_t cl = columns * lanes;
  return kColumnBarrierBytes + (2 * reps * (cl + 1) + 2 * cl + 2 * cluster * cl) * value_bytes;
}
// The column tiles of a strided launch: outer x inner / vec column vectors, `columns` a tile.
inline int64_t softmax_strided_tiles(int64_t outer, int64_t inner, int vec, int64_t columns) {
  return (outer * (inner / vec) + columns - 1) / columns;
}

// The realigning vec forward (block.cuh ShiftedRow) exists for 16-bit in and out, 16-byte units.
constexpr bool softmax_rows_shift_supported(int vec, int in_bytes, int out_bytes) {
  return vec == 8 && in_bytes == 2 && out_bytes == 2;
}

inline bool softmax_ptr_aligned(const void* ptr, int64_t bytes) {
  return reinterpret_cast<std::uintptr_t>(ptr) % static_cast<std::uintptr_t>(bytes) == 0;
}

}  // namespace fastact
