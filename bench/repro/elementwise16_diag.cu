// Diagnostic (not part of the library; bench/NOTES.md, thirty-ninth session): why the 16-bit elementwise
// cells run 0.04-0.3% behind torch eager at the memory limit (issue #3). torch 2.11's vectorised elementwise
// kernel on sm_90 (CUDALoops.cuh, MemoryAccess.cuh, thread_constants.h) runs 128 threads a block, 8 elements
// (one 16-byte access an operand) a thread, 32-bit indices, plain loads through non-restrict pointers and no
// register cap beyond __launch_bounds__(128). The library's 16-bit one-operand shape is the same access
// shape, but with 64-bit indices, __restrict__ (non-coherent, LDG.CONSTANT) loads and a 32-register cap
// (min 16 blocks); its two-operand shape is 512 threads at 8 bytes. This file builds those knobs one at a
// time beside the library's own launcher, as a shared library that elementwise16_diag.py loads with ctypes
// and times against torch's ops in the same process.
//
//   nvcc -std=c++17 -O3 -arch=sm_90 --expt-relaxed-constexpr -Iinclude -Xcompiler -fPIC -shared \
//        -DDIAG_OP=<0..8> -o libelt16_<op>.so bench/repro/elementwise16_diag.cu
//
// DIAG_OP: 0 gelu tanh fwd, 1 sigmoid fwd, 2 gelu erf fwd, 3 gelu tanh bwd, 4 gelu erf bwd, 5 sigmoid bwd (erff / expf
// math, as float tensors run), 6 gelu erf fwd, 7 gelu erf bwd, 8 sigmoid fwd in their 16-bit math forms. The library
// launcher row runs the Op given (ops 2, 4, 1 on 16-bit dtypes are no longer what the library runs there).
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "fastact/elementwise.cuh"


#ifndef DIAG_OP
#define DIAG_OP 0
#endif

using namespace fastact;
using namespace fastact::elementwise;

namespace {

template <int kOp> struct OpOf;
template <> struct OpOf<0> { using type = ForwardOp<math::GeluTanh>; };
template <> struct OpOf<1> { using type = ForwardOp<math::Sigmoid>; };
template <> struct OpOf<2> { using type = ForwardOp<math::GeluErf>; };
template <> struct OpOf<3> { using type = DerivativeOp<math::GeluTanh>; };
template <> struct OpOf<4> { using type = DerivativeOp<math::GeluErf>; };
template <> struct OpOf<5> { using type = SigmoidBackwardOp; };
// The 16-bit math forms (math.h; forty-sixth session): what the library's launchers run on 16-bit tensors.
template <> struct OpOf<6> { using type = ForwardOp<math::GeluErf16>; };
template <> struct OpOf<7> { using type = DerivativeOp<math::GeluErf16>; };
template <> struct OpOf<8> { using type = ForwardOp<math::Sigmoid16>; };
using Op = OpOf<DIAG_OP>::type;

// How a variant loads its operands: plainly (as torch's char* data), through the non-coherent path (as the
// library's __restrict__ const loads compile, LDG.E.128.CONSTANT), that with an L2 prefetch size or without
// allocating in L1, or with the last-use / evict-first hints (the first runs measured them all; no_allocate and
// last-use lost 1-3% everywhere and stay only to be compared). 8-byte accesses take plain or non-coherent only.
enum Load { kPlain, kNc, kNcL2_128, kNcL2_256, kNcNoL1, kLastUse, kStreaming, kNcTied };
// kNcTied (session 44): non-coherent loads, and every loaded word made to depend on every load of the tile (bits
// ANDed with a run-time zero and ORed into each, as the library's LoadDependence), so that ptxas cannot sink the
// other loads under the first unit's math: under the 32-register cap it issued the 16-bit erf gelu's second load
// (dy, or the forward's second access) only after the first one's math (SASS).
// How it stores: plainly, or evict-first (st.global.cs).
enum Store { kStorePlain, kStoreStreaming };

template <int kLoad, typename T, int kVec>
__device__ __forceinline__ AlignedVector<T, kVec> load(const T* p) {
  AlignedVector<T, kVec> v;
  if constexpr (sizeof(T) * kVec == 16 && kLoad != kPlain) {
    uint32_t w[4];
#define DIAG_LD(q) asm volatile("ld.global" q ".v4.u32 {%0, %1, %2, %3}, [%4];" \
                                : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(p))
    if constexpr (kLoad == kNc || kLoad == kNcTied) DIAG_LD(".nc");
    else if constexpr (kLoad == kNcL2_128) DIAG_LD(".nc.L2::128B");
    else if constexpr (kLoad == kNcL2_256) DIAG_LD(".nc.L2::256B");
    else if constexpr (kLoad == kNcNoL1) DIAG_LD(".nc.L1::no_allocate");
    else if constexpr (kLoad == kLastUse) DIAG_LD(".lu");
    else DIAG_LD(".cs");
#undef DIAG_LD
    *reinterpret_cast<uint4*>(&v) = make_uint4(w[0], w[1], w[2], w[3]);
  } else if constexpr (sizeof(T) * kVec == 8 && kLoad != kPlain) {
    const int2 w = __ldg(reinterpret_cast<const int2*>(p));
    *reinterpret_cast<int2*>(&v) = w;
  } else {
    v = *reinterpret_cast<const AlignedVector<T, kVec>*>(p);
  }
  return v;
}

template <int kStore, typename T, int kVec>
__device__ __forceinline__ void store(T* p, const AlignedVector<T, kVec>& v) {
  if constexpr (sizeof(T) * kVec == 16 && kStore == kStoreStreaming) {
    const uint4 w = *reinterpret_cast<const uint4*>(&v);
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w.x), "r"(w.y), "r"(w.z), "r"(w.w)
                 : "memory");
  } else {
    *reinterpret_cast<AlignedVector<T, kVec>*>(p) = v;
  }
}

// The variants: kThreads a block, kVec elements an access, kUnroll accesses a thread and operand,
// kMinBlocks the register cap (0: none), k32 32-bit indices, kLoad / kStore the access kinds above. Full tiles take
// the vector path; the last partial tile goes element by element (n here is always whole tiles).
template <int kThreads, int kVec, int kUnroll, int kMinBlocks, bool k32, int kLoad, int kStore, typename T>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    diag_kernel(const T* in0, const T* in1, T* out, int64_t n, Op op) {
  constexpr int kTile = kThreads * kVec * kUnroll;
  using Index = std::conditional_t<k32, int, int64_t>;
  const Index start = Index(blockIdx.x) * kTile;
  if (Index(n) - start >= kTile) {
    AlignedVector<T, kVec> a[kUnroll], b[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const Index i = start + (Index(threadIdx.x) + u * kThreads) * kVec;
      a[u] = load<kLoad, T, kVec>(in0 + i);
      if constexpr (Op::kArity == 2) b[u] = load<kLoad, T, kVec>(in1 + i);
    }
    if constexpr (kLoad == kNcTied && sizeof(T) * kVec == 16) {
      const unsigned zero = static_cast<unsigned>(static_cast<uint64_t>(n) >> 63);
      uint32_t bits = 0;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          bits |= reinterpret_cast<const uint32_t*>(&a[u])[w] & zero;
          if constexpr (Op::kArity == 2) bits |= reinterpret_cast<const uint32_t*>(&b[u])[w] & zero;
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          reinterpret_cast<uint32_t*>(&a[u])[w] |= bits;
          if constexpr (Op::kArity == 2) reinterpret_cast<uint32_t*>(&b[u])[w] |= bits;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const Index i = start + (Index(threadIdx.x) + u * kThreads) * kVec;
      store<kStore, T, kVec>(out + i, apply_vec<T, kVec>(op, a[u], Op::kArity == 2 ? b[u] : a[u]));
    }
    return;
  }
  for (int64_t i = start + threadIdx.x; i < n; i += kThreads) {
    const AlignedVector<T, 1> a = load<kPlain, T, 1>(in0 + i);
    const AlignedVector<T, 1> b = Op::kArity == 2 ? load<kPlain, T, 1>(in1 + i) : a;
    out[i] = apply_vec<T, 1>(op, a, b).val[0];
  }
}

template <int kThreads, int kBytes, int kUnroll, int kMinBlocks, bool k32, int kLoad, int kStore = kStorePlain,
          typename T>
int launch(const T* in0, const T* in1, T* out, int64_t n, cudaStream_t s) {
  constexpr int kVec = kBytes / static_cast<int>(sizeof(T));
  const int64_t grid = (n + int64_t{kThreads} * kVec * kUnroll - 1) / (int64_t{kThreads} * kVec * kUnroll);
  diag_kernel<kThreads, kVec, kUnroll, kMinBlocks, k32, kLoad, kStore, T><<<static_cast<unsigned>(grid), kThreads, 0, s>>>(
      in0, in1, out, n, Op{});
  return static_cast<int>(cudaGetLastError());
}

// The variant table; the driver prints the names (diag_variant_name) beside the figures.
#define DIAG_VARIANTS(X)                                                               \
  X("128 x 16B, cap 16, i64, nc", 128, 16, 1, 16, false, kNc, kStorePlain)             \
  X("128 x 16B, no cap, i32, plain (torch)", 128, 16, 1, 0, true, kPlain, kStorePlain)  \
  X("128 x 16B, cap 16, i64, nc.L2::256B", 128, 16, 1, 16, false, kNcL2_256, kStorePlain) \
  X("128 x 16B, cap 16, i64, nc.L1::no_alloc", 128, 16, 1, 16, false, kNcNoL1, kStorePlain) \
  X("128 x 16B, cap 16, i64, ld.lu", 128, 16, 1, 16, false, kLastUse, kStorePlain)     \
  X("128 x 16B, cap 16, i64, nc, st.cs", 128, 16, 1, 16, false, kNc, kStoreStreaming)  \
  X("128 x 16B, cap 16, i64, ld.cs, st.cs", 128, 16, 1, 16, false, kStreaming, kStoreStreaming) \
  X("128 x 16B, cap 16, i64, L2::256B, st.cs", 128, 16, 1, 16, false, kNcL2_256, kStoreStreaming) \
  X("256 x 16B, cap 8, i64, nc", 256, 16, 1, 8, false, kNc, kStorePlain)               \
  X("256 x 16B, no cap, i32, plain", 256, 16, 1, 0, true, kPlain, kStorePlain)         \
  X("256 x 8B, cap 8, i64, nc", 256, 8, 1, 8, false, kNc, kStorePlain)                 \
  X("512 x 16B, cap 4, i64, nc", 512, 16, 1, 4, false, kNc, kStorePlain)               \
  X("512 x 8B, cap 4, i64, nc", 512, 8, 1, 4, false, kNc, kStorePlain)                 \
  X("128 x 16B, cap 16, i64, nc, tied", 128, 16, 1, 16, false, kNcTied, kStorePlain)   \
  X("128 x 16B x 2, cap 16, i64, nc", 128, 16, 2, 16, false, kNc, kStorePlain)         \
  X("128 x 16B x 2, cap 16, i64, nc, tied", 128, 16, 2, 16, false, kNcTied, kStorePlain) \
  X("128 x 16B x 2, no cap, i64, nc", 128, 16, 2, 0, false, kNc, kStorePlain)         \
  X("128 x 16B x 4, cap 16, i64, nc", 128, 16, 4, 16, false, kNc, kStorePlain)         \
  X("256 x 16B x 2, cap 8, i64, nc", 256, 16, 2, 8, false, kNc, kStorePlain)           \
  X("128 x 8B x 2, cap 16, i64, nc", 128, 8, 2, 16, false, kNc, kStorePlain)

#define DIAG_NAME(name, ...) name,
const char* const kNames[] = {"library launcher", DIAG_VARIANTS(DIAG_NAME)};
#undef DIAG_NAME
constexpr int kVariants = sizeof(kNames) / sizeof(kNames[0]);

template <typename T>
int run(int variant, const void* a, const void* b, void* o, int64_t n, cudaStream_t s) {
  const T* in0 = static_cast<const T*>(a);
  const T* in1 = static_cast<const T*>(b);
  T* out = static_cast<T*>(o);
  if (variant == 0) return static_cast<int>(launch_elementwise<T>(in0, in1, out, n, Op{}, s));
  int v = 1;
#define DIAG_CASE(name, th, by, un, mb, i32, ld, st) \
  if (variant == v++) return launch<th, by, un, mb, i32, ld, st>(in0, in1, out, n, s);
  DIAG_VARIANTS(DIAG_CASE)
#undef DIAG_CASE
  return -1;
}

}  // namespace

#define DIAG_CAT2(a, b) a##b
#define DIAG_CAT(a, b) DIAG_CAT2(a, b)

// dtype 0: bfloat16, 1: float16. n < 2^31 for the 32-bit variants (the driver's tensors are 2^27).
extern "C" int DIAG_CAT(diag_launch_, DIAG_OP)(int dtype, int variant, const void* in0, const void* in1, void* out,
                                               int64_t n, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  return dtype == 0 ? run<__nv_bfloat16>(variant, in0, in1, out, n, s) : dtype == 1 ? run<__half>(variant, in0, in1, out, n, s) : run<float>(variant, in0, in1, out, n, s);
}

extern "C" int DIAG_CAT(diag_variants_, DIAG_OP)() { return kVariants; }
extern "C" const char* DIAG_CAT(diag_variant_name_, DIAG_OP)(int v) { return v >= 0 && v < kVariants ? kNames[v] : ""; }
