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

// The cost class of a pointwise functor: the transcendental it evaluates per element, which sets its instruction
// cost and so, near the memory limit, its best CUDA launch shape (elementwise.cuh elementwise_shape): sigmoid-like
// (one exp and a division forward, none backward), tanh GELU (tanhf) or erf GELU (erff). Every functor of a
// pointwise op (fastact/op_table.h) names its own as kCost.
enum class EltMath { kSigmoid, kTanh, kErf };

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
// sech(u) = 2 e / (1 + e^2), e = exp(-|u|): at most 1 at every u, where 1 / cosh(u) and its square overflow; for
// plain values and dual numbers (Dual, below) alike.
template <typename A>
FASTACT_HOST_DEVICE A sech_(A u) {
  const A e = exp_(u >= A(0) ? -u : u);
  return A(2) * e / (A(1) + e * e);
}

// 2^x and 1/x through the SFU (ex2.approx.ftz, rcp.approx.ftz: one MUFU each, 2 and 1 ulp; inputs and
// results below 2^-126 flush to 0). On the host, exp2f and a division. For exp_sfu and the 16-bit-output functors below.
FASTACT_HOST_DEVICE float ex2_sfu(float x) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
#else
  return exp2f(x);
#endif
}
FASTACT_HOST_DEVICE float rcp_sfu(float x) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
#else
  return 1.f / x;
#endif
}

// exp(x) through the SFU: ex2.approx.ftz of x * log2(e), a multiply and one MUFU (expf adds its range
// reduction; exp2f and __expf without -ftz=true a compare and two predicated multiplies to keep subnormal
// results). Error: ex2.approx's 2 ulp plus the product's rounding, |x| * 2^-24 relative; a result below
// 2^-126 (x < -87.3) flushes to 0. On the host, exp2f of the same product. The callers say why they take
// it: exp_log_prob below, softmax/common.cuh cached_exp.
FASTACT_HOST_DEVICE float exp_sfu(float x) { return ex2_sfu(x * 1.4426950408889634f); }

// exp(y) of a log-probability (y <= 0) in the log_softmax backward. On the GPU in float exp_sfu; error
// 2 + 1.17|y| ulp: under 1e-6 relative where y > -6.5 (probabilities above 1.5e-3), under 1.2e-5 at
// y = -87; a result below 2^-126 flushes to 0 (absolute error under 1.2e-38). Why: H100, the log backward at rows of 3072
// was 4% slower than the softmax backward with expf (277.1 against 266.3 us; now 264.8).
// Why .ftz spelled out rather than __expf: without -ftz=true (fastact builds without it) __expf keeps
// results below 2^-126 as denormals by scaling around the MUFU (a compare and two predicated
// multiplies), and that cost the 16-bit warp backward at rows of 197 11% (H100, bf16 [681308, 197]:
// 313.3 against 280.2 us).
FASTACT_HOST_DEVICE float exp_log_prob(float y) {
#if defined(__CUDA_ARCH__)
  return exp_sfu(y);
#else
  return ::expf(y);
#endif
}
FASTACT_HOST_DEVICE double exp_log_prob(double y) { return ::exp(y); }

struct GeluErf16;
struct Sigmoid16;

// A pointwise functor (the ops of fastact/op_table.h) has
//   forward(x)                        the op, in acc_t;
//   derivative(x), second_derivative(x)  f' and f'' at the input, or, for an op whose backward reads the
//                                     forward's output y (torch.sigmoid), derivative_from_output(y) and
//                                     second_derivative_from_output(y): f' as a function of y and its
//                                     derivative with respect to y;
//   kCost                             its cost class (EltMath above);
//   Narrow (optional)                 a functor of the same op for results rounded to 16 bits, float only,
//                                     with forward and optionally the derivative the backward takes, and kName;
//                                     the CUDA launchers take it for 16-bit tensors (elementwise.cuh StorageMath).

// F.gelu(x, approximate="none") = x/2 * (1 + erf(x / sqrt(2)))
struct GeluErf {
  static constexpr EltMath kCost = EltMath::kErf;
  using Narrow = GeluErf16;
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
  // d2/dx2 = phi(x) (2 - x^2).
  template <typename A>
  FASTACT_HOST_DEVICE A second_derivative(A x) const {
    const A x_sq = x * x;
    return GeluConstants<A>::kInvSqrt2Pi * exp_(A(-0.5) * x_sq) * (A(2) - x_sq);
  }
};

// The erf GELU for results rounded to 16 bits (bfloat16, float16), in float at about 2e-6 relative error for
// |x| < 6, under 1e-5 beyond (a 16-bit result is 2^-8 or 2^-11 apart), with two MUFUs and ~16 other instructions where erff alone
// takes ~25: in 16-bit the erf GELU is issue-bound, not memory-bound (at the H200's memory limit an SM has
// ~32 instructions an element to spend, loads, conversions and stores included). The CUDA launchers take it
// for 16-bit tensors (elementwise.cuh StorageMath); float and double keep GeluErf.
//
// With a = |x|: Phi(-a) = t q(t) exp(-a^2 / 2), t = 1 / (1 + p a) in (0, 1], q a degree-7 polynomial
// fitted (minimax in relative error over t in [0, 1], so over every a) to
// Phi(-a) exp(a^2 / 2) / t: 9.7e-7 relative evaluated in float; the rounding of the exponent adds 6.6e-7
// near 0, growing with x^2 (8.6e-6 in all at |x| = 13), and the MUFUs ~4e-7. Then Phi(x) = 1 - Phi(-a) for x >= 0, Phi(-a) for x < 0, both without
// cancellation, so the negative tail keeps its relative accuracy (erf-based 1 + erf(x / sqrt 2) loses it
// from x ~ -4 and is 0 below -5.6, in float64 below -8.3).
// Subnormal results: exp is taken as exp(-a^2 / 2) 2^16 (the exponent offset by 16, so ex2 does not flush
// before 2^-142) and q carries the 2^-16, so Phi(-a) rounds once into a float subnormal: bfloat16's
// subnormal results (to 2^-133) come out within an ulp of the float64 formula's.
// The fit, to redo it: nodes t_k = (1 - cos(pi (k + 0.5) / 4000)) / 2, a = (1 / t - 1) / p, target
// 0.5 erfcx(a / sqrt 2) / t (scipy.special.erfcx); least squares on the Vandermonde matrix in t weighted by
// 1 / target, then 60 Lawson reweightings towards minimax; p scanned over [0.25, 0.45] (degree 7 at p = 0.325:
// 6.8e-7 with float64 coefficients; degree 6 reaches 3.7e-6 at p = 0.28, degree 8 2.3e-7).
struct GeluErf16 {
  static constexpr const char* kName = "GeluErf16";
  static constexpr EltMath kCost = EltMath::kErf;
  static constexpr float kP = 0.325f;
  // q's coefficients, lowest first (q(t) = kQ0 + kQ1 t + ... + kQ7 t^7), times 2^-16.
  static constexpr float kQ0 = 0x1p-16f * 0.12965615f, kQ1 = 0x1p-16f * 0.12967208f, kQ2 = 0x1p-16f * 0.11550387f,
                         kQ3 = 0x1p-16f * 0.09351636f, kQ4 = 0x1p-16f * 0.026045887f, kQ5 = 0x1p-16f * 0.08530914f,
                         kQ6 = 0x1p-16f * -0.11352008f, kQ7 = 0x1p-16f * 0.03381686f;
  static constexpr float kMinusHalfLog2e = -0.72134752044448170368f;  // exp(-x^2/2) = 2^(x * (x * this))
  static constexpr float kDensity = 0x1p-16f * 0.39894228040143267794f;  // 1/sqrt(2 pi), times 2^-16

  // Phi(-|x|) and exp(-x^2 / 2) 2^16.
  struct Tail {
    float phi_minus_a;
    float exp_scaled;
  };
  FASTACT_HOST_DEVICE static Tail tail(float x) {
    const float t = rcp_sfu(fmaf(fabsf(x), kP, 1.f));
    float q = fmaf(kQ7, t, kQ6);
    q = fmaf(q, t, kQ5);
    q = fmaf(q, t, kQ4);
    q = fmaf(q, t, kQ3);
    q = fmaf(q, t, kQ2);
    q = fmaf(q, t, kQ1);
    q = fmaf(q, t, kQ0);
    const float e = ex2_sfu(fmaf(x, x * kMinusHalfLog2e, 16.f));
    return {t * q * e, e};
  }
  FASTACT_HOST_DEVICE static float cdf(float x, float phi_minus_a) {
    return x >= 0.f ? 1.f - phi_minus_a : phi_minus_a;
  }
  // x Phi(x): +inf at +inf, NaN at -inf (-inf * 0) and NaN, -0 at -0, as the float64 formula.
  FASTACT_HOST_DEVICE float forward(float x) const { return x * cdf(x, tail(x).phi_minus_a); }
  // Phi(x) + x phi(x): NaN at +-inf (inf * 0), as the float64 formula.
  FASTACT_HOST_DEVICE float derivative(float x) const {
    const Tail r = tail(x);
    return fmaf(x * kDensity, r.exp_scaled, cdf(x, r.phi_minus_a));
  }
};

// F.gelu(x, approximate="tanh") = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
struct GeluTanh {
  static constexpr EltMath kCost = EltMath::kTanh;
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
  // gelu = x (1 + t) / 2, t = tanh(u), u = k (x + c x^3): gelu'' = (1 - t^2) (u' + x (u'' - 2 t u'^2) / 2),
  // u' = k (1 + 3 c x^2), u'' = 6 k c x. 1 - t^2 as sech(u)^2: the difference loses every digit as t nears 1
  // (in float, 0.14% off at |x| = 4, and 0 instead of 4e-6 at |x| = 5); sech from exp(-|u|) (sech_), where
  // 1 / cosh(u)^2 overflowed into NaN in the dual numbers of the third derivative from |x| ~ 10 in float.
  template <typename A>
  FASTACT_HOST_DEVICE A second_derivative(A x) const {
    using K = GeluConstants<A>;
    const A x_sq = x * x;
    const A u = K::kBeta * (x + K::kKappa * x_sq * x);
    const A t = tanh_(u);
    const A sech = sech_(u);
    const A sech_sq = sech * sech;
    const A du = K::kBeta * (A(1) + A(3) * K::kKappa * x_sq);
    return sech_sq * (du + A(0.5) * x * (A(6) * K::kBeta * K::kKappa * x - A(2) * t * du * du));
  }
};

// torch.sigmoid, in the form that cannot overflow: exp is only ever taken of -|x|.
struct Sigmoid {
  static constexpr EltMath kCost = EltMath::kSigmoid;
  using Narrow = Sigmoid16;
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
  // d/dy [y (1 - y)] = 1 - 2 y.
  template <typename A>
  FASTACT_HOST_DEVICE A second_derivative_from_output(A y) const {
    return A(1) - A(2) * y;
  }
};

// torch.sigmoid for results rounded to 16 bits, in float at about 1e-6 relative error (4e-6 at x = -87, from the
// rounding of the exponent): exp(-|x|) 2^16
// by one ex2 (offset by 16, as GeluErf16's exp, so that a result down to bfloat16's smallest subnormal does not
// flush), 1 / (1 + exp(-|x|)) by one rcp (its argument in [1, 2]): two MUFUs and 5 other instructions where
// expf and a division take ~20. The backward needs none of it: Sigmoid's
// y (1 - y) (elementwise.cuh SigmoidBackwardOp).
struct Sigmoid16 {
  static constexpr const char* kName = "Sigmoid16";
  static constexpr EltMath kCost = EltMath::kSigmoid;
  static constexpr float kMinusLog2e = -1.44269504088896340736f;
  FASTACT_HOST_DEVICE float forward(float x) const {
    const float e = ex2_sfu(fmaf(fabsf(x), kMinusLog2e, 16.f));  // exp(-|x|) 2^16
    const float r = rcp_sfu(fmaf(e, 0x1p-16f, 1.f));
    return x >= 0.f ? r : e * r * 0x1p-16f;
  }
};

// F.silu(x) = x sigmoid(x) for results rounded to 16 bits: Sigmoid16's sigmoid (two MUFUs) where Silu's takes
// expf and a division; about 1e-6 relative, as Sigmoid16. The CUDA launchers take it for 16-bit tensors, forward
// and backward.
struct Silu16 {
  static constexpr const char* kName = "Silu16";
  static constexpr EltMath kCost = EltMath::kSigmoid;
  FASTACT_HOST_DEVICE float forward(float x) const { return x * Sigmoid16{}.forward(x); }
  FASTACT_HOST_DEVICE float derivative(float x) const {
    const float s = Sigmoid16{}.forward(x);
    return s * fmaf(x, 1.f - s, 1.f);
  }
};

// F.silu(x) = x sigmoid(x), through Sigmoid's form that takes exp only of -|x| (no overflow for large |x|). At
// -inf NaN (-inf * 0), as torch's x / (1 + exp(-x)).
struct Silu {
  static constexpr EltMath kCost = EltMath::kSigmoid;
  using Narrow = Silu16;
  template <typename A>
  FASTACT_HOST_DEVICE A forward(A x) const {
    return x * Sigmoid{}.forward(x);
  }
  // d/dx = s (1 + x (1 - s)), s = sigmoid(x) (torch's silu_backward).
  template <typename A>
  FASTACT_HOST_DEVICE A derivative(A x) const {
    const A s = Sigmoid{}.forward(x);
    return s * (A(1) + x * (A(1) - s));
  }
  // d2/dx2 = s (1 - s) (2 + x (1 - 2 s)).
  template <typename A>
  FASTACT_HOST_DEVICE A second_derivative(A x) const {
    const A s = Sigmoid{}.forward(x);
    return s * (A(1) - s) * (A(2) + x * (A(1) - A(2) * s));
  }
};

// ---- dual numbers: the third derivative of a pointwise functor from its second ------------------------

// v + d e with e^2 = 0. A functor's second derivative evaluated at Dual(s, 1) carries the third derivative in
// its d part (forward-mode differentiation of the formula as written), which the triple backward of a
// pointwise op takes (BackwardGrad<F, _, 3>): no third formula per op. Every math.h functor's templated
// members accept it (the arithmetic, comparisons and the math functions below).
template <typename A>
struct Dual {
  A v, d;
  constexpr Dual(A value = A(0), A slope = A(0)) : v(value), d(slope) {}
};
template <typename A>
FASTACT_HOST_DEVICE Dual<A> operator+(Dual<A> a, Dual<A> b) { return {a.v + b.v, a.d + b.d}; }
template <typename A>
FASTACT_HOST_DEVICE Dual<A> operator-(Dual<A> a, Dual<A> b) { return {a.v - b.v, a.d - b.d}; }
template <typename A>
FASTACT_HOST_DEVICE Dual<A> operator-(Dual<A> a) { return {-a.v, -a.d}; }
template <typename A>
FASTACT_HOST_DEVICE Dual<A> operator*(Dual<A> a, Dual<A> b) { return {a.v * b.v, a.d * b.v + a.v * b.d}; }
template <typename A>
FASTACT_HOST_DEVICE Dual<A> operator/(Dual<A> a, Dual<A> b) { return {a.v / b.v, (a.d * b.v - a.v * b.d) / (b.v * b.v)}; }
template <typename A>
FASTACT_HOST_DEVICE bool operator>=(Dual<A> a, Dual<A> b) { return a.v >= b.v; }
template <typename A>
FASTACT_HOST_DEVICE bool operator>(Dual<A> a, Dual<A> b) { return a.v > b.v; }
template <typename A>
FASTACT_HOST_DEVICE bool operator<=(Dual<A> a, Dual<A> b) { return a.v <= b.v; }
template <typename A>
FASTACT_HOST_DEVICE bool operator<(Dual<A> a, Dual<A> b) { return a.v < b.v; }
template <typename A>
FASTACT_HOST_DEVICE Dual<A> exp_(Dual<A> x) {
  const A e = exp_(x.v);
  return {e, e * x.d};
}
template <typename A>
FASTACT_HOST_DEVICE Dual<A> log_(Dual<A> x) { return {log_(x.v), x.d / x.v}; }
template <typename A>
FASTACT_HOST_DEVICE Dual<A> erf_(Dual<A> x) {  // erf' = 2 / sqrt(pi) exp(-x^2)
  return {erf_(x.v), A(1.12837916709551257390) * exp_(-x.v * x.v) * x.d};
}
template <typename A>
FASTACT_HOST_DEVICE Dual<A> tanh_(Dual<A> x) {
  const A s = sech_(x.v);
  return {tanh_(x.v), x.d * s * s};  // sech^2, not 1 - t^2 (which cancels as t nears 1)
}

// ---- pointwise functors as their ops use them ------------------------------------------------------

// F::Narrow where F has one, else F: the forward's functor on results rounded to 16 bits.
template <typename F, typename = void>
struct NarrowOf {
  using type = F;
  static constexpr bool kHas = false;
};
template <typename F>
struct NarrowOf<F, std::void_t<typename F::Narrow>> {
  using type = typename F::Narrow;
  static constexpr bool kHas = true;
};

// Whether functor G has the derivative a backward from the input (kFromOutput false) or from the output needs.
template <typename G, bool kFromOutput, typename = void>
struct HasDerivative : std::false_type {};
template <typename G>
struct HasDerivative<G, false, std::void_t<decltype(G{}.derivative(1.f))>> : std::true_type {};
template <typename G>
struct HasDerivative<G, true, std::void_t<decltype(G{}.derivative_from_output(1.f))>> : std::true_type {};

// The functor of F's backward on results rounded to 16 bits: F::Narrow where it has that derivative (GeluErf16),
// else F (Sigmoid16 is a forward only: the backward's y (1 - y) needs nothing cheaper).
template <typename F, bool kFromOutput>
using NarrowBackwardOf =
    std::conditional_t<NarrowOf<F>::kHas && HasDerivative<typename NarrowOf<F>::type, kFromOutput>::value,
                       typename NarrowOf<F>::type, F>;

// f' at s, the tensor the backward saved: the input x, or with kFromOutput the output y = f(x).
template <bool kFromOutput, typename F, typename A>
FASTACT_HOST_DEVICE A derivative_at(const F& f, A s) {
  if constexpr (kFromOutput) return f.derivative_from_output(s);
  else return f.derivative(s);
}

// The derivative of derivative_at(f, s) with respect to s: f''(x), or d/dy of f' written in y; kOrder 3: the
// derivative of that in turn (through Dual).
template <bool kFromOutput, int kOrder = 2, typename F, typename A>
FASTACT_HOST_DEVICE A second_derivative_at(const F& f, A s) {
  if constexpr (kOrder == 3) {
    return second_derivative_at<kFromOutput>(f, Dual<A>(s, A(1))).d;
  } else if constexpr (kFromOutput) {
    return f.second_derivative_from_output(s);
  } else {
    return f.second_derivative(s);
  }
}

// The backward op of a pointwise op, dx = dy f'(s), and the derivative of that with respect to s (double
// backward), a f''(s) for a = g dy (g the gradient of dx): both binary functors over (dy or a, s), run through
// the same elementwise kernels as the forward (CPU and CUDA). kOrder 3: the derivative of a f''(s) with respect
// to s in turn, a f'''(s) (triple backward).
template <typename F, bool kFromOutput>
struct Backward {
  F f;
  template <typename A>
  FASTACT_HOST_DEVICE A operator()(A dy, A s) const {
    return dy * derivative_at<kFromOutput>(f, s);
  }
};
template <typename F, bool kFromOutput, int kOrder = 2>
struct BackwardGrad {
  F f;
  template <typename A>
  FASTACT_HOST_DEVICE A operator()(A a, A s) const {
    return a * second_derivative_at<kFromOutput, kOrder>(f, s);
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
