// Variant `split` (also `long_row` beyond what a cluster caches, and `scalar` beyond what a block
// caches): rows of any length, inner == 1, read twice and written once: an online (max, sum) pass,
// then the write pass. Never three passes.
//
// A row is cut into `chunks` chunks of whole units (kVec elements each; kVec = 128-bit width when
// aligned, else 1): chunk c is units [c * U / chunks, (c + 1) * U / chunks), U = D / kVec, so chunk
// lengths differ by at most one unit.
//   chunks == 1 (kSplitBoth): one kernel, a CTA per row: stats, block all-reduce, write.
//   chunks  > 1: two kernels, a CTA per (row, chunk):
//     kSplitStats: the chunk's partial (max, sum) (backward: its partial sum of the backward term) is
//                  parked in the OUTPUT's own memory: 16-byte aligned inside the output bytes of every chunk
//                  of the row, at slot c ("slot area" of a chunk: K partials). No workspace allocation.
//     kSplitApply: a CTA first reads the K partials from the slot area of its own chunk, combines them
//                  (same fixed order in every CTA, so all chunks of a row use bitwise the same statistics),
//                  waits for the whole block (the slot area is about to be overwritten), then writes the
//                  chunk. Only this CTA touches its chunk's bytes in kSplitApply, so nothing races.
//   The host runs (kSplitStats, kSplitApply) over groups of rows whose input fits in a third of L2, so the
//   second read of the input comes from L2.
// The output must not alias the input (the kernels' outputs are always fresh tensors). The host
// guarantees each chunk's output bytes hold 16 + 16 * chunks bytes (softmax_detail::plan_split).
#pragma once

#include "fastact/softmax/common.cuh"

namespace fastact::softmax_impl {

enum SplitPhase : int { kSplitBoth = 0, kSplitStats = 1, kSplitApply = 2 };

// The slot area of the chunk whose output starts at `chunk_out`: its first 16-byte aligned address.
template <typename T>
FASTACT_DEVICE unsigned char* split_slots(T* chunk_out) {
  const auto addr = reinterpret_cast<std::uintptr_t>(chunk_out);
  return reinterpret_cast<unsigned char*>((addr + 15) & ~std::uintptr_t(15));
}

FASTACT_HOST_DEVICE int64_t split_unit_begin(int64_t chunk, int64_t units, int64_t chunks) {
  return chunk * units / chunks;
}

// One CTA's pass over units [u0, u1) of a row, kU accesses in flight per thread: the online
// (max, sum) of the input (forward) ...
template <typename A, typename in_t, int kVec>
FASTACT_DEVICE MaxSum<A> split_stats(const in_t* __restrict__ xr, int64_t u0, int64_t u1) {
  constexpr int kU = kSplitUnroll;
  const int nthreads = blockDim.x;
  MaxSum<A> st = OnlineOp<A>::identity();
  for (int64_t u = u0 + threadIdx.x; u < u1; u += int64_t(nthreads) * kU) {
    // Loads first, then conversions: converted as loaded, 16-bit inputs went out one load at a time (SASS).
    AlignedVector<in_t, kVec> in[kU];
#pragma unroll
    for (int q = 0; q < kU; ++q) {
      const int64_t uu = u + int64_t(q) * nthreads;
      if (uu < u1) in[q] = load_vector<in_t, kVec>(xr + uu * kVec);
    }
    A v[kU][kVec];
#pragma unroll
    for (int q = 0; q < kU; ++q) {
      if (u + int64_t(q) * nthreads < u1) {
        to_acc(in[q], v[q]);
      } else {
#pragma unroll
        for (int k = 0; k < kVec; ++k) v[q][k] = neg_inf<A>();
      }
    }
    online_update(st, v);
  }
  return st;
}

// ... and the write pass with the row's (max, constant).
template <typename A, typename in_t, typename out_t, typename Epi, int kVec>
FASTACT_DEVICE void split_apply(const in_t* __restrict__ xr, out_t* yr, int64_t u0, int64_t u1, A m, A c,
                                const Epi& epi) {
  constexpr int kU = kSplitUnroll;
  const int nthreads = blockDim.x;
  for (int64_t u = u0 + threadIdx.x; u < u1; u += int64_t(nthreads) * kU) {
    AlignedVector<in_t, kVec> in[kU];
#pragma unroll
    for (int q = 0; q < kU; ++q) {
      const int64_t uu = u + int64_t(q) * nthreads;
      if (uu < u1) in[q] = load_vector<in_t, kVec>(xr + uu * kVec);
    }
#pragma unroll
    for (int q = 0; q < kU; ++q) {
      const int64_t uu = u + int64_t(q) * nthreads;
      if (uu < u1) {
        A o[kVec];
        to_acc(in[q], o);
#pragma unroll
        for (int k = 0; k < kVec; ++k) o[k] = epi.forward(o[k], m, c);
        store_vector<out_t, kVec>(yr + uu * kVec, from_acc<out_t>(o));
      }
    }
  }
}

// Backward: the sum of the epilogue's backward term over units [u0, u1) (y is read only if the
// term uses it: not for log_softmax) ...
template <typename A, typename out_t, typename Epi, int kVec>
FASTACT_DEVICE A split_dot(const out_t* __restrict__ dyr, const out_t* __restrict__ yr, int64_t u0, int64_t u1,
                           const Epi& epi) {
  constexpr int kU = kSplitUnroll;
  const int nthreads = blockDim.x;
  A dot = A(0);
  for (int64_t u = u0 + threadIdx.x; u < u1; u += int64_t(nthreads) * kU) {
    AlignedVector<out_t, kVec> dy[kU], yv[kU];
#pragma unroll
    for (int q = 0; q < kU; ++q) {
      const int64_t uu = u + int64_t(q) * nthreads;
      if (uu < u1) {
        dy[q] = load_vector<out_t, kVec>(dyr + uu * kVec);
        if constexpr (Epi::kTermUsesOutput) yv[q] = load_vector<out_t, kVec>(yr + uu * kVec);
      }
    }
#pragma unroll
    for (int q = 0; q < kU; ++q) {
      if (u + int64_t(q) * nthreads < u1) {
        A g[kVec], o[kVec];
        to_acc(dy[q], g);
        to_acc(yv[q], o);
#pragma unroll
        for (int k = 0; k < kVec; ++k) dot += epi.backward_term(g[k], o[k]);
      }
    }
  }
  return dot;
}

// ... and its write pass.
template <typename A, typename in_t, typename out_t, typename Epi, int kVec>
FASTACT_DEVICE void split_apply_bwd(const out_t* __restrict__ dyr, const out_t* __restrict__ yr, in_t* dxr,
                                    int64_t u0, int64_t u1, A dot, const Epi& epi) {
  constexpr int kU = kSplitUnroll;
  const int nthreads = blockDim.x;
  for (int64_t u = u0 + threadIdx.x; u < u1; u += int64_t(nthreads) * kU) {
    AlignedVector<out_t, kVec> dy[kU], yv[kU];
#pragma unroll
    for (int q = 0; q < kU; ++q) {
      const int64_t uu = u + int64_t(q) * nthreads;
      if (uu < u1) {
        dy[q] = load_vector<out_t, kVec>(dyr + uu * kVec);
        yv[q] = load_vector<out_t, kVec>(yr + uu * kVec);
      }
    }
#pragma unroll
    for (int q = 0; q < kU; ++q) {
      const int64_t uu = u + int64_t(q) * nthreads;
      if (uu < u1) {
        A g[kVec], o[kVec];
        to_acc(dy[q], g);
        to_acc(yv[q], o);
#pragma unroll
        for (int k = 0; k < kVec; ++k) g[k] = epi.backward(g[k], o[k], dot);
        store_vector<in_t, kVec>(dxr + uu * kVec, from_acc<in_t>(g));
      }
    }
  }
}

// x: rows of D elements, row r at x + r * row_stride; y: [rows, D] dense (also the parking space).
// One (row, chunk) task per CTA: task = first_task + blockIdx.x, row = task / chunks.
template <typename in_t, typename out_t, typename Epi, int kVec, int kPhase>
__global__ __launch_bounds__(kSplitThreads) void softmax_split_fwd_kernel(const in_t* __restrict__ x, out_t* y,
                                                                          int64_t dim, int64_t row_stride,
                                                                          int64_t chunks, Epi epi,
                                                                          int64_t first_task) {
  using A = acc_t<out_t>;
  using P = MaxSum<A>;
  __shared__ RowScratch<P> scratch;
  int round = 0;
  int64_t row, c;
  divmod_nonneg(first_task + blockIdx.x, chunks, row, c);
  const int64_t units = dim / kVec;
  const int64_t u0 = split_unit_begin(c, units, chunks);
  const int64_t u1 = split_unit_begin(c + 1, units, chunks);
  const in_t* xr = x + row * row_stride;
  out_t* yr = y + row * dim;
  if constexpr (kPhase == kSplitStats) {
    const P st = row_allreduce(split_stats<A, in_t, kVec>(xr, u0, u1), OnlineOp<A>(), scratch, round, 1);
    for (int64_t cc = threadIdx.x; cc < chunks; cc += blockDim.x)
      reinterpret_cast<P*>(split_slots(yr + split_unit_begin(cc, units, chunks) * kVec))[c] = st;
  } else {
    P st;
    if constexpr (kPhase == kSplitBoth) {
      st = row_allreduce(split_stats<A, in_t, kVec>(xr, u0, u1), OnlineOp<A>(), scratch, round, 1);
    } else {
      const P* slots = reinterpret_cast<const P*>(split_slots(yr + u0 * kVec));
      P p = OnlineOp<A>::identity();
      for (int64_t q = threadIdx.x % kWarpSize; q < chunks; q += kWarpSize) p = OnlineOp<A>()(p, slots[q]);
      st = warp_reduce(p, OnlineOp<A>());
      __syncthreads();  // every thread has the partials before any thread overwrites the slot area
    }
    split_apply<A, in_t, out_t, Epi, kVec>(xr, yr, u0, u1, st.max, epi.row_constant(st.sum), epi);
  }
}

// grad_output, output: [rows, D] dense; grad_input: [rows, D] dense (also the parking space).
template <typename in_t, typename out_t, typename Epi, int kVec, int kPhase>
__global__ __launch_bounds__(kSplitThreads) void softmax_split_bwd_kernel(const out_t* __restrict__ grad_output,
                                                                          const out_t* __restrict__ output,
                                                                          in_t* grad_input, int64_t dim,
                                                                          int64_t chunks, Epi epi,
                                                                          int64_t first_task) {
  using A = acc_t<out_t>;
  __shared__ RowScratch<A> scratch;
  int round = 0;
  int64_t row, c;
  divmod_nonneg(first_task + blockIdx.x, chunks, row, c);
  const int64_t units = dim / kVec;
  const int64_t u0 = split_unit_begin(c, units, chunks);
  const int64_t u1 = split_unit_begin(c + 1, units, chunks);
  const out_t* dyr = grad_output + row * dim;
  const out_t* yr = output + row * dim;
  in_t* dxr = grad_input + row * dim;
  if constexpr (kPhase == kSplitStats) {
    const A dot = row_allreduce(split_dot<A, out_t, Epi, kVec>(dyr, yr, u0, u1, epi), SumOp<A>(), scratch, round, 1);
    for (int64_t cc = threadIdx.x; cc < chunks; cc += blockDim.x)
      reinterpret_cast<A*>(split_slots(dxr + split_unit_begin(cc, units, chunks) * kVec))[c] = dot;
  } else {
    A dot;
    if constexpr (kPhase == kSplitBoth) {
      dot = row_allreduce(split_dot<A, out_t, Epi, kVec>(dyr, yr, u0, u1, epi), SumOp<A>(), scratch, round, 1);
    } else {
      const A* slots = reinterpret_cast<const A*>(split_slots(dxr + u0 * kVec));
      A p = A(0);
      for (int64_t q = threadIdx.x % kWarpSize; q < chunks; q += kWarpSize) p += slots[q];
      dot = warp_reduce(p, SumOp<A>());
      __syncthreads();  // every thread has the partials before any thread overwrites the slot area
    }
    split_apply_bwd<A, in_t, out_t, Epi, kVec>(dyr, yr, dxr, u0, u1, dot, epi);
  }
}

namespace detail {

// The parking scheme's precondition: every chunk's output bytes hold the alignment slack and K slots.
inline bool split_fits(int64_t dim, int vec, int64_t chunks, int dst_bytes) {
  if (chunks <= 1) return true;
  const int64_t min_units = (dim / vec) / chunks;
  return min_units * vec * dst_bytes >= int64_t(kSplitSlotBytes) * (chunks + 1);
}

template <typename in_t, typename out_t, typename Epi, int kVec>
cudaError_t split_forward(const in_t* x, out_t* y, int64_t rows, int64_t dim, int64_t row_stride, int64_t chunks,
                          int64_t group_rows, cudaStream_t stream) {
  static_assert(sizeof(MaxSum<acc_t<out_t>>) <= kSplitSlotBytes, "a partial fits its slot");
  if (chunks <= 1) {
    return launch_items<softmax_split_fwd_kernel<in_t, out_t, Epi, kVec, kSplitBoth>>(
        rows, kSplitThreads, 0, 1, stream, x, y, dim, row_stride, int64_t(1), Epi{});
  }
  if (!split_fits(dim, kVec, chunks, sizeof(out_t)) || group_rows < 1) return cudaErrorInvalidConfiguration;
  for (int64_t r0 = 0; r0 < rows; r0 += group_rows) {
    const int64_t n = rows - r0 < group_rows ? rows - r0 : group_rows;
    const in_t* xg = x + r0 * row_stride;
    out_t* yg = y + r0 * dim;
    cudaError_t err = launch_items<softmax_split_fwd_kernel<in_t, out_t, Epi, kVec, kSplitStats>>(
        n * chunks, kSplitThreads, 0, 1, stream, xg, yg, dim, row_stride, chunks, Epi{});
    if (err != cudaSuccess) return err;
    err = launch_items<softmax_split_fwd_kernel<in_t, out_t, Epi, kVec, kSplitApply>>(
        n * chunks, kSplitThreads, 0, 1, stream, xg, yg, dim, row_stride, chunks, Epi{});
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

template <typename in_t, typename out_t, typename Epi, int kVec>
cudaError_t split_backward(const out_t* dy, const out_t* y, in_t* dx, int64_t rows, int64_t dim, int64_t chunks,
                           int64_t group_rows, cudaStream_t stream) {
  static_assert(sizeof(acc_t<out_t>) <= kSplitSlotBytes, "a partial fits its slot");
  if (chunks <= 1) {
    return launch_items<softmax_split_bwd_kernel<in_t, out_t, Epi, kVec, kSplitBoth>>(
        rows, kSplitThreads, 0, 1, stream, dy, y, dx, dim, int64_t(1), Epi{});
  }
  if (!split_fits(dim, kVec, chunks, sizeof(in_t)) || group_rows < 1) return cudaErrorInvalidConfiguration;
  for (int64_t r0 = 0; r0 < rows; r0 += group_rows) {
    const int64_t n = rows - r0 < group_rows ? rows - r0 : group_rows;
    const int64_t off = r0 * dim;
    cudaError_t err = launch_items<softmax_split_bwd_kernel<in_t, out_t, Epi, kVec, kSplitStats>>(
        n * chunks, kSplitThreads, 0, 1, stream, dy + off, y + off, dx + off, dim, chunks, Epi{});
    if (err != cudaSuccess) return err;
    err = launch_items<softmax_split_bwd_kernel<in_t, out_t, Epi, kVec, kSplitApply>>(
        n * chunks, kSplitThreads, 0, 1, stream, dy + off, y + off, dx + off, dim, chunks, Epi{});
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace detail
}  // namespace fastact::softmax_impl
