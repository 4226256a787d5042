// The CPU kernels of every fastact op: softmax / log_softmax forward and backward (last dim and
// strided), GELU (erf, tanh), bias + GELU, sigmoid.
//
// Compiled once per instruction set (setup.py: -DCPU_CAPABILITY=DEFAULT|AVX2|AVX512 plus the -m
// flags of each), ATen's scheme: at::vec::Vectorized<float> takes its width from those macros and
// everything here sits in `namespace CPU_CAPABILITY`, so the three builds never share a symbol.
// ODR note: only lean headers below (Vectorized, c10 scalar types, fastact/math.h). Inline code
// outside the ISA namespace that a wide-vector build instantiated could be chosen by the linker for
// the whole library and run on a CPU without those instructions; threads therefore come through
// the type-erased csrc/cpu/parallel.h, and no namespace-scope object here needs a constructor to
// run at load time (the table is constant-initialised).
//
// Precision: half and bfloat16 load into float and compute in float; float in float; double in
// double. Vector code implements the formulas of include/fastact/math.h (same constants,
// GeluConstants); scalar tails call the math.h functors themselves.

// gcc 12 reports (maybe-)uninitialized false positives inside its own avx512fintrin.h, whose
// intrinsics start from a self-initialised "undefined" register, wherever they are inlined (tens of
// thousands of lines through ATen's Vectorized<>); nothing here is uninitialised.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "cpu/kernels.h"
#include "cpu/parallel.h"

#include <fastact/math.h>

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <type_traits>

#define FASTACT_STRINGIFY_(x) #x
#define FASTACT_STRINGIFY(x) FASTACT_STRINGIFY_(x)

namespace fastact::cpu {
namespace CPU_CAPABILITY {
namespace {

using at::vec::Vectorized;

// Work (in elements) below which a kernel runs on the calling thread. Waking a TBB worker and
// joining it costs a few microseconds; 32K elements of the cheapest op here (sigmoid backward,
// about 0.1 ns an element on one core, cache-resident) is about that, and of the costlier ones
// (softmax, GELU) several times more. The same value as ATen's at::internal::GRAIN_SIZE, so a
// tensor that torch runs single-threaded runs single-threaded here too.
constexpr int64_t kGrain = 32768;
// GELU tanh, its backward and the GELU erf kernels cost 3-5x a sigmoid an element: they pay for
// threads from a smaller size.
constexpr int64_t kGrainHeavy = kGrain / 4;

// Long sums (softmax rows and columns, the bias gradient) are cascaded: partial sums over blocks
// of this many terms per lane, added into a total. A plain running sum of n floats drifts by up to
// n ulp (a 1e-4 relative error at 2e5 terms, what torch shows); blocks keep it at about
// (kSumBlock / lanes + n / kSumBlock) ulp for the cost of one vector add per block.
constexpr int64_t kSumBlock = 4096;  // elements of a row (a multiple of every vector pair width)
constexpr int64_t kSumRows = 256;    // rows (strided softmax, bias gradient)

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---------------------------------------------------------------------------------------------
// Loads and stores: every element type is read into and written from vectors of its acc_t.
// kV elements per vector; load2/store2 move 2 * kV elements (one 512-bit half/bfloat16 register
// on AVX512), the unit of work of every loop below.

template <typename T>
struct Io {  // float and double: the acc type is the element type
  using A = T;
  using V = Vectorized<A>;
  static constexpr int64_t kV = V::size();
  static V load(const T* p) { return V::loadu(p); }
  static void store(T* p, const V& v) { v.store(p); }
  static void load2(const T* p, V& a, V& b) {
    a = V::loadu(p);
    b = V::loadu(p + kV);
  }
  static void store2(T* p, const V& a, const V& b) {
    a.store(p);
    b.store(p + kV);
  }
  // load2 / store2 in the pair's lane order (Io<c10::BFloat16> on AVX2 says what that is); for float and double the
  // same as load2 / store2.
  static void load2_lanes(const T* p, V& a, V& b) { load2(p, a, b); }
  static void store2_lanes(T* p, const V& a, const V& b) { store2(p, a, b); }
};

template <typename T>
struct IoReduced {  // half and bfloat16, through float
  using A = float;
  using V = Vectorized<float>;
  static constexpr int64_t kV = V::size();
  static V load(const T* p) {
    V v;
    at::vec::load_to_float(p, v);
    return v;
  }
  static void store(T* p, const V& v) { at::vec::convert_from_float<T>(v, v).store(p, kV); }
  static void load2(const T* p, V& a, V& b) { at::vec::load_to_float(p, a, b); }
  static void store2(T* p, const V& a, const V& b) { at::vec::convert_from_float<T>(a, b).store(p); }
  // Element order but on AVX2's bfloat16: Io<T>'s own load2 / store2, so that a specialisation's (AVX512's native
  // bfloat16 store) serves these too.
  static void load2_lanes(const T* p, V& a, V& b) { Io<T>::load2(p, a, b); }
  static void store2_lanes(T* p, const V& a, const V& b) { Io<T>::store2(p, a, b); }
};
template <>
struct Io<c10::Half> : IoReduced<c10::Half> {};

#if defined(CPU_CAPABILITY_AVX512)
// float -> bfloat16 in one instruction (vcvtne2ps2bf16, round to nearest even) instead of the ~9 of
// ATen's emulated rounding: 20-35% off a bfloat16 GELU or sigmoid. AVX512-BF16 is not
// part of torch's AVX512 capability, so it is detected at run time (kernel_table() sets the flag
// once, before any kernel runs) and written as inline asm, so that this file needs no
// -mavx512bf16. The test costs one predictable branch per 32 elements. Unlike the emulation, the
// instruction flushes bfloat16 denormals (< 1.2e-38) to zero.
bool g_avx512_bf16 = false;

inline __m512i cvt_bf16_native(const __m512& lo, const __m512& hi) {  // [lo, hi] -> 32 x bfloat16
  __m512i r;
  asm("vcvtne2ps2bf16 %[lo], %[hi], %[r]" : [r] "=v"(r) : [hi] "v"(hi), [lo] "v"(lo));
  return r;
}
inline __m256i cvt_bf16_native(const __m512& v) {  // 16 x bfloat16
  __m256i r;
  asm("vcvtneps2bf16 %[v], %[r]" : [r] "=v"(r) : [v] "v"(v));
  return r;
}

template <>
struct Io<c10::BFloat16> : IoReduced<c10::BFloat16> {
  using Base = IoReduced<c10::BFloat16>;
  static void store(c10::BFloat16* p, const V& v) {
    if (g_avx512_bf16) _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), cvt_bf16_native(v));
    else Base::store(p, v);
  }
  C10_ALWAYS_INLINE static void store2(c10::BFloat16* p, const V& a, const V& b) {
    if (g_avx512_bf16) _mm512_storeu_si512(p, cvt_bf16_native(a, b));
    else Base::store2(p, a, b);
  }
};
#elif defined(CPU_CAPABILITY_AVX2)
// bfloat16 -> float is a 16-bit shift, which unpacking with zero words does in one instruction for 8 elements, but
// within each 128-bit half: a pair of float vectors then holds elements 0-3 and 8-11 (a), 4-7 and 12-15 (b), the
// pair's "lane order", where ATen's load_to_float takes an extract, two widening moves and two shifts for elements
// 0-7 (a) and 8-15 (b). Packing the rounded results (packus_epi32, also per 128-bit half) restores element order,
// so a store in lane order also saves ATen's closing permute. The rounding is ATen's (cvtfp32_bf16: to nearest
// even, NaN to 0xffff), so a lane-order store writes the bits store2 writes. Lane order is for loops in which every
// operand of a pair is loaded in it and its results are stored in it (maps from bfloat16 to bfloat16), or in which
// the order does not matter (sums). Measured: bench/NOTES.md, fifty-ninth session.
template <>
struct Io<c10::BFloat16> : IoReduced<c10::BFloat16> {
  C10_ALWAYS_INLINE static void load2_lanes(const c10::BFloat16* p, V& a, V& b) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    a = _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), v));
    b = _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), v));
  }
  // 16 bfloat16 in element order from a pair in lane order.
  C10_ALWAYS_INLINE static __m256i pack_lanes(const V& a, const V& b) {
    return _mm256_packus_epi32(rounded_bits(a), rounded_bits(b));
  }
  C10_ALWAYS_INLINE static void store2_lanes(c10::BFloat16* p, const V& a, const V& b) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), pack_lanes(a, b));
  }

 private:
  // Each float's bfloat16 bits in the low half of its 32 bits: (x + 0x7fff + ((x >> 16) & 1)) >> 16, NaN 0xffff.
  C10_ALWAYS_INLINE static __m256i rounded_bits(const __m256& v) {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
    return _mm256_blendv_epi8(_mm256_set1_epi32(0xffff), r, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_ORD_Q)));
  }
};
#else
template <>
struct Io<c10::BFloat16> : IoReduced<c10::BFloat16> {};
#endif

// One element as the acc type, and back (the scalar tails). c10::Half's own conversions in the AVX512 build go
// through 512-bit instructions on a vector built from the one value (torch/headeronly/cpu/vec/vec_half.h
// half2float_scalar / float2half_scalar); F16C's scalar forms are one instruction each, rounding to nearest even.
// Measured (this 2-core Zen 4 VM, AVX512, 8 MB, three interleaved rounds; bench/NOTES.md, forty-second session):
// float16 rows of 20, turned element by element, softmax forward 3.41 -> 2.66 ms, backward 4.09 -> 2.40; the
// backward's tail of 4 in rows of 100 0.76 -> 0.66 (torch 0.69), of 36 1.40 -> 1.05 (1.09).
template <typename T>
C10_ALWAYS_INLINE typename Io<T>::A to_acc(T v) {
  return typename Io<T>::A(v);
}
template <typename T>
C10_ALWAYS_INLINE T from_acc(typename Io<T>::A v) {
  return T(v);
}
#if defined(__F16C__)
template <>
C10_ALWAYS_INLINE float to_acc(c10::Half v) {
  return _cvtsh_ss(v.x);
}
template <>
C10_ALWAYS_INLINE c10::Half from_acc(float v) {
  return c10::Half(_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), c10::Half::from_bits());
}
#endif

// A row's last n (< 2 kV) elements p[0, n) as two vectors of the acc type, the lanes past n holding
// `fill`; and n elements stored from two vectors. The last-dim row loops take tails of more than kPaddedTailFwd /
// kPaddedTailBwd elements through them, shorter ones element by element: there the forward pays one out-of-line libm
// exp an element, the backward plain arithmetic (log_softmax: one exp). Measured with the moves inlined (this 2-core
// Zen 4 VM, AVX512, 8 MB rows, three interleaved rounds; bench/NOTES.md, fortieth session): a padded tail of one
// element lost against the element in every op (f32 rows of 33: softmax forward 1.18 against 1.00 ms, backward 0.51
// against 0.38); tails of four won in the forwards (rows of 36: 1.09 against 1.32 ms; log_softmax 1.20 against
// 1.56) and were mixed in the backwards (softmax f32 0.53 against 0.39; log_softmax f32 0.72 against 0.79, bf16 2.38
// against 2.03). Tails of 2-3 (forward) and 5 and more (backward) follow from those two points, unmeasured.
constexpr int64_t kPaddedTailFwd = 1;
constexpr int64_t kPaddedTailBwd = 4;
// v with its lanes from n on replaced by `fill` (0 <= n <= kV). ATen's Vectorized::set does the same through a
// switch over n that gcc did not inline; a call from the row loops spills every live vector register around it
// (the System V ABI has no callee-saved vector registers), which cost rows of 33-95 floats 35-40 ns each
// (bench/NOTES.md, fortieth session). This and the tails below are always inlined for that reason.
template <typename A>
C10_ALWAYS_INLINE Vectorized<A> fill_from(const Vectorized<A>& v, int64_t n, A fill) {
  using V = Vectorized<A>;
  return V::blendv(V(fill), v, V::arange(A(0), A(1)) < V(A(n)));
}
#if defined(CPU_CAPABILITY_AVX512)
template <>
C10_ALWAYS_INLINE Vectorized<float> fill_from(const Vectorized<float>& v, int64_t n, float fill) {
  return _mm512_mask_blend_ps(static_cast<__mmask16>((uint32_t{1} << n) - 1), _mm512_set1_ps(fill), v);
}
template <>
C10_ALWAYS_INLINE Vectorized<double> fill_from(const Vectorized<double>& v, int64_t n, double fill) {
  return _mm512_mask_blend_pd(static_cast<__mmask8>((uint32_t{1} << n) - 1), _mm512_set1_pd(fill), v);
}
#endif
template <typename T>
C10_ALWAYS_INLINE void load2_tail(const T* p, int64_t n, typename Io<T>::A fill, typename Io<T>::V& a,
                                  typename Io<T>::V& b) {
  using A = typename Io<T>::A;
  using V = typename Io<T>::V;
  constexpr int64_t kV = Io<T>::kV;
  // Partial vector loads (AVX512: masked moves; elsewhere at::vec copies through a buffer), the lanes past n
  // replaced by `fill`.
  const int64_t na = std::min(n, kV);
  if constexpr (std::is_same_v<T, A>) {
    a = fill_from(V::loadu(p, na), na, fill);
    b = n > kV ? fill_from(V::loadu(p + kV, n - kV), n - kV, fill) : V(fill);
  } else {
    const auto [lo, hi] = at::vec::convert_to_float<T>(Vectorized<T>::loadu(p, n));
    a = fill_from(lo, na, fill);
    b = n > kV ? fill_from(hi, n - kV, fill) : V(fill);
  }
}
template <typename T>
C10_ALWAYS_INLINE void store2_tail(T* p, int64_t n, const typename Io<T>::V& a, const typename Io<T>::V& b) {
  using A = typename Io<T>::A;
  constexpr int64_t kV = Io<T>::kV;
  if constexpr (std::is_same_v<T, A>) {
    a.store(p, std::min(n, kV));
    if (n > kV) b.store(p + kV, n - kV);
  } else {
    at::vec::convert_from_float<T>(a, b).store(p, n);
  }
}

// ---------------------------------------------------------------------------------------------
// Non-temporal ("streaming") stores for outputs much larger than the caches. A normal store first
// reads the line it writes into the cache (read-for-ownership), so writing dx of a backward moves
// four lines per three the op needs (read dy, y; write dx), and a forward three per two. A
// streaming store skips that read. Used only for outputs of kStreamBytes or more, whose lines
// would have left the 32 MB-class L3 before anyone read them again anyway (a smaller output is
// kept in the cache for the next op). The destination must be aligned to the vector register;
// stream_fence() orders the streamed lines before the chunk ends (they are weakly ordered, and a
// task's completion only releases ordinary stores).
constexpr int64_t kStreamBytes = int64_t{16} << 20;
constexpr std::uintptr_t kStreamAlign = 64;  // every ISA's register width divides it

template <typename VT>
inline void stream_vec(void* p, const VT& v) {
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (std::is_same_v<VT, Vectorized<float>>) _mm512_stream_ps(static_cast<float*>(p), v);
  else if constexpr (std::is_same_v<VT, Vectorized<double>>) _mm512_stream_pd(static_cast<double*>(p), v);
  else _mm512_stream_si512(static_cast<__m512i*>(p), v);  // 32 half or bfloat16 values
#elif defined(CPU_CAPABILITY_AVX2)
  if constexpr (std::is_same_v<VT, Vectorized<float>>) _mm256_stream_ps(static_cast<float*>(p), v);
  else if constexpr (std::is_same_v<VT, Vectorized<double>>) _mm256_stream_pd(static_cast<double*>(p), v);
  else _mm256_stream_si256(static_cast<__m256i*>(p), v);  // 16 half or bfloat16 values
#else
  v.store(p);  // no streaming form in the portable build
#endif
}

inline void stream_fence() {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  _mm_sfence();
#endif
}

inline bool stream_aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % kStreamAlign == 0; }

// IO::store2 as streaming stores; p aligned to kStreamAlign.
template <typename T>
inline void stream2(T* p, const typename Io<T>::V& a, const typename Io<T>::V& b) {
  using IO = Io<T>;
  if constexpr (std::is_same_v<typename IO::A, T>) {  // float, double: two registers
    stream_vec(p, a);
    stream_vec(p + IO::kV, b);
  } else {
#if defined(CPU_CAPABILITY_AVX512)
    if constexpr (std::is_same_v<T, c10::BFloat16>) {
      if (g_avx512_bf16) {
        _mm512_stream_si512(reinterpret_cast<__m512i*>(p), cvt_bf16_native(a, b));
        return;
      }
    }
#endif
    stream_vec(p, at::vec::convert_from_float<T>(a, b));  // one register of 2 * kV values
  }
}

// stream2 of a pair in lane order (Io::load2_lanes).
template <typename T>
inline void stream2_lanes(T* p, const typename Io<T>::V& a, const typename Io<T>::V& b) {
#if defined(CPU_CAPABILITY_AVX2)
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), Io<T>::pack_lanes(a, b));
    return;
  }
#endif
  stream2(p, a, b);
}

// A pair's load, store and streaming store in lane order where kLanes (the loop's operands and results all of one
// element type), else in element order.
template <bool kLanes, typename T>
C10_ALWAYS_INLINE void load2_in(const T* p, typename Io<T>::V& a, typename Io<T>::V& b) {
  if constexpr (kLanes) Io<T>::load2_lanes(p, a, b);
  else Io<T>::load2(p, a, b);
}
template <bool kLanes, typename T>
C10_ALWAYS_INLINE void store2_in(T* p, const typename Io<T>::V& a, const typename Io<T>::V& b) {
  if constexpr (kLanes) Io<T>::store2_lanes(p, a, b);
  else Io<T>::store2(p, a, b);
}
template <bool kLanes, typename T>
C10_ALWAYS_INLINE void stream2_in(T* p, const typename Io<T>::V& a, const typename Io<T>::V& b) {
  if constexpr (kLanes) stream2_lanes(p, a, b);
  else stream2(p, a, b);
}

// Streaming stores for an output written in pieces that do not start on kStreamAlign: short rows, whose starts
// move through the alignment from row to row. The pieces go to a buffer in L1 laid out as the output is modulo
// kStreamAlign, and every kStreamAlign unit of the output that they complete is streamed from there; the units
// at the ends of the range [begin, ...) a task writes, which the neighbouring tasks share, are copied plainly.
// Usage, over the consecutive pieces of one task: `p = stager.at(e, n)`, write elements [e, e + n) of the output
// at p (plain stores), `stager.written(e + n)`; at the end `stager.finish()`, then stream_fence(). A piece is at
// most kMaxPiece elements. Why: rows of dx that hold a vector pair but start off the alignment streamed only
// their aligned pairs, or none (bench/NOTES.md, forty-eighth session).
template <typename Out>
class StreamStager {
 public:
  static constexpr int64_t kBytes = 4096;
  static constexpr int64_t kUnit = int64_t(kStreamAlign / sizeof(Out));
  static constexpr int64_t kElems = kBytes / int64_t(sizeof(Out));
  static constexpr int64_t kMaxPiece = kElems - 2 * kUnit;

  StreamStager(Out* dst, int64_t begin)
      : dst_(dst),
        begin_(begin),
        lo_(begin - int64_t(reinterpret_cast<std::uintptr_t>(dst + begin) % kStreamAlign / sizeof(Out))),
        streamed_(lo_),
        end_(begin) {}
  StreamStager(const StreamStager&) = delete;
  StreamStager& operator=(const StreamStager&) = delete;

  // Where to write elements [e, e + n) of the output, e at the end of what is written so far, n <= kMaxPiece.
  Out* at(int64_t e, int64_t n) {
    if (e + n - lo_ > kElems) {  // move the unit not yet streamed (less than kUnit elements) to the front
      std::memcpy(buf_, buf_ + (streamed_ - lo_), size_t(end_ - streamed_) * sizeof(Out));
      lo_ = streamed_;
    }
    return buf_ + (e - lo_);
  }
  // Elements up to `end` are written: stream the whole units among them.
  void written(int64_t end) {
    end_ = end;
    int64_t u = streamed_;
    if (u < begin_ && u + kUnit <= end) {  // the first unit begins in the previous task's range
      copy(begin_, u + kUnit);
      u += kUnit;
    }
    for (; u + kUnit <= end; u += kUnit) stream_unit(dst_ + u, buf_ + (u - lo_));
    streamed_ = u;
  }
  // The last unit, which the next task's range may share.
  void finish() { copy(std::max(streamed_, begin_), end_); }

 private:
  void copy(int64_t a, int64_t b) {
    if (b > a) std::memcpy(dst_ + a, buf_ + (a - lo_), size_t(b - a) * sizeof(Out));
  }
  static void stream_unit(Out* dst, const Out* src) {
    using VO = Vectorized<Out>;
    static_assert(kStreamAlign % sizeof(VO) == 0);
#pragma GCC unroll 4
    for (std::size_t k = 0; k < kStreamAlign / sizeof(VO); ++k) {
      stream_vec(dst + k * VO::size(), VO::loadu(src + k * VO::size()));
    }
  }

  alignas(kStreamAlign) Out buf_[kElems];
  Out* const dst_;
  const int64_t begin_;
  int64_t lo_;        // the output's element at buf_[0]; dst_ + lo_ is aligned to kStreamAlign
  int64_t streamed_;  // elements before it are in the output (or belong to the previous task); a unit boundary
  int64_t end_;       // elements before it are written
};

// Calls row(r, p) for rows [r0, r1) of a dense [*, D] output `out`, p where row r's D elements are to be written:
// through a StreamStager where `staged` (its units streamed, then fenced), else in place.
template <typename Out, typename F>
C10_ALWAYS_INLINE void for_each_output_row(Out* out, int64_t D, int64_t r0, int64_t r1, bool staged, const F& row) {
  std::optional<StreamStager<Out>> stager;
  if (staged) stager.emplace(out, r0 * D);
  for (int64_t r = r0; r < r1; ++r) {
    row(r, staged ? stager->at(r * D, D) : out + r * D);
    if (staged) stager->written((r + 1) * D);
  }
  if (staged) {
    stager->finish();
    stream_fence();
  }
}

// ---------------------------------------------------------------------------------------------
// Vector math. Each function states its domain; outside it the result is unspecified (finite or
// NaN), which its callers account for.
//
// The primitives below are written with Vectorized<> for every ISA; where AVX512 has a much
// cheaper form (mask registers instead of vector masks, vscalefps for 2^n) an AVX512 overload
// replaces the generic one. Those, and the bfloat16 store above, are the only raw intrinsics in the
// file.

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
// against 44-57 at 64, 65 and 80; bench/NOTES.md, forty-sixth session).
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
// vector skips exp_u20, else both forms run and each lane takes its own. Why AVX512's form (Zen 4 VM, two threads,
// bench/NOTES.md fifty-first session): the 16-bit log_softmax backward, an exp an element, bf16 [262144, 128] 8.3-12.0
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
// Elementwise ops: a vector form and a scalar form (the math.h functor) of the same function.

// kNarrow: results rounded to 16 bits (kNarrowOut<T>; the tanh form's reciprocal_for).
template <bool kTanh, bool kNarrow = false>
struct GeluOp {
  template <typename A>
  Vectorized<A> operator()(const Vectorized<A>& x) const {
    if constexpr (kTanh) return gelu_tanh<kNarrow>(x);
    else return gelu_erf(x);
  }
  template <typename A>
  A operator()(A x) const {
    if constexpr (kTanh) return math::GeluTanh{}.forward(x);
    else return math::GeluErf{}.forward(x);
  }
};

template <bool kTanh, bool kNarrow = false>
struct GeluBackwardOp {  // (dy, x) -> dy * gelu'(x); kNarrow as GeluOp's
  template <typename A>
  Vectorized<A> operator()(const Vectorized<A>& dy, const Vectorized<A>& x) const {
    if constexpr (kTanh) return dy * gelu_tanh_derivative<kNarrow>(x);
    else return dy * gelu_erf_derivative(x);
  }
  template <typename A>
  A operator()(A dy, A x) const {
    if constexpr (kTanh) return dy * math::GeluTanh{}.derivative(x);
    else return dy * math::GeluErf{}.derivative(x);
  }
};

template <bool kNarrow>  // as GeluOp's
struct SigmoidOp {
  template <typename A>
  Vectorized<A> operator()(const Vectorized<A>& x) const {
    return sigmoid<kNarrow>(x);
  }
  template <typename A>
  A operator()(A x) const {
    return math::Sigmoid{}.forward(x);
  }
};

struct SigmoidBackwardOp {  // (dy, y) -> dy * y * (1 - y)
  template <typename A>
  Vectorized<A> operator()(const Vectorized<A>& dy, const Vectorized<A>& y) const {
    return dy * (y * (Vectorized<A>(A(1)) - y));
  }
  template <typename A>
  A operator()(A dy, A y) const {
    return dy * math::Sigmoid{}.derivative_from_output(y);
  }
};

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

template <typename T>
void gelu_fwd(const T* x, T* y, const ElementRows& g, bool tanh_approx) {
  if (tanh_approx) unary_kernel(x, y, g, kGrainHeavy, GeluOp<true, kNarrowOut<T>>{});
  else unary_kernel(x, y, g, kGrainHeavy, GeluOp<false>{});
}

template <typename T>
void gelu_bwd(const T* dy, const T* x, T* dx, const ElementRows& g, bool tanh_approx) {
  if (tanh_approx) binary_kernel(dy, x, dx, g, kGrainHeavy, GeluBackwardOp<true, kNarrowOut<T>>{});
  else binary_kernel(dy, x, dx, g, kGrainHeavy, GeluBackwardOp<false>{});
}

template <typename T>
void sigmoid_fwd(const T* x, T* y, const ElementRows& g) {
  unary_kernel(x, y, g, kGrain, SigmoidOp<kNarrowOut<T>>{});
}

template <typename T>
void sigmoid_bwd(const T* dy, const T* y, T* dx, const ElementRows& g) {
  binary_kernel(dy, y, dx, g, kGrain, SigmoidBackwardOp{});
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

template <typename T>
void bias_gelu_fwd(const T* x, int64_t x_stride, const T* bias, T* y, int64_t rows, int64_t cols, bool tanh_approx) {
  if (tanh_approx) bias_gelu_fwd_impl<T, true>(x, x_stride, bias, y, rows, cols);
  else bias_gelu_fwd_impl<T, false>(x, x_stride, bias, y, rows, cols);
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

template <typename T>
void bias_gelu_bwd(const T* dy, const T* x, int64_t x_stride, const T* bias, T* dx, T* dbias, int64_t rows,
                   int64_t cols, bool tanh_approx) {
  if (tanh_approx) bias_gelu_bwd_impl<T, true>(dy, x, x_stride, bias, dx, dbias, rows, cols);
  else bias_gelu_bwd_impl<T, false>(dy, x, x_stride, bias, dx, dbias, rows, cols);
}

// ---------------------------------------------------------------------------------------------
// Softmax and log_softmax. Per row (or column, when inner > 1): m = max, s = sum(exp(x - m)),
// c = epilogue.row_constant(s), then y = epilogue.forward(x, m, c) (math::SoftmaxEpilogue,
// math::LogSoftmaxEpilogue). Softmax keeps exp(x - m) from the sum pass (in y when y is of the acc
// type, else in a per-chunk float scratch row) and scales it; log_softmax recomputes x - m - c.
// Rows whose max is not finite (a NaN, a +inf, or all -inf) are NaN throughout, as in torch; every
// other row has x - m in [-inf, 0], exp_nonpos's domain.

template <bool kLog>
using Epilogue = std::conditional_t<kLog, math::LogSoftmaxEpilogue, math::SoftmaxEpilogue>;

// Rows shorter than a vector pair (D < 2 kV; which of them: softmax_rows_turned): kV rows at a time, turned through a
// buffer [D][kV] so that a lane holds a row. The max, the exps, the sum and the outputs are then lane-wise vector ops
// over D (a row of 10 floats costs a tenth of a vector exp, not 10 scalar exps and two horizontal reductions).
// Why (this 2-core AVX2 VM, 8 MB f32, ms, torch in brackets): rows of 10 21.1 (6.0) with scalar tails,
// 9.7 (4.7) with a padded vector pair a row; bench/NOTES.md thirtieth session has the figures after.

// The blocks of kV rows of those kernels: f(r0, nr) for rows [r0, r0 + nr), split over threads.
template <typename F>
void for_row_blocks(int64_t rows, int64_t D, int64_t kV, const F& f) {
  parallel_for(ceil_div(rows, kV), std::max<int64_t>(1, kGrain / (D * kV)), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) f(b * kV, std::min(kV, rows - b * kV));
  });
}
// nr rows of D elements, row l at p + l * stride, turned into buf[d * kV + l]; the lanes past nr zeros
// (computed and dropped). And back: buf's first nr lanes to nr dense rows at p.
template <typename A, typename T>
void turn_rows_in(const T* p, int64_t stride, int64_t nr, int64_t D, int64_t kV, A* buf) {
  for (int64_t l = 0; l < kV; ++l)
    for (int64_t d = 0; d < D; ++d) buf[d * kV + l] = l < nr ? A(to_acc(p[l * stride + d])) : A(0);
}
template <typename A, typename T>
void turn_rows_out(const A* buf, int64_t nr, int64_t D, int64_t kV, T* p) {
  for (int64_t l = 0; l < nr; ++l)
    for (int64_t d = 0; d < D; ++d) p[l * D + d] = from_acc<T>(buf[d * kV + l]);
}

// The forward of those rows.
template <typename In, typename Out, bool kLog>
void softmax_short_rows_fwd(const In* x, Out* y, const SoftmaxShape& shape) {
  using IO = Io<In>;
  using A = typename IO::A;
  using V = typename IO::V;
  constexpr int64_t kV = IO::kV;
  const int64_t D = shape.dim_size;
  for_row_blocks(shape.outer, D, kV, [&](int64_t r0, int64_t nr) {
    alignas(64) A buf[2 * kV * kV];  // [d][lane]
    turn_rows_in(x + r0 * shape.row_stride, shape.row_stride, nr, D, kV, buf);
    V m(-std::numeric_limits<A>::infinity());
    for (int64_t d = 0; d < D; ++d) m = at::vec::maximum(m, V::loadu(buf + d * kV));
    V s(A(0));
    for (int64_t d = 0; d < D; ++d) {
      const V e = exp_nonpos(V::loadu(buf + d * kV) - m);  // lanes with a non-finite max: masked below
      s = s + e;
      if constexpr (!kLog) e.store(buf + d * kV);
    }
    const V c = nan_unless_finite(m, kLog ? s.log() : V(A(1)) / s);  // torch's NaN rows
    for (int64_t d = 0; d < D; ++d) {
      const V v = V::loadu(buf + d * kV);
      (kLog ? (v - m) - c : v * c).store(buf + d * kV);
    }
    turn_rows_out(buf, nr, D, kV, y + r0 * D);
  });
}

// A row's max (NaN where it holds a NaN): vector pairs, then the tail as two padded vectors (the padding -inf) or
// element by element. Pass 1 of softmax_lastdim_fwd and log_softmax_blocked_fwd.
template <typename In>
typename Io<In>::A row_max(const In* xr, int64_t D) {
  using IO = Io<In>;
  using A = typename IO::A;
  using V = typename IO::V;
  constexpr int64_t kStep = 2 * IO::kV;
  int64_t i = 0;
  V vm0(-std::numeric_limits<A>::infinity()), vm1 = vm0;
  for (; i + kStep <= D; i += kStep) {
    V a, b;
    IO::load2_lanes(xr + i, a, b);  // a maximum: any order
    vm0 = at::vec::maximum(vm0, a);
    vm1 = at::vec::maximum(vm1, b);
  }
  if (D - i > kPaddedTailFwd) {
    V a, b;
    load2_tail(xr + i, D - i, -std::numeric_limits<A>::infinity(), a, b);
    vm0 = at::vec::maximum(vm0, a);
    vm1 = at::vec::maximum(vm1, b);
    i = D;
  }
  A m = hmax(at::vec::maximum(vm0, vm1));
  for (; i < D; ++i) m = max_nan(m, to_acc(xr[i]));
  return m;
}

// log_softmax's output row: y = x - m - c, vector pairs, then the tail as two padded vectors or element by element.
// The last pass of softmax_lastdim_fwd<kLog> and log_softmax_blocked_fwd.
template <typename In, typename Out>
void log_softmax_row_out(const In* xr, Out* yr, int64_t D, typename Io<In>::A m, typename Io<In>::A c) {
  using IO = Io<In>;
  using A = typename IO::A;
  using V = typename IO::V;
  constexpr int64_t kStep = 2 * IO::kV;
  constexpr bool kLanes = std::is_same_v<In, Out>;  // lane order (Io::load2_lanes) where x and y are of one type
  const V vmax(m), vc(c);
  int64_t i = 0;
  for (; i + kStep <= D; i += kStep) {
    V a, b;
    load2_in<kLanes>(xr + i, a, b);
    store2_in<kLanes>(yr + i, (a - vmax) - vc, (b - vmax) - vc);
  }
  if (D - i > kPaddedTailFwd) {
    V a, b;
    load2_tail(xr + i, D - i, A(0), a, b);
    store2_tail(yr + i, D - i, (a - vmax) - vc, (b - vmax) - vc);
    i = D;
  }
  for (; i < D; ++i) yr[i] = from_acc<Out>(math::LogSoftmaxEpilogue{}.forward(to_acc(xr[i]), m, c));
}

// Softmax over dim_size for inner == 1: rows of D elements, x row r at x + r * row_stride,
// y dense.
template <typename In, typename Out, bool kLog>
void softmax_lastdim_fwd(const In* x, Out* y, const SoftmaxShape& shape) {
  using IO = Io<In>;
  using OO = Io<Out>;
  using A = typename IO::A;
  using V = typename IO::V;
  static_assert(std::is_same_v<A, typename OO::A>);
  constexpr int64_t kV = IO::kV, kStep = 2 * kV;
  constexpr bool kExpInY = std::is_same_v<Out, A>;  // exp(x - m) parked in y itself
  constexpr bool kScratch = !kLog && !kExpInY;
  // Pass 2 loads x's pairs in lane order (Io::load2_lanes) where x and y are of one type, and pass 3 stores y's in
  // it: the exps between them keep that order (in y itself only for float and double, where it is element order).
  constexpr bool kLanes = std::is_same_v<In, Out>;
  const Epilogue<kLog> epi;
  const int64_t D = shape.dim_size;

  parallel_for(shape.outer, std::max<int64_t>(1, kGrain / D), [&](int64_t r0, int64_t r1) {
    std::unique_ptr<A[]> scratch(kScratch ? new A[D] : nullptr);
    for (int64_t r = r0; r < r1; ++r) {
      const In* xr = x + r * shape.row_stride;
      Out* yr = y + r * D;

      // Pass 1: the max.
      const A m = row_max(xr, D);
      if (!std::isfinite(m)) {
        std::fill(yr, yr + D, Out(std::numeric_limits<A>::quiet_NaN()));
        continue;
      }

      // Pass 2: s = sum(exp(x - m)), softmax keeping the exps.
      A* e = nullptr;
      if constexpr (!kLog) e = kExpInY ? reinterpret_cast<A*>(yr) : scratch.get();
      const V vmax(m);
      const int64_t vec_end = D - D % kStep;
      int64_t i = 0;
      V total(A(0));
      for (int64_t blk = 0; blk < vec_end; blk += kSumBlock) {
        const int64_t blk_end = std::min(blk + kSumBlock, vec_end);
        V s0(A(0)), s1(A(0));
        for (i = blk; i < blk_end; i += kStep) {
          V a, b;
          load2_in<kLanes>(xr + i, a, b);
          a = exp_nonpos(a - vmax);
          b = exp_nonpos(b - vmax);
          s0 = s0 + a;
          s1 = s1 + b;
          if constexpr (!kLog) {
            a.store(e + i);
            b.store(e + i + kV);
          }
        }
        total = total + (s0 + s1);
      }
      const int64_t tail = D - vec_end;
      A s;
      if (tail > kPaddedTailFwd) {  // the padding's exps are 0
        V a, b;
        load2_tail(xr + vec_end, tail, -std::numeric_limits<A>::infinity(), a, b);
        a = exp_nonpos(a - vmax);
        b = tail > kV ? exp_nonpos(b - vmax) : V(A(0));
        s = hsum(total + (a + b));
        if constexpr (!kLog) store2_tail(e + vec_end, tail, a, b);
      } else {
        s = hsum(total);
        for (i = vec_end; i < D; ++i) {
          const A t = math::exp_(to_acc(xr[i]) - m);
          s += t;
          if constexpr (!kLog) e[i] = t;
        }
      }
      const A c = epi.row_constant(s);

      // Pass 3: y.
      if constexpr (kLog) {
        log_softmax_row_out(xr, yr, D, m, c);
      } else {
        const V vc(c);
        for (i = 0; i < vec_end; i += kStep)  // e's pairs in the order pass 2 loaded x in
          store2_in<kLanes>(yr + i, V::loadu(e + i) * vc, V::loadu(e + i + kV) * vc);
        if (D - i > kPaddedTailFwd) {  // the tail as two padded vectors, as the body
          V a, b;
          load2_tail(e + i, D - i, A(0), a, b);
          store2_tail(yr + i, D - i, a * vc, b * vc);
          i = D;
        }
        for (; i < D; ++i) yr[i] = from_acc<Out>(e[i] * c);  // the tail: softmax from its kept exps, as the body
      }
    }
  });
}

// log_softmax over rows of kLogBlockedMinDim..kLogBlockedMaxDim floats (AVX512, inner == 1): rows in blocks, each
// pass one loop over the block's rows, as torch's log_softmax does. One row at a time, a short row is a chain of
// dependent steps (horizontal max, exp, horizontal sum, logf, output) longer than the row's own work, and the
// out-of-order window holds little more than one row's instructions, so the rows hardly overlap; within a pass the
// block's rows are independent. log(sum) is taken kV rows at a time, vectorised; a row with a non-finite max gets a
// NaN max, so its outputs x - m - c are NaN (torch's NaN rows) without a branch. Why (this 2-core Zen 4 VM, 8 MB f32,
// two threads, ms, three interleaved rounds, row loop or turned -> blocked, torch; bench/NOTES.md forty-fourth
// session): rows of 24 1.21 -> 1.02 (1.19), 31 1.13 -> 0.81 (0.94), 32 0.99 -> 0.69 (0.84), 48 0.84 -> 0.59 (0.75),
// 64 0.70 -> 0.52 (0.71), 128 0.51 -> 0.43 (0.67); 256 level (not taken). One thread: at 256 and 1000 blocks lost
// (0.87 -> 0.96, 0.76 -> 0.96: long rows overlap by themselves); under 24 level with the turned path; blocks of
// 128 rows 5-10% slower than ~8 KB.
constexpr int64_t kLogBlockedMinDim = 24;
constexpr int64_t kLogBlockedMaxDim = 128;
constexpr int64_t kLogBlockMaxRows = 128;
template <typename In>
bool log_softmax_rows_blocked(int64_t D) {
#if defined(CPU_CAPABILITY_AVX512)
  return std::is_same_v<In, float> && D >= kLogBlockedMinDim && D <= kLogBlockedMaxDim;
#else
  (void)D;
  return false;
#endif
}

template <typename In, typename Out>
void log_softmax_blocked_fwd(const In* x, Out* y, const SoftmaxShape& shape) {
  using IO = Io<In>;
  using A = typename IO::A;
  using V = typename IO::V;
  constexpr int64_t kV = IO::kV, kStep = 2 * kV;
  static_assert(kV <= 16);
  const int64_t D = shape.dim_size;
  const int64_t vec_end = D - D % kStep;
  // About 8 KB of f32 rows a block (rows of 32: 64 rows; 64: 32), read again from L1 by passes 2 and 3.
  const int64_t block = std::clamp<int64_t>(2048 / D, kV, kLogBlockMaxRows);
  constexpr A kNegInf = -std::numeric_limits<A>::infinity();

  parallel_for(shape.outer, std::max<int64_t>(1, kGrain / D), [&](int64_t r0, int64_t r1) {
    alignas(64) A mb[kLogBlockMaxRows + 16];  // the rows' max (NaN where not finite)
    alignas(64) A cb[kLogBlockMaxRows + 16];  // the rows' sum, then log(sum)
    for (int64_t rb = r0; rb < r1; rb += block) {
      const int64_t nb = std::min(block, r1 - rb);
      for (int64_t j = 0; j < nb; ++j) mb[j] = row_max(x + (rb + j) * shape.row_stride, D);  // pass 1: the max
      for (int64_t j = 0; j < nb; ++j) {  // pass 2: the sum (rows with a non-finite max: any value, masked below)
        const In* xr = x + (rb + j) * shape.row_stride;
        const V vmax(mb[j]);
        V s0(A(0)), s1(A(0));
        int64_t i = 0;
        for (; i < vec_end; i += kStep) {  // rows of at most kLogBlockedMaxDim: one cascade block
          V a, b;
          IO::load2_lanes(xr + i, a, b);  // a sum: any order
          s0 = s0 + exp_nonpos(a - vmax);
          s1 = s1 + exp_nonpos(b - vmax);
        }
        const int64_t tail = D - vec_end;
        A s;
        if (tail > kPaddedTailFwd) {  // the padding's exps are 0
          V a, b;
          load2_tail(xr + vec_end, tail, kNegInf, a, b);
          a = exp_nonpos(a - vmax);
          b = tail > kV ? exp_nonpos(b - vmax) : V(A(0));
          s = hsum((s0 + s1) + (a + b));
        } else {
          s = hsum(s0 + s1);
          for (i = vec_end; i < D; ++i) s += math::exp_(to_acc(xr[i]) - mb[j]);
        }
        cb[j] = s;
      }
      for (int64_t j = nb; j < ceil_div(nb, kV) * kV; ++j) mb[j] = cb[j] = A(1);
      for (int64_t j = 0; j < nb; j += kV) {  // log(sum), kV rows at a time
        const V m = V::loadu(mb + j);
        nan_unless_finite(m, V::loadu(cb + j).log()).store(cb + j);
        nan_unless_finite(m, m).store(mb + j);
      }
      for (int64_t j = 0; j < nb; ++j) {  // pass 3: y = x - m - c
        log_softmax_row_out(x + (rb + j) * shape.row_stride, y + (rb + j) * D, D, mb[j], cb[j]);
      }
    }
  });
}

// Vector lanes of one column block, for the strided kernels: NV vectors of kV adjacent columns.
template <typename IO, int NV>
struct Lanes {
  using V = typename IO::V;
  V v[NV];
  template <typename T>
  void load(const T* p) {
    for (int k = 0; k < NV; ++k) v[k] = Io<T>::load(p + k * IO::kV);
  }
  template <typename T>
  void store(T* p) const {
    if constexpr (NV == 2) Io<T>::store2(p, v[0], v[1]);
    else
      for (int k = 0; k < NV; ++k) Io<T>::store(p + k * IO::kV, v[k]);
  }
};

// The strided kernels walk a slab's rows in runs of adjacent columns, a chunk of columns a task, per-column
// state (max, sums) in buffers (the columns past the last vector pair in padded lanes), rather than a vector
// pair of columns at a time: a task that reads one 64-byte line a row, rows a page or more apart, leaves every line
// to a demand miss that no prefetcher follows. Results do not depend on the width: each column's arithmetic is the
// same, in the same order. The width (strided_run_width), first that which applies:
//  - whole slabs, where a slab's rows fit the buffers (inner <= kStridedMaxRun) and there is a slab for every
//    thread: a task then reads one contiguous block, once a pass, which the prefetchers stream;
//  - chunks whose rows of the two tensors a pass reads fit kStridedChunkBytes, so that the later passes read them
//    from L2, where that leaves runs of kStridedMinRunBytes or more;
//  - else, backward only, runs as wide as the buffers: the later passes read from L3 or memory, but each row in a
//    run long enough for the prefetchers. The forward keeps its vector pairs there: with two threads streaming
//    runs through one L3 at once its three passes lost to them (dim 0 of f32 [512, 32768] log 12.5 -> 15.3 ms,
//    of f16 [1000, 2097] 0.47 -> 0.92 ms; single-threaded level);
// then narrowed, not below two vector pairs, until every thread has a task; runs past L2 narrowed under
// kStridedMinStreamRunBytes go back to vector pairs (dim 0 of bf16 [8192, 512], two threads: runs of 256 columns, half
// of each row, ran the log backward 1.2-1.5 -> 2.5-2.6 ms; runs of 4 KB gained, dim 0 of f32 [1024, 2048] 1.6 -> 1.0,
// and of 2 KB were level, f16 [1000, 2097]). Where the runs apply at some thread count, the vector pairs take the
// columns past the last pair in the runs' lanes, so that every column's arithmetic is the same either way. Only at
// D >= kStridedMinRows and inner >= kStridedMinRunColumns; elsewhere a vector pair a task (D = 4: consecutive tasks
// already read consecutive lines; inner 33: runs padded to 64 columns did twice the work, [4096, 16, 33] at 0.4-0.6x
// the vector pairs).
// 2-core Zen 4 VM (AVX512, 1 MB L2, 32 MB L3), 64 MB, ms, medians of four or five rounds alternating the builds,
// ranges over three such A/Bs, previous rule (backward: chunks only within 256 KB, f32 rows a page apart, 16-bit rows
// 16 KB apart; forward: vector pairs) -> this one (bench/NOTES.md thirty-eighth session), dim 1 of f32 [8, 1024,
// 2048]: forward log 12.8 -> 8.8, softmax 12.7-14.0 -> 9.1-12.3 (torch.compile 12.5 / 14.7), backward log 15.3-17.7
// -> 8.8-9.5, softmax 17.9-19.2 -> 10.4-11.3 (11.4 / 14.7); bf16 the same shape backward log 13.0 -> 5.5-6.2; dim 0
// of f32 [512, 32768] backward log 21.8-27.2 -> 11.9-13.7.
constexpr int64_t kStridedMaxRun = 4096;
constexpr int64_t kStridedChunkBytes = int64_t{256} << 10;
constexpr int64_t kStridedMinRunBytes = 512;
constexpr int64_t kStridedMinRows = 16;
constexpr int64_t kStridedMinRunColumns = 128;
constexpr int64_t kStridedMinStreamRunBytes = 2048;

// Whether the strided runs apply to a slab of D rows of inner columns at all (at some thread count).
inline bool strided_runs_apply(int64_t D, int64_t inner) {
  return D >= kStridedMinRows && inner >= kStridedMinRunColumns;
}

// Columns a task of the strided kernels (above), always whole vector pairs; a vector pair (kBlock) where the runs do
// not apply. `streaming`: whether runs past L2 may be taken (the backward's).
template <typename In>
int64_t strided_run_width(int64_t outer, int64_t D, int64_t inner, int64_t threads, bool streaming) {
  constexpr int64_t kBlock = 2 * Io<In>::kV, kSize = sizeof(In);
  static_assert(kStridedMaxRun % kBlock == 0 && kStridedMinRunColumns >= 2 * kBlock, "runs of whole vector pairs");
  const int64_t padded = ceil_div(inner, kBlock) * kBlock;
  if (outer < 1 || !strided_runs_apply(D, inner)) return kBlock;
  if (padded <= kStridedMaxRun && outer >= threads) return padded;
  const int64_t fit = std::min(kStridedChunkBytes / (2 * D * kSize) / kBlock * kBlock, kStridedMaxRun);
  const bool fits_l2 = fit * kSize >= kStridedMinRunBytes;
  if (!fits_l2 && !streaming) return kBlock;
  int64_t width = std::min(fits_l2 ? fit : kStridedMaxRun, padded);
  if (outer < threads) width = std::min(width, ceil_div(ceil_div(inner, ceil_div(threads, outer)), kBlock) * kBlock);
  if (!fits_l2 && width * kSize < kStridedMinStreamRunBytes) return kBlock;
  return std::max(width, 2 * kBlock);
}

// The columns' state of a task's runs (max, sums, partial sums: three arrays of `columns`, a multiple of the vector
// pair), on the heap, once per range of tasks: a thread's stack (a user's, or a worker's) need not hold 96 KB
// frames. 64-byte aligned.
template <typename A>
class RunState {
 public:
  explicit RunState(int64_t columns) : columns_(columns), mem_(new A[3 * columns + kPad]) {}
  A* array(int k) const {
    const auto p = reinterpret_cast<std::uintptr_t>(mem_.get());
    return reinterpret_cast<A*>((p + 63) & ~std::uintptr_t{63}) + k * columns_;
  }

 private:
  static constexpr int64_t kPad = 64 / sizeof(A);
  int64_t columns_;
  std::unique_ptr<A[]> mem_;
};

// Softmax over D for inner > 1, in place along the strides: the lanes of a vector are NV * kV
// adjacent columns (the contiguous inner dim), each with its own running max and sum over D.
// x, y point at the block's first column of one [D, inner] slab.
template <typename In, typename Out, bool kLog, int NV>
void softmax_cols_fwd(const In* x, Out* y, int64_t D, int64_t inner, typename Io<In>::A* scratch) {
  using IO = Io<In>;
  using A = typename IO::A;
  using V = typename IO::V;
  using L = Lanes<IO, NV>;
  constexpr int64_t kW = NV * IO::kV;
  constexpr bool kExpInY = std::is_same_v<Out, A>;

  L m;
  for (auto& v : m.v) v = V(-std::numeric_limits<A>::infinity());
  for (int64_t d = 0; d < D; ++d) {
    L a;
    a.load(x + d * inner);
    for (int k = 0; k < NV; ++k) m.v[k] = at::vec::maximum(m.v[k], a.v[k]);
  }
  L s;
  for (auto& v : s.v) v = V(A(0));
  for (int64_t d0 = 0; d0 < D; d0 += kSumRows) {
    L part;
    for (auto& v : part.v) v = V(A(0));
    for (int64_t d = d0; d < std::min(D, d0 + kSumRows); ++d) {
      L a;
      a.load(x + d * inner);
      for (int k = 0; k < NV; ++k) {
        a.v[k] = exp_nonpos(a.v[k] - m.v[k]);  // lanes with a non-finite max: garbage, masked below
        part.v[k] = part.v[k] + a.v[k];
      }
      if constexpr (!kLog) {
        if constexpr (kExpInY) a.store(y + d * inner);
        else a.store(scratch + d * kW);
      }
    }
    for (int k = 0; k < NV; ++k) s.v[k] = s.v[k] + part.v[k];
  }
  L c;  // the row constant; NaN in lanes whose max is not finite (torch's NaN rows)
  for (int k = 0; k < NV; ++k) {
    c.v[k] = nan_unless_finite(m.v[k], kLog ? s.v[k].log() : V(A(1)) / s.v[k]);
  }
  for (int64_t d = 0; d < D; ++d) {
    L a;
    if constexpr (kLog) {
      a.load(x + d * inner);
      for (int k = 0; k < NV; ++k) a.v[k] = (a.v[k] - m.v[k]) - c.v[k];
    } else {
      if constexpr (kExpInY) a.load(y + d * inner);
      else a.load(scratch + d * kW);
      for (int k = 0; k < NV; ++k) a.v[k] = a.v[k] * c.v[k];
    }
    a.store(y + d * inner);
  }
}

// `width` columns from each of the D rows of x and y (rows `inner` apart), the runs of strided_run_width: the
// columns' max, then their sums of exps (softmax over float outputs keeps the exps in y, as softmax_cols_fwd does),
// then y; each column's arithmetic exactly that of softmax_cols_fwd. `whole`: the columns are all of the row, so that
// the vector pair at row d's last columns runs on into row d + 1 and is loaded whole (its lanes past the row are
// garbage that no column reads), and stored whole where the pass writes y only and in order of d (the lanes past
// the row are written again with row d + 1), but for the last row and the final scaling of the kept exps, which
// reads row d + 1's exps back.
template <typename In, typename Out, bool kLog>
void softmax_cols_fwd_wide(const In* x, Out* y, int64_t D, int64_t inner, int64_t width, bool whole,
                           const RunState<typename Io<In>::A>& state) {
  using IO = Io<In>;
  using OO = Io<Out>;
  using A = typename IO::A;
  using V = typename IO::V;
  constexpr int64_t kV = IO::kV, kStep = 2 * kV;
  constexpr bool kExpInY = !kLog && std::is_same_v<Out, A>;
  const int64_t full = width / kStep * kStep, tail = width - full;
  const int64_t padded = full + (tail > 0 ? kStep : 0);
  const auto runs_on = [&](int64_t d) { return whole && d + 1 < D; };
  const auto load_x = [&](int64_t d, int64_t c, V& a, V& b) {
    if (c < full || runs_on(d)) IO::load2(x + d * inner + c, a, b);
    else load2_tail(x + d * inner + c, tail, -std::numeric_limits<A>::infinity(), a, b);
  };
  const auto store_y = [&](int64_t d, int64_t c, const V& a, const V& b, bool run_on) {
    if (c < full || run_on) OO::store2(y + d * inner + c, a, b);
    else store2_tail(y + d * inner + c, tail, a, b);
  };
  A* const mx = state.array(0);
  A* const sum = state.array(1);
  A* const part = state.array(2);
  std::fill(mx, mx + padded, -std::numeric_limits<A>::infinity());
  for (int64_t d = 0; d < D; ++d) {
    for (int64_t c = 0; c < padded; c += kStep) {
      V a, b;
      load_x(d, c, a, b);
      at::vec::maximum(V::loadu(mx + c), a).store(mx + c);
      at::vec::maximum(V::loadu(mx + c + kV), b).store(mx + c + kV);
    }
  }
  std::fill(sum, sum + padded, A(0));
  for (int64_t d0 = 0; d0 < D; d0 += kSumRows) {
    std::fill(part, part + padded, A(0));
    for (int64_t d = d0; d < std::min(D, d0 + kSumRows); ++d) {
      for (int64_t c = 0; c < padded; c += kStep) {
        V a, b;
        load_x(d, c, a, b);
        a = exp_nonpos(a - V::loadu(mx + c));  // lanes with a non-finite max: garbage, masked below
        b = exp_nonpos(b - V::loadu(mx + c + kV));
        (V::loadu(part + c) + a).store(part + c);
        (V::loadu(part + c + kV) + b).store(part + c + kV);
        if constexpr (kExpInY) store_y(d, c, a, b, runs_on(d));
      }
    }
    for (int64_t c = 0; c < padded; c += kV) (V::loadu(sum + c) + V::loadu(part + c)).store(sum + c);
  }
  for (int64_t c = 0; c < padded; c += kV) {  // the row constant; NaN where the max is not finite (torch's NaN rows)
    const V s = V::loadu(sum + c);
    nan_unless_finite(V::loadu(mx + c), kLog ? s.log() : V(A(1)) / s).store(sum + c);
  }
  for (int64_t d = 0; d < D; ++d) {
    for (int64_t c = 0; c < padded; c += kStep) {
      V a, b;
      const V m0 = V::loadu(mx + c), m1 = V::loadu(mx + c + kV), c0 = V::loadu(sum + c), c1 = V::loadu(sum + c + kV);
      if constexpr (kExpInY) {
        if (c < full || runs_on(d)) OO::load2(y + d * inner + c, a, b);
        else load2_tail(y + d * inner + c, tail, A(0), a, b);
        store_y(d, c, a * c0, b * c1, false);
      } else {
        load_x(d, c, a, b);
        if constexpr (kLog) store_y(d, c, (a - m0) - c0, (b - m1) - c1, runs_on(d));
        else store_y(d, c, exp_nonpos(a - m0) * c0, exp_nonpos(b - m1) * c1, runs_on(d));
      }
    }
  }
}

// Columns [c0, c1) of one slab: blocks of two vectors, then one vector (c1 - c0 a multiple of kV: the columns past a
// slab's last vector go in lanes across slabs, softmax_turned_cols_fwd below); or, with `state` (where the runs apply
// at some thread count: strided_runs_apply), the columns past the last pair in the runs' lanes.
template <typename In, typename Out, bool kLog>
void softmax_strided_block_fwd(const In* x, Out* y, int64_t D, int64_t inner, int64_t c0, int64_t c1,
                               typename Io<In>::A* scratch, const RunState<typename Io<In>::A>* state) {
  constexpr int64_t kV = Io<In>::kV;
  int64_t c = c0;
  for (; c + 2 * kV <= c1; c += 2 * kV) softmax_cols_fwd<In, Out, kLog, 2>(x + c, y + c, D, inner, scratch);
  if (state != nullptr) {
    if (c < c1) softmax_cols_fwd_wide<In, Out, kLog>(x + c, y + c, D, inner, c1 - c, /*whole=*/false, *state);
    return;
  }
  for (; c < c1; c += kV) softmax_cols_fwd<In, Out, kLog, 1>(x + c, y + c, D, inner, scratch);
}

// The strided kernels' columns past a slab's last vector (r = inner % kV of them; every column when inner < kV),
// where the runs do not apply: rather than a column at a time in scalar code (D scalar exps), kV of those columns of
// consecutive slabs, in order of (slab, column), are turned through buffers [d][kV] so that a lane holds a column, as
// softmax_short_rows_fwd turns rows: the forward's max, exps, sum and outputs, the backward's sum and dx, are then
// lane-wise vector ops over D (sums cascaded every kSumRows rows, as softmax_cols_fwd's and softmax_cols_bwd's). A
// column's arithmetic is the same whichever lane or task it falls in, so the results do not depend on the thread
// count. The elements move through the buffers in their own type and are converted a vector at a time.
// Why (this 2-core Zen 4 VM, AVX512: kV = 16 in float, bfloat16 too; ranges of medians over five rounds alternating
// the builds, ms, scalar columns -> lanes, torch in brackets; bench/NOTES.md thirty-ninth session): dim 1 of f32
// [37449, 8, 7] softmax 9.4-14.1 -> 1.5-1.8 (4.6-6.8), log_softmax 7.0-11.5 -> 1.8-2.1 (4.5-5.3); of bf16 softmax
// 10.4-11.0 -> 1.4-2.5 (5.4-8.7); of f32 [8192, 16, 20] (a vector and four columns a slab) softmax 2.6-2.7 -> 1.0-1.1
// (2.0-2.1). The copies then a segment at a time down the rows (turn_cols_in): f32 [37449, 8, 7] softmax 1.5-2.0 ->
// 1.0-1.3 (4.6-6.3). The backward (its scalar columns had no exps but log_softmax's, one an element), the same
// session, dim 1 of f32 [37449, 8, 7] softmax 1.3-2.5 -> 0.9-1.6 (1.8-3.1), log_softmax 3.4-4.5 -> 1.0-1.7
// (3.3-5.8); of f32 [2, 131072, 7] softmax 2.2-3.4 -> 1.1-1.5 (1.5-2.2), log_softmax 3.4-5.7 -> 1.5-2.8 (2.9-5.2); of
// bf16 [4096, 64, 7] log_softmax 4.0-5.8 -> 0.9-1.2 (3.7-6.4); of f32 [4096, 8, 33] (one column a slab in lanes)
// softmax 0.17-0.22 -> 0.22-0.25 (0.33-0.48), the one shape a little behind the scalar columns.

// Where the strided kernels take a slab's last inner % kV columns in lanes across slabs (the runs do not apply at
// any thread count, and inner is no multiple of kV): the columns a lane group takes, kV, or fewer where kV would leave
// a thread without a group (few columns, long ones: dim 1 of [2, 131072, 7]); else 0. A column's arithmetic is the
// same in any lane of any group. The forward's and the backward's, and explain's.
// Float backwards of slabs wider than a vector (inner > kV) keep their last columns in their own tasks instead, in
// the runs' padded lanes (softmax_cols_bwd_wide): in lanes across slabs each such column re-read its rows' last lines
// after the slabs' vector tasks had moved them out of L2, and one leftover column doubled the time of the vector
// columns (dim 1 of [N, 1000, inner], 8 MB, us: inner 48 652-852, 49 1107-1572, torch 1043-1963). Measured (three
// interleaved rounds, ms, lanes across slabs -> padded lanes (torch); bench/NOTES.md, fortieth session): f32 softmax
// backward inner 49 1.27 -> 0.95 (1.20), 33 1.39 -> 1.14 (1.26), 20 1.34 -> 0.93 (1.12); log_softmax 49 1.48 -> 0.88
// (1.24), 33 1.23 -> 1.30 (1.33). The forwards lost (f32 softmax inner 33 0.76 -> 1.23, bf16 1.13 -> 2.78 against
// torch's 2.43) and so did the bf16 log_softmax backward (33: 1.58 -> 2.69), so only float backwards leave.
template <typename In>
int64_t turned_group_width(int64_t outer, int64_t D, int64_t inner, int64_t threads, bool backward) {
  constexpr int64_t kV = Io<In>::kV;
  if (strided_runs_apply(D, inner) || inner % kV == 0) return 0;
  if (backward && std::is_same_v<In, float> && inner > kV) return 0;
  return std::clamp<int64_t>(ceil_div(outer * (inner % kV), threads), 1, kV);
}

// A group's columns of one slab, adjacent in every row: the elements at x + at + d * inner, `len` of them, go to
// lanes [lane, lane + len).
struct TurnedSegment {
  int64_t at, lane, len;
};

// The tasks of the strided kernels where turned_group_width (w) applies, x dense [outer, D, inner]: blocks of kV
// slabs, each block's slabs' vector columns slab by slab (a vector pair a task), then its lane groups, w of the
// block's leftover columns (r = inner % kV a slab) each.
template <typename In>
class TurnedTasks {
 public:
  static constexpr int64_t kV = Io<In>::kV, kBlock = 2 * kV;
  TurnedTasks(const SoftmaxShape& shape, int64_t w)
      : outer_(shape.outer), D_(shape.dim_size), inner_(shape.inner), r_(inner_ % kV), body_(inner_ - r_),
        pairs_(ceil_div(body_, kBlock)), w_(w), per_block_(kV * pairs_ + ceil_div(kV * r_, w)) {}
  int64_t count() const {
    const int64_t blocks = ceil_div(outer_, kV), last = outer_ - (blocks - 1) * kV;
    return (blocks - 1) * per_block_ + last * pairs_ + ceil_div(last * r_, w_);
  }
  // Task t: pair(offset, c0, c1), the columns [c0, c1) (a vector pair, or the body's last vector) of the slab at
  // offset; or group(segs, nsegs, n), n columns in the lanes as segs lay them out.
  template <typename Pair, typename Group>
  void run(int64_t t, const Pair& pair, const Group& group) const {
    const int64_t b = t / per_block_, u = t % per_block_, slabs = std::min(kV, outer_ - b * kV);
    if (u < slabs * pairs_) {
      const int64_t c0 = u % pairs_ * kBlock;
      pair((b * kV + u / pairs_) * D_ * inner_, c0, std::min(body_, c0 + kBlock));
      return;
    }
    // A lane group: the block's leftover columns j in [j0, j0 + n) (of all slabs', j = o r + (c - body)).
    const int64_t j0 = b * kV * r_ + (u - slabs * pairs_) * w_, n = std::min(w_, (b * kV + slabs) * r_ - j0);
    TurnedSegment segs[kV];
    int64_t nsegs = 0;
    for (int64_t l = 0, o = j0 / r_, k = j0 % r_; l < n; k = 0, ++o) {  // slab o, from its column body + k
      const int64_t len = std::min(r_ - k, n - l);
      segs[nsegs++] = {o * D_ * inner_ + body_ + k, l, len};
      l += len;
    }
    group(segs, nsegs, n);
  }

 private:
  int64_t outer_, D_, inner_, r_, body_, pairs_, w_, per_block_;
};

// Rows [d0, d1) of a group's columns of x into t [d - d0][kV], the lanes past n zero (computed and dropped); and
// back, t's `rows` rows to rows [d0, d0 + rows) of y. A segment at a time down the rows, a vector move each (AVX512:
// at::vec's partial loadu / store are masked moves; elsewhere they would be a memcpy each, so element by element):
// every copy loop then walks one constant stride (inner in x, kV in t), which the hardware prefetchers follow.
// Row by row across the segments, a load's address jumped from slab to slab, and from DRAM the copies cost more than
// the scalar columns did (dim 1 of f32 [4096, 64, 7], softmax backward at one thread, ms: 4.2-4.7 against 2.6-2.9
// a segment at a time, the scalar columns 2.8, torch 2.7; from cache, [256, 64, 7]: 0.11-0.12 against 0.092, the
// scalar columns 0.18). Earlier, for the forward: a long column's elements lane by lane went to another line every
// other store (dim 1 of f32 [2, 131072, 7] 5.4-7.8 against row by row's 3.3-5.8), and element by element at a lane's
// offset each gcc made the stores an AVX512 vscatterqps (dim 1 of f32 [4096, 64, 7] 2.6-3.4 against 1.2-1.5).
template <typename T, int64_t kV>
void turn_cols_in(const T* x, int64_t inner, const TurnedSegment* segs, int64_t nsegs, int64_t n, int64_t d0,
                  int64_t d1, T* t) {
#if defined(CPU_CAPABILITY_AVX512)
  using R = Vectorized<T>;
  static_assert(R::size() >= kV);
  (void)n;  // the first segment (lane 0) is stored over all kV lanes, zeros past it; the others over their lanes
  for (int64_t k = 0; k < nsegs; ++k) {
    const T* p = x + segs[k].at;
    const int64_t lane = segs[k].lane, len = segs[k].len;
    for (int64_t d = d0; d < d1; ++d) R::loadu(p + d * inner, len).store(t + (d - d0) * kV + lane, k == 0 ? kV : len);
  }
#else
  for (int64_t d = d0; d < d1; ++d) std::fill(t + (d - d0) * kV + n, t + (d - d0 + 1) * kV, T(0));
  for (int64_t k = 0; k < nsegs; ++k) {
    const T* p = x + segs[k].at;
    for (int64_t d = d0; d < d1; ++d) {
      for (int64_t i = 0; i < segs[k].len; ++i) t[(d - d0) * kV + segs[k].lane + i] = p[d * inner + i];
    }
  }
#endif
}
template <typename T, int64_t kV>
void turn_cols_out(const T* t, int64_t inner, const TurnedSegment* segs, int64_t nsegs, int64_t d0, int64_t rows,
                   T* y) {
  for (int64_t k = 0; k < nsegs; ++k) {
    T* p = y + segs[k].at + d0 * inner;
    const int64_t lane = segs[k].lane, len = segs[k].len;
    for (int64_t d = 0; d < rows; ++d) {
#if defined(CPU_CAPABILITY_AVX512)
      Vectorized<T>::loadu(t + d * kV + lane, len).store(p + d * inner, len);
#else
      for (int64_t i = 0; i < len; ++i) p[d * inner + i] = t[d * kV + lane + i];
#endif
    }
  }
}

// The buffers [rows][kV] of one range of tasks (rows = min(D, kSumRows)): kInputs inputs' columns turned (of In: x;
// dy and y), the exps and outputs (of A), the outputs of Out where Out is not A. Where the types agree the buffers are
// one (the first input's, the acc's, the outputs'): each pass reads row d before it writes row d.
template <typename In, typename Out, int kInputs>
class TurnedColumns {
 public:
  using A = typename Io<In>::A;
  static constexpr int64_t kV = Io<In>::kV;
  explicit TurnedColumns(int64_t D)
      : acc_(new A[rows(D) * kV]), out_(std::is_same_v<Out, A> ? nullptr : new Out[rows(D) * kV]) {
    for (int i = 0; i < kInputs; ++i) {
      if (i > 0 || !std::is_same_v<In, A>) in_[i].reset(new In[rows(D) * kV]);
    }
  }
  static int64_t rows(int64_t D) { return std::min(D, kSumRows); }
  A* acc() const { return acc_.get(); }
  In* in(int i) const {
    if constexpr (std::is_same_v<In, A>) {
      if (i == 0) return acc_.get();
    }
    return in_[i].get();
  }
  Out* out() const {
    if constexpr (std::is_same_v<Out, A>) return acc_.get();
    else return out_.get();
  }

 private:
  std::unique_ptr<A[]> acc_;
  std::unique_ptr<In[]> in_[kInputs];
  std::unique_ptr<Out[]> out_;
};

// A group of up to kV columns in the lanes of one vector, as `segs` (n lanes in all) lay them out. Up to kSumRows
// rows the columns are turned once and softmax keeps its exps in the buffer; longer columns go through it a block of
// kSumRows rows at a time in each pass, softmax recomputing its exps (the same values), so that the buffers stay
// within L1/L2 whatever D (a group of 131072 rows turned whole is 8 MB of float).
template <typename In, typename Out, bool kLog>
void softmax_turned_cols_fwd(const In* x, Out* y, int64_t D, int64_t inner, const TurnedSegment* segs, int64_t nsegs,
                             int64_t n, const TurnedColumns<In, Out, 1>& buf) {
  using IO = Io<In>;
  using OO = Io<Out>;
  using A = typename IO::A;
  using V = typename IO::V;
  static_assert(std::is_same_v<A, typename OO::A>);
  constexpr int64_t kV = IO::kV;
  In* const xt = buf.in(0);  // [d - d0][lane]
  A* const et = buf.acc();
  Out* const yt = buf.out();
  const bool once = D <= kSumRows;
  const auto turn_in = [&](int64_t d0, int64_t d1) { turn_cols_in<In, kV>(x, inner, segs, nsegs, n, d0, d1, xt); };
  if (once) turn_in(0, D);
  V m(-std::numeric_limits<A>::infinity());
  for (int64_t d0 = 0; d0 < D; d0 += kSumRows) {
    const int64_t rows = std::min(D - d0, kSumRows);
    if (!once) turn_in(d0, d0 + rows);
    for (int64_t d = 0; d < rows; ++d) m = at::vec::maximum(m, IO::load(xt + d * kV));
  }
  V s(A(0));
  for (int64_t d0 = 0; d0 < D; d0 += kSumRows) {
    const int64_t rows = std::min(D - d0, kSumRows);
    if (!once) turn_in(d0, d0 + rows);
    V part(A(0));
    for (int64_t d = 0; d < rows; ++d) {
      const V e = exp_nonpos(IO::load(xt + d * kV) - m);  // lanes with a non-finite max: garbage, masked below
      part = part + e;
      if (!kLog && once) e.store(et + d * kV);
    }
    s = s + part;
  }
  const V c = nan_unless_finite(m, kLog ? s.log() : V(A(1)) / s);  // torch's NaN columns
  for (int64_t d0 = 0; d0 < D; d0 += kSumRows) {
    const int64_t rows = std::min(D - d0, kSumRows);
    if (!once) turn_in(d0, d0 + rows);
    for (int64_t d = 0; d < rows; ++d) {
      if constexpr (kLog) {
        OO::store(yt + d * kV, (IO::load(xt + d * kV) - m) - c);
      } else {
        OO::store(yt + d * kV, (once ? V::loadu(et + d * kV) : exp_nonpos(IO::load(xt + d * kV) - m)) * c);
      }
    }
    turn_cols_out<Out, kV>(yt, inner, segs, nsegs, d0, rows, y);
  }
}

// Task = (outer index, chunk of columns); x and y dense [outer, D, inner]. Each chunk: wide (strided_run_width), all
// of its columns at once; else a vector pair at a time in registers, then one vector, then, where the runs do not
// apply, the columns left (inner % kV a slab) in lanes across slabs (softmax_turned_cols_fwd), the tasks then
// TurnedTasks'.
template <typename In, typename Out, bool kLog>
void softmax_strided_fwd(const In* x, Out* y, const SoftmaxShape& shape) {
  using A = typename Io<In>::A;
  constexpr int64_t kV = Io<In>::kV, kBlock = 2 * kV;
  constexpr bool kScratch = !kLog && !std::is_same_v<Out, A>;
  const int64_t outer = shape.outer, D = shape.dim_size, inner = shape.inner;
  // The runs (wide implies them), or a slab's columns past its last vector in the runs' padded lanes.
  const bool lanes = strided_runs_apply(D, inner) || inner % kV != 0;
  if (const int64_t w = turned_group_width<In>(outer, D, inner, parallel_threads(), /*backward=*/false)) {
    const TurnedTasks<In> tasks(shape, w);
    parallel_for(tasks.count(), std::max<int64_t>(1, kGrain / (D * kV)), [&](int64_t t0, int64_t t1) {
      std::unique_ptr<A[]> scratch(kScratch && inner >= kV ? new A[D * kBlock] : nullptr);
      const TurnedColumns<In, Out, 1> buf(D);
      for (int64_t t = t0; t < t1; ++t) {
        tasks.run(
            t,
            [&](int64_t offset, int64_t c0, int64_t c1) {
              softmax_strided_block_fwd<In, Out, kLog>(x + offset, y + offset, D, inner, c0, c1, scratch.get(),
                                                       nullptr);
            },
            [&](const TurnedSegment* segs, int64_t nsegs, int64_t n) {
              softmax_turned_cols_fwd<In, Out, kLog>(x, y, D, inner, segs, nsegs, n, buf);
            });
      }
    });
    return;
  }
  const int64_t width = strided_run_width<In>(outer, D, inner, parallel_threads(), /*streaming=*/false);
  const bool wide = width > kBlock;
  const int64_t chunks = ceil_div(inner, width);
  parallel_for(outer * chunks, std::max<int64_t>(1, kGrain / (D * std::min(inner, width))),
               [&](int64_t t0, int64_t t1) {
                 std::unique_ptr<A[]> scratch(kScratch && !wide ? new A[D * kBlock] : nullptr);
                 const RunState<A> state(lanes ? width : 0);
                 for (int64_t t = t0; t < t1; ++t) {
                   const int64_t o = t / chunks, c0 = (t % chunks) * width, c1 = std::min(inner, c0 + width);
                   const int64_t offset = o * D * inner;
                   if (wide) {  // a last chunk under a vector pair too: the same arithmetic whatever the width
                     softmax_cols_fwd_wide<In, Out, kLog>(x + offset + c0, y + offset + c0, D, inner, c1 - c0,
                                                          chunks == 1, state);
                   } else {
                     softmax_strided_block_fwd<In, Out, kLog>(x + offset, y + offset, D, inner, c0, c1,
                                                              scratch.get(), lanes ? &state : nullptr);
                   }
                 }
               });
}

// Which rows softmax_short_rows_fwd / softmax_short_rows_bwd turn: those shorter than a vector pair, but in the AVX512
// build (kV = 16 float lanes, 16-bit inputs too) only forward rows under kFwdRowLoopMinDimAvx512 and backward rows
// under kBwdRowLoopMinDimAvx512 (float log_softmax's forward rows of kLogBlockedMinDim and more go to
// log_softmax_blocked_fwd before this rule); the row loop runs the longer ones as two padded vectors (mask blends). The AVX2 build (kV = 8) turns every row under 16: its
// row loop ran them 1.5-3.6x slower forward (rows of 10-15), its 16-bit backward 1.8-2.9x (rows of 9-15).
// Why (this 2-core Zen 4 VM, 8 MB, ms, interleaved rounds, turned -> row loop, torch in brackets; bench/NOTES.md
// forty-third session). Forward: rows of 27 / 31 softmax f32 1.174 -> 1.118 / 1.110 -> 0.975 (1.41 / 1.32), bf16
// 3.560 -> 2.821 / 3.631 -> 2.465, f16 2.671 -> 2.461 / 2.661 -> 2.154; log_softmax bf16 3.632 -> 3.164 / 3.624 ->
// 2.792, f16 2.765 -> 2.783 / 2.720 -> 2.467, f32 1.192 -> 1.226 / 1.134 -> 1.077 (1.10 / 1.05); at 24 turned still
// led (softmax f32 1.182 against 1.226, f16 2.689 against 2.798), and at 18-21 by 10-50%. Backward, 1.4-3.9x from 10
// on: softmax f32 rows of 16 1.087 -> 0.429 (0.389), 24 1.172 -> 0.462 (0.447), 31 1.124 -> 0.387 (0.417);
// log_softmax f32 16 1.365 -> 0.646 (0.620), 31 1.307 -> 0.581 (0.621); bf16 softmax 10 4.468 -> 2.861, 31 3.689 ->
// 1.107; log_softmax bf16 10 4.857 -> 4.601, 31 4.060 -> 1.752. At 3-6 log_softmax's turned backward led (f32 rows of
// 6 1.773 against 2.112: the row loop's element tail pays an exp an element).
constexpr int64_t kFwdRowLoopMinDimAvx512 = 27;
constexpr int64_t kBwdRowLoopMinDimAvx512 = 10;
template <typename In>
bool softmax_rows_turned(int64_t D, bool backward) {
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (Io<In>::kV == 16) return D < (backward ? kBwdRowLoopMinDimAvx512 : kFwdRowLoopMinDimAvx512);
#endif
  (void)backward;
  return D < 2 * Io<In>::kV;
}

template <typename In, typename Out>
void softmax_fwd_any(const In* x, Out* y, const SoftmaxShape& shape, bool log) {
  if (shape.inner == 1 && log && log_softmax_rows_blocked<In>(shape.dim_size)) {
    log_softmax_blocked_fwd<In, Out>(x, y, shape);
  } else if (shape.inner == 1 && softmax_rows_turned<In>(shape.dim_size, /*backward=*/false)) {
    if (log) softmax_short_rows_fwd<In, Out, true>(x, y, shape);
    else softmax_short_rows_fwd<In, Out, false>(x, y, shape);
  } else if (shape.inner == 1) {
    if (log) softmax_lastdim_fwd<In, Out, true>(x, y, shape);
    else softmax_lastdim_fwd<In, Out, false>(x, y, shape);
  } else {
    if (log) softmax_strided_fwd<In, Out, true>(x, y, shape);
    else softmax_strided_fwd<In, Out, false>(x, y, shape);
  }
}

// Backward. softmax: dx = y (dy - sum(dy y)); log_softmax: dx = dy - exp(y) sum(dy)
// (Epilogue::backward_term is what is summed, Epilogue::backward the map).
template <bool kLog>
struct VecBackward {
  template <typename V>
  static V term(const V& dy, const V& y) {
    if constexpr (kLog) return dy;
    else return dy * y;
  }
  template <typename V>
  static V map(const V& dy, const V& y, const V& sum) {
    if constexpr (kLog) return dy - exp_any(y) * sum;
    else return y * (dy - sum);
  }
};

// The backward of rows shorter than a vector pair, turned as softmax_short_rows_fwd turns them.
template <typename In, typename Out, bool kLog>
void softmax_short_rows_bwd(const In* dy, const In* y, Out* dx, const SoftmaxShape& shape) {
  using IO = Io<In>;
  using A = typename IO::A;
  using V = typename IO::V;
  constexpr int64_t kV = IO::kV;
  const int64_t D = shape.dim_size;
  for_row_blocks(shape.outer, D, kV, [&](int64_t r0, int64_t nr) {
    alignas(64) A g[2 * kV * kV], o[2 * kV * kV];  // [d][lane]
    turn_rows_in(dy + r0 * D, D, nr, D, kV, g);
    turn_rows_in(y + r0 * D, D, nr, D, kV, o);
    V s(A(0));
    for (int64_t d = 0; d < D; ++d) s = s + VecBackward<kLog>::term(V::loadu(g + d * kV), V::loadu(o + d * kV));
    for (int64_t d = 0; d < D; ++d) VecBackward<kLog>::map(V::loadu(g + d * kV), V::loadu(o + d * kV), s).store(g + d * kV);
    turn_rows_out(g, nr, D, kV, dx + r0 * D);
  });
}

// The 16-bit log_softmax backward takes exp(y) in its summing pass, which then reads dy and y as softmax's does, into a
// scratch row of acc_t (a task's, from the heap: at most kLogBwdExpFirstMaxDim elements, 4 MB of float); the second
// pass reads dy again and that row from cache: dx = dy - e s. Before, the summing pass read dy alone and the second
// read y too, converted it and took its exp, which left the load-convert-exp chain in the pass that writes.
// Measured (this 2-core VM, two threads, AVX512, separate processes alternating, fastact / torch ratios of the
// medians, before -> after; the VM's absolute times drifted 30% between runs): bf16 [32768, 1024] 1.06 / 1.12 ->
// 1.45 / 1.42; f16 [16384, 2048] 1.07 / 1.06 -> 1.28 / 1.37; bf16 [8192, 4096] 1.13 / 1.18 -> 1.51 / 1.31, f16
// 1.08 / 1.03 -> 1.29 / 1.27; bf16 [1024, 16384] 1.16 / 1.19 -> 1.39 / 1.33; bf16 [512, 65536] 1.17 / 1.22 ->
// 1.31 / 1.34; bf16 [131072, 256] 1.19 / 1.26 -> 1.32 / 1.28; f16 [524288, 64] 1.01 / 1.10 -> 1.11 / 1.08. Float
// rows lost (f32 [4096, 4096] 1.27 / 1.23 -> 1.19 / 1.21, [1024, 16384] 1.24 / 1.33 -> 1.13 / 1.11; [256, 65536]
// level, 1.08-1.33 -> 1.10-1.15): there y needs no conversion, and the scratch row's store and load cost more than
// the exp they move. bench/NOTES.md, forty-fifth session.
constexpr int64_t kLogBwdExpFirstMaxDim = int64_t{1} << 20;
// Vector pairs of a backward row held in registers (softmax_bwd_row_in_registers): 4 (float and 16-bit; 16 vectors of
// dy and y), 2 for double (not measured at 4).
template <typename In>
constexpr int kBwdRegisterPairs = sizeof(In) == 8 ? 2 : 4;
template <bool kLog, typename In>
bool log_softmax_bwd_exp_first(int64_t D) {
  return kLog && sizeof(In) == 2 && D > 2 * kBwdRegisterPairs<In> * Io<In>::kV &&  // past the in-register rows
         D <= kLogBwdExpFirstMaxDim;
}

// A backward row of at most kBwdRegisterPairs vector pairs (float and 16-bit: 4, D <= 8 kV) held in
// registers: dy and y loaded (and converted) once, padded past D (the padding's terms are 0 and its outputs dropped),
// summed, mapped and stored; the row loop below loads every element twice and pays its loop and tail logic a row.
// Why (2-core VMs, AVX512, 8 MB, fastact / torch; bench/NOTES.md forty-fifth and forty-sixth sessions): f32 softmax
// rows of 16 and 24 had fallen to 0.56-0.85 of torch's speed through the row loop (Zen 4); f16 softmax rows of 77-128
// ran at 0.86-1.04 (Xeon), 1.25-1.65 in registers, bf16 0.95-1.44 -> 1.09-1.70, the 16-bit log_softmax 1.04-1.36 ->
// 1.19-1.50 (two runs each, alternating builds).
// Where dx is kStreamBytes or more, the caller passes each row's place in a StreamStager. Rows of 3-4 pairs had
// taken the row loop instead, for its streaming stores (Xeon, 64 MB, two threads, three alternating runs, fastact /
// torch; bench/NOTES.md forty-seventh session): f16 rows of 100 softmax / log_softmax 0.59-0.73 / 0.54-0.61 ->
// 1.07-1.25 / 1.25-1.47 (the row loop's heads and tails of single elements) with the row's aligned pairs streamed,
// bf16 rows of 128 1.05-1.16 / 1.21-1.46 -> 1.23-1.42 / 1.54-1.86; rows of two pairs too: f32 rows of 64 0.90-1.05 /
// 0.70-1.17 -> 1.14-1.31 / 1.19-2.51, bf16 1.09-2.18 / 1.00-1.22 -> 1.17-1.50 / 1.31-1.62. Float rows of 3-4 pairs
// (before, 2 for float) and every row streamed through the stager: bench/NOTES.md, forty-eighth session.
template <bool kLog, typename In, typename Out>
C10_ALWAYS_INLINE void softmax_bwd_row_in_registers(const In* dyr, const In* yr, Out* dxr, int64_t D) {
  using IO = Io<In>;
  using A = typename IO::A;
  using V = typename IO::V;
  constexpr int64_t kStep = 2 * IO::kV;
  constexpr int kPairs = kBwdRegisterPairs<In>;
  // Whole pairs in lane order where dy, y and dx are of one type (each pair is loaded and stored in one order: whole
  // ones in lane order, the padded last one in element order).
  constexpr bool kLanes = std::is_same_v<In, Out>;
  const auto load_pair = [](const In* p, int64_t n, V& a, V& b) {
    if (n == kStep) load2_in<kLanes>(p, a, b);
    else load2_tail(p, n, A(0), a, b);
  };
  V g[2 * kPairs], yv[2 * kPairs];
  V t(A(0));
#pragma GCC unroll 4
  for (int k = 0; k < kPairs; ++k) {
    const int64_t n = std::min(D - k * kStep, kStep);
    if (n <= 0) break;
    load_pair(dyr + k * kStep, n, g[2 * k], g[2 * k + 1]);
    load_pair(yr + k * kStep, n, yv[2 * k], yv[2 * k + 1]);
    t = t + (VecBackward<kLog>::term(g[2 * k], yv[2 * k]) + VecBackward<kLog>::term(g[2 * k + 1], yv[2 * k + 1]));
  }
  const V vs(hsum(t));
#pragma GCC unroll 4
  for (int k = 0; k < kPairs; ++k) {
    const int64_t n = std::min(D - k * kStep, kStep);
    if (n <= 0) break;
    const V d0 = VecBackward<kLog>::map(g[2 * k], yv[2 * k], vs);
    const V d1 = VecBackward<kLog>::map(g[2 * k + 1], yv[2 * k + 1], vs);
    if (n == kStep) store2_in<kLanes>(dxr + k * kStep, d0, d1);
    else store2_tail(dxr + k * kStep, n, d0, d1);
  }
}

// Rows of dx of at most this many bytes that the row loop streams through a StreamStager (not a head of plain stores
// up to the alignment, then vector pairs). Measured (Xeon, 64 MB, two threads, three alternating runs, ms against the
// head; bench/NOTES.md forty-eighth session): f32 log_softmax rows of 197 13.2-15.3 -> 12.4-12.7, f16 rows of 257
// 17.1-19.0 -> 15.0-16.6, f32 softmax rows of 197 8.3-9.7 -> 7.9-8.7, bf16 rows of 197 level; longer rows lost (the
// buffer's copy costs more than their few shared lines save): f32 softmax rows of 577 8.2-9.2 -> 8.8-9.5, f16
// log_softmax rows of 577 16.1-18.1 -> 19.3-20.1, bf16 softmax rows of 1000 11.2 -> 11.9-12.3.
constexpr int64_t kStagedBwdRowBytes = 1024;
static_assert(kStagedBwdRowBytes <= StreamStager<double>::kMaxPiece * int64_t{sizeof(double)});

// The row loop of softmax_lastdim_bwd, one row a call of softmax_bwd_row: the summing pass (softmax_bwd_row_sum),
// then the writing pass (softmax_bwd_write_row), dx = map(dy, z, s) for z = y (BwdMapOutput), or with kExpFirst
// (log_softmax_bwd_exp_first) z = exp(y) from the scratch row e (BwdMapExpRow). The pointers, the sum and the flags
// (kExpFirst, kStream) are parameters, not a closure's references: vector stores may alias anything, so a value read
// through a reference is reloaded after every store, and a lambda that gcc left out of line (the plain stores') held
// the loop's index in memory. Measured (this 2-core Zen 3 VM, AVX2, one thread, 2 MB in cache; bench/NOTES.md,
// fifty-ninth session): with the row in one lambda, bf16 softmax rows of 96-192 ran at 0.67-0.75x torch.
template <bool kLog>
struct BwdMapOutput {  // z = y: softmax dx = y (dy - s), log_softmax dx = dy - exp(y) s
  template <typename V>
  C10_ALWAYS_INLINE V vec(const V& g, const V& z, const V& s) const {
    return VecBackward<kLog>::map(g, z, s);
  }
  template <typename A>
  C10_ALWAYS_INLINE A scalar(A g, A z, A s) const {
    return Epilogue<kLog>{}.backward(g, z, s);
  }
};
struct BwdMapExpRow {  // z = exp(y), from the scratch row: dx = dy - z s
  template <typename V>
  C10_ALWAYS_INLINE V vec(const V& g, const V& z, const V& s) const {
    return g - z * s;
  }
  template <typename A>
  C10_ALWAYS_INLINE A scalar(A g, A z, A s) const {
    return g - z * s;
  }
};

// Sum over the row of term(dy, y) (vector pairs in cascaded blocks of kSumBlock, then the tail: padded where longer
// than kPaddedTailBwd, else element by element); with kExpFirst also e[d] = exp(y[d]).
template <bool kLog, bool kExpFirst, typename In>
C10_ALWAYS_INLINE typename Io<In>::A softmax_bwd_row_sum(const In* dyr, const In* yr, int64_t D,
                                                         typename Io<In>::A* e) {
  using IO = Io<In>;
  using A = typename IO::A;
  using V = typename IO::V;
  constexpr int64_t kStep = 2 * IO::kV;
  const int64_t vec_end = D - D % kStep;
  V total(A(0));
  for (int64_t blk = 0; blk < vec_end; blk += kSumBlock) {
    const int64_t blk_end = std::min(blk + kSumBlock, vec_end);
    V s0(A(0)), s1(A(0));
    for (int64_t i = blk; i < blk_end; i += kStep) {
      V g0, g1, y0, y1;
      // A sum: any order, but with kExpFirst e in element order, for the writing pass.
      load2_in<!kExpFirst>(dyr + i, g0, g1);
      load2_in<!kExpFirst>(yr + i, y0, y1);
      s0 = s0 + VecBackward<kLog>::term(g0, y0);
      s1 = s1 + VecBackward<kLog>::term(g1, y1);
      if constexpr (kExpFirst) {
        exp_any(y0).store(e + i);
        exp_any(y1).store(e + i + IO::kV);
      }
    }
    total = total + (s0 + s1);
  }
  const int64_t tail = D - vec_end;
  if (tail > kPaddedTailBwd) {  // the tail as two padded vectors (the padding's terms are 0)
    V g0, g1, y0, y1;
    load2_tail(dyr + vec_end, tail, A(0), g0, g1);
    load2_tail(yr + vec_end, tail, A(0), y0, y1);
    total = total + (VecBackward<kLog>::term(g0, y0) + VecBackward<kLog>::term(g1, y1));
    if constexpr (kExpFirst) store2_tail(e + vec_end, tail, exp_any(y0), exp_any(y1));
    return hsum(total);
  }
  A s = hsum(total);
  for (int64_t i = vec_end; i < D; ++i) {
    s += Epilogue<kLog>{}.backward_term(to_acc(dyr[i]), to_acc(yr[i]));
    if constexpr (kExpFirst) e[i] = std::exp(to_acc(yr[i]));
  }
  return s;
}

// dx over [i, end) of a row with plain stores: padded vector pairs (at most kStep elements each: 32 16-bit ones on
// AVX512, 16 on AVX2) while more than kPaddedTailBwd remain, then element by element. Returns end. It takes the row's
// tail after the vector pairs and, where dx is streamed directly (rows longer than kStagedBwdRowBytes), its head up
// to the stream alignment. Element by element, a 16-bit head (up to 31 elements, each converted, and log_softmax's an
// exp) had cost rows that start off the alignment up to 30% (Xeon, 64 MB, two threads, three alternating runs;
// bench/NOTES.md forty-seventh session): f16 log_softmax rows of 197 0.71-0.73x torch -> 1.01-1.11x, f16 softmax rows
// of 577 0.90-1.03x -> 0.98-1.05x, f32 log_softmax rows of 197 0.90-0.94x -> 0.94-1.01x (rows of up to
// kStagedBwdRowBytes now go through a StreamStager instead).
template <typename In, typename Z, typename Out, typename Map>
C10_ALWAYS_INLINE int64_t softmax_bwd_write_plain(const In* dyr, const Z* z, Out* dxr, int64_t i, int64_t end,
                                                  const typename Io<In>::V& vs, typename Io<In>::A s,
                                                  const Map& map) {
  using IO = Io<In>;
  using A = typename IO::A;
  using V = typename IO::V;
  constexpr int64_t kStep = 2 * IO::kV;
  while (end - i > kPaddedTailBwd) {
    const int64_t n = std::min(end - i, kStep);
    V g0, g1, z0, z1;
    load2_tail(dyr + i, n, A(0), g0, g1);
    load2_tail(z + i, n, A(0), z0, z1);
    store2_tail(dxr + i, n, map.vec(g0, z0, vs), map.vec(g1, z1, vs));
    i += n;
  }
  for (; i < end; ++i) dxr[i] = from_acc<Out>(map.scalar(to_acc(dyr[i]), to_acc(z[i]), s));
  return i;
}

// The writing pass of a row: its first `head` elements plainly, its vector pairs (kStream: with streaming stores),
// its tail plainly.
template <bool kStream, typename In, typename Z, typename Out, typename Map>
C10_ALWAYS_INLINE void softmax_bwd_write_row(const In* dyr, const Z* z, Out* dxr, int64_t D, int64_t head,
                                             typename Io<In>::A s, const Map& map) {
  using IO = Io<In>;
  using V = typename IO::V;
  constexpr int64_t kStep = 2 * IO::kV;
  const V vs(s);
  int64_t i = softmax_bwd_write_plain(dyr, z, dxr, 0, head, vs, s, map);
  // Lane order where dy, z and dx are of one type; else (the fused casts, z = exp(y) in float) element order.
  constexpr bool kLanes = std::is_same_v<In, Z> && std::is_same_v<In, Out>;
  for (; i + kStep <= D; i += kStep) {
    V g0, g1, z0, z1;
    load2_in<kLanes>(dyr + i, g0, g1);
    load2_in<kLanes>(z + i, z0, z1);
    const V d0 = map.vec(g0, z0, vs), d1 = map.vec(g1, z1, vs);
    if constexpr (kStream) stream2_in<kLanes>(dxr + i, d0, d1);
    else store2_in<kLanes>(dxr + i, d0, d1);
  }
  softmax_bwd_write_plain(dyr, z, dxr, i, D, vs, s, map);
}

template <bool kLog, bool kExpFirst, bool kStream, typename In, typename Out>
void softmax_bwd_row(const In* dyr, const In* yr, Out* dxr, int64_t D, typename Io<In>::A* e) {
  const typename Io<In>::A s = softmax_bwd_row_sum<kLog, kExpFirst>(dyr, yr, D, e);
  const int64_t head =
      kStream ? std::min<int64_t>(D, int64_t((kStreamAlign - reinterpret_cast<std::uintptr_t>(dxr) % kStreamAlign) %
                                             kStreamAlign / sizeof(Out)))
              : 0;
  if constexpr (kExpFirst) softmax_bwd_write_row<kStream>(dyr, e, dxr, D, head, s, BwdMapExpRow{});
  else softmax_bwd_write_row<kStream>(dyr, yr, dxr, D, head, s, BwdMapOutput<kLog>{});
}

template <typename In, typename Out, bool kLog>
void softmax_lastdim_bwd(const In* dy, const In* y, Out* dx, const SoftmaxShape& shape) {
  using IO = Io<In>;
  using A = typename IO::A;
  constexpr int64_t kStep = 2 * IO::kV;
  const int64_t D = shape.dim_size;
  const bool large = shape.outer * D * int64_t{sizeof(Out)} >= kStreamBytes;  // streaming stores (kStreamBytes)
  const int64_t grain = std::max<int64_t>(1, kGrain / D);
  if (D <= kBwdRegisterPairs<In> * kStep) {  // softmax_bwd_row_in_registers
    static_assert(kBwdRegisterPairs<In> * kStep <= StreamStager<Out>::kMaxPiece);
    parallel_for(shape.outer, grain, [&](int64_t r0, int64_t r1) {
      for_each_output_row(dx, D, r0, r1, large, [&](int64_t r, Out* dxr) {
        softmax_bwd_row_in_registers<kLog, In, Out>(dy + r * D, y + r * D, dxr, D);
      });
    });
    return;
  }
  // Where dx is large, rows of up to kStagedBwdRowBytes go through a StreamStager; longer rows stream their vector
  // pairs after a head of plain stores up to the alignment.
  const bool staged = large && D * int64_t{sizeof(Out)} <= kStagedBwdRowBytes;
  const bool stream = large && !staged;
  // 16-bit log_softmax: exp(y) of the summing pass into a row of scratch (log_softmax_bwd_exp_first says why).
  const bool exp_first = log_softmax_bwd_exp_first<kLog, In>(D);
  const auto rows = [&](auto exp_first_c, auto stream_c) {
    constexpr bool kExpFirst = decltype(exp_first_c)::value;
    constexpr bool kStream = decltype(stream_c)::value;
    parallel_for(shape.outer, grain, [&](int64_t r0, int64_t r1) {
      std::unique_ptr<A[]> exp_row(kExpFirst ? new A[D] : nullptr);
      A* const e = exp_row.get();
      for_each_output_row(dx, D, r0, r1, staged, [&](int64_t r, Out* dxr) {
        softmax_bwd_row<kLog, kExpFirst, kStream>(dy + r * D, y + r * D, dxr, D, e);
      });
      if constexpr (kStream) stream_fence();
    });
  };
  const auto with_stream = [&](auto exp_first_c) {
    if (stream) rows(exp_first_c, std::true_type{});
    else rows(exp_first_c, std::false_type{});
  };
  if constexpr (kLog && sizeof(In) == 2) {
    if (exp_first) {
      with_stream(std::true_type{});
      return;
    }
  }
  with_stream(std::false_type{});
}

template <typename In, typename Out, bool kLog, int NV>
void softmax_cols_bwd(const In* dy, const In* y, Out* dx, int64_t D, int64_t inner) {
  using IO = Io<In>;
  using A = typename IO::A;
  using V = typename IO::V;
  using L = Lanes<IO, NV>;
  L s;
  for (auto& v : s.v) v = V(A(0));
  for (int64_t d0 = 0; d0 < D; d0 += kSumRows) {
    L part;
    for (auto& v : part.v) v = V(A(0));
    for (int64_t d = d0; d < std::min(D, d0 + kSumRows); ++d) {
      L g, o;
      g.load(dy + d * inner);
      o.load(y + d * inner);
      for (int k = 0; k < NV; ++k) part.v[k] = part.v[k] + VecBackward<kLog>::term(g.v[k], o.v[k]);
    }
    for (int k = 0; k < NV; ++k) s.v[k] = s.v[k] + part.v[k];
  }
  for (int64_t d = 0; d < D; ++d) {
    L g, o;
    g.load(dy + d * inner);
    o.load(y + d * inner);
    for (int k = 0; k < NV; ++k) g.v[k] = VecBackward<kLog>::map(g.v[k], o.v[k], s.v[k]);
    g.store(dx + d * inner);
  }
}

// The backward of a group of up to kV columns in lanes across slabs, as softmax_turned_cols_fwd takes them (dy and y
// turned, the sum, then dx; longer columns than kSumRows through the buffers a block of rows at a time in each pass).
template <typename In, typename Out, bool kLog>
void softmax_turned_cols_bwd(const In* dy, const In* y, Out* dx, int64_t D, int64_t inner, const TurnedSegment* segs,
                             int64_t nsegs, int64_t n, const TurnedColumns<In, Out, 2>& buf) {
  using IO = Io<In>;
  using A = typename IO::A;
  using V = typename IO::V;
  constexpr int64_t kV = IO::kV;
  In* const gt = buf.in(0);  // [d - d0][lane]
  In* const ot = buf.in(1);
  Out* const dt = buf.out();
  const bool once = D <= kSumRows;
  const auto turn_in = [&](int64_t d0, int64_t d1) {
    turn_cols_in<In, kV>(dy, inner, segs, nsegs, n, d0, d1, gt);
    turn_cols_in<In, kV>(y, inner, segs, nsegs, n, d0, d1, ot);
  };
  if (once) turn_in(0, D);
  V s(A(0));
  for (int64_t d0 = 0; d0 < D; d0 += kSumRows) {
    const int64_t rows = std::min(D - d0, kSumRows);
    if (!once) turn_in(d0, d0 + rows);
    V part(A(0));
    for (int64_t d = 0; d < rows; ++d)
      part = part + VecBackward<kLog>::term(IO::load(gt + d * kV), IO::load(ot + d * kV));
    s = s + part;
  }
  for (int64_t d0 = 0; d0 < D; d0 += kSumRows) {
    const int64_t rows = std::min(D - d0, kSumRows);
    if (!once) turn_in(d0, d0 + rows);
    for (int64_t d = 0; d < rows; ++d)
      Io<Out>::store(dt + d * kV, VecBackward<kLog>::map(IO::load(gt + d * kV), IO::load(ot + d * kV), s));
    turn_cols_out<Out, kV>(dt, inner, segs, nsegs, d0, rows, dx);
  }
}

// `width` columns from each row of dy / y / dx (rows `inner` apart); `whole`: they are all of the row (width ==
// inner), so that the slab is one block and the vector pair at row d's last columns runs on into row d + 1: there
// it is loaded and stored whole (the stored lanes past the row are written again with row d + 1; dx aliases
// neither input), but for the last row.
template <typename In, typename Out, bool kLog>
void softmax_cols_bwd_wide(const In* dy, const In* y, Out* dx, int64_t D, int64_t inner, int64_t width, bool whole,
                           const RunState<typename Io<In>::A>& state) {
  using IO = Io<In>;
  using A = typename IO::A;
  using V = typename IO::V;
  constexpr int64_t kV = IO::kV, kStep = 2 * kV;
  const int64_t full = width / kStep * kStep, tail = width - full;  // the tail in zero-filled lanes
  const int64_t padded = full + (tail > 0 ? kStep : 0);
  // Row d's pair of dy and y at its last columns: whole where it runs on into row d + 1, else the tail's lanes.
  const auto runs_on = [&](int64_t d) { return whole && d + 1 < D; };
  const auto load_tail = [&](int64_t d, V& g0, V& g1, V& y0, V& y1) {
    if (runs_on(d)) {
      IO::load2(dy + d * inner + full, g0, g1);
      IO::load2(y + d * inner + full, y0, y1);
    } else {
      load2_tail(dy + d * inner + full, tail, A(0), g0, g1);
      load2_tail(y + d * inner + full, tail, A(0), y0, y1);
    }
  };
  A* const sum = state.array(0);
  A* const part = state.array(1);
  std::fill(sum, sum + padded, A(0));
  for (int64_t d0 = 0; d0 < D; d0 += kSumRows) {
    std::fill(part, part + padded, A(0));
    for (int64_t d = d0; d < std::min(D, d0 + kSumRows); ++d) {
      V g0, g1, y0, y1;
      for (int64_t c = 0; c < full; c += kStep) {
        IO::load2(dy + d * inner + c, g0, g1);
        IO::load2(y + d * inner + c, y0, y1);
        (V::loadu(part + c) + VecBackward<kLog>::term(g0, y0)).store(part + c);
        (V::loadu(part + c + kV) + VecBackward<kLog>::term(g1, y1)).store(part + c + kV);
      }
      if (tail > 0) {
        load_tail(d, g0, g1, y0, y1);
        (V::loadu(part + full) + VecBackward<kLog>::term(g0, y0)).store(part + full);
        (V::loadu(part + full + kV) + VecBackward<kLog>::term(g1, y1)).store(part + full + kV);
      }
    }
    for (int64_t c = 0; c < padded; c += kV) (V::loadu(sum + c) + V::loadu(part + c)).store(sum + c);
  }
  for (int64_t d = 0; d < D; ++d) {
    V g0, g1, y0, y1;
    for (int64_t c = 0; c < full; c += kStep) {
      IO::load2(dy + d * inner + c, g0, g1);
      IO::load2(y + d * inner + c, y0, y1);
      Io<Out>::store2(dx + d * inner + c, VecBackward<kLog>::map(g0, y0, V::loadu(sum + c)),
                      VecBackward<kLog>::map(g1, y1, V::loadu(sum + c + kV)));
    }
    if (tail > 0) {
      load_tail(d, g0, g1, y0, y1);
      const V d0 = VecBackward<kLog>::map(g0, y0, V::loadu(sum + full));
      const V d1 = VecBackward<kLog>::map(g1, y1, V::loadu(sum + full + kV));
      if (runs_on(d)) Io<Out>::store2(dx + d * inner + full, d0, d1);
      else store2_tail(dx + d * inner + full, tail, d0, d1);
    }
  }
}

// Columns [c0, c1) of one slab: blocks of two vectors, then one vector (c1 - c0 a multiple of kV: the columns past a
// slab's last vector go in lanes across slabs, softmax_turned_cols_bwd); or, with `state` (where the runs apply at
// some thread count: strided_runs_apply), the columns past the last pair in the runs' lanes. As
// softmax_strided_block_fwd.
template <typename In, typename Out, bool kLog>
void softmax_strided_block_bwd(const In* dy, const In* y, Out* dx, int64_t D, int64_t inner, int64_t c0, int64_t c1,
                               const RunState<typename Io<In>::A>* state) {
  constexpr int64_t kV = Io<In>::kV;
  int64_t c = c0;
  for (; c + 2 * kV <= c1; c += 2 * kV) softmax_cols_bwd<In, Out, kLog, 2>(dy + c, y + c, dx + c, D, inner);
  if (state != nullptr) {
    if (c < c1) softmax_cols_bwd_wide<In, Out, kLog>(dy + c, y + c, dx + c, D, inner, c1 - c, /*whole=*/false, *state);
    return;
  }
  for (; c < c1; c += kV) softmax_cols_bwd<In, Out, kLog, 1>(dy + c, y + c, dx + c, D, inner);
}

// Task = (outer index, chunk of columns); dy, y and dx dense [outer, D, inner]. Each chunk: wide (strided_run_width),
// all of its columns at once; else softmax_strided_block_bwd; where the runs do not apply and inner is no multiple of
// kV, the tasks are TurnedTasks' (the columns left in lanes across slabs, softmax_turned_cols_bwd), as the forward's.
template <typename In, typename Out, bool kLog>
void softmax_strided_bwd(const In* dy, const In* y, Out* dx, const SoftmaxShape& shape) {
  constexpr int64_t kV = Io<In>::kV, kBlock = 2 * kV;
  const int64_t D = shape.dim_size, inner = shape.inner;
  if (const int64_t w = turned_group_width<In>(shape.outer, D, inner, parallel_threads(), /*backward=*/true)) {
    const TurnedTasks<In> tasks(shape, w);
    parallel_for(tasks.count(), std::max<int64_t>(1, kGrain / (D * kV)), [&](int64_t t0, int64_t t1) {
      const TurnedColumns<In, Out, 2> buf(D);
      for (int64_t t = t0; t < t1; ++t) {
        tasks.run(
            t,
            [&](int64_t offset, int64_t c0, int64_t c1) {
              softmax_strided_block_bwd<In, Out, kLog>(dy + offset, y + offset, dx + offset, D, inner, c0, c1,
                                                       nullptr);
            },
            [&](const TurnedSegment* segs, int64_t nsegs, int64_t n) {
              softmax_turned_cols_bwd<In, Out, kLog>(dy, y, dx, D, inner, segs, nsegs, n, buf);
            });
      }
    });
    return;
  }
  const int64_t width = strided_run_width<In>(shape.outer, D, inner, parallel_threads(), /*streaming=*/true);
  const bool wide = width > kBlock;
  const int64_t chunks = ceil_div(inner, width);
  parallel_for(shape.outer * chunks, std::max<int64_t>(1, kGrain / (D * std::min(inner, width))),
               [&](int64_t t0, int64_t t1) {
                 // The runs (wide implies them), or a slab's columns past its last vector in the runs' lanes.
                 const bool lanes = strided_runs_apply(D, inner) || inner % kV != 0;
                 const RunState<typename Io<In>::A> state(lanes ? width : 0);
                 for (int64_t t = t0; t < t1; ++t) {
                   const int64_t o = t / chunks, c0 = (t % chunks) * width, c1 = std::min(inner, c0 + width);
                   const int64_t offset = o * D * inner;
                   if (wide) {  // a last chunk under a vector pair too: the same arithmetic whatever the width
                     softmax_cols_bwd_wide<In, Out, kLog>(dy + offset + c0, y + offset + c0, dx + offset + c0, D,
                                                          inner, c1 - c0, chunks == 1, state);
                   } else {
                     softmax_strided_block_bwd<In, Out, kLog>(dy + offset, y + offset, dx + offset, D, inner, c0, c1,
                                                              lanes ? &state : nullptr);
                   }
                 }
               });
}

template <typename In, typename Out>
void softmax_bwd_any(const In* dy, const In* y, Out* dx, const SoftmaxShape& shape, bool log) {
  if (shape.inner == 1 && softmax_rows_turned<In>(shape.dim_size, /*backward=*/true)) {
    if (log) softmax_short_rows_bwd<In, Out, true>(dy, y, dx, shape);
    else softmax_short_rows_bwd<In, Out, false>(dy, y, dx, shape);
  } else if (shape.inner == 1) {
    if (log) softmax_lastdim_bwd<In, Out, true>(dy, y, dx, shape);
    else softmax_lastdim_bwd<In, Out, false>(dy, y, dx, shape);
  } else {
    if (log) softmax_strided_bwd<In, Out, true>(dy, y, dx, shape);
    else softmax_strided_bwd<In, Out, false>(dy, y, dx, shape);
  }
}

// ---------------------------------------------------------------------------------------------
// The table.

template <typename T>
void softmax_fwd(const T* x, T* y, const SoftmaxShape& shape, bool log) {
  softmax_fwd_any<T, T>(x, y, shape, log);
}
template <typename T>
void softmax_fwd_to_float(const T* x, float* y, const SoftmaxShape& shape, bool log) {
  softmax_fwd_any<T, float>(x, y, shape, log);
}
template <typename T>
void softmax_bwd(const T* dy, const T* y, T* dx, const SoftmaxShape& shape, bool log) {
  softmax_bwd_any<T, T>(dy, y, dx, shape, log);
}
template <typename T>
void softmax_bwd_from_float(const float* dy, const float* y, T* dx, const SoftmaxShape& shape, bool log) {
  softmax_bwd_any<float, T>(dy, y, dx, shape, log);
}

template <typename T>
int64_t softmax_strided_columns(const SoftmaxShape& shape, bool backward) {
  return strided_run_width<T>(shape.outer, shape.dim_size, shape.inner, parallel_threads(), /*streaming=*/backward);
}

template <typename T>
int64_t softmax_strided_lane_group(const SoftmaxShape& shape, bool backward) {
  return turned_group_width<T>(shape.outer, shape.dim_size, shape.inner, parallel_threads(), backward);
}

template <typename T>
constexpr TypedKernels<T> make_kernels() {
  constexpr bool kReduced = std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>;
  TypedKernels<T> k{};
  k.softmax_fwd = &softmax_fwd<T>;
  k.softmax_bwd = &softmax_bwd<T>;
  k.softmax_strided_columns = &softmax_strided_columns<T>;
  k.softmax_strided_lane_group = &softmax_strided_lane_group<T>;
  if constexpr (kReduced) {
    k.softmax_fwd_to_float = &softmax_fwd_to_float<T>;
    k.softmax_bwd_from_float = &softmax_bwd_from_float<T>;
  }
  k.gelu_fwd = &gelu_fwd<T>;
  k.gelu_bwd = &gelu_bwd<T>;
  k.sigmoid_fwd = &sigmoid_fwd<T>;
  k.sigmoid_bwd = &sigmoid_bwd<T>;
  k.bias_gelu_fwd = &bias_gelu_fwd<T>;
  k.bias_gelu_bwd = &bias_gelu_bwd<T>;
  return k;
}

constexpr KernelTable kTable{
    FASTACT_STRINGIFY(CPU_CAPABILITY), static_cast<int>(Vectorized<float>::size()),
    make_kernels<float>(),             make_kernels<double>(),
    make_kernels<c10::Half>(),         make_kernels<c10::BFloat16>(),
};

}  // namespace

const KernelTable& kernel_table() {
#if defined(CPU_CAPABILITY_AVX512) && defined(__GNUC__)
  // FASTACT_NO_AVX512_BF16=1 keeps the emulated conversion (bit-for-bit ATen's, denormals
  // included); tests use it to cover that path on CPUs that have the instruction.
  static const bool detected = [] {
    const char* off = std::getenv("FASTACT_NO_AVX512_BF16");
    g_avx512_bf16 = __builtin_cpu_supports("avx512bf16") && !(off && off[0] == '1');
    return true;
  }();
  (void)detected;
#endif
  return kTable;
}

}  // namespace CPU_CAPABILITY
}  // namespace fastact::cpu
