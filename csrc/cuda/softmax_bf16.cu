// bfloat16 instantiations of the softmax kernels: bf16 -> bf16, and the fused casts bf16 -> float
// (forward) / float -> bf16 grad_input (backward), in CUDA's own type, whose word-wise conversions and
// packed max include/fastact/softmax/common.cuh specialises.
#include <cuda_bf16.h>

#include "cuda/softmax.h"
#include "fastact/softmax/launch.cuh"

FASTACT_SOFTMAX_CUDA_DEFINE(__nv_bfloat16, __nv_bfloat16)
FASTACT_SOFTMAX_CUDA_DEFINE(__nv_bfloat16, float)
