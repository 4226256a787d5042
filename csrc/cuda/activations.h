// The CUDA activations (the pointwise ops of fastact/op_table.h and bias_gelu, forward and backward): the per-dtype launchers that
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
#include <type_traits>

#include "common.h"
#include "cuda/utils.h"
#include "fastact/elementwise.cuh"
#include "fastact/math.h"
#include "fastact/op_table.h"

namespace fastact::cuda {

// "kernel=<name>: <why>" for op an elementwise op of the table or its backward (gelu, gelu_backward,
// bias_gelu, bias_gelu_backward, sigmoid, ...) on the CUDA tensor x (the input; for bias_gelu the bias is assumed 16-byte
// aligned, as a fresh or contiguous bias is).
std::string explain_elementwise_cuda(const at::Tensor& x, const std::string& op);


// kBackwardGrad: a f''(s); kBackwardGrad3: a f'''(s).
enum class PointwiseDirection { kForward, kBackward, kBackwardGrad, kBackwardGrad3 };

// Launchers for one element type T (float, double, __half, __nv_bfloat16); each only enqueues on
// `stream` and returns the launch's error. Sizes in elements.
template <typename T>
struct ActivationLaunchers {
  using A = acc_t<T>;
  // A pointwise op of the table (fastact/op_table.h): `row` its optable::index, `choice` the functor its param
  // picks. kForward: out = f(a); kBackward: out = a f'(b) (b the saved input or output); kBackwardGrad:
  // out = a f''(b) (kBackwardGrad3: a f'''(b)). Operands laid out as g (ElementRows: a, then b).
  static cudaError_t pointwise(int row, int choice, PointwiseDirection dir, const T* a, const T* b, T* out,
                               const ElementRows& g, cudaStream_t stream);
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
cudaError_t ActivationLaunchers<T>::pointwise(int row, int choice, PointwiseDirection dir, const T* a, const T* b,
                                              T* out, const ElementRows& g, cudaStream_t stream) {
  cudaError_t err = cudaErrorInvalidValue;  // no such row
  optable::for_each_pointwise([&](auto* r) {
    using Row = std::remove_pointer_t<decltype(r)>;
    if (row != optable::index<Row>()) return;
    err = optable::with_functor<Row>(choice, [&](auto f) {
      switch (dir) {
        case PointwiseDirection::kForward:
          return activation_forward(a, out, g, f, stream);
        case PointwiseDirection::kBackward:
          return activation_backward<Row::kFromOutput>(a, b, out, g, f, stream);
        case PointwiseDirection::kBackwardGrad:
          return activation_backward_grad<Row::kFromOutput, 2>(a, b, out, g, f, stream);
        default:
          return activation_backward_grad<Row::kFromOutput, 3>(a, b, out, g, f, stream);
      }
    });
  });
  return err;
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
