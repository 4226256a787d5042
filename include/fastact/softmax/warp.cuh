// Variant `warp`: rows of up to 1024 elements (512 for float64), inner == 1.
//
// A row is padded to 2^kLog2 elements and split over kTpr lanes of a warp (a power of two <= 32), so
// a warp takes 32 / kTpr rows at once. Each lane holds kElems = 2^kLog2 / kTpr elements in registers,
// as kVecs accesses of kVec elements (kVec = 128-bit width when aligned, else 1):
//   element e of the row, with lane-in-row l and access j:  e = (j * kTpr + l) * kVec + k,
// so for each j the kTpr lanes of a row touch consecutive accesses (coalesced). A lane's first nvalid
// accesses lie inside the row (kVec divides D when kVec > 1); each phase (load, max, sum, stores;
// backward: load, dot, stores) skips the others. Reductions are xor shuffles within the row's lanes;
// no shared memory, no barriers. Blocks of 4 warps (2 for the 16-bit forward of rows of 1024 on a
// deep-memory device: dispatch.h row warp-small-blocks), one block of rows each. On a deep-memory device the
// forward of rows whose 128-bit units are not a power of two (D = 96: 24 units of floats) is packed
// (kPacked, dispatch.h row warp-packed): four accesses a lane, so a row spans fewer lanes and a warp
// takes several whole rows, not one with a quarter of its lanes idle. The forward of 16-bit rows whose
// lanes read several vectors (rows of 512 and 1024, and packed rows) keeps them as loaded
// (softmax_warp_raw), the others converted to the accumulation type.
//
// Lanes of many accesses (WarpShape::kFill: 16 or more, element rows of 2^9 and 2^10) fill the
// accesses past the row instead, with values that change nothing: -inf in the forward (the max keeps;
// exp(-inf - m) = 0), 0 in the backward (a term of 0); then the max and the backward's dot run over
// every slot, and the forward's sum and the stores test a fresh_copy of nvalid. Why: with one nvalid
// for every phase, ptxas computed a lane's 16-32 predicates once and kept them alive from the loads to
// the stores by saving them to registers (P2R): the bf16 log forward at 2^10 took 95 registers (five
// blocks an SM), and those rows (16-bit D % 8 != 0, float odd D) ran behind torch. H100, 256 MB: bf16
// log forward D = 577 386.7 -> 216.9 us (torch 281.1), log backward 419.1 -> 284.8 (torch 374.0).
// Lanes of fewer accesses keep every phase guarded: their few predicates stay in predicate registers,
// and the fill made them slower (64 MB: f16 log backward D = 33 78.5 -> 99.6 us, softmax backward bf16
// D = 10 9.3 -> 12.4 at 8 MB; 128-bit rows unchanged either way).
#pragma once

#include <type_traits>

#include "fastact/softmax/common.cuh"

namespace fastact::softmax_impl {

// kBackward, kOutBytes: the direction and the output element (backward: grad_output and output), for
// softmax_shapes.h softmax_warp_elems_per_thread; kPacked: the forward's packed plan (dispatch.h row warp-packed).
// kThreads: the block (kWarpBlockThreads; the forward's kWarpSmallBlockThreads, dispatch.h row warp-small-blocks).
template <int kLog2, int kVec, bool kBackward, int kOutBytes, bool kPacked = false, int kThreads = kWarpBlockThreads>
struct WarpShape {
  static_assert(!kPacked || (!kBackward && softmax_warp_packable(kLog2, kVec)), "packed: forward, packable rows");
  static_assert(kThreads == kWarpBlockThreads || (!kBackward && kThreads == kWarpSmallBlockThreads),
                "small blocks: the forward's");
  static constexpr int kElems = softmax_warp_elems_per_thread(kLog2, kVec, kBackward, kOutBytes, kPacked);  // per lane
  static constexpr int kTpr = (1 << kLog2) / kElems;                          // lanes per row
  static constexpr int kVecs = kElems / kVec;                                 // accesses per lane
  static constexpr int kRowsPerBlock = kThreads / kTpr;
  static_assert(kTpr >= 1 && kTpr <= kWarpSize && (kTpr & (kTpr - 1)) == 0, "lanes per row: power of two <= 32");
  static_assert(kElems % kVec == 0 && kVecs >= 1, "a lane holds whole accesses");
  // The forward's loads: cached in L2 only (load_vector_l2) where a lane reads several vectors, plain
  // where it reads one. Why (H100, 256 MB): rows of 1024 with .cg: float 185.5 -> 182.4 us, bf16
  // 184.2 -> 182.5; rows of 128, bf16, one access a lane: 184.4 with .cg, 182.9 plain (float unchanged
  // either way).
  static constexpr bool kLoadL2 = kVecs > 1;
  // Accesses past the row filled, the later phases' guards from fresh copies (see the top of the file).
  static constexpr bool kFill = kVecs >= 16;
  // The forward keeps 16-bit rows as loaded (softmax_shapes.h softmax_warp_raw).
  template <typename in_t, typename A>
  static constexpr bool kRaw = softmax_warp_raw(kVecs, kVec, sizeof(in_t), sizeof(A));
};

// How many of a lane's accesses (j * kTpr + lane) * kVec, j < kVecs, start inside a row of `dim`.
template <int kVecs, int kTpr, int kVec>
FASTACT_DEVICE int warp_valid(int lane_in_row, int dim) {
  const int units = dim / kVec;
  if (lane_in_row >= units) return 0;
  const int n = (units - lane_in_row + kTpr - 1) / kTpr;
  return n < kVecs ? n : kVecs;
}

// v, through a shuffle of a lane with itself: a value that ptxas cannot prove equal to v, so that
// compares against it are computed anew rather than merged with earlier compares against v (and
// those kept alive in registers in between). Every lane of the warp must call it.
FASTACT_DEVICE int fresh_copy(int v) { return __shfl_sync(0xffffffffu, v, static_cast<int>(threadIdx.x % kWarpSize)); }

// The count a later phase guards its accesses with: a fresh copy of nvalid where slots are filled, else nvalid.
template <bool kFill>
FASTACT_DEVICE int phase_count(int nvalid) {
  if constexpr (kFill) {
    return fresh_copy(nvalid);
  } else {
    return nvalid;
  }
}

// A lane's slice of a row in the forward: kVecs accesses of kVec elements, of which the first nvalid
// hold data. Two ways to keep it, with the same interface, so that one kernel body runs either:
//   load<kL2>(p, step, nvalid)  accesses j < nvalid from p + j * step (kL2: load_vector_l2), the
//                               others -inf where kFill
//   lane_max(n)                 the max of the lane's values: every slot where kFill, else j < n
//   keep_and_sum(m, n)          the sum of the terms exp(x - m) of accesses j < n (m the row's max)
//   out(epi, j, m, c, o)        access j's outputs, c = epi.row_constant(row sum)
// WarpConvertedRow holds the values as A, ForwardCache<Epi>'s kept values after keep_and_sum (for
// softmax exp(x - m): one exp an element). WarpRawRow holds them as loaded (half the registers for
// 16-bit inputs; softmax_warp_raw) and converts at each use: the max by packed compares
// (ElementMax), the exps twice, for the sum and for the outputs (KeepInput<Epi>).
template <typename in_t, typename A, typename Epi, int kVec, int kVecs, bool kFill>
struct WarpConvertedRow {
  using Cache = ForwardCache<Epi>;
  A v[kVecs][kVec];

  template <bool kL2>
  FASTACT_DEVICE void load(const in_t* p, int step, int nvalid) {
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (j < nvalid) {
        to_acc(kL2 ? load_vector_l2<in_t, kVec>(p + j * step) : load_vector<in_t, kVec>(p + j * step), v[j]);
      } else if constexpr (kFill) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) v[j][k] = neg_inf<A>();
      }
    }
  }
  FASTACT_DEVICE A lane_max(int n) const {
    A m = neg_inf<A>();
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (kFill || j < n) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) m = MaxOp<A>()(m, v[j][k]);
      }
    }
    return m;
  }
  FASTACT_DEVICE A keep_and_sum(A m, int n) {
    A s = A(0);
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (j < n) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          v[j][k] = Cache::keep(v[j][k], m);
          s += Cache::term(v[j][k], m);
        }
      }
    }
    return s;
  }
  FASTACT_DEVICE void out(const Epi& epi, int j, A m, A c, A (&o)[kVec]) const {
#pragma unroll
    for (int k = 0; k < kVec; ++k) o[k] = Cache::out(epi, v[j][k], m, c);
  }
};

template <typename in_t, typename A, typename Epi, int kVec, int kVecs, bool kFill>
struct WarpRawRow {
  using Raw = KeepInput<Epi>;
  AlignedVector<in_t, kVec> r[kVecs];

  template <bool kL2>
  FASTACT_DEVICE void load(const in_t* p, int step, int nvalid) {
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (j < nvalid) {
        r[j] = kL2 ? load_vector_l2<in_t, kVec>(p + j * step) : load_vector<in_t, kVec>(p + j * step);
      } else if constexpr (kFill) {
        A fill[kVec];
#pragma unroll
        for (int k = 0; k < kVec; ++k) fill[k] = neg_inf<A>();
        r[j] = from_acc<in_t>(fill);
      }
    }
  }
  FASTACT_DEVICE A lane_max(int n) const {
    A mv[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) mv[k] = neg_inf<A>();
    ElementMax<in_t>::into(r, kFill ? kVecs : n, mv);
    A m = mv[0];
#pragma unroll
    for (int k = 1; k < kVec; ++k) m = MaxOp<A>()(m, mv[k]);
    return m;
  }
  FASTACT_DEVICE A keep_and_sum(A m, int n) const {
    const A base = max_base(m);
    A s = A(0);
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (j < n) {
        A w[kVec];
        to_acc(r[j], w);
#pragma unroll
        for (int k = 0; k < kVec; ++k) s += Raw::term(w[k], base);
      }
    }
    return s;
  }
  FASTACT_DEVICE void out(const Epi& epi, int j, A m, A c, A (&o)[kVec]) const {
    to_acc(r[j], o);
#pragma unroll
    for (int k = 0; k < kVec; ++k) o[k] = Raw::out(epi, o[k], m, c);
  }
};

// x: rows of D elements, row r at x + r * row_stride; y: [rows, D] dense. Rows
// (first_block + blockIdx.x) * kRowsPerBlock + threadIdx.x / kTpr. The row's max, then its sum, each
// by shuffles over the row's lanes, then the outputs; the lane's slice kept as WarpShape::kRaw says.
template <typename in_t, typename out_t, typename Epi, int kLog2, int kVec, bool kPacked, int kThreads>
__global__ __launch_bounds__(kThreads) void softmax_warp_fwd_kernel(const in_t* __restrict__ x, out_t* __restrict__ y,
                                                                    int64_t rows, int dim, int64_t row_stride, Epi epi,
                                                                    int64_t first_block) {
  using A = acc_t<out_t>;
  using S = WarpShape<kLog2, kVec, false, int(sizeof(out_t)), kPacked, kThreads>;
  using Row = std::conditional_t<S::template kRaw<in_t, A>, WarpRawRow<in_t, A, Epi, kVec, S::kVecs, S::kFill>,
                                 WarpConvertedRow<in_t, A, Epi, kVec, S::kVecs, S::kFill>>;
  const int lane_in_row = threadIdx.x % S::kTpr;
  const int64_t row = (first_block + blockIdx.x) * S::kRowsPerBlock + threadIdx.x / S::kTpr;
  // Rows past the end still take part in the shuffles, with nothing valid.
  const int nvalid = row < rows ? warp_valid<S::kVecs, S::kTpr, kVec>(lane_in_row, dim) : 0;
  const int first = lane_in_row * kVec;
  constexpr int kStep = S::kTpr * kVec;
  Row slice;
  slice.template load<S::kLoadL2>(x + (row < rows ? row : 0) * row_stride + first, kStep, nvalid);
  const A m = warp_reduce<S::kTpr>(slice.lane_max(nvalid), MaxOp<A>());
  const A s = warp_reduce<S::kTpr>(slice.keep_and_sum(m, phase_count<S::kFill>(nvalid)), SumOp<A>());
  const A c = epi.row_constant(s);
  out_t* yr = y + (row < rows ? row : 0) * int64_t(dim) + first;
  const int nstore = phase_count<S::kFill>(nvalid);
#pragma unroll
  for (int j = 0; j < S::kVecs; ++j) {
    if (j < nstore) {
      A o[kVec];
      slice.out(epi, j, m, c, o);
      store_vector<out_t, kVec>(yr + j * kStep, from_acc<out_t>(o));
    }
  }
}

// grad_output, output: [rows, D] dense (out_t); grad_input: [rows, D] dense (in_t).
// Caches grad_output and output as loaded (0 past the row's end where kFill) and converts on use.
template <typename in_t, typename out_t, typename Epi, int kLog2, int kVec>
__global__ __launch_bounds__(kWarpBlockThreads) void softmax_warp_bwd_kernel(const out_t* __restrict__ grad_output,
                                                                             const out_t* __restrict__ output,
                                                                             in_t* __restrict__ grad_input,
                                                                             int64_t rows, int dim, Epi epi,
                                                                             int64_t first_block) {
  using A = acc_t<out_t>;
  using S = WarpShape<kLog2, kVec, true, int(sizeof(out_t))>;
  const int lane_in_row = threadIdx.x % S::kTpr;
  const int64_t row = (first_block + blockIdx.x) * S::kRowsPerBlock + threadIdx.x / S::kTpr;
  const int nvalid = row < rows ? warp_valid<S::kVecs, S::kTpr, kVec>(lane_in_row, dim) : 0;
  constexpr int kStep = S::kTpr * kVec;
  const int64_t offset = (row < rows ? row : 0) * int64_t(dim) + lane_in_row * kVec;

  AlignedVector<out_t, kVec> dy[S::kVecs], yv[S::kVecs];
#pragma unroll
  for (int j = 0; j < S::kVecs; ++j) {
    if (j < nvalid) {
      dy[j] = load_vector<out_t, kVec>(grad_output + offset + j * kStep);
      yv[j] = load_vector<out_t, kVec>(output + offset + j * kStep);
    } else if constexpr (S::kFill) {
      const A zeros[kVec] = {};
      dy[j] = yv[j] = from_acc<out_t>(zeros);
    }
  }
  A dot = A(0);
  LoadDependence outputs{opaque_zero(dim)};  // as block.cuh's resident_backward
#pragma unroll
  for (int j = 0; j < S::kVecs; ++j) {
    if (S::kFill || j < nvalid) {  // a term of 0 past the end where filled
      A g[kVec], o[kVec];
      to_acc(dy[j], g);
      to_acc(yv[j], o);
#pragma unroll
      for (int k = 0; k < kVec; ++k) dot += epi.backward_term(g[k], o[k]);
      if constexpr (output_loads_with_reduction<Epi, out_t>()) outputs.take(yv[j]);
    }
  }
  dot = outputs.apply(dot);
  dot = warp_reduce<S::kTpr>(dot, SumOp<A>());
  const int nstore = phase_count<S::kFill>(nvalid);
#pragma unroll
  for (int j = 0; j < S::kVecs; ++j) {
    if (j < nstore) {
      A g[kVec], o[kVec];
      to_acc(dy[j], g);
      to_acc(yv[j], o);
#pragma unroll
      for (int k = 0; k < kVec; ++k) g[k] = epi.backward(g[k], o[k], dot);
      store_vector<in_t, kVec>(grad_input + offset + j * kStep, from_acc<in_t>(g));
    }
  }
}

namespace detail {

template <typename in_t, typename out_t, typename Epi, int kLog2, int kVec, bool kPacked = false,
          int kThreads = kWarpBlockThreads>
cudaError_t launch_warp_fwd(const in_t* x, out_t* y, int64_t rows, int64_t dim, int64_t row_stride,
                            cudaStream_t stream) {
  using S = WarpShape<kLog2, kVec, false, int(sizeof(out_t)), kPacked, kThreads>;
  const int64_t blocks = (rows + S::kRowsPerBlock - 1) / S::kRowsPerBlock;
  return launch_items<softmax_warp_fwd_kernel<in_t, out_t, Epi, kLog2, kVec, kPacked, kThreads>>(
      blocks, kThreads, 0, 1, stream, x, y, rows, static_cast<int>(dim), row_stride, Epi{});
}

template <typename in_t, typename out_t, typename Epi, int kLog2, int kVec>
cudaError_t launch_warp_bwd(const out_t* dy, const out_t* y, in_t* dx, int64_t rows, int64_t dim,
                            cudaStream_t stream) {
  using S = WarpShape<kLog2, kVec, true, int(sizeof(out_t))>;
  const int64_t blocks = (rows + S::kRowsPerBlock - 1) / S::kRowsPerBlock;
  return launch_items<softmax_warp_bwd_kernel<in_t, out_t, Epi, kLog2, kVec>>(
      blocks, kWarpBlockThreads, 0, 1, stream, dy, y, dx, rows, static_cast<int>(dim), Epi{});
}

// Compile-time dispatch over log2(padded D) in [0, kMaxLog2]; only (kLog2, kVec) with 2^kLog2 >= kVec
// and 2^kLog2 <= the type's warp limit are instantiated, the packed forward only where softmax_warp_packable, its
// blocks of kWarpSmallBlockThreads only where softmax_warp_small_blockable (`threads`: the plan's block).
template <typename in_t, typename out_t, typename Epi, int kVec, int kLog2 = 0>
cudaError_t warp_forward(int log2, bool packed, int threads, const in_t* x, out_t* y, int64_t rows, int64_t dim,
                         int64_t row_stride, cudaStream_t stream) {
  constexpr int kMaxLog2 = sizeof(acc_t<out_t>) == 8 ? 9 : 10;
  if constexpr (kLog2 > kMaxLog2) {
    return cudaErrorInvalidValue;
  } else {
    if (log2 == kLog2) {
      const bool small = threads == kWarpSmallBlockThreads;
      if (!small && threads != kWarpBlockThreads) return cudaErrorInvalidValue;
      if constexpr ((1 << kLog2) < kVec) {
        return cudaErrorInvalidValue;
      } else {
        if (packed) {  // the packed rows take the usual blocks
          if constexpr (softmax_warp_packable(kLog2, kVec)) {
            if (!small) return launch_warp_fwd<in_t, out_t, Epi, kLog2, kVec, true>(x, y, rows, dim, row_stride, stream);
          }
          return cudaErrorInvalidValue;
        }
        if (small) {
          if constexpr (softmax_warp_small_blockable(kLog2, kVec, sizeof(in_t), sizeof(out_t))) {
            return launch_warp_fwd<in_t, out_t, Epi, kLog2, kVec, false, kWarpSmallBlockThreads>(x, y, rows, dim,
                                                                                              row_stride, stream);
          }
          return cudaErrorInvalidValue;
        }
        return launch_warp_fwd<in_t, out_t, Epi, kLog2, kVec, false>(x, y, rows, dim, row_stride, stream);
      }
    }
    return warp_forward<in_t, out_t, Epi, kVec, kLog2 + 1>(log2, packed, threads, x, y, rows, dim, row_stride,
                                                           stream);
  }
}

template <typename in_t, typename out_t, typename Epi, int kVec, int kLog2 = 0>
cudaError_t warp_backward(int log2, const out_t* dy, const out_t* y, in_t* dx, int64_t rows, int64_t dim,
                          cudaStream_t stream) {
  constexpr int kMaxLog2 = sizeof(acc_t<out_t>) == 8 ? 9 : 10;
  if constexpr (kLog2 > kMaxLog2) {
    return cudaErrorInvalidValue;
  } else {
    if (log2 == kLog2) {
      if constexpr ((1 << kLog2) >= kVec) {
        return launch_warp_bwd<in_t, out_t, Epi, kLog2, kVec>(dy, y, dx, rows, dim, stream);
      } else {
        return cudaErrorInvalidValue;
      }
    }
    return warp_backward<in_t, out_t, Epi, kVec, kLog2 + 1>(log2, dy, y, dx, rows, dim, stream);
  }
}

}  // namespace detail
}  // namespace fastact::softmax_impl
