// Host helpers for the CUDA adapters: the element types the kernels see, device properties (cached
// per device) and the one macro that turns a launcher's cudaError_t into a torch error naming the op.
#pragma once

#include <ATen/core/TensorBase.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <array>
#include <mutex>

namespace fastact::cuda {

// The element type the kernels see: c10's half types map onto CUDA's (same bits), so that
// include/ is instantiated with the types it specialises (softmax/common.cuh, math.h).
template <typename scalar_t>
struct CudaType {
  using type = scalar_t;
};
template <>
struct CudaType<at::Half> {
  using type = __half;
};
template <>
struct CudaType<at::BFloat16> {
  using type = __nv_bfloat16;
};
template <typename scalar_t>
using cuda_type = typename CudaType<scalar_t>::type;

// A tensor's elements as the kernels' element type, to read (in_ptr) or to write (out_ptr).
template <typename scalar_t>
const cuda_type<scalar_t>* in_ptr(const at::TensorBase& t) {
  return reinterpret_cast<const cuda_type<scalar_t>*>(t.const_data_ptr<scalar_t>());
}
template <typename scalar_t>
cuda_type<scalar_t>* out_ptr(const at::TensorBase& t) {
  return reinterpret_cast<cuda_type<scalar_t>*>(t.mutable_data_ptr<scalar_t>());
}

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
