// The row-resident kernels behind variants `vec`, `scalar` (rows that fit one block) and `long_row`
// (cluster mode): a row of D elements (inner == 1) is cached in the registers of one CTA, or of the
// `cluster` CTAs of a thread-block cluster (sm_90), read from HBM once, reduced, and written.
//
// Layout: the row is cut into units of kVec elements (kVec = 128-bit width when aligned, else 1).
// CTA of cluster rank r caches units [r * T * kVecs, (r + 1) * T * kVecs), T = blockDim.x; thread t
// holds units  r * T * kVecs + j * T + t,  j < kVecs, so for each j the block reads T consecutive
// units (coalesced). Units at or beyond D / kVec are skipped (kVec divides D when kVec > 1): every
// loop is guarded by j < nvalid rather than padding with -inf / 0, which would cost registers. The
// host guarantees cluster * T * kVecs * kVec >= D (so in-row offsets fit in int).
//
// Forward: each thread's max, its kept values (exp(x - max) for softmax, x for log_softmax) and their
// sum -> one all-reduce of the (max, sum) pairs (block, then cluster) -> write, rescaled to the row's
// max. Backward: sum of the epilogue's backward term -> write. The all-reduce costs one block barrier
// (plus one cluster barrier in a cluster); a max and then a sum would cost two. One row per CTA or
// cluster; a cluster's CTAs signal "done reading the others' shared memory" (arrive) before their
// stores and wait for the others only at exit, so that barrier overlaps the stores.
#pragma once

#include "fastact/softmax/common.cuh"

namespace fastact::softmax_impl {

template <typename out_t, int kVec>
constexpr int block_fwd_elems() {
  return softmax_resident_elems(false, kVec, sizeof(out_t), sizeof(acc_t<out_t>));
}
template <typename out_t, int kVec>
constexpr int block_bwd_elems() {
  return softmax_resident_elems(true, kVec, sizeof(out_t), sizeof(acc_t<out_t>));
}

// How many of a thread's accesses first + j * step (elements, j < kVecs) start inside a row of D.
// 32-bit arithmetic: the host caps a cached row at 16 x 1024 x 32 elements.
template <int kVecs>
FASTACT_DEVICE int resident_valid(int first, int64_t dim, int step) {
  const int d = static_cast<int>(dim);
  if (first >= d) return 0;
  const int n = (d - first + step - 1) / step;
  return n < kVecs ? n : kVecs;
}

// x: rows of D elements, row r at x + r * row_stride; y: [rows, D] dense. Row first_row +
// blockIdx.x / cluster.
template <typename in_t, typename out_t, typename Epi, int kVec>
__global__ __launch_bounds__(kResidentMaxThreads, 1) void softmax_block_fwd_kernel(const in_t* __restrict__ x,
                                                                                   out_t* __restrict__ y, int64_t dim,
                                                                                   int64_t row_stride, int cluster,
                                                                                   Epi epi, int64_t first_row) {
  using A = acc_t<out_t>;
  using Cache = ForwardCache<Epi>;
  constexpr int kElems = block_fwd_elems<out_t, kVec>();
  constexpr int kVecs = kElems / kVec;
  static_assert(kVecs >= 1 && kElems % kVec == 0, "whole accesses per thread");
  __shared__ RowScratch<MaxSum<A>> scratch;
  const int nthreads = blockDim.x;
  const int rank = static_cast<int>(blockIdx.x % static_cast<unsigned>(cluster));  // == cluster rank
  const int64_t row = first_row + blockIdx.x / cluster;
  // This thread's accesses: units first + j * T (j < kVecs), of which j < nvalid are inside the row.
  // Offsets within a row fit in int: the host caps D at 16 x 1024 x 32.
  const int first = (rank * nthreads * kVecs + static_cast<int>(threadIdx.x)) * kVec;
  const int step = nthreads * kVec;
  const int nvalid = resident_valid<kVecs>(first, dim, step);
  const in_t* xr = x + row * row_stride + first;
  int round = 0;

  A v[kVecs][kVec];
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < nvalid) to_acc(load_vector<in_t, kVec>(xr + j * step), v[j]);
  }
  // One all-reduce: this thread's (max, sum of exp(x - max)) pair, combined over the row (OnlineOp);
  // the kept values are rescaled on output (ForwardCache::factor).
  A m = neg_inf<A>();
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < nvalid) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) m = MaxOp<A>()(m, v[j][k]);
    }
  }
  const A base = max_base(m);
  A s = A(0);
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < nvalid) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        v[j][k] = Cache::keep(v[j][k], base);
        s += Cache::term(v[j][k], base);
      }
    }
  }
  const MaxSum<A> row_stats = row_allreduce(MaxSum<A>{m, s}, OnlineOp<A>(), scratch, round, cluster);
  if (cluster > 1) cluster_arrive();  // done reading the other CTAs' shared memory
  const A f = Cache::factor(m, row_stats.max, epi.row_constant(row_stats.sum));
  out_t* yr = y + row * dim + first;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < nvalid) {
      A o[kVec];
#pragma unroll
      for (int k = 0; k < kVec; ++k) o[k] = Cache::out(epi, v[j][k], row_stats.max, f);
      store_vector<out_t, kVec>(yr + j * step, from_acc<out_t>(o));
    }
  }
  // A CTA's shared memory must outlive the other CTAs' reads of it.
  if (cluster > 1) cluster_wait();
}

// grad_output, output: [rows, D] dense (out_t); grad_input: [rows, D] dense (in_t). Caches
// grad_output and output as loaded (raw element type) and converts on use.
template <typename in_t, typename out_t, typename Epi, int kVec>
__global__ __launch_bounds__(kResidentMaxThreads, 1) void softmax_block_bwd_kernel(
    const out_t* __restrict__ grad_output, const out_t* __restrict__ output, in_t* __restrict__ grad_input,
    int64_t dim, int cluster, Epi epi, int64_t first_row) {
  using A = acc_t<out_t>;
  constexpr int kElems = block_bwd_elems<out_t, kVec>();
  constexpr int kVecs = kElems / kVec;
  static_assert(kVecs >= 1 && kElems % kVec == 0, "whole accesses per thread");
  __shared__ RowScratch<A> scratch;
  const int nthreads = blockDim.x;
  const int rank = static_cast<int>(blockIdx.x % static_cast<unsigned>(cluster));
  const int64_t row = first_row + blockIdx.x / cluster;
  const int first = (rank * nthreads * kVecs + static_cast<int>(threadIdx.x)) * kVec;
  const int step = nthreads * kVec;
  const int nvalid = resident_valid<kVecs>(first, dim, step);
  const int64_t offset = row * dim + first;
  int round = 0;

  AlignedVector<out_t, kVec> dy[kVecs], yv[kVecs];
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < nvalid) {
      dy[j] = load_vector<out_t, kVec>(grad_output + offset + j * step);
      yv[j] = load_vector<out_t, kVec>(output + offset + j * step);
    }
  }
  A dot = A(0);
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < nvalid) {
      A g[kVec], o[kVec];
      to_acc(dy[j], g);
      to_acc(yv[j], o);
#pragma unroll
      for (int k = 0; k < kVec; ++k) dot += epi.backward_term(g[k], o[k]);
    }
  }
  dot = row_allreduce(dot, SumOp<A>(), scratch, round, cluster);
  if (cluster > 1) cluster_arrive();  // done reading the other CTAs' shared memory
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < nvalid) {
      A g[kVec], o[kVec];
      to_acc(dy[j], g);
      to_acc(yv[j], o);
#pragma unroll
      for (int k = 0; k < kVec; ++k) g[k] = epi.backward(g[k], o[k], dot);
      store_vector<in_t, kVec>(grad_input + offset + j * step, from_acc<in_t>(g));
    }
  }
  if (cluster > 1) cluster_wait();  // the other CTAs are done reading this one's shared memory
}

namespace detail {

// One row per CTA (cluster == 1) or per cluster; `threads` and `cluster` from the plan.
template <typename in_t, typename out_t, typename Epi, int kVec>
cudaError_t block_forward(const in_t* x, out_t* y, int64_t rows, int64_t dim, int64_t row_stride, int threads,
                          int cluster, cudaStream_t stream) {
  if (threads <= 0 || threads > kResidentMaxThreads || threads % kWarpSize != 0 || cluster < 1 ||
      cluster > kMaxCluster || int64_t(cluster) * threads * block_fwd_elems<out_t, kVec>() < dim)
    return cudaErrorInvalidConfiguration;
  return launch_items<softmax_block_fwd_kernel<in_t, out_t, Epi, kVec>>(rows, threads, 0, cluster, stream, x, y, dim,
                                                                        row_stride, cluster, Epi{});
}

template <typename in_t, typename out_t, typename Epi, int kVec>
cudaError_t block_backward(const out_t* dy, const out_t* y, in_t* dx, int64_t rows, int64_t dim, int threads,
                           int cluster, cudaStream_t stream) {
  if (threads <= 0 || threads > kResidentMaxThreads || threads % kWarpSize != 0 || cluster < 1 ||
      cluster > kMaxCluster || int64_t(cluster) * threads * block_bwd_elems<out_t, kVec>() < dim)
    return cudaErrorInvalidConfiguration;
  return launch_items<softmax_block_bwd_kernel<in_t, out_t, Epi, kVec>>(rows, threads, 0, cluster, stream, dy, y, dx,
                                                                        dim, cluster, Epi{});
}

}  // namespace detail
}  // namespace fastact::softmax_impl
