// Variant `strided`: softmax over a dim that is not innermost (inner > 1). Every tensor is dense
// [outer, D, inner]; the softmax runs down each of the outer * inner columns of D elements at stride
// inner. No transposing copy.
//
// A column vector is kVec consecutive columns of one outer index (kVec = 128-bit width when
// inner % width == 0 and the pointers are aligned, else 1), read as one access per D-row. A block
// owns a tile of C consecutive column vectors and T = blockDim.x threads: thread t works on column
// vector c = t % C of the tile and D-group g = t / C of G = T / C, so a warp reads whole lines of
// consecutive D-rows (coalesced). C is a power of two, a 128-byte line of a D-row (an int column map); or,
// streaming only, all the column vectors of an outer index (AnyColumns: the T % C threads past G * C
// idle), whose D-rows lie end to end, so that the G D-groups read one contiguous run, whatever the
// alignment and however few the columns (dispatch.h kStridedWholeOuterUnits says when).
//   cached mode (kStreaming = false): the CTA of cluster rank r caches D-rows
//       d = r * G * kRows + g + j * G,  j < kRows  (kRows = softmax_strided_rows)
//     in registers (the host guarantees cluster * G * kRows >= D): one HBM read; in the forward with
//     128-bit accesses, 16-bit inputs stay as loaded there, so kRows doubles (StridedRows,
//     softmax_strided_raw). Max and sum are reduced per (column, lane) over the D-groups (shuffles
//     within a warp, shared memory across warps, partials pushed into every CTA of a cluster), as in
//     the row kernels: in float one exchange of (max, sum) pairs (strided_pair_forward), in float64 a
//     max and then a sum (strided_cached_forward).
//   streaming mode (kStreaming = true; D too long to cache): the CTA of cluster rank r streams its
//     slice of D-rows [r * S, (r + 1) * S), S = ceil(D / cluster) (strided_slice; all of D without a
//     cluster): an online (max, sum) pass (the backward: the dot), the exchange, then the write pass
//     over the same slice. Two reads, the second mostly from L2 while the slices in flight fit it.
// One tile per CTA (or per cluster); or, in split mode (chunks > 1: too few tiles to fill the device),
// a CTA per (tile, chunk of D), partials through a workspace, two launches (see the split kernels).
#pragma once

#include <limits>
#include <type_traits>

#include "fastact/softmax/common.cuh"
#include "fastact/softmax/split.cuh"  // SplitPhase

namespace fastact::softmax_impl {

// How many of a thread's kRows cached D-rows d_first + j * G (j < kRows) are below D. 32-bit
// arithmetic: in cached mode the host caps D at cluster x G x kRows <= 16 x 1024 x 16.
template <int kRows>
FASTACT_DEVICE int cached_rows(int64_t d_first, int64_t dim, int G) {
  const int d = static_cast<int>(dim);
  const int f = static_cast<int>(d_first);
  if (f >= d) return 0;
  const int n = (d - f + G - 1) / G;
  return n < kRows ? n : kRows;
}

// The tile's geometry as one thread sees it (the same for every tile), from the kernel's column map
// (common.cuh): a line's count of columns (a power of two: shifts), or AnyColumns.
struct StridedThread {
  int C, c, g, G, rank;
  bool active;      // g < G (always, for a line)
  int64_t d_first;  // first D-row of this thread (cached mode: in this CTA's slice)
};

FASTACT_DEVICE void strided_split_thread(int columns, StridedThread& t) {
  const int log_c = __ffs(columns) - 1;
  t.C = columns;
  t.c = threadIdx.x & (columns - 1);
  t.g = threadIdx.x >> log_c;
  t.G = blockDim.x >> log_c;
  t.active = true;
}

FASTACT_DEVICE void strided_split_thread(const AnyColumns& cols, StridedThread& t) {
  t.C = cols.columns;
  t.c = cols.column(threadIdx.x);
  t.g = cols.group(threadIdx.x);
  t.G = cols.whole_groups;
  t.active = t.g < t.G;
}

template <typename Cols>
FASTACT_DEVICE StridedThread strided_thread(Cols cols, int cluster, int rows_per_thread) {
  StridedThread t;
  strided_split_thread(cols, t);
  t.rank = cluster_rank(cluster);
  t.d_first = int64_t(t.rank) * t.G * rows_per_thread + t.g;
  return t;
}

// What column_allreduce takes: a line's count as t.C (as the kernels passed it before AnyColumns), or
// the AnyColumns map.
FASTACT_DEVICE int reduce_columns(const StridedThread& t, int) { return t.C; }
FASTACT_DEVICE const AnyColumns& reduce_columns(const StridedThread&, const AnyColumns& cols) { return cols; }

// The tile of this CTA in a launch of one tile per CTA (cluster) whose first is `first_tile`; cluster is
// a power of two (the host checks).
FASTACT_DEVICE int64_t strided_tile(int64_t first_tile, int cluster) {
  return first_tile + (blockIdx.x >> (__ffs(cluster) - 1));
}

// The D-rows [lo, hi) that this CTA streams (streaming mode): its cluster rank's slice of
// ceil(D / cluster) rows; empty where the thread's column does not exist.
struct StridedSlice {
  int64_t lo, hi;
};

FASTACT_DEVICE StridedSlice strided_slice(const StridedThread& t, bool column_ok, int64_t dim, int cluster) {
  if (!column_ok) return {0, 0};
  const int64_t per = (dim + cluster - 1) / cluster;
  const int64_t lo = int64_t(t.rank) * per;
  const int64_t hi = lo + per;
  return {lo < dim ? lo : dim, hi < dim ? hi : dim};
}

// Where this thread's column vector of tile `tile` starts.
struct StridedColumn {
  bool ok;       // it exists (the last tile may be partial), and the thread is active
  int64_t base;  // element offset of its D-row 0
};

template <int kVec>
FASTACT_DEVICE StridedColumn strided_column(const StridedThread& t, int64_t tile, int64_t outer, int64_t dim,
                                            int64_t inner) {
  const int64_t inner_units = inner / kVec;
  const int64_t cv = tile * t.C + t.c;
  StridedColumn col;
  col.ok = t.active && cv < outer * inner_units;
  int64_t o = 0, iv = 0;
  if (col.ok) divmod_nonneg(cv, inner_units, o, iv);
  col.base = o * dim * inner + iv * kVec;
  return col;
}

// The cached forward's L2 prefetch: the D-rows that this thread's counterpart `ahead` tiles on (the same
// cluster rank, D-group and column of tile + ahead) will load, asked for once this thread's own loads are
// out; nothing past the last tile; ahead = 0: none. Tiles start in launch order as earlier ones end, so
// with `ahead` a fraction of the tiles the device runs at once (dispatch.h kStridedPrefetchDivisor),
// those loads are in flight while this tile's CTAs exchange and store, with none of their own.
template <int kVec, int kRows, typename T>
FASTACT_DEVICE void strided_prefetch_ahead(const T* __restrict__ base, const StridedThread& t, int64_t tile,
                                           int64_t ahead, int64_t outer, int64_t dim, int64_t inner) {
  if (ahead <= 0) return;
  const StridedColumn col = strided_column<kVec>(t, tile + ahead, outer, dim, inner);
  if (!col.ok) return;
  const int n = cached_rows<kRows>(t.d_first, dim, t.G);
  const T* p = base + col.base + t.d_first * inner;
  const int64_t step = int64_t(t.G) * inner;
#pragma unroll
  for (int j = 0; j < kRows; ++j) {
    if (j < n) prefetch_l2(p + j * step);
  }
}

// A thread's cached D-rows, j < kRows: converted to the accumulation type on load (kRaw = false;
// Cache::keep may replace them), or kept as loaded and converted at each use (kRaw = true, 16-bit
// inputs: half the registers a row, see softmax_strided_raw; the cache is then KeepInput, whose keep
// is the identity).
template <bool kRaw, typename in_t, typename A, int kVec, int kRows>
struct StridedRows {
  A v[kRows][kVec];
  FASTACT_DEVICE void take(int j, const AlignedVector<in_t, kVec>& loaded) { to_acc(loaded, v[j]); }
  // m[k] = max(m[k], the rows' elements k), rows j < n.
  FASTACT_DEVICE void max_into(int n, A (&m)[kVec]) const {
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      if (j < n) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) m[k] = MaxOp<A>()(m[k], v[j][k]);
      }
    }
  }
  FASTACT_DEVICE void get(int j, A (&w)[kVec]) const {
#pragma unroll
    for (int k = 0; k < kVec; ++k) w[k] = v[j][k];
  }
  FASTACT_DEVICE void set(int j, const A (&w)[kVec]) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) v[j][k] = w[k];
  }
};

template <typename in_t, typename A, int kVec, int kRows>
struct StridedRows<true, in_t, A, kVec, kRows> {
  AlignedVector<in_t, kVec> r[kRows];
  FASTACT_DEVICE void take(int j, const AlignedVector<in_t, kVec>& loaded) { r[j] = loaded; }
  FASTACT_DEVICE void max_into(int n, A (&m)[kVec]) const { ElementMax<in_t>::into(r, n, m); }
  FASTACT_DEVICE void get(int j, A (&w)[kVec]) const { to_acc(r[j], w); }
};

// The outputs of a tile from this thread's cached D-rows j < nrows: Cache::out(epi, x, M[k], c[k]) per
// lane k, at yc + j * step.
template <typename Cache, int kVec, int kRows, typename Rows, typename Epi, typename A, typename out_t>
FASTACT_DEVICE void strided_store_rows(const Rows& rows, int nrows, out_t* __restrict__ yc, int64_t step,
                                       const Epi& epi, const A (&M)[kVec], const A (&c)[kVec]) {
#pragma unroll
  for (int j = 0; j < kRows; ++j) {
    if (j < nrows) {
      A o[kVec];
      rows.get(j, o);
#pragma unroll
      for (int k = 0; k < kVec; ++k) o[k] = Cache::out(epi, o[k], M[k], c[k]);
      store_vector<out_t, kVec>(yc + j * step, from_acc<out_t>(o));
    }
  }
}

// The kept values of this thread's cached D-rows j < nrows, Cache::keep(x, m[k]) per lane k (stored back
// unless keep is the identity), and s[k] += their terms Cache::term(kept, m[k]).
template <typename Cache, int kVec, int kRows, typename Rows, typename A>
FASTACT_DEVICE void strided_keep_and_sum(Rows& rows, int nrows, const A (&m)[kVec], A (&s)[kVec]) {
#pragma unroll
  for (int j = 0; j < kRows; ++j) {
    if (j < nrows) {
      A w[kVec];
      rows.get(j, w);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        w[k] = Cache::keep(w[k], m[k]);
        s[k] += Cache::term(w[k], m[k]);
      }
      if constexpr (!Cache::kKeepsInput) rows.set(j, w);
    }
  }
}

// The cached forward of one tile in float64 (float runs strided_pair_forward), once this thread's
// D-rows j < nrows are in `rows`: the column max, the kept values and their column sum, and the
// outputs at yc + j * step. Every thread of the CTA (cluster) calls it, nrows = 0 included.
template <typename Cache, int kVec, int kRows, typename Rows, typename Epi, typename A, typename out_t, typename Cols>
FASTACT_DEVICE void strided_cached_forward(Rows& rows, int nrows, out_t* __restrict__ yc, int64_t step, const Epi& epi,
                                           ColumnScratch<A> smem, int& round, Cols cols, int cluster) {
  A m[kVec], s[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) m[k] = neg_inf<A>();
  rows.max_into(nrows, m);
  column_allreduce(m, MaxOp<A>(), smem, round, cols, cluster);
#pragma unroll
  for (int k = 0; k < kVec; ++k) s[k] = A(0);
  strided_keep_and_sum<Cache, kVec, kRows>(rows, nrows, m, s);
  column_allreduce(s, SumOp<A>(), smem, round, cols, cluster);
#pragma unroll
  for (int k = 0; k < kVec; ++k) s[k] = epi.row_constant(s[k]);
  strided_store_rows<Cache, kVec, kRows>(rows, nrows, yc, step, epi, m, s);
}

// The forward of one tile in float, once this thread's D-rows j < nrows are in `rows`: one exchange.
// The thread's max per lane m (from the lowest finite float, so never -inf: FiniteMaxSumOp), its kept
// values Cache::keep(x, m) and their sum; the (max, sum) pairs reduced over the column to (M, S); the
// outputs Cache::out(epi, kept, M, f), f = Cache::factor(m, M, row_constant(S)), at yc + j * step.
// Cache: KeepInput<Epi> for raw rows (16-bit inputs kept as loaded: softmax computes exp twice per
// element) and for log_softmax; ForwardCache<SoftmaxEpilogue> for converted softmax rows, which keep
// exp(x - m) and rescale by exp(m - M) at the store, as block.cuh's resident_forward does. Why one
// exchange rather than a max and then a sum (strided_cached_forward): each exchange is a block barrier
// (and a cluster wait) that the whole CTA waits at, with its rows in registers and no loads in flight;
// the H100 diag at [32, 1024, 2048] dim 1 (bf16): 512 x 8 x 2 119.2 -> 103.8 us, the best shape
// 108.2 -> 103.8; float rows gained likewise.
template <typename Cache, int kVec, int kRows, typename Rows, typename Epi, typename out_t, typename Cols>
FASTACT_DEVICE void strided_pair_forward(Rows& rows, int nrows, out_t* __restrict__ yc, int64_t step, const Epi& epi,
                                         ColumnScratch<MaxSum<float>> smem, int& round, Cols cols, int cluster) {
  using A = float;
  MaxSum<A> st[kVec];
  A m[kVec];
  {
    A s[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      m[k] = -std::numeric_limits<A>::max();
      s[k] = A(0);
    }
    rows.max_into(nrows, m);
    strided_keep_and_sum<Cache, kVec, kRows>(rows, nrows, m, s);
#pragma unroll
    for (int k = 0; k < kVec; ++k) st[k] = {m[k], s[k]};
  }
  column_allreduce(st, FiniteMaxSumOp(), smem, round, cols, cluster);
  A M[kVec], f[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    M[k] = st[k].max;
    f[k] = Cache::factor(m[k], M[k], epi.row_constant(st[k].sum));
  }
  strided_store_rows<Cache, kVec, kRows>(rows, nrows, yc, step, epi, M, f);
}

// Streaming passes over D-rows [lo, hi) of this thread's column (D-rows lo + g, lo + g + G, ... in
// batches of kU accesses; step = G * inner): the online (max, sum) of the input per lane (masked rows are
// -inf: exp(-inf) adds 0) ...
template <typename A, typename in_t, int kVec, int kU>
FASTACT_DEVICE void strided_stream_stats(const in_t* __restrict__ xc, int64_t lo, int64_t hi, const StridedThread& t,
                                         int64_t inner, MaxSum<A> (&st)[kVec]) {
  const int64_t step = int64_t(t.G) * inner;
  for (int64_t d = lo + t.g; d < hi; d += int64_t(t.G) * kU) {
    const in_t* xp = xc + d * inner;
    // Loads first, then conversions (as in split_stats).
    AlignedVector<in_t, kVec> in[kU];
#pragma unroll
    for (int q = 0; q < kU; ++q) {
      if (d + int64_t(q) * t.G < hi) in[q] = load_vector<in_t, kVec>(xp + q * step);
    }
    A v[kVec][kU];
#pragma unroll
    for (int q = 0; q < kU; ++q) {
      A w[kVec];
      if (d + int64_t(q) * t.G < hi) {
        to_acc(in[q], w);
      } else {
#pragma unroll
        for (int k = 0; k < kVec; ++k) w[k] = neg_inf<A>();
      }
#pragma unroll
      for (int k = 0; k < kVec; ++k) v[k][q] = w[k];
    }
#pragma unroll
    for (int k = 0; k < kVec; ++k) online_update(st[k], v[k]);
  }
}

// ... and the write pass with the column's (max, row constant) per lane.
template <typename A, typename in_t, typename out_t, typename Epi, int kVec, int kU>
FASTACT_DEVICE void strided_stream_write(const in_t* __restrict__ xc, out_t* __restrict__ yc, int64_t lo, int64_t hi,
                                         const StridedThread& t, int64_t inner, const Epi& epi, const A (&m)[kVec],
                                         const A (&cst)[kVec]) {
  const int64_t step = int64_t(t.G) * inner;
  for (int64_t d = lo + t.g; d < hi; d += int64_t(t.G) * kU) {
    const in_t* xp = xc + d * inner;
    out_t* yp = yc + d * inner;
    AlignedVector<in_t, kVec> in[kU];
#pragma unroll
    for (int q = 0; q < kU; ++q) {
      if (d + int64_t(q) * t.G < hi) in[q] = load_vector<in_t, kVec>(xp + q * step);
    }
#pragma unroll
    for (int q = 0; q < kU; ++q) {
      if (d + int64_t(q) * t.G < hi) {
        A o[kVec];
        to_acc(in[q], o);
#pragma unroll
        for (int k = 0; k < kVec; ++k) o[k] = epi.forward(o[k], m[k], cst[k]);
        store_vector<out_t, kVec>(yp + q * step, from_acc<out_t>(o));
      }
    }
  }
}

// The backward's two streaming passes walk D-rows [lo, hi) of this thread's column alike (D-rows lo + g,
// lo + g + G, ... in batches of kU accesses; step = G * inner): load a batch of dy (and of y when kLoadY),
// then body(offset, dy, y) per D-row, both converted to the accumulation type (y unset without kLoadY).
template <bool kLoadY, typename A, typename out_t, int kVec, int kU, typename Body>
FASTACT_DEVICE void strided_stream_backward_rows(const out_t* __restrict__ dyc, const out_t* __restrict__ yc,
                                                 int64_t lo, int64_t hi, const StridedThread& t, int64_t inner,
                                                 Body body) {
  const int64_t step = int64_t(t.G) * inner;
  for (int64_t d = lo + t.g; d < hi; d += int64_t(t.G) * kU) {
    const int64_t off = d * inner;
    AlignedVector<out_t, kVec> dy[kU], yv[kU];
#pragma unroll
    for (int q = 0; q < kU; ++q) {
      if (d + int64_t(q) * t.G < hi) {
        dy[q] = load_vector<out_t, kVec>(dyc + off + q * step);
        if constexpr (kLoadY) yv[q] = load_vector<out_t, kVec>(yc + off + q * step);
      }
    }
#pragma unroll
    for (int q = 0; q < kU; ++q) {
      if (d + int64_t(q) * t.G < hi) {
        A g[kVec], o[kVec];
        to_acc(dy[q], g);
        to_acc(yv[q], o);
        body(off + q * step, g, o);
      }
    }
  }
}

// The summing pass: dot[k] += the backward terms (y loaded only where the term reads it) ...
template <typename A, typename out_t, typename Epi, int kVec, int kU>
FASTACT_DEVICE void strided_stream_dot(const out_t* __restrict__ dyc, const out_t* __restrict__ yc, int64_t lo,
                                       int64_t hi, const StridedThread& t, int64_t inner, const Epi& epi,
                                       A (&dot)[kVec]) {
  strided_stream_backward_rows<Epi::kTermUsesOutput, A, out_t, kVec, kU>(
      dyc, yc, lo, hi, t, inner, [&](int64_t, const A (&g)[kVec], const A (&o)[kVec]) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) dot[k] += epi.backward_term(g[k], o[k]);
      });
}

// ... and the write pass of grad_input with the column's dot.
template <typename A, typename in_t, typename out_t, typename Epi, int kVec, int kU>
FASTACT_DEVICE void strided_stream_backward_write(const out_t* __restrict__ dyc, const out_t* __restrict__ yc,
                                                  in_t* __restrict__ dxc, int64_t lo, int64_t hi,
                                                  const StridedThread& t, int64_t inner, const Epi& epi,
                                                  const A (&dot)[kVec]) {
  strided_stream_backward_rows<true, A, out_t, kVec, kU>(
      dyc, yc, lo, hi, t, inner, [&](int64_t off, const A (&g)[kVec], const A (&o)[kVec]) {
        A r[kVec];
#pragma unroll
        for (int k = 0; k < kVec; ++k) r[k] = epi.backward(g[k], o[k], dot[k]);
        store_vector<in_t, kVec>(dxc + off, from_acc<in_t>(r));
      });
}

// The forward's cache: D-rows as loaded for 16-bit inputs in 128-bit accesses (kRaw,
// softmax_strided_raw), else converted to the accumulation type. In float both run
// strided_pair_forward (Cache: KeepInput for raw rows, else ForwardCache); float64 rows
// strided_cached_forward.
template <typename in_t, typename out_t, typename Epi, int kVec>
struct StridedForwardCache {
  using A = acc_t<out_t>;
  static constexpr bool kRaw = softmax_strided_raw(false, kVec, sizeof(in_t), sizeof(A));
  static constexpr int kRows = softmax_strided_rows(false, kVec, sizeof(in_t), sizeof(out_t), sizeof(A));
  static_assert(!kRaw || std::is_same_v<A, float>, "raw rows: 16-bit inputs, float arithmetic");
  using Rows = StridedRows<kRaw, in_t, A, kVec, kRows>;
  using Cache = std::conditional_t<kRaw, KeepInput<Epi>, ForwardCache<Epi>>;
  // Bytes of one value of the column all-reduce ((max, sum) pairs in float).
  static constexpr int kValueBytes = softmax_strided_value_bytes(false, false, sizeof(A));
};

template <typename in_t, typename out_t, typename Epi, int kVec, bool kStreaming, typename Cols>
__global__ __launch_bounds__(kStridedMaxThreads, 1) void softmax_strided_fwd_kernel(
    const in_t* __restrict__ x,  // [outer, D, inner]
    out_t* __restrict__ y,       // [outer, D, inner]
    int64_t outer, int64_t dim, int64_t inner, Cols cols, int cluster, Epi epi,
    int64_t ahead,  // cached mode: tiles ahead to prefetch (strided_prefetch_ahead); 0: none
    int64_t first_tile) {
  using A = acc_t<out_t>;
  using P = MaxSum<A>;
  using F = StridedForwardCache<in_t, out_t, Epi, kVec>;
  constexpr int kRows = F::kRows;
  constexpr int kU = softmax_stream_unroll(kVec, sizeof(A));
  extern __shared__ __align__(16) unsigned char smem_raw[];
  exchange_init(column_scratch<A>(smem_raw).bar, cluster);
  const StridedThread t = strided_thread(cols, cluster, kRows);
  const int64_t tile = strided_tile(first_tile, cluster);
  const StridedColumn col = strided_column<kVec>(t, tile, outer, dim, inner);
  const in_t* xc = x + col.base;
  out_t* yc = y + col.base;
  int round = 0;
  if constexpr (!kStreaming) {
    const int nrows = col.ok ? cached_rows<kRows>(t.d_first, dim, t.G) : 0;
    const int64_t first = t.d_first * inner;
    const int64_t step = int64_t(t.G) * inner;
    typename F::Rows rows;
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      if (j < nrows) rows.take(j, load_vector<in_t, kVec>(xc + first + j * step));
    }
    if constexpr (std::is_same_v<A, float>) {
      // The prefetch is float accumulation's and 128-bit accesses' only (dispatch.h strided_prefetches):
      // compiled into the float64 kernels, the call alone cost them spills.
      if constexpr (kVec > 1) strided_prefetch_ahead<kVec, kRows>(x, t, tile, ahead, outer, dim, inner);
      strided_pair_forward<typename F::Cache, kVec, kRows>(rows, nrows, yc + first, step, epi,
                                                           column_scratch<P>(smem_raw), round, reduce_columns(t, cols), cluster);
    } else {
      strided_cached_forward<ForwardCache<Epi>, kVec, kRows>(rows, nrows, yc + first, step, epi,
                                                             column_scratch<A>(smem_raw), round, reduce_columns(t, cols), cluster);
    }
  } else {
    // Streaming: an online pass over the slice, the exchange, the write pass.
    const StridedSlice sl = strided_slice(t, col.ok, dim, cluster);
    P st[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) st[k] = OnlineOp<A>::identity();
    strided_stream_stats<A, in_t, kVec, kU>(xc, sl.lo, sl.hi, t, inner, st);
    column_allreduce(st, OnlineOp<A>(), column_scratch<P>(smem_raw), round, reduce_columns(t, cols), cluster);
    A m[kVec], cst[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      m[k] = st[k].max;
      cst[k] = epi.row_constant(st[k].sum);
    }
    strided_stream_write<A, in_t, out_t, Epi, kVec, kU>(xc, yc, sl.lo, sl.hi, t, inner, epi, m, cst);
  }
}

template <typename in_t, typename out_t, typename Epi, int kVec, bool kStreaming, typename Cols>
__global__ __launch_bounds__(kStridedMaxThreads, 1) void softmax_strided_bwd_kernel(
    const out_t* __restrict__ grad_output,  // [outer, D, inner]
    const out_t* __restrict__ output,       // [outer, D, inner]
    in_t* __restrict__ grad_input,          // [outer, D, inner]
    int64_t outer, int64_t dim, int64_t inner, Cols cols, int cluster, Epi epi, int64_t first_tile) {
  using A = acc_t<out_t>;
  constexpr int kRows = softmax_strided_rows(true, kVec, sizeof(in_t), sizeof(out_t), sizeof(A));
  constexpr int kU = softmax_stream_unroll(kVec, kVec > 1 ? sizeof(out_t) : (sizeof(out_t) > 4 ? sizeof(out_t) : 4));
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const ColumnScratch<A> smem = column_scratch<A>(smem_raw);
  exchange_init(smem.bar, cluster);
  const StridedThread t = strided_thread(cols, cluster, kRows);
  const StridedColumn col = strided_column<kVec>(t, strided_tile(first_tile, cluster), outer, dim, inner);
  const out_t* dyc = grad_output + col.base;
  const out_t* yc = output + col.base;
  in_t* dxc = grad_input + col.base;
  int round = 0;
  A dot[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) dot[k] = A(0);
  if constexpr (!kStreaming) {
    const int nrows = col.ok ? cached_rows<kRows>(t.d_first, dim, t.G) : 0;
    const int64_t first = t.d_first * inner;
    const int64_t step = int64_t(t.G) * inner;
    AlignedVector<out_t, kVec> dy[kRows], yv[kRows];
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      if (j < nrows) {
        // Whole lines into L2: the neighbouring tiles read the rest of each line (load_vector_line).
        dy[j] = load_vector_line<out_t, kVec>(dyc + first + j * step);
        yv[j] = load_vector_line<out_t, kVec>(yc + first + j * step);
      }
    }
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      if (j < nrows) {
        A g[kVec], o[kVec];
        to_acc(dy[j], g);
        to_acc(yv[j], o);
#pragma unroll
        for (int k = 0; k < kVec; ++k) dot[k] += epi.backward_term(g[k], o[k]);
      }
    }
    column_allreduce(dot, SumOp<A>(), smem, round, reduce_columns(t, cols), cluster);
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      if (j < nrows) {
        A g[kVec], o[kVec];
        to_acc(dy[j], g);
        to_acc(yv[j], o);
#pragma unroll
        for (int k = 0; k < kVec; ++k) g[k] = epi.backward(g[k], o[k], dot[k]);
        store_vector<in_t, kVec>(dxc + first + j * step, from_acc<in_t>(g));
      }
    }
  } else {
    const StridedSlice sl = strided_slice(t, col.ok, dim, cluster);
    strided_stream_dot<A, out_t, Epi, kVec, kU>(dyc, yc, sl.lo, sl.hi, t, inner, epi, dot);
    column_allreduce(dot, SumOp<A>(), smem, round, reduce_columns(t, cols), cluster);
    strided_stream_backward_write<A, in_t, out_t, Epi, kVec, kU>(dyc, yc, dxc, sl.lo, sl.hi, t, inner, epi, dot);
  }
}

// Split mode (a streamed plan with chunks > 1: D too long to cache, and too few tiles to fill the device
// even over a cluster): D cut into `chunks` chunks, chunk k the D-rows [k * D / chunks, (k + 1) * D /
// chunks); two kernels over the (tile, chunk) items, item = tile * chunks + k, a CTA each:
//   kSplitStats: the chunk's partial per column lane, (max, sum) pairs (backward: the dot), block-reduced
//     over its D-groups and written to the workspace at ws[(item * C + c) * kVec + lane];
//   kSplitApply: the CTA folds its tile's `chunks` partials (its D-groups take every G-th, then the
//     column all-reduce: the same order in every CTA of the tile, so all its chunks use the same bits),
//     then streams its chunk again and writes it. The apply launch runs the items in reverse, so its
//     first CTAs read what the stats launch read last, while that is still in L2.
// Two reads of the input (of grad_output and output); the workspace is the caller's
// (softmax_workspace_bytes). cluster is 1.

// This CTA's (tile, chunk) item of a split launch (the apply launch runs them in reverse), its thread's
// column, and the chunk's D-rows [lo, hi) (empty where the column does not exist).
struct StridedChunk {
  int64_t item, tile, lo, hi;
  StridedColumn col;
};

template <int kVec, int kPhase>
FASTACT_DEVICE StridedChunk strided_split_item(const StridedThread& t, int64_t first_item, int64_t items,
                                               int64_t chunks, int64_t outer, int64_t dim, int64_t inner) {
  StridedChunk w;
  w.item = first_item + blockIdx.x;
  if constexpr (kPhase == kSplitApply) w.item = items - 1 - w.item;
  w.tile = w.item / chunks;
  const int64_t k = w.item - w.tile * chunks;
  w.col = strided_column<kVec>(t, w.tile, outer, dim, inner);
  w.lo = k * dim / chunks;
  w.hi = w.col.ok ? (k + 1) * dim / chunks : w.lo;
  return w;
}

// The stats launch: D-group 0 of each existing column writes its lanes' partials of item w.item ...
template <typename V, int kVec>
FASTACT_DEVICE void strided_split_store(V* __restrict__ ws, const StridedThread& t, const StridedChunk& w,
                                        const V (&v)[kVec]) {
  if (t.g != 0 || !w.col.ok) return;
#pragma unroll
  for (int q = 0; q < kVec; ++q) ws[(w.item * t.C + t.c) * kVec + q] = v[q];
}

// ... and the apply launch: v[q] = op(v[q], the partials of chunks g, g + G, ... of the tile), before the
// block's column all-reduce.
template <typename V, int kVec, typename Op>
FASTACT_DEVICE void strided_split_fold(const V* __restrict__ ws, const StridedThread& t, const StridedChunk& w,
                                       int64_t chunks, Op op, V (&v)[kVec]) {
  if (!w.col.ok) return;
  for (int64_t j = t.g; j < chunks; j += t.G) {
#pragma unroll
    for (int q = 0; q < kVec; ++q) v[q] = op(v[q], ws[((w.tile * chunks + j) * t.C + t.c) * kVec + q]);
  }
}

template <typename in_t, typename out_t, typename Epi, int kVec, int kPhase, typename Cols>
__global__ __launch_bounds__(kStridedMaxThreads, 1) void softmax_strided_split_fwd_kernel(
    const in_t* __restrict__ x, out_t* __restrict__ y, int64_t outer, int64_t dim, int64_t inner, Cols cols,
    int64_t chunks, int64_t items, MaxSum<acc_t<out_t>>* __restrict__ ws, Epi epi, int64_t first_item) {
  using A = acc_t<out_t>;
  using P = MaxSum<A>;
  constexpr int kU = softmax_stream_unroll(kVec, sizeof(A));
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const StridedThread t = strided_thread(cols, 1, 0);
  const StridedChunk w = strided_split_item<kVec, kPhase>(t, first_item, items, chunks, outer, dim, inner);
  const StridedColumn& col = w.col;
  const int64_t lo = w.lo, hi = w.hi;
  int round = 0;
  P st[kVec];
#pragma unroll
  for (int q = 0; q < kVec; ++q) st[q] = OnlineOp<A>::identity();
  if constexpr (kPhase == kSplitStats) {
    strided_stream_stats<A, in_t, kVec, kU>(x + col.base, lo, hi, t, inner, st);
    column_allreduce(st, OnlineOp<A>(), column_scratch<P>(smem_raw), round, reduce_columns(t, cols), 1);
    strided_split_store(ws, t, w, st);
  } else {
    strided_split_fold(ws, t, w, chunks, OnlineOp<A>(), st);
    column_allreduce(st, OnlineOp<A>(), column_scratch<P>(smem_raw), round, reduce_columns(t, cols), 1);
    A m[kVec], cst[kVec];
#pragma unroll
    for (int q = 0; q < kVec; ++q) {
      m[q] = st[q].max;
      cst[q] = epi.row_constant(st[q].sum);
    }
    strided_stream_write<A, in_t, out_t, Epi, kVec, kU>(x + col.base, y + col.base, lo, hi, t, inner, epi, m, cst);
  }
}

template <typename in_t, typename out_t, typename Epi, int kVec, int kPhase, typename Cols>
__global__ __launch_bounds__(kStridedMaxThreads, 1) void softmax_strided_split_bwd_kernel(
    const out_t* __restrict__ grad_output, const out_t* __restrict__ output, in_t* __restrict__ grad_input,
    int64_t outer, int64_t dim, int64_t inner, Cols cols, int64_t chunks, int64_t items,
    acc_t<out_t>* __restrict__ ws, Epi epi, int64_t first_item) {
  using A = acc_t<out_t>;
  constexpr int kU = softmax_stream_unroll(kVec, kVec > 1 ? sizeof(out_t) : (sizeof(out_t) > 4 ? sizeof(out_t) : 4));
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const StridedThread t = strided_thread(cols, 1, 0);
  const StridedChunk w = strided_split_item<kVec, kPhase>(t, first_item, items, chunks, outer, dim, inner);
  const StridedColumn& col = w.col;
  const int64_t lo = w.lo, hi = w.hi;
  int round = 0;
  A dot[kVec];
#pragma unroll
  for (int q = 0; q < kVec; ++q) dot[q] = A(0);
  if constexpr (kPhase == kSplitStats) {
    strided_stream_dot<A, out_t, Epi, kVec, kU>(grad_output + col.base, output + col.base, lo, hi, t, inner, epi,
                                                 dot);
    column_allreduce(dot, SumOp<A>(), column_scratch<A>(smem_raw), round, reduce_columns(t, cols), 1);
    strided_split_store(ws, t, w, dot);
  } else {
    strided_split_fold(ws, t, w, chunks, SumOp<A>(), dot);
    column_allreduce(dot, SumOp<A>(), column_scratch<A>(smem_raw), round, reduce_columns(t, cols), 1);
    strided_stream_backward_write<A, in_t, out_t, Epi, kVec, kU>(grad_output + col.base, output + col.base,
                                                                 grad_input + col.base, lo, hi, t, inner, epi, dot);
  }
}

namespace detail {

inline bool columns_are_line(int columns) { return columns > 0 && (columns & (columns - 1)) == 0; }

// A launch shape the kernels take: whole warps; a line (a power of two dividing the threads), or, when
// streaming, any count of columns up to the threads (AnyColumns).
inline bool strided_shape_ok(int threads, int columns, bool streaming) {
  if (threads <= 0 || threads > kStridedMaxThreads || threads % kWarpSize != 0) return false;
  if (columns <= 0 || columns > threads) return false;
  return columns_are_line(columns) ? threads % columns == 0 : streaming;
}

// Checks a cached or streaming plan's shape against D; cudaSuccess if it runs.
inline cudaError_t strided_plan_ok(int threads, int columns, int cluster, bool streaming, int64_t dim, int rows,
                                   int64_t inner, int vec, size_t smem) {
  if (!strided_shape_ok(threads, columns, streaming) || inner % vec != 0 || cluster < 1 || cluster > kMaxCluster ||
      (cluster & (cluster - 1)) != 0)
    return cudaErrorInvalidConfiguration;
  if (!streaming && int64_t(cluster) * (threads / columns) * rows < dim) return cudaErrorInvalidConfiguration;
  if (smem > size_t(kStridedMaxSmem)) return cudaErrorInvalidConfiguration;
  return cudaSuccess;
}

// Calls launch(cols) with the column map of `columns` (common.cuh): the count itself for a line, else
// AnyColumns (streaming kernels only: strided_shape_ok).
template <typename Launch>
cudaError_t with_columns(int columns, int threads, Launch launch) {
  if (columns_are_line(columns)) return launch(columns);
  return launch(any_columns(columns, threads));
}

template <typename in_t, typename out_t, typename Epi, int kVec>
cudaError_t strided_forward(const in_t* x, out_t* y, int64_t outer, int64_t dim, int64_t inner, int threads,
                            int columns, int cluster, bool streaming, bool prefetch, cudaStream_t stream) {
  using A = acc_t<out_t>;
  using F = StridedForwardCache<in_t, out_t, Epi, kVec>;
  constexpr int kRows = F::kRows;
  const auto smem =
      size_t(softmax_strided_smem_bytes(threads, columns, kVec, cluster, streaming ? sizeof(MaxSum<A>) : F::kValueBytes));
  const cudaError_t ok = strided_plan_ok(threads, columns, cluster, streaming, dim, kRows, inner, kVec, smem);
  if (ok != cudaSuccess) return ok;
  const int64_t ntiles = softmax_strided_tiles(outer, inner, kVec, columns);
  if (streaming)
    return with_columns(columns, threads, [&](auto cols) {
      return launch_items<softmax_strided_fwd_kernel<in_t, out_t, Epi, kVec, true, decltype(cols)>>(
          ntiles, threads, smem, cluster, stream, x, y, outer, dim, inner, cols, cluster, Epi{}, int64_t(0));
    });
  constexpr auto kCached = softmax_strided_fwd_kernel<in_t, out_t, Epi, kVec, false, int>;
  const int64_t ahead = prefetch ? resident_tiles<kCached>(threads, cluster, smem) / kStridedPrefetchDivisor : 0;
  return launch_items<kCached>(ntiles, threads, smem, cluster, stream, x, y, outer, dim, inner, columns, cluster,
                               Epi{}, ahead);
}

template <typename in_t, typename out_t, typename Epi, int kVec>
cudaError_t strided_backward(const out_t* dy, const out_t* y, in_t* dx, int64_t outer, int64_t dim, int64_t inner,
                             int threads, int columns, int cluster, bool streaming, cudaStream_t stream) {
  using A = acc_t<out_t>;
  constexpr int kRows = softmax_strided_rows(true, kVec, sizeof(in_t), sizeof(out_t), sizeof(acc_t<out_t>));
  const auto smem = size_t(softmax_strided_smem_bytes(threads, columns, kVec, cluster, sizeof(A)));
  const cudaError_t ok = strided_plan_ok(threads, columns, cluster, streaming, dim, kRows, inner, kVec, smem);
  if (ok != cudaSuccess) return ok;
  const int64_t ntiles = softmax_strided_tiles(outer, inner, kVec, columns);
  if (streaming)
    return with_columns(columns, threads, [&](auto cols) {
      return launch_items<softmax_strided_bwd_kernel<in_t, out_t, Epi, kVec, true, decltype(cols)>>(
          ntiles, threads, smem, cluster, stream, dy, y, dx, outer, dim, inner, cols, cluster, Epi{});
    });
  return launch_items<softmax_strided_bwd_kernel<in_t, out_t, Epi, kVec, false, int>>(
      ntiles, threads, smem, cluster, stream, dy, y, dx, outer, dim, inner, columns, cluster, Epi{});
}

// Checks a split plan against the problem: cudaSuccess if it runs with `workspace_bytes` of workspace
// (values of `value_bytes`, one per (tile, chunk, column lane)).
inline cudaError_t strided_split_ok(int threads, int columns, int64_t chunks, int64_t outer, int64_t dim,
                                    int64_t inner, int vec, size_t smem, const void* workspace,
                                    int64_t workspace_bytes, int value_bytes) {
  const cudaError_t ok = strided_plan_ok(threads, columns, 1, true, dim, 1, inner, vec, smem);
  if (ok != cudaSuccess) return ok;
  if (workspace == nullptr || chunks < 2 || chunks > dim) return cudaErrorInvalidValue;
  const int64_t tiles = softmax_strided_tiles(outer, inner, vec, columns);
  if (tiles > (int64_t(1) << 40) / (chunks * columns * vec * value_bytes) ||
      tiles * chunks * columns * vec * value_bytes > workspace_bytes)
    return cudaErrorInvalidValue;
  return cudaSuccess;
}

// The split mode's two launches (chunks > 1; `workspace`: softmax_workspace_bytes of the plan, whose
// size is `workspace_bytes`).
template <typename in_t, typename out_t, typename Epi, int kVec>
cudaError_t strided_split_forward(const in_t* x, out_t* y, int64_t outer, int64_t dim, int64_t inner, int threads,
                                  int columns, int64_t chunks, void* workspace, int64_t workspace_bytes,
                                  cudaStream_t stream) {
  using A = acc_t<out_t>;
  const auto smem = size_t(softmax_strided_smem_bytes(threads, columns, kVec, 1, sizeof(MaxSum<A>)));
  const cudaError_t ok = strided_split_ok(threads, columns, chunks, outer, dim, inner, kVec, smem, workspace,
                                          workspace_bytes, int(sizeof(MaxSum<A>)));
  if (ok != cudaSuccess) return ok;
  const int64_t items = softmax_strided_tiles(outer, inner, kVec, columns) * chunks;
  auto* ws = static_cast<MaxSum<A>*>(workspace);
  return with_columns(columns, threads, [&](auto cols) {
    using Cols = decltype(cols);
    const cudaError_t err = launch_items<softmax_strided_split_fwd_kernel<in_t, out_t, Epi, kVec, kSplitStats, Cols>>(
        items, threads, smem, 1, stream, x, y, outer, dim, inner, cols, chunks, items, ws, Epi{});
    if (err != cudaSuccess) return err;
    return launch_items<softmax_strided_split_fwd_kernel<in_t, out_t, Epi, kVec, kSplitApply, Cols>>(
        items, threads, smem, 1, stream, x, y, outer, dim, inner, cols, chunks, items, ws, Epi{});
  });
}

template <typename in_t, typename out_t, typename Epi, int kVec>
cudaError_t strided_split_backward(const out_t* dy, const out_t* y, in_t* dx, int64_t outer, int64_t dim,
                                   int64_t inner, int threads, int columns, int64_t chunks, void* workspace,
                                   int64_t workspace_bytes, cudaStream_t stream) {
  using A = acc_t<out_t>;
  const auto smem = size_t(softmax_strided_smem_bytes(threads, columns, kVec, 1, sizeof(A)));
  const cudaError_t ok = strided_split_ok(threads, columns, chunks, outer, dim, inner, kVec, smem, workspace,
                                          workspace_bytes, int(sizeof(A)));
  if (ok != cudaSuccess) return ok;
  const int64_t items = softmax_strided_tiles(outer, inner, kVec, columns) * chunks;
  auto* ws = static_cast<A*>(workspace);
  return with_columns(columns, threads, [&](auto cols) {
    using Cols = decltype(cols);
    const cudaError_t err = launch_items<softmax_strided_split_bwd_kernel<in_t, out_t, Epi, kVec, kSplitStats, Cols>>(
        items, threads, smem, 1, stream, dy, y, dx, outer, dim, inner, cols, chunks, items, ws, Epi{});
    if (err != cudaSuccess) return err;
    return launch_items<softmax_strided_split_bwd_kernel<in_t, out_t, Epi, kVec, kSplitApply, Cols>>(
        items, threads, smem, 1, stream, dy, y, dx, outer, dim, inner, cols, chunks, items, ws, Epi{});
  });
}

}  // namespace detail
}  // namespace fastact::softmax_impl
