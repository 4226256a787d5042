// The plain softmax launchers (torch-free): pointers, int64 sizes, a plan or a variant, a stream.
//
//   softmax_forward<in_t, out_t, Epilogue>(x, y, outer, D, inner, row_stride, plan, stream, workspace)
//   softmax_backward<in_t, out_t, Epilogue>(grad_output, output, grad_input, outer, D, inner, plan,
//                                           stream, workspace)
//   ... and the same with a variant in place of the plan (no workspace: no grid mode).
//
// Geometry: [outer, D, inner]. Forward with inner == 1: input row r at x + r * row_stride, output
// dense; with inner > 1: both dense. Backward: all three dense. Epilogue: math::SoftmaxEpilogue or
// math::LogSoftmaxEpilogue (include/fastact/math.h). Outputs must not alias inputs (the `split` mode
// parks partial results in the output's memory between its two kernels).
//
// Returns the first launch error (cudaSuccess if none); cudaErrorInvalidValue / ...Configuration /
// ...MisalignedAddress for a plan that does not fit the arguments. No allocation, no host sync, no
// static device state: safe under CUDA graph capture on any stream. `workspace`: for grid plans
// and strided split plans (softmax_workspace_bytes(plan, outer) > 0), that many bytes (zeroed for grid
// plans: softmax_workspace_zeroed) on the launch's device, for this launch alone (the torch ops take it
// from the caching allocator); null for any other plan.
//
// Where each variant lives: warp.cuh (warp), vec.cuh (vec), scalar.cuh (scalar), long_row.cuh
// (long_row), split.cuh (split), grid.cuh (grid, and long_row beyond a cluster), strided.cuh (strided;
// staged.cuh its staged mode);
// block.cuh holds the row-resident kernels that
// vec, scalar and long_row share; common.cuh the reductions and the launch helper.
#pragma once

#include <cuda_runtime.h>

#include <mutex>

#include "fastact/dispatch.h"
#include "fastact/math.h"
#include "fastact/memory_depth.cuh"
#include "fastact/runtime_options.h"
#include "fastact/softmax/block.cuh"
#include "fastact/softmax/common.cuh"
#include "fastact/softmax/grid.cuh"
#include "fastact/softmax/long_row.cuh"
#include "fastact/softmax/scalar.cuh"
#include "fastact/softmax/split.cuh"
#include "fastact/softmax/staged.cuh"
#include "fastact/softmax/strided.cuh"
#include "fastact/softmax/vec.cuh"
#include "fastact/softmax/warp.cuh"

namespace fastact {

// ------------------------------------------------------------------------------------------------
// Device properties the dispatcher needs.

namespace softmax_impl::detail {

// The kernel the cluster probe asks about: the resident forward, whose CTAs are the largest.
constexpr auto kClusterProbeKernel = &softmax_block_fwd_kernel<float, float, math::SoftmaxEpilogue, 4>;

// Fills max_cluster and wide_cluster_threads (dispatch.h says what they mean). Clusters of 16 count
// as "wide" at a block size when they hold at least 90% of the CTAs that the device holds at that
// size without clusters. Why the 90%: a GPC with fewer free SMs than a cluster needs leaves them idle.
// runtime_options().max_cluster (1, 8 or 16; other values round down) lowers max_cluster: 1 turns clusters off, 8
// keeps them portable.
inline void probe_clusters(int sm_count, int cc_major, SoftmaxDeviceProps* p) {
  p->max_cluster = 1;
  p->wide_cluster_threads = 0;
  if (cc_major < 9) return;
  const int v = runtime_options().max_cluster;
  const int cap = v >= kMaxCluster ? kMaxCluster : v >= kMaxPortableCluster ? kMaxPortableCluster : 1;
  if (cap == 1) return;
  p->max_cluster = kMaxPortableCluster;
  if (cap < kMaxCluster || allow_large_clusters<kClusterProbeKernel>() != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  if (max_active_clusters<kClusterProbeKernel>(kMaxCluster, kResidentMaxThreads, 0) < 1) return;
  p->max_cluster = kMaxCluster;
  // Probed at 512 and 1024 threads: 256-thread CTAs stay in clusters of up to 8 (only those measured).
  for (int threads : {512, kResidentMaxThreads}) {
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kClusterProbeKernel, threads, 0) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    const int64_t ctas = int64_t(max_active_clusters<kClusterProbeKernel>(kMaxCluster, threads, 0)) * kMaxCluster;
    if (ctas * 10 < int64_t(sm_count) * per_sm * 9) return;
    p->wide_cluster_threads = threads;
  }
}

// SoftmaxProblem::bwd_two_cta_threads for block.cuh's backward kernel of 128-bit accesses (no edges) on the
// current device: the largest block, a multiple of a warp, of which the occupancy query fits two CTAs an SM. The
// registers the compiler chose decide it, so it is asked, not assumed; once per device. 0 when the query fails
// (the dispatcher then takes dispatch.h cluster_backward_two_cta_threads's default).
template <typename in_t, typename out_t, typename Epi>
int block_backward_two_cta_threads() {
  constexpr auto kKernel = softmax_block_bwd_kernel<in_t, out_t, Epi, softmax_vec_width(sizeof(in_t), sizeof(out_t))>;
  static std::once_flag once[kMaxDevices];
  static int threads[kMaxDevices];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  if (device < 0 || device >= kMaxDevices) return 0;
  std::call_once(once[device], [device] {
    threads[device] = 0;
    for (int t = kResidentMaxThreads; t >= kWarpSize; t -= kWarpSize) {
      int per_sm = 0;
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, t, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
      }
      if (per_sm >= 2) {
        threads[device] = t;
        return;
      }
    }
  });
  return threads[device];
}

}  // namespace softmax_impl::detail

// Properties of `device`, read once per device per process (host-side cache). Switches to `device`
// for the probe and back.
inline cudaError_t softmax_device_props(int device, SoftmaxDeviceProps* out) {
  constexpr int kMax = softmax_impl::kMaxDevices;
  static std::once_flag once[kMax];
  static SoftmaxDeviceProps props[kMax];
  static cudaError_t status[kMax];
  if (device < 0 || device >= kMax) return cudaErrorInvalidDevice;
  std::call_once(once[device], [device] {
    SoftmaxDeviceProps p;
    int l2 = 0, previous = 0;
    cudaError_t err = cudaGetDevice(&previous);
    if (err == cudaSuccess && previous != device) err = cudaSetDevice(device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&p.sm_count, cudaDevAttrMultiProcessorCount, device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&p.cc_major, cudaDevAttrComputeCapabilityMajor, device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device);
    if (err == cudaSuccess) {
      p.l2_bytes = l2;
      p.memory_depth = device_memory(device).depth;
      softmax_impl::detail::probe_clusters(p.sm_count, p.cc_major, &p);
    }
    p.prefetch = runtime_options().prefetch;
    if (previous != device) {
      const cudaError_t restore = cudaSetDevice(previous);
      if (err == cudaSuccess) err = restore;
    }
    props[device] = p;
    status[device] = err;
  });
  *out = props[device];
  return status[device];
}

// The dispatcher's view of a call (dispatch.h's builders with the element sizes filled in).
template <typename in_t, typename out_t>
SoftmaxProblem softmax_forward_problem(const in_t* x, const out_t* y, int64_t outer, int64_t dim, int64_t inner,
                                       int64_t row_stride, const SoftmaxDeviceProps& dev) {
  return softmax_forward_problem(static_cast<const void*>(x), int(sizeof(in_t)), static_cast<const void*>(y),
                                 int(sizeof(out_t)), int(sizeof(acc_t<out_t>)), outer, dim, inner, row_stride, dev);
}

template <typename in_t, typename out_t>
SoftmaxProblem softmax_backward_problem(const out_t* grad_output, const out_t* output, const in_t* grad_input,
                                        int64_t outer, int64_t dim, int64_t inner, const SoftmaxDeviceProps& dev) {
  return softmax_backward_problem(static_cast<const void*>(grad_output), static_cast<const void*>(output),
                                  int(sizeof(out_t)), static_cast<const void*>(grad_input), int(sizeof(in_t)),
                                  int(sizeof(acc_t<out_t>)), outer, dim, inner, dev);
}

// ------------------------------------------------------------------------------------------------
// Launchers taking a plan (from choose_softmax / plan_softmax in dispatch.h).

namespace softmax_impl::detail {

// Rows off the alignment (plan.edges) run only in the resident kernels of vec and long_row, with
// 128-bit units (block.cuh's RowEdges).
inline bool edges_plan_valid(const SoftmaxPlan& plan, bool vec) {
  return vec && plan.mode == SoftmaxMode::kResident &&
         (plan.variant == SoftmaxVariant::kVec || plan.variant == SoftmaxVariant::kLongRow);
}

// A register cache kept as loaded (plan.raw) runs only in long_row's cluster forward, with 128-bit units.
inline bool raw_plan_valid(const SoftmaxPlan& plan, bool vec) {
  return vec && plan.mode == SoftmaxMode::kResident && plan.variant == SoftmaxVariant::kLongRow;
}

// The grid mode runs for variants grid and long_row.
inline bool grid_plan_valid(const SoftmaxPlan& plan) {
  return plan.variant == SoftmaxVariant::kGrid || plan.variant == SoftmaxVariant::kLongRow;
}

}  // namespace softmax_impl::detail

template <typename in_t, typename out_t, typename Epilogue>
cudaError_t softmax_forward(const in_t* x, out_t* y, int64_t outer, int64_t dim, int64_t inner, int64_t row_stride,
                            const SoftmaxPlan& plan, cudaStream_t stream, void* workspace = nullptr) {
  using namespace softmax_impl::detail;
  constexpr int kW = softmax_vec_width(sizeof(in_t), sizeof(out_t));
  if (outer <= 0 || dim <= 0 || inner <= 0) return cudaSuccess;
  if (plan.two_pass || plan.one_unit) return cudaErrorInvalidValue;  // a backward plan
  if (plan.vec != 1 && plan.vec != kW) return cudaErrorInvalidValue;
  const bool vec = plan.vec == kW;
  if (plan.shifted) {  // vec, 16-bit rows: x anywhere (element-aligned), y aligned, D a whole number of units
    if (!vec || plan.variant != SoftmaxVariant::kVec || plan.mode != SoftmaxMode::kResident || plan.edges ||
        plan.raw || inner != 1 || !softmax_rows_shift_supported(kW, sizeof(in_t), sizeof(out_t)))
      return cudaErrorInvalidValue;
    if (!softmax_ptr_aligned(y, kW * int64_t(sizeof(out_t))) || !softmax_ptr_aligned(x, sizeof(in_t)) ||
        dim % kW != 0)
      return cudaErrorMisalignedAddress;
    return vec_forward<in_t, out_t, Epilogue>(x, y, outer, dim, row_stride, plan, stream);
  }
  if (vec && !(softmax_ptr_aligned(x, kW * int64_t(sizeof(in_t))) &&
               softmax_ptr_aligned(y, kW * int64_t(sizeof(out_t)))))
    return cudaErrorMisalignedAddress;
  if (plan.mode == SoftmaxMode::kStrided) {
    if (inner <= 1) return cudaErrorInvalidValue;
    if (plan.staged) {  // element accesses: any alignment, any inner
      if (vec || plan.streaming || plan.cluster != 1 || plan.chunks != 1) return cudaErrorInvalidValue;
      return strided_staged_forward<in_t, out_t, Epilogue>(x, y, outer, dim, inner, plan.threads, plan.columns,
                                                          plan.groups, stream);
    }
    if (vec && inner % kW != 0) return cudaErrorMisalignedAddress;
    if (plan.chunks > 1) {  // split mode
      if (!plan.streaming || plan.cluster != 1) return cudaErrorInvalidValue;
      return vec ? strided_split_forward<in_t, out_t, Epilogue, kW>(x, y, outer, dim, inner, plan.threads,
                                                                    plan.columns, plan.chunks, workspace,
                                                                    plan.workspace_bytes, stream)
                 : strided_split_forward<in_t, out_t, Epilogue, 1>(x, y, outer, dim, inner, plan.threads,
                                                                   plan.columns, plan.chunks, workspace,
                                                                   plan.workspace_bytes, stream);
    }
    return vec ? strided_forward<in_t, out_t, Epilogue, kW>(x, y, outer, dim, inner, plan.threads, plan.columns,
                                                            plan.cluster, plan.streaming, plan.prefetch, stream)
               : strided_forward<in_t, out_t, Epilogue, 1>(x, y, outer, dim, inner, plan.threads, plan.columns,
                                                           plan.cluster, plan.streaming, plan.prefetch, stream);
  }
  if (inner != 1) return cudaErrorInvalidValue;
  if (plan.raw && !raw_plan_valid(plan, vec)) return cudaErrorInvalidValue;
  if (plan.edges) {  // every row at one offset from the alignment in x and y
    if (!edges_plan_valid(plan, vec)) return cudaErrorInvalidValue;
    if (outer > 1 && (row_stride - dim) % kW != 0) return cudaErrorMisalignedAddress;
  } else if (vec && (dim % kW != 0 || (outer > 1 && row_stride % kW != 0))) {
    return cudaErrorMisalignedAddress;
  }
  if (plan.mode == SoftmaxMode::kGrid) {
    if (!grid_plan_valid(plan)) return cudaErrorInvalidValue;
    return vec ? grid_forward<in_t, out_t, Epilogue, kW>(x, y, outer, dim, row_stride, plan, workspace, stream)
               : grid_forward<in_t, out_t, Epilogue, 1>(x, y, outer, dim, row_stride, plan, workspace, stream);
  }
  switch (plan.variant) {
    case SoftmaxVariant::kWarp:
      if (plan.warp_log2 < 0 || plan.warp_log2 > 30 || dim > (int64_t(1) << plan.warp_log2))
        return cudaErrorInvalidValue;
      return vec ? warp_forward<in_t, out_t, Epilogue, kW>(plan.warp_log2, plan.packed, plan.threads, x, y, outer, dim,
                                                           row_stride, stream)
                 : warp_forward<in_t, out_t, Epilogue, 1>(plan.warp_log2, plan.packed, plan.threads, x, y, outer, dim,
                                                          row_stride, stream);
    case SoftmaxVariant::kVec:
      if (!vec) return cudaErrorInvalidValue;
      return vec_forward<in_t, out_t, Epilogue>(x, y, outer, dim, row_stride, plan, stream);
    case SoftmaxVariant::kScalar:
      if (vec) return cudaErrorInvalidValue;
      return scalar_forward<in_t, out_t, Epilogue>(x, y, outer, dim, row_stride, plan, stream);
    case SoftmaxVariant::kLongRow:
      return vec ? long_row_forward<in_t, out_t, Epilogue, kW>(x, y, outer, dim, row_stride, plan, stream)
                 : long_row_forward<in_t, out_t, Epilogue, 1>(x, y, outer, dim, row_stride, plan, stream);
    case SoftmaxVariant::kSplit:
      return vec ? split_forward<in_t, out_t, Epilogue, kW>(x, y, outer, dim, row_stride, plan.chunks,
                                                            plan.group_rows, stream)
                 : split_forward<in_t, out_t, Epilogue, 1>(x, y, outer, dim, row_stride, plan.chunks,
                                                           plan.group_rows, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

template <typename in_t, typename out_t, typename Epilogue>
cudaError_t softmax_backward(const out_t* grad_output, const out_t* output, in_t* grad_input, int64_t outer,
                             int64_t dim, int64_t inner, const SoftmaxPlan& plan, cudaStream_t stream,
                             void* workspace = nullptr) {
  using namespace softmax_impl::detail;
  constexpr int kW = softmax_vec_width(sizeof(in_t), sizeof(out_t));
  if (outer <= 0 || dim <= 0 || inner <= 0) return cudaSuccess;
  if (plan.shifted) return cudaErrorInvalidValue;  // a forward plan
  if (plan.vec != 1 && plan.vec != kW) return cudaErrorInvalidValue;
  const bool vec = plan.vec == kW;
  if (plan.two_pass && plan.one_unit) return cudaErrorInvalidValue;  // one kernel or the other
  if ((plan.two_pass || plan.one_unit) && !(plan.variant == SoftmaxVariant::kVec &&
                                             plan.mode == SoftmaxMode::kResident && vec && !plan.edges && inner == 1))
    return cudaErrorInvalidValue;  // vec's rows only
  if (vec && !(softmax_ptr_aligned(grad_output, kW * int64_t(sizeof(out_t))) &&
               softmax_ptr_aligned(output, kW * int64_t(sizeof(out_t))) &&
               softmax_ptr_aligned(grad_input, kW * int64_t(sizeof(in_t)))))
    return cudaErrorMisalignedAddress;
  const out_t* dy = grad_output;
  const out_t* y = output;
  in_t* dx = grad_input;
  if (plan.mode == SoftmaxMode::kStrided) {
    if (inner <= 1) return cudaErrorInvalidValue;
    if (plan.staged) {  // element accesses: any alignment, any inner
      if (vec || plan.streaming || plan.cluster != 1 || plan.chunks != 1) return cudaErrorInvalidValue;
      return strided_staged_backward<in_t, out_t, Epilogue>(dy, y, dx, outer, dim, inner, plan.threads, plan.columns,
                                                           plan.groups, stream);
    }
    if (vec && inner % kW != 0) return cudaErrorMisalignedAddress;
    if (plan.chunks > 1) {  // split mode
      if (!plan.streaming || plan.cluster != 1) return cudaErrorInvalidValue;
      return vec ? strided_split_backward<in_t, out_t, Epilogue, kW>(dy, y, dx, outer, dim, inner, plan.threads,
                                                                     plan.columns, plan.chunks, workspace,
                                                                     plan.workspace_bytes, stream)
                 : strided_split_backward<in_t, out_t, Epilogue, 1>(dy, y, dx, outer, dim, inner, plan.threads,
                                                                    plan.columns, plan.chunks, workspace,
                                                                    plan.workspace_bytes, stream);
    }
    return vec ? strided_backward<in_t, out_t, Epilogue, kW>(dy, y, dx, outer, dim, inner, plan.threads,
                                                             plan.columns, plan.cluster, plan.streaming, stream)
               : strided_backward<in_t, out_t, Epilogue, 1>(dy, y, dx, outer, dim, inner, plan.threads,
                                                            plan.columns, plan.cluster, plan.streaming, stream);
  }
  if (inner != 1 || plan.raw) return cudaErrorInvalidValue;  // raw: a forward cache only
  if (plan.edges) {  // all three tensors dense: every row at one offset from the alignment
    if (!edges_plan_valid(plan, vec)) return cudaErrorInvalidValue;
  } else if (vec && dim % kW != 0) {
    return cudaErrorMisalignedAddress;
  }
  if (plan.mode == SoftmaxMode::kGrid) {
    if (!grid_plan_valid(plan)) return cudaErrorInvalidValue;
    return vec ? grid_backward<in_t, out_t, Epilogue, kW>(dy, y, dx, outer, dim, plan, workspace, stream)
               : grid_backward<in_t, out_t, Epilogue, 1>(dy, y, dx, outer, dim, plan, workspace, stream);
  }
  switch (plan.variant) {
    case SoftmaxVariant::kWarp:
      if (plan.warp_log2 < 0 || plan.warp_log2 > 30 || dim > (int64_t(1) << plan.warp_log2) || plan.packed ||
          plan.threads != kWarpBlockThreads)
        return cudaErrorInvalidValue;
      return vec ? warp_backward<in_t, out_t, Epilogue, kW>(plan.warp_log2, dy, y, dx, outer, dim, stream)
                 : warp_backward<in_t, out_t, Epilogue, 1>(plan.warp_log2, dy, y, dx, outer, dim, stream);
    case SoftmaxVariant::kVec:
      if (!vec) return cudaErrorInvalidValue;
      return vec_backward<in_t, out_t, Epilogue>(dy, y, dx, outer, dim, plan, stream);
    case SoftmaxVariant::kScalar:
      if (vec) return cudaErrorInvalidValue;
      return scalar_backward<in_t, out_t, Epilogue>(dy, y, dx, outer, dim, plan, stream);
    case SoftmaxVariant::kLongRow:
      return vec ? long_row_backward<in_t, out_t, Epilogue, kW>(dy, y, dx, outer, dim, plan, stream)
                 : long_row_backward<in_t, out_t, Epilogue, 1>(dy, y, dx, outer, dim, plan, stream);
    case SoftmaxVariant::kSplit:
      return vec ? split_backward<in_t, out_t, Epilogue, kW>(dy, y, dx, outer, dim, plan.chunks, plan.group_rows,
                                                             stream)
                 : split_backward<in_t, out_t, Epilogue, 1>(dy, y, dx, outer, dim, plan.chunks, plan.group_rows,
                                                            stream);
    default:
      return cudaErrorInvalidValue;
  }
}

// ------------------------------------------------------------------------------------------------
// Launchers taking a variant (kAuto: the dispatcher chooses) on the current device. They have no
// workspace, so the dispatcher plans no grid mode and variant 'grid' is rejected.
// cudaErrorInvalidValue when a forced variant rejects the problem (softmax_variant_rejects says why).

template <typename in_t, typename out_t, typename Epilogue>
cudaError_t softmax_forward(const in_t* x, out_t* y, int64_t outer, int64_t dim, int64_t inner, int64_t row_stride,
                            SoftmaxVariant variant, cudaStream_t stream) {
  int device = 0;
  SoftmaxDeviceProps dev;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = softmax_device_props(device, &dev);
  if (err != cudaSuccess) return err;
  const SoftmaxProblem p = softmax_forward_problem(x, y, outer, dim, inner, row_stride, dev);
  if (softmax_variant_rejects(variant, p) != nullptr) return cudaErrorInvalidValue;
  const SoftmaxPlan plan = variant == SoftmaxVariant::kAuto ? choose_softmax(p) : plan_softmax(variant, p);
  return softmax_forward<in_t, out_t, Epilogue>(x, y, outer, dim, inner, row_stride, plan, stream);
}

template <typename in_t, typename out_t, typename Epilogue>
cudaError_t softmax_backward(const out_t* grad_output, const out_t* output, in_t* grad_input, int64_t outer,
                             int64_t dim, int64_t inner, SoftmaxVariant variant, cudaStream_t stream) {
  int device = 0;
  SoftmaxDeviceProps dev;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = softmax_device_props(device, &dev);
  if (err != cudaSuccess) return err;
  SoftmaxProblem p = softmax_backward_problem(grad_output, output, grad_input, outer, dim, inner, dev);
  p.term_uses_output = Epilogue::kTermUsesOutput;
  if (inner == 1) p.bwd_two_cta_threads = softmax_impl::detail::block_backward_two_cta_threads<in_t, out_t, Epilogue>();
  if (softmax_variant_rejects(variant, p) != nullptr) return cudaErrorInvalidValue;
  const SoftmaxPlan plan = variant == SoftmaxVariant::kAuto ? choose_softmax(p) : plan_softmax(variant, p);
  return softmax_backward<in_t, out_t, Epilogue>(grad_output, output, grad_input, outer, dim, inner, plan, stream);
}

}  // namespace fastact
