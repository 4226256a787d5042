// Elementwise kernels of the activations and their plain launchers (torch-free):
//
//   elementwise_kernel   y = f(x) (gelu, sigmoid forward) and dx = g(dy, z) (the backward forms:
//                        gelu dx = dy * gelu'(x), sigmoid dx = dy * y (1 - y) from the output y),
//                        over n elements of dense, identically laid out arrays, in memory order.
//   bias_gelu_forward_kernel   y = gelu(x + bias) over a contiguous [rows, H] array, bias [H]
//                        broadcast over rows, in memory order like elementwise_kernel.
//   bias_gelu_backward_kernel  dx = dy * gelu'(x + bias), and the sums of dx over the rows of its
//                        block into per-block column partials.
//   bias_grad_reduce_kernel   dbias[h] = sum of the partials of column h, in a fixed order.
//
// Element types: float, double, __half, __nv_bfloat16 (csrc maps at::Half / at::BFloat16 onto the
// last two). Arithmetic in acc_t<T> through the functors of fastact/math.h.
//
// Memory-bound by design: every access is 128 bits when the pointers allow it (AlignedVector of
// vec_width<T>() elements) and each thread has several independent accesses in flight, with 64-bit
// indices: the elementwise and bias_gelu forward kernels as one tile per block over a grid of
// ceil(n / tile) blocks, bias_gelu_backward_kernel as one wave of persistent blocks, each over a
// chunk of rows (a block's column sums need its rows). No atomics, no host synchronisation, no
// state: every launcher only enqueues on `stream`, so all of this is CUDA-graph capturable and
// deterministic.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "fastact/copy_async.cuh"
#include "fastact/math.h"
#include "fastact/reduce.cuh"
#include "fastact/vec.cuh"

namespace fastact {
namespace elementwise {

// ---- launch shape: one place for the launchers and for explain() ----------------------------------

// 8 warps: enough threads per block to cover a row of 256 accesses (2048 bf16) in one pass, few
// enough that 4 blocks share an SM (block-level tail effects stay small).
constexpr int kThreads = 256;
// Blocks the register cap must allow on one SM (__launch_bounds__ min blocks): 4 x 256 = 1024
// threads, i.e. at most 64 registers a thread. The grid is sm_count * kBlocksPerSm blocks: one wave.
constexpr int kBlocksPerSm = 4;
// ---- elementwise_kernel: one tile per block ---------------------------------------------------------
// 128 threads a block, each with one or two independent 16-byte loads an operand (elementwise_shape
// below) issued before any arithmetic; a block does one tile and exits, so the grid is
// ceil(n / tile) blocks and the SMs keep as many blocks resident as registers allow (no persistent
// loop, no shared memory): memory-level
// parallelism comes from many resident warps, as in torch's own vectorised elementwise kernel,
// instead of a deep per-thread pipeline.
constexpr int kEltThreads = 128;
// Element loads per thread on the scalar (misaligned) path: each moves only 2-8 bytes.
constexpr int kEltScalarLoadsPerThread = 8;

// Launch shape of elementwise_kernel: accesses per thread and operand (the unroll factor), and the
// blocks per SM its register cap must allow (__launch_bounds__ min blocks; 16 x 128 threads: at most
// 32 registers a thread, full occupancy; 0: no cap).
struct EltShape {
  int unroll;
  int min_blocks;
};

// The shape for elements of `elem_bytes` bytes, an op reading `arity` operands, and whether the op is
// the erf gelu forward (the one-operand op with the most arithmetic a byte: erff, ~25 instructions an
// element, issue-bound in 16-bit per ncu). Vector path (16-byte accesses), from a sweep of unroll 1 / 2
// / 4 x cap none / 12 / 16 against torch on the H100 (bench/NOTES.md, 256 MB tensors):
//   float, 16-bit   1 access, 32 registers   torch's own shape (4 floats or 8 16-bit values a thread
//                                            and operand, full occupancy): 0.997-1.007x torch on every
//                                            op; more accesses or registers lose occupancy (16-bit
//                                            gelu bwd at 40 registers: 0.96x, erf fwd at 4: 0.95x)
//   16-bit erf fwd  2 accesses, 32 regs.     1.012-1.015x torch (1 access: 0.997-1.001x); ptxas spills
//                                            8-12 bytes to L1 here, and it is still the fastest
//   double          2 / 1 (one / two operands), no cap: its erf/exp/tanh need twice the registers
// Scalar path: 8 element accesses a thread over all operands (4 for double), no cap.
constexpr EltShape elementwise_shape(int elem_bytes, int arity, bool vectorised, bool erf_forward) {
  if (!vectorised) {
    const int loads = kEltScalarLoadsPerThread / (elem_bytes == 8 ? 2 : 1);
    return {loads / arity < 1 ? 1 : loads / arity, 0};
  }
  if (elem_bytes == 8) return {arity == 1 ? 2 : 1, 0};
  return {elem_bytes == 2 && erf_forward ? 2 : 1, 16};
}

// ---- bias_gelu_backward_kernel: persistent blocks with a cp.async ring ----------------------------------------
// 16-byte loads a thread issues per step on bias_gelu's vector path (all operands together). They go
// global -> shared through cp.async, two steps deep (the next step's loads are in flight while this
// one computes), so a thread has 4-8 x 16 B in flight: 64-128 KiB per SM at 1024 threads, 3-6x what
// Little's law asks of an H100 at 3 TB/s (~20 KiB per SM at ~1 us loaded latency). Why not plain
// loads into registers: ptxas sinks a load towards its first use when the arithmetic after it is
// register-hungry (erf/tanh in float on 4 x 8 bf16 values), which left only 2 loads in flight per
// thread of a persistent block; a cp.async holds no register, so it stays where it is written.
constexpr int kVecLoadsPerThread = 4;
// Element loads per thread and step on bias_gelu's scalar (misaligned) path.
constexpr int kScalarLoadsPerThread = 8;
// Steps of loads in flight on the vector path (the cp.async ring): this step's and the next one's.
constexpr int kStages = 2;

// bias_gelu: accesses per thread and operand, two operands' worth (4 x 16 B a thread on the vector
// path): the backward's rows per step (x and dy), and the forward tile's accesses (x and the bias
// vector, which comes from L1; one access a thread instead measured 93.7 -> 97.4 us on bf16
// 16384x4096).
constexpr int bias_gelu_unroll(int elem_bytes, bool vectorised) {
  const int loads = (vectorised ? kVecLoadsPerThread : kScalarLoadsPerThread) / (elem_bytes == 8 ? 2 : 1);
  return loads / 2 < 1 ? 1 : loads / 2;
}

// bias_gelu: rows each thread handles at the least, so that a row chunk is not so short that the
// per-block partial sums of the backward (a [row_chunks, H] workspace) grow past a small fraction of
// the data: with >= 8 rows a thread, the workspace has at most 1/8 of dy's rows.
constexpr int kMinRowsPerThread = 8;
// bias_grad_reduce_kernel: a block reduces 32 columns (one coalesced 128-byte row segment of float
// partials per warp) with 32 lanes along the chunk dim (1024 threads).
constexpr int kReduceCols = 32;
constexpr int kReduceLanes = 32;

FASTACT_HOST_DEVICE constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks of elementwise_kernel for n elements, `vec` elements per access, `unroll` accesses per thread
// and operand: one tile of kEltThreads * unroll * vec elements each.
inline int64_t elementwise_grid(int64_t n, int vec, int unroll) {
  return std::max<int64_t>(1, ceil_div(n, int64_t{kEltThreads} * unroll * vec));
}

// ---- conversions between the element type and acc_t (explicit: torch builds define
// __CUDA_NO_HALF_CONVERSIONS__ / __CUDA_NO_BFLOAT16_CONVERSIONS__) ---------------------------------

template <typename T>
struct Convert {  // float, double: acc_t<T> is T
  static FASTACT_DEVICE acc_t<T> to_acc(T v) { return v; }
  static FASTACT_DEVICE T from_acc(acc_t<T> v) { return v; }
};
template <>
struct Convert<__half> {
  static FASTACT_DEVICE float to_acc(__half v) { return __half2float(v); }
  static FASTACT_DEVICE __half from_acc(float v) { return __float2half_rn(v); }
};
template <>
struct Convert<__nv_bfloat16> {
  static FASTACT_DEVICE float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
  static FASTACT_DEVICE __nv_bfloat16 from_acc(float v) { return __float2bfloat16_rn(v); }
};

// ---- the ops: functors over acc_t, wrapping the math.h functors ------------------------------------

// y = f(x): F is math::GeluErf, math::GeluTanh or math::Sigmoid.
template <typename F>
struct ForwardOp {
  static constexpr int kArity = 1;
  F f;
  template <typename A>
  FASTACT_DEVICE A operator()(A x) const {
    return f.forward(x);
  }
};

// dx = dy * f'(x) (torch's gelu_backward): F is math::GeluErf or math::GeluTanh.
template <typename F>
struct DerivativeOp {
  static constexpr int kArity = 2;
  F f;
  template <typename A>
  FASTACT_DEVICE A operator()(A dy, A x) const {
    return dy * f.derivative(x);
  }
};

// dx = dy * y (1 - y), from the forward's output y (torch's sigmoid_backward).
struct SigmoidBackwardOp {
  static constexpr int kArity = 2;
  math::Sigmoid f;
  template <typename A>
  FASTACT_DEVICE A operator()(A dy, A y) const {
    return dy * f.derivative_from_output(y);
  }
};

// ---- elementwise_kernel ----------------------------------------------------------------------------

// op on one access: out.val[j] = op(a.val[j]) or op(a.val[j], b.val[j]), in acc_t.
template <typename T, int kVec, typename Op>
FASTACT_DEVICE AlignedVector<T, kVec> apply_vec(const Op& op, const AlignedVector<T, kVec>& a,
                                                const AlignedVector<T, kVec>& b) {
  AlignedVector<T, kVec> o;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    if constexpr (Op::kArity == 1) {
      o.val[j] = Convert<T>::from_acc(op(Convert<T>::to_acc(a.val[j])));
    } else {
      o.val[j] = Convert<T>::from_acc(op(Convert<T>::to_acc(a.val[j]), Convert<T>::to_acc(b.val[j])));
    }
  }
  return o;
}

// One tile with plain loads: each thread handles kUnroll_ accesses of kVec elements, access u at
// `offset + u * kEltThreads * kVec` (the block's accesses are consecutive, so every warp access is
// coalesced). Every load of the tile is issued before any arithmetic. kGuard: only accesses whose
// index within the tile, threadIdx.x + u * kEltThreads, is below `valid` exist (the last tile).
template <int kVec, int kUnroll_, bool kGuard, typename T, typename Op>
FASTACT_DEVICE void elementwise_tile(const T* __restrict__ in0, const T* __restrict__ in1, T* __restrict__ out,
                                     int64_t offset, int64_t valid, const Op& op) {
  using Vec = AlignedVector<T, kVec>;
  constexpr int64_t kStride = int64_t{kEltThreads} * kVec;  // elements from access u to u + 1
  Vec a[kUnroll_];
  Vec b[kUnroll_];
#pragma unroll
  for (int u = 0; u < kUnroll_; ++u) {
    if (!kGuard || threadIdx.x + u * kEltThreads < valid) {
      a[u] = load_vector<T, kVec>(in0 + offset + u * kStride);
      if constexpr (Op::kArity == 2) b[u] = load_vector<T, kVec>(in1 + offset + u * kStride);
    }
  }
#pragma unroll
  for (int u = 0; u < kUnroll_; ++u) {
    if (!kGuard || threadIdx.x + u * kEltThreads < valid) {
      store_vector<T, kVec>(out + offset + u * kStride, apply_vec<T, kVec>(op, a[u], Op::kArity == 2 ? b[u] : a[u]));
    }
  }
}

// out[i] = op(in0[i]) or op(in0[i], in1[i]) for i in [0, n): in0, in1, out are dense arrays of one
// memory order ([n] each; in1 unused for unary ops). Block b takes tile b, elements
// [b * kTile, (b + 1) * kTile). kVec > 1 requires every pointer 16-byte aligned (then every access
// is: offsets are multiples of kVec). The last block takes what is left, fewer than kTile elements:
// first as whole accesses, then the last n % kVec elements one each (the scalar tail starts exactly
// where the vector body ends).
template <int kVec, int kUnroll_, int kMinBlocks, typename T, typename Op>
__global__ void __launch_bounds__(kEltThreads, kMinBlocks)
    elementwise_kernel(const T* __restrict__ in0, const T* __restrict__ in1, T* __restrict__ out, int64_t n,
                       Op op) {
  constexpr int64_t kTile = int64_t{kEltThreads} * kUnroll_ * kVec;
  const int64_t start = int64_t{blockIdx.x} * kTile;
  const int64_t first = start + int64_t{threadIdx.x} * kVec;  // this thread's first element
  if (n - start >= kTile) {
    elementwise_tile<kVec, kUnroll_, false>(in0, in1, out, first, 0, op);
    return;
  }
  const int64_t rest_vecs = (n - start) / kVec;  // whole accesses in the last tile, < kEltThreads * kUnroll_
  if (rest_vecs > 0) elementwise_tile<kVec, kUnroll_, true>(in0, in1, out, first, rest_vecs, op);
  if constexpr (kVec > 1) {
    const int64_t i = start + rest_vecs * kVec + threadIdx.x;  // n - i < kVec <= kEltThreads
    if (i < n) elementwise_tile<1, 1, false>(in0 + i, Op::kArity == 2 ? in1 + i : in1, out + i, 0, 0, op);
  }
}

// True when every non-null pointer allows 128-bit accesses.
inline bool all_vec_aligned(const void* a, const void* b, const void* c, const void* d = nullptr) {
  return is_vec_aligned(a) && is_vec_aligned(b) && is_vec_aligned(c) && is_vec_aligned(d);
}

template <int kVec, int kUnroll_, int kMinBlocks, typename T, typename Op>
cudaError_t launch_elementwise_as(const T* in0, const T* in1, T* out, int64_t n, Op op, cudaStream_t stream) {
  // gridDim.x may reach 2^31 - 1: with tiles of >= 1024 elements, n would have to pass 2^41.
  const int64_t grid = elementwise_grid(n, kVec, kUnroll_);
  if (grid > int64_t{0x7fffffff}) return cudaErrorInvalidConfiguration;
  elementwise_kernel<kVec, kUnroll_, kMinBlocks><<<static_cast<unsigned>(grid), kEltThreads, 0, stream>>>(in0, in1, out, n, op);
  return cudaGetLastError();
}

// Whether Op is the erf gelu forward (elementwise_shape's erf_forward).
template <typename Op>
constexpr bool kErfForward = std::is_same_v<Op, ForwardOp<math::GeluErf>>;

// Vector path when every pointer is 16-byte aligned, else the scalar path.
template <typename T, typename Op>
cudaError_t launch_elementwise(const T* in0, const T* in1, T* out, int64_t n, Op op, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (all_vec_aligned(in0, in1, out)) {
    constexpr EltShape kS = elementwise_shape(sizeof(T), Op::kArity, true, kErfForward<Op>);
    return launch_elementwise_as<vec_width<T>(), kS.unroll, kS.min_blocks>(in0, in1, out, n, op, stream);
  }
  constexpr EltShape kS = elementwise_shape(sizeof(T), Op::kArity, false, kErfForward<Op>);
  return launch_elementwise_as<1, kS.unroll, kS.min_blocks>(in0, in1, out, n, op, stream);
}

// ---- bias_gelu --------------------------------------------------------------------------------------

// How a [rows, H] bias_gelu splits over the GPU. A row is H / vec accesses; a block is tx x ty
// threads: tx consecutive accesses of a row (a column tile) times ty rows side by side, so a thread
// owns one access column and loads its bias once. grid = (col_tiles, row_chunks): block (cx, cy)
// takes column tile cx of rows [cy * rows_per_chunk, (cy + 1) * rows_per_chunk), thread (lx, ly)
// rows ly, ly + ty, ... of it. With tx = H / vec <= kThreads a block covers whole rows (one contiguous
// stretch of memory); wider rows split into equal column tiles of a multiple of 32 accesses.
struct BiasGeluPlan {
  int vec = 1;                 // elements per access: vec_width<T>() or 1
  int tx = 1;                  // threads along a row, <= kThreads
  int ty = 1;                  // rows a block handles side by side: kThreads / tx
  int64_t col_tiles = 1;       // gridDim.x: ceil(H / vec / tx)
  int64_t row_chunks = 1;      // gridDim.y (<= sm_count * kBlocksPerSm, far below 65535)
  int64_t rows_per_chunk = 0;  // the last chunk may be shorter
  // acc_t elements of the backward's workspace of per-chunk column sums, [row_chunks, H]; 0 when a
  // single chunk writes dbias directly.
  int64_t workspace_elems(int64_t H) const { return row_chunks > 1 ? row_chunks * H : 0; }
  int threads() const { return tx * ty; }
};

// rows >= 1, H >= 1, vec divides H. Fills the GPU with one wave of sm_count * kBlocksPerSm blocks
// where the tensor is large enough, keeping >= kMinRowsPerThread rows per thread.
inline BiasGeluPlan plan_bias_gelu(int64_t rows, int64_t H, int vec, int sm_count) {
  BiasGeluPlan p;
  p.vec = vec;
  const int64_t accesses = H / vec;  // per row
  if (accesses <= kThreads) {
    p.tx = static_cast<int>(accesses);
    p.col_tiles = 1;
  } else {
    p.col_tiles = ceil_div(accesses, kThreads);
    p.tx = static_cast<int>(ceil_div(ceil_div(accesses, p.col_tiles), 32) * 32);  // <= kThreads
  }
  p.ty = kThreads / p.tx;
  const int64_t target_blocks = int64_t{sm_count} * kBlocksPerSm;
  const int64_t max_chunks = std::max<int64_t>(1, rows / (int64_t{p.ty} * kMinRowsPerThread));
  const int64_t chunks = std::min(std::max<int64_t>(1, ceil_div(target_blocks, p.col_tiles)), max_chunks);
  p.rows_per_chunk = ceil_div(rows, chunks);
  p.row_chunks = ceil_div(rows, p.rows_per_chunk);  // no empty chunk
  return p;
}

// One access of bias_gelu's backward: out = dx = dy * gelu'(x + b), also added to dsum (in acc_t,
// before rounding to T).
template <typename T, int kVec, typename Gelu>
FASTACT_DEVICE AlignedVector<T, kVec> bias_gelu_apply(const AlignedVector<T, kVec>& xv, const AlignedVector<T, kVec>& gv,
                                                      const acc_t<T> (&b)[kVec], acc_t<T> (&dsum)[kVec],
                                                      const Gelu& gelu) {
  using A = acc_t<T>;
  AlignedVector<T, kVec> o;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const A z = Convert<T>::to_acc(xv.val[j]) + b[j];
    const A g = Convert<T>::to_acc(gv.val[j]) * gelu.derivative(z);
    dsum[j] += g;
    o.val[j] = Convert<T>::from_acc(g);
  }
  return o;
}

// kUnroll_ rows of one access column with plain loads: row u at element offset `offset + u * row_step`
// (row_step = ty * H); kGuard: only rows u < valid. The scalar path and each thread's last rows use it.
template <int kVec, int kUnroll_, bool kGuard, typename T, typename Gelu>
FASTACT_DEVICE void bias_gelu_rows(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ out,
                                   int64_t offset, int64_t row_step, int valid, const acc_t<T> (&b)[kVec],
                                   acc_t<T> (&dsum)[kVec], const Gelu& gelu) {
  using Vec = AlignedVector<T, kVec>;
  Vec xv[kUnroll_];
  Vec gv[kUnroll_];
#pragma unroll
  for (int u = 0; u < kUnroll_; ++u) {
    if (!kGuard || u < valid) {
      xv[u] = load_vector<T, kVec>(x + offset + u * row_step);
      gv[u] = load_vector<T, kVec>(dy + offset + u * row_step);
    }
  }
#pragma unroll
  for (int u = 0; u < kUnroll_; ++u) {
    if (!kGuard || u < valid) {
      store_vector<T, kVec>(out + offset + u * row_step, bias_gelu_apply(xv[u], gv[u], b, dsum, gelu));
    }
  }
}

// The cp.async ring of bias_gelu's vector path: slots 0..U-1 hold x's rows of a step, U..2U-1 dy's.
template <int kVec, int kUnroll_, typename T>
FASTACT_DEVICE void bias_gelu_issue(const T* __restrict__ x, const T* __restrict__ dy, int64_t offset,
                                    int64_t row_step, AlignedVector<T, kVec> (*slots)[kThreads]) {
#pragma unroll
  for (int u = 0; u < kUnroll_; ++u) {
    copy_async_16(&slots[u][threadIdx.x], x + offset + u * row_step);
    copy_async_16(&slots[kUnroll_ + u][threadIdx.x], dy + offset + u * row_step);
  }
}

// bias_gelu backward: out = dx = dy * gelu'(x + bias); then the block sums its rows' dx per column (thread sums in
// row order, then the ty threads of a column in ly order: a fixed order) and writes them to
// partial[blockIdx.y, col] (in acc_t), or straight to dbias[col] when there is a single row chunk.
// x, dy, out: [rows, H] contiguous; bias, dbias: [H]; partial: [gridDim.y, H]. kVec > 1 needs
// H % kVec == 0 and 16-byte aligned pointers; its loads go through the cp.async ring, the next step's
// issued before this one's arithmetic. blockDim.x = tx * ty (see BiasGeluPlan).
template <int kVec, int kUnroll_, typename T, typename Gelu>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    bias_gelu_backward_kernel(const T* __restrict__ x, const T* __restrict__ bias, const T* __restrict__ dy,
                     T* __restrict__ out, acc_t<T>* __restrict__ partial, T* __restrict__ dbias, int64_t rows,
                     int64_t H, int tx, int64_t rows_per_chunk, Gelu gelu) {
  using A = acc_t<T>;
  using Vec = AlignedVector<T, kVec>;
  const int ty = blockDim.x / tx;
  const int lx = threadIdx.x % tx;
  const int ly = threadIdx.x / tx;
  const int64_t col = (int64_t{blockIdx.x} * tx + lx) * kVec;  // this thread's first column
  const int64_t r_begin = int64_t{blockIdx.y} * rows_per_chunk;
  const int64_t r_end = std::min(rows, r_begin + rows_per_chunk);

  A dsum[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) dsum[j] = A(0);

  if (col < H) {  // threads past the row's end (last column tile only) just join the reduction
    A b[kVec];
    {
      const Vec bv = load_vector<T, kVec>(bias + col);
#pragma unroll
      for (int j = 0; j < kVec; ++j) b[j] = Convert<T>::to_acc(bv.val[j]);
    }
    const int64_t row_step = int64_t{ty} * H;
    const int64_t r0 = r_begin + ly;  // this thread's rows: r0, r0 + ty, ... < r_end
    const int64_t my_rows = r0 < r_end ? ceil_div(r_end - r0, ty) : 0;
    const int64_t steps = my_rows / kUnroll_;  // steps of kUnroll_ rows
    const int64_t step = kUnroll_ * row_step;  // elements from one step to the next
    int64_t offset = r0 * H + col;             // of row r0 + k * kUnroll_ * ty at step k
    const int64_t steps_end = offset + steps * step;
    if constexpr (kVec > 1) {
      static_assert(kStages == 2, "the ring below alternates two stages");
      __shared__ Vec ring[kStages][2 * kUnroll_][kThreads];
      if (steps > 0) bias_gelu_issue<kVec, kUnroll_>(x, dy, offset, row_step, ring[0]);
      copy_async_commit();
      for (int stage = 0; offset < steps_end; stage ^= 1, offset += step) {
        if (offset + step < steps_end) {
          bias_gelu_issue<kVec, kUnroll_>(x, dy, offset + step, row_step, ring[stage ^ 1]);
        }
        copy_async_commit();   // possibly empty: one group per iteration either way
        copy_async_wait<1>();  // everything but the newest group has landed: this step's loads
#pragma unroll
        for (int u = 0; u < kUnroll_; ++u) {
          const Vec xv = ring[stage][u][threadIdx.x];
          const Vec gv = ring[stage][kUnroll_ + u][threadIdx.x];
          store_vector<T, kVec>(out + offset + u * row_step, bias_gelu_apply(xv, gv, b, dsum, gelu));
        }
      }
    } else {
      for (; offset < steps_end; offset += step) {
        bias_gelu_rows<kVec, kUnroll_, false>(x, dy, out, offset, row_step, kUnroll_, b, dsum, gelu);
      }
    }
    const int rest = static_cast<int>(my_rows - steps * kUnroll_);  // < kUnroll_ rows left
    if (rest > 0) bias_gelu_rows<kVec, kUnroll_, true>(x, dy, out, offset, row_step, rest, b, dsum, gelu);
  }

  {
    // [ty][tx * kVec]: thread (lx, ly)'s sums at row ly, columns lx * kVec ...; i.e. at threadIdx.x * kVec.
    __shared__ A sums[kThreads * kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) sums[threadIdx.x * kVec + j] = dsum[j];
    __syncthreads();
    const int width = tx * kVec;  // columns of this tile
    const int64_t col0 = int64_t{blockIdx.x} * width;
    for (int e = threadIdx.x; e < width && col0 + e < H; e += blockDim.x) {
      A s = A(0);
      for (int k = 0; k < ty; ++k) s += sums[k * width + e];
      if (gridDim.y == 1) {
        dbias[col0 + e] = Convert<T>::from_acc(s);
      } else {
        partial[int64_t{blockIdx.y} * H + col0 + e] = s;
      }
    }
  }
}

// ---- bias_gelu forward: one tile per block ----------------------------------------------------------
// y = gelu(x + bias[i % H]) over the n = rows * H elements in memory order, shaped like
// elementwise_kernel (a tile per block, every load of the tile issued before any arithmetic). Each
// access also loads its bias vector, at column (i % H): the bias (H elements) stays in L1/L2. vec
// divides H, so an access never straddles two rows. The column of a thread's access u is its first
// column (one remainder per thread) plus u * col_step, col_step = (kEltThreads * kVec) % H, wrapped by
// one conditional subtraction.
template <int kVec, int kUnroll_, bool kGuard, typename T, typename Gelu>
FASTACT_DEVICE void bias_gelu_forward_tile(const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ y,
                                           int64_t offset, int64_t valid, int64_t H, int64_t col_step,
                                           const Gelu& gelu) {
  using A = acc_t<T>;
  using Vec = AlignedVector<T, kVec>;
  constexpr int64_t kStride = int64_t{kEltThreads} * kVec;
  Vec xv[kUnroll_];
  Vec bv[kUnroll_];
  int64_t col = ((offset | H) >> 32) == 0 ? int64_t{static_cast<uint32_t>(offset) % static_cast<uint32_t>(H)}
                                          : offset % H;
#pragma unroll
  for (int u = 0; u < kUnroll_; ++u) {
    if (!kGuard || threadIdx.x + u * kEltThreads < valid) {
      xv[u] = load_vector<T, kVec>(x + offset + u * kStride);
      bv[u] = load_vector<T, kVec>(bias + col);
    }
    col += col_step;
    if (col >= H) col -= H;
  }
#pragma unroll
  for (int u = 0; u < kUnroll_; ++u) {
    if (!kGuard || threadIdx.x + u * kEltThreads < valid) {
      Vec o;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const A z = Convert<T>::to_acc(xv[u].val[j]) + Convert<T>::to_acc(bv[u].val[j]);
        o.val[j] = Convert<T>::from_acc(gelu.forward(z));
      }
      store_vector<T, kVec>(y + offset + u * kStride, o);
    }
  }
}

// x, y: [n] contiguous (n = rows * H); bias: [H]. kVec > 1 needs H % kVec == 0 and 16-byte aligned
// pointers. Block b takes elements [b * kTile, (b + 1) * kTile); the last block what is left (whole
// accesses: kVec divides n).
template <int kVec, int kUnroll_, typename T, typename Gelu>
__global__ void __launch_bounds__(kEltThreads)
    bias_gelu_forward_kernel(const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ y, int64_t n,
                             int64_t H, int64_t col_step, Gelu gelu) {
  constexpr int64_t kTile = int64_t{kEltThreads} * kUnroll_ * kVec;
  const int64_t start = int64_t{blockIdx.x} * kTile;
  const int64_t first = start + int64_t{threadIdx.x} * kVec;
  if (n - start >= kTile) {
    bias_gelu_forward_tile<kVec, kUnroll_, false>(x, bias, y, first, 0, H, col_step, gelu);
  } else {
    bias_gelu_forward_tile<kVec, kUnroll_, true>(x, bias, y, first, (n - start) / kVec, H, col_step, gelu);
  }
}

template <int kVec, typename T, typename Gelu>
cudaError_t launch_bias_gelu_forward_as(const T* x, const T* bias, T* y, int64_t n, int64_t H, Gelu gelu,
                                        cudaStream_t stream) {
  constexpr int kU = bias_gelu_unroll(sizeof(T), kVec > 1);
  const int64_t grid = elementwise_grid(n, kVec, kU);
  if (grid > int64_t{0x7fffffff}) return cudaErrorInvalidConfiguration;
  const int64_t col_step = (int64_t{kEltThreads} * kVec) % H;
  bias_gelu_forward_kernel<kVec, kU><<<static_cast<unsigned>(grid), kEltThreads, 0, stream>>>(x, bias, y, n, H,
                                                                                               col_step, gelu);
  return cudaGetLastError();
}

// dbias[h] = sum over c of partial[c, h], c = 0 .. chunks - 1. Block: kReduceCols columns x
// kReduceLanes lanes; lane l of a column sums chunks l, l + kReduceLanes, ... in order, then warp w
// (all threads of one ly) sums column w's lanes by warp_reduce's fixed butterfly. The order depends
// only on (chunks, H): bit-identical results run to run. partial: [chunks, H] acc_t; dbias: [H].
template <typename T>
__global__ void __launch_bounds__(kReduceCols * kReduceLanes)
    bias_grad_reduce_kernel(const acc_t<T>* __restrict__ partial, T* __restrict__ dbias, int64_t chunks,
                            int64_t H) {
  static_assert(kReduceCols == kWarpSize, "warp w of the block finishes column w");
  using A = acc_t<T>;
  __shared__ A lanes[kReduceLanes][kReduceCols + 1];  // +1: the column-wise read below is conflict-free
  const int lx = threadIdx.x % kReduceCols;            // column within the block, = lane
  const int ly = threadIdx.x / kReduceCols;            // chunk lane, = warp
  const int64_t col = int64_t{blockIdx.x} * kReduceCols + lx;
  A s = A(0);
  if (col < H) {
#pragma unroll 4
    for (int64_t c = ly; c < chunks; c += kReduceLanes) s += partial[c * H + col];
  }
  lanes[ly][lx] = s;
  __syncthreads();
  A v = lanes[lx][ly];  // warp ly, lane lx: column ly's sum from chunk lane lx
  v = warp_reduce(v, SumOp<A>{});  // valid in every lane
  const int64_t out_col = int64_t{blockIdx.x} * kReduceCols + ly;
  if (lx == 0 && out_col < H) dbias[out_col] = Convert<T>::from_acc(v);
}

template <int kVec, typename T, typename Gelu>
cudaError_t launch_bias_gelu_backward_as(const T* dy, const T* x, const T* bias, T* dx, acc_t<T>* partial, T* dbias,
                                         int64_t rows, int64_t H, const BiasGeluPlan& p, Gelu gelu,
                                         cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.col_tiles), static_cast<unsigned>(p.row_chunks));
  constexpr int kU = bias_gelu_unroll(sizeof(T), kVec > 1);
  bias_gelu_backward_kernel<kVec, kU><<<grid, p.threads(), 0, stream>>>(x, bias, dy, dx, partial, dbias, rows, H,
                                                                         p.tx, p.rows_per_chunk, gelu);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || p.row_chunks == 1) return err;
  const auto reduce_grid = static_cast<unsigned>(ceil_div(H, kReduceCols));
  bias_grad_reduce_kernel<T><<<reduce_grid, kReduceCols * kReduceLanes, 0, stream>>>(partial, dbias, p.row_chunks, H);
  return cudaGetLastError();
}

}  // namespace elementwise

// ---- the plain launchers ----------------------------------------------------------------------------

// The access width bias_gelu uses for these pointers and row length: vec_width<T>() when H is a
// multiple of it and every pointer is 16-byte aligned, else 1.
template <typename T>
int bias_gelu_vec(int64_t H, const void* a, const void* b, const void* c, const void* d = nullptr) {
  return H % vec_width<T>() == 0 && elementwise::all_vec_aligned(a, b, c, d) ? vec_width<T>() : 1;
}

// y = f(x), f one of math::GeluErf, math::GeluTanh, math::Sigmoid. x, y: [n], dense, one memory order.
template <typename T, typename F>
cudaError_t activation_forward(const T* x, T* y, int64_t n, F f, cudaStream_t stream) {
  return elementwise::launch_elementwise<T>(x, nullptr, y, n, elementwise::ForwardOp<F>{f}, stream);
}

// dx = dy * gelu'(x), Gelu one of math::GeluErf, math::GeluTanh. dy, x, dx: [n].
template <typename T, typename Gelu>
cudaError_t gelu_backward(const T* dy, const T* x, T* dx, int64_t n, Gelu gelu, cudaStream_t stream) {
  return elementwise::launch_elementwise<T>(dy, x, dx, n, elementwise::DerivativeOp<Gelu>{gelu}, stream);
}

// dx = dy * y (1 - y), y = sigmoid(x) the forward's output. dy, y, dx: [n].
template <typename T>
cudaError_t sigmoid_backward(const T* dy, const T* y, T* dx, int64_t n, cudaStream_t stream) {
  return elementwise::launch_elementwise<T>(dy, y, dx, n, elementwise::SigmoidBackwardOp{}, stream);
}

// y = gelu(x + bias). x, y: [rows, H] contiguous; bias: [H]. 128-bit accesses when
// bias_gelu_vec<T>(H, x, bias, y) allows them, else element accesses.
template <typename T, typename Gelu>
cudaError_t bias_gelu_forward(const T* x, const T* bias, T* y, int64_t rows, int64_t H, Gelu gelu,
                              cudaStream_t stream) {
  if (rows <= 0 || H <= 0) return cudaSuccess;
  if (bias_gelu_vec<T>(H, x, bias, y) > 1)
    return elementwise::launch_bias_gelu_forward_as<vec_width<T>()>(x, bias, y, rows * H, H, gelu, stream);
  return elementwise::launch_bias_gelu_forward_as<1>(x, bias, y, rows * H, H, gelu, stream);
}

// dx = dy * gelu'(x + bias), dbias = sum over rows of dx (computed in acc_t, deterministically).
// dy, x, dx: [rows, H] contiguous; bias, dbias: [H]; workspace: plan.workspace_elems(H) acc_t elements
// (may be null when that is 0). plan from plan_bias_gelu(rows, H, bias_gelu_vec<T>(H, dy, x, bias, dx),
// sm_count). Two kernels when plan.row_chunks > 1 (the second reads only the workspace).
template <typename T, typename Gelu>
cudaError_t bias_gelu_backward(const T* dy, const T* x, const T* bias, T* dx, T* dbias, acc_t<T>* workspace,
                               int64_t rows, int64_t H, const elementwise::BiasGeluPlan& plan, Gelu gelu,
                               cudaStream_t stream) {
  if (rows <= 0 || H <= 0) return cudaSuccess;
  if (plan.vec == vec_width<T>()) {
    return elementwise::launch_bias_gelu_backward_as<vec_width<T>()>(dy, x, bias, dx, workspace, dbias, rows, H, plan,
                                                                     gelu, stream);
  }
  return elementwise::launch_bias_gelu_backward_as<1>(dy, x, bias, dx, workspace, dbias, rows, H, plan, gelu, stream);
}

}  // namespace fastact
