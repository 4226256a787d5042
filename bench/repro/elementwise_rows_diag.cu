// Diagnostic (not part of the library; bench/NOTES.md, forty-ninth session): the launch shape of
// elementwise_rows_kernel on a kDeep device (the H200), where the 16-bit ops on chunk views ([32768, 4096] rows
// 8192 apart) ran up to 1.59x behind torch.compile while the dense kernels of the same shape beat it. ptxas spills
// the rows kernel under the deep shape's 32-register cap (128 threads, 16 CTAs an SM). This file builds the
// library's own rows launcher (launch_elementwise_rows_as) at other shapes, and one twin without the per-access
// row division (a 2-D grid: blockIdx.y the row), as a shared library that elementwise_rows_diag.py loads with
// ctypes and times against torch.compile in the same process. The `step` twin is what the library's rows kernel
// became after these runs (one division a thread, then RowStep): since then the `rows` variants run that kernel too,
// and `step` is its copy (the figures in bench/NOTES.md are from the kernel that divided every access).
//
//   nvcc -std=c++17 -O3 -arch=sm_90 --expt-relaxed-constexpr -Iinclude -Xcompiler -fPIC -shared \
//        -DDIAG_OP=<0..7> -o libeltrows_<op>.so bench/repro/elementwise_rows_diag.cu
//
// DIAG_OP: 0 gelu tanh fwd, 1 sigmoid fwd, 2 gelu erf fwd, 3 gelu tanh bwd, 4 gelu erf bwd, 5 sigmoid bwd,
// 6 bias_gelu erf fwd, 7 bias_gelu tanh fwd; in the math forms the library runs on each dtype (StorageMath).
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

template <int kOp, typename T> struct OpOf;
template <typename T> struct OpOf<0, T> { using type = ForwardOp<StorageMath<math::GeluTanh, T>>; };
template <typename T> struct OpOf<1, T> { using type = ForwardOp<StorageMath<math::Sigmoid, T>>; };
template <typename T> struct OpOf<2, T> { using type = ForwardOp<StorageMath<math::GeluErf, T>>; };
template <typename T> struct OpOf<3, T> { using type = DerivativeOp<StorageMath<math::GeluTanh, T>>; };
template <typename T> struct OpOf<4, T> { using type = DerivativeOp<StorageMath<math::GeluErf, T>>; };
template <typename T> struct OpOf<5, T> { using type = SigmoidBackwardOp; };
template <typename T> struct OpOf<6, T> { using type = BiasGeluForwardOp<StorageMath<math::GeluErf, T>>; };
template <typename T> struct OpOf<7, T> { using type = BiasGeluForwardOp<StorageMath<math::GeluTanh, T>>; };

// The 2-D twin: block (bx, r) takes accesses [bx * kThreads * kUnroll, ...) of row r, so no access divides its
// index by the row length; otherwise elementwise_rows_kernel (every load before any arithmetic).
template <int kThreads, int kVec, int kUnroll, int kMinBlocks, typename T, typename Op>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    rows2d_kernel(const T* __restrict__ in0, int64_t stride0, const T* __restrict__ in1, int64_t stride1,
                  T* __restrict__ out, uint32_t per_row, Op op) {
  using Vec = AlignedVector<T, kVec>;
  const int64_t r = blockIdx.y;
  const uint32_t first = blockIdx.x * uint32_t{kThreads * kUnroll} + threadIdx.x;
  const T* a0 = in0 + r * stride0;
  const T* a1 = in1 + r * stride1;
  T* o = out + r * int64_t{per_row} * kVec;
  Vec a[kUnroll];
  Vec b[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const uint32_t q = first + u * kThreads;
    if (q < per_row) {
      a[u] = load_vector<T, kVec>(a0 + int64_t{q} * kVec);
      if constexpr (Op::kArity == 2) b[u] = load_vector<T, kVec>(a1 + int64_t{q} * kVec);
    }
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const uint32_t q = first + u * kThreads;
    if (q < per_row) {
      store_vector<T, kVec>(o + int64_t{q} * kVec, apply_vec<T, kVec>(op, a[u], Op::kArity == 2 ? b[u] : a[u]));
    }
  }
}


// The stepping twin: the 1-D grid of elementwise_rows_kernel, but a thread divides only its first access's
// index by the row length; each later access (kThreads accesses on, fewer than a row: per_row >= kThreads) steps
// its input pointers and wraps into the next row at most once.
template <int kThreads, int kVec, int kUnroll, int kMinBlocks, typename T, typename Op>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    rows_step_kernel(const T* __restrict__ in0, int64_t stride0, const T* __restrict__ in1, int64_t stride1,
                     T* __restrict__ out, uint32_t accesses, uint32_t per_row, RowDivider div, Op op) {
  using Vec = AlignedVector<T, kVec>;
  const uint32_t first = blockIdx.x * uint32_t{kThreads * kUnroll} + threadIdx.x;
  uint32_t r = div.quotient(first);
  uint32_t c = first - r * per_row;
  const T* p0 = in0 + int64_t{r} * stride0 + int64_t{c} * kVec;
  const T* p1 = in1 + int64_t{r} * stride1 + int64_t{c} * kVec;
  Vec a[kUnroll];
  Vec b[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    if (first + u * kThreads < accesses) {
      a[u] = load_vector<T, kVec>(p0);
      if constexpr (Op::kArity == 2) b[u] = load_vector<T, kVec>(p1);
    }
    c += kThreads;
    p0 += kThreads * kVec;
    p1 += kThreads * kVec;
    if (c >= per_row) {
      c -= per_row;
      p0 += stride0 - int64_t{per_row} * kVec;
      p1 += stride1 - int64_t{per_row} * kVec;
    }
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const uint32_t q = first + u * kThreads;
    if (q < accesses) {
      store_vector<T, kVec>(out + int64_t{q} * kVec, apply_vec<T, kVec>(op, a[u], Op::kArity == 2 ? b[u] : a[u]));
    }
  }
}

template <int kThreads, int kBytes, int kUnroll, int kMinBlocks, typename T, typename Op>
int launch_rows(const T* in0, const T* in1, T* out, const ElementRows& g, cudaStream_t s) {
  constexpr int kVec = kBytes / static_cast<int>(sizeof(T));
  return static_cast<int>(launch_elementwise_rows_as<kThreads, kVec, kUnroll, kMinBlocks>(in0, in1, out, g, Op{}, s));
}

template <int kThreads, int kBytes, int kUnroll, int kMinBlocks, typename T, typename Op>
int launch_2d(const T* in0, const T* in1, T* out, const ElementRows& g, cudaStream_t s) {
  constexpr int kVec = kBytes / static_cast<int>(sizeof(T));
  const uint32_t per_row = static_cast<uint32_t>(g.cols / kVec);
  const dim3 grid((per_row + kThreads * kUnroll - 1) / (kThreads * kUnroll), static_cast<unsigned>(g.rows));
  rows2d_kernel<kThreads, kVec, kUnroll, kMinBlocks, T, Op><<<grid, kThreads, 0, s>>>(in0, g.stride0, in1, g.stride1,
                                                                                      out, per_row, Op{});
  return static_cast<int>(cudaGetLastError());
}


template <int kThreads, int kBytes, int kUnroll, int kMinBlocks, typename T, typename Op>
int launch_step(const T* in0, const T* in1, T* out, const ElementRows& g, cudaStream_t s) {
  constexpr int kVec = kBytes / static_cast<int>(sizeof(T));
  const int64_t per_row = g.cols / kVec;
  const int64_t accesses = g.rows * per_row;  // the driver's tensors: < 2^31 accesses, per_row >= kThreads
  const unsigned grid = static_cast<unsigned>((accesses + kThreads * kUnroll - 1) / (kThreads * kUnroll));
  rows_step_kernel<kThreads, kVec, kUnroll, kMinBlocks, T, Op><<<grid, kThreads, 0, s>>>(
      in0, g.stride0, in1, g.stride1, out, static_cast<uint32_t>(accesses), static_cast<uint32_t>(per_row),
      RowDivider(per_row), Op{});
  return static_cast<int>(cudaGetLastError());
}

// The variant table: threads, bytes an access, accesses a thread and operand, min blocks (0: no cap).
#define DIAG_VARIANTS(X)                                   \
  X("rows 128 x 16B x 2, cap 16 (deep now)", rows, 128, 16, 2, 16) \
  X("rows 128 x 16B x 1, cap 16", rows, 128, 16, 1, 16)    \
  X("rows 128 x 16B x 2, cap 12", rows, 128, 16, 2, 12)    \
  X("rows 128 x 16B x 2, cap 8", rows, 128, 16, 2, 8)      \
  X("rows 128 x 16B x 2, no cap", rows, 128, 16, 2, 0)     \
  X("rows 256 x 16B x 2, cap 4", rows, 256, 16, 2, 4)      \
  X("rows 256 x 16B x 2, cap 6", rows, 256, 16, 2, 6)      \
  X("rows 512 x 16B x 1, cap 4 (H100)", rows, 512, 16, 1, 4) \
  X("rows 128 x 16B x 4, cap 8", rows, 128, 16, 4, 8)      \
  X("rows 128 x 16B x 4, no cap", rows, 128, 16, 4, 0)     \
  X("2d 128 x 16B x 2, cap 16", 2d, 128, 16, 2, 16)        \
  X("2d 128 x 16B x 2, cap 8", 2d, 128, 16, 2, 8)          \
  X("2d 256 x 16B x 2, cap 4", 2d, 256, 16, 2, 4)          \
  X("2d 128 x 16B x 4, cap 8", 2d, 128, 16, 4, 8)          \
  X("2d 128 x 16B x 4, no cap", 2d, 128, 16, 4, 0)         \
  X("2d 64 x 16B x 8, cap 16", 2d, 64, 16, 8, 16)          \
  X("2d 128 x 16B x 4, cap 12", 2d, 128, 16, 4, 12)        \
  X("step 128 x 16B x 4, cap 8", step, 128, 16, 4, 8)      \
  X("step 128 x 16B x 4, no cap", step, 128, 16, 4, 0)     \
  X("step 128 x 16B x 2, cap 16", step, 128, 16, 2, 16)    \
  X("step 128 x 16B x 2, cap 8", step, 128, 16, 2, 8)

#define DIAG_NAME(name, ...) name,
const char* const kNames[] = {"library launcher", DIAG_VARIANTS(DIAG_NAME)};
#undef DIAG_NAME
constexpr int kVariants = sizeof(kNames) / sizeof(kNames[0]);

template <typename T>
int run(int variant, const void* a, const void* b, void* o, const ElementRows& g, cudaStream_t s) {
  using Op = typename OpOf<DIAG_OP, T>::type;
  const T* in0 = static_cast<const T*>(a);
  const T* in1 = static_cast<const T*>(b);
  T* out = static_cast<T*>(o);
  if (variant == 0) return static_cast<int>(launch_elementwise<T>(in0, in1, out, g, Op{}, s));
  int v = 1;
#define DIAG_CASE(name, kind, th, by, un, mb) \
  if (variant == v++) return launch_##kind<th, by, un, mb, T, Op>(in0, in1, out, g, s);
  DIAG_VARIANTS(DIAG_CASE)
#undef DIAG_CASE
  return -1;
}

}  // namespace

#define DIAG_CAT2(a, b) a##b
#define DIAG_CAT(a, b) DIAG_CAT2(a, b)

// dtype 0: bfloat16, 1: float16, 2: float32. out: [rows, cols] dense; in0 / in1 rows `stride0` / `stride1` apart.
extern "C" int DIAG_CAT(diag_launch_, DIAG_OP)(int dtype, int variant, const void* in0, int64_t stride0,
                                               const void* in1, int64_t stride1, void* out, int64_t rows,
                                               int64_t cols, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const ElementRows g{rows, cols, stride0, stride1};
  return dtype == 0   ? run<__nv_bfloat16>(variant, in0, in1, out, g, s)
         : dtype == 1 ? run<__half>(variant, in0, in1, out, g, s)
                      : run<float>(variant, in0, in1, out, g, s);
}

extern "C" int DIAG_CAT(diag_variants_, DIAG_OP)() { return kVariants; }
extern "C" const char* DIAG_CAT(diag_variant_name_, DIAG_OP)(int v) {
  return v >= 0 && v < kVariants ? kNames[v] : "";
}
