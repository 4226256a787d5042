// Diagnostic (not part of the library; bench/NOTES.md, fortieth session): the softmax / log_softmax cells of the
// H100 bar report that sit at the memory limit but 0.1-0.9% behind torch.compile's Triton kernels, mostly
// backwards (h100-2026-11-27-s38-bar-bench.log): 16-bit [131072, 1024], [32768, 4096], [8192, 16384] and f32
// [65536, 1024] backwards, f32 [16384, 4096] / [65536, 1024] and 16-bit [131072, 1024] forwards. This file builds,
// beside the library's own launcher for the plan the dispatcher picks, the launch knobs of those plans one at a
// time: threads per CTA (rows per CTA for the warp kernel), the units a thread's registers are sized for
// (block.cuh compiles its kernels for softmax_resident_elems whatever the plan uses), __launch_bounds__ minimum
// blocks (register caps), cache hints on the loads of dy / y / x and the stores of dx / y, the order of a
// thread's loads, and 8- against 16-byte accesses. Each variant kernel is a copy of the library's kernel with one
// knob as a template parameter and the library's own device code for the rest (ResidentSlice, row_allreduce,
// resident_forward, WarpShape and the warp row caches, LoadDependence, the epilogues), so the arithmetic is the
// library's: a variant that gives each thread the same elements in the same order is bitwise equal to it (marked
// exact); one that moves elements between threads (another CTA size in the block kernel, 8-byte accesses, a
// block for a warp) sums the row's terms in another order and is equal within float rounding.
//
// A shared library for softmax_bwd_diag.py (ctypes), one shape a build, both epilogues:
//
//   nvcc -std=c++17 -O3 -arch=sm_90 --expt-relaxed-constexpr -Iinclude -Xcompiler -fPIC -shared \
//        -DDIAG_PART=<0..10> -o libsmdiag_<part>.so bench/repro/softmax_bwd_diag.cu
//
// DIAG_PART (direction, dtype, D): 0-2 backward bf16 D = 1024 / 4096 / 16384, 3-5 backward f16 the same,
// 6 backward f32 D = 1024, 7 forward bf16 D = 1024, 8 forward f16 D = 1024, 9 forward f32 D = 4096,
// 10 forward f32 D = 1024. repro_common.cuh is not used: its helpers time and check standalone programs, and
// here the driver times and checks in Python against torch's ops.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "fastact/softmax/launch.cuh"

#ifndef DIAG_PART
#define DIAG_PART 0
#endif

namespace {

using namespace fastact;
using namespace fastact::softmax_impl;

// A part's direction, dtype (0 bfloat16, 1 float16, 2 float32) and D.
constexpr bool part_backward(int p) { return p <= 6; }
constexpr int part_dtype(int p) { return p <= 2 ? 0 : p <= 5 ? 1 : p == 6 ? 2 : p == 7 ? 0 : p == 8 ? 1 : 2; }
constexpr int part_dim(int p) {
  return p <= 5 ? (p % 3 == 0 ? 1024 : p % 3 == 1 ? 4096 : 16384) : p == 9 ? 4096 : 1024;
}

constexpr int kPart = DIAG_PART;
static_assert(kPart >= 0 && kPart <= 10, "DIAG_PART: 0..10");
constexpr bool kBackward = part_backward(kPart);
constexpr int kDtype = part_dtype(kPart);
constexpr int kDim = part_dim(kPart);
using T = std::conditional_t<kDtype == 0, __nv_bfloat16, std::conditional_t<kDtype == 1, __half, float>>;
constexpr int kW = softmax_vec_width(sizeof(T), sizeof(T));  // 128-bit units: 8 (16-bit), 4 (float)

// Return codes besides cudaError_t's.
constexpr int kBadShape = 1000;      // the variant does not take this D
constexpr int kPlanDiffers = 1001;   // the dispatcher's plan is not the one this file's "library" row assumes

// ------------------------------------------------------------------------------------------------
// Loads and stores with cache hints. kLdLib / kStLib: what the library does at that spot (load_vector /
// store_vector: through const __restrict__ pointers the loads compile to ld.global.nc; the warp forward's loads
// are ld.global.cg where a lane reads several units, WarpShape::kLoadL2). The others as inline PTX, 16- or
// 8-byte units: .cg (L2 only), .cs (evict-first, streaming), .nc.L1::no_allocate, .nc.L2::256B (a 256-byte L2
// fetch a miss); stores .cs, or an L2 evict_first cache policy (createpolicy, st.global.L2::cache_hint).
enum Ld : int { kLdLib, kLdCg, kLdCs, kLdNoL1, kLdL2_256, kLdEvictLast, kLdEvictFirst };
// kLdEvictLast / kLdEvictFirst: what Triton emits for tl.load(..., eviction_policy='evict_last' / 'evict_first') on
// sm_90, the library's load_vector_evict (vec.cuh; 16-byte units only).
enum St : int { kStLib, kStCs, kStEvictFirst };

template <int kLd, typename E, int N>
__device__ __forceinline__ AlignedVector<E, N> ld(const E* p) {
  constexpr int kBytes = int(sizeof(E)) * N;
  if constexpr (kLd == kLdLib) {
    return load_vector<E, N>(p);
  } else if constexpr (kLd == kLdEvictLast || kLd == kLdEvictFirst) {
    static_assert(kBytes == 16, "policy loads: 16-byte units");
    return load_vector_evict<kLd == kLdEvictLast ? Evict::kLast : Evict::kFirst, E, N>(p);
  } else {
    static_assert(kBytes == 16 || kBytes == 8, "hinted loads: 8- or 16-byte units");
    AlignedVector<E, N> v;
    if constexpr (kBytes == 16) {
      uint4 u;
#define DIAG_LD4(q) \
  asm volatile("ld.global" q ".v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w) : "l"(p))
      if constexpr (kLd == kLdCg) DIAG_LD4(".cg");
      else if constexpr (kLd == kLdCs) DIAG_LD4(".cs");
      else if constexpr (kLd == kLdNoL1) DIAG_LD4(".nc.L1::no_allocate");
      else DIAG_LD4(".nc.L2::256B");
#undef DIAG_LD4
      memcpy(&v, &u, 16);
    } else {
      uint2 u;
#define DIAG_LD2(q) asm volatile("ld.global" q ".v2.u32 {%0, %1}, [%2];" : "=r"(u.x), "=r"(u.y) : "l"(p))
      if constexpr (kLd == kLdCg) DIAG_LD2(".cg");
      else if constexpr (kLd == kLdCs) DIAG_LD2(".cs");
      else if constexpr (kLd == kLdNoL1) DIAG_LD2(".nc.L1::no_allocate");
      else DIAG_LD2(".nc.L2::256B");
#undef DIAG_LD2
      memcpy(&v, &u, 8);
    }
    return v;
  }
}

template <int kSt, typename E, int N>
__device__ __forceinline__ void st(E* p, const AlignedVector<E, N>& v) {
  constexpr int kBytes = int(sizeof(E)) * N;
  if constexpr (kSt == kStLib) {
    store_vector<E, N>(p, v);
  } else {
    static_assert(kBytes == 16 || kBytes == 8, "hinted stores: 8- or 16-byte units");
    uint64_t policy = 0;
    if constexpr (kSt == kStEvictFirst) asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    if constexpr (kBytes == 16) {
      uint4 u;
      memcpy(&u, &v, 16);
      if constexpr (kSt == kStCs)
        asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(u.x), "r"(u.y), "r"(u.z), "r"(u.w)
                     : "memory");
      else
        asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(p), "r"(u.x), "r"(u.y),
                     "r"(u.z), "r"(u.w), "l"(policy)
                     : "memory");
    } else {
      uint2 u;
      memcpy(&u, &v, 8);
      if constexpr (kSt == kStCs)
        asm volatile("st.global.cs.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(u.x), "r"(u.y) : "memory");
      else
        asm volatile("st.global.L2::cache_hint.v2.u32 [%0], {%1, %2}, %3;" ::"l"(p), "r"(u.x), "r"(u.y), "l"(policy)
                     : "memory");
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Backward, warp kernel (softmax/warp.cuh softmax_warp_bwd_kernel): a warp a row (kTpr = 32, as the library's
// shape at D = 1024 in 16- and 8-byte units), kThreads a CTA (the library: kWarpBlockThreads = 128, 4 rows).
// kGrouped: a lane loads all its dy units, then all its y units (the library alternates dy[j], y[j]).
template <typename in_t, typename out_t, typename Epi, int kLog2, int kVec, int kThreads, int kLd, int kSt,
          bool kGrouped>
__device__ __forceinline__ void warp_bwd_body(const out_t* __restrict__ grad_output, const out_t* __restrict__ output,
                                              in_t* __restrict__ grad_input, int64_t rows, int dim, Epi epi,
                                              int64_t first_block) {
  using A = acc_t<out_t>;
  constexpr int kTpr = kWarpSize;
  constexpr int kVecs = (1 << kLog2) / kTpr / kVec;
  constexpr int kRowsPerBlock = kThreads / kTpr;
  static_assert(kVecs >= 1 && kVecs < 16, "whole units a lane, no filled slots (WarpShape::kFill)");
  const int lane_in_row = threadIdx.x % kTpr;
  const int64_t row = (first_block + blockIdx.x) * kRowsPerBlock + threadIdx.x / kTpr;
  const int nvalid = row < rows ? warp_valid<kVecs, kTpr, kVec>(lane_in_row, dim) : 0;
  constexpr int kStep = kTpr * kVec;
  const int64_t offset = (row < rows ? row : 0) * int64_t(dim) + lane_in_row * kVec;

  AlignedVector<out_t, kVec> dy[kVecs], yv[kVecs];
  if constexpr (kGrouped) {
#pragma unroll
    for (int j = 0; j < kVecs; ++j)
      if (j < nvalid) dy[j] = ld<kLd, out_t, kVec>(grad_output + offset + j * kStep);
#pragma unroll
    for (int j = 0; j < kVecs; ++j)
      if (j < nvalid) yv[j] = ld<kLd, out_t, kVec>(output + offset + j * kStep);
  } else {
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (j < nvalid) {
        dy[j] = ld<kLd, out_t, kVec>(grad_output + offset + j * kStep);
        yv[j] = ld<kLd, out_t, kVec>(output + offset + j * kStep);
      }
    }
  }
  A dot = A(0);
  LoadDependence outputs{opaque_zero(dim)};
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < nvalid) {
      A g[kVec], o[kVec];
      to_acc(dy[j], g);
      to_acc(yv[j], o);
#pragma unroll
      for (int k = 0; k < kVec; ++k) dot += epi.backward_term(g[k], o[k]);
      if constexpr (output_loads_with_reduction<Epi, out_t>()) outputs.take(yv[j]);
    }
  }
  dot = outputs.apply(dot);
  dot = warp_reduce<kTpr>(dot, SumOp<A>());
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < nvalid) {
      A g[kVec], o[kVec];
      to_acc(dy[j], g);
      to_acc(yv[j], o);
#pragma unroll
      for (int k = 0; k < kVec; ++k) g[k] = epi.backward(g[k], o[k], dot);
      st<kSt, in_t, kVec>(grad_input + offset + j * kStep, from_acc<in_t>(g));
    }
  }
}

// The same body under the library's bounds (__launch_bounds__(kThreads), no minimum) or with a minimum of
// kMinBlocks CTAs an SM (a register cap).
template <typename in_t, typename out_t, typename Epi, int kLog2, int kVec, int kThreads, int kLd, int kSt,
          bool kGrouped>
__global__ __launch_bounds__(kThreads) void warp_bwd_kernel(const out_t* __restrict__ grad_output,
                                                            const out_t* __restrict__ output,
                                                            in_t* __restrict__ grad_input, int64_t rows, int dim,
                                                            Epi epi, int64_t first_block) {
  warp_bwd_body<in_t, out_t, Epi, kLog2, kVec, kThreads, kLd, kSt, kGrouped>(grad_output, output, grad_input, rows,
                                                                             dim, epi, first_block);
}
template <typename in_t, typename out_t, typename Epi, int kLog2, int kVec, int kThreads, int kMinBlocks, int kLd,
          int kSt, bool kGrouped>
__global__ __launch_bounds__(kThreads, kMinBlocks) void warp_bwd_kernel_min(const out_t* __restrict__ grad_output,
                                                                            const out_t* __restrict__ output,
                                                                            in_t* __restrict__ grad_input,
                                                                            int64_t rows, int dim, Epi epi,
                                                                            int64_t first_block) {
  warp_bwd_body<in_t, out_t, Epi, kLog2, kVec, kThreads, kLd, kSt, kGrouped>(grad_output, output, grad_input, rows,
                                                                             dim, epi, first_block);
}

// ------------------------------------------------------------------------------------------------
// Backward, block kernel (softmax/block.cuh softmax_block_bwd_kernel and resident_backward): a CTA a row, the
// thread's units j * T + t of dy and y in registers, compiled for kVecs units (the library: block_bwd_elems /
// kVec = 4 in 16-bit, 4 in float, whatever the plan's threads leave valid), under __launch_bounds__(kBound,
// kMinBlocks) (the library: (1024, 1)). kVec: 8- or 16-byte units. Stores through st<kSt>; otherwise
// resident_backward's body with no extra units.
template <typename Epi, int kVec, int kVecs, int kSt, typename A, typename out_t, typename in_t>
__device__ __forceinline__ void diag_resident_backward(const AlignedVector<out_t, kVec> (&dy)[kVecs],
                                                       const AlignedVector<out_t, kVec> (&yv)[kVecs],
                                                       const ResidentSlice& s, unsigned zero, in_t* __restrict__ dxr,
                                                       const Epi& epi, RowScratch<A>& scratch, int& round,
                                                       int cluster) {
  A dot = A(0);
  LoadDependence outputs{zero};
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < s.nvalid) {
      A g[kVec], o[kVec];
      to_acc(dy[j], g);
      to_acc(yv[j], o);
#pragma unroll
      for (int k = 0; k < kVec; ++k) dot += epi.backward_term(g[k], o[k]);
      if constexpr (output_loads_with_reduction<Epi, out_t>()) outputs.take(yv[j]);
    }
  }
  dot = outputs.apply(dot);
  dot = row_allreduce(dot, SumOp<A>(), scratch, round, cluster);
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < s.nvalid) {
      A g[kVec], o[kVec];
      to_acc(dy[j], g);
      to_acc(yv[j], o);
#pragma unroll
      for (int k = 0; k < kVec; ++k) g[k] = epi.backward(g[k], o[k], dot);
      st<kSt, in_t, kVec>(dxr + j * s.step, from_acc<in_t>(g));
    }
  }
}

template <typename in_t, typename out_t, typename Epi, int kVec, int kVecs, int kLd, int kSt, bool kGrouped>
__device__ __forceinline__ void block_bwd_body(const out_t* __restrict__ grad_output, const out_t* __restrict__ output,
                                               in_t* __restrict__ grad_input, int64_t dim, int cluster, Epi epi,
                                               int64_t first_row) {
  using A = acc_t<out_t>;
  __shared__ RowScratch<A> scratch;
  exchange_init(scratch.bar, cluster);
  const ResidentSlice s = resident_slice<kVec, kVecs>(dim, cluster);
  const int64_t row = first_row + blockIdx.x / cluster;
  const int64_t offset = row * dim + s.first;
  int round = 0;
  AlignedVector<out_t, kVec> dy[kVecs], yv[kVecs];
  if constexpr (kGrouped) {
#pragma unroll
    for (int j = 0; j < kVecs; ++j)
      if (j < s.nvalid) dy[j] = ld<kLd, out_t, kVec>(grad_output + offset + j * s.step);
#pragma unroll
    for (int j = 0; j < kVecs; ++j)
      if (j < s.nvalid) yv[j] = ld<kLd, out_t, kVec>(output + offset + j * s.step);
  } else {
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (j < s.nvalid) {
        dy[j] = ld<kLd, out_t, kVec>(grad_output + offset + j * s.step);
        yv[j] = ld<kLd, out_t, kVec>(output + offset + j * s.step);
      }
    }
  }
  diag_resident_backward<Epi, kVec, kVecs, kSt, A>(dy, yv, s, opaque_zero(dim), grad_input + offset, epi, scratch,
                                                   round, cluster);
}

template <typename in_t, typename out_t, typename Epi, int kVec, int kVecs, int kBound, int kLd, int kSt,
          bool kGrouped>
__global__ __launch_bounds__(kBound) void block_bwd_kernel(const out_t* __restrict__ grad_output,
                                                           const out_t* __restrict__ output,
                                                           in_t* __restrict__ grad_input, int64_t dim, int cluster,
                                                           Epi epi, int64_t first_row) {
  block_bwd_body<in_t, out_t, Epi, kVec, kVecs, kLd, kSt, kGrouped>(grad_output, output, grad_input, dim, cluster, epi,
                                                                    first_row);
}
template <typename in_t, typename out_t, typename Epi, int kVec, int kVecs, int kBound, int kMinBlocks, int kLd,
          int kSt, bool kGrouped>
__global__ __launch_bounds__(kBound, kMinBlocks) void block_bwd_kernel_min(const out_t* __restrict__ grad_output,
                                                                           const out_t* __restrict__ output,
                                                                           in_t* __restrict__ grad_input, int64_t dim,
                                                                           int cluster, Epi epi, int64_t first_row) {
  block_bwd_body<in_t, out_t, Epi, kVec, kVecs, kLd, kSt, kGrouped>(grad_output, output, grad_input, dim, cluster, epi,
                                                                    first_row);
}

// Backward in two passes over the row, as torch.compile's Triton kernel for these cells (inductor's looped
// reduction, read from TORCH_LOGS=output_code in the forty-first session: pass 1 loads dy and y with
// eviction_policy='evict_last' and sums dy * y; pass 2 loads them again with 'evict_first' and writes dx; XBLOCK 1,
// 16 warps at D = 4096, 32 at 16384). Here: pass 1 loads the thread's units of dy (and of y where the term reads
// it) with kLd1 and sums the term; the row all-reduce; pass 2 loads dy and y again with kLd2 (from L1 or L2) and
// writes dx. Nothing the thread loaded is live across the all-reduce. Sums in the library's order: exact.
template <typename in_t, typename out_t, typename Epi, int kVec, int kVecs, int kLd1, int kLd2, int kSt>
__device__ __forceinline__ void reload_bwd_body(const out_t* __restrict__ grad_output, const out_t* __restrict__ output,
                                                in_t* __restrict__ grad_input, int64_t dim, Epi epi,
                                                int64_t first_row) {
  using A = acc_t<out_t>;
  __shared__ RowScratch<A> scratch;
  exchange_init(scratch.bar, 1);
  const ResidentSlice s = resident_slice<kVec, kVecs>(dim, 1);
  const int64_t offset = (first_row + blockIdx.x) * dim + s.first;
  const out_t* dyr = grad_output + offset;
  const out_t* yr = output + offset;
  int round = 0;
  A dot = A(0);
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < s.nvalid) {
      A g[kVec], o[kVec];
      to_acc(ld<kLd1, out_t, kVec>(dyr + j * s.step), g);
      if constexpr (Epi::kTermUsesOutput) {
        to_acc(ld<kLd1, out_t, kVec>(yr + j * s.step), o);
      } else {
#pragma unroll
        for (int k = 0; k < kVec; ++k) o[k] = A(0);
      }
#pragma unroll
      for (int k = 0; k < kVec; ++k) dot += epi.backward_term(g[k], o[k]);
    }
  }
  dot = row_allreduce(dot, SumOp<A>(), scratch, round, 1);
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < s.nvalid) {
      A g[kVec], o[kVec];
      to_acc(ld<kLd2, out_t, kVec>(dyr + j * s.step), g);
      to_acc(ld<kLd2, out_t, kVec>(yr + j * s.step), o);
#pragma unroll
      for (int k = 0; k < kVec; ++k) g[k] = epi.backward(g[k], o[k], dot);
      st<kSt, in_t, kVec>(grad_input + offset + j * s.step, from_acc<in_t>(g));
    }
  }
}
template <typename in_t, typename out_t, typename Epi, int kVec, int kVecs, int kBound, int kLd1, int kLd2, int kSt>
__global__ __launch_bounds__(kBound) void reload_bwd_kernel(const out_t* __restrict__ grad_output,
                                                            const out_t* __restrict__ output,
                                                            in_t* __restrict__ grad_input, int64_t dim, int /*cluster*/,
                                                            Epi epi, int64_t first_row) {
  reload_bwd_body<in_t, out_t, Epi, kVec, kVecs, kLd1, kLd2, kSt>(grad_output, output, grad_input, dim, epi,
                                                                  first_row);
}

// Forward in two passes over the row, as torch.compile's Triton kernel for f32 rows of 4096 (an online max / sum
// over x loaded with eviction_policy='evict_last', then x again with 'evict_first' and the outputs;
// bench/results/h100-2026-11-27-s41-inductor-kernels.txt): pass 1 loads the thread's units with kLd1, its max and
// its sum of exp(x - max); the row's (max, sum) all-reduce; pass 2 loads them again with kLd2 and writes
// epi.forward through KeepInput (exp computed in both passes, as the library's shared-memory units).
template <typename in_t, typename out_t, typename Epi, int kVec, int kVecs, int kLd1, int kLd2, int kSt>
__device__ __forceinline__ void reload_fwd_body(const in_t* __restrict__ x, out_t* __restrict__ y, int64_t dim,
                                                Epi epi, int64_t first_row) {
  using A = acc_t<out_t>;
  using Raw = KeepInput<Epi>;
  __shared__ RowScratch<MaxSum<A>> scratch;
  exchange_init(scratch.bar, 1);
  const ResidentSlice s = resident_slice<kVec, kVecs>(dim, 1);
  const int64_t offset = (first_row + blockIdx.x) * dim + s.first;
  int round = 0;
  A v[kVecs][kVec];
  A m = neg_inf<A>();
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < s.nvalid) {
      to_acc(ld<kLd1, in_t, kVec>(x + offset + j * s.step), v[j]);
#pragma unroll
      for (int k = 0; k < kVec; ++k) m = MaxOp<A>()(m, v[j][k]);
    }
  }
  const A base = max_base(m);
  A sum = A(0);
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < s.nvalid) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) sum += Raw::term(v[j][k], base);
    }
  }
  const MaxSum<A> stats = row_allreduce(MaxSum<A>{m, sum}, OnlineOp<A>(), scratch, round, 1);
  const A c = epi.row_constant(stats.sum);
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < s.nvalid) {
      A w[kVec], o[kVec];
      to_acc(ld<kLd2, in_t, kVec>(x + offset + j * s.step), w);
#pragma unroll
      for (int k = 0; k < kVec; ++k) o[k] = Raw::out(epi, w[k], stats.max, c);
      st<kSt, out_t, kVec>(y + offset + j * s.step, from_acc<out_t>(o));
    }
  }
}
template <typename in_t, typename out_t, typename Epi, int kVec, int kVecs, int kBound, int kLd1, int kLd2, int kSt>
__global__ __launch_bounds__(kBound) void reload_fwd_kernel(const in_t* __restrict__ x, out_t* __restrict__ y,
                                                            int64_t dim, Epi epi, int64_t first_row) {
  reload_fwd_body<in_t, out_t, Epi, kVec, kVecs, kLd1, kLd2, kSt>(x, y, dim, epi, first_row);
}

// ------------------------------------------------------------------------------------------------
// Forward, warp kernel (softmax_warp_fwd_kernel): the library's WarpShape (kTpr, kVecs, raw or converted cache),
// kThreads a CTA; loads as the library's (kLdLib: .cg where a lane reads several units) or hinted.
template <typename in_t, typename out_t, typename Epi, int kLog2, int kVec, int kThreads, int kLd, int kSt>
__device__ __forceinline__ void warp_fwd_body(const in_t* __restrict__ x, out_t* __restrict__ y, int64_t rows,
                                              int dim, int64_t row_stride, Epi epi, int64_t first_block) {
  using A = acc_t<out_t>;
  using S = WarpShape<kLog2, kVec, false, int(sizeof(out_t))>;
  constexpr bool kRaw = S::template kRaw<in_t, A>;
  using Row = std::conditional_t<kRaw, WarpRawRow<in_t, A, Epi, kVec, S::kVecs, S::kFill>,
                                 WarpConvertedRow<in_t, A, Epi, kVec, S::kVecs, S::kFill>>;
  static_assert(!S::kFill, "no filled slots in the shapes measured");
  constexpr int kRowsPerBlock = kThreads / S::kTpr;
  const int lane_in_row = threadIdx.x % S::kTpr;
  const int64_t row = (first_block + blockIdx.x) * kRowsPerBlock + threadIdx.x / S::kTpr;
  const int nvalid = row < rows ? warp_valid<S::kVecs, S::kTpr, kVec>(lane_in_row, dim) : 0;
  const int first = lane_in_row * kVec;
  constexpr int kStep = S::kTpr * kVec;
  Row slice;
  const in_t* xr = x + (row < rows ? row : 0) * row_stride + first;
  if constexpr (kLd == kLdLib) {
    slice.template load<S::kLoadL2>(xr, kStep, nvalid);
  } else {
#pragma unroll
    for (int j = 0; j < S::kVecs; ++j) {
      if (j < nvalid) {
        if constexpr (kRaw) {
          slice.r[j] = ld<kLd, in_t, kVec>(xr + j * kStep);
        } else {
          to_acc(ld<kLd, in_t, kVec>(xr + j * kStep), slice.v[j]);
        }
      }
    }
  }
  const A m = warp_reduce<S::kTpr>(slice.lane_max(nvalid), MaxOp<A>());
  const A s = warp_reduce<S::kTpr>(slice.keep_and_sum(m, phase_count<S::kFill>(nvalid)), SumOp<A>());
  const A c = epi.row_constant(s);
  out_t* yr = y + (row < rows ? row : 0) * int64_t(dim) + first;
  const int nstore = phase_count<S::kFill>(nvalid);
#pragma unroll
  for (int j = 0; j < S::kVecs; ++j) {
    if (j < nstore) {
      A o[kVec];
      slice.out(epi, j, m, c, o);
      st<kSt, out_t, kVec>(yr + j * kStep, from_acc<out_t>(o));
    }
  }
}

template <typename in_t, typename out_t, typename Epi, int kLog2, int kVec, int kThreads, int kLd, int kSt>
__global__ __launch_bounds__(kThreads) void warp_fwd_kernel(const in_t* __restrict__ x, out_t* __restrict__ y,
                                                            int64_t rows, int dim, int64_t row_stride, Epi epi,
                                                            int64_t first_block) {
  warp_fwd_body<in_t, out_t, Epi, kLog2, kVec, kThreads, kLd, kSt>(x, y, rows, dim, row_stride, epi, first_block);
}
template <typename in_t, typename out_t, typename Epi, int kLog2, int kVec, int kThreads, int kMinBlocks, int kLd,
          int kSt>
__global__ __launch_bounds__(kThreads, kMinBlocks) void warp_fwd_kernel_min(const in_t* __restrict__ x,
                                                                            out_t* __restrict__ y, int64_t rows,
                                                                            int dim, int64_t row_stride, Epi epi,
                                                                            int64_t first_block) {
  warp_fwd_body<in_t, out_t, Epi, kLog2, kVec, kThreads, kLd, kSt>(x, y, rows, dim, row_stride, epi, first_block);
}

// ------------------------------------------------------------------------------------------------
// Forward, block kernel (softmax_block_fwd_kernel, aligned rows, converted cache): compiled for kVecs units
// (the library: block_fwd_elems / kVec = 8 in float), loads through ld<kLd>; kSt == kStLib: the library's
// resident_forward; else diag_resident_forward, its body with no extra units and stores through st<kSt>.
template <typename Epi, int kVec, int kVecs, int kSt, typename A, typename out_t>
__device__ __forceinline__ void diag_resident_forward(A (&v)[kVecs][kVec], const ResidentSlice& s,
                                                      out_t* __restrict__ yr, const Epi& epi,
                                                      RowScratch<MaxSum<A>>& scratch, int& round, int cluster) {
  using Cache = ForwardCache<Epi>;
  A m = neg_inf<A>();
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < s.nvalid) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) m = MaxOp<A>()(m, v[j][k]);
    }
  }
  const A base = max_base(m);
  A sum = A(0);
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < s.nvalid) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        v[j][k] = Cache::keep(v[j][k], base);
        sum += Cache::term(v[j][k], base);
      }
    }
  }
  const MaxSum<A> row_stats = row_allreduce(MaxSum<A>{m, sum}, OnlineOp<A>(), scratch, round, cluster);
  const A c = epi.row_constant(row_stats.sum);
  const A f = Cache::factor(m, row_stats.max, c);
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < s.nvalid) {
      A o[kVec];
#pragma unroll
      for (int k = 0; k < kVec; ++k) o[k] = Cache::out(epi, v[j][k], row_stats.max, f);
      st<kSt, out_t, kVec>(yr + j * s.step, from_acc<out_t>(o));
    }
  }
}

template <typename in_t, typename out_t, typename Epi, int kVec, int kVecs, int kLd, int kSt>
__device__ __forceinline__ void block_fwd_body(const in_t* __restrict__ x, out_t* __restrict__ y, int64_t dim,
                                               int64_t row_stride, int cluster, Epi epi, int64_t first_row) {
  using A = acc_t<out_t>;
  __shared__ RowScratch<MaxSum<A>> scratch;
  exchange_init(scratch.bar, cluster);
  const ResidentSlice s = resident_slice<kVec, kVecs>(dim, cluster);
  const int64_t row = first_row + blockIdx.x / cluster;
  const in_t* xr = x + row * row_stride + s.first;
  out_t* yr = y + row * dim + s.first;
  int round = 0;
  A v[kVecs][kVec];
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < s.nvalid) to_acc(ld<kLd, in_t, kVec>(xr + j * s.step), v[j]);
  }
  if constexpr (kSt == kStLib) {
    resident_forward<Epi, kVec, kVecs>(v, s, yr, epi, scratch, round, cluster);
  } else {
    diag_resident_forward<Epi, kVec, kVecs, kSt>(v, s, yr, epi, scratch, round, cluster);
  }
}

template <typename in_t, typename out_t, typename Epi, int kVec, int kVecs, int kBound, int kLd, int kSt>
__global__ __launch_bounds__(kBound) void block_fwd_kernel(const in_t* __restrict__ x, out_t* __restrict__ y,
                                                           int64_t dim, int64_t row_stride, int cluster, Epi epi,
                                                           int64_t first_row) {
  block_fwd_body<in_t, out_t, Epi, kVec, kVecs, kLd, kSt>(x, y, dim, row_stride, cluster, epi, first_row);
}
template <typename in_t, typename out_t, typename Epi, int kVec, int kVecs, int kBound, int kMinBlocks, int kLd,
          int kSt>
__global__ __launch_bounds__(kBound, kMinBlocks) void block_fwd_kernel_min(const in_t* __restrict__ x,
                                                                           out_t* __restrict__ y, int64_t dim,
                                                                           int64_t row_stride, int cluster, Epi epi,
                                                                           int64_t first_row) {
  block_fwd_body<in_t, out_t, Epi, kVec, kVecs, kLd, kSt>(x, y, dim, row_stride, cluster, epi, first_row);
}

// ------------------------------------------------------------------------------------------------
// The variants: a launcher and the kernel's registers, local memory and CTAs an SM (occupancy query).

// info[0..3]: registers, local (spill) bytes a thread, threads a CTA, CTAs an SM.
template <auto kKernel>
int kernel_info(int threads, int* info) {
  cudaFuncAttributes a{};
  cudaError_t e = cudaFuncGetAttributes(&a, kKernel);
  int per_sm = 0;
  if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, threads, 0);
  info[0] = a.numRegs;
  info[1] = static_cast<int>(a.localSizeBytes);
  info[2] = threads;
  info[3] = per_sm;
  return static_cast<int>(e);
}

// Warp kernel, backward or forward: kThreads a CTA (32 / kTpr rows a warp), kMinBlocks 0 for the library's
// bounds, kVec units (8- or 16-byte).
template <bool kBwd, int kLog2, int kVec, int kThreads, int kMinBlocks, int kLd, int kSt, bool kGrouped = false>
struct WarpV {
  template <typename Epi>
  static constexpr auto kernel() {
    if constexpr (kBwd) {
      if constexpr (kMinBlocks == 0) return &warp_bwd_kernel<T, T, Epi, kLog2, kVec, kThreads, kLd, kSt, kGrouped>;
      else return &warp_bwd_kernel_min<T, T, Epi, kLog2, kVec, kThreads, kMinBlocks, kLd, kSt, kGrouped>;
    } else {
      static_assert(!kGrouped, "one input");
      if constexpr (kMinBlocks == 0) return &warp_fwd_kernel<T, T, Epi, kLog2, kVec, kThreads, kLd, kSt>;
      else return &warp_fwd_kernel_min<T, T, Epi, kLog2, kVec, kThreads, kMinBlocks, kLd, kSt>;
    }
  }
  static constexpr int kRowsPerBlock =
      kThreads / (kBwd ? kWarpSize : WarpShape<kLog2, kVec, false, int(sizeof(T))>::kTpr);
  template <typename Epi>
  static int launch(const void* a, const void* b, void* o, int64_t rows, int64_t dim, cudaStream_t s) {
    if (dim > (int64_t(1) << kLog2) || dim <= (int64_t(1) << kLog2) / 2 || dim % kVec != 0) return kBadShape;
    const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
    constexpr auto kKernel = kernel<Epi>();
    if constexpr (kBwd) {
      return static_cast<int>(launch_items<kKernel>(blocks, kThreads, 0, 1, s, static_cast<const T*>(a),
                                                    static_cast<const T*>(b), static_cast<T*>(o), rows,
                                                    static_cast<int>(dim), Epi{}));
    } else {
      (void)b;
      return static_cast<int>(launch_items<kKernel>(blocks, kThreads, 0, 1, s, static_cast<const T*>(a),
                                                    static_cast<T*>(o), rows, static_cast<int>(dim), dim, Epi{}));
    }
  }
  template <typename Epi>
  static int info(int64_t /*rows*/, int64_t /*dim*/, int* out) {
    return kernel_info<kernel<Epi>()>(kThreads, out);
  }
};

// Block kernel, backward or forward: a CTA of dim / (kUnitsUsed * kVec) threads a row (kUnitsUsed units a thread
// valid, kVecs compiled), __launch_bounds__(kBound, kMinBlocks) (kMinBlocks 0: kBound alone).
template <bool kBwd, int kVec, int kVecs, int kUnitsUsed, int kBound, int kMinBlocks, int kLd, int kSt,
          bool kGrouped = false>
struct BlockV {
  static_assert(kUnitsUsed >= 1 && kUnitsUsed <= kVecs, "units used <= units compiled");
  template <typename Epi>
  static constexpr auto kernel() {
    if constexpr (kBwd) {
      if constexpr (kMinBlocks == 0) return &block_bwd_kernel<T, T, Epi, kVec, kVecs, kBound, kLd, kSt, kGrouped>;
      else return &block_bwd_kernel_min<T, T, Epi, kVec, kVecs, kBound, kMinBlocks, kLd, kSt, kGrouped>;
    } else {
      static_assert(!kGrouped, "one input");
      if constexpr (kMinBlocks == 0) return &block_fwd_kernel<T, T, Epi, kVec, kVecs, kBound, kLd, kSt>;
      else return &block_fwd_kernel_min<T, T, Epi, kVec, kVecs, kBound, kMinBlocks, kLd, kSt>;
    }
  }
  static int threads(int64_t dim) {
    const int64_t per = int64_t(kUnitsUsed) * kVec;
    if (dim % per != 0) return -1;
    const int64_t t = dim / per;
    return t >= kWarpSize && t <= kBound && t % kWarpSize == 0 ? static_cast<int>(t) : -1;
  }
  template <typename Epi>
  static int launch(const void* a, const void* b, void* o, int64_t rows, int64_t dim, cudaStream_t s) {
    const int t = threads(dim);
    if (t < 0) return kBadShape;
    constexpr auto kKernel = kernel<Epi>();
    if constexpr (kBwd) {
      return static_cast<int>(launch_items<kKernel>(rows, t, 0, 1, s, static_cast<const T*>(a),
                                                    static_cast<const T*>(b), static_cast<T*>(o), dim, 1, Epi{}));
    } else {
      (void)b;
      return static_cast<int>(
          launch_items<kKernel>(rows, t, 0, 1, s, static_cast<const T*>(a), static_cast<T*>(o), dim, dim, 1, Epi{}));
    }
  }
  template <typename Epi>
  static int info(int64_t /*rows*/, int64_t dim, int* out) {
    const int t = threads(dim);
    if (t < 0) return kBadShape;
    return kernel_info<kernel<Epi>()>(t, out);
  }
};

// The two-pass kernels (reload_bwd_kernel, reload_fwd_kernel): a CTA of dim / (kVecs * kVec) threads a row,
// __launch_bounds__(kBound).
template <bool kBwd, int kVec, int kVecs, int kBound, int kLd1, int kLd2, int kSt = kStLib>
struct ReloadV {
  template <typename Epi>
  static constexpr auto kernel() {
    if constexpr (kBwd) return &reload_bwd_kernel<T, T, Epi, kVec, kVecs, kBound, kLd1, kLd2, kSt>;
    else return &reload_fwd_kernel<T, T, Epi, kVec, kVecs, kBound, kLd1, kLd2, kSt>;
  }
  static int threads(int64_t dim) { return BlockV<kBwd, kVec, kVecs, kVecs, kBound, 0, kLdLib, kStLib>::threads(dim); }
  template <typename Epi>
  static int launch(const void* a, const void* b, void* o, int64_t rows, int64_t dim, cudaStream_t s) {
    const int t = threads(dim);
    if (t < 0) return kBadShape;
    constexpr auto kKernel = kernel<Epi>();
    if constexpr (kBwd) {
      return static_cast<int>(launch_items<kKernel>(rows, t, 0, 1, s, static_cast<const T*>(a),
                                                    static_cast<const T*>(b), static_cast<T*>(o), dim, 1, Epi{}));
    } else {
      (void)b;
      return static_cast<int>(
          launch_items<kKernel>(rows, t, 0, 1, s, static_cast<const T*>(a), static_cast<T*>(o), dim, Epi{}));
    }
  }
  template <typename Epi>
  static int info(int64_t /*rows*/, int64_t dim, int* out) {
    const int t = threads(dim);
    if (t < 0) return kBadShape;
    return kernel_info<kernel<Epi>()>(t, out);
  }
};

// The library's launcher for the plan its dispatcher picks on this problem, as the torch op builds it
// (csrc/cuda/softmax_ops.cpp: a workspace offered, the backward's two-CTA probe); only the plan this shape is
// known to take (kWarp at log2 10, or vec without edges), else kPlanDiffers. The launchers are called directly
// (softmax/warp.cuh, softmax/vec.cuh) rather than through softmax_backward / softmax_forward, whose switch
// would compile every variant of the library into each of these builds.
struct LibraryV {
  template <typename Epi>
  static SoftmaxPlan plan(const void* a, const void* b, const void* o, int64_t rows, int64_t dim) {
    int device = 0;
    SoftmaxDeviceProps dev;
    if (cudaGetDevice(&device) != cudaSuccess || softmax_device_props(device, &dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return SoftmaxPlan{};
    }
    SoftmaxProblem p = kBackward ? softmax_backward_problem<T, T>(static_cast<const T*>(a), static_cast<const T*>(b),
                                                                  static_cast<const T*>(o), rows, dim, 1, dev)
                                 : softmax_forward_problem<T, T>(static_cast<const T*>(a), static_cast<const T*>(o),
                                                                 rows, dim, 1, dim, dev);
    p.workspace = true;
    p.term_uses_output = Epi::kTermUsesOutput;
    if (kBackward) p.bwd_two_cta_threads = softmax_impl::detail::block_backward_two_cta_threads<T, T, Epi>();
    return choose_softmax(p);
  }
  static bool warp_plan(const SoftmaxPlan& s) {  // the library's 128-thread blocks (not a deep device's forward)
    return s.variant == SoftmaxVariant::kWarp && s.mode == SoftmaxMode::kWarp && s.vec == kW && s.warp_log2 == 10 &&
           s.threads == kWarpBlockThreads && !s.packed;
  }
  static bool vec_plan(const SoftmaxPlan& s) {
    return s.variant == SoftmaxVariant::kVec && s.mode == SoftmaxMode::kResident && s.vec == kW && !s.edges &&
           !s.shifted && !s.raw && s.cluster == 1;
  }
  template <typename Epi>
  static int launch(const void* a, const void* b, void* o, int64_t rows, int64_t dim, cudaStream_t st) {
    const SoftmaxPlan s = plan<Epi>(a, b, o, rows, dim);
    const T* in0 = static_cast<const T*>(a);
    T* out = static_cast<T*>(o);
    if constexpr (kDim == 1024) {
      if (!warp_plan(s)) return kPlanDiffers;
      if constexpr (kBackward) {
        const T* y = static_cast<const T*>(b);
        return static_cast<int>(softmax_impl::detail::launch_warp_bwd<T, T, Epi, 10, kW>(in0, y, out, rows, dim, st));
      } else {
        return static_cast<int>(softmax_impl::detail::launch_warp_fwd<T, T, Epi, 10, kW>(in0, out, rows, dim, dim, st));
      }
    } else {
      if (!vec_plan(s)) return kPlanDiffers;
      if constexpr (kBackward) {
        return static_cast<int>(
            softmax_impl::detail::vec_backward<T, T, Epi>(in0, static_cast<const T*>(b), out, rows, dim, s, st));
      } else {
        return static_cast<int>(softmax_impl::detail::vec_forward<T, T, Epi>(in0, out, rows, dim, dim, s, st));
      }
    }
  }
  template <typename Epi>
  static int info(int64_t rows, int64_t dim, int* out) {
    const SoftmaxPlan s = plan<Epi>(nullptr, nullptr, nullptr, rows, dim);
    if constexpr (kDim == 1024) {
      if (!warp_plan(s)) return kPlanDiffers;
      if constexpr (kBackward) return kernel_info<&softmax_warp_bwd_kernel<T, T, Epi, 10, kW>>(s.threads, out);
      else return kernel_info<&softmax_warp_fwd_kernel<T, T, Epi, 10, kW, false, kWarpBlockThreads>>(s.threads, out);
    } else {
      if (!vec_plan(s)) return kPlanDiffers;
      if constexpr (kBackward) {
        if constexpr (Epi::kTermUsesOutput) {  // the two-pass rule (dispatch.h softmax_rows_two_pass) for softmax
          if (s.two_pass && int64_t(s.threads) * kW >= dim)
            return kernel_info<&softmax_block_bwd_two_pass_kernel<T, T, Epi, kW, 1>>(s.threads, out);
          if (s.two_pass) return kernel_info<&softmax_block_bwd_two_pass_kernel<T, T, Epi, kW, 2>>(s.threads, out);
        }
        return kernel_info<&softmax_block_bwd_kernel<T, T, Epi, kW>>(s.threads, out);
      }
      else return kernel_info<&softmax_block_fwd_kernel<T, T, Epi, kW>>(s.threads, out);
    }
  }
};

using LaunchFn = int (*)(const void*, const void*, void*, int64_t, int64_t, cudaStream_t);
using InfoFn = int (*)(int64_t, int64_t, int*);
struct Variant {
  const char* name;
  bool exact;  // each thread gets the library's elements in the library's order: bitwise its result
  LaunchFn launch[2];  // softmax, log_softmax
  InfoFn info[2];
};

template <typename K>
constexpr Variant V(const char* name, bool exact) {
  return {name,
          exact,
          {&K::template launch<math::SoftmaxEpilogue>, &K::template launch<math::LogSoftmaxEpilogue>},
          {&K::template info<math::SoftmaxEpilogue>, &K::template info<math::LogSoftmaxEpilogue>}};
}

constexpr bool B = kBackward;
constexpr int kW8 = kW / 2;  // 8-byte units

// What ptxas gives these kernels (nvcc 13.0, sm_90; -Xptxas -v, softmax / log_softmax): the 16-bit warp backward
// at D = 1024 48 / 48 registers (10 CTAs of 128 an SM), 40 with 12 CTAs (4-8 spill bytes); the 16-bit vec backward
// compiled for 4 units 60 / 57 (at D = 4096 its 256-thread CTAs use 2 of them: 4 CTAs an SM), sized for 2 units
// 40 / 36 (6 CTAs), 32 with a minimum of 8 (no spills); at D = 16384 (512 x 4 units) 2 CTAs an SM whatever the
// bounds, 3 only with spills; the float warp backward at D = 1024 78 / 79 (6 CTAs of 128); the float vec forward
// compiled for 8 units 64 (D = 4096: 256 threads, 4 units, 4 CTAs an SM), sized for 4 units 48 / 44 (5 CTAs).
//
// The tables, one a part. Row 0 is the library's launcher; the knobs change one thing each from the library's
// shape (its twin, rebuilt here, is row 1), except where a row says otherwise.
// Templated on the part, with conditions that depend on it, so that only the part's table is instantiated.
template <int P>
const Variant* variants(int* n) {
  constexpr bool kB = part_backward(P);
  constexpr int kD = part_dim(P);
  constexpr bool k16 = part_dtype(P) != 2;
  if constexpr (kB && kD == 1024 && k16) {
    // The library: warp, 128 threads (4 rows a CTA), a row a warp, 4 units of dy and of y a lane, 16 bytes.
    static const Variant v[] = {
        V<LibraryV>("library (warp, 128 thr = 4 rows/CTA)", true),
        V<WarpV<B, 10, kW, 128, 0, kLdLib, kStLib>>("warp 128 thr (library twin)", true),
        V<WarpV<B, 10, kW, 256, 0, kLdLib, kStLib>>("warp 256 thr (8 rows/CTA)", true),
        V<WarpV<B, 10, kW, 512, 0, kLdLib, kStLib>>("warp 512 thr (16 rows/CTA)", true),
        V<WarpV<B, 10, kW, 128, 12, kLdLib, kStLib>>("warp 128, min 12 CTAs/SM", true),
        V<WarpV<B, 10, kW, 128, 16, kLdLib, kStLib>>("warp 128, min 16 CTAs/SM", true),
        V<WarpV<B, 10, kW, 128, 0, kLdLib, kStLib, true>>("warp 128, loads dy then y", true),
        V<WarpV<B, 10, kW, 128, 0, kLdLib, kStCs>>("warp 128, st.cs dx", true),
        V<WarpV<B, 10, kW, 128, 0, kLdLib, kStEvictFirst>>("warp 128, st L2::evict_first dx", true),
        V<WarpV<B, 10, kW, 128, 0, kLdCs, kStLib>>("warp 128, ld.cs dy,y", true),
        V<WarpV<B, 10, kW, 128, 0, kLdNoL1, kStLib>>("warp 128, ld.nc.L1::no_allocate", true),
        V<WarpV<B, 10, kW, 128, 0, kLdL2_256, kStLib>>("warp 128, ld.nc.L2::256B", true),
        V<WarpV<B, 10, kW8, 128, 0, kLdLib, kStLib>>("warp 128, 8-byte units (8 a lane)", false),
        V<WarpV<B, 10, kW, 256, 0, kLdCs, kStCs>>("warp 256, ld.cs + st.cs", true),
        V<BlockV<B, kW, 2, 2, 64, 0, kLdLib, kStLib>>("block 64 thr x 2 units/row (vec shape)", false),
        V<BlockV<B, kW, 1, 1, 128, 0, kLdLib, kStLib>>("block 128 thr x 1 unit/row", false),
    };
    *n = int(sizeof(v) / sizeof(v[0]));
    return v;
  } else if constexpr (kB && kD == 4096) {
    // The library before the two-pass rule (forty-first session; still log_softmax's plan): vec, 256 threads x 2 units
    // of dy and y, the kernel compiled for 4 units, bounds (1024, 1). Row 1 is that kernel ("library twin"); the rows here are marked
    // as reordering, since softmax's auto plan now sums in another order (log_softmax's still bitwise).
    static const Variant v[] = {
        V<LibraryV>("library (auto: softmax two passes 512 x 1; log vec 256 x 2)", true),
        V<BlockV<B, kW, 4, 2, 1024, 1, kLdLib, kStLib>>("block 256 (library twin)", false),
        V<BlockV<B, kW, 2, 2, 1024, 1, kLdLib, kStLib>>("block 256, sized for 2 units", false),
        V<BlockV<B, kW, 2, 2, 256, 0, kLdLib, kStLib>>("block 256, sized 2, bounds 256", false),
        V<BlockV<B, kW, 2, 2, 256, 6, kLdLib, kStLib>>("block 256, sized 2, min 6 CTAs/SM", false),
        V<BlockV<B, kW, 2, 2, 256, 8, kLdLib, kStLib>>("block 256, sized 2, min 8 CTAs/SM", false),
        V<BlockV<B, kW, 4, 4, 1024, 1, kLdLib, kStLib>>("block 128 x 4 units", false),
        V<BlockV<B, kW, 1, 1, 1024, 1, kLdLib, kStLib>>("block 512 x 1 unit", false),
        V<BlockV<B, kW, 1, 1, 512, 4, kLdLib, kStLib>>("block 512 x 1, min 4 CTAs/SM", false),
        V<BlockV<B, kW, 4, 2, 1024, 1, kLdLib, kStLib, true>>("block 256, loads dy then y", false),
        V<BlockV<B, kW, 4, 2, 1024, 1, kLdLib, kStCs>>("block 256, st.cs dx", false),
        V<BlockV<B, kW, 4, 2, 1024, 1, kLdLib, kStEvictFirst>>("block 256, st L2::evict_first dx", false),
        V<BlockV<B, kW, 4, 2, 1024, 1, kLdCs, kStLib>>("block 256, ld.cs dy,y", false),
        V<BlockV<B, kW, 4, 2, 1024, 1, kLdNoL1, kStLib>>("block 256, ld.nc.L1::no_allocate", false),
        V<BlockV<B, kW8, 2, 2, 1024, 1, kLdLib, kStLib>>("block 512 x 2 units of 8 bytes", false),
        V<BlockV<B, kW, 2, 2, 256, 0, kLdCs, kStCs>>("block 256, sized 2, bounds 256, ld.cs+st.cs", false),
        V<ReloadV<B, kW, 1, 512, kLdEvictLast, kLdEvictFirst>>("two passes 512 x 1, evict_last / evict_first", false),
        V<ReloadV<B, kW, 1, 512, kLdLib, kLdLib>>("two passes 512 x 1, plain loads", false),
        V<ReloadV<B, kW, 2, 256, kLdEvictLast, kLdEvictFirst>>("two passes 256 x 2, evict_last / evict_first", false),
        V<ReloadV<B, kW, 2, 256, kLdLib, kLdLib>>("two passes 256 x 2, plain loads", false),
    };
    *n = int(sizeof(v) / sizeof(v[0]));
    return v;
  } else if constexpr (kB && kD == 16384) {
    // The library before the two-pass rule (still log_softmax's plan): vec, 512 threads x 4 units (all the kernel is
    // compiled for), bounds (1024, 1). Row 1 is that kernel ("library twin").
    static const Variant v[] = {
        V<LibraryV>("library (auto: softmax two passes 1024 x 2; log vec 512 x 4)", true),
        V<BlockV<B, kW, 4, 4, 1024, 1, kLdLib, kStLib>>("block 512 (library twin)", false),
        V<BlockV<B, kW, 4, 4, 512, 0, kLdLib, kStLib>>("block 512, bounds 512", false),
        V<BlockV<B, kW, 4, 4, 512, 3, kLdLib, kStLib>>("block 512, min 3 CTAs/SM", false),
        V<BlockV<B, kW, 2, 2, 1024, 1, kLdLib, kStLib>>("block 1024 x 2 units", false),
        V<BlockV<B, kW, 2, 2, 1024, 2, kLdLib, kStLib>>("block 1024 x 2, min 2 CTAs/SM", false),
        V<BlockV<B, kW, 8, 8, 256, 0, kLdLib, kStLib>>("block 256 x 8 units, bounds 256", false),
        V<BlockV<B, kW, 4, 4, 1024, 1, kLdLib, kStLib, true>>("block 512, loads dy then y", false),
        V<BlockV<B, kW, 4, 4, 1024, 1, kLdLib, kStCs>>("block 512, st.cs dx", false),
        V<BlockV<B, kW, 4, 4, 1024, 1, kLdLib, kStEvictFirst>>("block 512, st L2::evict_first dx", false),
        V<BlockV<B, kW, 4, 4, 1024, 1, kLdCs, kStLib>>("block 512, ld.cs dy,y", false),
        V<BlockV<B, kW, 4, 4, 1024, 1, kLdNoL1, kStLib>>("block 512, ld.nc.L1::no_allocate", false),
        V<BlockV<B, kW, 4, 4, 1024, 1, kLdL2_256, kStLib>>("block 512, ld.nc.L2::256B", false),
        V<BlockV<B, kW8, 4, 4, 1024, 1, kLdLib, kStLib>>("block 1024 x 4 units of 8 bytes", false),
        V<ReloadV<B, kW, 2, 1024, kLdEvictLast, kLdEvictFirst>>("two passes 1024 x 2, evict_last / evict_first", false),
        V<ReloadV<B, kW, 2, 1024, kLdLib, kLdLib>>("two passes 1024 x 2, plain loads", false),
        V<ReloadV<B, kW, 4, 512, kLdEvictLast, kLdEvictFirst>>("two passes 512 x 4, evict_last / evict_first", false),
        V<ReloadV<B, kW, 4, 512, kLdLib, kLdLib>>("two passes 512 x 4, plain loads", false),
    };
    *n = int(sizeof(v) / sizeof(v[0]));
    return v;
  } else if constexpr (kB) {  // float, D = 1024
    // The library: warp, 128 threads (4 rows a CTA), a row a warp, 8 units of dy and of y a lane, 16 bytes.
    static const Variant v[] = {
        V<LibraryV>("library (warp, 128 thr = 4 rows/CTA)", true),
        V<WarpV<B, 10, kW, 128, 0, kLdLib, kStLib>>("warp 128 thr (library twin)", true),
        V<WarpV<B, 10, kW, 256, 0, kLdLib, kStLib>>("warp 256 thr (8 rows/CTA)", true),
        V<WarpV<B, 10, kW, 512, 0, kLdLib, kStLib>>("warp 512 thr (16 rows/CTA)", true),
        V<WarpV<B, 10, kW, 128, 8, kLdLib, kStLib>>("warp 128, min 8 CTAs/SM", true),
        V<WarpV<B, 10, kW, 128, 0, kLdLib, kStLib, true>>("warp 128, loads dy then y", true),
        V<WarpV<B, 10, kW, 128, 0, kLdLib, kStCs>>("warp 128, st.cs dx", true),
        V<WarpV<B, 10, kW, 128, 0, kLdLib, kStEvictFirst>>("warp 128, st L2::evict_first dx", true),
        V<WarpV<B, 10, kW, 128, 0, kLdCs, kStLib>>("warp 128, ld.cs dy,y", true),
        V<WarpV<B, 10, kW, 128, 0, kLdNoL1, kStLib>>("warp 128, ld.nc.L1::no_allocate", true),
        V<BlockV<B, kW, 2, 2, 128, 0, kLdLib, kStLib>>("block 128 thr x 2 units/row (vec shape)", false),
        V<BlockV<B, kW, 1, 1, 256, 0, kLdLib, kStLib>>("block 256 thr x 1 unit/row", false),
        V<BlockV<B, kW, 4, 4, 64, 0, kLdLib, kStLib>>("block 64 thr x 4 units/row", false),
    };
    *n = int(sizeof(v) / sizeof(v[0]));
    return v;
  } else if constexpr (kD == 1024 && k16) {
    // The library: warp, 128 threads, a row a warp, 4 units of x a lane kept as loaded, .cg loads.
    static const Variant v[] = {
        V<LibraryV>("library (warp raw, 128 thr, ld.cg)", true),
        V<WarpV<B, 10, kW, 128, 0, kLdLib, kStLib>>("warp 128 (library twin)", true),
        V<WarpV<B, 10, kW, 256, 0, kLdLib, kStLib>>("warp 256 (8 rows/CTA)", true),
        V<WarpV<B, 10, kW, 512, 0, kLdLib, kStLib>>("warp 512 (16 rows/CTA)", true),
        V<WarpV<B, 10, kW, 128, 16, kLdLib, kStLib>>("warp 128, min 16 CTAs/SM", true),
        V<WarpV<B, 10, kW, 128, 0, kLdCs, kStLib>>("warp 128, ld.cs x", true),
        V<WarpV<B, 10, kW, 128, 0, kLdNoL1, kStLib>>("warp 128, ld.nc.L1::no_allocate x", true),
        V<WarpV<B, 10, kW, 128, 0, kLdL2_256, kStLib>>("warp 128, ld.nc.L2::256B x", true),
        V<WarpV<B, 10, kW, 128, 0, kLdLib, kStCs>>("warp 128, st.cs y", true),
        V<WarpV<B, 10, kW, 128, 0, kLdLib, kStEvictFirst>>("warp 128, st L2::evict_first y", true),
    };
    *n = int(sizeof(v) / sizeof(v[0]));
    return v;
  } else if constexpr (kD == 4096) {  // float forward
    // The library: vec, 256 threads x 4 units of x, the kernel compiled for 8 units, bounds (1024, 1).
    static const Variant v[] = {
        V<LibraryV>("library (vec, 256 thr x 4 units, sized for 8)", true),
        V<BlockV<B, kW, 8, 4, 1024, 1, kLdLib, kStLib>>("block 256 (library twin)", true),
        V<BlockV<B, kW, 4, 4, 1024, 1, kLdLib, kStLib>>("block 256, sized for 4 units", true),
        V<BlockV<B, kW, 4, 4, 256, 0, kLdLib, kStLib>>("block 256, sized 4, bounds 256", true),
        V<BlockV<B, kW, 4, 4, 256, 6, kLdLib, kStLib>>("block 256, sized 4, min 6 CTAs/SM", true),
        V<BlockV<B, kW, 2, 2, 1024, 1, kLdLib, kStLib>>("block 512 x 2 units", false),
        V<BlockV<B, kW, 1, 1, 1024, 1, kLdLib, kStLib>>("block 1024 x 1 unit", false),
        V<BlockV<B, kW, 8, 8, 1024, 1, kLdLib, kStLib>>("block 128 x 8 units", false),
        V<BlockV<B, kW, 8, 4, 1024, 1, kLdCg, kStLib>>("block 256, ld.cg x", true),
        V<BlockV<B, kW, 8, 4, 1024, 1, kLdCs, kStLib>>("block 256, ld.cs x", true),
        V<BlockV<B, kW, 8, 4, 1024, 1, kLdNoL1, kStLib>>("block 256, ld.nc.L1::no_allocate x", true),
        V<BlockV<B, kW, 8, 4, 1024, 1, kLdLib, kStCs>>("block 256, st.cs y", true),
        V<BlockV<B, kW, 8, 4, 1024, 1, kLdLib, kStEvictFirst>>("block 256, st L2::evict_first y", true),
        V<ReloadV<B, kW, 2, 512, kLdEvictLast, kLdEvictFirst>>("two passes 512 x 2, evict_last / evict_first", false),
        V<ReloadV<B, kW, 2, 512, kLdLib, kLdLib>>("two passes 512 x 2, plain loads", false),
        V<ReloadV<B, kW, 4, 256, kLdEvictLast, kLdEvictFirst>>("two passes 256 x 4, evict_last / evict_first", false),
        V<ReloadV<B, kW, 1, 1024, kLdEvictLast, kLdEvictFirst>>("two passes 1024 x 1, evict_last / evict_first", false),
    };
    *n = int(sizeof(v) / sizeof(v[0]));
    return v;
  } else {  // float forward, D = 1024
    // The library: warp, 128 threads, a row a warp, 8 units of x a lane converted to float, .cg loads.
    static const Variant v[] = {
        V<LibraryV>("library (warp, 128 thr, ld.cg)", true),
        V<WarpV<B, 10, kW, 128, 0, kLdLib, kStLib>>("warp 128 (library twin)", true),
        V<WarpV<B, 10, kW, 256, 0, kLdLib, kStLib>>("warp 256 (8 rows/CTA)", true),
        V<WarpV<B, 10, kW, 512, 0, kLdLib, kStLib>>("warp 512 (16 rows/CTA)", true),
        V<WarpV<B, 10, kW, 128, 8, kLdLib, kStLib>>("warp 128, min 8 CTAs/SM", true),
        V<WarpV<B, 10, kW, 128, 0, kLdNoL1, kStLib>>("warp 128, ld.nc.L1::no_allocate x", true),
        V<WarpV<B, 10, kW, 128, 0, kLdCs, kStLib>>("warp 128, ld.cs x", true),
        V<WarpV<B, 10, kW, 128, 0, kLdLib, kStCs>>("warp 128, st.cs y", true),
        V<WarpV<B, 10, kW, 128, 0, kLdLib, kStEvictFirst>>("warp 128, st L2::evict_first y", true),
        V<ReloadV<B, kW, 1, 256, kLdEvictLast, kLdEvictFirst>>("two passes 256 x 1, evict_last / evict_first", false),
        V<ReloadV<B, kW, 2, 128, kLdEvictLast, kLdEvictFirst>>("two passes 128 x 2, evict_last / evict_first", false),
        V<ReloadV<B, kW, 1, 256, kLdLib, kLdLib>>("two passes 256 x 1, plain loads", false),
    };
    *n = int(sizeof(v) / sizeof(v[0]));
    return v;
  }
}

const Variant* table(int* n) { return variants<kPart>(n); }

}  // namespace

// ------------------------------------------------------------------------------------------------
// The C entry points (softmax_bwd_diag.py).

// This build's shape: [0] 1 backward / 0 forward, [1] dtype (0 bfloat16, 1 float16, 2 float32), [2] D.
extern "C" void diag_part(int* out) {
  out[0] = kBackward ? 1 : 0;
  out[1] = kDtype;
  out[2] = kDim;
}

extern "C" int diag_variants() {
  int n = 0;
  table(&n);
  return n;
}

extern "C" const char* diag_variant_name(int v) {
  int n = 0;
  const Variant* t = table(&n);
  return v >= 0 && v < n ? t[v].name : "";
}

extern "C" int diag_variant_exact(int v) {
  int n = 0;
  const Variant* t = table(&n);
  return v >= 0 && v < n ? int(t[v].exact) : 0;
}

// Backward: a = grad_output, b = output, out = grad_input; forward: a = x (b unused), out = y. All dense [rows, D]
// of this build's dtype, 16-byte aligned. log: 0 softmax, 1 log_softmax. Returns a cudaError_t, or kBadShape /
// kPlanDiffers.
extern "C" int diag_launch(int v, int log, const void* a, const void* b, void* out, int64_t rows, int64_t dim,
                           void* stream) {
  int n = 0;
  const Variant* t = table(&n);
  if (v < 0 || v >= n || log < 0 || log > 1) return static_cast<int>(cudaErrorInvalidValue);
  return t[v].launch[log](a, b, out, rows, dim, static_cast<cudaStream_t>(stream));
}

// info[0..3]: registers, local bytes a thread, threads a CTA, CTAs an SM (occupancy query) of variant v's kernel.
extern "C" int diag_variant_info(int v, int log, int64_t rows, int64_t dim, int* info) {
  int n = 0;
  const Variant* t = table(&n);
  if (v < 0 || v >= n || log < 0 || log > 1) return static_cast<int>(cudaErrorInvalidValue);
  return t[v].info[log](rows, dim, info);
}

// The dispatcher's plan for this shape as the torch op builds the problem (softmax_explain's text).
extern "C" const char* diag_plan(int log, int64_t rows) {
  static std::string text;
  int device = 0;
  SoftmaxDeviceProps dev;
  if (cudaGetDevice(&device) != cudaSuccess || softmax_device_props(device, &dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return "no device";
  }
  SoftmaxProblem p = kBackward ? softmax_backward_problem<T, T>(nullptr, nullptr, nullptr, rows, kDim, 1, dev)
                               : softmax_forward_problem<T, T>(nullptr, nullptr, rows, kDim, 1, kDim, dev);
  p.workspace = true;
  p.term_uses_output = log == 0;
  if (kBackward)
    p.bwd_two_cta_threads =
        log ? softmax_impl::detail::block_backward_two_cta_threads<T, T, math::LogSoftmaxEpilogue>()
            : softmax_impl::detail::block_backward_two_cta_threads<T, T, math::SoftmaxEpilogue>();
  text = softmax_explain(p, choose_softmax(p));
  return text.c_str();
}
