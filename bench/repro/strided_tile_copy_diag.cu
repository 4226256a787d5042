// Diagnostic (not part of the library; bench/NOTES.md, thirty-sixth session's next steps): the ceiling of the
// strided tile pattern by piece width. Softmax over dim 0 of f32 [16384, 4096] reads, per tile, a piece of P bytes
// of every D-row; the library's cached tiles hold P = 32 (backward) or 64 (forward) bytes because a tile must fit
// one cluster's registers, and a plain copy through those tiles already caps at 0.82 (64 B) / 0.87 (128 B) of the
// limit (strided_dim0_diag fwd). Before building wider tiles (shared memory beside registers, or a strided grid
// mode), this measures what a tile of P bytes of each D-row, split over K CTAs along D, reaches as a plain copy:
// each CTA copies its D-slice of the tile into shared memory (cp.async, 16-byte chunks, a warp along a row's
// piece), meets the tile's other CTAs (none / a cluster barrier / a global-memory arrival count, as the grid mode's
// exchange would), and writes the slice back out. Times are CUDA-event medians of 20 calls; the fraction is of
// the limit measured in the same run (the best of cudaMemcpy device-to-device and a 128-bit copy kernel).
//
//   nvcc -std=c++17 -O3 -arch=sm_90 -o tile_copy bench/repro/strided_tile_copy_diag.cu
//   ./tile_copy
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#include <cooperative_groups.h>

#include "repro_common.cuh"

namespace {

enum Meet { kNone = 0, kCluster = 1, kGlobal = 2 };

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem) {
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}

// One tile per K consecutive CTAs: tile = blockIdx.x / K covers columns [tile * C, (tile + 1) * C) of 16-byte
// units (C = P / 16); rank = blockIdx.x % K takes D-rows [rank * R, (rank + 1) * R).
template <int kMeet>
__global__ void __launch_bounds__(512, 2) tile_copy(const float4* __restrict__ x, float4* __restrict__ y,
                                                     int64_t inner_units, int C, int K, int R,
                                                     unsigned* __restrict__ arrived) {
  extern __shared__ float4 buf[];
  const int64_t tile = blockIdx.x / K;
  const int rank = blockIdx.x % K;
  const int64_t col0 = tile * C;
  const int64_t d0 = int64_t(rank) * R;
  const int n = R * C;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int r = i / C, c = i - r * C;
    cp_async_16(buf + i, x + (d0 + r) * inner_units + col0 + c);
  }
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
  __syncthreads();
  if constexpr (kMeet == kCluster) {
    cooperative_groups::this_cluster().sync();
  } else if constexpr (kMeet == kGlobal) {
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(arrived + tile, 1u);
      // Bounded: a tile whose CTAs are not all resident would wait forever (the library's grid mode takes
      // tickets and gives up instead); here a CTA that waited ~1 s goes on and the run reports it.
      for (int spins = 0; *reinterpret_cast<volatile unsigned*>(arrived + tile) < unsigned(K); ++spins) {
        if (spins > (1 << 23)) { atomicAdd(arrived + (1 << 17), 1u); break; }
        __nanosleep(100);
      }
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int r = i / C, c = i - r * C;
    y[(d0 + r) * inner_units + col0 + c] = buf[i];
  }
}

__global__ void plain_copy(const float4* __restrict__ x, float4* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) y[i] = x[i];
}

}  // namespace

int main() {
  const int64_t D = 16384, inner = 4096;  // f32 [16384, 4096], dim 0: 256 MB
  const int64_t N = D * inner, units = inner / 4;
  const double bytes = 2.0 * N * 4;
  float4 *x, *y;
  unsigned* arrived;
  CK(cudaMalloc(&x, N * 4)); CK(cudaMalloc(&y, N * 4));
  CK(cudaMalloc(&arrived, 1 << 20));  // per-tile arrival counts; [1 << 17]: waits given up
  // Whole numbers below 2^24: a copy compares exactly.
  CK(cudaMemcpy(x, repro::lcg_values(N, [](uint32_t b) { return float(b); }).data(), N * 4, cudaMemcpyHostToDevice));
  auto time_us = [&](auto fn) {
    return repro::median_us(fn, [&] { CK(cudaMemsetAsync(arrived, 0, 1 << 20)); }, 23, 3);
  };
  const float t_memcpy = time_us([&] { return cudaMemcpyAsync(y, x, N * 4, cudaMemcpyDeviceToDevice); });
  const float t_plain = time_us([&] { plain_copy<<<132 * 8, 512>>>(x, y, N / 4); return cudaGetLastError(); });
  const double limit = bytes / (std::min(t_memcpy, t_plain) * 1e3);
  printf("limit %.1f GB/s (cudaMemcpy %.1f us, 128-bit copy kernel %.1f us)\n", limit, t_memcpy, t_plain);
  std::vector<float> hx(N), hy(N);
  CK(cudaMemcpy(hx.data(), x, N * 4, cudaMemcpyDeviceToHost));
  printf("%6s %4s %6s %10s %-8s %9s %7s %s\n", "P (B)", "K", "rows", "slice KB", "meet", "us", "frac", "check");
  for (int P : {32, 64, 128, 256, 512, 1024}) {
    const int C = P / 16;
    for (int slice_kb : {32, 64, 128}) {
      const int64_t K64 = D * P / (int64_t(slice_kb) << 10);
      if (K64 < 1 || K64 > 256 || D % K64) continue;
      const int K = int(K64), R = int(D / K);
      const int64_t tiles = units / C;
      const size_t smem = size_t(R) * C * 16;
      for (int meet : {kNone, kCluster, kGlobal}) {
        if (meet == kCluster && K > 16) continue;
        cudaError_t err = cudaSuccess;
        auto launch = [&]() -> cudaError_t {
          cudaLaunchConfig_t cfg = {};
          cfg.gridDim = dim3(unsigned(tiles * K));
          cfg.blockDim = dim3(512);
          cfg.dynamicSmemBytes = smem;
          cudaLaunchAttribute attr[1];
          int na = 0;
          if (meet == kCluster) {
            attr[0].id = cudaLaunchAttributeClusterDimension;
            attr[0].val.clusterDim.x = K; attr[0].val.clusterDim.y = 1; attr[0].val.clusterDim.z = 1;
            na = 1;
          }
          cfg.attrs = attr; cfg.numAttrs = na;
          if (meet == kNone) return cudaLaunchKernelEx(&cfg, tile_copy<kNone>, (const float4*)x, y, units, C, K, R, arrived);
          if (meet == kCluster) return cudaLaunchKernelEx(&cfg, tile_copy<kCluster>, (const float4*)x, y, units, C, K, R, arrived);
          return cudaLaunchKernelEx(&cfg, tile_copy<kGlobal>, (const float4*)x, y, units, C, K, R, arrived);
        };
        for (auto k : {tile_copy<kNone>, tile_copy<kCluster>, tile_copy<kGlobal>}) {
          CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10));
          CK(cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
        }
        CK(cudaMemset(y, 0xff, N * 4));
        err = launch();
        if (err != cudaSuccess) { printf("%6d %4d %6d %10d %-8s launch: %s\n", P, K, R, slice_kb, meet == 0 ? "none" : meet == 1 ? "cluster" : "global", cudaGetErrorString(err)); cudaGetLastError(); continue; }
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(hy.data(), y, N * 4, cudaMemcpyDeviceToHost));
        const bool ok = std::equal(hx.begin(), hx.end(), hy.begin());
        const float us = time_us(launch);
        unsigned gave_up = 0;
        CK(cudaMemcpy(&gave_up, arrived + (1 << 17), 4, cudaMemcpyDeviceToHost));
        printf("%6d %4d %6d %10d %-8s %9.1f %7.3f %s\n", P, K, R, slice_kb, meet == 0 ? "none" : meet == 1 ? "cluster" : "global",
               us, bytes / (us * 1e3) / limit, ok ? (gave_up ? "y == x, a CTA gave up waiting" : "y == x") : "WRONG");
      }
    }
  }
  printf("done\n");
  return 0;
}
