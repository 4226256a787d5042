// Variant `long_row`: inner == 1, rows too long for one block's registers (tens of thousands to
// millions of elements); never three passes over HBM.
//   sm_90, the row fits a cluster (at most 16 CTAs; in the forward with 128-bit accesses and float
//     arithmetic 512 threads x 64 elements, part or all of them in shared memory, and 16-bit rows past
//     that 512 x 128, 64 of them in registers as loaded; otherwise 1024 threads x the register cache):
//     the row is split over a thread-block cluster, each CTA caching its slice; the max and the sum are
//     combined through distributed shared memory. HBM is read once.
//       forward, 128-bit path, float arithmetic: softmax_cluster_smem_fwd_kernel below, part of the
//       slice in shared memory (plan.raw: its register part as loaded); otherwise (the backward, element
//       accesses, float64, and the forward's 256-thread clusters that fit in registers, rows off the
//       128-bit alignment: plan.edges): block.cuh's kernels, 16-bit forwards with the register slice
//       kept as loaded (plan.raw). One row per cluster.
//   otherwise (no clusters, or longer rows), where the caller provides a workspace and at most one CTA
//     an SM caches the row: grid.cuh's mode, the row over CTAs anywhere on the device, each caching its
//     slice as here, the partials combined through global memory.
//     HBM is read once.
//   otherwise: variant `split` (split.cuh): an online max+sum pass per chunk, then one write pass,
//     several CTAs per row when rows are few, L2-sized row groups.
// 128-bit accesses when aligned, element accesses otherwise, in every mode.
#pragma once

#include "fastact/copy_async.cuh"
#include "fastact/softmax/block.cuh"
#include "fastact/softmax/split.cuh"

namespace fastact::softmax_impl {

// The slice of softmax_cluster_smem_fwd_kernel (dispatch.h: kClusterSmemBytes): a thread's kRegVecs
// units in registers (as A; kRawRegs: as loaded, dispatch.h softmax_cluster_smem_raw_regs), then kSmemVecs in
// dynamic shared memory, as loaded.
template <typename in_t, typename out_t, int kVec, bool kRawRegs = false>
struct ClusterSmemShape {
  static constexpr int kRegVecs = (kRawRegs ? softmax_resident_raw_elems(sizeof(in_t))
                                            : softmax_cluster_smem_reg_elems(sizeof(in_t), sizeof(acc_t<out_t>))) /
                                  kVec;
  static constexpr int kSmemVecs = softmax_cluster_smem_elems(sizeof(in_t)) / kVec;
  static constexpr int kVecs = kRegVecs + kSmemVecs;
  // 64 registers (two 512-thread CTAs an SM) with a register part, 40 without (three).
  static constexpr int kMinBlocks = kRegVecs > 0 ? 2 : 3;
  static constexpr bool kSupported =
      softmax_cluster_smem_supported(kVec, sizeof(in_t), sizeof(acc_t<out_t>)) &&
      (!kRawRegs || softmax_resident_raw(false, kVec, sizeof(in_t), sizeof(acc_t<out_t>)));
};

FASTACT_DEVICE unsigned char* cluster_smem_bytes() {
  extern __shared__ __align__(16) unsigned char cluster_smem[];
  return cluster_smem;
}

// resident_forward's Extra in the kernel below: the thread's units kFirst + j (j < kUnits) of its
// slice, held as loaded in its own shared-memory slots slot[j * T] (copy_async_16), and processed
// through the epilogue itself (block.cuh's LoadedUnits: the input is kept, so softmax computes those
// exps twice). fold_max first waits for the thread's copies, so that they were in flight during the
// register loads and the register part of the max.
template <typename Epi, typename in_t, int kVec, int kFirst, int kUnits>
struct SharedUnits : LoadedUnits<SharedUnits<Epi, in_t, kVec, kFirst, kUnits>, Epi, in_t, kVec, kFirst, kUnits> {
  using Base = LoadedUnits<SharedUnits, Epi, in_t, kVec, kFirst, kUnits>;
  using Unit = AlignedVector<in_t, kVec>;
  const Unit* slot;  // this thread's unit kFirst + j at slot[j * nthreads]
  int nthreads;

  FASTACT_DEVICE const Unit& unit(int j) const { return slot[j * nthreads]; }
  template <typename A>
  FASTACT_DEVICE void fold_max(A& m, const ResidentSlice& s) const {
    copy_async_wait<0>();
    Base::fold_max(m, s);
  }
};

// Forward of the cluster mode, 128-bit path, float arithmetic: a row per cluster, the slice of thread
// t in CTA rank r the units r * T * kVecs + j * T + t (j < kVecs, as block.cuh's layout), of which
// j < kRegVecs go to registers and the rest to the thread's own shared-memory slots
// slot[(j - kRegVecs) * T + t] (a warp's slots consecutive: conflict-free; each thread reads only its
// own: no barrier). The copies into shared memory are issued first (cp.async, no registers held), so
// they are in flight with the register loads. Then block.cuh's resident_forward, with the
// shared-memory units as its extra units (SharedUnits): the thread's max over both parts; its kept
// values (registers: ForwardCache, exp once) and the sum of exp over both parts; one (max, sum)
// all-reduce over the cluster; the outputs, from the registers as block.cuh's kernel writes them and
// from shared memory through the epilogue itself (KeepInput: softmax computes those exps twice).
// kRawRegs (16-bit rows past what shared memory alone covers: dispatch.h softmax_cluster_smem_raw_regs): the
// register units kept as loaded (block.cuh's RegisterUnits), the two parts processed alike through the
// epilogue (KeepInput).
// With plan.prefetch (16-bit rows: dispatch.h long_row_prefetches), once its own loads are out each
// thread asks L2 for the units its counterpart in the row `ahead` rows on will load (prefetch_slice):
// rows start in launch order as clusters finish, so with `ahead` a fraction of the clusters the device
// runs at once (kLongRowPrefetchDivisor) those loads are in flight while this cluster reduces and stores.
template <typename in_t, typename out_t, typename Epi, int kVec, bool kRawRegs>
__global__ __launch_bounds__(kClusterSmemMaxThreads, (ClusterSmemShape<in_t, out_t, kVec, kRawRegs>::kMinBlocks)) void
softmax_cluster_smem_fwd_kernel(const in_t* __restrict__ x, out_t* __restrict__ y, int64_t dim, int64_t row_stride,
                                int cluster, Epi epi,
                                int64_t rows,   // of the whole call (launch_items may split it)
                                int64_t ahead,  // rows ahead whose slices to prefetch into L2 (plan.prefetch); 0: none
                                int64_t first_row) {
  using A = acc_t<out_t>;
  using Shape = ClusterSmemShape<in_t, out_t, kVec, kRawRegs>;
  using Unit = AlignedVector<in_t, kVec>;
  constexpr int kRegVecs = Shape::kRegVecs;
  constexpr int kSmemVecs = Shape::kSmemVecs;
  static_assert(Shape::kSupported && kSmemVecs >= 1, "16-byte units, float arithmetic");
  const int nthreads = blockDim.x;
  Unit* const slot = reinterpret_cast<Unit*>(cluster_smem_bytes()) + threadIdx.x;  // unit j at slot[j * T]
  __shared__ RowScratch<MaxSum<A>> scratch;
  exchange_init(scratch.bar, cluster);
  const ResidentSlice s = resident_slice<kVec, Shape::kVecs>(dim, cluster);
  const int64_t row = first_row + blockIdx.x / cluster;
  const in_t* xr = x + row * row_stride + s.first;
  out_t* const yr = y + row * dim + s.first;
  int round = 0;
#pragma unroll
  for (int j = 0; j < kSmemVecs; ++j) {
    if (kRegVecs + j < s.nvalid)
      copy_async_16(slot + j * nthreads, xr + (kRegVecs + j) * s.step);
  }
  copy_async_commit();
  const SharedUnits<Epi, in_t, kVec, kRegVecs, kSmemVecs> shared{{}, slot, nthreads};
  if constexpr (kRawRegs) {
    RegisterUnits<Epi, in_t, kVec, kRegVecs> units;
#pragma unroll
    for (int j = 0; j < kRegVecs; ++j) {
      if (j < s.nvalid) units.r[j] = load_vector<in_t, kVec>(xr + j * s.step);
    }
    if (ahead > 0 && row + ahead < rows) prefetch_slice<Shape::kVecs>(x + (row + ahead) * row_stride, s);
    A none[1][kVec];  // no converted units: the slice is in `units` and `shared`
    resident_forward<Epi, kVec, 0>(none, s, yr, epi, scratch, round, cluster,
                                   BothExtras<RegisterUnits<Epi, in_t, kVec, kRegVecs>,
                                              SharedUnits<Epi, in_t, kVec, kRegVecs, kSmemVecs>>{units, shared});
    // Plain stores: with warp-paired ones (block.cuh forward_stores) ptxas spilled 8-16 bytes here (64 registers,
    // two 512-thread CTAs an SM).
  } else {
    A v[kRegVecs > 0 ? kRegVecs : 1][kVec];
#pragma unroll
    for (int j = 0; j < kRegVecs; ++j) {
      if (j < s.nvalid) to_acc(load_vector<in_t, kVec>(xr + j * s.step), v[j]);
    }
    if constexpr (kRegVecs == 0) {  // 16-bit rows only (dispatch.h long_row_prefetches)
      if (ahead > 0 && row + ahead < rows)
        prefetch_slice<Shape::kVecs>(x + (row + ahead) * row_stride, s);
    }
    resident_forward<Epi, kVec, kRegVecs>(v, s, yr, epi, scratch, round, cluster, shared,
                                          forward_stores<in_t, out_t, kVec, Shape::kVecs, false>(dim));
  }
}

namespace detail {

// softmax_cluster_smem_fwd_kernel on `plan` (kRawRegs: plan.raw), where its types run it.
template <typename in_t, typename out_t, typename Epi, int kVec, bool kRawRegs>
cudaError_t cluster_smem_forward(const in_t* x, out_t* y, int64_t rows, int64_t dim, int64_t row_stride,
                                 const SoftmaxPlan& plan, cudaStream_t stream) {
  using Shape = ClusterSmemShape<in_t, out_t, kVec, kRawRegs>;
  if constexpr (Shape::kSupported) {
    constexpr auto kKernel = softmax_cluster_smem_fwd_kernel<in_t, out_t, Epi, kVec, kRawRegs>;
    constexpr int kMaxSmem = Shape::kSmemVecs * kClusterSmemMaxThreads * 16;
    const int threads = plan.threads;
    if (plan.edges || plan.raw != kRawRegs ||
        plan.smem_elems != Shape::kSmemVecs * kVec || plan.elems_per_thread != Shape::kVecs * kVec || threads <= 0 ||
        threads > kClusterSmemMaxThreads ||
        threads % kWarpSize != 0 || plan.cluster < 2 || plan.cluster > kMaxCluster ||
        int64_t(plan.cluster) * threads * Shape::kVecs * kVec < dim)
      return cudaErrorInvalidConfiguration;
    const cudaError_t err = kernel_attribute_once<kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem>();
    if (err != cudaSuccess) return err;
    const size_t smem = size_t(Shape::kSmemVecs) * threads * 16;
    // After the shared-memory attribute, which the occupancy query sees.
    const int64_t ahead =
        plan.prefetch ? resident_tiles<kKernel>(threads, plan.cluster, smem) / kLongRowPrefetchDivisor : 0;
    return launch_items<kKernel>(rows, threads, smem, plan.cluster, stream, x, y, dim, row_stride, plan.cluster, Epi{},
                                 rows, ahead);
  }
  return cudaErrorInvalidConfiguration;
}

// The cluster mode's forward: with plan.smem_elems, the kernel above (plan.raw: its register part as
// loaded); else block.cuh's (registers only).
template <typename in_t, typename out_t, typename Epi, int kVec>
cudaError_t cluster_forward(const in_t* x, out_t* y, int64_t rows, int64_t dim, int64_t row_stride,
                            const SoftmaxPlan& plan, cudaStream_t stream) {
  if (plan.smem_elems == 0)
    return block_forward<in_t, out_t, Epi, kVec>(x, y, rows, dim, row_stride, plan.threads, plan.cluster, plan.edges,
                                                 plan.raw, /*shifted=*/false, stream);
  if (plan.raw) return cluster_smem_forward<in_t, out_t, Epi, kVec, true>(x, y, rows, dim, row_stride, plan, stream);
  return cluster_smem_forward<in_t, out_t, Epi, kVec, false>(x, y, rows, dim, row_stride, plan, stream);
}

template <typename in_t, typename out_t, typename Epi, int kVec>
cudaError_t long_row_forward(const in_t* x, out_t* y, int64_t rows, int64_t dim, int64_t row_stride,
                             const SoftmaxPlan& plan, cudaStream_t stream) {
  if (plan.mode == SoftmaxMode::kResident)
    return cluster_forward<in_t, out_t, Epi, kVec>(x, y, rows, dim, row_stride, plan, stream);
  return split_forward<in_t, out_t, Epi, kVec>(x, y, rows, dim, row_stride, plan.chunks, plan.group_rows, stream);
}

template <typename in_t, typename out_t, typename Epi, int kVec>
cudaError_t long_row_backward(const out_t* dy, const out_t* y, in_t* dx, int64_t rows, int64_t dim,
                              const SoftmaxPlan& plan, cudaStream_t stream) {
  if (plan.mode == SoftmaxMode::kResident)
    return block_backward<in_t, out_t, Epi, kVec>(dy, y, dx, rows, dim, plan.threads, plan.cluster, plan.edges, stream);
  return split_backward<in_t, out_t, Epi, kVec>(dy, y, dx, rows, dim, plan.chunks, plan.group_rows, stream);
}

}  // namespace detail
}  // namespace fastact::softmax_impl
