// Standalone reproducer (no torch, no fastact headers) of a compute-sanitizer synccheck failure on
// sm_90: a kernel whose CTAs push 4-byte values into every CTA of their 16-CTA cluster with
// st.async (counted on an mbarrier, the exchange of fastact's softmax/common.cuh) stops under
// `compute-sanitizer --tool synccheck` with "an illegal memory access" and 0 synccheck errors when
// two CTAs of the kernel can share an SM; it passes with one CTA an SM (argument 2: extra dynamic
// shared memory), in clusters of 8, plainly, and under memcheck, initcheck and racecheck. This is why
// scripts/sanitize_cases.py leaves those plans out under synccheck (SYNCCHECK_SKIPS,
// synccheck_cannot_run): rerun it on a new compute-sanitizer to see whether the skips can go.
//
//   nvcc -std=c++17 -arch=sm_90 -o repro bench/diag/synccheck_cluster16.cu
//   ./repro 16 0         # plain: ok
//   compute-sanitizer --tool synccheck ./repro 16 0        # illegal memory access (2025.3.1)
//   compute-sanitizer --tool synccheck ./repro 16 120000   # ok: one CTA an SM
//   compute-sanitizer --tool synccheck ./repro 8 0         # ok
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

constexpr int kValues = 8;  // values each CTA pushes to every CTA of its cluster

__device__ uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__global__ void exchange(int cluster, int* ok) {
  extern __shared__ __align__(16) unsigned char smem[];
  auto* bar = reinterpret_cast<uint64_t*>(smem);
  auto* slots = reinterpret_cast<float*>(smem + 16);  // [cluster][kValues]
  const int rank = static_cast<int>(blockIdx.x % cluster);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_addr(bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncwarp();
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
  if (threadIdx.x == 0) {
    const uint32_t bytes = static_cast<uint32_t>(cluster * kValues * sizeof(float));
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
  }
  if (threadIdx.x < kValues) {
    const float v = float(rank * 100 + threadIdx.x);
    for (int peer = 0; peer < cluster; ++peer) {
      uint32_t dst, rbar;
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(dst) : "r"(smem_addr(&slots[rank * kValues + threadIdx.x])), "r"(peer));
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(rbar) : "r"(smem_addr(bar)), "r"(peer));
      asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(dst),
                   "r"(__float_as_uint(v)), "r"(rbar)
                   : "memory");
    }
  }
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\nmbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n@!done bra WAIT;\n}\n" ::"r"(
          smem_addr(bar))
      : "memory");
  if (threadIdx.x == 0) {
    int good = 1;
    for (int r = 0; r < cluster; ++r)
      for (int q = 0; q < kValues; ++q) good &= slots[r * kValues + q] == float(r * 100 + q);
    ok[blockIdx.x] = good;
  }
}

int main(int argc, char** argv) {
  const int cluster = argc > 1 ? std::atoi(argv[1]) : 16;
  const size_t smem = 16 + cluster * kValues * sizeof(float) + (argc > 2 ? std::atoll(argv[2]) : 0);
  const int blocks = 8 * cluster, threads = 512;
  int* ok;
  cudaMalloc(&ok, blocks * sizeof(int));
  cudaMemset(ok, 0, blocks * sizeof(int));
  cudaFuncSetAttribute(exchange, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaFuncSetAttribute(exchange, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  int per_sm = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, exchange, threads, smem);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = cluster;
  attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
  config.attrs = &attr;
  config.numAttrs = 1;
  cudaError_t err = cudaLaunchKernelEx(&config, exchange, cluster, ok);
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  std::vector<int> h(blocks);
  if (err == cudaSuccess) err = cudaMemcpy(h.data(), ok, blocks * sizeof(int), cudaMemcpyDeviceToHost);
  int bad = 0;
  for (int v : h) bad += v != 1;
  std::printf("cluster %d, %d CTA(s) an SM: %s\n", cluster, per_sm,
              err != cudaSuccess ? cudaGetErrorString(err) : bad ? "WRONG" : "ok");
  return err != cudaSuccess || bad;
}
