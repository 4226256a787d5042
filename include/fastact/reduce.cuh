// Warp and block reductions: max, sum, and the online (max, sum-of-exp) pair.
// Each says where its result is valid.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <limits>
#include <type_traits>

#include "fastact/math.h"

namespace fastact {

constexpr int kWarpSize = 32;

// Max of two values. float: fmaxf, one FMNMX where the ternary takes a compare and a select (the
// 16-bit softmax forwards are bound by issue). NaN: fmaxf returns the other operand and the ternary
// returns b, so neither propagates NaN by itself; the softmax kernels get torch's NaN rows from the
// sum of exp(x - max), which a NaN element makes NaN whatever the max.
template <typename A>
struct MaxOp {
  FASTACT_DEVICE A operator()(A a, A b) const {
    if constexpr (std::is_same_v<A, float>) {
      return fmaxf(a, b);
    } else {
      return a > b ? a : b;
    }
  }
  static FASTACT_HOST_DEVICE A identity() { return -std::numeric_limits<A>::infinity(); }
};

template <typename A>
struct SumOp {
  FASTACT_DEVICE A operator()(A a, A b) const { return a + b; }
  static FASTACT_HOST_DEVICE A identity() { return A(0); }
};

// Running max m and sum s of exp(x - m) over the values seen: merging two partial results
// rescales the smaller-max side, so one pass over the data gives both (Milakov & Gimelshein, 2018).
template <typename A>
struct MaxSum {
  A max;
  A sum;
};

template <typename A>
struct MaxSumOp {
  FASTACT_DEVICE MaxSum<A> operator()(MaxSum<A> a, MaxSum<A> b) const {
    const A m = a.max > b.max ? a.max : b.max;
    // A side that has seen nothing (max = -inf) contributes 0; exp(-inf - -inf) would be NaN.
    const A sa = a.max == -std::numeric_limits<A>::infinity() ? A(0) : a.sum * math::exp_(a.max - m);
    const A sb = b.max == -std::numeric_limits<A>::infinity() ? A(0) : b.sum * math::exp_(b.max - m);
    return {m, sa + sb};
  }
  static FASTACT_HOST_DEVICE MaxSum<A> identity() { return {-std::numeric_limits<A>::infinity(), A(0)}; }
};

template <typename A>
FASTACT_DEVICE MaxSum<A> shfl_xor(MaxSum<A> v, int mask, int width) {
  return {__shfl_xor_sync(0xffffffffu, v.max, mask, width), __shfl_xor_sync(0xffffffffu, v.sum, mask, width)};
}
template <typename A>
FASTACT_DEVICE A shfl_xor(A v, int mask, int width) {
  return __shfl_xor_sync(0xffffffffu, v, mask, width);
}

// Butterfly reduction over groups of `kWidth` consecutive lanes (a power of two <= 32).
// Every lane of the warp must call it. Result: valid in every lane of its group.
template <int kWidth = kWarpSize, typename T, typename Op>
FASTACT_DEVICE T warp_reduce(T val, Op op) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset /= 2) val = op(val, shfl_xor(val, offset, kWidth));
  return val;
}

// Reduction over the whole block (blockDim.x a multiple of 32, at most 1024 threads).
// `scratch` is shared memory of at least 32 T's. Every thread must call it. Result: valid in every
// thread. Ends with a barrier, so `scratch` may be reused right after.
template <typename T, typename Op>
FASTACT_DEVICE T block_reduce(T val, Op op, T* scratch) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  val = warp_reduce(val, op);
  if (lane == 0) scratch[warp] = val;
  __syncthreads();
  if (warp == 0) {
    val = lane < num_warps ? scratch[lane] : Op::identity();
    val = warp_reduce(val, op);
    if (lane == 0) scratch[0] = val;
  }
  __syncthreads();
  val = scratch[0];
  __syncthreads();
  return val;
}

}  // namespace fastact
