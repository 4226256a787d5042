// Activation math shared by the CUDA kernels and the CPU kernels: torch-free functors, each
// computed in its accumulation type (float for float/half/bfloat16, double for double), each with
// the torch formula it must match. Element types only need conversions to and from acc_t, so the
// same templates serve at::Half / at::BFloat16 (csrc) and float / double.
#pragma once

#include <cmath>
#include <type_traits>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define FASTACT_HOST_DEVICE __host__ __device__ __forceinline__
#define FASTACT_DEVICE __device__ __forceinline__
#else
#define FASTACT_HOST_DEVICE inline
#define FASTACT_DEVICE inline
#endif

namespace fastact {

// The type arithmetic is done in: double for double, float for everything narrower.
template <typename T>
struct AccType {
  using type = float;
};
template <>
struct AccType<double> {
  using type = double;
};
template <typename T>
using acc_t = typename AccType<T>::type;

namespace math {

// Constants of torch's GELU formulas (aten/src/ATen/native/cuda/ActivationGeluKernel.cu).
template <typename T>
struct GeluConstants {
  static constexpr T kAlpha = T(0.70710678118654752440);   // 1 / sqrt(2)
  static constexpr T kBeta = T(0.79788456080286535588);    // sqrt(2 / pi)
  static constexpr T kKappa = T(0.044715);                 // the tanh approximation's cubic term
  static constexpr T kInvSqrt2Pi = T(0.39894228040143267794);  // 1 / sqrt(2 * pi)
};

// Overloads so one template body compiles to erff/expf for float and erf/exp for double, on the
// host and on the device alike.
FASTACT_HOST_DEVICE float erf_(float x) { return ::erff(x); }
FASTACT_HOST_DEVICE double erf_(double x) { return ::erf(x); }
FASTACT_HOST_DEVICE float tanh_(float x) { return ::tanhf(x); }
FASTACT_HOST_DEVICE double tanh_(double x) { return ::tanh(x); }
FASTACT_HOST_DEVICE float exp_(float x) { return ::expf(x); }
FASTACT_HOST_DEVICE double exp_(double x) { return ::exp(x); }
FASTACT_HOST_DEVICE float log_(float x) { return ::logf(x); }
FASTACT_HOST_DEVICE double log_(double x) { return ::log(x); }

// exp(x) through the SFU: ex2.approx.ftz of x * log2(e), a multiply and one MUFU (expf adds its range
// reduction; exp2f and __expf without -ftz=true a compare and two predicated multiplies to keep subnormal
// results). Error: ex2.approx's 2 ulp plus the product's rounding, |x| * 2^-24 relative; a result below
// 2^-126 (x < -87.3) flushes to 0. On the host, exp2f of the same product. The callers say why they take
// it: exp_log_prob below, softmax/common.cuh cached_exp.
FASTACT_HOST_DEVICE float exp_sfu(float x) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x * 1.4426950408889634f));
  return r;
#else
  return exp2f(x * 1.4426950408889634f);
#endif
}

// exp(y) of a log-probability (y <= 0) in the log_softmax backward. On the GPU in float exp_sfu; error
// 2 + 1.17|y| ulp: under 1e-6 relative where y > -6.5 (probabilities above 1.5e-3), under 1.2e-5 at
// y = -87; a result below 2^-126 flushes to 0 (absolute error under 1.2e-38). Why: H100, the log backward at rows of 3072
// was 4% slower than the softmax backward with expf (277.1 against 266.3 us; now 264.8).
// Why .ftz spelled out rather than __expf: without -ftz=true (fastact builds without it) __expf keeps
// results below 2^-126 as denormals by scaling around the MUFU (a compare and two predicated
// multiplies), and that cost the 16-bit warp backward at rows of 197 11% (H100, bf16 [681308, 197]:
// 313.3 against 280.2 us; bench/NOTES.md, twenty-sixth session).
FASTACT_HOST_DEVICE float exp_log_prob(float y) {
#if defined(__CUDA_ARCH__)
  return exp_sfu(y);
#else
  return ::expf(y);
#endif
}
FASTACT_HOST_DEVICE double exp_log_prob(double y) { return ::exp(y); }

// F.gelu(x, approximate="none") = x/2 * (1 + erf(x / sqrt(2)))
struct GeluErf {
  template <typename A>
  FASTACT_HOST_DEVICE A forward(A x) const {
    return A(0.5) * x * (A(1) + erf_(x * GeluConstants<A>::kAlpha));
  }
  // d/dx = Phi(x) + x * phi(x), Phi the normal CDF, phi its density.
  template <typename A>
  FASTACT_HOST_DEVICE A derivative(A x) const {
    const A cdf = A(0.5) * (A(1) + erf_(x * GeluConstants<A>::kAlpha));
    const A pdf = exp_(A(-0.5) * x * x) * GeluConstants<A>::kInvSqrt2Pi;
    return cdf + x * pdf;
  }
};

// F.gelu(x, approximate="tanh") = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
struct GeluTanh {
  template <typename A>
  FASTACT_HOST_DEVICE A forward(A x) const {
    const A inner = GeluConstants<A>::kBeta * (x + GeluConstants<A>::kKappa * x * x * x);
    return A(0.5) * x * (A(1) + tanh_(inner));
  }
  template <typename A>
  FASTACT_HOST_DEVICE A derivative(A x) const {
    const A x_sq = x * x;
    const A inner = GeluConstants<A>::kBeta * (x + GeluConstants<A>::kKappa * x_sq * x);
    const A t = tanh_(inner);
    const A d_inner = GeluConstants<A>::kBeta * (A(1) + A(3) * GeluConstants<A>::kKappa * x_sq);
    return A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * d_inner;
  }
};

// torch.sigmoid, in the form that cannot overflow: exp is only ever taken of -|x|.
struct Sigmoid {
  template <typename A>
  FASTACT_HOST_DEVICE A forward(A x) const {
    const A e = exp_(x >= A(0) ? -x : x);  // in (0, 1]
    const A r = A(1) / (A(1) + e);
    return x >= A(0) ? r : e * r;
  }
  // Given y = sigmoid(x): dy/dx = y (1 - y) (torch's sigmoid_backward takes the output).
  template <typename A>
  FASTACT_HOST_DEVICE A derivative_from_output(A y) const {
    return y * (A(1) - y);
  }
};

// Softmax epilogues: a kernel computes the max m and the sum s = sum(exp(x - m)) of a row, turns s
// into a per-row constant c = row_constant(s) once, then maps each element with forward(x, m, c):
// softmax exp(x - m) * (1/s), log_softmax x - m - log(s). A row of all -inf has m = -inf and gives
// NaN, as torch does. Backward: softmax dx = y * (dy - sum(dy * y)), log_softmax
// dx = dy - exp(y) * sum(dy); the kernels reduce backward_term over the row.
struct SoftmaxEpilogue {
  // Whether backward_term reads y: streaming kernels skip the load of y in the summing pass if not.
  static constexpr bool kTermUsesOutput = true;
  template <typename A>
  FASTACT_HOST_DEVICE A row_constant(A sum) const {
    return A(1) / sum;
  }
  template <typename A>
  FASTACT_HOST_DEVICE A forward(A x, A max, A c) const {
    return exp_(x - max) * c;
  }
  template <typename A>
  FASTACT_HOST_DEVICE A backward_term(A dy, A y) const {
    return dy * y;
  }
  template <typename A>
  FASTACT_HOST_DEVICE A backward(A dy, A y, A row_sum) const {
    return y * (dy - row_sum);
  }
};

struct LogSoftmaxEpilogue {
  static constexpr bool kTermUsesOutput = false;
  template <typename A>
  FASTACT_HOST_DEVICE A row_constant(A sum) const {
    return log_(sum);
  }
  template <typename A>
  FASTACT_HOST_DEVICE A forward(A x, A max, A c) const {
    return x - max - c;
  }
  template <typename A>
  FASTACT_HOST_DEVICE A backward_term(A dy, A /*y*/) const {
    return dy;
  }
  template <typename A>
  FASTACT_HOST_DEVICE A backward(A dy, A y, A row_sum) const {
    return dy - exp_log_prob(y) * row_sum;
  }
};

}  // namespace math
}  // namespace fastact
