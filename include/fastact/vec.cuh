// An aligned vector of N elements for 128-bit loads and stores, one generic type for every dtype
// (the MemoryAccess.cuh pattern), and the host-side test for whether a pointer can use it.
#pragma once

#include <cstdint>

#include "fastact/math.h"

namespace fastact {

// Bytes one vector access moves: 16, the widest load a thread can issue (LDG.E.128).
constexpr int kVecBytes = 16;

// Elements of T in one 128-bit access: 4 float, 8 half/bfloat16, 2 double.
template <typename T>
constexpr int vec_width() {
  return kVecBytes / static_cast<int>(sizeof(T));
}

template <typename T, int N>
struct alignas(sizeof(T) * N) AlignedVector {
  T val[N];
};

template <typename T, int N>
FASTACT_DEVICE AlignedVector<T, N> load_vector(const T* p) {  // p must be aligned to sizeof(T) * N
  return *reinterpret_cast<const AlignedVector<T, N>*>(p);
}

// The same load, cached in L2 only (ld.global.cg; 16-byte vectors, other sizes load as above). For
// data read once: on the H100 the warp softmax forward at rows of 1024 floats ran 1.7% faster with it
// (185.5 -> 182.4 us on 256 MB); rows of 128 and the 128-bit block kernels were unchanged, and the
// warp backward at rows of 128 lost 2% (bf16); bf16 rows of 128 at one access a lane lost 0.8%.
// So only the warp forward uses it, where a lane reads
// several vectors (WarpShape::kLoadL2, softmax/warp.cuh).
template <typename T, int N>
FASTACT_DEVICE AlignedVector<T, N> load_vector_l2(const T* p) {
#ifdef __CUDA_ARCH__
  if constexpr (sizeof(T) * N == 16) {
    AlignedVector<T, N> v;
    *reinterpret_cast<int4*>(&v) = __ldcg(reinterpret_cast<const int4*>(p));
    return v;
  }
#endif
  return load_vector<T, N>(p);
}

// The same load, asking L2 to fetch the whole 128-byte line from memory (ld.global.nc.L2::128B, a
// hint; 16-byte vectors of 2- and 4-byte elements, sm_80+; others load as above). For loads that read a
// narrow piece of each line while other CTAs read the rest at about the same time: the cached strided
// backward, whose tiles read 32 or 64 bytes of each D-row. On the H100, softmax backward over dim 0 of
// f32 [8192, 8192] (64-byte pieces) ran ~0.78 -> ~0.86 of the limit, [16384, 4096] (32-byte pieces)
// 0.670 -> 0.70-0.75; 128-byte pieces were unchanged; the strided forward lost 3% at 64-byte pieces.
// float64 keeps the plain load:
// as four 32-bit words its vectors cost register moves, and it was not measured. The .nc path is the one
// the kernels' const __restrict__ loads already take: p must not be written by any thread while the
// kernel runs.
template <typename T, int N>
FASTACT_DEVICE AlignedVector<T, N> load_vector_line(const T* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (sizeof(T) * N == 16 && sizeof(T) <= 4) {
    uint4 u;
    asm volatile("ld.global.nc.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
                 : "l"(p));
    AlignedVector<T, N> v;
    *reinterpret_cast<uint4*>(&v) = u;
    return v;
  }
#endif
  return load_vector<T, N>(p);
}

// Loads of data the same CTA reads twice, close together (block.cuh's two-pass backward): the first read asks L1
// and L2 to keep the lines (Evict::kLast), the second to drop them first (Evict::kFirst). ld.global.L1::evict_*.
// L2::cache_hint with a createpolicy.fractional.L2::evict_* policy, which is what Triton emits for tl.load's
// eviction_policy='evict_last' / 'evict_first' on sm_90 (16-byte vectors, sm_80+; others load as load_vector).
// Why: dispatch.h row two-pass (docs/dispatch.md two-pass); the same two passes with plain loads ran 2.6-3.7% slower.
enum class Evict { kLast, kFirst };
template <Evict kPolicy, typename T, int N>
FASTACT_DEVICE AlignedVector<T, N> load_vector_evict(const T* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (sizeof(T) * N == 16) {
    uint64_t policy;
    uint4 u;
    if constexpr (kPolicy == Evict::kLast) {
      asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
      asm volatile("ld.global.L1::evict_last.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                   : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
                   : "l"(p), "l"(policy));
    } else {
      asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
      asm volatile("ld.global.L1::evict_first.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                   : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
                   : "l"(p), "l"(policy));
    }
    AlignedVector<T, N> v;
    *reinterpret_cast<uint4*>(&v) = u;
    return v;
  }
#endif
  return load_vector<T, N>(p);
}

// Asks L2 for the line holding p ahead of a later load (prefetch.global.L2): no register written, no
// wait. Callers pass only addresses they may load.
template <typename T>
FASTACT_DEVICE void prefetch_l2(const T* p) {
#ifdef __CUDA_ARCH__
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}

template <typename T, int N>
FASTACT_DEVICE void store_vector(T* p, const AlignedVector<T, N>& v) {  // p aligned likewise
  *reinterpret_cast<AlignedVector<T, N>*>(p) = v;
}

// A warp's 32 consecutive units of N elements, 32 bytes a lane (lane l's at p = chunk + N * l): the float outputs of
// softmax's 16-bit inputs (N = 8). Stored as each lane's own two 16-byte halves, each store instruction would
// write half of each 32-byte sector it touches. Here lanes l and l ^ 16 swap one half (a shuffle an element of
// it), so that each of the two store instructions covers 512 contiguous bytes: the first [chunk, chunk + 16 * N)
// (lanes < 16 their own first half, lanes >= 16 their partner's second half), the second the next 16 * N. Every
// lane of the warp must call it, with its unit inside the tensor; threadIdx.x is the linear thread index (1-D blocks),
// so its bit 4 is the lane's.
template <typename Out, int N>
FASTACT_DEVICE void store_warp_paired(Out* p, const AlignedVector<Out, N>& v) {
  static_assert(N * sizeof(Out) == 2 * kVecBytes, "two 16-byte halves a lane");
  constexpr int kHalf = N / 2;
#ifdef __CUDA_ARCH__
  const bool low = (threadIdx.x & 16) == 0;
  AlignedVector<Out, kHalf> first, second;
#pragma unroll
  for (int k = 0; k < kHalf; ++k) {
    const Out mine_lo = v.val[k], mine_hi = v.val[kHalf + k];
    const Out got = __shfl_xor_sync(0xffffffffu, low ? mine_hi : mine_lo, 16);
    first.val[k] = low ? mine_lo : got;
    second.val[k] = low ? got : mine_hi;
  }
  // lanes < 16: own first half at p, the partner's first half at p + 16 * N; lanes >= 16: the partner's second
  // half at p - 16 * N + kHalf, own second half at p + kHalf.
  store_vector<Out, kHalf>(low ? p : p - 16 * N + kHalf, first);
  store_vector<Out, kHalf>(low ? p + 16 * N : p + kHalf, second);
#else
  store_vector<Out, N>(p, v);
#endif
}

// 0 at run time, from a kernel argument known to be >= 0 (a length), so that the compiler cannot fold it: for
// LoadDependence.
FASTACT_DEVICE unsigned opaque_zero(int64_t nonneg) {
  return static_cast<unsigned>(static_cast<uint64_t>(nonneg) >> 63);
}

// Makes values depend on loads whose bits they do not use, unchanged: the bits of each loaded value ANDed with
// `zero` (opaque_zero) are ORed into `bits` (take), and `bits` into a float or double (apply). Nothing computed
// from the result can start before every taken load has arrived, so ptxas cannot sink a load below the arithmetic
// of another: softmax's backwards (softmax/common.cuh output_loads_with_reduction). (The 16-bit erf GELU forward's
// tiles were tied too, until its 16-bit math form (math.h GeluErf16) made them light.)
struct LoadDependence {
  unsigned zero;
  unsigned bits = 0;
  template <typename U>
  FASTACT_DEVICE void take(const U& v) {
    static_assert(sizeof(U) % 4 == 0 || sizeof(U) == 2, "whole 32-bit words, or one 16-bit element");
    if constexpr (sizeof(U) % 4 == 0) {
      const auto* w = reinterpret_cast<const unsigned*>(&v);
#pragma unroll
      for (int i = 0; i < int(sizeof(U) / 4); ++i) bits |= w[i] & zero;
    } else {
      bits |= *reinterpret_cast<const unsigned short*>(&v) & zero;
    }
  }
  template <typename A>
  FASTACT_DEVICE A apply(A acc) const {
    static_assert(sizeof(A) == 4 || sizeof(A) == 8, "float or double");
#ifdef __CUDA_ARCH__
    if constexpr (sizeof(A) == 4) {
      return __uint_as_float(__float_as_uint(acc) | bits);
    } else {
      return __longlong_as_double(__double_as_longlong(acc) | static_cast<long long>(bits));
    }
#else
    return acc;
#endif
  }
};

// Host side: may `p` be read with AlignedVector<T, vec_width<T>()>? (nullptr counts as aligned.)
inline bool is_vec_aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % kVecBytes == 0; }

}  // namespace fastact
