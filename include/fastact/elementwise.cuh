// Elementwise kernels of the activations and their plain launchers (torch-free):
//
//   elementwise_kernel   y = f(x) (the pointwise forwards) and dx = g(dy, z) (the backward forms:
//                        gelu dx = dy * gelu'(x), sigmoid dx = dy * y (1 - y) from the output y),
//                        over n elements of dense, identically laid out arrays, in memory order.
//   bias_gelu_forward_kernel   y = gelu(x + bias) over a contiguous [rows, H] array, bias [H]
//                        broadcast over rows, in memory order like elementwise_kernel.
//   bias_gelu_backward_kernel  dx = dy * gelu'(x + bias), and the sums of dx over the rows of its
//                        tile into per-tile column partials.
//   bias_grad_reduce_kernel   dbias[h] = sum of the partials of column h, in a fixed order.
//
// Element types: float, double, __half, __nv_bfloat16 (csrc maps at::Half / at::BFloat16 onto the
// last two). Arithmetic in acc_t<T> through the functors of fastact/math.h.
//
// Memory-bound by design: vector accesses (AlignedVector) when every pointer is 16-byte aligned, 128
// bits wide except where elementwise_shape measured 64 better (two-operand backwards but the 16-bit tanh GELU's),
// with 64-bit indices: every kernel as one tile per block over a grid of ceil(n / tile) blocks (bias_gelu's
// backward: tiles of whole column strips over 32 rows, so a block's column sums cover its rows). No
// atomics, no host synchronisation, no state: every launcher only enqueues on `stream`, so all of this
// is CUDA-graph capturable and deterministic.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "fastact/element_rows.h"
#include "fastact/math.h"
#include "fastact/memory_depth.cuh"
#include "fastact/reduce.cuh"
#include "fastact/vec.cuh"

namespace fastact {
namespace elementwise {

// ---- launch shape: one place for the launchers and for explain() ----------------------------------

// bias_gelu_backward_kernel: 8 warps; a block is kBiasGeluTx accesses along a row (a warp: 512 bytes
// of each row with 16-byte accesses) times kThreads / kBiasGeluTx rows side by side, where rows are
// that wide (BiasGeluPlan).
constexpr int kThreads = 256;
constexpr int kBiasGeluTx = 32;
// Blocks the register cap must allow on one SM (__launch_bounds__ min blocks): 3 x 256 threads, at
// most 85 registers a thread: every row of a thread's tile is loaded before any arithmetic (x and dy,
// 4 rows: 32 registers in 16-bit), plus its bias and column sums (2 x 8 floats).
// Why (H100, 16384 x 4096 and 8192 x 8192, tanh, a diag sweep of tile shapes in one process;
// docs/performance.md, bias_gelu): 32 x 8 threads x 4 rows at 3 blocks: bf16 145.6 / 145.0 us, f32
// 275.0, against the persistent one-wave kernel it replaced at 151.8 / 151.6 and 290.4 (and the
// elementwise gelu backward on the same bytes without dbias at 133.8 / 261.6). Uncapped (107
// registers) 147.5 / 146.6; 8-byte accesses 152.8-191.2; 64 accesses along a row 159.6-181.7 (bf16);
// 2 rows a thread 149.9-174.5.
constexpr int kBiasGeluMinBlocks = 3;
// ---- elementwise_kernel: one tile per block ---------------------------------------------------------
// Each thread makes one or two independent loads an operand (elementwise_shape below), issued before
// any arithmetic; a block does one tile and exits, so the grid is ceil(n / tile) blocks and the SMs
// keep as many blocks resident as registers allow (no persistent loop, no shared memory):
// memory-level parallelism comes from many resident warps, as in torch's own vectorised elementwise
// kernel, instead of a deep per-thread pipeline.
//
// Threads of a block, where elementwise_shape does not say otherwise (and of bias_gelu's forward tile).
constexpr int kEltThreads = 128;
// Element loads per thread on the scalar (misaligned) path: each moves only 2-8 bytes.
constexpr int kEltScalarLoadsPerThread = 8;

// Launch shape of elementwise_kernel: threads a block, bytes of one vector access (16 or 8; the
// vector path needs 16-byte aligned pointers either way), accesses per thread and operand (the
// unroll factor), and the blocks per SM its register cap must allow (__launch_bounds__ min blocks,
// min_blocks x threads = 2048: at most 32 registers a thread, full occupancy; 0: no cap).
struct EltShape {
  int threads;
  int access_bytes;
  int unroll;
  int min_blocks;
};

// The transcendental an op evaluates per element, which sets its instruction cost and so, near the memory
// limit, its best launch shape: sigmoid (exp and a division, forward; none backward: y (1 - y)), tanh gelu
// (tanhf) or erf gelu; each math.h functor names its own (kCost). On 16-bit elements the erf GELU and the
// sigmoid forward run their 16-bit math forms (math.h GeluErf16, Sigmoid16: two MUFUs and ~16 / ~6 other
// instructions); on float and double erff / expf.
using EltMath = ::fastact::EltMath;

// The shape for elements of `elem_bytes` bytes and an op reading `arity` operands with `math`.
// Vector path, from sweeps against torch and torch.compile on the H100 (256 MB tensors; the 16-bit figures from
// diag builds of this kernel at forced shapes, timed beside torch's ops in one process; docs/performance.md,
// elementwise):
//   one operand (forwards), float: 128 threads, one 16-byte access, 32 registers: torch's own access shape
//       (full occupancy), 0.997-1.007x torch on every op; more accesses or registers lose occupancy
//   16-bit erf and sigmoid forwards (their 16-bit math forms): 512 threads, one 16-byte access, 32 registers:
//       erf bf16 / f16 180.7 / 180.1 us (torch 190.9 / 187.3), where 256 threads took 181.3 / 180.9, 128
//       threads 181.6 / 181.2 and the old erff shape (2 accesses, loads tied) 182.3 / 182.3; sigmoid 181.2 /
//       180.5 (torch 181.3 / 181.0), 128 threads 181.7 / 181.5; 4 accesses 184.5-207.9 (spills)
//   16-bit tanh forward: 256 threads, otherwise the same (0.998-0.999 of torch's time in five of the six
//       dtype-runs, 1.001 in one, where 128 threads took 1.000-1.004)
//   two operands (backwards), float and 16-bit sigmoid and erf: 512 threads, one 8-byte access, 32 registers:
//       262.7-263.3 us where the 16-byte, 128-thread shape took 265.7-266.7 (f32 gelu / sigmoid, bf16
//       sigmoid), with torch.compile at 262.7-266.3; its autotuner picks 8-byte accesses too (256
//       threads) for float. 16-bit erf: 264.2 / 264.0 (torch 265.3 / 264.2), 128 threads x 16 bytes 266.7
//       / 266.6 (with erff, 8-byte accesses were issue-bound: 283.8 against 265.5)
//   16-bit tanh backward: 512 threads, one 16-byte access (0.992-0.995 of torch's time, 8 bytes 1.000-
//       1.002; three runs)
//   double: 128 threads, 16 bytes, 2 / 1 accesses (one / two operands), no cap: its erf/exp/tanh need
//       twice the registers
// Scalar path: 128 threads, 8 element accesses a thread over all operands (4 for double), no cap.
//
// A kDeep device (memory_depth.cuh: the H200) needs more bytes in flight a thread than those H100 shapes keep.
// There every float and 16-bit vector shape is 128 threads of 16-byte accesses at 32 registers, with two accesses
// for 16-bit forwards and the 16-bit GELU backwards (the same diag builds with float rows, H200, 256 MB, five
// rounds, us: the H100 shape -> this one (torch)):
//   two operands, one access: float sigmoid / tanh / erf backward 194.1 / 201.0 / 208.1 -> 186.8 / 186.8 /
//       186.7 (187.5), 16-bit sigmoid backward 196.5 -> 186.6 (186.7). 8-byte accesses at 512 threads leave
//       too few bytes in flight there
//   16-bit forwards, two accesses: sigmoid 149.3 -> 134.0 (142.2), tanh 151.3 -> 136.3 (150.9); one access:
//       151.7-153.2
//   16-bit tanh and erf backwards, two accesses: 217.6 -> 190.1 (211.4), 241.6 -> 223.5 (245.5)
//   float forwards: one access, as on the H100 (129.2-130.6 at one or two; torch 130.2-130.7)
// (bf16 figures; f16 within 2%. The erf figures are erff's: with erff the erf forward took four accesses there,
// 154.0; its 16-bit math form takes the other forwards' two, not yet timed on an H200.) On the H100 the same
// two-access shapes lost 0.5-1%, so each class keeps its own. Under the 32-register cap ptxas spills a little in
// the deep bf16 tanh and erf backwards (bytes stored / loaded: 20 / 44, 4 / 16); the diag's twins, which spill
// alike, gave the figures above.
constexpr EltShape elementwise_shape(int elem_bytes, int arity, bool vectorised, EltMath math,
                                     MemoryDepth depth = MemoryDepth::kStandard) {
  if (!vectorised) {
    const int loads = kEltScalarLoadsPerThread / (elem_bytes == 8 ? 2 : 1);
    return {kEltThreads, elem_bytes, loads / arity < 1 ? 1 : loads / arity, 0};
  }
  if (elem_bytes == 8) return {kEltThreads, kVecBytes, arity == 1 ? 2 : 1, 0};
  if (depth == MemoryDepth::kDeep) {
    const int unroll = elem_bytes != 2 ? 1 : arity == 1 ? 2 : (math == EltMath::kSigmoid ? 1 : 2);
    return {kEltThreads, kVecBytes, unroll, 16};
  }
  if (elem_bytes == 2 && math == EltMath::kTanh) {
    return arity == 1 ? EltShape{256, kVecBytes, 1, 8} : EltShape{512, kVecBytes, 1, 4};
  }
  if (arity == 2) return {512, 8, 1, 4};
  if (elem_bytes == 2) return {512, kVecBytes, 1, 4};
  return {kEltThreads, kVecBytes, 1, 16};
}

// ---- bias_gelu: accesses per thread ----------------------------------------------------------------
// 16-byte loads of the forward tile per thread (x and the bias vector, which comes from L1; one
// access a thread instead measured 93.7 -> 97.4 us on bf16 16384x4096), and element loads per thread
// of the scalar (misaligned) paths; both over two operands.
constexpr int kVecLoadsPerThread = 4;
constexpr int kScalarLoadsPerThread = 8;

// bias_gelu forward: accesses per thread and operand (two operands' worth of the loads above).
constexpr int bias_gelu_forward_unroll(int elem_bytes, bool vectorised) {
  const int loads = (vectorised ? kVecLoadsPerThread : kScalarLoadsPerThread) / (elem_bytes == 8 ? 2 : 1);
  return loads / 2 < 1 ? 1 : loads / 2;
}

// bias_gelu backward: rows a thread loads at once (x and dy of each, plain loads into registers,
// all issued before any arithmetic). Vector path: 4 (kBiasGeluMinBlocks says why); scalar path: 8,
// element loads being cheap in registers. A tile of 8 x 4 rows makes the workspace of per-tile column
// sums 1/32 of dx's elements (4 bytes each: 1/16 of a 16-bit dx's bytes), written once and read once
// by bias_grad_reduce_kernel.
constexpr int bias_gelu_backward_rows(bool vectorised) { return vectorised ? 4 : 8; }

// bias_gelu backward: at most this many row groups (tiles along the rows); a taller tensor's blocks
// take several tiles' rows one after another (BiasGeluPlan::steps). Why: it bounds the workspace at
// kMaxRowGroups x H floats (32 MiB at H = 4096) however many rows there are, and only tensors of more
// than 64K rows (at 32 rows a tile) pay for it.
constexpr int64_t kMaxRowGroups = 2048;
// bias_grad_reduce_kernel: a block reduces 32 columns (one coalesced 128-byte row segment of float
// partials per warp) with 32 lanes along the group dim (1024 threads).
constexpr int kReduceCols = 32;
constexpr int kReduceLanes = 32;

FASTACT_HOST_DEVICE constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks of elementwise_kernel (and of bias_gelu's forward) for n elements, `threads` a block, `vec`
// elements per access, `unroll` accesses per thread and operand: one tile of threads * unroll * vec
// elements each.
inline int64_t elementwise_grid(int64_t n, int threads, int vec, int unroll) {
  return std::max<int64_t>(1, ceil_div(n, int64_t{threads} * unroll * vec));
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

// y = f(x): F a math.h functor of a pointwise op (fastact/op_table.h), or its 16-bit form. kMath: the cost class
// that picks the launch shape (elementwise_shape).
template <typename F>
struct ForwardOp {
  static constexpr int kArity = 1;
  static constexpr EltMath kMath = F::kCost;
  F f;
  template <typename A>
  FASTACT_DEVICE A operator()(A x) const {
    return f.forward(x);
  }
};

// dx = dy * f'(s), s the forward's input or (kFromOutput) its output: torch's gelu_backward, sigmoid_backward.
template <typename F, bool kFromOutput>
struct BackwardOp {
  static constexpr int kArity = 2;
  static constexpr EltMath kMath = F::kCost;
  math::Backward<F, kFromOutput> f;
  template <typename A>
  FASTACT_DEVICE A operator()(A dy, A s) const {
    return f(dy, s);
  }
};

// a * f''(s): the backward's derivative with respect to s (double backward), shaped as the backward; kOrder 3:
// a * f'''(s) (triple backward).
template <typename F, bool kFromOutput, int kOrder>
struct BackwardGradOp {
  static constexpr int kArity = 2;
  static constexpr EltMath kMath = F::kCost;
  math::BackwardGrad<F, kFromOutput, kOrder> f;
  template <typename A>
  FASTACT_DEVICE A operator()(A a, A s) const {
    return f(a, s);
  }
};

// y = gelu(x + b): bias_gelu's forward as a two-operand op, for the rows kernel (x a strided stack of
// rows, the bias its second input at row stride 0). Gelu: math::GeluErf or math::GeluTanh.
template <typename Gelu>
struct BiasGeluForwardOp {
  static constexpr int kArity = 2;
  static constexpr EltMath kMath = Gelu::kCost;
  Gelu gelu;
  template <typename A>
  FASTACT_DEVICE A operator()(A x, A b) const {
    return gelu.forward(x + b);
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

// One tile with plain loads: each of the kThreads_ threads handles kUnroll_ accesses of kVec elements,
// access u at `offset + u * kThreads_ * kVec` (the block's accesses are consecutive, so every warp
// access is coalesced). Every load of the tile is issued before any arithmetic. kGuard: only accesses
// whose index within the tile, threadIdx.x + u * kThreads_, is below `valid` exist (the last tile).
template <int kThreads_, int kVec, int kUnroll_, bool kGuard, typename T, typename Op>
FASTACT_DEVICE void elementwise_tile(const T* __restrict__ in0, const T* __restrict__ in1, T* __restrict__ out,
                                     int64_t offset, int64_t valid, const Op& op) {
  using Vec = AlignedVector<T, kVec>;
  constexpr int64_t kStride = int64_t{kThreads_} * kVec;  // elements from access u to u + 1
  Vec a[kUnroll_];
  Vec b[kUnroll_];
#pragma unroll
  for (int u = 0; u < kUnroll_; ++u) {
    if (!kGuard || threadIdx.x + u * kThreads_ < valid) {
      a[u] = load_vector<T, kVec>(in0 + offset + u * kStride);
      if constexpr (Op::kArity == 2) b[u] = load_vector<T, kVec>(in1 + offset + u * kStride);
    }
  }
#pragma unroll
  for (int u = 0; u < kUnroll_; ++u) {
    if (!kGuard || threadIdx.x + u * kThreads_ < valid) {
      store_vector<T, kVec>(out + offset + u * kStride, apply_vec<T, kVec>(op, a[u], Op::kArity == 2 ? b[u] : a[u]));
    }
  }
}

// out[i] = op(in0[i]) or op(in0[i], in1[i]) for i in [0, n): in0, in1, out are dense arrays of one
// memory order ([n] each; in1 unused for unary ops). Block b takes tile b, elements
// [b * kTile, (b + 1) * kTile). kVec > 1 requires every pointer 16-byte aligned (then every access
// is: offsets are multiples of kVec). The last block takes what is left, fewer than kTile elements:
// first as whole accesses, then the last n % kVec elements one each (the scalar tail starts exactly
// where the vector body ends). blockDim.x == kThreads_.
template <int kThreads_, int kVec, int kUnroll_, int kMinBlocks, typename T, typename Op>
__global__ void __launch_bounds__(kThreads_, kMinBlocks)
    elementwise_kernel(const T* __restrict__ in0, const T* __restrict__ in1, T* __restrict__ out, int64_t n,
                       Op op) {
  constexpr int64_t kTile = int64_t{kThreads_} * kUnroll_ * kVec;
  const int64_t start = int64_t{blockIdx.x} * kTile;
  const int64_t first = start + int64_t{threadIdx.x} * kVec;  // this thread's first element
  if (n - start >= kTile) {
    elementwise_tile<kThreads_, kVec, kUnroll_, false>(in0, in1, out, first, 0, op);
    return;
  }
  const int64_t rest_vecs = (n - start) / kVec;  // whole accesses in the last tile, < kThreads_ * kUnroll_
  if (rest_vecs > 0) elementwise_tile<kThreads_, kVec, kUnroll_, true>(in0, in1, out, first, rest_vecs, op);
  if constexpr (kVec > 1) {
    const int64_t i = start + rest_vecs * kVec + threadIdx.x;  // n - i < kVec <= kThreads_
    if (i < n) {
      elementwise_tile<kThreads_, 1, 1, false>(in0 + i, Op::kArity == 2 ? in1 + i : in1, out + i, 0, 0, op);
    }
  }
}

// True when every non-null pointer allows 128-bit accesses.
inline bool all_vec_aligned(const void* a, const void* b, const void* c, const void* d = nullptr) {
  return is_vec_aligned(a) && is_vec_aligned(b) && is_vec_aligned(c) && is_vec_aligned(d);
}

template <int kThreads_, int kVec, int kUnroll_, int kMinBlocks, typename T, typename Op>
cudaError_t launch_elementwise_as(const T* in0, const T* in1, T* out, int64_t n, Op op, cudaStream_t stream) {
  // gridDim.x may reach 2^31 - 1: with tiles of >= 1024 elements, n would have to pass 2^41.
  const int64_t grid = elementwise_grid(n, kThreads_, kVec, kUnroll_);
  if (grid > int64_t{0x7fffffff}) return cudaErrorInvalidConfiguration;
  elementwise_kernel<kThreads_, kVec, kUnroll_, kMinBlocks, T, Op>
      <<<static_cast<unsigned>(grid), kThreads_, 0, stream>>>(in0, in1, out, n, op);
  return cudaGetLastError();
}

// Whether Op is bias_gelu's forward (elementwise_rows_shape's bias).
template <typename Op>
constexpr bool kBiasOp = false;
template <typename Gelu>
constexpr bool kBiasOp<BiasGeluForwardOp<Gelu>> = true;

// The cost class of an Op (elementwise_shape's math): its functor's.
template <typename Op>
constexpr EltMath kMathOf = Op::kMath;

constexpr bool operator==(const EltShape& a, const EltShape& b) {
  return a.threads == b.threads && a.access_bytes == b.access_bytes && a.unroll == b.unroll &&
         a.min_blocks == b.min_blocks;
}

// The vector path of Op over T in the shape of a kDepth device.
template <typename T, typename Op, MemoryDepth kDepth>
cudaError_t launch_elementwise_vec(const T* in0, const T* in1, T* out, int64_t n, Op op, cudaStream_t stream) {
  constexpr EltShape kS = elementwise_shape(sizeof(T), Op::kArity, true, kMathOf<Op>, kDepth);
  return launch_elementwise_as<kS.threads, kS.access_bytes / static_cast<int>(sizeof(T)), kS.unroll, kS.min_blocks,
                               T, Op>(in0, in1, out, n, op, stream);
}

// Whether a kDeep device takes another vector shape for Op over T than a kStandard one (where not, only one
// is instantiated, and the launcher asks nothing of the device).
template <typename T, typename Op>
constexpr bool kDepthMatters =
    !(elementwise_shape(sizeof(T), Op::kArity, true, kMathOf<Op>, MemoryDepth::kDeep) ==
      elementwise_shape(sizeof(T), Op::kArity, true, kMathOf<Op>, MemoryDepth::kStandard));

// Vector path when every pointer is 16-byte aligned, in the shape of the current device's memory depth;
// else the scalar path.
template <typename T, typename Op>
cudaError_t launch_elementwise(const T* in0, const T* in1, T* out, int64_t n, Op op, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (all_vec_aligned(in0, in1, out)) {
    if constexpr (kDepthMatters<T, Op>) {
      if (current_memory_depth() == MemoryDepth::kDeep) {
        return launch_elementwise_vec<T, Op, MemoryDepth::kDeep>(in0, in1, out, n, op, stream);
      }
    }
    return launch_elementwise_vec<T, Op, MemoryDepth::kStandard>(in0, in1, out, n, op, stream);
  }
  constexpr EltShape kS = elementwise_shape(sizeof(T), Op::kArity, false, kMathOf<Op>);
  return launch_elementwise_as<kS.threads, 1, kS.unroll, kS.min_blocks>(in0, in1, out, n, op, stream);
}

// ---- elementwise_rows_kernel: inputs that are strided stacks of rows -----------------------------------

// How an access of the rows kernel moves to the one kThreads accesses further on: kThreads / per_row whole rows and
// `cols` = kThreads % per_row accesses on, and one row more where its column passes the row's end. delta: the
// elements an input pointer moves for that step; wrap: what it moves more at such a row end.
struct RowStep {
  uint32_t cols = 0;
  int64_t delta0 = 0, delta1 = 0;
  int64_t wrap0 = 0, wrap1 = 0;

  RowStep() = default;
  RowStep(int64_t threads, int64_t per_row, int vec, int64_t stride0, int64_t stride1)
      : cols(static_cast<uint32_t>(threads % per_row)),
        delta0(threads / per_row * stride0 + threads % per_row * vec),
        delta1(threads / per_row * stride1 + threads % per_row * vec),
        wrap0(stride0 - per_row * vec),
        wrap1(stride1 - per_row * vec) {}
};

// out[r * cols + c] = op(in0[r * stride0 + c]) or op(in0[r * stride0 + c], in1[r * stride1 + c]) for the
// rows of a launch (ElementRows; the output dense). Accesses of kVec elements: kVec divides cols and both
// strides and every pointer is aligned to an access (element_rows_vec), so no access straddles two rows.
// Access q of the launch is unit q % per_row of row q / per_row (per_row = cols / kVec). Block b takes
// accesses [b * kThreads_ * kUnroll_, ...), thread t those t + u * kThreads_, every load of the block issued
// before any arithmetic, as in elementwise_tile. A thread divides only its first access's index by per_row
// (RowDivider, so a launch holds fewer than 2^31 accesses: launch_elementwise_rows_as splits the rows); its
// later accesses step their input pointers (RowStep). Dividing every access, with its two 64-bit row addresses,
// cost registers that deep shapes (several accesses a thread) do not have: under a cap ptxas spilled, without
// one occupancy fell (measured on the H200: docs/performance.md, elementwise).
template <int kThreads_, int kVec, int kUnroll_, int kMinBlocks, typename T, typename Op>
__global__ void __launch_bounds__(kThreads_, kMinBlocks)
    elementwise_rows_kernel(const T* __restrict__ in0, int64_t stride0, const T* __restrict__ in1, int64_t stride1,
                            T* __restrict__ out, uint32_t accesses, uint32_t per_row, RowDivider div, RowStep step,
                            Op op) {
  using Vec = AlignedVector<T, kVec>;
  const uint32_t first = blockIdx.x * uint32_t{kThreads_ * kUnroll_} + threadIdx.x;
  if (first >= accesses) return;  // so are its later accesses
  const uint32_t r = div.quotient(first);
  uint32_t c = first - r * per_row;
  const T* p0 = in0 + r * stride0 + int64_t{c} * kVec;
  const T* p1 = Op::kArity == 2 ? in1 + r * stride1 + int64_t{c} * kVec : nullptr;
  Vec a[kUnroll_];
  Vec b[kUnroll_];
#pragma unroll
  for (int u = 0; u < kUnroll_; ++u) {
    if (u > 0) {  // pointers past the launch's last access are formed but not read
      c += step.cols;
      p0 += step.delta0;
      if constexpr (Op::kArity == 2) p1 += step.delta1;
      if (c >= per_row) {
        c -= per_row;
        p0 += step.wrap0;
        if constexpr (Op::kArity == 2) p1 += step.wrap1;
      }
    }
    if (first + u * kThreads_ < accesses) {
      a[u] = load_vector<T, kVec>(p0);
      if constexpr (Op::kArity == 2) b[u] = load_vector<T, kVec>(p1);
    }
  }
#pragma unroll
  for (int u = 0; u < kUnroll_; ++u) {
    const uint32_t q = first + u * kThreads_;
    if (q < accesses) {
      store_vector<T, kVec>(out + int64_t{q} * kVec, apply_vec<T, kVec>(op, a[u], Op::kArity == 2 ? b[u] : a[u]));
    }
  }
}

// Launch shape of elementwise_rows_kernel: elementwise_shape's, except that
// - on a kStandard device (one access a thread), 16-bit two-operand ops take 16-byte accesses where the flat kernel
//   takes 8-byte ones (the sigmoid and erf GELU backwards, bias_gelu's erf forward; 512 threads either way): every
//   access also divides its index by the row length and forms two row addresses, which 8-byte accesses pay twice
//   per byte. H100, chunk views ([rows, 4096] of [rows, 8192], 256 MB), backward, us at 8 / 16 bytes (measured
//   when the flat 16-bit tanh backward took 8 bytes too): bf16 tanh gelu 274.8 / 268.4 (torch.compile
//   267.7-267.9); float tanh gelu 265.8 / 267.8, erf 267.3 / 267.7 (torch.compile 264.5): float keeps 8 bytes,
//   but where the second input is bias_gelu's bias (`bias`, read from L1 at row stride 0): f32 bias_gelu forward
//   182.2 at 16 bytes, 198.7 at 8.
// - on a kDeep device, the 16-bit GELU two-operand ops (backwards, bias_gelu's forward) take four 16-byte accesses
//   a thread at 128 threads, uncapped (56-64 registers), and the 16-bit sigmoid forward one. The flat kernel's deep
//   shape (two accesses, 32 registers) spilled here: H200, bf16 chunk views [32768, 4096] of 8192, us, that shape
//   -> this one (torch.compile): tanh / erf GELU backward 329.7 / 283.1 -> 194.6 / 189.7 (209.0 / 264.2), bias_gelu
//   erf / tanh forward 227.8 / 198.9 -> 139.5 / 154.8 (214.5 / 181.3); sigmoid forward 130.9 -> 130.0 (129.6). f16,
//   which that shape did not slow: tanh GELU backward 189.6 -> 198.7 (210.2), bias_gelu erf forward 134.7 -> 134.9.
//   (A diag build of this launcher at other shapes, timed beside torch.compile.) 8 CTAs an SM (64 registers) was
//   ahead in bf16 bias_gelu (132.5 / 144.8 in the diag's 2-D twin) but 9% behind in f16 tanh backward.
constexpr EltShape elementwise_rows_shape(int elem_bytes, int arity, bool vectorised, EltMath math, bool bias,
                                          MemoryDepth depth = MemoryDepth::kStandard) {
  if (depth == MemoryDepth::kDeep && vectorised && elem_bytes == 2) {
    if (arity == 2 && math != EltMath::kSigmoid) return {kEltThreads, kVecBytes, 4, 0};
    if (arity == 1 && math == EltMath::kSigmoid) return {kEltThreads, kVecBytes, 1, 16};
  }
  const EltShape s = elementwise_shape(elem_bytes, arity, vectorised, math, depth);
  const bool widen = vectorised && s.access_bytes == 8 && (elem_bytes == 2 || bias);
  return widen ? EltShape{s.threads, kVecBytes, s.unroll, s.min_blocks} : s;
}

// Whether the rows of g take accesses of `vec` elements: every pointer 16-byte aligned (so each row
// start, a multiple of vec elements further, is aligned to an access) and vec dividing cols and the
// inputs' row strides (in1 null: a unary op).
inline bool element_rows_vec(const ElementRows& g, int vec, const void* in0, const void* in1, const void* out) {
  return all_vec_aligned(in0, in1, out) && g.cols % vec == 0 && g.stride0 % vec == 0 &&
         (in1 == nullptr || g.stride1 % vec == 0);
}

// Launches of elementwise_rows_kernel over g's rows, at most 2^31 - 1 accesses each. Rows of 2^31
// accesses or more (tens of GB) go one at a time through elementwise_kernel: each row alone is flat.
template <int kThreads_, int kVec, int kUnroll_, int kMinBlocks, typename T, typename Op>
cudaError_t launch_elementwise_rows_as(const T* in0, const T* in1, T* out, const ElementRows& g, Op op,
                                       cudaStream_t stream) {
  constexpr int64_t kMaxAccesses = 0x7fffffff;
  const int64_t per_row = g.cols / kVec;
  // Row r of an input (in1 is null for unary ops).
  const auto row_of = [](const T* p, int64_t stride, int64_t r) { return p == nullptr ? p : p + r * stride; };
  if (per_row > kMaxAccesses) {
    for (int64_t r = 0; r < g.rows; ++r) {
      const cudaError_t err = launch_elementwise_as<kThreads_, kVec, kUnroll_, kMinBlocks>(
          row_of(in0, g.stride0, r), row_of(in1, g.stride1, r), out + r * g.cols, g.cols, op, stream);
      if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
  }
  const int64_t rows_per_launch = kMaxAccesses / per_row;
  const RowDivider div(per_row);
  const RowStep step(kThreads_, per_row, kVec, g.stride0, g.stride1);
  for (int64_t r0 = 0; r0 < g.rows; r0 += rows_per_launch) {
    const int64_t accesses = std::min(rows_per_launch, g.rows - r0) * per_row;
    const int64_t grid = ceil_div(accesses, int64_t{kThreads_} * kUnroll_);
    const auto kernel = elementwise_rows_kernel<kThreads_, kVec, kUnroll_, kMinBlocks, T, Op>;
    kernel<<<static_cast<unsigned>(grid), kThreads_, 0, stream>>>(row_of(in0, g.stride0, r0), g.stride0,
                                                                  row_of(in1, g.stride1, r0), g.stride1,
                                                                  out + r0 * g.cols, static_cast<uint32_t>(accesses),
                                                                  static_cast<uint32_t>(per_row), div, step, op);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

// The elementwise op over operands laid out as g: the flat kernels when every operand is at the
// output's offsets, else the rows kernel, with elementwise_rows_shape's vector accesses where
// element_rows_vec allows them and element accesses otherwise.
template <typename T, typename Op, MemoryDepth kDepth = MemoryDepth::kStandard>
cudaError_t launch_elementwise_rows(const T* in0, const T* in1, T* out, const ElementRows& g, Op op,
                                    cudaStream_t stream) {
  constexpr EltShape kV = elementwise_rows_shape(sizeof(T), Op::kArity, true, kMathOf<Op>, kBiasOp<Op>, kDepth);
  constexpr int kVec = kV.access_bytes / static_cast<int>(sizeof(T));
  if (element_rows_vec(g, kVec, in0, Op::kArity == 2 ? in1 : nullptr, out)) {
    return launch_elementwise_rows_as<kV.threads, kVec, kV.unroll, kV.min_blocks>(in0, in1, out, g, op, stream);
  }
  constexpr EltShape kS = elementwise_rows_shape(sizeof(T), Op::kArity, false, kMathOf<Op>, kBiasOp<Op>);
  return launch_elementwise_rows_as<kS.threads, 1, kS.unroll, kS.min_blocks>(in0, in1, out, g, op, stream);
}

template <typename T, typename Op>
cudaError_t launch_elementwise(const T* in0, const T* in1, T* out, const ElementRows& g, Op op,
                               cudaStream_t stream) {
  if (g.numel() <= 0) return cudaSuccess;
  if (g.is_flat()) return launch_elementwise(in0, in1, out, g.numel(), op, stream);
  constexpr bool kRowsDepthMatters =
      !(elementwise_rows_shape(sizeof(T), Op::kArity, true, kMathOf<Op>, kBiasOp<Op>, MemoryDepth::kDeep) ==
        elementwise_rows_shape(sizeof(T), Op::kArity, true, kMathOf<Op>, kBiasOp<Op>, MemoryDepth::kStandard));
  if constexpr (kRowsDepthMatters) {
    if (current_memory_depth() == MemoryDepth::kDeep) {
      return launch_elementwise_rows<T, Op, MemoryDepth::kDeep>(in0, in1, out, g, op, stream);
    }
  }
  return launch_elementwise_rows<T, Op>(in0, in1, out, g, op, stream);
}

// ---- bias_gelu --------------------------------------------------------------------------------------

// How a [rows, H] bias_gelu backward splits over the GPU. A row is H / vec accesses; a block is
// tx x ty threads: tx consecutive accesses of a row (a column strip) times ty rows side by side, so a
// thread owns one access column and loads its bias once. Rows are taken ty * rows_per_thread at a
// time (a batch): thread (lx, ly) takes rows ly, ly + ty, ... of each batch, so at each of its
// loads the block reads ty consecutive rows. Block b is column strip b % col_tiles of row group
// b / col_tiles, the rows [group * rows_per_block(), ...): `steps` batches, one after another. Rows of
// at most kBiasGeluTx accesses are one strip (tx = H / vec, ty = kThreads / tx); wider rows split
// into col_tiles equal strips of at most kBiasGeluTx accesses.
struct BiasGeluPlan {
  int vec = 1;              // elements per access: vec_width<T>() or 1
  int tx = 1;               // threads along a row, <= kBiasGeluTx
  int ty = 1;               // rows a block handles side by side: kThreads / tx
  int rows_per_thread = 1;  // rows of a batch a thread loads at once: bias_gelu_backward_rows
  int64_t steps = 1;        // batches a block takes, one after another
  int64_t col_tiles = 1;    // column strips: ceil(H / vec / tx)
  int64_t row_groups = 1;   // row groups: ceil(rows / rows_per_block()), <= kMaxRowGroups
  int64_t rows_per_block() const { return int64_t{ty} * rows_per_thread * steps; }
  int64_t blocks() const { return col_tiles * row_groups; }  // a 1-D grid (the launcher checks <= INT32_MAX)
  // acc_t elements of the backward's workspace of per-group column sums, [row_groups, H]; 0 when a
  // single group writes dbias directly.
  int64_t workspace_elems(int64_t H) const { return row_groups > 1 ? row_groups * H : 0; }
  int threads() const { return tx * ty; }
};

// rows >= 1, H >= 1, vec divides H.
inline BiasGeluPlan plan_bias_gelu(int64_t rows, int64_t H, int vec) {
  BiasGeluPlan p;
  p.vec = vec;
  const int64_t accesses = H / vec;  // per row
  p.col_tiles = ceil_div(accesses, kBiasGeluTx);
  p.tx = static_cast<int>(ceil_div(accesses, p.col_tiles));  // equal strips, <= kBiasGeluTx
  p.ty = kThreads / p.tx;
  p.rows_per_thread = bias_gelu_backward_rows(vec > 1);
  const int64_t batch = int64_t{p.ty} * p.rows_per_thread;
  p.steps = ceil_div(ceil_div(rows, batch), kMaxRowGroups);
  p.row_groups = ceil_div(rows, p.rows_per_block());
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

// One batch of a thread: rows u < valid (<= kRows) of one access column, row u at dy + u * stride (out
// likewise) and x + u * x_stride: every load first, then dx and the column sums in row order.
template <int kVec, int kRows, typename T, typename Gelu>
FASTACT_DEVICE void bias_gelu_batch(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ out,
                                    int64_t stride, int64_t x_stride, int valid, const acc_t<T> (&b)[kVec],
                                    acc_t<T> (&dsum)[kVec], const Gelu& gelu) {
  using Vec = AlignedVector<T, kVec>;
  Vec xv[kRows];
  Vec gv[kRows];
#pragma unroll
  for (int u = 0; u < kRows; ++u) {
    if (u < valid) {
      xv[u] = load_vector<T, kVec>(x + u * x_stride);
      gv[u] = load_vector<T, kVec>(dy + u * stride);
    }
  }
#pragma unroll
  for (int u = 0; u < kRows; ++u) {
    if (u < valid) store_vector<T, kVec>(out + u * stride, bias_gelu_apply(xv[u], gv[u], b, dsum, gelu));
  }
}

// bias_gelu backward: out = dx = dy * gelu'(x + bias) over the block's tile (BiasGeluPlan); then the
// block sums its rows' dx per column (thread sums in row order, then the ty threads of a column in ly
// order: a fixed order) and writes them to partial[group, col] (in acc_t), or straight to dbias[col]
// when there is a single row group. dy, out: [rows, H] contiguous; x: [rows, H], row r at x + r * x_row
// (x_row == H: contiguous; a strided stack of rows, read in place); bias, dbias: [H]; partial:
// [row_groups, H]. kVec > 1 needs H and x_row multiples of kVec and 16-byte aligned pointers.
// blockDim.x = tx * ty.
// kSteps: a block may take several batches (steps > 1). A separate instantiation because the loop's
// state costs registers: with it the bf16 kernel spills ~90 bytes at the 80-register cap, without
// it none.
template <int kVec, int kRows, bool kSteps, typename T, typename Gelu>
__global__ void __launch_bounds__(kThreads, kBiasGeluMinBlocks)
    bias_gelu_backward_kernel(const T* __restrict__ x, const T* __restrict__ bias, const T* __restrict__ dy,
                              T* __restrict__ out, acc_t<T>* __restrict__ partial, T* __restrict__ dbias,
                              int64_t rows, int64_t H, int64_t x_row, int tx, int col_tiles, int64_t steps,
                              Gelu gelu) {
  using A = acc_t<T>;
  using Vec = AlignedVector<T, kVec>;
  const int ty = blockDim.x / tx;
  const int lx = threadIdx.x % tx;
  const int ly = threadIdx.x / tx;
  const int64_t strip = blockIdx.x % static_cast<unsigned>(col_tiles);
  const int64_t group = blockIdx.x / static_cast<unsigned>(col_tiles);
  const int64_t col = (strip * tx + lx) * kVec;  // this thread's first column

  A dsum[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) dsum[j] = A(0);

  if (col < H) {  // threads past the row's end (last strip only) just join the reduction
    A b[kVec];
    {
      const Vec bv = load_vector<T, kVec>(bias + col);
#pragma unroll
      for (int j = 0; j < kVec; ++j) b[j] = Convert<T>::to_acc(bv.val[j]);
    }
    const int64_t batch = int64_t{ty} * kRows;
    const int64_t first = group * batch * steps + ly;  // this thread's first row
    const int64_t end = first - ly + batch * steps < rows ? first - ly + batch * steps : rows;
    const int64_t stride = int64_t{ty} * H;  // elements from one of a thread's rows to the next
    const int64_t x_stride = int64_t{ty} * x_row;
    const int64_t offset = first * H + col;
    const T* xp = x + first * x_row + col;
    const T* gp = dy + offset;
    T* op = out + offset;
    // Rows first, first + ty, ... below end: kRows a batch but in the group's last (< kRows * ty left).
    const auto valid = [&](int64_t left) {
      return left >= batch ? kRows : (static_cast<int>(left) + ty - 1) / ty;
    };
    if constexpr (kSteps) {
      for (int64_t left = end - first; left > 0; left -= batch) {
        bias_gelu_batch<kVec, kRows>(xp, gp, op, stride, x_stride, valid(left), b, dsum, gelu);
        xp += kRows * x_stride;
        gp += kRows * stride;
        op += kRows * stride;
      }
    } else if (end > first) {
      bias_gelu_batch<kVec, kRows>(xp, gp, op, stride, x_stride, valid(end - first), b, dsum, gelu);
    }
  }

  // [ty][tx * kVec + 1]: thread (lx, ly)'s sums at row ly, columns lx * kVec ... (the + 1 spreads the
  // column-wise reads below over the banks).
  __shared__ A sums[kThreads * kVec + kThreads];
  const int width = tx * kVec;  // columns of this strip
#pragma unroll
  for (int j = 0; j < kVec; ++j) sums[ly * (width + 1) + lx * kVec + j] = dsum[j];
  __syncthreads();
  const int64_t col0 = strip * width;
  for (int e = threadIdx.x; e < width && col0 + e < H; e += blockDim.x) {
    A s = A(0);
    for (int k = 0; k < ty; ++k) s += sums[k * (width + 1) + e];
    if (gridDim.x == static_cast<unsigned>(col_tiles)) {  // one row group
      dbias[col0 + e] = Convert<T>::from_acc(s);
    } else {
      partial[group * H + col0 + e] = s;
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
  constexpr int kU = bias_gelu_forward_unroll(sizeof(T), kVec > 1);
  const int64_t grid = elementwise_grid(n, kEltThreads, kVec, kU);
  if (grid > int64_t{0x7fffffff}) return cudaErrorInvalidConfiguration;
  const int64_t col_step = (int64_t{kEltThreads} * kVec) % H;
  bias_gelu_forward_kernel<kVec, kU><<<static_cast<unsigned>(grid), kEltThreads, 0, stream>>>(x, bias, y, n, H,
                                                                                               col_step, gelu);
  return cudaGetLastError();
}

// dbias[h] = sum over c of partial[c, h], c = 0 .. groups - 1. Block: kReduceCols columns x
// kReduceLanes lanes; lane l of a column sums groups l, l + kReduceLanes, ... in order, then warp w
// (all threads of one ly) sums column w's lanes by warp_reduce's fixed butterfly. The order depends
// only on (groups, H): bit-identical results run to run. partial: [groups, H] acc_t; dbias: [H].
template <typename T>
__global__ void __launch_bounds__(kReduceCols * kReduceLanes)
    bias_grad_reduce_kernel(const acc_t<T>* __restrict__ partial, T* __restrict__ dbias, int64_t groups,
                            int64_t H) {
  static_assert(kReduceCols == kWarpSize, "warp w of the block finishes column w");
  using A = acc_t<T>;
  __shared__ A lanes[kReduceLanes][kReduceCols + 1];  // +1: the column-wise read below is conflict-free
  const int lx = threadIdx.x % kReduceCols;            // column within the block, = lane
  const int ly = threadIdx.x / kReduceCols;            // group lane, = warp
  const int64_t col = int64_t{blockIdx.x} * kReduceCols + lx;
  A s = A(0);
  if (col < H) {
#pragma unroll 4
    for (int64_t c = ly; c < groups; c += kReduceLanes) s += partial[c * H + col];
  }
  lanes[ly][lx] = s;
  __syncthreads();
  A v = lanes[lx][ly];  // warp ly, lane lx: column ly's sum from group lane lx
  v = warp_reduce(v, SumOp<A>{});  // valid in every lane
  const int64_t out_col = int64_t{blockIdx.x} * kReduceCols + ly;
  if (lx == 0 && out_col < H) dbias[out_col] = Convert<T>::from_acc(v);
}

template <int kVec, typename T, typename Gelu>
cudaError_t launch_bias_gelu_backward_as(const T* dy, const T* x, int64_t x_row, const T* bias, T* dx,
                                         acc_t<T>* partial, T* dbias, int64_t rows, int64_t H, const BiasGeluPlan& p,
                                         Gelu gelu, cudaStream_t stream) {
  constexpr int kRows = bias_gelu_backward_rows(kVec > 1);
  if (p.vec != kVec || p.rows_per_thread != kRows || p.blocks() > INT32_MAX) return cudaErrorInvalidConfiguration;
  const auto kernel = p.steps > 1 ? bias_gelu_backward_kernel<kVec, kRows, true, T, Gelu>
                                  : bias_gelu_backward_kernel<kVec, kRows, false, T, Gelu>;
  kernel<<<static_cast<unsigned>(p.blocks()), p.threads(), 0, stream>>>(
      x, bias, dy, dx, partial, dbias, rows, H, x_row, p.tx, static_cast<int>(p.col_tiles), p.steps, gelu);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || p.row_groups == 1) return err;
  const auto reduce_grid = static_cast<unsigned>(ceil_div(H, kReduceCols));
  bias_grad_reduce_kernel<T><<<reduce_grid, kReduceCols * kReduceLanes, 0, stream>>>(partial, dbias, p.row_groups, H);
  return cudaGetLastError();
}

}  // namespace elementwise

// ---- the plain launchers ----------------------------------------------------------------------------

// The functor the launchers evaluate for math.h functor F on elements of type T: on 16-bit elements F's 16-bit
// form where it has one (math::GeluErf16, math::Sigmoid16: float math to under 1e-5, a fraction of erff's /
// expf's and a division's instructions); everything else F itself. StorageBackward: the same for the backward,
// which takes the 16-bit form only where it has the derivative (GeluErf16 does, Sigmoid16 not).
template <typename F, typename T>
using StorageMath = std::conditional_t<sizeof(T) == 2, typename math::NarrowOf<F>::type, F>;
template <typename F, bool kFromOutput, typename T>
using StorageBackward = std::conditional_t<sizeof(T) == 2, math::NarrowBackwardOf<F, kFromOutput>, F>;

// The access width bias_gelu uses for these pointers and row length: vec_width<T>() when H is a
// multiple of it and every pointer is 16-byte aligned, else 1.
template <typename T>
int bias_gelu_vec(int64_t H, const void* a, const void* b, const void* c, const void* d = nullptr) {
  return H % vec_width<T>() == 0 && elementwise::all_vec_aligned(a, b, c, d) ? vec_width<T>() : 1;
}

// y = f(x), F the math.h functor of a pointwise op. x, y laid out as g (ElementRows: x is its first input).
template <typename T, typename F>
cudaError_t activation_forward(const T* x, T* y, const ElementRows& g, F, cudaStream_t stream) {
  return elementwise::launch_elementwise<T>(x, nullptr, y, g, elementwise::ForwardOp<StorageMath<F, T>>{}, stream);
}

// dx = dy * f'(s), s the forward's input or (kFromOutput) its output. dy, s, dx laid out as g (dy its first
// input, s its second).
template <bool kFromOutput, typename T, typename F>
cudaError_t activation_backward(const T* dy, const T* s, T* dx, const ElementRows& g, F, cudaStream_t stream) {
  return elementwise::launch_elementwise<T>(
      dy, s, dx, g, elementwise::BackwardOp<StorageBackward<F, kFromOutput, T>, kFromOutput>{}, stream);
}

// out = a * f''(s) (the backward's derivative with respect to s; kOrder 3: a * f'''(s)), laid out as the
// backward's operands.
template <bool kFromOutput, int kOrder, typename T, typename F>
cudaError_t activation_backward_grad(const T* a, const T* s, T* out, const ElementRows& g, F, cudaStream_t stream) {
  return elementwise::launch_elementwise<T>(a, s, out, g, elementwise::BackwardGradOp<F, kFromOutput, kOrder>{},
                                            stream);
}

// y = gelu(x + bias). x: [rows, H], row r at x + r * x_stride; y: [rows, H] contiguous; bias: [H].
// Contiguous x (x_stride == H): bias_gelu_forward_kernel, 128-bit accesses when bias_gelu_vec<T>(H, x,
// bias, y) allows them, else element accesses. A strided stack of rows: elementwise_rows_kernel, the
// bias its second input at row stride 0.
template <typename T, typename Gelu>
cudaError_t bias_gelu_forward(const T* x, int64_t x_stride, const T* bias, T* y, int64_t rows, int64_t H, Gelu,
                              cudaStream_t stream) {
  if (rows <= 0 || H <= 0) return cudaSuccess;
  const StorageMath<Gelu, T> gelu;
  if (x_stride != H && rows > 1) {
    return elementwise::launch_elementwise<T>(x, bias, y, ElementRows{rows, H, x_stride, 0},
                                              elementwise::BiasGeluForwardOp<StorageMath<Gelu, T>>{gelu}, stream);
  }
  if (bias_gelu_vec<T>(H, x, bias, y) > 1)
    return elementwise::launch_bias_gelu_forward_as<vec_width<T>()>(x, bias, y, rows * H, H, gelu, stream);
  return elementwise::launch_bias_gelu_forward_as<1>(x, bias, y, rows * H, H, gelu, stream);
}

// dx = dy * gelu'(x + bias), dbias = sum over rows of dx (computed in acc_t, deterministically).
// dy, dx: [rows, H] contiguous; x: [rows, H], row r at x + r * x_stride (H: contiguous); bias, dbias: [H];
// workspace: plan.workspace_elems(H) acc_t elements (may be null when that is 0). plan from
// plan_bias_gelu(rows, H, vec, sm_count), vec = bias_gelu_vec<T>(H, dy, x, bias, dx) when it divides
// x_stride, else 1. Two kernels when plan.row_groups > 1 (the second reads only the workspace).
template <typename T, typename Gelu>
cudaError_t bias_gelu_backward(const T* dy, const T* x, int64_t x_stride, const T* bias, T* dx, T* dbias,
                               acc_t<T>* workspace, int64_t rows, int64_t H, const elementwise::BiasGeluPlan& plan,
                               Gelu, cudaStream_t stream) {
  if (rows <= 0 || H <= 0) return cudaSuccess;
  const StorageMath<Gelu, T> gelu;
  if (plan.vec == vec_width<T>()) {
    return elementwise::launch_bias_gelu_backward_as<vec_width<T>()>(dy, x, x_stride, bias, dx, workspace, dbias, rows,
                                                                     H, plan, gelu, stream);
  }
  return elementwise::launch_bias_gelu_backward_as<1>(dy, x, x_stride, bias, dx, workspace, dbias, rows, H, plan, gelu,
                                                      stream);
}

}  // namespace fastact
