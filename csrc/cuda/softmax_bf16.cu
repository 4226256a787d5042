// bfloat16 instantiations of the softmax kernels: bf16 -> bf16, and the fused casts bf16 -> float
// (forward) / float -> bf16 grad_input (backward).
#include <c10/util/BFloat16.h>
#include <cuda_bf16.h>

#include "cuda/softmax.h"
#include "fastact/softmax/common.cuh"

namespace fastact::softmax_impl {

// Whole 32-bit words, two elements at a time, as for CUDA's own 16-bit type (PackedElementConvert in
// softmax/common.cuh says why); the same rounding as c10::BFloat16(float).
template <>
struct ElementConvert<c10::BFloat16> : PackedElementConvert<c10::BFloat16, Packed16::kBFloat16> {};

// The max over elements kept as loaded (the warp, block and strided forwards): packed compares
// (PackedElementMax).
template <>
struct ElementMax<c10::BFloat16> : PackedElementMax<c10::BFloat16, Packed16::kBFloat16> {};

}  // namespace fastact::softmax_impl

#include "fastact/softmax/launch.cuh"

FASTACT_SOFTMAX_CUDA_DEFINE(c10::BFloat16, c10::BFloat16)
FASTACT_SOFTMAX_CUDA_DEFINE(c10::BFloat16, float)
