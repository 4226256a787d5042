// float32 instantiations of the softmax kernels (every variant, both epilogues, forward and
// backward), and the per-device properties the dispatcher reads.
#include <c10/util/Exception.h>

#include "cuda/softmax.h"
#include "fastact/softmax/launch.cuh"

FASTACT_SOFTMAX_CUDA_DEFINE(float, float)

namespace fastact::cuda {

SoftmaxDeviceProps softmax_device_props_cached(int device) {
  SoftmaxDeviceProps props;
  const cudaError_t err = softmax_device_props(device, &props);
  TORCH_CHECK(err == cudaSuccess, "fastact: reading the properties of CUDA device ", device,
              " failed: ", cudaGetErrorString(err));
  return props;
}

}  // namespace fastact::cuda
