// bfloat16 instantiations of the softmax kernels: bf16 -> bf16, and the fused casts bf16 -> float
// (forward) / float -> bf16 grad_input (backward).
#include <c10/util/BFloat16.h>
#include <cuda_bf16.h>

#include "cuda/softmax.h"
#include "fastact/softmax/common.cuh"

namespace fastact::softmax_impl {

// Converts whole 32-bit words (two elements) at a time (see ElementConvert in softmax/common.cuh):
// c10's operator float goes through the 16-bit member, and ptxas then gives every element a register
// of its own, which spilled the register-bound kernels. Same rounding as c10: widening is a
// shift, narrowing round-to-nearest-even (__floats2bfloat162_rn, as c10::BFloat16(float) does on sm_80+).
template <>
struct ElementConvert<c10::BFloat16> {
  template <typename A, int N>
  static FASTACT_DEVICE void to_acc(const AlignedVector<c10::BFloat16, N>& v, A (&out)[N]) {
    if constexpr (N % 2 == 0) {
      const auto* w = reinterpret_cast<const unsigned*>(&v);
#pragma unroll
      for (int i = 0; i < N / 2; ++i) {
        out[2 * i] = static_cast<A>(__uint_as_float(w[i] << 16));              // low half: element 2i
        out[2 * i + 1] = static_cast<A>(__uint_as_float(w[i] & 0xffff0000u));  // high half: element 2i+1
      }
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) out[i] = static_cast<A>(__uint_as_float(static_cast<unsigned>(v.val[i].x) << 16));
    }
  }
  template <typename A, int N>
  static FASTACT_DEVICE AlignedVector<c10::BFloat16, N> from_acc(const A (&in)[N]) {
    AlignedVector<c10::BFloat16, N> v;
    if constexpr (N % 2 == 0) {
      auto* w = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
      for (int i = 0; i < N / 2; ++i)
        w[i] = __floats2bfloat162_rn(static_cast<float>(in[2 * i]), static_cast<float>(in[2 * i + 1]));
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i)
        v.val[i] = c10::BFloat16(__bfloat16_as_ushort(__float2bfloat16_rn(static_cast<float>(in[i]))),
                                 c10::BFloat16::from_bits());
    }
    return v;
  }
};

// The strided forward's column max over rows kept as loaded: packed compares (PackedElementMax).
template <>
struct ElementMax<c10::BFloat16> : PackedElementMax<c10::BFloat16, Packed16::kBFloat16> {};

}  // namespace fastact::softmax_impl

#include "fastact/softmax/launch.cuh"

FASTACT_SOFTMAX_CUDA_DEFINE(c10::BFloat16, c10::BFloat16)
FASTACT_SOFTMAX_CUDA_DEFINE(c10::BFloat16, float)
