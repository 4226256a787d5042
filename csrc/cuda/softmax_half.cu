// float16 instantiations of the softmax kernels: half -> half, and the fused casts half -> float
// (forward) / float -> half grad_input (backward).
#include <c10/util/Half.h>
#include <cuda_fp16.h>

#include "cuda/softmax.h"
#include "fastact/softmax/common.cuh"

namespace fastact::softmax_impl {

// Whole 32-bit words, two elements at a time, as for CUDA's own 16-bit type (PackedElementConvert in
// softmax/common.cuh says why); the same rounding as c10::Half(float).
template <>
struct ElementConvert<c10::Half> : PackedElementConvert<c10::Half, Packed16::kHalf> {};

// The max over elements kept as loaded (the warp, block and strided forwards): packed compares
// (PackedElementMax).
template <>
struct ElementMax<c10::Half> : PackedElementMax<c10::Half, Packed16::kHalf> {};

}  // namespace fastact::softmax_impl

#include "fastact/softmax/launch.cuh"

FASTACT_SOFTMAX_CUDA_DEFINE(c10::Half, c10::Half)
FASTACT_SOFTMAX_CUDA_DEFINE(c10::Half, float)
