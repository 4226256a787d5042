// Variant `long_row`: inner == 1, rows too long for one block's registers (tens of thousands to
// millions of elements); never three passes over HBM.
//   sm_90, the row fits a cluster (<= 16 CTAs x 1024 threads x 32 elements forward): the row is
//     split over a thread-block cluster, each CTA caching its slice in registers; the max and the sum
//     are combined through distributed shared memory. HBM is read once.
//       forward, 128-bit path, float arithmetic, CTAs of one per SM: softmax_cluster_fwd_kernel
//       below, persistent, the next row staged in shared memory; otherwise (smaller CTAs, the
//       backward, element accesses, float64): block.cuh's kernels, one row per cluster.
//   otherwise (no clusters, or longer rows): variant `split` (split.cuh): an online max+sum pass per
//     chunk, then one write pass, several CTAs per row when rows are few, L2-sized row groups.
// 128-bit accesses when aligned, element accesses otherwise, in both modes.
#pragma once

#include <mutex>
#include <vector>

#include "fastact/copy_async.cuh"
#include "fastact/softmax/block.cuh"
#include "fastact/softmax/split.cuh"

namespace fastact::softmax_impl {

// One thread's staging slots for kUnits 16-byte units of the next row, in a staged kernel's dynamic
// shared memory: slot j at slot0[j * T] (T = blockDim.x), so each thread reads only the slots it
// filled (no barrier) and a warp's slots are consecutive (conflict-free).
template <typename T, int kVec, int kUnits>
struct RowStage {
  using Unit = AlignedVector<T, kVec>;
  static_assert(sizeof(Unit) == 16, "cp.async moves 16-byte units");
  Unit* slot0;
  int stride;
  // Copies unit j (from src_unit0 + j * step) into slot j with cp.async.
  FASTACT_DEVICE void issue(int j, const T* src_unit0, int step) const {
    copy_async_16(slot0 + j * stride, src_unit0 + j * step);
  }
  FASTACT_DEVICE Unit operator[](int j) const { return slot0[j * stride]; }
};

// The dynamic shared memory of a staged kernel, as 16-byte units.
FASTACT_DEVICE AlignedVector<float, 4>* stage_units() {
  extern __shared__ __align__(16) unsigned char stage_bytes[];
  return reinterpret_cast<AlignedVector<float, 4>*>(stage_bytes);
}

// The staged kernel runs where the plan's CTAs have more than this many threads, i.e. one CTA per SM
// (64 registers a thread). Measured on the H100 (bench/NOTES.md): with 1024-thread CTAs staging took
// f32 rows of 262144 from 253 to 218 us and 16-bit ones from 304 to 254; with two or more CTAs per SM
// (512 or 256 threads) the one-row-per-cluster kernel was as fast or faster (f32 65536: 208 vs 212 us
// at 4 x 512), the other CTA on the SM already overlapping its phases.
constexpr int kStageAboveThreads = 512;

// Forward of the cluster mode, 128-bit path, 1024-thread CTAs: as many clusters as the device holds
// at once, each looping over rows (row first + k * clusters). Why: a cluster that does one row and
// exits moves no data while it reduces and while the next CTAs launch, and a CTA that fills its SM
// has nobody there to overlap those phases with. Here a thread copies its slice of the next row into
// shared memory with cp.async, unit by unit, as soon as it has taken the same unit of this row into
// registers, so the next row streams in while this one is reduced and written.
//
// Layout as softmax_block_fwd_kernel (block.cuh): unit j < kVecs of thread t in CTA rank r is
// r * T * kVecs + j * T + t; its staging slot is stage[j * T + t] (each thread reads only its own
// slots: no barrier around them). Dynamic shared memory: kVecs * T 16-byte units.
template <typename in_t, typename out_t, typename Epi, int kVec>
__global__ __launch_bounds__(kResidentMaxThreads, 1) void softmax_cluster_fwd_kernel(const in_t* __restrict__ x,
                                                                                     out_t* __restrict__ y,
                                                                                     int64_t rows, int64_t dim,
                                                                                     int64_t row_stride, int cluster,
                                                                                     Epi epi) {
  using A = acc_t<out_t>;
  constexpr int kElems = block_fwd_elems<out_t, kVec>();
  constexpr int kVecs = kElems / kVec;
  static_assert(kVecs >= 1 && kElems % kVec == 0, "whole accesses per thread");
  using Stage = RowStage<in_t, kVec, kVecs>;
  const Stage stage{reinterpret_cast<typename Stage::Unit*>(stage_units()) + threadIdx.x, static_cast<int>(blockDim.x)};
  __shared__ RowScratch<MaxSum<A>> scratch;
  exchange_init(scratch.bar, cluster);
  const ResidentSlice s = resident_slice<kVec, kVecs>(dim, cluster);
  const int64_t row_step = gridDim.x / cluster;
  int round = 0;  // RowScratch alternates its buffers by round: successive rows need no extra barrier
  // One commit group per unit, always kVecs of them per row (empty where there is nothing to copy).
  int64_t row = blockIdx.x / cluster;
  if (row < rows) {
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (j < s.nvalid) stage.issue(j, x + row * row_stride + s.first, s.step);
      copy_async_commit();
    }
  }
  for (; row < rows; row += row_step) {
    const bool more = row + row_step < rows;
    const in_t* next = x + (row + row_step) * row_stride + s.first;
    A v[kVecs][kVec];
    // Before unit j is read, the pending groups are units j.. of this row and units ..j-1 of the next,
    // so "all but kVecs - 1 landed" means unit j has. Its slot then takes the next row's unit j (a
    // thread's own load of a slot precedes its later copy into it).
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      copy_async_wait<kVecs - 1>();
      if (j < s.nvalid) {
        to_acc(stage[j], v[j]);
        if (more) stage.issue(j, next, s.step);
      }
      copy_async_commit();
    }
    resident_forward<Epi, kVec, kVecs>(v, s, y + row * dim + s.first, epi, scratch, round, cluster);
  }
}

namespace detail {

// max_active_clusters of kKernel (cluster >= 2), cached per device and configuration. The first query
// on a device also lets kKernel use kMaxSmem bytes of dynamic shared memory (the most any of its
// configurations asks for: one value, whatever the order of the queries).
template <auto kKernel, size_t kMaxSmem>
int resident_clusters(int cluster, int threads, size_t smem) {
  struct Entry {
    int device, cluster, threads;
    size_t smem;
    int clusters;
  };
  static std::mutex mutex;
  static std::vector<Entry> cache;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  std::lock_guard<std::mutex> lock(mutex);
  for (const Entry& e : cache) {
    if (e.device == device && e.cluster == cluster && e.threads == threads && e.smem == smem) return e.clusters;
  }
  int clusters = 0;
  cudaError_t err =
      cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kMaxSmem));
  if (err == cudaSuccess && cluster > kMaxPortableCluster) err = allow_large_clusters<kKernel>();
  if (err == cudaSuccess) {
    clusters = max_active_clusters<kKernel>(cluster, threads, smem);
  } else {
    (void)cudaGetLastError();
  }
  cache.push_back({device, cluster, threads, smem, clusters});
  return clusters;
}

// The cluster mode's forward: the staged persistent kernel where it pays, else one row per cluster
// (block.cuh). Returns cudaErrorInvalidConfiguration for a plan that does not cache the row.
template <typename in_t, typename out_t, typename Epi, int kVec>
cudaError_t cluster_forward(const in_t* x, out_t* y, int64_t rows, int64_t dim, int64_t row_stride, int threads,
                            int cluster, cudaStream_t stream) {
  if constexpr (kVec * sizeof(in_t) == 16 && sizeof(acc_t<out_t>) == 4) {
    constexpr auto kKernel = softmax_cluster_fwd_kernel<in_t, out_t, Epi, kVec>;
    constexpr int kVecs = block_fwd_elems<out_t, kVec>() / kVec;
    constexpr size_t kMaxSmem = size_t(kVecs) * kResidentMaxThreads * 16;
    if (threads > kStageAboveThreads && threads <= kResidentMaxThreads && threads % kWarpSize == 0 &&
        cluster >= 2 && cluster <= kMaxCluster && int64_t(cluster) * threads * kVecs * kVec >= dim) {
      const size_t smem = size_t(kVecs) * threads * 16;
      const int64_t resident = resident_clusters<kKernel, kMaxSmem>(cluster, threads, smem);
      if (resident >= 1) {
        const int64_t clusters = rows < resident ? rows : resident;
        return launch<kKernel>(clusters * cluster, threads, smem, cluster, stream, x, y, rows, dim, row_stride,
                               cluster, Epi{});
      }
    }
  }
  return block_forward<in_t, out_t, Epi, kVec>(x, y, rows, dim, row_stride, threads, cluster, stream);
}

template <typename in_t, typename out_t, typename Epi, int kVec>
cudaError_t long_row_forward(const in_t* x, out_t* y, int64_t rows, int64_t dim, int64_t row_stride,
                             const SoftmaxPlan& plan, cudaStream_t stream) {
  if (plan.mode == SoftmaxMode::kResident)
    return cluster_forward<in_t, out_t, Epi, kVec>(x, y, rows, dim, row_stride, plan.threads, plan.cluster, stream);
  return split_forward<in_t, out_t, Epi, kVec>(x, y, rows, dim, row_stride, plan.chunks, plan.group_rows, stream);
}

template <typename in_t, typename out_t, typename Epi, int kVec>
cudaError_t long_row_backward(const out_t* dy, const out_t* y, in_t* dx, int64_t rows, int64_t dim,
                              const SoftmaxPlan& plan, cudaStream_t stream) {
  if (plan.mode == SoftmaxMode::kResident)
    return block_backward<in_t, out_t, Epi, kVec>(dy, y, dx, rows, dim, plan.threads, plan.cluster, stream);
  return split_backward<in_t, out_t, Epi, kVec>(dy, y, dx, rows, dim, plan.chunks, plan.group_rows, stream);
}

}  // namespace detail
}  // namespace fastact::softmax_impl
