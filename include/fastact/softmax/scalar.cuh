// Variant `scalar`: inner == 1, any layout (misaligned views such as x.view(-1)[1:], odd D, any row
// stride). Element loads and stores, coalesced across the block. Rows that fit one block's
// registers (D <= 1024 x 32 forward) use the row-resident kernel (block.cuh, kVec = 1, one read);
// longer rows a block per row that streams the row twice (split.cuh, one chunk per row).
#pragma once

#include "fastact/softmax/block.cuh"
#include "fastact/softmax/split.cuh"

namespace fastact::softmax_impl::detail {

template <typename in_t, typename out_t, typename Epi>
cudaError_t scalar_forward(const in_t* x, out_t* y, int64_t rows, int64_t dim, int64_t row_stride,
                           const SoftmaxPlan& plan, cudaStream_t stream) {
  if (plan.mode == SoftmaxMode::kResident)
    return block_forward<in_t, out_t, Epi, 1>(x, y, rows, dim, row_stride, plan.threads, 1, /*edges=*/false,
                                              /*raw=*/false, /*shifted=*/false, stream);
  return split_forward<in_t, out_t, Epi, 1>(x, y, rows, dim, row_stride, 1, rows, stream);
}

template <typename in_t, typename out_t, typename Epi>
cudaError_t scalar_backward(const out_t* dy, const out_t* y, in_t* dx, int64_t rows, int64_t dim,
                            const SoftmaxPlan& plan, cudaStream_t stream) {
  if (plan.mode == SoftmaxMode::kResident)
    return block_backward<in_t, out_t, Epi, 1>(dy, y, dx, rows, dim, plan.threads, 1, /*edges=*/false, stream);
  return split_backward<in_t, out_t, Epi, 1>(dy, y, dx, rows, dim, 1, rows, stream);
}

}  // namespace fastact::softmax_impl::detail
