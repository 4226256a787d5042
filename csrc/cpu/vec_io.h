// Shared pieces of the per-ISA CPU kernels (softmax_kernels.cpp, elementwise_kernels.cpp): loads and
// stores of every element type through vectors of its acc type (Io<T>, bfloat16 pairs in lane order,
// the padded row tails), streaming stores for large outputs (StreamStager for outputs written in
// unaligned pieces), and the work sizes that decide when a kernel takes threads.
//
// Compiled once per instruction set with each kernel file (setup.py ISA_SOURCES: -DCPU_CAPABILITY=
// DEFAULT|AVX2|AVX512 plus the -m flags of each), ATen's scheme: at::vec::Vectorized<float> takes its width
// from those macros and everything here sits in `namespace CPU_CAPABILITY`, so the three builds never share
// a symbol; helpers sit in an anonymous namespace inside it, a copy per kernel file.
// ODR note: only lean headers below (Vectorized, c10 scalar types, fastact/math.h). Inline code
// outside the ISA namespace that a wide-vector build instantiated could be chosen by the linker for
// the whole library and run on a CPU without those instructions; threads therefore come through
// the type-erased csrc/cpu/parallel.h, and no namespace-scope object of these files needs a
// constructor to run at load time (the table is constant-initialised).
//
// Precision: half and bfloat16 load into float and compute in float; float in float; double in
// double. Vector code implements the formulas of include/fastact/math.h (same constants,
// GeluConstants); scalar tails call the math.h functors themselves.
#pragma once

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

namespace fastact::cpu {
namespace CPU_CAPABILITY {

#if defined(CPU_CAPABILITY_AVX512)
// Whether bfloat16 stores use the AVX512-BF16 instruction (Io<c10::BFloat16> below). One flag for all the
// kernel files of the build: kernels.cpp defines it, and kernel_table() sets it before any kernel runs.
extern bool g_avx512_bf16;
#endif

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

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

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
// -mavx512bf16. The test (g_avx512_bf16) costs one predictable branch per 32 elements. Unlike the emulation,
// the instruction flushes bfloat16 denormals (< 1.2e-38) to zero.

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
// the order does not matter (sums). Measured on a 2-core Zen 3 VM (AVX2, one thread, 2 MB, ms, element order -> lane
// order, torch in brackets): the bf16 softmax backward, rows of 128 0.61-0.63 -> 0.38-0.45 (0.57-0.64), of 4096
// 0.55-0.62 -> 0.28 (0.53-0.67); the bf16 sigmoid backward 0.37-0.41 -> 0.21-0.26 (0.37-0.45).
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
// Measured (a 2-core Zen 4 VM, AVX512, 8 MB, three interleaved rounds):
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
// exp an element, the backward plain arithmetic (log_softmax: one exp). Measured with the moves inlined (a 2-core
// Zen 4 VM, AVX512, 8 MB rows, three interleaved rounds): a padded tail of one
// element lost against the element in every op (f32 rows of 33: softmax forward 1.18 against 1.00 ms, backward 0.51
// against 0.38); tails of four won in the forwards (rows of 36: 1.09 against 1.32 ms; log_softmax 1.20 against
// 1.56) and were mixed in the backwards (softmax f32 0.53 against 0.39; log_softmax f32 0.72 against 0.79, bf16 2.38
// against 2.03). Tails of 2-3 (forward) and 5 and more (backward) follow from those two points, unmeasured.
constexpr int64_t kPaddedTailFwd = 1;
constexpr int64_t kPaddedTailBwd = 4;
// v with its lanes from n on replaced by `fill` (0 <= n <= kV). ATen's Vectorized::set does the same through a
// switch over n that gcc did not inline; a call from the row loops spills every live vector register around it
// (the System V ABI has no callee-saved vector registers), which cost rows of 33-95 floats 35-40 ns each
// (a 2-core Zen 4 VM, AVX512). This and the tails below are always inlined for that reason.
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
// their aligned pairs, or none (softmax_kernels.cpp has the figures at kStagedBwdRowBytes).
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

}  // namespace

}  // namespace CPU_CAPABILITY
}  // namespace fastact::cpu
