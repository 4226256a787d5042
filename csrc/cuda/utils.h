// Host helpers for the CUDA adapters: device properties (cached per device) and the one
// macro that turns a launcher's cudaError_t into a torch error naming the op.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime.h>

#include <array>
#include <mutex>

namespace fastact::cuda {

struct DeviceInfo {
  int sm_count = 0;
  int max_smem_per_block_optin = 0;  // bytes a block may use after raising its limit
  int cc_major = 0;
  int cc_minor = 0;
};

// Properties of `device`, read once per device per process.
inline const DeviceInfo& device_info(int device) {
  static std::array<DeviceInfo, 64> cache{};
  static std::array<std::once_flag, 64> once;
  TORCH_INTERNAL_ASSERT(device >= 0 && device < 64, "fastact: device index out of range: ", device);
  std::call_once(once[device], [device] {
    DeviceInfo& d = cache[device];
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, device));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&d.max_smem_per_block_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&d.cc_major, cudaDevAttrComputeCapabilityMajor, device));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&d.cc_minor, cudaDevAttrComputeCapabilityMinor, device));
  });
  return cache[device];
}

}  // namespace fastact::cuda

// After a launcher from include/fastact returns: a launch error becomes a torch error that says
// which op failed (C10_CUDA_KERNEL_LAUNCH_CHECK, with the op's name).
#define FASTACT_CHECK_LAUNCH(expr, op)                                                              \
  do {                                                                                              \
    const cudaError_t fastact_err_ = (expr);                                                        \
    TORCH_CHECK(fastact_err_ == cudaSuccess, op, ": CUDA kernel launch failed: ",                   \
                cudaGetErrorString(fastact_err_));                                                  \
  } while (0)
