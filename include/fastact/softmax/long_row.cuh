// Variant `long_row`: inner == 1, rows too long for one block's registers (tens of thousands to
// millions of elements); never three passes over HBM.
//   sm_90, the row fits a cluster (<= 16 CTAs x 1024 threads x 32 elements forward): the row is
//     split over a thread-block cluster, each CTA caching its slice in registers; the max and the sum
//     are combined through distributed shared memory. HBM is read once. (block.cuh, cluster > 1.)
//   otherwise (no clusters, or longer rows): variant `split` (split.cuh): an online max+sum pass per
//     chunk, then one write pass, several CTAs per row when rows are few, L2-sized row groups.
// 128-bit accesses when aligned, element accesses otherwise, in both modes.
#pragma once

#include "fastact/softmax/block.cuh"
#include "fastact/softmax/split.cuh"

namespace fastact::softmax_impl::detail {

template <typename in_t, typename out_t, typename Epi, int kVec>
cudaError_t long_row_forward(const in_t* x, out_t* y, int64_t rows, int64_t dim, int64_t row_stride,
                             const SoftmaxPlan& plan, cudaStream_t stream) {
  if (plan.mode == SoftmaxMode::kResident)
    return block_forward<in_t, out_t, Epi, kVec>(x, y, rows, dim, row_stride, plan.threads, plan.cluster, stream);
  return split_forward<in_t, out_t, Epi, kVec>(x, y, rows, dim, row_stride, plan.chunks, plan.group_rows, stream);
}

template <typename in_t, typename out_t, typename Epi, int kVec>
cudaError_t long_row_backward(const out_t* dy, const out_t* y, in_t* dx, int64_t rows, int64_t dim,
                              const SoftmaxPlan& plan, cudaStream_t stream) {
  if (plan.mode == SoftmaxMode::kResident)
    return block_backward<in_t, out_t, Epi, kVec>(dy, y, dx, rows, dim, plan.threads, plan.cluster, stream);
  return split_backward<in_t, out_t, Epi, kVec>(dy, y, dx, rows, dim, plan.chunks, plan.group_rows, stream);
}

}  // namespace fastact::softmax_impl::detail
