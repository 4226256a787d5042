// Diagnostic (not part of the library; bench/NOTES.md, thirty-fifth session): where the grid mode's forward loses
// 5-7% against the cluster mode at the same per-CTA shape. f32 rows of 262144 / 524288 / 1048576 (256 MB), the
// library's grid and cluster launches against copies of the grid forward kernel with one thing changed each:
//   0 the library's ticket and exchange (the copy itself);
//   1 task = blockIdx.x (no ticket atomic; unsafe in general: measures the ticket's latency);
//   2 one ticket per cluster of K CTAs, launched as clusters (a row's CTAs start in K-CTA gangs);
//   3 the ticket, and an L2 prefetch of the guessed slice (blockIdx.x) while it is in flight;
//   4 one slice, no finished count at the end (right unless a CTA gives up);
//   5 no exchange between CTAs (each CTA's own partial: wrong results, timing only);
//   6 / 7 the slots polled directly (8-byte partials; a zeroed slot is never a partial), with / without a sleep;
//   8 the library's exchange with the arrival count polled without the sleep.
// Each variant's output is compared bitwise with the library grid's.
//
//   nvcc -std=c++17 -O3 -arch=sm_90 --expt-relaxed-constexpr -Iinclude -o grid_diag bench/repro/grid_exchange_diag.cu
//   ./grid_diag
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
FASTACT_DEVICE GridExchange exchange_of(const GridWorkspaceView& ws, int ctas, GridTask& t, int64_t& row) {
  int64_t r, rank;
  divmod_nonneg(static_cast<int64_t>(t.task), ctas, r, rank);
  row = r;
  return GridExchange{ws.slots + 16 * r * ctas, ws.arrived + r, &t.gave_up, ws.wait_ns, ctas, static_cast<int>(rank), 0, 0u};
}

template <int kMode>
__global__ __launch_bounds__(512, 2) void diag_grid_fwd(const float* __restrict__ x, float* __restrict__ y, int64_t dim,
                                                        int64_t row_stride, int ctas, Epi epi, GridWorkspaceView ws, int K) {
  using Shape = GridForwardShape<float, float, 4>;
  __shared__ RowScratch<MaxSum<float>> scratch;
  __shared__ GridTask task;
  __shared__ uint64_t tbar;
  int64_t row;
  GridExchange group;
  if constexpr (kMode == 0) {
    group = grid_task(ws, ctas, task, row);
  } else if constexpr (kMode == 1) {
    if (threadIdx.x == 0) { task.task = blockIdx.x; task.gave_up = 0; atomicAdd(ws.ticket, 1ull); }
    __syncthreads();
    group = exchange_of(ws, ctas, task, row);
  } else if constexpr (kMode == 2) {
    const int r = cluster_rank(K);
    if (threadIdx.x == 0) { mbarrier_init(&tbar, 1); fence_mbarrier_init(); task.gave_up = 0; }
    __syncwarp();
    cluster_arrive_relaxed();
    cluster_wait();
    if (threadIdx.x == 0) {
      if (r == 0) {
        const unsigned long long base = atomicAdd(ws.ticket, static_cast<unsigned long long>(K));
        task.task = base;
        for (int q = 1; q < K; ++q) push_to_peer(base, &task.task, &tbar, q);
      } else {
        mbarrier_arrive_expect_bytes(&tbar, 8);
        mbarrier_wait_parity(&tbar, 0);
        task.task += r;
      }
    }
    __syncthreads();
    group = exchange_of(ws, ctas, task, row);
  } else {
    if (threadIdx.x == 0) { task.task = grid_ticket(ws.ticket); task.gave_up = 0; }
    {
      int64_t gr, grank;
      divmod_nonneg(static_cast<int64_t>(blockIdx.x), ctas, gr, grank);
      const ResidentSlice s = resident_slice_of_rank<4, Shape::kVecs>(dim, static_cast<int>(grank));
      prefetch_slice<Shape::kVecs>(x + gr * row_stride, s);
    }
    __syncthreads();
    group = exchange_of(ws, ctas, task, row);
  }
  do {
    grid_forward_slice<float, float, Epi, 4>(x, y, dim, row_stride, row, group.rank, epi, scratch, group);
  } while (grid_next(ws, task, ctas, group, row));
}

// 7: the exchange polls the slots themselves (8-byte partials, a zeroed slot never a partial: sum >= 1 or
// max = -inf), no arrival counter: one round trip fewer after the last arrival.
}  // namespace
namespace fastact::softmax_impl {
struct SlotGroup {
  unsigned char* slots;
  int size;
  int rank;
  int sleep_ns;
};
struct SpinGroup {
  unsigned char* slots;
  unsigned* arrived;
  int size;
  int rank;
};
template <typename V, typename Op>
FASTACT_DEVICE V row_allreduce(V v, Op op, RowScratch<V>& sm, int& round, const SpinGroup& g) {
  const int ring = (round++) & 1;
  v = block_allreduce(v, op, sm, ring);
  if (threadIdx.x == 0) {
    *reinterpret_cast<V*>(g.slots + 16 * int64_t(g.rank)) = v;
    arrive_release_gpu(g.arrived);
  }
  if (threadIdx.x < kWarpSize) {
    while (load_acquire_gpu(g.arrived) < unsigned(g.size)) {}
    const V p = grid_fold<V>(g.slots, g.size, op);
    if (threadIdx.x == 0) sm.cta[ring][0] = p;
  }
  __syncthreads();
  return sm.cta[ring][0];
}
FASTACT_DEVICE constexpr bool row_gave_up(const SpinGroup&) { return false; }
template <typename V, typename Op>
FASTACT_DEVICE V row_allreduce(V v, Op op, RowScratch<V>& sm, int& round, const SlotGroup& g) {
  static_assert(sizeof(V) == 8, "8-byte partials");
  const int ring = (round++) & 1;
  v = block_allreduce(v, op, sm, ring);
  if (threadIdx.x == 0) {
    unsigned long long bits;
    memcpy(&bits, &v, 8);
    asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(g.slots + 16 * int64_t(g.rank)), "l"(bits) : "memory");
  }
  if (threadIdx.x < kWarpSize) {
    const int lane = threadIdx.x;
    V p = Op::identity();
    for (int q0 = 0; q0 < g.size; q0 += kWarpSize) {
      const int q = q0 + lane;
      unsigned long long bits = 0;
      bool have = q >= g.size;
      while (!__all_sync(0xffffffffu, have)) {
        if (!have) {
          asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(bits) : "l"(g.slots + 16 * int64_t(q)) : "memory");
          have = bits != 0;
          if (!have && g.sleep_ns) __nanosleep(g.sleep_ns);
        }
      }
      if (q < g.size) {
        V w;
        memcpy(&w, &bits, 8);
        p = op(p, w);
      }
    }
    p = warp_reduce(p, op);
    if (threadIdx.x == 0) sm.cta[ring][0] = p;
  }
  __syncthreads();
  return sm.cta[ring][0];
}
FASTACT_DEVICE constexpr bool row_gave_up(const SlotGroup&) { return false; }
}  // namespace fastact::softmax_impl
namespace {

// A copy of grid_forward_slice over any Group (int 1: the block's own partial only: wrong results).
template <typename Group>
FASTACT_DEVICE void slice_any(const float* __restrict__ x, float* __restrict__ y, int64_t dim, int64_t row, int rank,
                              const Epi& epi, RowScratch<MaxSum<float>>& scratch, const Group& group) {
  using Shape = GridForwardShape<float, float, 4>;
  using Unit = AlignedVector<float, 4>;
  constexpr int kRegVecs = Shape::kRegVecs;
  constexpr int kSmemVecs = Shape::kSmemVecs;
  const int nthreads = blockDim.x;
  Unit* const slot = reinterpret_cast<Unit*>(cluster_smem_bytes()) + threadIdx.x;
  const ResidentSlice s = resident_slice_of_rank<4, Shape::kVecs>(dim, rank);
  const float* xr = x + row * dim + s.first;
  int round = 0;
#pragma unroll
  for (int j = 0; j < kSmemVecs; ++j) {
    if (kRegVecs + j < s.nvalid) copy_async_16(slot + j * nthreads, xr + (kRegVecs + j) * s.step);
  }
  copy_async_commit();
  float v[kRegVecs][4];
#pragma unroll
  for (int j = 0; j < kRegVecs; ++j) {
    if (j < s.nvalid) to_acc(load_vector<float, 4>(xr + j * s.step), v[j]);
  }
  resident_forward<Epi, 4, kRegVecs>(v, s, y + row * dim + s.first, epi, scratch, round, group,
                                     SharedUnits<Epi, float, 4, kRegVecs, kSmemVecs>{{}, slot, nthreads});
}

// 4: the library's ticket and exchange, one slice, no finished count at the end (right unless a CTA gives up).
// 5: the ticket, no exchange between CTAs (timing only).
template <int kMode>
__global__ __launch_bounds__(512, 2) void diag_grid_fwd2(const float* __restrict__ x, float* __restrict__ y, int64_t dim,
                                                         int64_t row_stride, int ctas, Epi epi, GridWorkspaceView ws, int K) {
  __shared__ RowScratch<MaxSum<float>> scratch;
  __shared__ GridTask task;
  int64_t row;
  GridExchange group = grid_task(ws, ctas, task, row);
  if constexpr (kMode == 4) slice_any(x, y, dim, row, group.rank, epi, scratch, group);
  else if constexpr (kMode == 7) slice_any(x, y, dim, row, group.rank, epi, scratch, SlotGroup{group.slots, group.size, group.rank, 0});
  else if constexpr (kMode == 6) slice_any(x, y, dim, row, group.rank, epi, scratch, SlotGroup{group.slots, group.size, group.rank, 100});
  else if constexpr (kMode == 8) slice_any(x, y, dim, row, group.rank, epi, scratch, SpinGroup{group.slots, group.arrived, group.size, group.rank});
  else slice_any(x, y, dim, row, group.rank, epi, scratch, 1);
}

template <int kMode>
cudaError_t launch_diag(const float* x, float* y, int64_t rows, int64_t dim, const SoftmaxPlan& plan, void* wsp, int K) {
  using Shape = GridForwardShape<float, float, 4>;
  constexpr auto kKernel = [] { if constexpr (kMode >= 4) return diag_grid_fwd2<kMode>; else return diag_grid_fwd<kMode>; }();
  constexpr int kMaxSmem = Shape::kSmemUnits * Shape::kMaxThreads * 16;
  cudaError_t err = kernel_attribute_once<kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem>();
  if (err != cudaSuccess) return err;
  const int ctas = int(plan.chunks);
  return launch<kKernel>(rows * ctas, plan.threads, size_t(Shape::kSmemUnits) * plan.threads * 16, kMode == 2 ? K : 1, 0,
                         x, y, dim, dim, ctas, Epi{}, detail::grid_workspace_view(wsp, rows, ctas), K);
}

}  // namespace

int main() {
  SoftmaxDeviceProps dev;
  CK(softmax_device_props(0, &dev));
  const int64_t N = int64_t(64) << 20;  // 256 MB of f32
  float *x, *y, *yref;
  CK(cudaMalloc(&x, N * 4)); CK(cudaMalloc(&y, N * 4)); CK(cudaMalloc(&yref, N * 4));
  CK(cudaMemcpy(x, repro::uniform_inputs(N).data(), N * 4, cudaMemcpyHostToDevice));
  void* ws; CK(cudaMalloc(&ws, 64 << 20));
  std::vector<float> hy(N), hr(N);
  const double limit = 2968.0;  // GB/s, the bar report's limit (session 34)
  for (int64_t dim : {int64_t(262144), int64_t(524288), int64_t(1048576)}) {
    const int64_t rows = N / dim;
    SoftmaxProblem p = softmax_forward_problem(x, y, rows, dim, 1, dim, dev);
    p.workspace = true;
    const SoftmaxPlan auto_plan = choose_softmax(p);
    const SoftmaxPlan grid = plan_softmax(SoftmaxVariant::kGrid, p);
    const size_t wsb = softmax_workspace_bytes(grid, rows);
    printf("== f32 [%lld, %lld]: auto %s\n   grid: %d CTAs x %d threads, workspace %zu\n", (long long)rows, (long long)dim,
           softmax_explain(p, auto_plan).c_str(), int(grid.chunks), grid.threads, wsb);
    auto run = [&](const char* name, auto fn, bool is_ref) {
      const float us = repro::median_us(fn, [&] { CK(cudaMemsetAsync(ws, 0, wsb)); });
      const double frac = 2.0 * N * 4 / (us * 1e3) / limit;
      const char* check = "";
      if (is_ref) { CK(cudaMemcpy(yref, y, N * 4, cudaMemcpyDeviceToDevice)); }
      else {
        CK(cudaMemcpy(hy.data(), y, N * 4, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(hr.data(), yref, N * 4, cudaMemcpyDeviceToHost));
        check = memcmp(hy.data(), hr.data(), N * 4) == 0 ? "bitwise = grid" : "DIFFERS";
      }
      printf("   %-28s %8.1f us  %.3f of %.0f  %s\n", name, us, frac, limit, check);
      CK(cudaMemset(y, 0xff, N * 4));
    };
    run("library grid", [&] { return softmax_forward<float, float, Epi>(x, y, rows, dim, 1, dim, grid, 0, ws); }, true);
    if (auto_plan.mode != SoftmaxMode::kGrid)
      run("library auto (cluster)", [&] { return softmax_forward<float, float, Epi>(x, y, rows, dim, 1, dim, auto_plan, 0, ws); }, false);
    run("diag 1 blockIdx", [&] { return launch_diag<1>(x, y, rows, dim, grid, ws, 1); }, false);
    run("diag 3 ticket+guess prefetch", [&] { return launch_diag<3>(x, y, rows, dim, grid, ws, 1); }, false);
    for (int K : {2, 4, 8, 16}) {
      if (grid.chunks % K) continue;
      char name[64];
      snprintf(name, sizeof name, "diag 2 cluster ticket K=%d", K);
      run(name, [&] { return launch_diag<2>(x, y, rows, dim, grid, ws, K); }, false);
    }
    run("diag 4 no finished tail", [&] { return launch_diag<4>(x, y, rows, dim, grid, ws, 1); }, false);
    for (int rep = 0; rep < 2; ++rep) {
      run("diag 0 library", [&] { return launch_diag<0>(x, y, rows, dim, grid, ws, 1); }, false);
      run("diag 5 no exchange (wrong)", [&] { return launch_diag<5>(x, y, rows, dim, grid, ws, 1); }, false);
      run("diag 7 slot polling", [&] { return launch_diag<7>(x, y, rows, dim, grid, ws, 1); }, false);
      run("diag 6 slot polling, sleep 100", [&] { return launch_diag<6>(x, y, rows, dim, grid, ws, 1); }, false);
      run("diag 8 counter, no sleep", [&] { return launch_diag<8>(x, y, rows, dim, grid, ws, 1); }, false);
    }
    run("library grid (again)", [&] { return softmax_forward<float, float, Epi>(x, y, rows, dim, 1, dim, grid, 0, ws); }, false);
  }
  printf("done\n");
  return 0;
}
