// Diagnostic (not part of the library, not compiled by CI; torch-free and fastact-free): how close a plain stream
// of 16-byte copies comes to the report's limit at each tensor size. On the H200 the bar's 16-bit cells of 128 MB
// tensors (bias_gelu bf16 [16384, 4096], the strided bf16 [32, 1024, 2048] dim 1) run at 0.80-0.83 of a limit
// measured on 256 MB float tensors, while torch's own bf16 copy_ of 128 MB reached 0.88. Whether any kernel does
// better at that size says whether those cells have room (docs/performance.md, known gaps). Built as a shared
// library that stream_size.py loads with ctypes:
//
//   nvcc -std=c++17 -O3 -arch=sm_90 -Xcompiler -fPIC -shared -o DIR/libstreamsize.so bench/diag/stream_size.cu
//
// Kinds (all copy n16 16-byte vectors from x to y):
//   0  one vector a thread, 256-thread blocks (torch's elementwise shape for 16-bit types, less its 32-bit index);
//   1  four vectors a thread, loaded together then stored, a block's 1024 vectors contiguous;
//   2  as 1 over a persistent grid (8 blocks an SM, grid-stride over blocks' 1024-vector chunks);
//   3  as 1 with streaming (evict-first) loads and stores (__ldcs / __stcs);
//   4  as 1 with 512-thread blocks and eight vectors a thread.
#include <cstdint>

#include <cuda_runtime.h>

namespace {

template <int kPer, bool kStream>
__global__ __launch_bounds__(256) void copy_chunks(const uint4* __restrict__ x, uint4* __restrict__ y, int64_t n16,
                                                   int64_t chunks) {
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const int64_t base = c * int64_t(blockDim.x) * kPer + threadIdx.x;
    uint4 v[kPer];
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t i = base + int64_t(k) * blockDim.x;
      if (i < n16) v[k] = kStream ? __ldcs(x + i) : x[i];
    }
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t i = base + int64_t(k) * blockDim.x;
      if (i < n16) {
        if (kStream) {
          __stcs(y + i, v[k]);
        } else {
          y[i] = v[k];
        }
      }
    }
  }
}

template <int kPer>
__global__ __launch_bounds__(512) void copy_chunks_512(const uint4* __restrict__ x, uint4* __restrict__ y,
                                                       int64_t n16) {
  const int64_t base = blockIdx.x * int64_t(blockDim.x) * kPer + threadIdx.x;
  uint4 v[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t i = base + int64_t(k) * blockDim.x;
    if (i < n16) v[k] = x[i];
  }
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t i = base + int64_t(k) * blockDim.x;
    if (i < n16) y[i] = v[k];
  }
}

}  // namespace

// 0 on success, else the CUDA error of the launch.
extern "C" int diag_copy(int kind, const void* x, void* y, int64_t n16, cudaStream_t stream) {
  const auto* in = static_cast<const uint4*>(x);
  auto* out = static_cast<uint4*>(y);
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  switch (kind) {
    case 0:
      copy_chunks<1, false><<<(n16 + 255) / 256, 256, 0, stream>>>(in, out, n16, (n16 + 255) / 256);
      break;
    case 1:
      copy_chunks<4, false><<<(n16 + 1023) / 1024, 256, 0, stream>>>(in, out, n16, (n16 + 1023) / 1024);
      break;
    case 2: {
      const int64_t chunks = (n16 + 1023) / 1024;
      const int64_t grid = chunks < int64_t(sms) * 8 ? chunks : int64_t(sms) * 8;
      copy_chunks<4, false><<<grid, 256, 0, stream>>>(in, out, n16, chunks);
      break;
    }
    case 3:
      copy_chunks<4, true><<<(n16 + 1023) / 1024, 256, 0, stream>>>(in, out, n16, (n16 + 1023) / 1024);
      break;
    case 4:
      copy_chunks_512<8><<<(n16 + 4095) / 4096, 512, 0, stream>>>(in, out, n16);
      break;
    default:
      return int(cudaErrorInvalidValue);
  }
  return int(cudaGetLastError());
}
