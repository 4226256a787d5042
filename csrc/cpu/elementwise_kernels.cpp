// The CPU kernels of the elementwise ops: the pointwise ops of fastact/op_table.h (GELU erf and tanh,
// sigmoid, ...: forward, backward and the backward's own derivative) and bias + GELU. Compiled once per instruction set, inside `namespace CPU_CAPABILITY` (csrc/cpu/vec_io.h
// has the scheme and its ODR rules); kernels.cpp puts the entry points at the end in the table.

#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "cpu/vec_io.h"
#include "cpu/vec_math.h"

namespace fastact::cpu {
namespace CPU_CAPABILITY {
namespace {

// ---------------------------------------------------------------------------------------------
// Vector math of GELU and sigmoid (the primitives they share with softmax are in vec_math.h).

// Standard normal CDF Phi(x) = 0.5 (1 + erf(x / sqrt 2)), and g = exp(-x^2 / 2) (so that the
// density is g / sqrt(2 pi)). float: the Abramowitz-Stegun 7.1.26 erfc approximation (|error| <
// 1.5e-7, the one ATen's vectorised erf uses) in its erfc form, 0.5 erfc(|z|) = 0.5 t P(t) e^-z^2,
// which avoids the cancellation in 1 + erf(z) for negative x and shares e^-z^2 = g with the
// density. double: Sleef erf and exp (1 ulp), the formula as written.
// NaN x: unspecified cdf and g; callers multiply by x, which carries the NaN.
inline void normal_cdf(const Vec<float>& x, Vec<float>& cdf, Vec<float>& g) {
  using V = Vec<float>;
  using K = math::GeluConstants<float>;
  // Abramowitz & Stegun 7.1.26: erfc(z) ~ t (a1 + t (a2 + t (a3 + t (a4 + t a5)))) e^-z^2,
  // t = 1 / (1 + p z), z >= 0.
  const V p(0.3275911f), a1(0.254829592f), a2(-0.284496736f), a3(1.421413741f), a4(-1.453152027f),
      a5(1.061405429f);
  const V z = x * V(K::kAlpha);
  const V t = V(1.f) / at::vec::fmadd(p, z.abs(), V(1.f));
  const V poly = at::vec::fmadd(at::vec::fmadd(at::vec::fmadd(at::vec::fmadd(a5, t, a4), t, a3), t, a2), t, a1);
  g = exp_nonpos(V(0.f) - z * z);            // -x^2/2 <= 0
  const V half_erfc = V(0.5f) * poly * t * g;  // 0.5 erfc(|z|) = Phi(-|x|)
  cdf = if_negative(x, half_erfc, V(1.f) - half_erfc);
}
inline void normal_cdf(const Vec<double>& x, Vec<double>& cdf, Vec<double>& g) {
  using V = Vec<double>;
  using K = math::GeluConstants<double>;
  cdf = V(0.5) * (V(1.0) + (x * V(K::kAlpha)).erf());
  g = (V(-0.5) * x * x).exp();
}

// sign(v) min(|v|, b) for b > 0, i.e. clamp(v, -b, b): on AVX512 one vrangeps (imm 0b0010: the smaller magnitude,
// with the first operand's sign) instead of clamp's max and min. NaN v: unspecified (callers carry it).
inline Vec<float> clamp_symmetric(const Vec<float>& v, float b) {
#if defined(CPU_CAPABILITY_AVX512)
  return Vec<float>(_mm512_range_ps(v, _mm512_set1_ps(b), 0x02));
#else
  return at::vec::clamp(v, Vec<float>(-b), Vec<float>(b));
#endif
}

// erf(z) for float without exp: z P(z^2) / Q(z^2), P and Q of degree 5, a minimax fit of
// erf(z) / z on [0, 3.95] (fitted for fastact by iteratively reweighted least squares; fit error
// 3.5e-8, 4e-7 absolute after float rounding, against A-S 7.1.26's 1.5e-7 plus its exp), |z|
// clamped to 3.95, where erf rounds to 1 in float. A third cheaper than the erfc form above (no
// exp); used where the density is not needed too (the forward).
inline Vec<float> erf_rational(const Vec<float>& z_in) {
  using V = Vec<float>;
  const V z = clamp_symmetric(z_in, 3.95f);  // NaN: unspecified (callers carry it)
  const V w = z * z;
  V p = at::vec::fmadd(V(1.9848707215053274e-06f), w, V(2.883273668664206e-04f));
  p = at::vec::fmadd(p, w, V(3.99749715314486e-03f));
  p = at::vec::fmadd(p, w, V(5.346587719952808e-02f));
  p = at::vec::fmadd(p, w, V(1.9604755285905412e-01f));
  p = at::vec::fmadd(p, w, V(1.1283791261339278f));  // 2 / sqrt(pi): erf(z) ~ 2z/sqrt(pi) at 0
  V q = at::vec::fmadd(V(3.759316412485503e-05f), w, V(1.2152920263034904e-03f));
  q = at::vec::fmadd(q, w, V(1.5437796006025567e-02f));
  q = at::vec::fmadd(q, w, V(1.1641390825377043e-01f));
  q = at::vec::fmadd(q, w, V(5.07074685907922e-01f));
  q = at::vec::fmadd(q, w, V(1.f));
  // At the clamp the fit overshoots 1 by an ulp; the clamp keeps 1 + erf >= 0, so that gelu(x) is
  // exactly -0 (not a few ulp of the wrong sign) for x below -5.6.
  return clamp_symmetric(z * p / q, 1.f);
}

// F.gelu(x, approximate="none") = x/2 (1 + erf(x / sqrt 2)) (math::GeluErf). float: erf_rational;
// double: normal_cdf (Sleef erf).
inline Vec<float> gelu_erf(const Vec<float>& x) {
  using V = Vec<float>;
  return x * at::vec::fmadd(V(0.5f), erf_rational(x * V(math::GeluConstants<float>::kAlpha)), V(0.5f));
}
inline Vec<double> gelu_erf(const Vec<double>& x) {
  Vec<double> cdf, g;
  normal_cdf(x, cdf, g);
  return x * cdf;
}
// d/dx = Phi(x) + x phi(x) (math::GeluErf::derivative).
template <typename A>
Vec<A> gelu_erf_derivative(const Vec<A>& x) {
  Vec<A> cdf, g;
  normal_cdf(x, cdf, g);
  return at::vec::fmadd(x * g, Vec<A>(math::GeluConstants<A>::kInvSqrt2Pi), cdf);
}

// 1 / d for d in [1, 2], to about 2^-22 relative: the hardware's reciprocal estimate (12 or 14 bits)
// and one Newton step, r (2 - d r). For outputs rounded to 16 bits (2^-8 or 2^-11 apart), where it
// equals a division after rounding but for rare ties, and costs a fraction of one (vdivps is the
// slowest instruction of a sigmoid or a tanh GELU). The portable build divides.
inline Vec<float> reciprocal_1_2(const Vec<float>& d) {
#if defined(CPU_CAPABILITY_AVX512)
  const Vec<float> r = Vec<float>(_mm512_rcp14_ps(d));
#elif defined(CPU_CAPABILITY_AVX2)
  const Vec<float> r = Vec<float>(_mm256_rcp_ps(d));
#else
  return Vec<float>(1.f) / d;
#endif
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  return r * at::vec::fnmadd(d, r, Vec<float>(2.f));
#endif
}

// Whether T's results are rounded to 16 bits: the kNarrow argument of sigmoid, the tanh GELU and their ops.
template <typename T>
constexpr bool kNarrowOut = std::is_same_v<T, c10::BFloat16> || std::is_same_v<T, c10::Half>;

// 1 / d for d in [1, 2]: reciprocal_1_2 where the result is rounded to 16 bits (float only), else a
// division.
template <bool kNarrow, typename A>
Vec<A> reciprocal_for(const Vec<A>& d) {
  if constexpr (kNarrow && std::is_same_v<A, float>) return reciprocal_1_2(d);
  else return Vec<A>(A(1)) / d;
}

// F.gelu(x, approximate="tanh") = x/2 (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)
// (math::GeluTanh), through the identity (1 + tanh(u)) / 2 = sigmoid(2u): one exp, no tanh, no
// cancellation in 1 + tanh(u) for negative x, and no overflow: with e = exp(-|2u|) in [0, 1] and
// r = 1 / (1 + e), s = sigmoid(2u) is r for u >= 0 and e r for u < 0, and s (1 - s) = e r^2
// either way. Derivative: (1 + t)/2 + x/2 (1 - t^2) u' = s + 2 x s (1 - s) u',
// u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
// kNarrow: the result is rounded to 16 bits (reciprocal_for).
template <bool kNarrow, typename A>
void gelu_tanh_parts(const Vec<A>& x, Vec<A>& s, Vec<A>& e, Vec<A>& r) {
  using V = Vec<A>;
  using K = math::GeluConstants<A>;
  const V u = V(K::kBeta) * x * at::vec::fmadd(V(K::kKappa), x * x, V(A(1)));
  e = exp_nonpos(V(A(0)) - (u + u).abs());  // NaN x: unspecified, x carries the NaN
  r = reciprocal_for<kNarrow>(V(A(1)) + e);
  s = if_negative(u, e * r, r);
}
template <bool kNarrow = false, typename A>
Vec<A> gelu_tanh(const Vec<A>& x) {
  Vec<A> s, e, r;
  gelu_tanh_parts<kNarrow>(x, s, e, r);
  return x * s;
}
template <bool kNarrow = false, typename A>
Vec<A> gelu_tanh_derivative(const Vec<A>& x) {
  using V = Vec<A>;
  using K = math::GeluConstants<A>;
  V s, e, r;
  gelu_tanh_parts<kNarrow>(x, s, e, r);
  const V du = V(K::kBeta) * at::vec::fmadd(V(A(3) * K::kKappa), x * x, V(A(1)));
  return at::vec::fmadd(V(A(2)) * x * e * r * r, du, s);
}

// torch.sigmoid without overflow (math::Sigmoid): e = exp(-|x|) in (0, 1], r = 1 / (1 + e),
// sigmoid = r for x >= 0 and e r for x < 0. kNarrow: the result is rounded to 16 bits
// (reciprocal_for).
template <bool kNarrow = false, typename A>
Vec<A> sigmoid(const Vec<A>& x) {
  using V = Vec<A>;
  const V e = exp_nonpos(V(A(0)) - x.abs());  // NaN x: unspecified, fixed below
  const V r = reciprocal_for<kNarrow>(V(A(1)) + e);
  return keep_nan(x, if_negative(x, e * r, r));
}

// ---------------------------------------------------------------------------------------------
// Pointwise ops: a vector form and a scalar form (the math.h functor) of the same function.

// The SIMD form of a math.h functor F of a pointwise op (fastact/op_table.h): forward(x) and the derivative its
// backward takes, derivative(x) or derivative_from_output(y), over Vec<A>; kNarrow: results rounded to 16 bits
// (kNarrowOut<T>; reciprocal_for). kDefined false: none written, the ops below evaluate the functor lane by lane
// (correct, not fast). Its double-backward op (second derivative) is always taken lane by lane.
template <typename F>
struct VecForm {
  static constexpr bool kDefined = false;
};

template <>
struct VecForm<math::GeluErf> {
  static constexpr bool kDefined = true;
  template <bool kNarrow, typename A>
  static Vec<A> forward(const Vec<A>& x) {
    return gelu_erf(x);
  }
  template <bool kNarrow, typename A>
  static Vec<A> derivative(const Vec<A>& x) {
    return gelu_erf_derivative(x);
  }
};

template <>
struct VecForm<math::GeluTanh> {
  static constexpr bool kDefined = true;
  template <bool kNarrow, typename A>
  static Vec<A> forward(const Vec<A>& x) {
    return gelu_tanh<kNarrow>(x);
  }
  template <bool kNarrow, typename A>
  static Vec<A> derivative(const Vec<A>& x) {
    return gelu_tanh_derivative<kNarrow>(x);
  }
};

template <>
struct VecForm<math::Sigmoid> {
  static constexpr bool kDefined = true;
  template <bool kNarrow, typename A>
  static Vec<A> forward(const Vec<A>& x) {
    return sigmoid<kNarrow>(x);
  }
  template <bool kNarrow, typename A>
  static Vec<A> derivative_from_output(const Vec<A>& y) {
    return y * (Vec<A>(A(1)) - y);
  }
};

// F.silu = x sigmoid(x), f' = s (1 + x (1 - s)) (math::Silu), on the vector sigmoid above.
template <>
struct VecForm<math::Silu> {
  static constexpr bool kDefined = true;
  template <bool kNarrow, typename A>
  static Vec<A> forward(const Vec<A>& x) {
    return x * sigmoid<kNarrow>(x);
  }
  template <bool kNarrow, typename A>
  static Vec<A> derivative(const Vec<A>& x) {
    const Vec<A> s = sigmoid<kNarrow>(x);
    return s * at::vec::fmadd(x, Vec<A>(A(1)) - s, Vec<A>(A(1)));
  }
};

// f applied to each lane of v: the vector form of a functor without one.
template <typename A, typename Fn>
Vec<A> by_lanes(const Fn& f, const Vec<A>& v) {
  alignas(64) A lanes[Vec<A>::size()];
  v.store(lanes);
  for (int j = 0; j < static_cast<int>(Vec<A>::size()); ++j) lanes[j] = f(lanes[j]);
  return Vec<A>::loadu(lanes);
}
template <typename A, typename Fn>
Vec<A> by_lanes(const Fn& f, const Vec<A>& a, const Vec<A>& b) {
  alignas(64) A la[Vec<A>::size()], lb[Vec<A>::size()];
  a.store(la);
  b.store(lb);
  for (int j = 0; j < static_cast<int>(Vec<A>::size()); ++j) la[j] = f(la[j], lb[j]);
  return Vec<A>::loadu(la);
}

// y = f(x).
template <typename F, bool kNarrow = false>
struct ForwardOp {
  template <typename A>
  Vectorized<A> operator()(const Vectorized<A>& x) const {
    if constexpr (VecForm<F>::kDefined) return VecForm<F>::template forward<kNarrow>(x);
    else return by_lanes([](A v) { return F{}.forward(v); }, x);
  }
  template <typename A>
  A operator()(A x) const {
    return F{}.forward(x);
  }
};

// dx = dy f'(s), s the input or (kFromOutput) the output.
template <typename F, bool kFromOutput, bool kNarrow = false>
struct BackwardOp {
  template <typename A>
  Vectorized<A> operator()(const Vectorized<A>& dy, const Vectorized<A>& s) const {
    if constexpr (!VecForm<F>::kDefined) {
      return by_lanes([](A d, A v) { return math::Backward<F, kFromOutput>{}(d, v); }, dy, s);
    } else if constexpr (kFromOutput) {
      return dy * VecForm<F>::template derivative_from_output<kNarrow>(s);
    } else {
      return dy * VecForm<F>::template derivative<kNarrow>(s);
    }
  }
  template <typename A>
  A operator()(A dy, A s) const {
    return math::Backward<F, kFromOutput>{}(dy, s);
  }
};

// a f''(s): the backward's derivative with respect to s (double backward), or with kOrder 3 a f'''(s) (triple
// backward), lane by lane.
template <typename F, bool kFromOutput, int kOrder>
struct BackwardGradOp {
  template <typename A>
  Vectorized<A> operator()(const Vectorized<A>& a, const Vectorized<A>& s) const {
    return by_lanes([](A u, A v) { return math::BackwardGrad<F, kFromOutput, kOrder>{}(u, v); }, a, s);
  }
  template <typename A>
  A operator()(A a, A s) const {
    return math::BackwardGrad<F, kFromOutput, kOrder>{}(a, s);
  }
};

// bias_gelu's GELU.
template <bool kTanh>
using GeluFunctor = std::conditional_t<kTanh, math::GeluTanh, math::GeluErf>;
template <bool kTanh, bool kNarrow = false>
using GeluOp = ForwardOp<GeluFunctor<kTanh>, kNarrow>;
template <bool kTanh, bool kNarrow = false>
using GeluBackwardOp = BackwardOp<GeluFunctor<kTanh>, /*kFromOutput=*/false, kNarrow>;

// A note on the loops below: each runs in a function whose pointers are parameters (locals), not
// in a lambda that captured them by reference. A vector store may alias anything (the intrinsics'
// types are may_alias), so a pointer read through a closure would be reloaded after every store:
// five extra dependent loads per iteration, 20% of a memory-bound op.

// y[i] = op(x[i]) for i in [begin, end), whole vector pairs then single elements.
// kStream: streaming stores, after single elements up to the first aligned output address.
template <bool kStream, typename T, typename Op>
void unary_range(const T* x, T* y, int64_t begin, int64_t end, const Op& op) {
  using IO = Io<T>;
  using A = typename IO::A;
  using V = typename IO::V;
  constexpr int64_t kStep = 2 * IO::kV;
  int64_t i = begin;
  if constexpr (kStream) {
    for (; i < end && !stream_aligned(y + i); ++i) y[i] = from_acc<T>(op(to_acc(x[i])));
  }
  for (; i + kStep <= end; i += kStep) {
    V a0, a1;
    IO::load2_lanes(x + i, a0, a1);
    if constexpr (kStream) stream2_lanes(y + i, op(a0), op(a1));
    else IO::store2_lanes(y + i, op(a0), op(a1));
  }
  for (; i < end; ++i) y[i] = from_acc<T>(op(to_acc(x[i])));
  if constexpr (kStream) stream_fence();
}

// z[i] = op(a[i], b[i]) for i in [begin, end).
template <bool kStream, typename T, typename Op>
void binary_range(const T* a, const T* b, T* z, int64_t begin, int64_t end, const Op& op) {
  using IO = Io<T>;
  using A = typename IO::A;
  using V = typename IO::V;
  constexpr int64_t kStep = 2 * IO::kV;
  int64_t i = begin;
  if constexpr (kStream) {
    for (; i < end && !stream_aligned(z + i); ++i) z[i] = from_acc<T>(op(to_acc(a[i]), to_acc(b[i])));
  }
  for (; i + kStep <= end; i += kStep) {
    V a0, a1, b0, b1;
    IO::load2_lanes(a + i, a0, a1);
    IO::load2_lanes(b + i, b0, b1);
    if constexpr (kStream) stream2_lanes(z + i, op(a0, b0), op(a1, b1));
    else IO::store2_lanes(z + i, op(a0, b0), op(a1, b1));
  }
  for (; i < end; ++i) z[i] = from_acc<T>(op(to_acc(a[i]), to_acc(b[i])));
  if constexpr (kStream) stream_fence();
}

// Calls seg(row, c0, c1) for the row segments that make up elements [begin, end) of a
// [rows, cols] row-major array.
template <typename F>
void for_each_row_segment(int64_t begin, int64_t end, int64_t cols, const F& seg) {
  int64_t r = begin / cols, c = begin % cols;
  while (begin < end) {
    const int64_t c1 = std::min(cols, c + (end - begin));
    seg(r, c, c1);
    begin += c1 - c;
    ++r;
    c = 0;
  }
}

// Where the elementwise loops may cut a row. The range loops decide from a segment's own start and
// end which elements the vector body computes and which the single-element code (the streaming
// prologue, the tail), and the two round differently (the scalar code is math.h's functors, the
// vector code its own polynomials: an ulp or two apart). So that every element is computed by the
// same code whatever the chunks (the thread count), a chunk may begin or end only where the loop
// over the whole row would be between two of its steps: at the row's start, or `peel` (the
// elements the whole row's loop takes one at a time first) plus a multiple of `unit` (a vector
// pair; with streaming stores, the pair or the streaming alignment, whichever is wider, so that a
// segment starting there peels nothing). snap() moves an element index down to such a point; it
// is monotone and keeps 0 and rows * cols, so snapped chunks still partition the elements.
template <typename Peel>
struct RowCuts {
  int64_t cols;
  int64_t unit;
  Peel peel;  // peel(r): the single elements at the start of row r, from 0 to cols

  int64_t snap(int64_t i) const {
    const int64_t r = i / cols, c = i % cols;
    if (c == 0) return i;
    const int64_t p = peel(r);
    return r * cols + (c < p ? 0 : p + (c - p) / unit * unit);
  }
};

template <typename Peel>
RowCuts<Peel> row_cuts(int64_t cols, int64_t unit, const Peel& peel) {
  return {cols, unit, peel};
}

// The elements unary_range / binary_range<kStream> write one at a time before their first vector
// pair when a segment starts at out: up to the first kStreamAlign boundary (n if none is reached).
template <typename T>
int64_t stream_peel(const T* out, int64_t n) {
  const auto misalign = reinterpret_cast<std::uintptr_t>(out) % kStreamAlign;
  if (misalign == 0) return 0;
  if (misalign % sizeof(T) != 0) return n;  // never aligned: every element one at a time
  return std::min<int64_t>(n, static_cast<int64_t>((kStreamAlign - misalign) / sizeof(T)));
}

// Runs seg(r, c0, c1) over the row segments of a [rows, cols] output (row r at out + r * cols), in
// chunks over threads cut only where RowCuts allows, for range loops with streaming stores
// (kStream) or without.
template <typename T, typename Seg>
void parallel_row_segments(const T* out, int64_t rows, int64_t cols, int64_t grain, bool stream, const Seg& seg) {
  constexpr int64_t kStep = 2 * Io<T>::kV;
  const auto run = [&](const auto& cuts) {
    parallel_for(rows * cols, grain, [&](int64_t b, int64_t e) {
      for_each_row_segment(cuts.snap(b), cuts.snap(e), cols, seg);
    });
  };
  if (stream) {
    constexpr int64_t kAlignElems = static_cast<int64_t>(kStreamAlign / sizeof(T));
    run(row_cuts(cols, std::max(kStep, kAlignElems), [&](int64_t r) { return stream_peel(out + r * cols, cols); }));
  } else {
    run(row_cuts(cols, kStep, [](int64_t) { return int64_t{0}; }));
  }
}

// Over the elements of g (flat operands: one row of n), in chunks cut where RowCuts allows.
// Outputs of kStreamBytes or more are written with streaming stores.
template <typename T, typename Op>
void unary_kernel(const T* x, T* y, const ElementRows& g, int64_t grain, const Op& op) {
  const int64_t n = g.numel();
  const bool stream = n * int64_t{sizeof(T)} >= kStreamBytes;
  const ElementRows f = g.is_flat() ? ElementRows::flat(n) : g;
  parallel_row_segments(y, f.rows, f.cols, grain, stream, [&](int64_t r, int64_t c0, int64_t c1) {
    if (stream) unary_range<true>(x + r * f.stride0, y + r * f.cols, c0, c1, op);
    else unary_range<false>(x + r * f.stride0, y + r * f.cols, c0, c1, op);
  });
}

template <typename T, typename Op>
void binary_kernel(const T* a, const T* b, T* z, const ElementRows& g, int64_t grain, const Op& op) {
  const int64_t n = g.numel();
  const bool stream = n * int64_t{sizeof(T)} >= kStreamBytes;
  const ElementRows f = g.is_flat() ? ElementRows::flat(n) : g;
  parallel_row_segments(z, f.rows, f.cols, grain, stream, [&](int64_t r, int64_t c0, int64_t c1) {
    if (stream) binary_range<true>(a + r * f.stride0, b + r * f.stride1, z + r * f.cols, c0, c1, op);
    else binary_range<false>(a + r * f.stride0, b + r * f.stride1, z + r * f.cols, c0, c1, op);
  });
}

// ---------------------------------------------------------------------------------------------
// bias + GELU. x, y, dy, dx contiguous [rows, cols]; bias, dbias [cols].

// y[c] = gelu(x[c] + bias[c]) for c in [c0, c1) of one row: x + bias never leaves registers.
template <typename T, bool kTanh>
void bias_gelu_segment(const T* x, const T* bias, T* y, int64_t c0, int64_t c1) {
  using IO = Io<T>;
  using A = typename IO::A;
  using V = typename IO::V;
  constexpr int64_t kStep = 2 * IO::kV;
  const GeluOp<kTanh, kNarrowOut<T>> gelu;
  int64_t c = c0;
  for (; c + kStep <= c1; c += kStep) {
    V x0, x1, b0, b1;
    IO::load2_lanes(x + c, x0, x1);  // x, bias and y in one order (Io::load2_lanes)
    IO::load2_lanes(bias + c, b0, b1);
    IO::store2_lanes(y + c, gelu(x0 + b0), gelu(x1 + b1));
  }
  for (; c < c1; ++c) y[c] = from_acc<T>(gelu(to_acc(x[c]) + to_acc(bias[c])));
}

template <typename T, bool kTanh>
void bias_gelu_fwd_impl(const T* x, int64_t x_stride, const T* bias, T* y, int64_t rows, int64_t cols) {
  // Cut only between vector pairs of a row (RowCuts): the same bits at any thread count.
  parallel_row_segments(y, rows, cols, kGrainHeavy, /*stream=*/false, [&](int64_t r, int64_t c0, int64_t c1) {
    bias_gelu_segment<T, kTanh>(x + r * x_stride, bias, y + r * cols, c0, c1);
  });
}

// The fixed partition of the bias-gradient reduction: tasks of (row chunk, column block), each
// summing its rows of dx into its own slice of a [row_chunks, cols] acc_t buffer, then a sum of
// that buffer over row chunks in chunk order. Nothing depends on the thread count or on the
// order tasks run in, so dbias is bit-identical from run to run and machine to machine (at one ISA).
struct BiasGradPartition {
  // A column block of the partial sums stays in L1 while its rows stream by (8 KB of float).
  static constexpr int64_t kColBlock = 2048;
  // Elements a row chunk should hold: below this the partial buffer costs more than it buys.
  static constexpr int64_t kChunkElems = kGrain;
  // At most this many row chunks (the parallelism over rows), and at most this many partial
  // sums in all (1 MB of float), so that the final reduction stays a small fraction of the pass.
  static constexpr int64_t kMaxRowChunks = 64;
  static constexpr int64_t kMaxPartials = int64_t(1) << 18;

  int64_t row_chunks, rows_per_chunk, col_blocks;

  BiasGradPartition(int64_t rows, int64_t cols) {
    int64_t chunks = std::clamp<int64_t>(rows * cols / kChunkElems, 1, kMaxRowChunks);
    chunks = std::min({chunks, rows, std::max<int64_t>(1, kMaxPartials / cols)});
    rows_per_chunk = ceil_div(rows, chunks);
    row_chunks = ceil_div(rows, rows_per_chunk);
    col_blocks = ceil_div(cols, kColBlock);
  }
};

// dx[c] = dy[c] * gelu'(x[c] + bias[c]) for c in [c0, c1) of one row, and acc[c - c0] += dx[c]
// (in acc_t, before dx's rounding).
template <typename T, bool kTanh>
void bias_gelu_bwd_segment(const T* dy, const T* x, const T* bias, T* dx, typename Io<T>::A* acc, int64_t c0,
                           int64_t c1) {
  using IO = Io<T>;
  using A = typename IO::A;
  using V = typename IO::V;
  constexpr int64_t kStep = 2 * IO::kV;
  const GeluBackwardOp<kTanh, kNarrowOut<T>> grad;
  int64_t c = c0;
  for (; c + kStep <= c1; c += kStep) {
    V g0, g1, x0, x1, b0, b1;
    IO::load2(dy + c, g0, g1);
    IO::load2(x + c, x0, x1);
    IO::load2(bias + c, b0, b1);
    const V d0 = grad(g0, x0 + b0), d1 = grad(g1, x1 + b1);
    IO::store2(dx + c, d0, d1);
    A* a = acc + (c - c0);
    (V::loadu(a) + d0).store(a);
    (V::loadu(a + IO::kV) + d1).store(a + IO::kV);
  }
  for (; c < c1; ++c) {
    const A d = grad(to_acc(dy[c]), to_acc(x[c]) + to_acc(bias[c]));
    dx[c] = from_acc<T>(d);
    acc[c - c0] += d;
  }
}

template <typename T, bool kTanh>
void bias_gelu_bwd_impl(const T* dy, const T* x, int64_t x_stride, const T* bias, T* dx, T* dbias, int64_t rows,
                        int64_t cols) {
  using A = typename Io<T>::A;
  const BiasGradPartition part(rows, cols);
  std::unique_ptr<A[]> partial(new A[part.row_chunks * cols]);  // [row_chunks, cols]

  const int64_t tasks = part.row_chunks * part.col_blocks;
  const int64_t task_elems = part.rows_per_chunk * std::min(cols, BiasGradPartition::kColBlock);
  parallel_for(tasks, std::max<int64_t>(1, kGrainHeavy / task_elems), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t rc = t / part.col_blocks, cb = t % part.col_blocks;
      const int64_t r0 = rc * part.rows_per_chunk, r1 = std::min(rows, r0 + part.rows_per_chunk);
      const int64_t c0 = cb * BiasGradPartition::kColBlock, c1 = std::min(cols, c0 + BiasGradPartition::kColBlock);
      A* total = partial.get() + rc * cols;
      std::fill(total + c0, total + c1, A(0));
      A acc[BiasGradPartition::kColBlock];  // acc[c - c0]: this task's columns over <= kSumRows rows
      for (int64_t r = r0; r < r1; ++r) {
        if ((r - r0) % kSumRows == 0) {
          if (r > r0)
            for (int64_t c = c0; c < c1; ++c) total[c] += acc[c - c0];
          std::fill(acc, acc + (c1 - c0), A(0));
        }
        bias_gelu_bwd_segment<T, kTanh>(dy + r * cols, x + r * x_stride, bias, dx + r * cols, acc, c0, c1);
      }
      for (int64_t c = c0; c < c1; ++c) total[c] += acc[c - c0];
    }
  });

  // dbias[c] = sum over row chunks, in chunk order.
  parallel_for(cols, kGrain, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      A s = partial[c];
      for (int64_t rc = 1; rc < part.row_chunks; ++rc) s += partial[rc * cols + c];
      dbias[c] = from_acc<T>(s);
    }
  });
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The entry points (csrc/cpu/kernels.h: TypedKernels).

// The threading grain of a pointwise op: the GELUs' erf and tanh are several times a sigmoid's work.
template <typename F>
constexpr int64_t kPointwiseGrain = F::kCost == EltMath::kSigmoid ? kGrain : kGrainHeavy;

template <typename T, typename Row>
void pointwise_fwd(const T* x, T* y, const ElementRows& g, int choice) {
  optable::with_functor<Row>(choice, [&](auto f) {
    using F = decltype(f);
    unary_kernel(x, y, g, kPointwiseGrain<F>, ForwardOp<F, kNarrowOut<T>>{});
  });
}

template <typename T, typename Row>
void pointwise_bwd(const T* dy, const T* s, T* dx, const ElementRows& g, int choice) {
  optable::with_functor<Row>(choice, [&](auto f) {
    using F = decltype(f);
    binary_kernel(dy, s, dx, g, kPointwiseGrain<F>, BackwardOp<F, Row::kFromOutput, kNarrowOut<T>>{});
  });
}

template <typename T, typename Row>
void pointwise_bwd_grad(const T* a, const T* s, T* out, const ElementRows& g, int choice, int order) {
  optable::with_functor<Row>(choice, [&](auto f) {
    using F = decltype(f);
    if (order == 3) binary_kernel(a, s, out, g, kGrainHeavy, BackwardGradOp<F, Row::kFromOutput, 3>{});
    else binary_kernel(a, s, out, g, kGrainHeavy, BackwardGradOp<F, Row::kFromOutput, 2>{});
  });
}

template <typename T>
void bias_gelu_fwd(const T* x, int64_t x_stride, const T* bias, T* y, int64_t rows, int64_t cols, bool tanh_approx) {
  if (tanh_approx) bias_gelu_fwd_impl<T, true>(x, x_stride, bias, y, rows, cols);
  else bias_gelu_fwd_impl<T, false>(x, x_stride, bias, y, rows, cols);
}

template <typename T>
void bias_gelu_bwd(const T* dy, const T* x, int64_t x_stride, const T* bias, T* dx, T* dbias, int64_t rows,
                   int64_t cols, bool tanh_approx) {
  if (tanh_approx) bias_gelu_bwd_impl<T, true>(dy, x, x_stride, bias, dx, dbias, rows, cols);
  else bias_gelu_bwd_impl<T, false>(dy, x, x_stride, bias, dx, dbias, rows, cols);
}

// The entry points of the kernel table (csrc/cpu/kernels.h), for every element type.
template <typename T>
void fill_pointwise_kernels(TypedKernels<T>& k) {
  optable::for_each_pointwise([&](auto* row) {
    using Row = std::remove_pointer_t<decltype(row)>;
    constexpr int i = optable::index<Row>();
    k.pointwise_fwd[i] = &pointwise_fwd<T, Row>;
    k.pointwise_bwd[i] = &pointwise_bwd<T, Row>;
    k.pointwise_bwd_grad[i] = &pointwise_bwd_grad<T, Row>;
  });
}

#define FASTACT_ELEMENTWISE_ENTRIES(T)                                                                        \
  template void fill_pointwise_kernels<T>(TypedKernels<T>&);                                                  \
  template void bias_gelu_fwd<T>(const T*, int64_t, const T*, T*, int64_t, int64_t, bool);                    \
  template void bias_gelu_bwd<T>(const T*, const T*, int64_t, const T*, T*, T*, int64_t, int64_t, bool);
FASTACT_ELEMENTWISE_ENTRIES(float)
FASTACT_ELEMENTWISE_ENTRIES(double)
FASTACT_ELEMENTWISE_ENTRIES(c10::Half)
FASTACT_ELEMENTWISE_ENTRIES(c10::BFloat16)
#undef FASTACT_ELEMENTWISE_ENTRIES
}  // namespace CPU_CAPABILITY
}  // namespace fastact::cpu
