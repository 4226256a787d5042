// The vector math primitives both kernel families use (softmax_kernels.cpp, elementwise_kernels.cpp):
// lane selects, exp on its two domains, horizontal reductions. Per ISA, as csrc/cpu/vec_io.h says.
#pragma once

#include "cpu/vec_io.h"

namespace fastact::cpu {
namespace CPU_CAPABILITY {
namespace {

// ---------------------------------------------------------------------------------------------
// Vector math. Each function states its domain; outside it the result is unspecified (finite or
// NaN), which its callers account for.
//
// The primitives below are written with Vectorized<> for every ISA; where AVX512 has a much
// cheaper form (mask registers instead of vector masks, vscalefps for 2^n) an AVX512 overload
// replaces the generic one. Those, the bfloat16 loads and stores of vec_io.h and a few AVX512 forms in
// the kernel files, each next to its portable form, are the only raw intrinsics of the kernels.

template <typename A>
using Vec = Vectorized<A>;

// Lanes where x < 0 take a, the others b.
template <typename A>
Vec<A> if_negative(const Vec<A>& x, const Vec<A>& a, const Vec<A>& b) {
  return Vec<A>::blendv(b, a, x < Vec<A>(A(0)));
}
// y, with the NaN lanes of x copied from x.
template <typename A>
Vec<A> keep_nan(const Vec<A>& x, const Vec<A>& y) {
  return Vec<A>::blendv(y, x, x != x);
}
// y, with the lanes where `ok` is not finite set to NaN.
template <typename A>
Vec<A> nan_unless_finite(const Vec<A>& ok, const Vec<A>& y) {
  // ok - ok is 0 exactly where ok is finite (inf - inf and NaN - NaN are NaN).
  return Vec<A>::blendv(Vec<A>(std::numeric_limits<A>::quiet_NaN()), y, (ok - ok) == Vec<A>(A(0)));
}

// exp(x) for x <= 0 (-inf included); NaN in: unspecified. float: ATen's exp_u20, an inline
// degree-5 polynomial (a few ulp; far inside float tolerances and several times cheaper than the
// Sleef call behind exp()), or on AVX512 the cheaper form below. double: Sleef, 1 ulp.
#if !defined(CPU_CAPABILITY_AVX512)
inline Vec<float> exp_nonpos(const Vec<float>& x) { return x.exp_u20(); }
#endif
inline Vec<double> exp_nonpos(const Vec<double>& x) { return x.exp(); }

#if defined(CPU_CAPABILITY_AVX512)
template <>
inline Vec<float> if_negative(const Vec<float>& x, const Vec<float>& a, const Vec<float>& b) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), b, a);
}
template <>
inline Vec<double> if_negative(const Vec<double>& x, const Vec<double>& a, const Vec<double>& b) {
  return _mm512_mask_blend_pd(_mm512_cmp_pd_mask(x, _mm512_setzero_pd(), _CMP_LT_OQ), b, a);
}
template <>
inline Vec<float> keep_nan(const Vec<float>& x, const Vec<float>& y) {
  return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}
template <>
inline Vec<double> keep_nan(const Vec<double>& x, const Vec<double>& y) {
  return _mm512_mask_mov_pd(y, _mm512_cmp_pd_mask(x, x, _CMP_UNORD_Q), x);
}
// exp(x) = 2^n exp(r), n = round(x / ln 2), r = x - n ln 2 in [-ln2/2, ln2/2] (ln 2 split in a
// high part exact in float and a low part, Cody-Waite), exp(r) by its degree-6 Taylor polynomial
// (truncation error below 2e-7 relative), 2^n applied by vscalefps, which also rounds
// denormal results. Lanes below -104 (exp(-104) is below the smallest denormal; -inf, which pads the
// row tails; NaN) give 0 by a zeroing mask, their arithmetic done on 0: vscalefps underflowing to 0
// takes a microcode assist on Intel cores (none on Zen 4), and with -inf in every padded tail that cost
// each row of a length not a multiple of 16 floats ~100 ns (Xeon VM, rows of 66-84: 157-188 ns a row
// against 44-57 at 64, 65 and 80).
inline Vec<float> exp_nonpos(const Vec<float>& xv) {
  const __mmask16 live = _mm512_cmp_ps_mask(xv, _mm512_set1_ps(-104.f), _CMP_GE_OQ);
  const __m512 x = _mm512_maskz_mov_ps(live, xv);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);  // ln 2, high 10 bits
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);       // ln 2 - 0.693359375
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.f / 720), r, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_maskz_scalef_ps(live, p, n);
}
#endif

// exp for any input, with exp's own results at +inf/overflow and NaN (log_softmax backward takes
// exp of user data). Lanes <= 0 (log_softmax's own outputs) by exp_nonpos, which on AVX512 is the cheaper form above;
// other lanes by ATen's exp_u20, saturated to +inf above ln(FLT_MAX), NaN kept. A lane's result does not depend on
// its neighbours (the thread-count invariance of the strided kernels rests on that): where every lane is <= 0 the
// vector skips exp_u20, else both forms run and each lane takes its own. Why AVX512's form (a 2-core Zen 4 VM, two
// threads): the 16-bit log_softmax backward, an exp an element, bf16 [262144, 128] 8.3-12.0
// -> 6.4-6.5 ms (torch 10.8-14.1).
C10_ALWAYS_INLINE Vec<float> exp_any(const Vec<float>& x) {
  using V = Vec<float>;
#if defined(CPU_CAPABILITY_AVX512)
  const __mmask16 nonpos = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LE_OQ);  // false for NaN
  const V e = exp_nonpos(x);
  if (nonpos == 0xFFFF) return e;
#endif
  V r = x.exp_u20();  // saturates at FLT_MAX above ln(FLT_MAX)
  r = V::blendv(r, V(std::numeric_limits<float>::infinity()), x > V(88.72283935546875f));  // ln(FLT_MAX)
  r = keep_nan(x, r);
#if defined(CPU_CAPABILITY_AVX512)
  r = _mm512_mask_mov_ps(r, nonpos, e);
#endif
  return r;
}
inline Vec<double> exp_any(const Vec<double>& x) { return x.exp(); }

// Horizontal sum and max (the max propagates NaN, as at::vec::maximum does lane-wise).
template <typename A>
A hsum(const Vec<A>& v) {
  return at::vec::vec_reduce_all<A>([](const Vec<A>& a, const Vec<A>& b) { return a + b; }, v);
}
template <typename A>
A hmax(const Vec<A>& v) {
  return at::vec::vec_reduce_all<A>([](const Vec<A>& a, const Vec<A>& b) { return at::vec::maximum(a, b); }, v);
}
// The scalar max that propagates NaN.
template <typename A>
A max_nan(A a, A b) {
  return (a != a || a > b) ? a : b;
}

}  // namespace

}  // namespace CPU_CAPABILITY
}  // namespace fastact::cpu
