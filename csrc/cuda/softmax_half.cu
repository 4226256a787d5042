// float16 instantiations of the softmax kernels: half -> half, and the fused casts half -> float
// (forward) / float -> half grad_input (backward), in CUDA's own type, whose word-wise conversions and
// packed max include/fastact/softmax/common.cuh specialises.
#include <cuda_fp16.h>

#include "cuda/softmax.h"
#include "fastact/softmax/launch.cuh"

FASTACT_SOFTMAX_CUDA_DEFINE(__half, __half)
FASTACT_SOFTMAX_CUDA_DEFINE(__half, float)
