// Diagnostic (not part of the library; bench/NOTES.md, thirty-seventh session): a strided grid mode for softmax
// over dim 0, before the library gets one. strided_tile_copy_diag found that a plain copy through tiles of P
// bytes of each D-row, split over K CTAs that meet through a global arrival count, reaches 0.85-0.88 of the
// limit at P = 128 and 0.88-0.92 at P = 256, where the library's cluster tiles (P = 32-64: all a 16-CTA
// cluster's registers hold at D = 16384) cap at 0.76-0.78. This is that pattern with the softmax in it: each
// CTA takes a ticket (tile, rank) = divmod(ticket, K), caches its D-rows' pieces of the tile in registers
// (R vectors a thread; 16-bit inputs as loaded), folds its (max, sum) pairs (backward: the dot of dy and y)
// over its D-groups, publishes the C * L partials in global slots, counts itself on the tile's counter,
// waits for the tile's K CTAs (bounded: a wait that times out is counted and reported), folds the K
// partials of each column in rank order (every CTA the same bits) and writes its outputs from registers.
// The zeroing of the tickets and counters is inside the timed call (a memset, as a library launch would).
// Outputs are compared with the library's plan (float rounding: the fold order differs).
//
//   nvcc -std=c++17 -O3 -arch=sm_90 --expt-relaxed-constexpr -Iinclude -o grid_diag bench/repro/strided_grid_diag.cu
//   ./grid_diag
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include "fastact/grid_sync.cuh"
#include "fastact/softmax/launch.cuh"
#include "repro_common.cuh"
#include "repro_pairs.cuh"

using namespace fastact;
using namespace fastact::softmax_impl;
using Epi = math::SoftmaxEpilogue;

namespace {

using namespace repro;

struct Work {
  unsigned long long* ticket;
  unsigned* arrived;   // per tile
  unsigned* timeouts;  // waits that gave up
  void* slots;         // [tiles][K][V] partials
};

// kC 16-byte units of each D-row a tile (P = 16 kC bytes), kR D-rows a thread, kThreads threads.
template <typename T, int kC, int kR, int kThreads, int kMinBlocks, bool kBwd>
__global__ __launch_bounds__(kThreads, kMinBlocks) void grid_strided(const T* __restrict__ a,  // fwd: x; bwd: dy
                                                                     const T* __restrict__ b,  // bwd: y
                                                                     T* __restrict__ out, int64_t dim, int64_t inner,
                                                                     int K, Work w) {
  constexpr int L = 16 / sizeof(T);
  constexpr int V = kC * L;  // values (columns) a tile
  constexpr int G = kThreads / kC;
  constexpr int S = G * kR;  // D-rows a CTA
  constexpr int P = (kThreads / V) > 32 ? 32 : (kThreads / V);  // lanes folding one value
  static_assert(kThreads % V == 0 && (P & (P - 1)) == 0 && V >= 32 && kC <= 32, "shape");
  using Vec = AlignedVector<T, L>;
  using Part = std::conditional_t<kBwd, float, Pair>;
  constexpr int W = kThreads / 32;  // warps: each folds its own D-groups by shuffles first
  __shared__ Part red[W][V];
  __shared__ Part res[V];
  __shared__ unsigned long long task_s;
  if (threadIdx.x == 0) task_s = atomicAdd(w.ticket, 1ull);
  __syncthreads();
  const int64_t tile = static_cast<int64_t>(task_s / K);
  const int rank = static_cast<int>(task_s % K);
  const int c = threadIdx.x % kC, g = threadIdx.x / kC;
  const int64_t inner_units = inner / L;
  const int64_t cv = tile * kC + c;
  const int64_t o = cv / inner_units, iv = cv % inner_units;
  const int64_t base = o * dim * inner + iv * L;
  const int64_t d0 = int64_t(rank) * S + g;
  Vec va[kR], vb[kR];
#pragma unroll
  for (int j = 0; j < kR; ++j) {
    if (d0 + int64_t(j) * G < dim) {
      va[j] = load_vector<T, L>(a + base + (d0 + int64_t(j) * G) * inner);
      if constexpr (kBwd) vb[j] = load_vector<T, L>(b + base + (d0 + int64_t(j) * G) * inner);
    }
  }
  Part mine[L];
  if constexpr (kBwd) {
#pragma unroll
    for (int l = 0; l < L; ++l) mine[l] = 0.f;
#pragma unroll
    for (int j = 0; j < kR; ++j) {
      if (d0 + int64_t(j) * G < dim) {
#pragma unroll
        for (int l = 0; l < L; ++l) mine[l] += to_f(va[j].val[l]) * to_f(vb[j].val[l]);
      }
    }
  } else {
#pragma unroll
    for (int l = 0; l < L; ++l) mine[l] = {-3.0e38f, 0.f};
#pragma unroll
    for (int j = 0; j < kR; ++j) {
      if (d0 + int64_t(j) * G < dim) {
#pragma unroll
        for (int l = 0; l < L; ++l) mine[l].m = fmaxf(mine[l].m, to_f(va[j].val[l]));
      }
    }
#pragma unroll
    for (int j = 0; j < kR; ++j) {
      if (d0 + int64_t(j) * G < dim) {
#pragma unroll
        for (int l = 0; l < L; ++l) mine[l].s += __expf(to_f(va[j].val[l]) - mine[l].m);
      }
    }
  }
  // The warp's D-groups of each (column, lane): lanes l, l ^ kC, l ^ 2 kC, ... hold the same column.
#pragma unroll
  for (int mask = kC; mask < 32; mask *= 2) {
#pragma unroll
    for (int l = 0; l < L; ++l) {
      if constexpr (kBwd) mine[l] += __shfl_xor_sync(0xffffffffu, mine[l], mask);
      else mine[l] = combine(mine[l], shfl_pair(mine[l], mask));
    }
  }
  if ((threadIdx.x % 32) < kC) {
#pragma unroll
    for (int l = 0; l < L; ++l) red[threadIdx.x / 32][c * L + l] = mine[l];
  }
  __syncthreads();
  // The CTA's partial of value q: P lanes, each a strided share of the G groups, then shuffles.
  Part* slots = static_cast<Part*>(w.slots) + (tile * K) * V;
  {
    const int q = threadIdx.x / P, p = threadIdx.x % P;
    if (q < V) {
      Part r = red[p % W][q];  // P <= W: kThreads / V <= kThreads / 32 since V >= 32
      for (int i = p + P; i < W; i += P) {
        if constexpr (kBwd) r += red[i][q]; else r = combine(r, red[i][q]);
      }
      for (int mask = P / 2; mask > 0; mask /= 2) {
        if constexpr (kBwd) r += __shfl_xor_sync(0xffffffffu, r, mask); else r = combine(r, shfl_pair(r, mask));
      }
      if (p == 0) {
        slots[rank * V + q] = r;
        __threadfence();  // before thread 0's release below (with the barrier between)
      }
    }
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    if (threadIdx.x == 0) arrive_release_gpu(w.arrived + tile);
    const bool ok = __all_sync(0xffffffffu, wait_at_least_gpu(w.arrived + tile, unsigned(K), 500000000ull));
    if (!ok && threadIdx.x == 0) atomicAdd(w.timeouts, 1u);
  }
  __syncthreads();
  // Every CTA folds the K partials of each value in rank order: the same bits in all of them.
  {
    const int q = threadIdx.x / P, p = threadIdx.x % P;
    if (q < V) {
      Part r = p < K ? ld_part(slots + p * V + q) : Part(identity<Part>());
      for (int i = p + P; i < K; i += P) {
        if constexpr (kBwd) r += ld_part(slots + i * V + q); else r = combine(r, ld_part(slots + i * V + q));
      }
      for (int mask = P / 2; mask > 0; mask /= 2) {
        if constexpr (kBwd) r += __shfl_xor_sync(0xffffffffu, r, mask); else r = combine(r, shfl_pair(r, mask));
      }
      if (p == 0) res[q] = r;
    }
  }
  __syncthreads();
  float M[L], F[L];
#pragma unroll
  for (int l = 0; l < L; ++l) {
    if constexpr (kBwd) {
      M[l] = res[c * L + l];
    } else {
      M[l] = res[c * L + l].m;
      F[l] = 1.f / res[c * L + l].s;
    }
  }
#pragma unroll
  for (int j = 0; j < kR; ++j) {
    if (d0 + int64_t(j) * G < dim) {
      Vec r;
#pragma unroll
      for (int l = 0; l < L; ++l) {
        if constexpr (kBwd) {
          const float yv = to_f(vb[j].val[l]);
          r.val[l] = from_f<T>(yv * (to_f(va[j].val[l]) - M[l]));
        } else {
          r.val[l] = from_f<T>(__expf(to_f(va[j].val[l]) - M[l]) * F[l]);
        }
      }
      store_vector<T, L>(out + base + (d0 + int64_t(j) * G) * inner, r);
    }
  }
}

template <typename T>
struct Buffers {
  T *x, *y, *dy, *dx, *ref;
};

// The grid launch of one shape: tiles x K CTAs, the workspace zeroed first (inside the timed call).
template <typename T, int kC, int kR, int kThreads, int kMinBlocks, bool kBwd>
cudaError_t launch_grid(const Buffers<T>& bf, int64_t dim, int64_t inner, void* ws, size_t ws_bytes, int* K_out) {
  constexpr int L = 16 / sizeof(T);
  constexpr int S = kThreads / kC * kR;
  const int K = static_cast<int>((dim + S - 1) / S);
  const int64_t tiles = inner / L / kC;
  *K_out = K;
  const size_t head = 4096;
  if (head + size_t(tiles) * K * kC * L * 8 > ws_bytes) return cudaErrorInvalidValue;
  cudaError_t e = cudaMemsetAsync(ws, 0, 16 + size_t(tiles) * 4);
  if (e != cudaSuccess) return e;
  Work w;
  w.ticket = static_cast<unsigned long long*>(ws);
  w.timeouts = reinterpret_cast<unsigned*>(static_cast<char*>(ws) + 8);
  w.arrived = reinterpret_cast<unsigned*>(static_cast<char*>(ws) + 16);
  w.slots = static_cast<char*>(ws) + head;
  if constexpr (kBwd) {
    grid_strided<T, kC, kR, kThreads, kMinBlocks, true><<<tiles * K, kThreads>>>(bf.dy, bf.y, bf.dx, dim, inner, K, w);
  } else {
    grid_strided<T, kC, kR, kThreads, kMinBlocks, false><<<tiles * K, kThreads>>>(bf.x, nullptr, bf.y, dim, inner, K, w);
  }
  return cudaGetLastError();
}

template <typename T>
__global__ void fill_kernel(T* x, int64_t n, int kind) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float u = (h >> 8) * (1.0f / 16777216.0f);
    x[i] = from_f<T>(kind == 0 ? (u - 0.5f) * 8.f : kind == 1 ? 0.f : (u - 0.5f) * 0.01f);
  }
}

}  // namespace

// Whether the library's bf16 dim-0 time depends on the input's values: the same launch over x filled on the
// device three ways, against the host-made uniform inputs.
template <typename T>
void data_study(const char* tname, int64_t dim, int64_t inner, const SoftmaxDeviceProps& dev) {
  const int64_t N = dim * inner;
  const int eb = sizeof(T);
  T *x, *y;
  CK(cudaMalloc(&x, N * eb)); CK(cudaMalloc(&y, N * eb));
  const SoftmaxProblem fp = softmax_forward_problem(x, eb, y, eb, 4, 1, dim, inner, dim, dev);
  const SoftmaxPlan plan = choose_softmax(fp);
  const double limit = 2968.0;
  auto lib = [&] { return softmax_forward<T, T, Epi>(x, y, 1, dim, inner, dim, plan, 0, nullptr); };
  {
    const std::vector<float> h = repro::uniform_inputs(N);
    std::vector<T> t(N);
    for (int64_t i = 0; i < N; ++i) t[i] = T(h[i]);
    CK(cudaMemcpy(x, t.data(), N * eb, cudaMemcpyHostToDevice));
    const float us = repro::median_us(lib);
    printf("%s [%lld, %lld] dim 0 fwd, host uniform [-4, 4):  %7.1f us  %.3f\n", tname, (long long)dim, (long long)inner, us, 2.0 * N * eb / (us * 1e3) / limit);
  }
  const char* names[] = {"device uniform [-4, 4)", "zeros", "device uniform [-0.005, 0.005)"};
  for (int kind = 0; kind < 3; ++kind) {
    fill_kernel<T><<<1024, 256>>>(x, N, kind);
    CK(cudaDeviceSynchronize());
    const float us = repro::median_us(lib);
    printf("%s [%lld, %lld] dim 0 fwd, %-30s %7.1f us  %.3f\n", tname, (long long)dim, (long long)inner, names[kind], us, 2.0 * N * eb / (us * 1e3) / limit);
  }
  CK(cudaFree(x)); CK(cudaFree(y));
}

template <typename T>
void study(const char* tname, int64_t dim, int64_t inner, void* ws, size_t ws_bytes, const SoftmaxDeviceProps& dev) {
  const int64_t N = dim * inner;
  const int eb = sizeof(T);
  Buffers<T> bf;
  CK(cudaMalloc(&bf.x, N * eb)); CK(cudaMalloc(&bf.y, N * eb)); CK(cudaMalloc(&bf.dy, N * eb));
  CK(cudaMalloc(&bf.dx, N * eb)); CK(cudaMalloc(&bf.ref, N * eb));
  {
    const std::vector<float> h = repro::uniform_inputs(N + 7);
    std::vector<T> t(N);
    for (int64_t i = 0; i < N; ++i) t[i] = T(h[i]);
    CK(cudaMemcpy(bf.x, t.data(), N * eb, cudaMemcpyHostToDevice));
    for (int64_t i = 0; i < N; ++i) t[i] = T(h[i + 7]);
    CK(cudaMemcpy(bf.dy, t.data(), N * eb, cudaMemcpyHostToDevice));
  }
  unsigned* timeouts = reinterpret_cast<unsigned*>(static_cast<char*>(ws) + 8);
  const double limit = 2968.0;  // GB/s, the bar report's limit (sessions 34-37)
  std::vector<T> hy(N), hr(N);
  for (int bwd = 0; bwd < 2; ++bwd) {
    const SoftmaxProblem fp = softmax_forward_problem(bf.x, eb, bf.y, eb, 4, 1, dim, inner, dim, dev);
    const SoftmaxProblem p = bwd ? softmax_backward_problem(bf.dy, bf.y, eb, bf.dx, eb, 4, 1, dim, inner, dev) : fp;
    const SoftmaxPlan plan = choose_softmax(p);
    printf("== %s [%lld, %lld] dim 0 %s: %s\n", tname, (long long)dim, (long long)inner, bwd ? "bwd" : "fwd",
           softmax_explain(p, plan).c_str());
    const double bytes = (bwd ? 3.0 : 2.0) * N * eb;
    T* out = bwd ? bf.dx : bf.y;
    CK(softmax_forward<T, T, Epi>(bf.x, bf.y, 1, dim, inner, dim, choose_softmax(fp), 0, nullptr));
    auto lib = [&] {
      return bwd ? softmax_backward<T, T, Epi>(bf.dy, bf.y, bf.dx, 1, dim, inner, plan, 0, nullptr)
                 : softmax_forward<T, T, Epi>(bf.x, bf.y, 1, dim, inner, dim, plan, 0, nullptr);
    };
    const float lib_us = repro::median_us(lib);
    CK(cudaMemcpy(bf.ref, out, N * eb, cudaMemcpyDeviceToDevice));
    printf("   library                                  %7.1f us  %.3f of %.0f\n", lib_us, bytes / (lib_us * 1e3) / limit,
           limit);
    auto run = [&](const char* name, auto launch) {
      int K = 0;
      CK(cudaMemset(out, 0xff, N * eb));
      CK(cudaMemset(timeouts, 0, 4));
      const cudaError_t e0 = launch(&K);
      if (e0 != cudaSuccess) { printf("   %-40s %s\n", name, cudaGetErrorString(e0)); (void)cudaGetLastError(); return; }
      CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(hy.data(), out, N * eb, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(hr.data(), bf.ref, N * eb, cudaMemcpyDeviceToHost));
      double worst = 0;
      for (int64_t i = 0; i < N; ++i) {
        const double a = float(hy[i]), r = float(hr[i]);
        const double err = std::fabs(a - r) / (std::fabs(r) + (bwd ? 1e-3 : 1e-6));
        worst = err > worst || err != err ? err : worst;
      }
      const float us = repro::median_us([&] { int k; return launch(&k); });
      unsigned to = 0;
      CK(cudaMemcpy(&to, timeouts, 4, cudaMemcpyDeviceToHost));
      printf("   %-40s %7.1f us  %.3f of %.0f  K %3d  max rel. err. vs library %.2g%s\n", name, us,
             bytes / (us * 1e3) / limit, limit, K, worst, to ? "  WAITS TIMED OUT" : "");
    };
#define GRID_FWD(C, R, TH, MB)                                                                          \
  run("grid P=" #C "x16 B, " #R " rows x " #TH " thr, " #MB " CTA/SM",                                  \
      [&](int* K) { return launch_grid<T, C, R, TH, MB, false>(bf, dim, inner, ws, ws_bytes, K); })
#define GRID_BWD(C, R, TH, MB)                                                                          \
  run("grid P=" #C "x16 B, " #R " rows x " #TH " thr, " #MB " CTA/SM",                                  \
      [&](int* K) { return launch_grid<T, C, R, TH, MB, true>(bf, dim, inner, ws, ws_bytes, K); })
    // Shapes whose ptxas reports no spills (16-bit backwards: the fewest; the bf16 shapes hold 4-byte pairs
    // for 8 lanes a vector).
    if constexpr (sizeof(T) == 4) {
      if (!bwd) {
        GRID_FWD(8, 8, 512, 2);
        GRID_FWD(16, 8, 512, 2);
        GRID_FWD(32, 8, 512, 2);
        GRID_FWD(16, 16, 512, 1);
        GRID_FWD(8, 8, 1024, 1);
        GRID_FWD(16, 8, 1024, 1);
        GRID_FWD(16, 4, 512, 3);
      } else {
        GRID_BWD(8, 4, 512, 2);
        GRID_BWD(16, 4, 512, 2);
        GRID_BWD(8, 8, 512, 1);
        GRID_BWD(16, 8, 512, 1);
        GRID_BWD(8, 4, 1024, 1);
        GRID_BWD(16, 4, 1024, 1);
        GRID_BWD(16, 2, 512, 3);
      }
    } else {
      if (!bwd) {
        GRID_FWD(8, 4, 512, 2);
        GRID_FWD(16, 4, 512, 2);
        GRID_FWD(32, 4, 512, 2);
        GRID_FWD(8, 8, 512, 1);
        GRID_FWD(16, 8, 512, 1);
        GRID_FWD(8, 4, 1024, 1);
        GRID_FWD(16, 4, 1024, 1);
      } else {
        GRID_BWD(8, 4, 512, 2);
        GRID_BWD(16, 4, 512, 2);
        GRID_BWD(16, 2, 512, 3);
        GRID_BWD(8, 8, 512, 1);
        GRID_BWD(8, 4, 1024, 1);
      }
    }
#undef GRID_FWD
#undef GRID_BWD
    const float lib2 = repro::median_us(lib);
    printf("   library (again)                          %7.1f us  %.3f of %.0f\n", lib2, bytes / (lib2 * 1e3) / limit,
           limit);
  }
  CK(cudaFree(bf.x)); CK(cudaFree(bf.y)); CK(cudaFree(bf.dy)); CK(cudaFree(bf.dx)); CK(cudaFree(bf.ref));
}

int main(int argc, char** argv) {
  const bool only_bf16 = argc > 1 && strcmp(argv[1], "bf16") == 0;
  if (argc > 1 && strcmp(argv[1], "data") == 0) {
    SoftmaxDeviceProps d;
    CK(softmax_device_props(0, &d));
    data_study<__nv_bfloat16>("bf16", 16384, 8192, d);
    data_study<float>("f32", 16384, 4096, d);
    data_study<__nv_bfloat16>("bf16", 4096, 32768, d);
    return 0;
  }
  SoftmaxDeviceProps dev;
  CK(softmax_device_props(0, &dev));
  const size_t ws_bytes = size_t(64) << 20;
  void* ws;
  CK(cudaMalloc(&ws, ws_bytes));
  if (only_bf16) {  // the bf16 study first, on a fresh process
    study<__nv_bfloat16>("bf16", 16384, 8192, ws, ws_bytes, dev);
    study<__nv_bfloat16>("bf16", 8192, 16384, ws, ws_bytes, dev);
  } else {
    study<float>("f32", 16384, 4096, ws, ws_bytes, dev);
    study<__nv_bfloat16>("bf16", 16384, 8192, ws, ws_bytes, dev);
    study<float>("f32", 8192, 8192, ws, ws_bytes, dev);
  }
  printf("done\n");
}
