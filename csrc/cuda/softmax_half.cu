// float16 instantiations of the softmax kernels: half -> half, and the fused casts half -> float
// (forward) / float -> half grad_input (backward).
#include <c10/util/Half.h>
#include <cuda_fp16.h>

#include "cuda/softmax.h"
#include "fastact/softmax/common.cuh"

namespace fastact::softmax_impl {

// Converts whole 32-bit words (two elements) at a time (see ElementConvert in softmax/common.cuh):
// c10's operator float goes through the 16-bit member, and ptxas then gives every element a register
// of its own, which spilled the register-bound kernels. Same rounding as c10: widening is exact,
// narrowing round-to-nearest-even (__floats2half2_rn, as c10::Half(float) does on the device).
template <>
struct ElementConvert<c10::Half> {
  template <typename A, int N>
  static FASTACT_DEVICE void to_acc(const AlignedVector<c10::Half, N>& v, A (&out)[N]) {
    if constexpr (N % 2 == 0) {
      const auto* w = reinterpret_cast<const __half2*>(&v);
#pragma unroll
      for (int i = 0; i < N / 2; ++i) {
        const float2 f = __half22float2(w[i]);
        out[2 * i] = static_cast<A>(f.x);
        out[2 * i + 1] = static_cast<A>(f.y);
      }
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) out[i] = static_cast<A>(__half2float(__ushort_as_half(v.val[i].x)));
    }
  }
  template <typename A, int N>
  static FASTACT_DEVICE AlignedVector<c10::Half, N> from_acc(const A (&in)[N]) {
    AlignedVector<c10::Half, N> v;
    if constexpr (N % 2 == 0) {
      auto* w = reinterpret_cast<__half2*>(&v);
#pragma unroll
      for (int i = 0; i < N / 2; ++i)
        w[i] = __floats2half2_rn(static_cast<float>(in[2 * i]), static_cast<float>(in[2 * i + 1]));
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i)
        v.val[i] = c10::Half(__half_as_ushort(__float2half_rn(static_cast<float>(in[i]))), c10::Half::from_bits());
    }
    return v;
  }
};

// The strided forward's column max over rows kept as loaded: packed compares (PackedElementMax).
template <>
struct ElementMax<c10::Half> : PackedElementMax<c10::Half, Packed16::kHalf> {};

}  // namespace fastact::softmax_impl

#include "fastact/softmax/launch.cuh"

FASTACT_SOFTMAX_CUDA_DEFINE(c10::Half, c10::Half)
FASTACT_SOFTMAX_CUDA_DEFINE(c10::Half, float)
