// Diagnostic (not part of the library; bench/NOTES.md, thirty-ninth session; measured, a dead end): softmax
// over dim 0 through L2, before the library gets such a mode. Dim 0 of a 256 MB matrix runs at 0.77-0.81
// forward on the library's cluster tiles, whose pieces of each D-row (32-64 bytes) are all that a 16-CTA
// cluster's registers hold at D = 16384; a plain copy through 256-byte pieces reaches 0.86-0.92
// (strided_tile_copy_diag). strided_grid_diag put wider pieces in registers across K CTAs meeting through a
// global count, and lost (0.70-0.77): each CTA held its registers through the wait and the fold, with no loads in
// flight. Here nothing is held across a wait. A task (tile, rank) reads its slice of S D-rows x P bytes once
// from memory (pass A), folds its columns' (max, sum) pairs and publishes them; the tile's last arriving CTA
// folds the K partials of each column into (max, 1 / sum) and raises the tile's flag. Pass B of a task waits
// for the flag, reads the same slice again, which is still in L2, and writes y. Pipelined (kPipe), each CTA
// runs pass A of its next task before pass B of the previous one, so while a tile's ranks meet, the CTA has
// loads in flight; memory sees x read once and y written once, in pieces of P bytes of each D-row.
//
// Safety of the waits: tasks are handed out in ticket order and a tile's K tickets are consecutive; a CTA
// waits (pass B) only after its pass A of a later ticket, and pass A never waits, so with K at most the
// resident CTAs every tile's last pass A is reached (the host checks K <= grid; the waits are bounded anyway
// and a timeout is counted and reported).
//
// Prediction: forward 0.85-0.90 of the limit at P = 256 bytes (the copy's 0.86-0.92 less the fold), if the
// slices are still in L2 at pass B: 2 tasks a CTA in flight x the grid's CTAs x S x P is 8-35 MB below.
// Measured (H100, bench/results/h100-2026-11-27-s39-strided-l2-diag-run{1,2}*.txt): 0.32-0.61 against the
// library's 0.76-0.88 on every shape, f32 and bf16; results within float rounding of the library's. Fewer CTAs
// an SM (a smaller footprint in L2) lost more (1 CTA/SM 0.39-0.44, 4: 0.53-0.57), so L2 capacity is not the
// limit: each task's chain of ticket, loads, three barriers, arrival, wait and second loads is, with too
// little in flight between them.
//
//   nvcc -std=c++17 -O3 -arch=sm_90 --expt-relaxed-constexpr -Iinclude -o l2_diag bench/repro/strided_l2_diag.cu
//   ./l2_diag          (run 1's shapes)      ./l2_diag small     (run 2: smaller footprints in L2)
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include <string>
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
  unsigned* timeouts;  // waits that gave up
  unsigned* arrived;   // [tiles]: ranks whose pass A published
  unsigned* ready;     // [tiles]: the tile's (max, 1 / sum) are in `finals`
  Pair* slots;         // [tiles][K][V] partials
  Pair* finals;        // [tiles][V]
};

// kC 16-byte units of each D-row a tile (P = 16 kC bytes), kR D-rows a thread, kThreads threads.
template <typename T, int kC, int kR, int kThreads>
struct Shape {
  static constexpr int L = 16 / sizeof(T);
  static constexpr int V = kC * L;          // columns a tile
  static constexpr int G = kThreads / kC;   // D-groups
  static constexpr int S = G * kR;          // D-rows a task
  static constexpr int W = kThreads / 32;   // warps
  static constexpr int P = (kThreads / V) > 32 ? 32 : (kThreads / V);  // lanes folding one column
  static_assert(kThreads % V == 0 && (P & (P - 1)) == 0 && V >= 32 && kC <= 32 && P <= W, "shape");
};

struct Task {
  int64_t tile, base, d0;
  int rank;
};

template <typename T, int kC, int kR, int kThreads>
FASTACT_DEVICE Task task_of(int64_t t, int K, int64_t dim, int64_t inner) {
  using Sh = Shape<T, kC, kR, kThreads>;
  Task k;
  k.tile = t / K;
  k.rank = static_cast<int>(t % K);
  const int c = threadIdx.x % kC, g = threadIdx.x / kC;
  const int64_t inner_units = inner / Sh::L;
  const int64_t cv = k.tile * kC + c;
  const int64_t o = cv / inner_units, iv = cv % inner_units;
  k.base = o * dim * inner + iv * Sh::L;
  k.d0 = int64_t(k.rank) * Sh::S + g;
  return k;
}

// Pass A: the task's slice, its columns' (max, sum) published; the tile's last arriver folds the K partials.
template <typename T, int kC, int kR, int kThreads>
FASTACT_DEVICE void pass_a(const T* __restrict__ x, int64_t t, int K, int64_t dim, int64_t inner, const Work& w,
                           Pair (*red)[Shape<T, kC, kR, kThreads>::V], int* last_s) {
  using Sh = Shape<T, kC, kR, kThreads>;
  constexpr int L = Sh::L, V = Sh::V, G = Sh::G, W = Sh::W, P = Sh::P;
  using Vec = AlignedVector<T, L>;
  const Task k = task_of<T, kC, kR, kThreads>(t, K, dim, inner);
  const int c = threadIdx.x % kC;
  Vec v[kR];
#pragma unroll
  for (int j = 0; j < kR; ++j) {
    if (k.d0 + int64_t(j) * G < dim) v[j] = load_vector<T, L>(x + k.base + (k.d0 + int64_t(j) * G) * inner);
  }
  Pair mine[L];
#pragma unroll
  for (int l = 0; l < L; ++l) mine[l] = {-3.0e38f, 0.f};
#pragma unroll
  for (int j = 0; j < kR; ++j) {
    if (k.d0 + int64_t(j) * G < dim) {
#pragma unroll
      for (int l = 0; l < L; ++l) mine[l].m = fmaxf(mine[l].m, to_f(v[j].val[l]));
    }
  }
#pragma unroll
  for (int j = 0; j < kR; ++j) {
    if (k.d0 + int64_t(j) * G < dim) {
#pragma unroll
      for (int l = 0; l < L; ++l) mine[l].s += __expf(to_f(v[j].val[l]) - mine[l].m);
    }
  }
#pragma unroll
  for (int mask = kC; mask < 32; mask *= 2) {
#pragma unroll
    for (int l = 0; l < L; ++l) mine[l] = combine(mine[l], shfl_pair(mine[l], mask));
  }
  if ((threadIdx.x % 32) < kC) {
#pragma unroll
    for (int l = 0; l < L; ++l) red[threadIdx.x / 32][c * L + l] = mine[l];
  }
  __syncthreads();
  Pair* slots = w.slots + k.tile * K * V;
  const int q = threadIdx.x / P, p = threadIdx.x % P;
  if (q < V) {
    Pair r = red[p][q];
    for (int i = p + P; i < W; i += P) r = combine(r, red[i][q]);
    for (int mask = P / 2; mask > 0; mask /= 2) r = combine(r, shfl_pair(r, mask));
    if (p == 0) {
      slots[k.rank * V + q] = r;
      __threadfence();
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) *last_s = fetch_add_acq_rel_gpu(w.arrived + k.tile) == unsigned(K - 1);
  __syncthreads();
  if (*last_s) {  // uniform across the CTA
    if (q < V) {
      Pair r = p < K ? ld_part(slots + p * V + q) : Pair{-3.0e38f, 0.f};
      for (int i = p + P; i < K; i += P) r = combine(r, ld_part(slots + i * V + q));
      for (int mask = P / 2; mask > 0; mask /= 2) r = combine(r, shfl_pair(r, mask));
      if (p == 0) {
        w.finals[k.tile * V + q] = {r.m, 1.f / r.s};
        __threadfence();
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) arrive_release_gpu(w.ready + k.tile);
  }
  __syncthreads();  // red and last_s are reused
}

// Pass B: waits for the tile's (max, 1 / sum), reads the slice again (from L2) and writes y.
template <typename T, int kC, int kR, int kThreads>
FASTACT_DEVICE void pass_b(const T* __restrict__ x, T* __restrict__ y, int64_t t, int K, int64_t dim, int64_t inner,
                           const Work& w, Pair* fin) {
  using Sh = Shape<T, kC, kR, kThreads>;
  constexpr int L = Sh::L, V = Sh::V, G = Sh::G;
  using Vec = AlignedVector<T, L>;
  const Task k = task_of<T, kC, kR, kThreads>(t, K, dim, inner);
  const int c = threadIdx.x % kC;
  if (threadIdx.x < 32) {
    const bool ok = __all_sync(0xffffffffu, wait_at_least_gpu(w.ready + k.tile, 1u, 500000000ull));
    if (!ok && threadIdx.x == 0) atomicAdd(w.timeouts, 1u);
  }
  __syncthreads();
  for (int q = threadIdx.x; q < V; q += kThreads) fin[q] = ld_part(w.finals + k.tile * V + q);
  __syncthreads();
  float M[L], F[L];
#pragma unroll
  for (int l = 0; l < L; ++l) {
    M[l] = fin[c * L + l].m;
    F[l] = fin[c * L + l].s;
  }
  Vec v[kR];
#pragma unroll
  for (int j = 0; j < kR; ++j) {
    if (k.d0 + int64_t(j) * G < dim) v[j] = load_vector<T, L>(x + k.base + (k.d0 + int64_t(j) * G) * inner);
  }
#pragma unroll
  for (int j = 0; j < kR; ++j) {
    if (k.d0 + int64_t(j) * G < dim) {
      Vec r;
#pragma unroll
      for (int l = 0; l < L; ++l) r.val[l] = from_f<T>(__expf(to_f(v[j].val[l]) - M[l]) * F[l]);
      store_vector<T, L>(y + k.base + (k.d0 + int64_t(j) * G) * inner, r);
    }
  }
  __syncthreads();  // fin is reused
}

// A persistent grid: each CTA takes tickets until `tasks` are handed out. kPipe: pass A of the next task before
// pass B of the previous one; else pass B right after pass A of the same task.
template <typename T, int kC, int kR, int kThreads, int kMinBlocks, bool kPipe>
__global__ __launch_bounds__(kThreads, kMinBlocks) void l2_softmax_fwd(const T* __restrict__ x, T* __restrict__ y,
                                                                       int64_t dim, int64_t inner, int K,
                                                                       int64_t tasks, Work w) {
  using Sh = Shape<T, kC, kR, kThreads>;
  __shared__ Pair red[Sh::W][Sh::V];
  __shared__ Pair fin[Sh::V];
  __shared__ unsigned long long task_s;
  __shared__ int last_s;
  int64_t prev = -1;
  for (;;) {
    if (threadIdx.x == 0) task_s = atomicAdd(w.ticket, 1ull);
    __syncthreads();
    const int64_t t = task_s < static_cast<unsigned long long>(tasks) ? static_cast<int64_t>(task_s) : -1;
    __syncthreads();  // task_s is written again next round
    if (t >= 0) pass_a<T, kC, kR, kThreads>(x, t, K, dim, inner, w, red, &last_s);
    if constexpr (kPipe) {
      if (prev >= 0) pass_b<T, kC, kR, kThreads>(x, y, prev, K, dim, inner, w, fin);
      prev = t;
    } else {
      if (t >= 0) pass_b<T, kC, kR, kThreads>(x, y, t, K, dim, inner, w, fin);
    }
    if (t < 0) break;
  }
}

template <typename T, int kC, int kR, int kThreads, int kMinBlocks, bool kPipe>
cudaError_t launch_l2(const T* x, T* y, int64_t dim, int64_t inner, void* ws, size_t ws_bytes, int sms, int cap,
                      int* K_out, int* grid_out) {
  using Sh = Shape<T, kC, kR, kThreads>;
  const auto kernel = l2_softmax_fwd<T, kC, kR, kThreads, kMinBlocks, kPipe>;
  const int K = static_cast<int>((dim + Sh::S - 1) / Sh::S);
  const int64_t tiles = inner / Sh::L / kC;
  int per_sm = 0;
  cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0);
  if (e != cudaSuccess) return e;
  const int grid = (cap > 0 ? std::min(cap, per_sm) : per_sm) * sms;  // cap: CTAs an SM, fewer slices in L2
  *K_out = K;
  *grid_out = grid;
  if (K > grid || inner % (Sh::L * kC) != 0) return cudaErrorInvalidValue;
  const size_t head = 64, flags = size_t(tiles) * 8;
  const size_t slots = size_t(tiles) * K * Sh::V * sizeof(Pair), finals = size_t(tiles) * Sh::V * sizeof(Pair);
  const size_t flags_end = (head + flags + 255) / 256 * 256;
  if (flags_end + slots + finals > ws_bytes) return cudaErrorInvalidValue;
  e = cudaMemsetAsync(ws, 0, head + flags);
  if (e != cudaSuccess) return e;
  char* b = static_cast<char*>(ws);
  Work w;
  w.ticket = reinterpret_cast<unsigned long long*>(b);
  w.timeouts = reinterpret_cast<unsigned*>(b + 8);
  w.arrived = reinterpret_cast<unsigned*>(b + head);
  w.ready = w.arrived + tiles;
  w.slots = reinterpret_cast<Pair*>(b + flags_end);
  w.finals = reinterpret_cast<Pair*>(b + flags_end + slots);
  kernel<<<grid, kThreads>>>(x, y, dim, inner, K, tiles * K, w);
  return cudaGetLastError();
}

template <typename T>
void study(const char* tname, int64_t dim, int64_t inner, void* ws, size_t ws_bytes, const SoftmaxDeviceProps& dev,
           bool second_run) {
  const int64_t N = dim * inner;
  const int eb = sizeof(T);
  T *x, *y, *ref;
  CK(cudaMalloc(&x, N * eb)); CK(cudaMalloc(&y, N * eb)); CK(cudaMalloc(&ref, N * eb));
  {
    const std::vector<float> h = repro::uniform_inputs(N);
    std::vector<T> t(N);
    for (int64_t i = 0; i < N; ++i) t[i] = T(h[i]);
    CK(cudaMemcpy(x, t.data(), N * eb, cudaMemcpyHostToDevice));
  }
  unsigned* timeouts = reinterpret_cast<unsigned*>(static_cast<char*>(ws) + 8);
  const double limit = 2968.0;  // GB/s, the bar report's limit (sessions 34-39)
  const double bytes = 2.0 * N * eb;
  const SoftmaxProblem fp = softmax_forward_problem(x, eb, y, eb, 4, 1, dim, inner, dim, dev);
  const SoftmaxPlan plan = choose_softmax(fp);
  printf("== %s [%lld, %lld] dim 0 fwd: %s\n", tname, (long long)dim, (long long)inner, softmax_explain(fp, plan).c_str());
  auto lib = [&] { return softmax_forward<T, T, Epi>(x, ref, 1, dim, inner, dim, plan, 0, nullptr); };
  const float lib_us = repro::median_us(lib);
  printf("   library                                        %7.1f us  %.3f of %.0f\n", lib_us, bytes / (lib_us * 1e3) / limit, limit);
  std::vector<T> hy(N), hr(N);
  CK(cudaMemcpy(hr.data(), ref, N * eb, cudaMemcpyDeviceToHost));
  auto run = [&](const std::string& name, auto launch) {
    int K = 0, grid = 0;
    CK(cudaMemset(y, 0xff, N * eb));
    CK(cudaMemset(timeouts, 0, 4));
    const cudaError_t e0 = launch(&K, &grid);
    if (e0 != cudaSuccess) {
      printf("   %-46s %s (K %d, grid %d)\n", name.c_str(), cudaGetErrorString(e0), K, grid);
      (void)cudaGetLastError();
      return;
    }
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(hy.data(), y, N * eb, cudaMemcpyDeviceToHost));
    double worst = 0;
    for (int64_t i = 0; i < N; ++i) {
      const double a = float(hy[i]), r = float(hr[i]);
      const double err = std::fabs(a - r) / (std::fabs(r) + 1e-6);
      worst = err > worst || err != err ? err : worst;
    }
    const float us = repro::median_us([&] { int k, g; return launch(&k, &g); });
    unsigned to = 0;
    CK(cudaMemcpy(&to, timeouts, 4, cudaMemcpyDeviceToHost));
    printf("   %-46s %7.1f us  %.3f of %.0f  K %3d grid %4d  max rel. err. vs library %.2g%s\n", name.c_str(), us,
           bytes / (us * 1e3) / limit, limit, K, grid, worst, to ? "  WAITS TIMED OUT" : "");
  };
  const int sms = dev.sm_count;
#define L2_CAP(C, R, TH, MB, PIPE, CAP)                                                                       \
  run(std::string("l2 P=" #C "x16 B, " #R " rows x " #TH " thr, min " #MB) + (PIPE ? ", pipelined" : ", in turn") + \
          (CAP ? ", " #CAP " CTA/SM" : ""),                                                                         \
      [&](int* K, int* g) { return launch_l2<T, C, R, TH, MB, PIPE>(x, y, dim, inner, ws, ws_bytes, sms, CAP, K, g); })
#define L2_FWD(C, R, TH, MB, PIPE) L2_CAP(C, R, TH, MB, PIPE, 0)
  if (second_run) {  // run 2: does a smaller footprint in L2 between the passes help? (run 1: 0.45-0.61)
    if constexpr (sizeof(T) == 4) {
      L2_FWD(16, 8, 256, 4, true);
      L2_CAP(16, 8, 256, 4, true, 1);
      L2_CAP(16, 8, 256, 4, true, 2);
      L2_FWD(8, 4, 256, 4, true);
      L2_CAP(8, 4, 256, 4, true, 2);
      L2_FWD(16, 2, 256, 4, true);
      L2_CAP(16, 16, 256, 2, true, 1);
    }
  } else if constexpr (sizeof(T) == 4) {
    L2_FWD(16, 8, 256, 4, true);
    L2_FWD(16, 8, 256, 4, false);
    L2_FWD(8, 8, 256, 4, true);
    L2_FWD(16, 4, 256, 4, true);
    L2_FWD(16, 16, 256, 2, true);
    L2_FWD(32, 8, 512, 2, true);
    L2_FWD(16, 8, 512, 2, true);
  } else {
    L2_FWD(16, 4, 256, 4, true);
    L2_FWD(16, 4, 256, 4, false);
    L2_FWD(8, 4, 256, 4, true);
    L2_FWD(16, 8, 256, 2, true);
    L2_FWD(16, 4, 512, 2, true);
  }
#undef L2_FWD
#undef L2_CAP
  const float lib2 = repro::median_us(lib);
  printf("   library (again)                                %7.1f us  %.3f of %.0f\n", lib2, bytes / (lib2 * 1e3) / limit, limit);
  CK(cudaFree(x)); CK(cudaFree(y)); CK(cudaFree(ref));
}

}  // namespace

int main(int argc, char** argv) {
  const bool second = argc > 1 && strcmp(argv[1], "small") == 0;
  SoftmaxDeviceProps dev;
  CK(softmax_device_props(0, &dev));
  const size_t ws_bytes = size_t(128) << 20;
  void* ws;
  CK(cudaMalloc(&ws, ws_bytes));
  study<float>("f32", 16384, 4096, ws, ws_bytes, dev, second);
  study<float>("f32", 8192, 8192, ws, ws_bytes, dev, second);
  if (!second) {
    study<float>("f32", 4096, 16384, ws, ws_bytes, dev, false);
    study<__nv_bfloat16>("bf16", 16384, 8192, ws, ws_bytes, dev, false);
    study<__nv_bfloat16>("bf16", 8192, 16384, ws, ws_bytes, dev, false);
  }
  printf("done\n");
}
