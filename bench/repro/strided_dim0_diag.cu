// Diagnostic (not part of the library; bench/NOTES.md, thirty-sixth session): why softmax over dim 0 of a 256 MB
// f32 [16384, 4096] (outer 1, D 16384, inner 4096) runs at 0.82 (forward) / 0.67 (backward) of the limit while
// dim-1 cells with wider tiles reach 0.92-0.99. The suspect: a tile reads only 64 B (forward) / 32 B (backward) of
// each D-row, so DRAM sees scattered small requests; the neighbouring tiles, which read the rest of each 128-B
// line, run at about the same time on other clusters. Variants, each against the library's plan:
//   library                      the auto plan as the library launches it;
//   granularity G                the same launch under cudaLimitMaxL2FetchGranularity = G bytes;
//   L2::128B / L2::256B          copies of the cached strided kernels whose loads carry that L2 prefetch size;
//   bwd no exchange (wrong)      the backward copy without the cluster's column all-reduce (timing only);
// Outputs are compared bitwise with the library's.
//
//   nvcc -std=c++17 -O3 -arch=sm_90 --expt-relaxed-constexpr -Iinclude -o dim0_diag bench/repro/strided_dim0_diag.cu
//   ./dim0_diag          (./dim0_diag smem: the cached backward with D-rows in shared memory beside the registers,
//                         tiles 2-4x as wide as the library's; ./dim0_diag gran: the fetch granularity under other strided cells' library plans;
//                         ./dim0_diag fwd: the forward study: prefetch distance, no exchange, the tile as a copy)
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

#include "fastact/softmax/launch.cuh"
#include "repro_common.cuh"

using namespace fastact;
using namespace fastact::softmax_impl;
using Epi = math::SoftmaxEpilogue;


namespace {

// kLoad: 0 plain, 1 ld.global.nc.L2::128B, 2 ld.global.nc.L2::256B.
template <int kLoad>
FASTACT_DEVICE AlignedVector<float, 4> ld4(const float* p) {
  if constexpr (kLoad == 0) {
    return load_vector<float, 4>(p);
  } else {
    AlignedVector<float, 4> v;
    if constexpr (kLoad == 1)
      asm("ld.global.nc.L2::128B.v4.f32 {%0, %1, %2, %3}, [%4];"
          : "=f"(v.val[0]), "=f"(v.val[1]), "=f"(v.val[2]), "=f"(v.val[3]) : "l"(p));
    else
      asm("ld.global.nc.L2::256B.v4.f32 {%0, %1, %2, %3}, [%4];"
          : "=f"(v.val[0]), "=f"(v.val[1]), "=f"(v.val[2]), "=f"(v.val[3]) : "l"(p));
    return v;
  }
}

template <int kLoad, int kMode = 0>
__global__ __launch_bounds__(kStridedMaxThreads, 1) void diag_fwd(const float* __restrict__ x, float* __restrict__ y,
                                                                  int64_t outer, int64_t dim, int64_t inner, int cols,
                                                                  int cluster, Epi epi, int64_t ahead, int64_t first_tile) {
  using P = MaxSum<float>;
  using F = StridedForwardCache<float, float, Epi, 4>;
  constexpr int kRows = F::kRows;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  exchange_init(column_scratch<float>(smem_raw).bar, cluster);
  const StridedThread t = strided_thread(cols, cluster, kRows);
  const int64_t tile = strided_tile(first_tile, cluster);
  const StridedColumn col = strided_column<4>(t, tile, outer, dim, inner);
  const float* xc = x + col.base;
  float* yc = y + col.base;
  int round = 0;
  const int nrows = col.ok ? cached_rows<kRows>(t.d_first, dim, t.G) : 0;
  const int64_t first = t.d_first * inner;
  const int64_t step = int64_t(t.G) * inner;
  typename F::Rows rows;
#pragma unroll
  for (int j = 0; j < kRows; ++j) {
    if (j < nrows) rows.take(j, ld4<kLoad>(xc + first + j * step));
  }
  strided_prefetch_ahead<4, kRows>(x, t, tile, ahead, outer, dim, inner);
  if constexpr (kMode == 0) {
    strided_pair_forward<typename F::Cache, 4, kRows>(rows, nrows, yc + first, step, epi, column_scratch<P>(smem_raw), round,
                                                     reduce_columns(t, cols), cluster);
  } else if constexpr (kMode == 1) {  // the thread's own (max, sum) only, a cluster barrier in place of the exchange
    float m[4], sm[4], f[4];
    for (int k = 0; k < 4; ++k) { m[k] = -3.0e38f; sm[k] = 0.f; }
    rows.max_into(nrows, m);
    strided_keep_and_sum<typename F::Cache, 4, kRows>(rows, nrows, m, sm);
    __syncthreads();
    if (cluster > 1) { cluster_arrive_relaxed(); cluster_wait(); }
    for (int k = 0; k < 4; ++k) f[k] = F::Cache::factor(m[k], m[k], epi.row_constant(sm[k]));
    strided_store_rows<typename F::Cache, 4, kRows>(rows, nrows, yc + first, step, epi, m, f);
  } else {  // y = x through the same tile
    __syncthreads();
    if (cluster > 1) { cluster_arrive_relaxed(); cluster_wait(); }
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      if (j < nrows) {
        AlignedVector<float, 4> o;
        float w[4];
        rows.get(j, w);
        for (int k = 0; k < 4; ++k) o.val[k] = w[k];
        store_vector<float, 4>(yc + first + j * step, o);
      }
    }
  }
}

// The cached backward. kLoad: the loads' L2 fetch size (ld4); kExchange: false leaves out the column
// all-reduce (each thread's own dot: wrong results, timing only); kSmemRows: that many more D-rows a thread in
// shared memory beside its kRows in registers (cp.async, each thread's own slots after the exchange's scratch, at
// byte scratch_bytes: no barrier before it reads them), so that a tile can be twice as wide at the same D:
// [16384, 4096] in 64-byte pieces (4 columns x 512 threads x cluster 16, 8 D-rows a thread) where the library's
// registers alone hold 32-byte pieces; the copies ask L2 for whole lines where the loads do (kLoad > 0).
template <int kLoad, bool kExchange, int kSmemRows = 0>
__global__ __launch_bounds__(kStridedMaxThreads, 1) void diag_bwd(const float* __restrict__ grad_output,
                                                                  const float* __restrict__ output,
                                                                  float* __restrict__ grad_input, int64_t outer,
                                                                  int64_t dim, int64_t inner, int cols, int cluster,
                                                                  Epi epi, int scratch_bytes, int64_t first_tile) {
  constexpr int kRows = softmax_strided_rows(true, 4, 4, 4, 4);
  constexpr int kAll = kRows + kSmemRows;
  using V4 = AlignedVector<float, 4>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const ColumnScratch<float> smem = column_scratch<float>(smem_raw);
  exchange_init(smem.bar, cluster);
  V4* const slot_dy = kSmemRows > 0 ? reinterpret_cast<V4*>(smem_raw + scratch_bytes) + threadIdx.x : nullptr;
  V4* const slot_y = slot_dy + kSmemRows * blockDim.x;
  const StridedThread t = strided_thread(cols, cluster, kAll);
  const StridedColumn col = strided_column<4>(t, strided_tile(first_tile, cluster), outer, dim, inner);
  const float* dyc = grad_output + col.base;
  const float* yc = output + col.base;
  float* dxc = grad_input + col.base;
  int round = 0;
  float dot[4] = {0.f, 0.f, 0.f, 0.f};
  const int nrows = col.ok ? cached_rows<kAll>(t.d_first, dim, t.G) : 0;
  const int64_t first = t.d_first * inner;
  const int64_t step = int64_t(t.G) * inner;
  if constexpr (kSmemRows > 0) {
#pragma unroll
    for (int j = kRows; j < kAll; ++j) {
      if (j < nrows) {
        copy_async_16<(kLoad > 0)>(slot_dy + (j - kRows) * blockDim.x, dyc + first + j * step);
        copy_async_16<(kLoad > 0)>(slot_y + (j - kRows) * blockDim.x, yc + first + j * step);
      }
    }
    copy_async_commit();
  }
  V4 dy[kRows], yv[kRows];
#pragma unroll
  for (int j = 0; j < kRows; ++j) {
    if (j < nrows) {
      dy[j] = ld4<kLoad>(dyc + first + j * step);
      yv[j] = ld4<kLoad>(yc + first + j * step);
    }
  }
#pragma unroll
  for (int j = 0; j < kRows; ++j) {
    if (j < nrows) {
#pragma unroll
      for (int k = 0; k < 4; ++k) dot[k] += epi.backward_term(dy[j].val[k], yv[j].val[k]);
    }
  }
  if constexpr (kSmemRows > 0) {
    copy_async_wait<0>();
#pragma unroll
    for (int j = kRows; j < kAll; ++j) {
      if (j < nrows) {
        const V4 a = slot_dy[(j - kRows) * blockDim.x], b = slot_y[(j - kRows) * blockDim.x];
#pragma unroll
        for (int k = 0; k < 4; ++k) dot[k] += epi.backward_term(a.val[k], b.val[k]);
      }
    }
  }
  if constexpr (kExchange) {
    column_allreduce(dot, SumOp<float>(), smem, round, reduce_columns(t, cols), cluster);
  } else {
    if (cluster > 1) { cluster_arrive_relaxed(); cluster_wait(); }  // keep a row's CTAs in step, no data
  }
#pragma unroll
  for (int j = 0; j < kAll; ++j) {
    if (j < nrows) {
      V4 a, b, g;
      if (j < kRows) { a = dy[j]; b = yv[j]; }
      else { a = slot_dy[(j - kRows) * blockDim.x]; b = slot_y[(j - kRows) * blockDim.x]; }
#pragma unroll
      for (int k = 0; k < 4; ++k) g.val[k] = epi.backward(a.val[k], b.val[k], dot[k]);
      store_vector<float, 4>(dxc + first + j * step, g);
    }
  }
}

// ahead_scale: the library's prefetch distance times this (0: no prefetch).
template <int kLoad, int kMode = 0>
cudaError_t launch_fwd(const float* x, float* y, int64_t outer, int64_t dim, int64_t inner, const SoftmaxPlan& plan,
                       double ahead_scale = 1.0) {
  using F = StridedForwardCache<float, float, Epi, 4>;
  const auto smem = size_t(softmax_strided_smem_bytes(plan.threads, plan.columns, 4, plan.cluster, F::kValueBytes));
  constexpr auto kKernel = diag_fwd<kLoad, kMode>;
  const int64_t ahead = plan.prefetch ? int64_t(ahead_scale * (resident_tiles<kKernel>(plan.threads, plan.cluster, smem) / kStridedPrefetchDivisor)) : 0;
  return launch_items<kKernel>(softmax_strided_tiles(outer, inner, 4, plan.columns), plan.threads, smem, plan.cluster, 0,
                               x, y, outer, dim, inner, plan.columns, plan.cluster, Epi{}, ahead);
}

// The backward above in tiles of `cols` columns x `threads` threads over `cluster` CTAs (the library's plan's, or
// other shapes); cudaErrorInvalidValue where that shape does not cover D.
template <int kLoad, bool kExchange, int kSmemRows = 0>
cudaError_t launch_bwd(const float* dy, const float* y, float* dx, int64_t outer, int64_t dim, int64_t inner, int cols,
                       int threads, int cluster) {
  constexpr int kAll = softmax_strided_rows(true, 4, 4, 4, 4) + kSmemRows;
  if (int64_t(cluster) * (threads / cols) * kAll < dim) return cudaErrorInvalidValue;
  const int64_t scratch = softmax_strided_smem_bytes(threads, cols, 4, cluster, 4);
  const int slots = int((scratch + 15) / 16 * 16);
  const size_t smem = kSmemRows > 0 ? size_t(slots) + size_t(2) * kSmemRows * threads * 16 : size_t(scratch);
  constexpr auto kKernel = diag_bwd<kLoad, kExchange, kSmemRows>;
  if constexpr (kSmemRows > 0) {
    static bool once = [] {
      return cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10) == cudaSuccess;
    }();
    if (!once) return cudaErrorInvalidValue;
  }
  return launch_items<kKernel>(softmax_strided_tiles(outer, inner, 4, cols), threads, smem, cluster, 0, dy, y, dx, outer,
                               dim, inner, cols, cluster, Epi{}, slots);
}

template <int kLoad, bool kExchange>
cudaError_t launch_bwd(const float* dy, const float* y, float* dx, int64_t outer, int64_t dim, int64_t inner,
                       const SoftmaxPlan& plan) {
  return launch_bwd<kLoad, kExchange>(dy, y, dx, outer, dim, inner, plan.columns, plan.threads, plan.cluster);
}

}  // namespace


int main(int argc, char** argv) {
  const bool fwd_study = argc > 1 && strcmp(argv[1], "fwd") == 0;
  const bool gran_study = argc > 1 && strcmp(argv[1], "gran") == 0;
  const bool smem_study = argc > 1 && strcmp(argv[1], "smem") == 0;
  SoftmaxDeviceProps dev;
  CK(softmax_device_props(0, &dev));
  const int64_t N = int64_t(64) << 20;  // 256 MB of f32
  float *x, *y, *yref, *dy, *dx;
  CK(cudaMalloc(&x, N * 4)); CK(cudaMalloc(&y, N * 4)); CK(cudaMalloc(&yref, N * 4));
  CK(cudaMalloc(&dy, N * 4)); CK(cudaMalloc(&dx, N * 4));
  {
    const std::vector<float> h = repro::uniform_inputs(N);
    CK(cudaMemcpy(x, h.data(), N * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dy, h.data() + 7, (N - 7) * 4, cudaMemcpyHostToDevice));
  }
  std::vector<float> hy(N), hr(N);
  const double limit = 2968.0;  // GB/s, the bar report's limit (sessions 34-36)
  size_t gran0 = 0;
  CK(cudaDeviceGetLimit(&gran0, cudaLimitMaxL2FetchGranularity));
  printf("default cudaLimitMaxL2FetchGranularity: %zu\n", gran0);
  struct Shape { int64_t outer, dim, inner; };
  std::vector<Shape> shapes = {{1, 16384, 4096}, {1, 8192, 8192}, {1, 4096, 16384}};
  if (gran_study) shapes = {{255, 257, 1023}, {93, 700, 1023}, {656, 100, 1023}, {8, 2048, 4096}, {262, 1000, 256}};
  for (const Shape& sh : shapes) {
    const int64_t outer = sh.outer, dim = sh.dim, inner = sh.inner;
    for (int bwd = 0; bwd < 2; ++bwd) {
      SoftmaxProblem p = bwd ? softmax_backward_problem(dy, y, 4, dx, 4, 4, outer, dim, inner, dev)
                             : softmax_forward_problem(x, 4, y, 4, 4, outer, dim, inner, dim, dev);
      const SoftmaxPlan plan = choose_softmax(p);
      printf("== f32 [%lld, %lld, %lld] dim 1 %s: %s\n", (long long)outer, (long long)dim, (long long)inner,
             bwd ? "bwd" : "fwd", softmax_explain(p, plan).c_str());
      const double bytes = (bwd ? 3.0 : 2.0) * outer * dim * inner * 4;
      float* out = bwd ? dx : y;
      // The backward's y: the forward's output.
      if (bwd) CK(softmax_forward<float, float, Epi>(x, y, outer, dim, inner, dim, choose_softmax(softmax_forward_problem(x, 4, y, 4, 4, outer, dim, inner, dim, dev)), 0, nullptr));
      auto lib = [&] {
        return bwd ? softmax_backward<float, float, Epi>(dy, y, dx, outer, dim, inner, plan, 0, nullptr)
                   : softmax_forward<float, float, Epi>(x, y, outer, dim, inner, dim, plan, 0, nullptr);
      };
      if (gran_study) {
        for (int rep = 0; rep < 2; ++rep) {
          for (size_t g : {size_t(64), size_t(32), size_t(128)}) {
            CK(cudaDeviceSetLimit(cudaLimitMaxL2FetchGranularity, g));
            const float us = repro::median_us(lib);
            printf("   granularity %-4zu %8.1f us  %.3f of %.0f\n", g, us, bytes / (us * 1e3) / limit, limit);
          }
        }
        CK(cudaDeviceSetLimit(cudaLimitMaxL2FetchGranularity, gran0));
        continue;
      }
      if (plan.mode != SoftmaxMode::kStrided || plan.staged || plan.streaming || plan.chunks != 1) {
        printf("   (not a cached strided plan: skipped)\n");
        continue;
      }
      auto run = [&](const char* name, auto fn, int is_ref) {
        const float us = repro::median_us(fn);
        const double frac = bytes / (us * 1e3) / limit;
        const char* check = "";
        if (is_ref == 1) { CK(cudaMemcpy(yref, out, N * 4, cudaMemcpyDeviceToDevice)); }
        else if (is_ref == 0 || is_ref == 3) {
          CK(cudaMemcpy(hy.data(), out, N * 4, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(hr.data(), yref, N * 4, cudaMemcpyDeviceToHost));
          check = memcmp(hy.data(), hr.data(), N * 4) == 0 ? "bitwise = library" : "DIFFERS";
          if (is_ref == 3 && check[0] == 'D') {  // another exchange order: within float rounding of the library's
            double worst = 0;
            for (int64_t i = 0; i < N; ++i) {
              const double e = std::fabs(double(hy[i]) - hr[i]) / (std::fabs(double(hr[i])) + 1e-6);
              worst = e > worst || e != e ? e : worst;
            }
            static char buf[64];
            snprintf(buf, sizeof buf, "%s library (max rel. err. %.2g)", worst < 1e-4 ? "close to" : "FAR FROM", worst);
            check = buf;
          }
        }
        printf("   %-30s %8.1f us  %.3f of %.0f  %s\n", name, us, frac, limit, check);
        CK(cudaMemset(out, 0xff, N * 4));
      };
      run("library", lib, 1);
      if (smem_study) {
        if (!bwd) continue;
        for (int rep = 0; rep < 2; ++rep) {
          for (int cols : {4, 8, 16}) {  // fixed shapes: the same runs whichever plan the library takes
            for (int threads : {512, 1024}) {
              for (int cl : {8, 16}) {
                if (cl > 16 || cols > threads) continue;
                char name[96];
                snprintf(name, sizeof name, "regs+smem 4+4, %d x %d x %d, lines", cols, threads, cl);
                const cudaError_t e = launch_bwd<1, true, 4>(dy, y, dx, outer, dim, inner, cols, threads, cl);
                if (e != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
                  printf("   %-30s %s\n", name, cudaGetErrorString(e != cudaSuccess ? e : cudaGetLastError()));
                  cudaGetLastError();
                  continue;
                }
                run(name, [&] { return launch_bwd<1, true, 4>(dy, y, dx, outer, dim, inner, cols, threads, cl); }, 3);
                snprintf(name, sizeof name, "regs+smem 4+4, %d x %d x %d, plain", cols, threads, cl);
                run(name, [&] { return launch_bwd<0, true, 4>(dy, y, dx, outer, dim, inner, cols, threads, cl); }, 3);
              }
            }
          }
          run("library (again)", lib, 0);
        }
        continue;
      }
      if (fwd_study) {
        if (bwd) continue;
        printf("   resident tiles %lld\n", (long long)resident_tiles<diag_fwd<0, 0>>(plan.threads, plan.cluster,
               size_t(softmax_strided_smem_bytes(plan.threads, plan.columns, 4, plan.cluster, StridedForwardCache<float, float, Epi, 4>::kValueBytes))));
        for (int rep = 0; rep < 2; ++rep) {
          run("copy, prefetch x1", [&] { return launch_fwd<0>(x, y, outer, dim, inner, plan, 1.0); }, 0);
          run("no prefetch", [&] { return launch_fwd<0>(x, y, outer, dim, inner, plan, 0.0); }, 0);
          run("no prefetch, L2::128B", [&] { return launch_fwd<1>(x, y, outer, dim, inner, plan, 0.0); }, 0);
          run("prefetch x0.5", [&] { return launch_fwd<0>(x, y, outer, dim, inner, plan, 0.5); }, 0);
          run("prefetch x2", [&] { return launch_fwd<0>(x, y, outer, dim, inner, plan, 2.0); }, 0);
          run("no exchange (wrong)", [&] { return launch_fwd<0, 1>(x, y, outer, dim, inner, plan, 1.0); }, 2);
          run("no exchange, no prefetch (wrong)", [&] { return launch_fwd<0, 1>(x, y, outer, dim, inner, plan, 0.0); }, 2);
          run("tile copy y = x (wrong)", [&] { return launch_fwd<0, 2>(x, y, outer, dim, inner, plan, 1.0); }, 2);
          run("tile copy, no prefetch (wrong)", [&] { return launch_fwd<0, 2>(x, y, outer, dim, inner, plan, 0.0); }, 2);
          run("tile copy, L2::128B, no pf (wrong)", [&] { return launch_fwd<1, 2>(x, y, outer, dim, inner, plan, 0.0); }, 2);
          run("library (again)", lib, 0);
        }
        continue;
      }
      for (int rep = 0; rep < 2; ++rep) {
        for (size_t g : {size_t(32), size_t(64), size_t(128)}) {
          CK(cudaDeviceSetLimit(cudaLimitMaxL2FetchGranularity, g));
          size_t got = 0;
          CK(cudaDeviceGetLimit(&got, cudaLimitMaxL2FetchGranularity));
          char name[64];
          snprintf(name, sizeof name, "granularity %zu (got %zu)", g, got);
          run(name, lib, 0);
        }
        CK(cudaDeviceSetLimit(cudaLimitMaxL2FetchGranularity, gran0));
        if (bwd) {
          run("copy, plain loads", [&] { return launch_bwd<0, true>(dy, y, dx, outer, dim, inner, plan); }, 0);
          run("L2::128B", [&] { return launch_bwd<1, true>(dy, y, dx, outer, dim, inner, plan); }, 0);
          run("L2::256B", [&] { return launch_bwd<2, true>(dy, y, dx, outer, dim, inner, plan); }, 0);
          run("no exchange (wrong)", [&] { return launch_bwd<0, false>(dy, y, dx, outer, dim, inner, plan); }, 2);
          run("no exchange, L2::256B (wrong)", [&] { return launch_bwd<2, false>(dy, y, dx, outer, dim, inner, plan); }, 2);
        } else {
          run("copy, plain loads", [&] { return launch_fwd<0>(x, y, outer, dim, inner, plan); }, 0);
          run("L2::128B", [&] { return launch_fwd<1>(x, y, outer, dim, inner, plan); }, 0);
          run("L2::256B", [&] { return launch_fwd<2>(x, y, outer, dim, inner, plan); }, 0);
        }
        run("library (again)", lib, 0);
      }
    }
  }
  printf("done\n");
  return 0;
}
