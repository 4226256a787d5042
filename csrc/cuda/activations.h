// The CUDA activations (gelu, bias_gelu, sigmoid, forward and backward): the per-dtype launchers that
// the host code (activations.cu) calls and the dtype files (activations_{float,half,bfloat16}.cu)
// instantiate — one class of static launchers per element type, declared `extern template` here so
// each kernel is compiled in exactly one translation unit and the build parallelises — and the
// explain hook.
#pragma once

#include <ATen/core/Tensor.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "common.h"
#include "cuda/utils.h"
#include "fastact/elementwise.cuh"
#include "fastact/math.h"

namespace fastact::cuda {

// "kernel=<name>: <why>" for op in gelu, gelu_backward, bias_gelu, bias_gelu_backward, sigmoid,
// sigmoid_backward on the CUDA tensor x (the input; for bias_gelu the bias is assumed 16-byte
// aligned, as a fresh or contiguous bias is).
std::string explain_elementwise_cuda(const at::Tensor& x, const std::string& op);


// Launchers for one element type T (float, double, __half, __nv_bfloat16); each only enqueues on
// `stream` and returns the launch's error. Sizes in elements.
template <typename T>
struct ActivationLaunchers {
  using A = acc_t<T>;
  // Operands laid out as g (ElementRows: the op's first input, then its second).
  static cudaError_t gelu(const T* x, T* y, const ElementRows& g, GeluApprox approx, cudaStream_t stream);
  static cudaError_t gelu_backward(const T* dy, const T* x, T* dx, const ElementRows& g, GeluApprox approx,
                                   cudaStream_t stream);
  static cudaError_t sigmoid(const T* x, T* y, const ElementRows& g, cudaStream_t stream);
  static cudaError_t sigmoid_backward(const T* dy, const T* y, T* dx, const ElementRows& g, cudaStream_t stream);
  // x: [rows, H], row r at x + r * x_stride; y: [rows, H] contiguous; bias: [H].
  static cudaError_t bias_gelu(const T* x, int64_t x_stride, const T* bias, T* y, int64_t rows, int64_t H,
                               GeluApprox approx, cudaStream_t stream);
  // x row r at x + r * x_stride; workspace: plan.workspace_elems(H) elements of A.
  static cudaError_t bias_gelu_backward(const T* dy, const T* x, int64_t x_stride, const T* bias, T* dx, T* dbias,
                                        A* workspace, int64_t rows, int64_t H, const elementwise::BiasGeluPlan& plan,
                                        GeluApprox approx, cudaStream_t stream);
};

// Out of the class body (so not inline): `extern template` below then keeps every translation unit
// but the dtype file's from instantiating the kernels.
template <typename T>
cudaError_t ActivationLaunchers<T>::gelu(const T* x, T* y, const ElementRows& g, GeluApprox approx,
                                         cudaStream_t stream) {
  return approx == GeluApprox::kTanh ? activation_forward(x, y, g, math::GeluTanh{}, stream)
                                     : activation_forward(x, y, g, math::GeluErf{}, stream);
}

template <typename T>
cudaError_t ActivationLaunchers<T>::gelu_backward(const T* dy, const T* x, T* dx, const ElementRows& g,
                                                  GeluApprox approx, cudaStream_t stream) {
  return approx == GeluApprox::kTanh ? fastact::gelu_backward(dy, x, dx, g, math::GeluTanh{}, stream)
                                     : fastact::gelu_backward(dy, x, dx, g, math::GeluErf{}, stream);
}

template <typename T>
cudaError_t ActivationLaunchers<T>::sigmoid(const T* x, T* y, const ElementRows& g, cudaStream_t stream) {
  return activation_forward(x, y, g, math::Sigmoid{}, stream);
}

template <typename T>
cudaError_t ActivationLaunchers<T>::sigmoid_backward(const T* dy, const T* y, T* dx, const ElementRows& g,
                                                     cudaStream_t stream) {
  return fastact::sigmoid_backward(dy, y, dx, g, stream);
}

template <typename T>
cudaError_t ActivationLaunchers<T>::bias_gelu(const T* x, int64_t x_stride, const T* bias, T* y, int64_t rows,
                                              int64_t H, GeluApprox approx, cudaStream_t stream) {
  return approx == GeluApprox::kTanh ? bias_gelu_forward(x, x_stride, bias, y, rows, H, math::GeluTanh{}, stream)
                                     : bias_gelu_forward(x, x_stride, bias, y, rows, H, math::GeluErf{}, stream);
}

template <typename T>
cudaError_t ActivationLaunchers<T>::bias_gelu_backward(const T* dy, const T* x, int64_t x_stride, const T* bias, T* dx,
                                                       T* dbias, A* workspace, int64_t rows, int64_t H,
                                                       const elementwise::BiasGeluPlan& plan, GeluApprox approx,
                                                       cudaStream_t stream) {
  return approx == GeluApprox::kTanh ? fastact::bias_gelu_backward(dy, x, x_stride, bias, dx, dbias, workspace, rows, H,
                                                                   plan, math::GeluTanh{}, stream)
                                     : fastact::bias_gelu_backward(dy, x, x_stride, bias, dx, dbias, workspace, rows, H,
                                                                   plan, math::GeluErf{}, stream);
}

extern template struct ActivationLaunchers<float>;          // activations_float.cu
extern template struct ActivationLaunchers<double>;         // activations_float.cu
extern template struct ActivationLaunchers<__half>;         // activations_half.cu
extern template struct ActivationLaunchers<__nv_bfloat16>;  // activations_bfloat16.cu

}  // namespace fastact::cuda
