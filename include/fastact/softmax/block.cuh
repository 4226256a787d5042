// The row-resident kernels behind variants `vec`, `scalar` (rows that fit one block) and `long_row`
// (cluster mode): a row of D elements (inner == 1) is cached in the registers of one CTA, or of the
// `cluster` CTAs of a thread-block cluster (sm_90), read from HBM once, reduced, and written.
//
// Layout: the row is cut into units of kVec elements (kVec = 128-bit width when aligned, else 1).
// Rows off the alignment (kEdges, plan.edges: D not a multiple of kVec, every tensor's rows at the
// same offset from it) are cut into a head, a body and a tail (RowEdges below): the units are those of
// the body, laid out as here; the head and tail elements belong to two threads of the last CTA.
// 16-bit rows whose input starts off the alignment by a different amount in each row (kShift, plan.shifted:
// a row stride off the vector width, or an offset view) into an aligned dense output: the aligned 16-byte
// chunks of the input under the units are staged in shared memory, and each unit is built from two of them
// (ShiftedRow below).
// CTA of cluster rank r caches units [r * T * kVecs, (r + 1) * T * kVecs), T = blockDim.x; thread t
// holds units  r * T * kVecs + j * T + t,  j < kVecs, so for each j the block reads T consecutive
// units (coalesced). Units at or beyond D / kVec are skipped (kVec divides D when kVec > 1): every
// loop is guarded by j < nvalid rather than padding with -inf / 0, which would cost registers. The
// host guarantees cluster * T * kVecs * kVec >= D (so in-row offsets fit in int).
//
// Forward: each thread's max, its kept values (exp(x - max) for softmax, x for log_softmax; kRaw, the
// long_row clusters' 16-bit forwards: the loaded vectors themselves, twice the elements in the same
// registers) and their sum -> one all-reduce of the (max, sum) pairs (block, then cluster) -> write,
// rescaled to the row's max. Backward: sum of the epilogue's backward term -> write. The all-reduce
// costs one block barrier (in a cluster, plus one exchange of pushed partials: row_allreduce); a max
// and then a sum would cost two. One row per CTA or cluster; each CTA reads only its own shared memory,
// so none waits for the others at exit.
#pragma once

#include "fastact/copy_async.cuh"
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
// 32-bit arithmetic: the host caps a cached row at 16 x 512 x 128 elements (2^20).
template <int kVecs>
FASTACT_DEVICE int resident_valid(int first, int64_t dim, int step) {
  const int d = static_cast<int>(dim);
  if (first >= d) return 0;
  const int n = (d - first + step - 1) / step;
  return n < kVecs ? n : kVecs;
}

// This thread's units of a cached row: the CTA of cluster rank `rank` (cluster_rank),
// thread t: units first + j * step, j < kVecs, of which j < nvalid start inside the row. Offsets
// within a row fit in int: the host caps D at 16 x 512 x 128.
struct ResidentSlice {
  int first;   // element offset of unit 0 in the row
  int step;    // elements from unit j to unit j + 1: T * kVec
  int nvalid;  // units inside the row
};

// The slice of the CTA of rank `rank` among the row's CTAs (a cluster's, or grid.cuh's).
template <int kVec, int kVecs>
FASTACT_DEVICE ResidentSlice resident_slice_of_rank(int64_t dim, int rank) {
  const int nthreads = blockDim.x;
  ResidentSlice s;
  s.first = (rank * nthreads * kVecs + static_cast<int>(threadIdx.x)) * kVec;
  s.step = nthreads * kVec;
  s.nvalid = resident_valid<kVecs>(s.first, dim, s.step);
  return s;
}

// The L2 prefetch of the units that this thread's counterpart (the same thread of the CTA of the same
// rank, so the same slice s) will load from the row at `row` (prefetch_l2 each; units past the row's end
// none).
template <int kVecs, typename T>
FASTACT_DEVICE void prefetch_slice(const T* __restrict__ row, const ResidentSlice& s) {
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < s.nvalid) prefetch_l2(row + s.first + j * s.step);
  }
}

template <int kVec, int kVecs>
FASTACT_DEVICE ResidentSlice resident_slice(int64_t dim, int cluster) {
  return resident_slice_of_rank<kVec, kVecs>(dim, cluster_rank(cluster));
}

// How resident_forward writes a thread's units of the slice: stores.at(s), taken once the row's all-reduce is
// done, gives a writer whose store(p, j, v) writes unit j at p = yr + j * s.step. PlainStores: each unit whole.
template <int kVec>
struct PlainStores {
  FASTACT_DEVICE PlainStores at(const ResidentSlice& /*s*/) const { return *this; }
  template <typename T>
  FASTACT_DEVICE void store(T* p, int /*j*/, const AlignedVector<T, kVec>& v) const {
    store_vector<T, kVec>(p, v);
  }
};

// 16-bit rows into a float output (the dtype= cast): a lane's unit is 8 floats, 32 bytes; stored whole, each
// store instruction of the warp writes half of each 32-byte sector it touches. Where the warp's 32 units of j lie
// inside the row, its lanes swap halves and store 512 contiguous bytes an instruction (vec.cuh store_warp_paired);
// the warp that holds the row's end stores plain. Why (H200, [*, D] 256 MB of bf16 in, a diag of the library's
// plans): the dispatcher's vec plans (4 units a thread), D = 2048 208.6 -> 197.9 us, 4096 220.7 -> 202.2 (0.874 ->
// 0.956 of the limit), 8192 229.3 -> 203.1, 12288 266.0 -> 218.6, 16384 275.0 -> 203.2. Plans of one or two units a
// thread lose 2-10% (the shuffles, with few loads to hide them behind); the dispatcher gives these rows none.
// Loading 8-byte pieces instead (each lane then stores its own 512-byte runs, no shuffle) lost 7-10% but at 16384:
// the loads, not the stores, set the pace there. The count of paired units is taken after the all-reduce, so that
// it holds no register across it (the log_softmax kernel is at the 64 registers of 1024 threads).
template <typename out_t, int kVec, int kVecs>
struct WarpPairedStores {
  int dim;  // the row's elements

  struct Writer {
    int paired;  // units j < paired are stored by warp pairs
    FASTACT_DEVICE void store(out_t* p, int j, const AlignedVector<out_t, kVec>& v) const {
      if (j < paired) {
        store_warp_paired<out_t, kVec>(p, v);
      } else {
        store_vector<out_t, kVec>(p, v);
      }
    }
  };
  FASTACT_DEVICE Writer at(const ResidentSlice& s) const {
    // The warp's units of j start at c0 + j * step. A CTA of whole warps keeps each warp's 32 units in its slice.
    const int c0 = s.first - static_cast<int>(threadIdx.x % kWarpSize) * kVec;
    const int room = dim - c0 - kWarpSize * kVec;
    const int n = room < 0 ? 0 : room / s.step + 1;
    return Writer{blockDim.x % kWarpSize != 0 ? 0 : (n < kVecs ? n : kVecs)};
  }
};

// The stores of a resident forward's slice (softmax_block_fwd_kernel; long_row.cuh's shared-memory cluster kernel and
// grid.cuh's slices, whose units lie alike): paired where a unit's outputs are two 16-byte halves wider than its
// inputs, else plain. Rows off the alignment (kEdges) store plain: the pairs made D = 4095 slower (softmax 217.7 ->
// 228.0 us, log_softmax 215.1 -> 218.6), and the log kernel spilled. long_row's shared-memory cluster kernel
// gained alike (H200, bf16 in: rows of 32768-128256 240-246 -> 202-204 us); the grid kernel's pairs are untimed.
template <typename in_t, typename out_t, int kVec, int kVecs, bool kEdges>
FASTACT_DEVICE auto forward_stores(int64_t dim) {
  if constexpr (!kEdges && sizeof(out_t) > sizeof(in_t) && kVec * sizeof(out_t) == 2 * kVecBytes) {
    return WarpPairedStores<out_t, kVec, kVecs>{static_cast<int>(dim)};
  } else {
    return PlainStores<kVec>{};
  }
}

// resident_forward's Extra when all of the thread's slice is in v (block.cuh's kernels): hooks that do
// nothing. An Extra holds the rest of the slice, kept elsewhere (long_row.cuh's SharedUnits: in shared
// memory, as loaded), and resident_forward calls its hooks after the matching loops over v: fold_max(m)
// folds its values into the thread's max m; add_terms(sum, base) adds their terms exp(x - base) to the
// thread's sum; store(epi, M, c, yr, s, writer) writes their outputs KeepInput<Epi>::out(epi, x, M, c) to
// yr + j * s.step (unit j of the slice) through resident_forward's writer (PlainStores, WarpPairedStores): M the
// row's max, c = epi.row_constant(row sum) (not f, which rescales the values kept in v).
struct NoExtraUnits {
  template <typename A>
  FASTACT_DEVICE void fold_max(A& /*m*/, const ResidentSlice& /*s*/) const {}
  template <typename A>
  FASTACT_DEVICE void add_terms(A& /*sum*/, A /*base*/, const ResidentSlice& /*s*/) const {}
  template <typename Epi, typename A, typename out_t, typename Writer>
  FASTACT_DEVICE void store(const Epi& /*epi*/, A /*row_max*/, A /*c*/, out_t* /*yr*/, const ResidentSlice& /*s*/,
                            const Writer& /*writer*/) const {}
};

// resident_forward's Extra for units of the slice kept as loaded (in_t) rather than as A: units
// kFirst + j (j < kUnits) of the slice, unit j read as Units::unit(j) (CRTP), processed through the
// epilogue itself (KeepInput: softmax computes their exps twice, for the sum and for the outputs).
// Units: RegisterUnits below (registers), long_row.cuh's SharedUnits (shared memory).
template <typename Units, typename Epi, typename in_t, int kVec, int kFirst, int kUnits>
struct LoadedUnits {
  using Raw = KeepInput<Epi>;

  // f(unit index in the slice, its values as A) for each of these units inside the row.
  template <typename A, typename F>
  FASTACT_DEVICE void for_each(const ResidentSlice& s, F&& f) const {
#pragma unroll
    for (int j = 0; j < kUnits; ++j) {
      if (kFirst + j < s.nvalid) {
        A w[kVec];
        to_acc(static_cast<const Units*>(this)->unit(j), w);
        f(kFirst + j, w);
      }
    }
  }
  template <typename A>
  FASTACT_DEVICE void fold_max(A& m, const ResidentSlice& s) const {
    for_each<A>(s, [&](int, const A(&w)[kVec]) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) m = MaxOp<A>()(m, w[k]);
    });
  }
  template <typename A>
  FASTACT_DEVICE void add_terms(A& sum, A base, const ResidentSlice& s) const {
    for_each<A>(s, [&](int, const A(&w)[kVec]) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) sum += Raw::term(w[k], base);
    });
  }
  template <typename A, typename out_t, typename Writer>
  FASTACT_DEVICE void store(const Epi& epi, A row_max, A c, out_t* __restrict__ yr, const ResidentSlice& s,
                            const Writer& writer) const {
    for_each<A>(s, [&](int j, const A(&w)[kVec]) {
      A o[kVec];
#pragma unroll
      for (int k = 0; k < kVec; ++k) o[k] = Raw::out(epi, w[k], row_max, c);
      writer.store(yr + j * s.step, j, from_acc<out_t>(o));
    });
  }
};

// The whole slice (or, in long_row.cuh's kRawRegs kernel, its first kUnits units, the rest in shared memory),
// kUnits units, in registers as loaded (softmax_block_fwd_kernel with kRaw: 16-bit
// inputs, dispatch.h softmax_resident_raw): half the registers of the converted cache. The max by
// packed 16-bit compares where the element type has them (ElementMax).
template <typename Epi, typename in_t, int kVec, int kUnits>
struct RegisterUnits : LoadedUnits<RegisterUnits<Epi, in_t, kVec, kUnits>, Epi, in_t, kVec, 0, kUnits> {
  AlignedVector<in_t, kVec> r[kUnits];

  FASTACT_DEVICE const AlignedVector<in_t, kVec>& unit(int j) const { return r[j]; }
  template <typename A>
  FASTACT_DEVICE void fold_max(A& m, const ResidentSlice& s) const {
    A mv[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) mv[k] = neg_inf<A>();
    ElementMax<in_t>::into(r, s.nvalid, mv);
#pragma unroll
    for (int k = 0; k < kVec; ++k) m = MaxOp<A>()(m, mv[k]);
  }
};

// resident_forward's Extra made of two: each hook runs the first's, then the second's.
template <typename First, typename Second>
struct BothExtras {
  First first;
  Second second;
  template <typename A>
  FASTACT_DEVICE void fold_max(A& m, const ResidentSlice& s) const {
    first.fold_max(m, s);
    second.fold_max(m, s);
  }
  template <typename A>
  FASTACT_DEVICE void add_terms(A& sum, A base, const ResidentSlice& s) const {
    first.add_terms(sum, base, s);
    second.add_terms(sum, base, s);
  }
  template <typename Epi, typename A, typename out_t, typename Writer>
  FASTACT_DEVICE void store(const Epi& epi, A row_max, A c, out_t* yr, const ResidentSlice& s,
                            const Writer& writer) const {
    first.store(epi, row_max, c, yr, s, writer);
    second.store(epi, row_max, c, yr, s, writer);
  }
};

// A row that starts off the 128-bit alignment (kEdges): row r of every tensor starts (r * D) % kVec
// elements past an aligned address, since the host takes such rows only when every base pointer is
// aligned and the input's row stride equals D modulo kVec (dispatch.h: softmax_rows_edge_vectorizable).
// Its first `head` elements (up to the next aligned address) and its last `tail` elements (after the
// last whole unit) move one at a time; the `body` between them moves in aligned units. The last two
// threads of the cluster's last CTA own the head and the tail (their slices end the row, so they hold
// the fewest units): `offset` and `count` are this thread's edge elements within the row.
struct RowEdges {
  int head;    // elements before the body (< kVec; all of D when D is shorter)
  int body;    // elements in whole units (a multiple of kVec)
  int offset;  // this thread's edge: elements [offset, offset + count) of the row
  int count;   // 0 for every thread but the two owners (< kVec)
};

// 32-bit in-row arithmetic: the host caps a cached row at 16 x 512 x 128 elements (2^20).
template <int kVec>
FASTACT_DEVICE RowEdges row_edges(int64_t row, int64_t dim, int cluster) {
  const int d = static_cast<int>(dim);
  const int phase = static_cast<int>((row % kVec) * (dim % kVec) % kVec);  // (row * D) % kVec, no overflow
  const int head = phase == 0 ? 0 : (kVec - phase < d ? kVec - phase : d);
  const int tail = (d - head) % kVec;
  RowEdges e{head, d - head - tail, 0, 0};
  if (cluster_rank(cluster) == cluster - 1) {
    if (threadIdx.x == blockDim.x - 1) {
      e.count = head;
    } else if (threadIdx.x == blockDim.x - 2) {
      e.offset = d - tail;
      e.count = tail;
    }
  }
  return e;
}

// This thread's edge elements (RowEdges::count of them, fewer than kVec) of one row of T at `row`, as
// loaded: element loads issued with the body's vector loads, so that their latency overlaps.
template <typename T, int kVec>
struct EdgeElements {
  static constexpr int kMax = kVec - 1 > 0 ? kVec - 1 : 1;
  T e[kMax];
  int count;
  FASTACT_DEVICE EdgeElements(const T* __restrict__ row, const RowEdges& ed) : count(ed.count) {
#pragma unroll
    for (int k = 0; k < kMax; ++k) {
      if (k < count) e[k] = row[ed.offset + k];
    }
  }
  template <typename A>
  FASTACT_DEVICE A value(int k) const {
    AlignedVector<T, 1> v{{e[k]}};
    A a[1];
    to_acc(v, a);
    return a[0];
  }
};

template <typename T, typename A>
FASTACT_DEVICE void store_element(T* p, A value) {
  const A a[1] = {value};
  store_vector<T, 1>(p, from_acc<T>(a));
}

// resident_forward's Extra for a row with edges: this thread's edge elements of x, processed through
// the epilogue itself (KeepInput, as long_row.cuh's SharedUnits), written to yrow[offset + k].
template <typename Epi, typename in_t, typename out_t, int kVec>
struct ForwardEdges {
  using Raw = KeepInput<Epi>;
  EdgeElements<in_t, kVec> x;
  out_t* yrow;
  int offset;
  FASTACT_DEVICE ForwardEdges(const in_t* __restrict__ xrow, out_t* yrow_, const RowEdges& ed)
      : x(xrow, ed), yrow(yrow_), offset(ed.offset) {}

  template <typename A>
  FASTACT_DEVICE void fold_max(A& m, const ResidentSlice& /*s*/) const {
#pragma unroll
    for (int k = 0; k < x.kMax; ++k) {
      if (k < x.count) m = MaxOp<A>()(m, x.template value<A>(k));
    }
  }
  template <typename A>
  FASTACT_DEVICE void add_terms(A& sum, A base, const ResidentSlice& /*s*/) const {
#pragma unroll
    for (int k = 0; k < x.kMax; ++k) {
      if (k < x.count) sum += Raw::term(x.template value<A>(k), base);
    }
  }
  template <typename A, typename T, typename Writer>
  FASTACT_DEVICE void store(const Epi& epi, A row_max, A c, T* /*yr*/, const ResidentSlice& /*s*/,
                            const Writer& /*writer*/) const {
#pragma unroll
    for (int k = 0; k < x.kMax; ++k) {
      if (k < x.count) store_element(yrow + offset + k, Raw::out(epi, x.template value<A>(k), row_max, c));
    }
  }
};

// resident_backward's Extra: hooks that do nothing (the whole slice is in its arrays). add_terms(epi, dot,
// outputs) adds the Extra's backward terms to dot and, where output_loads_with_reduction, passes the output
// values it loaded to outputs (LoadDependence).
struct NoExtraGrads {
  template <typename Epi, typename A>
  FASTACT_DEVICE void add_terms(const Epi& /*epi*/, A& /*dot*/, LoadDependence& /*outputs*/) const {}
  template <typename Epi, typename A>
  FASTACT_DEVICE void store(const Epi& /*epi*/, A /*dot*/) const {}
};

// resident_backward's Extra for a row with edges: this thread's edge elements of grad_output and
// output; add_terms adds their backward terms to the dot (their output values to `outputs`), store
// writes dxrow[offset + k].
template <typename out_t, typename in_t, int kVec>
struct BackwardEdges {
  EdgeElements<out_t, kVec> dy, y;
  in_t* dxrow;
  int offset;
  FASTACT_DEVICE BackwardEdges(const out_t* __restrict__ dyrow, const out_t* __restrict__ yrow, in_t* dxrow_,
                               const RowEdges& ed)
      : dy(dyrow, ed), y(yrow, ed), dxrow(dxrow_), offset(ed.offset) {}

  template <typename Epi, typename A>
  FASTACT_DEVICE void add_terms(const Epi& epi, A& dot, LoadDependence& outputs) const {
#pragma unroll
    for (int k = 0; k < dy.kMax; ++k) {
      if (k < dy.count) {
        dot += epi.backward_term(dy.template value<A>(k), y.template value<A>(k));
        if constexpr (output_loads_with_reduction<Epi, out_t>()) outputs.take(y.e[k]);
      }
    }
  }
  template <typename Epi, typename A>
  FASTACT_DEVICE void store(const Epi& epi, A dot) const {
#pragma unroll
    for (int k = 0; k < dy.kMax; ++k) {
      if (k < dy.count)
        store_element(dxrow + offset + k, epi.backward(dy.template value<A>(k), y.template value<A>(k), dot));
    }
  }
};

// The forward of one cached row, given this thread's units v (j < s.nvalid, j < kVecs) as A and the
// rest of its slice, if any, through `extra`: its max, its kept values and their sum -> one all-reduce
// of the (max, sum) pairs over the row (OnlineOp) -> the outputs at yr + j * step (yr: this thread's
// unit 0; written through `stores`: PlainStores, or WarpPairedStores), rescaled to the row's max
// (ForwardCache::factor). kVecs may be 0 (v: one unused unit) when `extra` holds the whole slice. `group`:
// the row's CTAs, as row_allreduce takes them (int: the cluster size; GridExchange: CTAs anywhere on the device).
template <typename Epi, int kVec, int kVecs, typename Extra = NoExtraUnits, typename Stores = PlainStores<kVec>,
          typename A, typename out_t, typename Group>
FASTACT_DEVICE void resident_forward(A (&v)[kVecs > 0 ? kVecs : 1][kVec], const ResidentSlice& s,
                                     out_t* __restrict__ yr, const Epi& epi, RowScratch<MaxSum<A>>& scratch,
                                     int& round, const Group& group, const Extra& extra = Extra(),
                                     const Stores& stores = Stores()) {
  using Cache = ForwardCache<Epi>;
  A m = neg_inf<A>();
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < s.nvalid) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) m = MaxOp<A>()(m, v[j][k]);
    }
  }
  extra.fold_max(m, s);
  const A base = max_base(m);
  A sum = A(0);
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < s.nvalid) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        v[j][k] = Cache::keep(v[j][k], base);
        sum += Cache::term(v[j][k], base);
      }
    }
  }
  extra.add_terms(sum, base, s);
  const MaxSum<A> row_stats = row_allreduce(MaxSum<A>{m, sum}, OnlineOp<A>(), scratch, round, group);
  if (row_gave_up(group)) return;  // grid.cuh: the launch's last CTA writes this slice
  const A c = epi.row_constant(row_stats.sum);
  const A f = Cache::factor(m, row_stats.max, c);
  const auto writer = stores.at(s);
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < s.nvalid) {
      A o[kVec];
#pragma unroll
      for (int k = 0; k < kVec; ++k) o[k] = Cache::out(epi, v[j][k], row_stats.max, f);
      writer.store(yr + j * s.step, j, from_acc<out_t>(o));
    }
  }
  extra.store(epi, row_stats.max, c, yr, s, writer);
}

// This thread's units j < s.nvalid of one row of grad_output and output, as loaded: dy[j] and yv[j]
// from dyr + j * s.step and yr + j * s.step (dyr, yr: the thread's unit 0).
template <int kVec, int kVecs, typename out_t>
FASTACT_DEVICE void load_backward_units(const out_t* __restrict__ dyr, const out_t* __restrict__ yr,
                                        const ResidentSlice& s, AlignedVector<out_t, kVec> (&dy)[kVecs],
                                        AlignedVector<out_t, kVec> (&yv)[kVecs]) {
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < s.nvalid) {
      dy[j] = load_vector<out_t, kVec>(dyr + j * s.step);
      yv[j] = load_vector<out_t, kVec>(yr + j * s.step);
    }
  }
}

// The backward of one cached row, given this thread's units of grad_output and output as loaded:
// the sum of the epilogue's backward term over the row (all-reduce), then grad_input at
// dxr + j * step (dxr: this thread's unit 0).
// `extra` as resident_forward's: the rest of the thread's part of the row (NoExtraGrads: none);
// `group` as resident_forward's; `zero`: opaque_zero (common.cuh) of the row length.
template <typename Epi, int kVec, int kVecs, typename A, typename Extra = NoExtraGrads, typename out_t, typename in_t,
          typename Group>
FASTACT_DEVICE void resident_backward(const AlignedVector<out_t, kVec> (&dy)[kVecs],
                                      const AlignedVector<out_t, kVec> (&yv)[kVecs], const ResidentSlice& s,
                                      unsigned zero, in_t* __restrict__ dxr, const Epi& epi, RowScratch<A>& scratch,
                                      int& round, const Group& group, const Extra& extra = Extra()) {
  A dot = A(0);
  LoadDependence outputs{zero};  // where output_loads_with_reduction: the output's loads with grad_output's
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < s.nvalid) {
      A g[kVec], o[kVec];
      to_acc(dy[j], g);
      to_acc(yv[j], o);
#pragma unroll
      for (int k = 0; k < kVec; ++k) dot += epi.backward_term(g[k], o[k]);
      if constexpr (output_loads_with_reduction<Epi, out_t>()) outputs.take(yv[j]);
    }
  }
  extra.add_terms(epi, dot, outputs);
  dot = outputs.apply(dot);
  dot = row_allreduce(dot, SumOp<A>(), scratch, round, group);
  if (row_gave_up(group)) return;  // grid.cuh: the launch's last CTA writes this slice
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < s.nvalid) {
      A g[kVec], o[kVec];
      to_acc(dy[j], g);
      to_acc(yv[j], o);
#pragma unroll
      for (int k = 0; k < kVec; ++k) g[k] = epi.backward(g[k], o[k], dot);
      store_vector<in_t, kVec>(dxr + j * s.step, from_acc<in_t>(g));
    }
  }
  extra.store(epi, dot);
}

// `extra` with this thread's edge elements (ForwardEdges) added when kEdges: the rest of its slice for
// resident_forward. xrow, yrow: the row's first element in x and y.
template <bool kEdges, typename Epi, int kVec, typename Extra, typename in_t, typename out_t>
FASTACT_DEVICE auto with_edges(const Extra& extra, const in_t* __restrict__ xrow, out_t* yrow, const RowEdges& ed) {
  if constexpr (kEdges) {
    using Edges = ForwardEdges<Epi, in_t, out_t, kVec>;
    return BothExtras<Extra, Edges>{extra, Edges(xrow, yrow, ed)};
  } else {
    return extra;
  }
}

// kShift's loads. The input row at xrow starts `sh` elements (0 <= sh < kVec) past the aligned chunk
// chunk0 = xrow - sh; unit u of the row (elements [u * kVec, (u + 1) * kVec), where the output's unit u
// is) is the upper kVec - sh elements of chunk u (at chunk0 + u * kVec) and the lower sh of chunk u + 1.
// One CTA a row (no cluster): its units are u = j * T + t, consecutive. Phase 1 (stage): the chunks of the
// units and one more, those that hold elements of the row (e < D + sh), go to shared memory, chunk u to
// stage[u] (cp.async: all of them in flight at once, no registers held); chunks that reach past either end
// of the tensor's elements [lo, lo + n) (rows at least a chunk apart: only row 0's first and the last row's
// last can; every chunk is checked) element by element (copy_async_16_within), their elements outside
// unwritten and never used; then one block barrier (thread t reads chunk u + 1, which
// thread t + 1 copied). Phase 2 (unit): unit u from stage[u] and stage[u + 1] by funnel shifts. Why staged:
// in registers, chunk u + 1 came from the next lane by a shuffle, and lane 31 loaded its own; with each
// shuffle after its load, a thread had one load in flight (bf16 [32768, 4096] rows at stride 4097: 0.77 of
// the limit, aligned rows 0.99), with all loads first the chunks held twice the registers and ran at 0.60.
template <typename T, int kVec>
struct ShiftedRow {
  static_assert(sizeof(T) == 2 && kVec == 8, "16-bit elements, 16-byte chunks");
  using Unit = AlignedVector<T, kVec>;
  const T* chunk0;
  const T* lo;  // the tensor's elements: [lo, lo + n)
  int64_t n;
  int dim;  // D (in-row offsets fit in int: the host caps a cached row at 16 x 512 x 128 elements (2^20))
  int sh;

  FASTACT_DEVICE ShiftedRow(const T* xrow, const T* lo_, int64_t n_, int64_t dim_)
      : lo(lo_), n(n_), dim(static_cast<int>(dim_)) {
    sh = static_cast<int>((reinterpret_cast<uintptr_t>(xrow) % (kVec * sizeof(T))) / sizeof(T));
    chunk0 = xrow - sh;
  }
  // Phase 1: chunks c < count of the row to stage[c]; every thread of the block calls it.
  FASTACT_DEVICE void stage_chunks(Unit* stage, int count) const {
    for (int c = static_cast<int>(threadIdx.x); c < count; c += static_cast<int>(blockDim.x)) {
      const int e = c * kVec;
      if (e >= dim + sh) break;  // this thread's later chunks are further on
      copy_async_16_within(chunk0 + e, lo, n, stage[c].val);
    }
    copy_async_commit();
    copy_async_wait<0>();
    __syncthreads();
  }
  // Phase 2: unit c of the row (c < D / kVec), from stage[c] and stage[c + 1].
  FASTACT_DEVICE Unit unit(const Unit* stage, int c) const {
    uint32_t w[8];
    memcpy(w, stage + c, 16);
    if (sh > 0) {
      memcpy(w + 4, stage + c + 1, 16);
    } else {
#pragma unroll
      for (int i = 4; i < 8; ++i) w[i] = 0u;
    }
    // Word i of the unit: elements 2i + sh and 2i + 1 + sh of the two chunks, words i + sh / 2 and the next,
    // shifted by half a word when sh is odd. sh is the same in the whole row: a uniform branch. (A switch rather
    // than w[i + sh / 2]: a runtime index into a register array makes nvcc place it in local memory.)
    const unsigned f = (sh & 1) * 16u;
    uint32_t o[4];
    switch (sh >> 1) {
      case 0:
#pragma unroll
        for (int i = 0; i < 4; ++i) o[i] = __funnelshift_r(w[i], w[i + 1], f);
        break;
      case 1:
#pragma unroll
        for (int i = 0; i < 4; ++i) o[i] = __funnelshift_r(w[i + 1], w[i + 2], f);
        break;
      case 2:
#pragma unroll
        for (int i = 0; i < 4; ++i) o[i] = __funnelshift_r(w[i + 2], w[i + 3], f);
        break;
      default:
#pragma unroll
        for (int i = 0; i < 4; ++i) o[i] = __funnelshift_r(w[i + 3], w[i + 4], f);
        break;
    }
    Unit u;
    memcpy(&u, o, 16);
    return u;
  }
};

// The dynamic shared memory of block.cuh's kernels (the shifted forward's stage).
FASTACT_DEVICE unsigned char* block_smem_bytes() {
  extern __shared__ __align__(16) unsigned char block_smem[];
  return block_smem;
}

// Bytes of that stage for `threads` threads of kVecs units each: their chunks and one more.
template <int kVecs>
constexpr size_t shifted_stage_bytes(int threads) {
  return (size_t(kVecs) * size_t(threads) + 1) * 16;
}

// x: rows of D elements, row r at x + r * row_stride; y: [rows, D] dense. Row first_row +
// blockIdx.x / cluster (of `rows` in the whole call: launch_items may split it). kEdges: rows off the alignment
// (RowEdges), the body in units. kRaw: the slice cached as loaded (RegisterUnits; dispatch.h
// softmax_resident_raw), else converted to A. kShift: x's rows off the alignment, each by its own amount
// (ShiftedRow), y aligned.
template <typename in_t, typename out_t, typename Epi, int kVec, bool kEdges = false, bool kRaw = false,
          bool kShift = false>
__global__ __launch_bounds__(kResidentMaxThreads, 1) void softmax_block_fwd_kernel(const in_t* __restrict__ x,
                                                                                   out_t* __restrict__ y, int64_t dim,
                                                                                   int64_t row_stride, int cluster,
                                                                                   Epi epi, int64_t rows,
                                                                                   int64_t first_row) {
  using A = acc_t<out_t>;
  constexpr int kElems = kRaw ? softmax_resident_raw_elems(sizeof(in_t)) : block_fwd_elems<out_t, kVec>();
  constexpr int kVecs = kElems / kVec;
  static_assert(kVecs >= 1 && kElems % kVec == 0, "whole accesses per thread");
  static_assert(!kEdges || kVec > 1, "edges only around 128-bit units");
  static_assert(!kRaw || softmax_resident_raw(false, kVec, sizeof(in_t), sizeof(A)), "raw: 16-bit units, float");
  static_assert(!kShift || (!kEdges && !kRaw), "shifted rows: units of y, converted");
  __shared__ RowScratch<MaxSum<A>> scratch;
  exchange_init(scratch.bar, cluster);
  RowEdges ed{0, 0, 0, 0};
  if constexpr (kEdges) ed = row_edges<kVec>(first_row + blockIdx.x / cluster, dim, cluster);
  const ResidentSlice s = resident_slice<kVec, kVecs>(kEdges ? ed.body : dim, cluster);
  const int64_t row = first_row + blockIdx.x / cluster;
  const in_t* xrow = x + row * row_stride;
  out_t* yrow = y + row * dim;
  const in_t* xr = xrow + (ed.head + s.first);
  out_t* yr = yrow + (ed.head + s.first);
  int round = 0;
  if constexpr (kRaw) {
    RegisterUnits<Epi, in_t, kVec, kVecs> units;
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (j < s.nvalid) units.r[j] = load_vector<in_t, kVec>(xr + j * s.step);
    }
    A none[1][kVec];  // no converted units: all of the slice is in `units`
    resident_forward<Epi, kVec, 0>(none, s, yr, epi, scratch, round, cluster,
                                   with_edges<kEdges, Epi, kVec>(units, xrow, yrow, ed),
                                   forward_stores<in_t, out_t, kVec, kVecs, kEdges>(dim));
  } else {
    A v[kVecs][kVec];
    if constexpr (kShift) {
      // One CTA a row (cluster 1): unit j of thread t is unit j * T + t of the row.
      const ShiftedRow<in_t, kVec> shifted(xrow, x, (rows - 1) * row_stride + dim, dim);
      auto* const stage = reinterpret_cast<AlignedVector<in_t, kVec>*>(block_smem_bytes());
      const int nthreads = static_cast<int>(blockDim.x);
      shifted.stage_chunks(stage, kVecs * nthreads + 1);
#pragma unroll
      for (int j = 0; j < kVecs; ++j) {
        if (j < s.nvalid) to_acc(shifted.unit(stage, j * nthreads + static_cast<int>(threadIdx.x)), v[j]);
      }
    } else {
#pragma unroll
      for (int j = 0; j < kVecs; ++j) {
        if (j < s.nvalid) to_acc(load_vector<in_t, kVec>(xr + j * s.step), v[j]);
      }
    }
    resident_forward<Epi, kVec, kVecs>(v, s, yr, epi, scratch, round, cluster,
                                       with_edges<kEdges, Epi, kVec>(NoExtraUnits{}, xrow, yrow, ed),
                                       forward_stores<in_t, out_t, kVec, kVecs, kEdges>(dim));
  }
}

// grad_output, output: [rows, D] dense (out_t); grad_input: [rows, D] dense (in_t). Caches
// grad_output and output as loaded (raw element type) and converts on use. kEdges as the forward's.
// kUnits > 0: the register cache holds that many units a thread (plan.one_unit: 1), not the longest row's.
template <typename in_t, typename out_t, typename Epi, int kVec, bool kEdges = false, int kUnits = 0>
__global__ __launch_bounds__(kResidentMaxThreads, 1) void softmax_block_bwd_kernel(
    const out_t* __restrict__ grad_output, const out_t* __restrict__ output, in_t* __restrict__ grad_input,
    int64_t dim, int cluster, Epi epi, int64_t first_row) {
  using A = acc_t<out_t>;
  constexpr int kElems = kUnits > 0 ? kUnits * kVec : block_bwd_elems<out_t, kVec>();
  constexpr int kVecs = kElems / kVec;
  static_assert(kVecs >= 1 && kElems % kVec == 0, "whole accesses per thread");
  static_assert(!kEdges || kVec > 1, "edges only around 128-bit units");
  __shared__ RowScratch<A> scratch;
  exchange_init(scratch.bar, cluster);
  RowEdges ed{0, 0, 0, 0};
  if constexpr (kEdges) ed = row_edges<kVec>(first_row + blockIdx.x / cluster, dim, cluster);
  const ResidentSlice s = resident_slice<kVec, kVecs>(kEdges ? ed.body : dim, cluster);
  const int64_t row = first_row + blockIdx.x / cluster;
  const int64_t offset = row * dim + (ed.head + s.first);
  int round = 0;
  AlignedVector<out_t, kVec> dy[kVecs], yv[kVecs];
  load_backward_units<kVec>(grad_output + offset, output + offset, s, dy, yv);
  if constexpr (kEdges) {
    const int64_t r0 = row * dim;
    resident_backward<Epi, kVec, kVecs, A>(
        dy, yv, s, opaque_zero(dim), grad_input + offset, epi, scratch, round, cluster,
        BackwardEdges<out_t, in_t, kVec>(grad_output + r0, output + r0, grad_input + r0, ed));
  } else {
    resident_backward<Epi, kVec, kVecs, A>(dy, yv, s, opaque_zero(dim), grad_input + offset, epi, scratch, round,
                                           cluster);
  }
}

// The backward of a row in two passes (plan.two_pass; dispatch.h row two-pass says where and why): pass 1 loads the
// thread's units of grad_output and output with an evict_last policy and sums the term (softmax's, which reads both:
// the only epilogue the rule takes); the row's all-reduce; pass 2 loads grad_output and output again with
// evict_first (from L1 or L2) and writes grad_input. Nothing loaded is live across the all-reduce. One CTA a row,
// aligned rows of whole units, the units j * T + t of the resident kernels, summed in their order (at the same
// threads, bitwise softmax_block_bwd_kernel's result). kVecs: the units a thread moves in each pass
// (dispatch.h plan_block: 1 or 2), compiled for exactly those (ptxas, sm_90: 24 and 32 registers, two 1024-thread
// CTAs an SM).
template <typename in_t, typename out_t, typename Epi, int kVec, int kVecs>
__global__ __launch_bounds__(kResidentMaxThreads, 1) void softmax_block_bwd_two_pass_kernel(
    const out_t* __restrict__ grad_output, const out_t* __restrict__ output, in_t* __restrict__ grad_input,
    int64_t dim, Epi epi, int64_t first_row) {
  using A = acc_t<out_t>;
  static_assert(kVec > 1 && kVecs >= 1 && kVecs <= 2, "128-bit units, one or two a thread");
  static_assert(Epi::kTermUsesOutput, "softmax's backward (log_softmax's stays resident)");
  __shared__ RowScratch<A> scratch;
  exchange_init(scratch.bar, 1);
  const ResidentSlice s = resident_slice<kVec, kVecs>(dim, 1);
  const int64_t offset = (first_row + blockIdx.x) * dim + s.first;
  const out_t* dyr = grad_output + offset;
  const out_t* yr = output + offset;
  // Each pass issues all of its loads before it uses any. With each unit's loads next to their uses, ptxas kept
  // one unit's loads in flight at a time: at 1024 threads x 4 units (H100, bf16 [4096, 32768], a diag build of this
  // kernel) 293.2 us, 270.8 in one wave.
  AlignedVector<out_t, kVec> gv[kVecs], ov[kVecs];
  int round = 0;
  A dot = A(0);
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < s.nvalid) {
      gv[j] = load_vector_evict<Evict::kLast, out_t, kVec>(dyr + j * s.step);
      ov[j] = load_vector_evict<Evict::kLast, out_t, kVec>(yr + j * s.step);
    }
  }
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < s.nvalid) {
      A g[kVec], o[kVec];
      to_acc(gv[j], g);
      to_acc(ov[j], o);
#pragma unroll
      for (int k = 0; k < kVec; ++k) dot += epi.backward_term(g[k], o[k]);
    }
  }
  dot = row_allreduce(dot, SumOp<A>(), scratch, round, 1);
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < s.nvalid) {
      gv[j] = load_vector_evict<Evict::kFirst, out_t, kVec>(dyr + j * s.step);
      ov[j] = load_vector_evict<Evict::kFirst, out_t, kVec>(yr + j * s.step);
    }
  }
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (j < s.nvalid) {
      A g[kVec], o[kVec];
      to_acc(gv[j], g);
      to_acc(ov[j], o);
#pragma unroll
      for (int k = 0; k < kVec; ++k) g[k] = epi.backward(g[k], o[k], dot);
      store_vector<in_t, kVec>(grad_input + offset + j * s.step, from_acc<in_t>(g));
    }
  }
}

namespace detail {

// One row per CTA (cluster == 1) or per cluster; `threads` and `cluster` from the plan.
// `edges`: rows off the alignment (RowEdges; the caller checked the pointers and the row stride).
// Two threads of the last CTA own the edges, so a block has at least two.
// The forward kernel for (kEdges, kRaw, kShift); combinations its types cannot run are configuration errors
// (and are not instantiated).
template <typename in_t, typename out_t, typename Epi, int kVec, bool kEdges, bool kRaw, bool kShift = false>
cudaError_t launch_block_forward(const in_t* x, out_t* y, int64_t rows, int64_t dim, int64_t row_stride, int threads,
                                 int cluster, cudaStream_t stream) {
  if constexpr ((kEdges && kVec == 1) ||
                (kRaw && !softmax_resident_raw(false, kVec, sizeof(in_t), sizeof(acc_t<out_t>))) ||
                (kShift && !softmax_rows_shift_supported(kVec, sizeof(in_t), sizeof(out_t)))) {
    return cudaErrorInvalidConfiguration;
  } else {
    constexpr auto kKernel = softmax_block_fwd_kernel<in_t, out_t, Epi, kVec, kEdges, kRaw, kShift>;
    size_t smem = 0;
    if constexpr (kShift) {
      constexpr int kVecs = block_fwd_elems<out_t, kVec>() / kVec;
      constexpr int kMaxSmem = int(shifted_stage_bytes<kVecs>(kResidentMaxThreads));
      const cudaError_t err = kernel_attribute_once<kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem>();
      if (err != cudaSuccess) return err;
      smem = shifted_stage_bytes<kVecs>(threads);
    }
    return launch_items<kKernel>(rows, threads, smem, cluster, stream, x, y, dim, row_stride, cluster, Epi{}, rows);
  }
}

// `raw`: the slice cached as loaded (long_row's clusters, where dispatch.h's softmax_resident_raw holds).
// `shifted`: vec's rows realigned (plan.shifted: dispatch.h softmax_rows_shift_vectorizable; the caller checked
// y's alignment): one row per CTA, whole units of y.
template <typename in_t, typename out_t, typename Epi, int kVec>
cudaError_t block_forward(const in_t* x, out_t* y, int64_t rows, int64_t dim, int64_t row_stride, int threads,
                          int cluster, bool edges, bool raw, bool shifted, cudaStream_t stream) {
  const int elems = raw ? softmax_resident_raw_elems(sizeof(in_t)) : block_fwd_elems<out_t, kVec>();
  if (threads <= 0 || threads > kResidentMaxThreads || threads % kWarpSize != 0 || cluster < 1 ||
      cluster > kMaxCluster || int64_t(cluster) * threads * elems < dim)
    return cudaErrorInvalidConfiguration;
  if (shifted) {
    if (cluster != 1 || edges || raw || dim % kVec != 0) return cudaErrorInvalidConfiguration;
    return launch_block_forward<in_t, out_t, Epi, kVec, false, false, true>(x, y, rows, dim, row_stride, threads, 1,
                                                                            stream);
  }
  if (edges) {
    return raw ? launch_block_forward<in_t, out_t, Epi, kVec, true, true>(x, y, rows, dim, row_stride, threads,
                                                                          cluster, stream)
               : launch_block_forward<in_t, out_t, Epi, kVec, true, false>(x, y, rows, dim, row_stride, threads,
                                                                           cluster, stream);
  }
  return raw ? launch_block_forward<in_t, out_t, Epi, kVec, false, true>(x, y, rows, dim, row_stride, threads, cluster,
                                                                         stream)
             : launch_block_forward<in_t, out_t, Epi, kVec, false, false>(x, y, rows, dim, row_stride, threads,
                                                                          cluster, stream);
}

// `two_pass`: softmax_block_bwd_two_pass_kernel (plan.two_pass): one CTA a row, aligned rows of whole units, one a
// thread where `threads` cover the row so, else two. `one_unit` (plan.one_unit): softmax_block_bwd_kernel sized for one
// unit a thread, one CTA a row of at most `threads` units.
template <typename in_t, typename out_t, typename Epi, int kVec>
cudaError_t block_backward(const out_t* dy, const out_t* y, in_t* dx, int64_t rows, int64_t dim, int threads,
                           int cluster, bool edges, cudaStream_t stream, bool two_pass = false, bool one_unit = false) {
  if (threads <= 0 || threads > kResidentMaxThreads || threads % kWarpSize != 0 || cluster < 1 ||
      cluster > kMaxCluster || int64_t(cluster) * threads * block_bwd_elems<out_t, kVec>() < dim)
    return cudaErrorInvalidConfiguration;
  if (two_pass) {  // compiled only for the backwards of dispatch.h row two-pass
    if constexpr (kVec > 1 && sizeof(in_t) == 2 && sizeof(out_t) == 2 && Epi::kTermUsesOutput) {
      if (cluster != 1 || edges || dim % kVec != 0 || int64_t(threads) * 2 * kVec < dim)
        return cudaErrorInvalidConfiguration;
      if (int64_t(threads) * kVec >= dim)
        return launch_items<softmax_block_bwd_two_pass_kernel<in_t, out_t, Epi, kVec, 1>>(rows, threads, 0, 1, stream,
                                                                                          dy, y, dx, dim, Epi{});
      return launch_items<softmax_block_bwd_two_pass_kernel<in_t, out_t, Epi, kVec, 2>>(rows, threads, 0, 1, stream, dy,
                                                                                        y, dx, dim, Epi{});
    }
    return cudaErrorInvalidConfiguration;
  }
  if (one_unit) {  // compiled only for the backwards of dispatch.h row vec-one-unit
    if constexpr (kVec > 1 && sizeof(in_t) == 2 && sizeof(out_t) == 2) {
      if (cluster != 1 || edges || dim % kVec != 0 || int64_t(threads) * kVec < dim) return cudaErrorInvalidConfiguration;
      return launch_items<softmax_block_bwd_kernel<in_t, out_t, Epi, kVec, false, 1>>(rows, threads, 0, 1, stream, dy,
                                                                                      y, dx, dim, 1, Epi{});
    }
    return cudaErrorInvalidConfiguration;
  }
  if (edges) {
    if constexpr (kVec > 1) {
      return launch_items<softmax_block_bwd_kernel<in_t, out_t, Epi, kVec, true>>(rows, threads, 0, cluster, stream,
                                                                                  dy, y, dx, dim, cluster, Epi{});
    }
    return cudaErrorInvalidConfiguration;
  }
  return launch_items<softmax_block_bwd_kernel<in_t, out_t, Epi, kVec>>(rows, threads, 0, cluster, stream, dy, y, dx,
                                                                        dim, cluster, Epi{});
}

}  // namespace detail
}  // namespace fastact::softmax_impl
