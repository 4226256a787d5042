// float64 instantiations of the softmax kernels (every variant, both epilogues, forward and backward).
#include "cuda/softmax.h"
#include "fastact/softmax/launch.cuh"

FASTACT_SOFTMAX_CUDA_DEFINE(double, double)
