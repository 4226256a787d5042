// CUDA softmax family: what csrc/cuda/softmax*.cu export to the rest of csrc.
//
// softmax_ops.cpp registers the CUDA kernels of softmax, log_softmax, softmax_backward and
// log_softmax_backward (TORCH_LIBRARY_IMPL(fastact, CUDA, m)); the per-dtype files
// (softmax_float.cu, softmax_double.cu, softmax_half.cu, softmax_bf16.cu) instantiate the launchers
// declared below, so the kernel templates compile in parallel.
#pragma once

#include <ATen/core/Tensor.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <string>

#include "fastact/dispatch.h"

namespace fastact {

// What the dispatcher would run for fastact.explain(op, x, dim) on a CUDA tensor x:
// "variant=<name>: D=..., outer=..., inner=...: <why> [<launch configuration>]".
// op = softmax (log=false, backward=false), log_softmax (log=true), softmax_backward /
// log_softmax_backward (backward=true; x stands for the saved output, grad_output is taken to be
// laid out like it). dtype is the op's own: the forward's output dtype (softmax's dtype=), the backward's
// input_dtype (grad_input's); none: x's. Allocates nothing, launches nothing. Errors as the ops (dtype, dim range).
std::string explain_softmax_cuda(const at::Tensor& x, int64_t dim, bool log, bool backward,
                                 std::optional<at::ScalarType> dtype);

namespace cuda {

// Per-device properties for the dispatcher (cached; defined in softmax_float.cu).
SoftmaxDeviceProps softmax_device_props_cached(int device);

// Launchers, one overload per (input, output) element-type pair the ops use, in the kernels' element
// types (cuda_type in cuda/utils.h: CUDA's own 16-bit types, which include/ specialises): same dtype, and the
// fused casts (half/bfloat16 input -> float output forward; float grad_output/output -> half/bfloat16
// grad_input backward). Geometry, plan and workspace as fastact::softmax_forward / softmax_backward
// (include/fastact/softmax/launch.cuh); `log` picks LogSoftmaxEpilogue over SoftmaxEpilogue.
// softmax_backward_two_cta_threads: SoftmaxProblem::bwd_two_cta_threads of the pair's backward on the
// current device (the pointers only pick the overload; null is fine).
#define FASTACT_SOFTMAX_CUDA_DECLARE(in_t, out_t)                                                          \
  cudaError_t softmax_forward_cuda(bool log, const in_t* x, out_t* y, int64_t outer, int64_t dim,          \
                                   int64_t inner, int64_t row_stride, const SoftmaxPlan& plan,             \
                                   cudaStream_t stream, void* workspace);                                   \
  cudaError_t softmax_backward_cuda(bool log, const out_t* grad_output, const out_t* output, in_t* grad_input, \
                                    int64_t outer, int64_t dim, int64_t inner, const SoftmaxPlan& plan,    \
                                    cudaStream_t stream, void* workspace);                                  \
  int softmax_backward_two_cta_threads(bool log, const out_t* grad_output, const in_t* grad_input);

FASTACT_SOFTMAX_CUDA_DECLARE(float, float)
FASTACT_SOFTMAX_CUDA_DECLARE(double, double)
FASTACT_SOFTMAX_CUDA_DECLARE(__half, __half)
FASTACT_SOFTMAX_CUDA_DECLARE(__half, float)
FASTACT_SOFTMAX_CUDA_DECLARE(__nv_bfloat16, __nv_bfloat16)
FASTACT_SOFTMAX_CUDA_DECLARE(__nv_bfloat16, float)

#undef FASTACT_SOFTMAX_CUDA_DECLARE

}  // namespace cuda
}  // namespace fastact

// Defines the launchers of one (in_t, out_t) pair; used once per pair by the per-dtype .cu files,
// after including fastact/softmax/launch.cuh.
#define FASTACT_SOFTMAX_CUDA_DEFINE(in_t, out_t)                                                            \
  namespace fastact::cuda {                                                                                 \
  cudaError_t softmax_forward_cuda(bool log, const in_t* x, out_t* y, int64_t outer, int64_t dim,           \
                                   int64_t inner, int64_t row_stride, const SoftmaxPlan& plan,              \
                                   cudaStream_t stream, void* workspace) {                                   \
    return log ? ::fastact::softmax_forward<in_t, out_t, math::LogSoftmaxEpilogue>(                          \
                     x, y, outer, dim, inner, row_stride, plan, stream, workspace)                           \
               : ::fastact::softmax_forward<in_t, out_t, math::SoftmaxEpilogue>(                             \
                     x, y, outer, dim, inner, row_stride, plan, stream, workspace);                          \
  }                                                                                                         \
  cudaError_t softmax_backward_cuda(bool log, const out_t* grad_output, const out_t* output, in_t* grad_input, \
                                    int64_t outer, int64_t dim, int64_t inner, const SoftmaxPlan& plan,     \
                                    cudaStream_t stream, void* workspace) {                                  \
    return log ? ::fastact::softmax_backward<in_t, out_t, math::LogSoftmaxEpilogue>(                         \
                     grad_output, output, grad_input, outer, dim, inner, plan, stream, workspace)           \
               : ::fastact::softmax_backward<in_t, out_t, math::SoftmaxEpilogue>(                            \
                     grad_output, output, grad_input, outer, dim, inner, plan, stream, workspace);          \
  }                                                                                                         \
  int softmax_backward_two_cta_threads(bool log, const out_t*, const in_t*) {                               \
    using ::fastact::softmax_impl::detail::block_backward_two_cta_threads;                                  \
    return log ? block_backward_two_cta_threads<in_t, out_t, math::LogSoftmaxEpilogue>()                    \
               : block_backward_two_cta_threads<in_t, out_t, math::SoftmaxEpilogue>();                      \
  }                                                                                                         \
  }
