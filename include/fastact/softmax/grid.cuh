// Variant `grid`, and long_row's mode for rows longer than a cluster caches (or where there are no
// clusters): inner == 1, a row over `ctas` CTAs anywhere on the device (plan.chunks, at most one an
// SM: dispatch.h plan_grid), each caching its slice as long_row's clusters do; HBM is read once, in
// one launch.
//
// Work: (row, rank) = divmod(ticket, ctas), the ticket taken by each CTA as it starts (grid_sync.cuh:
// why a row's CTAs may then wait for each other). The slice of rank r is block.cuh's layout for
// cluster rank r. Forward: cached as long_row.cuh's shared-memory clusters cache it (registers, and
// shared memory in the 128-bit float-arithmetic forwards; not their 16-bit register part as loaded); backward: grad_output and output in
// registers as block.cuh's backward, and with 16-byte units more of both in shared memory. The row's
// partials meet in global memory (common.cuh: row_allreduce over GridExchange): each CTA stores its
// (max, sum) (backward: its sum of the backward term) in its slot and counts itself on the row's
// counter; each waits for all of them, folds them in rank order, and writes its part of the output
// from its cache.
//
// A CTA waits for its row at most kGridWaitNs (dispatch.h: other kernels may hold the SMs its row
// needs); one that gives up publishes its partial all the same, writes nothing, and lists its task;
// the launch's last CTA to finish computes the listed slices again, with the same arithmetic
// (grid_next): results are bitwise reproducible either way.
//
// Workspace (dispatch.h softmax_grid_workspace; zeroed by the caller): the ticket and two counts, a
// counter per row, a 16-byte slot per (row, rank), the list of tasks given up. One launch (at most
// kMaxGridBlocks CTAs).
#pragma once

#include <algorithm>

#include "fastact/copy_async.cuh"
#include "fastact/runtime_options.h"
#include "fastact/softmax/block.cuh"
#include "fastact/softmax/long_row.cuh"

namespace fastact::softmax_impl {

// The workspace as the kernels see it (dispatch.h softmax_grid_workspace), and the launch's constants.
struct GridWorkspaceView {
  unsigned long long* ticket;
  unsigned* finished;      // CTAs done
  unsigned* gave_up_count; // entries in gave_up
  unsigned* arrived;       // per row
  unsigned char* slots;    // per (row, rank)
  unsigned* gave_up;       // tasks whose CTA gave up waiting
  unsigned total;          // CTAs in the launch
  uint64_t wait_ns;        // how long a CTA waits for its row (dispatch.h kGridWaitNs)
};

// A CTA's task (shared memory): its ticket, whether its wait gave up, whether it finished last.
struct GridTask {
  unsigned long long task;
  int gave_up;
  int last;
};

// This CTA's row and its place among the row's CTAs, from the ticket (one block barrier).
FASTACT_DEVICE GridExchange grid_task(const GridWorkspaceView& ws, int ctas, GridTask& t, int64_t& row) {
  if (threadIdx.x == 0) {
    t.task = grid_ticket(ws.ticket);
    t.gave_up = 0;
  }
  __syncthreads();
  int64_t r, rank;
  divmod_nonneg(static_cast<int64_t>(t.task), ctas, r, rank);
  row = r;
  return GridExchange{ws.slots + 16 * r * ctas, ws.arrived + r, &t.gave_up, ws.wait_ns, ctas, static_cast<int>(rank),
                      0, 0u};
}

// After a slice: whether this CTA has another. After its own: a CTA that gave up lists its task, and
// every CTA counts itself finished; the launch's last one then takes the listed tasks one by one, with
// g.folded set (every CTA published its partial before it waited), and computes each slice again with
// the arithmetic its own CTA would have used: the outputs are bitwise the same. The kernels run the
// slice in a loop rather than keep a second copy of it, which made the common path slower (H100, rows
// of 2^20: bf16 forward 214 -> 233 us).
FASTACT_DEVICE bool grid_next(const GridWorkspaceView& ws, GridTask& t, int ctas, GridExchange& g, int64_t& row) {
  if (!g.folded) {
    if (threadIdx.x == 0) {
      unsigned done;
      if (t.gave_up) {  // release: the list entry, for the last CTA's acquire below
        ws.gave_up[atomicAdd(ws.gave_up_count, 1u)] = static_cast<unsigned>(t.task);
        done = fetch_add_acq_rel_gpu(ws.finished);
      } else {
        // Relaxed: a release here would first wait for this thread's output stores to be acknowledged.
        done = atomicAdd(ws.finished, 1u);
      }
      t.last = done == ws.total - 1;
    }
    __syncthreads();
    if (!t.last) return false;
    // Each thread: the list entries (released with the increments above, acquired through the RMW
    // chain on `finished`).
    (void)load_acquire_gpu(ws.finished);
    g.folded = 1;
  }
  if (g.next >= __ldcg(ws.gave_up_count)) return false;
  int64_t r, rank;
  divmod_nonneg(static_cast<int64_t>(__ldcg(ws.gave_up + g.next)), ctas, r, rank);
  ++g.next;
  row = r;
  g.rank = static_cast<int>(rank);
  g.slots = ws.slots + 16 * r * ctas;
  g.arrived = ws.arrived + r;
  return true;
}

// The forward's slice: as long_row's shared-memory clusters where those run (128-bit units, float
// arithmetic: ClusterSmemShape), else block.cuh's register cache (as A).
template <typename in_t, typename out_t, int kVec>
struct GridForwardShape {
  using Smem = ClusterSmemShape<in_t, out_t, kVec>;
  static constexpr bool kSmem = Smem::kSupported;
  static constexpr int kRegVecs = kSmem ? Smem::kRegVecs : block_fwd_elems<out_t, kVec>() / kVec;
  static constexpr int kSmemVecs = kSmem ? Smem::kSmemVecs : 0;
  static constexpr int kSmemUnits = kSmemVecs;  // 16-byte units of shared memory a thread
  static constexpr int kVecs = kRegVecs + kSmemVecs;
  static constexpr int kMaxThreads = kSmem ? kClusterSmemMaxThreads : kResidentMaxThreads;
  static constexpr int kMinBlocks = kSmem ? Smem::kMinBlocks : 1;
};

// One row's slice of rank `rank` (x: rows of D elements, row r at x + r * row_stride; y: [rows, D]
// dense), as softmax_cluster_smem_fwd_kernel's (long_row.cuh): kRegVecs units a thread in registers (as
// A), then kSmemVecs in the thread's own shared-memory slots (as loaded, copied first), none without
// shared memory; resident_forward over `group`.
template <typename in_t, typename out_t, typename Epi, int kVec>
FASTACT_DEVICE void grid_forward_slice(const in_t* __restrict__ x, out_t* __restrict__ y, int64_t dim,
                                       int64_t row_stride, int64_t row, int rank, const Epi& epi,
                                       RowScratch<MaxSum<acc_t<out_t>>>& scratch, const GridExchange& group) {
  using A = acc_t<out_t>;
  using Shape = GridForwardShape<in_t, out_t, kVec>;
  using Unit = AlignedVector<in_t, kVec>;
  constexpr int kRegVecs = Shape::kRegVecs;
  constexpr int kSmemVecs = Shape::kSmemVecs;
  const int nthreads = blockDim.x;
  Unit* const slot = reinterpret_cast<Unit*>(cluster_smem_bytes()) + threadIdx.x;  // unit j at slot[j * T]
  const ResidentSlice s = resident_slice_of_rank<kVec, Shape::kVecs>(dim, rank);
  const in_t* xr = x + row * row_stride + s.first;
  int round = 0;
#pragma unroll
  for (int j = 0; j < kSmemVecs; ++j) {
    if (kRegVecs + j < s.nvalid) copy_async_16(slot + j * nthreads, xr + (kRegVecs + j) * s.step);
  }
  copy_async_commit();
  A v[kRegVecs > 0 ? kRegVecs : 1][kVec];
#pragma unroll
  for (int j = 0; j < kRegVecs; ++j) {
    if (j < s.nvalid) to_acc(load_vector<in_t, kVec>(xr + j * s.step), v[j]);
  }
  const auto stores = forward_stores<in_t, out_t, kVec, Shape::kVecs, false>(dim);
  if constexpr (kSmemVecs > 0) {
    resident_forward<Epi, kVec, kRegVecs>(v, s, y + row * dim + s.first, epi, scratch, round, group,
                                          SharedUnits<Epi, in_t, kVec, kRegVecs, kSmemVecs>{{}, slot, nthreads},
                                          stores);
  } else {
    resident_forward<Epi, kVec, kRegVecs>(v, s, y + row * dim + s.first, epi, scratch, round, group, NoExtraUnits{},
                                          stores);
  }
}

template <typename in_t, typename out_t, typename Epi, int kVec>
__global__ __launch_bounds__(GridForwardShape<in_t, out_t, kVec>::kMaxThreads,
                             GridForwardShape<in_t, out_t, kVec>::kMinBlocks) void
softmax_grid_fwd_kernel(const in_t* __restrict__ x, out_t* __restrict__ y, int64_t dim, int64_t row_stride, int ctas,
                        Epi epi, GridWorkspaceView ws) {
  using A = acc_t<out_t>;
  __shared__ RowScratch<MaxSum<A>> scratch;
  __shared__ GridTask task;
  int64_t row;
  GridExchange group = grid_task(ws, ctas, task, row);
  do {
    grid_forward_slice<in_t, out_t, Epi, kVec>(x, y, dim, row_stride, row, group.rank, epi, scratch, group);
  } while (grid_next(ws, task, ctas, group, row));
}

// The backward's slice: block.cuh's register cache of grad_output and output, and with 16-byte units
// kSmemVecs more units of each in the thread's own shared-memory slots (dispatch.h kGridBwdSmemBytes).
template <typename out_t, int kVec>
struct GridBackwardShape {
  static constexpr int kRegVecs = block_bwd_elems<out_t, kVec>() / kVec;
  static constexpr int kSmemVecs = softmax_grid_bwd_smem_elems(kVec, sizeof(out_t)) / (kVec > 1 ? kVec : 1);
  static constexpr int kSmemUnits = 2 * kSmemVecs;  // 16-byte units of shared memory a thread: both arrays
  static constexpr int kVecs = kRegVecs + kSmemVecs;
  static constexpr int kMaxThreads = kSmemVecs > 0 ? kGridBwdSmemMaxThreads : kResidentMaxThreads;
  static constexpr int kMinBlocks = kSmemVecs > 0 ? 2 : 1;
};

// resident_backward's Extra for the backward's shared-memory units: units kFirst + j (j < kUnits) of
// the thread's slice, grad_output's at slot[j * T] and output's at slot[(kUnits + j) * T], as loaded
// (cp.async, waited for in add_terms: each thread reads only its own slots, no barrier). add_terms
// adds their backward terms; store writes their grad_input at dxr + (kFirst + j) * step.
template <typename out_t, typename in_t, int kVec, int kFirst, int kUnits>
struct SharedGrads {
  using Unit = AlignedVector<out_t, kVec>;
  const Unit* slot;
  in_t* dxr;
  int nthreads;
  int nvalid;
  int step;

  // f(unit index in the slice, grad_output's values, output's values) for each unit inside the row.
  template <typename A, typename F>
  FASTACT_DEVICE void for_each(F&& f) const {
#pragma unroll
    for (int j = 0; j < kUnits; ++j) {
      if (kFirst + j < nvalid) {
        A g[kVec], o[kVec];
        to_acc(slot[j * nthreads], g);
        to_acc(slot[(kUnits + j) * nthreads], o);
        f(kFirst + j, g, o);
      }
    }
  }
  template <typename Epi, typename A>
  FASTACT_DEVICE void add_terms(const Epi& epi, A& dot, LoadDependence& /*outputs*/) const {  // copies, not loads
    copy_async_wait<0>();
    for_each<A>([&](int, const A(&g)[kVec], const A(&o)[kVec]) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) dot += epi.backward_term(g[k], o[k]);
    });
  }
  template <typename Epi, typename A>
  FASTACT_DEVICE void store(const Epi& epi, A dot) const {
    for_each<A>([&](int j, const A(&g)[kVec], const A(&o)[kVec]) {
      A d[kVec];
#pragma unroll
      for (int k = 0; k < kVec; ++k) d[k] = epi.backward(g[k], o[k], dot);
      store_vector<in_t, kVec>(dxr + j * step, from_acc<in_t>(d));
    });
  }
};

// One row's slice of rank `rank` (grad_output, output: [rows, D] dense (out_t); grad_input: [rows, D]
// dense (in_t)): the copies into shared memory issued first, then the register loads (block.cuh's
// backward cache), then resident_backward over `group`.
template <typename in_t, typename out_t, typename Epi, int kVec>
FASTACT_DEVICE void grid_backward_slice(const out_t* __restrict__ grad_output, const out_t* __restrict__ output,
                                        in_t* __restrict__ grad_input, int64_t dim, int64_t row, int rank,
                                        const Epi& epi, RowScratch<acc_t<out_t>>& scratch, const GridExchange& group) {
  using A = acc_t<out_t>;
  using Shape = GridBackwardShape<out_t, kVec>;
  using Unit = AlignedVector<out_t, kVec>;
  constexpr int kRegVecs = Shape::kRegVecs;
  constexpr int kSmemVecs = Shape::kSmemVecs;
  const int nthreads = blockDim.x;
  Unit* const slot = reinterpret_cast<Unit*>(cluster_smem_bytes()) + threadIdx.x;
  const ResidentSlice s = resident_slice_of_rank<kVec, Shape::kVecs>(dim, rank);
  const int64_t offset = row * dim + s.first;
  int round = 0;
#pragma unroll
  for (int j = 0; j < kSmemVecs; ++j) {
    if (kRegVecs + j < s.nvalid) {
      copy_async_16(slot + j * nthreads, grad_output + offset + (kRegVecs + j) * s.step);
      copy_async_16(slot + (kSmemVecs + j) * nthreads, output + offset + (kRegVecs + j) * s.step);
    }
  }
  copy_async_commit();
  AlignedVector<out_t, kVec> dy[kRegVecs], yv[kRegVecs];
  load_backward_units<kVec>(grad_output + offset, output + offset, s, dy, yv);
  if constexpr (kSmemVecs > 0) {
    using Extra = SharedGrads<out_t, in_t, kVec, kRegVecs, kSmemVecs>;
    resident_backward<Epi, kVec, kRegVecs, A>(dy, yv, s, opaque_zero(dim), grad_input + offset, epi, scratch, round,
                                              group, Extra{slot, grad_input + offset, nthreads, s.nvalid, s.step});
  } else {
    resident_backward<Epi, kVec, kRegVecs, A>(dy, yv, s, opaque_zero(dim), grad_input + offset, epi, scratch, round,
                                              group);
  }
}

template <typename in_t, typename out_t, typename Epi, int kVec>
__global__ __launch_bounds__(GridBackwardShape<out_t, kVec>::kMaxThreads,
                             GridBackwardShape<out_t, kVec>::kMinBlocks) void
softmax_grid_bwd_kernel(const out_t* __restrict__ grad_output, const out_t* __restrict__ output,
                        in_t* __restrict__ grad_input, int64_t dim, int ctas, Epi epi, GridWorkspaceView ws) {
  using A = acc_t<out_t>;
  __shared__ RowScratch<A> scratch;
  __shared__ GridTask task;
  int64_t row;
  GridExchange group = grid_task(ws, ctas, task, row);
  do {
    grid_backward_slice<in_t, out_t, Epi, kVec>(grad_output, output, grad_input, dim, row, group.rank, epi, scratch,
                                                group);
  } while (grid_next(ws, task, ctas, group, row));
}

namespace detail {

// kGridWaitNs, or what the runtime options say.
inline uint64_t grid_wait_ns() { return uint64_t(std::max<int64_t>(runtime_options().grid_wait_ns, 0)); }

inline GridWorkspaceView grid_workspace_view(void* workspace, int64_t rows, int64_t ctas) {
  const SoftmaxGridWorkspace w = softmax_grid_workspace(rows, ctas);
  auto* base = static_cast<unsigned char*>(workspace);
  return {reinterpret_cast<unsigned long long*>(base),
          reinterpret_cast<unsigned*>(base + 8),
          reinterpret_cast<unsigned*>(base + 12),
          reinterpret_cast<unsigned*>(base + w.arrived),
          base + w.slots,
          reinterpret_cast<unsigned*>(base + w.gave_up),
          static_cast<unsigned>(rows * ctas),
          grid_wait_ns()};
}

// Whether the plan's CTAs (threads x elems_per_thread elements, `kVecs` units a thread) fit the
// kernel and cache the row; in-row offsets stay below 2^31.
inline bool grid_plan_fits(const SoftmaxPlan& plan, int64_t dim, int max_threads, int elems) {
  const int64_t per_row = plan.chunks * plan.threads * int64_t(elems);
  return plan.threads > 0 && plan.threads <= max_threads && plan.threads % kWarpSize == 0 && plan.chunks >= 1 &&
         plan.chunks <= (int64_t(1) << 20) && plan.elems_per_thread == elems && per_row >= dim &&
         per_row < (int64_t(1) << 31);
}

// Launches kKernel (Shape: its slice) over `rows` rows of plan.chunks CTAs, after checking the plan
// against the slice; the kernel's arguments are args..., then the CTAs per row, the epilogue and the
// workspace.
template <auto kKernel, typename Shape, int kVec, typename Epi, typename... Args>
cudaError_t launch_grid(int64_t rows, int64_t dim, const SoftmaxPlan& plan, void* workspace, cudaStream_t stream,
                        Args... args) {
  if (workspace == nullptr) return cudaErrorInvalidValue;
  const int ctas = static_cast<int>(plan.chunks);
  if (plan.edges || plan.raw || plan.smem_elems != Shape::kSmemVecs * kVec ||
      !grid_plan_fits(plan, dim, Shape::kMaxThreads, Shape::kVecs * kVec) || rows * ctas > kMaxGridBlocks)
    return cudaErrorInvalidConfiguration;
  if constexpr (Shape::kSmemUnits > 0) {
    constexpr int kMaxSmem = Shape::kSmemUnits * Shape::kMaxThreads * 16;
    const cudaError_t err = kernel_attribute_once<kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem>();
    if (err != cudaSuccess) return err;
  }
  return launch<kKernel>(rows * ctas, plan.threads, size_t(Shape::kSmemUnits) * plan.threads * 16, 1, stream,
                         args..., ctas, Epi{}, grid_workspace_view(workspace, rows, ctas));
}

template <typename in_t, typename out_t, typename Epi, int kVec>
cudaError_t grid_forward(const in_t* x, out_t* y, int64_t rows, int64_t dim, int64_t row_stride,
                         const SoftmaxPlan& plan, void* workspace, cudaStream_t stream) {
  return launch_grid<softmax_grid_fwd_kernel<in_t, out_t, Epi, kVec>, GridForwardShape<in_t, out_t, kVec>, kVec, Epi>(
      rows, dim, plan, workspace, stream, x, y, dim, row_stride);
}

template <typename in_t, typename out_t, typename Epi, int kVec>
cudaError_t grid_backward(const out_t* dy, const out_t* y, in_t* dx, int64_t rows, int64_t dim,
                          const SoftmaxPlan& plan, void* workspace, cudaStream_t stream) {
  return launch_grid<softmax_grid_bwd_kernel<in_t, out_t, Epi, kVec>, GridBackwardShape<out_t, kVec>, kVec, Epi>(
      rows, dim, plan, workspace, stream, dy, y, dx, dim);
}

}  // namespace detail
}  // namespace fastact::softmax_impl
