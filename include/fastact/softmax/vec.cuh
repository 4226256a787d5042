// Variant `vec`: inner == 1, rows that fit one block's registers (D <= 1024 threads x 32 elements
// forward; x 16 (float32), 32 (16-bit), 8 (float64) backward), every pointer 16-byte aligned, and
// either D and the row stride multiples of the 128-bit width, or (plan.edges) rows that start off that
// width, each tensor's row r at the same offset (the row stride equals D modulo the width): then each
// row's few elements before its first and after its last aligned vector move one at a time (block.cuh's
// RowEdges). A block per row, 128-bit loads and stores, the row
// read from HBM once. The kernel is softmax_block_{fwd,bwd}_kernel<..., kVec = 128-bit width>
// (block.cuh) launched with cluster = 1.
#pragma once

#include "fastact/softmax/block.cuh"

namespace fastact::softmax_impl::detail {

template <typename in_t, typename out_t, typename Epi>
cudaError_t vec_forward(const in_t* x, out_t* y, int64_t rows, int64_t dim, int64_t row_stride, const SoftmaxPlan& plan,
                        cudaStream_t stream) {
  constexpr int kW = softmax_vec_width(sizeof(in_t), sizeof(out_t));
  return block_forward<in_t, out_t, Epi, kW>(x, y, rows, dim, row_stride, plan.threads, 1, plan.edges,
                                             /*raw=*/false, plan.shifted, stream);
}

template <typename in_t, typename out_t, typename Epi>
cudaError_t vec_backward(const out_t* dy, const out_t* y, in_t* dx, int64_t rows, int64_t dim, const SoftmaxPlan& plan,
                         cudaStream_t stream) {
  constexpr int kW = softmax_vec_width(sizeof(in_t), sizeof(out_t));
  return block_backward<in_t, out_t, Epi, kW>(dy, y, dx, rows, dim, plan.threads, 1, plan.edges, stream,
                                              plan.two_pass, plan.one_unit);
}

}  // namespace fastact::softmax_impl::detail
