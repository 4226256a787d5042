// The CPU kernels of softmax and log_softmax, forward and backward: rows over the last dim (short
// rows turned into lanes, rows of 24-128 in blocks for log_softmax, long rows streamed), strided
// dims (column runs, lane groups across slabs) and the fused casts from / to float of the 16-bit
// types. Compiled once per instruction set, inside `namespace CPU_CAPABILITY` (csrc/cpu/vec_io.h
// has the scheme and its ODR rules); kernels.cpp puts the entry points at the end in the table.

#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "cpu/vec_io.h"
#include "cpu/vec_math.h"

namespace fastact::cpu {
namespace CPU_CAPABILITY {
namespace {

// ---------------------------------------------------------------------------------------------
// Softmax and log_softmax. Per row (or column, when inner > 1): m = max, s = sum(exp(x - m)),
// c = epilogue.row_constant(s), then y = epilogue.forward(x, m, c) (math::SoftmaxEpilogue,
// math::LogSoftmaxEpilogue). Softmax keeps exp(x - m) from the sum pass (in y when y is of the acc
// type, else in a per-chunk float scratch row) and scales it; log_softmax recomputes x - m - c.
// Rows whose max is not finite (a NaN, a +inf, or all -inf) are NaN throughout, as in torch; every
// other row has x - m in [-inf, 0], exp_nonpos's domain.

template <bool kLog>
using Epilogue = std::conditional_t<kLog, math::LogSoftmaxEpilogue, math::SoftmaxEpilogue>;

// Rows shorter than a vector pair (D < 2 kV; which of them: softmax_rows_turned): kV rows at a time, turned through a
// buffer [D][kV] so that a lane holds a row. The max, the exps, the sum and the outputs are then lane-wise vector ops
// over D (a row of 10 floats costs a tenth of a vector exp, not 10 scalar exps and two horizontal reductions).
// Why (a 2-core AVX2 VM, 8 MB f32, ms, torch in brackets): rows of 10 21.1 (6.0) with scalar tails,
// 9.7 (4.7) with a padded vector pair a row, both slower than turning the rows.

// The blocks of kV rows of those kernels: f(r0, nr) for rows [r0, r0 + nr), split over threads.
template <typename F>
void for_row_blocks(int64_t rows, int64_t D, int64_t kV, const F& f) {
  parallel_for(ceil_div(rows, kV), std::max<int64_t>(1, kGrain / (D * kV)), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) f(b * kV, std::min(kV, rows - b * kV));
  });
}
// nr rows of D elements, row l at p + l * stride, turned into buf[d * kV + l]; the lanes past nr zeros
// (computed and dropped). And back: buf's first nr lanes to nr dense rows at p.
template <typename A, typename T>
void turn_rows_in(const T* p, int64_t stride, int64_t nr, int64_t D, int64_t kV, A* buf) {
  for (int64_t l = 0; l < kV; ++l)
    for (int64_t d = 0; d < D; ++d) buf[d * kV + l] = l < nr ? A(to_acc(p[l * stride + d])) : A(0);
}
template <typename A, typename T>
void turn_rows_out(const A* buf, int64_t nr, int64_t D, int64_t kV, T* p) {
  for (int64_t l = 0; l < nr; ++l)
    for (int64_t d = 0; d < D; ++d) p[l * D + d] = from_acc<T>(buf[d * kV + l]);
}

// The forward of those rows.
template <typename In, typename Out, bool kLog>
void softmax_short_rows_fwd(const In* x, Out* y, const SoftmaxShape& shape) {
  using IO = Io<In>;
  using A = typename IO::A;
  using V = typename IO::V;
  constexpr int64_t kV = IO::kV;
  const int64_t D = shape.dim_size;
  for_row_blocks(shape.outer, D, kV, [&](int64_t r0, int64_t nr) {
    alignas(64) A buf[2 * kV * kV];  // [d][lane]
    turn_rows_in(x + r0 * shape.row_stride, shape.row_stride, nr, D, kV, buf);
    V m(-std::numeric_limits<A>::infinity());
    for (int64_t d = 0; d < D; ++d) m = at::vec::maximum(m, V::loadu(buf + d * kV));
    V s(A(0));
    for (int64_t d = 0; d < D; ++d) {
      const V e = exp_nonpos(V::loadu(buf + d * kV) - m);  // lanes with a non-finite max: masked below
      s = s + e;
      if constexpr (!kLog) e.store(buf + d * kV);
    }
    const V c = nan_unless_finite(m, kLog ? s.log() : V(A(1)) / s);  // torch's NaN rows
    for (int64_t d = 0; d < D; ++d) {
      const V v = V::loadu(buf + d * kV);
      (kLog ? (v - m) - c : v * c).store(buf + d * kV);
    }
    turn_rows_out(buf, nr, D, kV, y + r0 * D);
  });
}

// A row's max (NaN where it holds a NaN): vector pairs, then the tail as two padded vectors (the padding -inf) or
// element by element. Pass 1 of softmax_lastdim_fwd and log_softmax_blocked_fwd.
template <typename In>
typename Io<In>::A row_max(const In* xr, int64_t D) {
  using IO = Io<In>;
  using A = typename IO::A;
  using V = typename IO::V;
  constexpr int64_t kStep = 2 * IO::kV;
  int64_t i = 0;
  V vm0(-std::numeric_limits<A>::infinity()), vm1 = vm0;
  for (; i + kStep <= D; i += kStep) {
    V a, b;
    IO::load2_lanes(xr + i, a, b);  // a maximum: any order
    vm0 = at::vec::maximum(vm0, a);
    vm1 = at::vec::maximum(vm1, b);
  }
  if (D - i > kPaddedTailFwd) {
    V a, b;
    load2_tail(xr + i, D - i, -std::numeric_limits<A>::infinity(), a, b);
    vm0 = at::vec::maximum(vm0, a);
    vm1 = at::vec::maximum(vm1, b);
    i = D;
  }
  A m = hmax(at::vec::maximum(vm0, vm1));
  for (; i < D; ++i) m = max_nan(m, to_acc(xr[i]));
  return m;
}

// log_softmax's output row: y = x - m - c, vector pairs, then the tail as two padded vectors or element by element.
// The last pass of softmax_lastdim_fwd<kLog> and log_softmax_blocked_fwd.
template <typename In, typename Out>
void log_softmax_row_out(const In* xr, Out* yr, int64_t D, typename Io<In>::A m, typename Io<In>::A c) {
  using IO = Io<In>;
  using A = typename IO::A;
  using V = typename IO::V;
  constexpr int64_t kStep = 2 * IO::kV;
  constexpr bool kLanes = std::is_same_v<In, Out>;  // lane order (Io::load2_lanes) where x and y are of one type
  const V vmax(m), vc(c);
  int64_t i = 0;
  for (; i + kStep <= D; i += kStep) {
    V a, b;
    load2_in<kLanes>(xr + i, a, b);
    store2_in<kLanes>(yr + i, (a - vmax) - vc, (b - vmax) - vc);
  }
  if (D - i > kPaddedTailFwd) {
    V a, b;
    load2_tail(xr + i, D - i, A(0), a, b);
    store2_tail(yr + i, D - i, (a - vmax) - vc, (b - vmax) - vc);
    i = D;
  }
  for (; i < D; ++i) yr[i] = from_acc<Out>(math::LogSoftmaxEpilogue{}.forward(to_acc(xr[i]), m, c));
}

// Softmax over dim_size for inner == 1: rows of D elements, x row r at x + r * row_stride,
// y dense.
template <typename In, typename Out, bool kLog>
void softmax_lastdim_fwd(const In* x, Out* y, const SoftmaxShape& shape) {
  using IO = Io<In>;
  using OO = Io<Out>;
  using A = typename IO::A;
  using V = typename IO::V;
  static_assert(std::is_same_v<A, typename OO::A>);
  constexpr int64_t kV = IO::kV, kStep = 2 * kV;
  constexpr bool kExpInY = std::is_same_v<Out, A>;  // exp(x - m) parked in y itself
  constexpr bool kScratch = !kLog && !kExpInY;
  // Pass 2 loads x's pairs in lane order (Io::load2_lanes) where x and y are of one type, and pass 3 stores y's in
  // it: the exps between them keep that order (in y itself only for float and double, where it is element order).
  constexpr bool kLanes = std::is_same_v<In, Out>;
  const Epilogue<kLog> epi;
  const int64_t D = shape.dim_size;

  parallel_for(shape.outer, std::max<int64_t>(1, kGrain / D), [&](int64_t r0, int64_t r1) {
    std::unique_ptr<A[]> scratch(kScratch ? new A[D] : nullptr);
    for (int64_t r = r0; r < r1; ++r) {
      const In* xr = x + r * shape.row_stride;
      Out* yr = y + r * D;

      // Pass 1: the max.
      const A m = row_max(xr, D);
      if (!std::isfinite(m)) {
        std::fill(yr, yr + D, Out(std::numeric_limits<A>::quiet_NaN()));
        continue;
      }

      // Pass 2: s = sum(exp(x - m)), softmax keeping the exps.
      A* e = nullptr;
      if constexpr (!kLog) e = kExpInY ? reinterpret_cast<A*>(yr) : scratch.get();
      const V vmax(m);
      const int64_t vec_end = D - D % kStep;
      int64_t i = 0;
      V total(A(0));
      for (int64_t blk = 0; blk < vec_end; blk += kSumBlock) {
        const int64_t blk_end = std::min(blk + kSumBlock, vec_end);
        V s0(A(0)), s1(A(0));
        for (i = blk; i < blk_end; i += kStep) {
          V a, b;
          load2_in<kLanes>(xr + i, a, b);
          a = exp_nonpos(a - vmax);
          b = exp_nonpos(b - vmax);
          s0 = s0 + a;
          s1 = s1 + b;
          if constexpr (!kLog) {
            a.store(e + i);
            b.store(e + i + kV);
          }
        }
        total = total + (s0 + s1);
      }
      const int64_t tail = D - vec_end;
      A s;
      if (tail > kPaddedTailFwd) {  // the padding's exps are 0
        V a, b;
        load2_tail(xr + vec_end, tail, -std::numeric_limits<A>::infinity(), a, b);
        a = exp_nonpos(a - vmax);
        b = tail > kV ? exp_nonpos(b - vmax) : V(A(0));
        s = hsum(total + (a + b));
        if constexpr (!kLog) store2_tail(e + vec_end, tail, a, b);
      } else {
        s = hsum(total);
        for (i = vec_end; i < D; ++i) {
          const A t = math::exp_(to_acc(xr[i]) - m);
          s += t;
          if constexpr (!kLog) e[i] = t;
        }
      }
      const A c = epi.row_constant(s);

      // Pass 3: y.
      if constexpr (kLog) {
        log_softmax_row_out(xr, yr, D, m, c);
      } else {
        const V vc(c);
        for (i = 0; i < vec_end; i += kStep)  // e's pairs in the order pass 2 loaded x in
          store2_in<kLanes>(yr + i, V::loadu(e + i) * vc, V::loadu(e + i + kV) * vc);
        if (D - i > kPaddedTailFwd) {  // the tail as two padded vectors, as the body
          V a, b;
          load2_tail(e + i, D - i, A(0), a, b);
          store2_tail(yr + i, D - i, a * vc, b * vc);
          i = D;
        }
        for (; i < D; ++i) yr[i] = from_acc<Out>(e[i] * c);  // the tail: softmax from its kept exps, as the body
      }
    }
  });
}

// log_softmax over rows of kLogBlockedMinDim..kLogBlockedMaxDim floats (AVX512, inner == 1): rows in blocks, each
// pass one loop over the block's rows, as torch's log_softmax does. One row at a time, a short row is a chain of
// dependent steps (horizontal max, exp, horizontal sum, logf, output) longer than the row's own work, and the
// out-of-order window holds little more than one row's instructions, so the rows hardly overlap; within a pass the
// block's rows are independent. log(sum) is taken kV rows at a time, vectorised; a row with a non-finite max gets a
// NaN max, so its outputs x - m - c are NaN (torch's NaN rows) without a branch. Why (a 2-core Zen 4 VM, AVX512,
// 8 MB f32, two threads, ms, three interleaved rounds, row loop or turned -> blocked, torch): rows of 24 1.21 -> 1.02 (1.19), 31 1.13 -> 0.81 (0.94), 32 0.99 -> 0.69 (0.84), 48 0.84 -> 0.59 (0.75),
// 64 0.70 -> 0.52 (0.71), 128 0.51 -> 0.43 (0.67); 256 level (not taken). One thread: at 256 and 1000 blocks lost
// (0.87 -> 0.96, 0.76 -> 0.96: long rows overlap by themselves); under 24 level with the turned path; blocks of
// 128 rows 5-10% slower than ~8 KB.
constexpr int64_t kLogBlockedMinDim = 24;
constexpr int64_t kLogBlockedMaxDim = 128;
constexpr int64_t kLogBlockMaxRows = 128;
template <typename In>
bool log_softmax_rows_blocked(int64_t D) {
#if defined(CPU_CAPABILITY_AVX512)
  return std::is_same_v<In, float> && D >= kLogBlockedMinDim && D <= kLogBlockedMaxDim;
#else
  (void)D;
  return false;
#endif
}

template <typename In, typename Out>
void log_softmax_blocked_fwd(const In* x, Out* y, const SoftmaxShape& shape) {
  using IO = Io<In>;
  using A = typename IO::A;
  using V = typename IO::V;
  constexpr int64_t kV = IO::kV, kStep = 2 * kV;
  static_assert(kV <= 16);
  const int64_t D = shape.dim_size;
  const int64_t vec_end = D - D % kStep;
  // About 8 KB of f32 rows a block (rows of 32: 64 rows; 64: 32), read again from L1 by passes 2 and 3.
  const int64_t block = std::clamp<int64_t>(2048 / D, kV, kLogBlockMaxRows);
  constexpr A kNegInf = -std::numeric_limits<A>::infinity();

  parallel_for(shape.outer, std::max<int64_t>(1, kGrain / D), [&](int64_t r0, int64_t r1) {
    alignas(64) A mb[kLogBlockMaxRows + 16];  // the rows' max (NaN where not finite)
    alignas(64) A cb[kLogBlockMaxRows + 16];  // the rows' sum, then log(sum)
    for (int64_t rb = r0; rb < r1; rb += block) {
      const int64_t nb = std::min(block, r1 - rb);
      for (int64_t j = 0; j < nb; ++j) mb[j] = row_max(x + (rb + j) * shape.row_stride, D);  // pass 1: the max
      for (int64_t j = 0; j < nb; ++j) {  // pass 2: the sum (rows with a non-finite max: any value, masked below)
        const In* xr = x + (rb + j) * shape.row_stride;
        const V vmax(mb[j]);
        V s0(A(0)), s1(A(0));
        int64_t i = 0;
        for (; i < vec_end; i += kStep) {  // rows of at most kLogBlockedMaxDim: one cascade block
          V a, b;
          IO::load2_lanes(xr + i, a, b);  // a sum: any order
          s0 = s0 + exp_nonpos(a - vmax);
          s1 = s1 + exp_nonpos(b - vmax);
        }
        const int64_t tail = D - vec_end;
        A s;
        if (tail > kPaddedTailFwd) {  // the padding's exps are 0
          V a, b;
          load2_tail(xr + vec_end, tail, kNegInf, a, b);
          a = exp_nonpos(a - vmax);
          b = tail > kV ? exp_nonpos(b - vmax) : V(A(0));
          s = hsum((s0 + s1) + (a + b));
        } else {
          s = hsum(s0 + s1);
          for (i = vec_end; i < D; ++i) s += math::exp_(to_acc(xr[i]) - mb[j]);
        }
        cb[j] = s;
      }
      for (int64_t j = nb; j < ceil_div(nb, kV) * kV; ++j) mb[j] = cb[j] = A(1);
      for (int64_t j = 0; j < nb; j += kV) {  // log(sum), kV rows at a time
        const V m = V::loadu(mb + j);
        nan_unless_finite(m, V::loadu(cb + j).log()).store(cb + j);
        nan_unless_finite(m, m).store(mb + j);
      }
      for (int64_t j = 0; j < nb; ++j) {  // pass 3: y = x - m - c
        log_softmax_row_out(x + (rb + j) * shape.row_stride, y + (rb + j) * D, D, mb[j], cb[j]);
      }
    }
  });
}

// Vector lanes of one column block, for the strided kernels: NV vectors of kV adjacent columns.
template <typename IO, int NV>
struct Lanes {
  using V = typename IO::V;
  V v[NV];
  template <typename T>
  void load(const T* p) {
    for (int k = 0; k < NV; ++k) v[k] = Io<T>::load(p + k * IO::kV);
  }
  template <typename T>
  void store(T* p) const {
    if constexpr (NV == 2) Io<T>::store2(p, v[0], v[1]);
    else
      for (int k = 0; k < NV; ++k) Io<T>::store(p + k * IO::kV, v[k]);
  }
};

// The strided kernels walk a slab's rows in runs of adjacent columns, a chunk of columns a task, per-column
// state (max, sums) in buffers (the columns past the last vector pair in padded lanes), rather than a vector
// pair of columns at a time: a task that reads one 64-byte line a row, rows a page or more apart, leaves every line
// to a demand miss that no prefetcher follows. Results do not depend on the width: each column's arithmetic is the
// same, in the same order. The width (strided_run_width), first that which applies:
//  - whole slabs, where a slab's rows fit the buffers (inner <= kStridedMaxRun) and there is a slab for every
//    thread: a task then reads one contiguous block, once a pass, which the prefetchers stream;
//  - chunks whose rows of the two tensors a pass reads fit kStridedChunkBytes, so that the later passes read them
//    from L2, where that leaves runs of kStridedMinRunBytes or more;
//  - else, backward only, runs as wide as the buffers: the later passes read from L3 or memory, but each row in a
//    run long enough for the prefetchers. The forward keeps its vector pairs there: with two threads streaming
//    runs through one L3 at once its three passes lost to them (dim 0 of f32 [512, 32768] log 12.5 -> 15.3 ms,
//    of f16 [1000, 2097] 0.47 -> 0.92 ms; single-threaded level);
// then narrowed, not below two vector pairs, until every thread has a task; runs past L2 narrowed under
// kStridedMinStreamRunBytes go back to vector pairs (dim 0 of bf16 [8192, 512], two threads: runs of 256 columns, half
// of each row, ran the log backward 1.2-1.5 -> 2.5-2.6 ms; runs of 4 KB gained, dim 0 of f32 [1024, 2048] 1.6 -> 1.0,
// and of 2 KB were level, f16 [1000, 2097]). Where the runs apply at some thread count, the vector pairs take the
// columns past the last pair in the runs' lanes, so that every column's arithmetic is the same either way. Only at
// D >= kStridedMinRows and inner >= kStridedMinRunColumns; elsewhere a vector pair a task (D = 4: consecutive tasks
// already read consecutive lines; inner 33: runs padded to 64 columns did twice the work, [4096, 16, 33] at 0.4-0.6x
// the vector pairs).
// 2-core Zen 4 VM (AVX512, 1 MB L2, 32 MB L3), 64 MB, ms, medians of four or five rounds alternating the builds,
// ranges over three such A/Bs, previous rule (backward: chunks only within 256 KB, f32 rows a page apart, 16-bit rows
// 16 KB apart; forward: vector pairs) -> this one, dim 1 of f32 [8, 1024,
// 2048]: forward log 12.8 -> 8.8, softmax 12.7-14.0 -> 9.1-12.3 (torch.compile 12.5 / 14.7), backward log 15.3-17.7
// -> 8.8-9.5, softmax 17.9-19.2 -> 10.4-11.3 (11.4 / 14.7); bf16 the same shape backward log 13.0 -> 5.5-6.2; dim 0
// of f32 [512, 32768] backward log 21.8-27.2 -> 11.9-13.7.
constexpr int64_t kStridedMaxRun = 4096;
constexpr int64_t kStridedChunkBytes = int64_t{256} << 10;
constexpr int64_t kStridedMinRunBytes = 512;
constexpr int64_t kStridedMinRows = 16;
constexpr int64_t kStridedMinRunColumns = 128;
constexpr int64_t kStridedMinStreamRunBytes = 2048;

// Whether the strided runs apply to a slab of D rows of inner columns at all (at some thread count).
inline bool strided_runs_apply(int64_t D, int64_t inner) {
  return D >= kStridedMinRows && inner >= kStridedMinRunColumns;
}

// Columns a task of the strided kernels (above), always whole vector pairs; a vector pair (kBlock) where the runs do
// not apply. `streaming`: whether runs past L2 may be taken (the backward's).
template <typename In>
int64_t strided_run_width(int64_t outer, int64_t D, int64_t inner, int64_t threads, bool streaming) {
  constexpr int64_t kBlock = 2 * Io<In>::kV, kSize = sizeof(In);
  static_assert(kStridedMaxRun % kBlock == 0 && kStridedMinRunColumns >= 2 * kBlock, "runs of whole vector pairs");
  const int64_t padded = ceil_div(inner, kBlock) * kBlock;
  if (outer < 1 || !strided_runs_apply(D, inner)) return kBlock;
  if (padded <= kStridedMaxRun && outer >= threads) return padded;
  const int64_t fit = std::min(kStridedChunkBytes / (2 * D * kSize) / kBlock * kBlock, kStridedMaxRun);
  const bool fits_l2 = fit * kSize >= kStridedMinRunBytes;
  if (!fits_l2 && !streaming) return kBlock;
  int64_t width = std::min(fits_l2 ? fit : kStridedMaxRun, padded);
  if (outer < threads) width = std::min(width, ceil_div(ceil_div(inner, ceil_div(threads, outer)), kBlock) * kBlock);
  if (!fits_l2 && width * kSize < kStridedMinStreamRunBytes) return kBlock;
  return std::max(width, 2 * kBlock);
}

// The columns' state of a task's runs (max, sums, partial sums: three arrays of `columns`, a multiple of the vector
// pair), on the heap, once per range of tasks: a thread's stack (a user's, or a worker's) need not hold 96 KB
// frames. 64-byte aligned.
template <typename A>
class RunState {
 public:
  explicit RunState(int64_t columns) : columns_(columns), mem_(new A[3 * columns + kPad]) {}
  A* array(int k) const {
    const auto p = reinterpret_cast<std::uintptr_t>(mem_.get());
    return reinterpret_cast<A*>((p + 63) & ~std::uintptr_t{63}) + k * columns_;
  }

 private:
  static constexpr int64_t kPad = 64 / sizeof(A);
  int64_t columns_;
  std::unique_ptr<A[]> mem_;
};

// Softmax over D for inner > 1, in place along the strides: the lanes of a vector are NV * kV
// adjacent columns (the contiguous inner dim), each with its own running max and sum over D.
// x, y point at the block's first column of one [D, inner] slab.
template <typename In, typename Out, bool kLog, int NV>
void softmax_cols_fwd(const In* x, Out* y, int64_t D, int64_t inner, typename Io<In>::A* scratch) {
  using IO = Io<In>;
  using A = typename IO::A;
  using V = typename IO::V;
  using L = Lanes<IO, NV>;
  constexpr int64_t kW = NV * IO::kV;
  constexpr bool kExpInY = std::is_same_v<Out, A>;

  L m;
  for (auto& v : m.v) v = V(-std::numeric_limits<A>::infinity());
  for (int64_t d = 0; d < D; ++d) {
    L a;
    a.load(x + d * inner);
    for (int k = 0; k < NV; ++k) m.v[k] = at::vec::maximum(m.v[k], a.v[k]);
  }
  L s;
  for (auto& v : s.v) v = V(A(0));
  for (int64_t d0 = 0; d0 < D; d0 += kSumRows) {
    L part;
    for (auto& v : part.v) v = V(A(0));
    for (int64_t d = d0; d < std::min(D, d0 + kSumRows); ++d) {
      L a;
      a.load(x + d * inner);
      for (int k = 0; k < NV; ++k) {
        a.v[k] = exp_nonpos(a.v[k] - m.v[k]);  // lanes with a non-finite max: garbage, masked below
        part.v[k] = part.v[k] + a.v[k];
      }
      if constexpr (!kLog) {
        if constexpr (kExpInY) a.store(y + d * inner);
        else a.store(scratch + d * kW);
      }
    }
    for (int k = 0; k < NV; ++k) s.v[k] = s.v[k] + part.v[k];
  }
  L c;  // the row constant; NaN in lanes whose max is not finite (torch's NaN rows)
  for (int k = 0; k < NV; ++k) {
    c.v[k] = nan_unless_finite(m.v[k], kLog ? s.v[k].log() : V(A(1)) / s.v[k]);
  }
  for (int64_t d = 0; d < D; ++d) {
    L a;
    if constexpr (kLog) {
      a.load(x + d * inner);
      for (int k = 0; k < NV; ++k) a.v[k] = (a.v[k] - m.v[k]) - c.v[k];
    } else {
      if constexpr (kExpInY) a.load(y + d * inner);
      else a.load(scratch + d * kW);
      for (int k = 0; k < NV; ++k) a.v[k] = a.v[k] * c.v[k];
    }
    a.store(y + d * inner);
  }
}

// `width` columns from each of the D rows of x and y (rows `inner` apart), the runs of strided_run_width: the
// columns' max, then their sums of exps (softmax over float outputs keeps the exps in y, as softmax_cols_fwd does),
// then y; each column's arithmetic exactly that of softmax_cols_fwd. `whole`: the columns are all of the row, so that
// the vector pair at row d's last columns runs on into row d + 1 and is loaded whole (its lanes past the row are
// garbage that no column reads), and stored whole where the pass writes y only and in order of d (the lanes past
// the row are written again with row d + 1), but for the last row and the final scaling of the kept exps, which
// reads row d + 1's exps back.
template <typename In, typename Out, bool kLog>
void softmax_cols_fwd_wide(const In* x, Out* y, int64_t D, int64_t inner, int64_t width, bool whole,
                           const RunState<typename Io<In>::A>& state) {
  using IO = Io<In>;
  using OO = Io<Out>;
  using A = typename IO::A;
  using V = typename IO::V;
  constexpr int64_t kV = IO::kV, kStep = 2 * kV;
  constexpr bool kExpInY = !kLog && std::is_same_v<Out, A>;
  const int64_t full = width / kStep * kStep, tail = width - full;
  const int64_t padded = full + (tail > 0 ? kStep : 0);
  const auto runs_on = [&](int64_t d) { return whole && d + 1 < D; };
  const auto load_x = [&](int64_t d, int64_t c, V& a, V& b) {
    if (c < full || runs_on(d)) IO::load2(x + d * inner + c, a, b);
    else load2_tail(x + d * inner + c, tail, -std::numeric_limits<A>::infinity(), a, b);
  };
  const auto store_y = [&](int64_t d, int64_t c, const V& a, const V& b, bool run_on) {
    if (c < full || run_on) OO::store2(y + d * inner + c, a, b);
    else store2_tail(y + d * inner + c, tail, a, b);
  };
  A* const mx = state.array(0);
  A* const sum = state.array(1);
  A* const part = state.array(2);
  std::fill(mx, mx + padded, -std::numeric_limits<A>::infinity());
  for (int64_t d = 0; d < D; ++d) {
    for (int64_t c = 0; c < padded; c += kStep) {
      V a, b;
      load_x(d, c, a, b);
      at::vec::maximum(V::loadu(mx + c), a).store(mx + c);
      at::vec::maximum(V::loadu(mx + c + kV), b).store(mx + c + kV);
    }
  }
  std::fill(sum, sum + padded, A(0));
  for (int64_t d0 = 0; d0 < D; d0 += kSumRows) {
    std::fill(part, part + padded, A(0));
    for (int64_t d = d0; d < std::min(D, d0 + kSumRows); ++d) {
      for (int64_t c = 0; c < padded; c += kStep) {
        V a, b;
        load_x(d, c, a, b);
        a = exp_nonpos(a - V::loadu(mx + c));  // lanes with a non-finite max: garbage, masked below
        b = exp_nonpos(b - V::loadu(mx + c + kV));
        (V::loadu(part + c) + a).store(part + c);
        (V::loadu(part + c + kV) + b).store(part + c + kV);
        if constexpr (kExpInY) store_y(d, c, a, b, runs_on(d));
      }
    }
    for (int64_t c = 0; c < padded; c += kV) (V::loadu(sum + c) + V::loadu(part + c)).store(sum + c);
  }
  for (int64_t c = 0; c < padded; c += kV) {  // the row constant; NaN where the max is not finite (torch's NaN rows)
    const V s = V::loadu(sum + c);
    nan_unless_finite(V::loadu(mx + c), kLog ? s.log() : V(A(1)) / s).store(sum + c);
  }
  for (int64_t d = 0; d < D; ++d) {
    for (int64_t c = 0; c < padded; c += kStep) {
      V a, b;
      const V m0 = V::loadu(mx + c), m1 = V::loadu(mx + c + kV), c0 = V::loadu(sum + c), c1 = V::loadu(sum + c + kV);
      if constexpr (kExpInY) {
        if (c < full || runs_on(d)) OO::load2(y + d * inner + c, a, b);
        else load2_tail(y + d * inner + c, tail, A(0), a, b);
        store_y(d, c, a * c0, b * c1, false);
      } else {
        load_x(d, c, a, b);
        if constexpr (kLog) store_y(d, c, (a - m0) - c0, (b - m1) - c1, runs_on(d));
        else store_y(d, c, exp_nonpos(a - m0) * c0, exp_nonpos(b - m1) * c1, runs_on(d));
      }
    }
  }
}

// Columns [c0, c1) of one slab: blocks of two vectors, then one vector (c1 - c0 a multiple of kV: the columns past a
// slab's last vector go in lanes across slabs, softmax_turned_cols_fwd below); or, with `state` (where the runs apply
// at some thread count: strided_runs_apply), the columns past the last pair in the runs' lanes.
template <typename In, typename Out, bool kLog>
void softmax_strided_block_fwd(const In* x, Out* y, int64_t D, int64_t inner, int64_t c0, int64_t c1,
                               typename Io<In>::A* scratch, const RunState<typename Io<In>::A>* state) {
  constexpr int64_t kV = Io<In>::kV;
  int64_t c = c0;
  for (; c + 2 * kV <= c1; c += 2 * kV) softmax_cols_fwd<In, Out, kLog, 2>(x + c, y + c, D, inner, scratch);
  if (state != nullptr) {
    if (c < c1) softmax_cols_fwd_wide<In, Out, kLog>(x + c, y + c, D, inner, c1 - c, /*whole=*/false, *state);
    return;
  }
  for (; c < c1; c += kV) softmax_cols_fwd<In, Out, kLog, 1>(x + c, y + c, D, inner, scratch);
}

// The strided kernels' columns past a slab's last vector (r = inner % kV of them; every column when inner < kV),
// where the runs do not apply: rather than a column at a time in scalar code (D scalar exps), kV of those columns of
// consecutive slabs, in order of (slab, column), are turned through buffers [d][kV] so that a lane holds a column, as
// softmax_short_rows_fwd turns rows: the forward's max, exps, sum and outputs, the backward's sum and dx, are then
// lane-wise vector ops over D (sums cascaded every kSumRows rows, as softmax_cols_fwd's and softmax_cols_bwd's). A
// column's arithmetic is the same whichever lane or task it falls in, so the results do not depend on the thread
// count. The elements move through the buffers in their own type and are converted a vector at a time.
// Why (a 2-core Zen 4 VM, AVX512: kV = 16 in float, bfloat16 too; ranges of medians over five rounds alternating
// the builds, ms, scalar columns -> lanes, torch in brackets): dim 1 of f32
// [37449, 8, 7] softmax 9.4-14.1 -> 1.5-1.8 (4.6-6.8), log_softmax 7.0-11.5 -> 1.8-2.1 (4.5-5.3); of bf16 softmax
// 10.4-11.0 -> 1.4-2.5 (5.4-8.7); of f32 [8192, 16, 20] (a vector and four columns a slab) softmax 2.6-2.7 -> 1.0-1.1
// (2.0-2.1). The copies then a segment at a time down the rows (turn_cols_in): f32 [37449, 8, 7] softmax 1.5-2.0 ->
// 1.0-1.3 (4.6-6.3). The backward (its scalar columns had no exps but log_softmax's, one an element), measured the
// same way, dim 1 of f32 [37449, 8, 7] softmax 1.3-2.5 -> 0.9-1.6 (1.8-3.1), log_softmax 3.4-4.5 -> 1.0-1.7
// (3.3-5.8); of f32 [2, 131072, 7] softmax 2.2-3.4 -> 1.1-1.5 (1.5-2.2), log_softmax 3.4-5.7 -> 1.5-2.8 (2.9-5.2); of
// bf16 [4096, 64, 7] log_softmax 4.0-5.8 -> 0.9-1.2 (3.7-6.4); of f32 [4096, 8, 33] (one column a slab in lanes)
// softmax 0.17-0.22 -> 0.22-0.25 (0.33-0.48), the one shape a little behind the scalar columns.

// Where the strided kernels take a slab's last inner % kV columns in lanes across slabs (the runs do not apply at
// any thread count, and inner is no multiple of kV): the columns a lane group takes, kV, or fewer where kV would leave
// a thread without a group (few columns, long ones: dim 1 of [2, 131072, 7]); else 0. A column's arithmetic is the
// same in any lane of any group. The forward's and the backward's, and explain's.
// Float backwards of slabs wider than a vector (inner > kV) keep their last columns in their own tasks instead, in
// the runs' padded lanes (softmax_cols_bwd_wide): in lanes across slabs each such column re-read its rows' last lines
// after the slabs' vector tasks had moved them out of L2, and one leftover column doubled the time of the vector
// columns (dim 1 of [N, 1000, inner], 8 MB, us: inner 48 652-852, 49 1107-1572, torch 1043-1963). Measured (three
// interleaved rounds, ms, lanes across slabs -> padded lanes (torch); a 2-core Zen 4 VM, AVX512): f32 softmax
// backward inner 49 1.27 -> 0.95 (1.20), 33 1.39 -> 1.14 (1.26), 20 1.34 -> 0.93 (1.12); log_softmax 49 1.48 -> 0.88
// (1.24), 33 1.23 -> 1.30 (1.33). The forwards lost (f32 softmax inner 33 0.76 -> 1.23, bf16 1.13 -> 2.78 against
// torch's 2.43) and so did the bf16 log_softmax backward (33: 1.58 -> 2.69), so only float backwards leave.
template <typename In>
int64_t turned_group_width(int64_t outer, int64_t D, int64_t inner, int64_t threads, bool backward) {
  constexpr int64_t kV = Io<In>::kV;
  if (strided_runs_apply(D, inner) || inner % kV == 0) return 0;
  if (backward && std::is_same_v<In, float> && inner > kV) return 0;
  return std::clamp<int64_t>(ceil_div(outer * (inner % kV), threads), 1, kV);
}

// A group's columns of one slab, adjacent in every row: the elements at x + at + d * inner, `len` of them, go to
// lanes [lane, lane + len).
struct TurnedSegment {
  int64_t at, lane, len;
};

// The tasks of the strided kernels where turned_group_width (w) applies, x dense [outer, D, inner]: blocks of kV
// slabs, each block's slabs' vector columns slab by slab (a vector pair a task), then its lane groups, w of the
// block's leftover columns (r = inner % kV a slab) each.
template <typename In>
class TurnedTasks {
 public:
  static constexpr int64_t kV = Io<In>::kV, kBlock = 2 * kV;
  TurnedTasks(const SoftmaxShape& shape, int64_t w)
      : outer_(shape.outer), D_(shape.dim_size), inner_(shape.inner), r_(inner_ % kV), body_(inner_ - r_),
        pairs_(ceil_div(body_, kBlock)), w_(w), per_block_(kV * pairs_ + ceil_div(kV * r_, w)) {}
  int64_t count() const {
    const int64_t blocks = ceil_div(outer_, kV), last = outer_ - (blocks - 1) * kV;
    return (blocks - 1) * per_block_ + last * pairs_ + ceil_div(last * r_, w_);
  }
  // Task t: pair(offset, c0, c1), the columns [c0, c1) (a vector pair, or the body's last vector) of the slab at
  // offset; or group(segs, nsegs, n), n columns in the lanes as segs lay them out.
  template <typename Pair, typename Group>
  void run(int64_t t, const Pair& pair, const Group& group) const {
    const int64_t b = t / per_block_, u = t % per_block_, slabs = std::min(kV, outer_ - b * kV);
    if (u < slabs * pairs_) {
      const int64_t c0 = u % pairs_ * kBlock;
      pair((b * kV + u / pairs_) * D_ * inner_, c0, std::min(body_, c0 + kBlock));
      return;
    }
    // A lane group: the block's leftover columns j in [j0, j0 + n) (of all slabs', j = o r + (c - body)).
    const int64_t j0 = b * kV * r_ + (u - slabs * pairs_) * w_, n = std::min(w_, (b * kV + slabs) * r_ - j0);
    TurnedSegment segs[kV];
    int64_t nsegs = 0;
    for (int64_t l = 0, o = j0 / r_, k = j0 % r_; l < n; k = 0, ++o) {  // slab o, from its column body + k
      const int64_t len = std::min(r_ - k, n - l);
      segs[nsegs++] = {o * D_ * inner_ + body_ + k, l, len};
      l += len;
    }
    group(segs, nsegs, n);
  }

 private:
  int64_t outer_, D_, inner_, r_, body_, pairs_, w_, per_block_;
};

// Rows [d0, d1) of a group's columns of x into t [d - d0][kV], the lanes past n zero (computed and dropped); and
// back, t's `rows` rows to rows [d0, d0 + rows) of y. A segment at a time down the rows, a vector move each (AVX512:
// at::vec's partial loadu / store are masked moves; elsewhere they would be a memcpy each, so element by element):
// every copy loop then walks one constant stride (inner in x, kV in t), which the hardware prefetchers follow.
// Row by row across the segments, a load's address jumped from slab to slab, and from DRAM the copies cost more than
// the scalar columns did (dim 1 of f32 [4096, 64, 7], softmax backward at one thread, ms: 4.2-4.7 against 2.6-2.9
// a segment at a time, the scalar columns 2.8, torch 2.7; from cache, [256, 64, 7]: 0.11-0.12 against 0.092, the
// scalar columns 0.18). Earlier, for the forward: a long column's elements lane by lane went to another line every
// other store (dim 1 of f32 [2, 131072, 7] 5.4-7.8 against row by row's 3.3-5.8), and element by element at a lane's
// offset each gcc made the stores an AVX512 vscatterqps (dim 1 of f32 [4096, 64, 7] 2.6-3.4 against 1.2-1.5).
template <typename T, int64_t kV>
void turn_cols_in(const T* x, int64_t inner, const TurnedSegment* segs, int64_t nsegs, int64_t n, int64_t d0,
                  int64_t d1, T* t) {
#if defined(CPU_CAPABILITY_AVX512)
  using R = Vectorized<T>;
  static_assert(R::size() >= kV);
  (void)n;  // the first segment (lane 0) is stored over all kV lanes, zeros past it; the others over their lanes
  for (int64_t k = 0; k < nsegs; ++k) {
    const T* p = x + segs[k].at;
    const int64_t lane = segs[k].lane, len = segs[k].len;
    for (int64_t d = d0; d < d1; ++d) R::loadu(p + d * inner, len).store(t + (d - d0) * kV + lane, k == 0 ? kV : len);
  }
#else
  for (int64_t d = d0; d < d1; ++d) std::fill(t + (d - d0) * kV + n, t + (d - d0 + 1) * kV, T(0));
  for (int64_t k = 0; k < nsegs; ++k) {
    const T* p = x + segs[k].at;
    for (int64_t d = d0; d < d1; ++d) {
      for (int64_t i = 0; i < segs[k].len; ++i) t[(d - d0) * kV + segs[k].lane + i] = p[d * inner + i];
    }
  }
#endif
}
template <typename T, int64_t kV>
void turn_cols_out(const T* t, int64_t inner, const TurnedSegment* segs, int64_t nsegs, int64_t d0, int64_t rows,
                   T* y) {
  for (int64_t k = 0; k < nsegs; ++k) {
    T* p = y + segs[k].at + d0 * inner;
    const int64_t lane = segs[k].lane, len = segs[k].len;
    for (int64_t d = 0; d < rows; ++d) {
#if defined(CPU_CAPABILITY_AVX512)
      Vectorized<T>::loadu(t + d * kV + lane, len).store(p + d * inner, len);
#else
      for (int64_t i = 0; i < len; ++i) p[d * inner + i] = t[d * kV + lane + i];
#endif
    }
  }
}

// The buffers [rows][kV] of one range of tasks (rows = min(D, kSumRows)): kInputs inputs' columns turned (of In: x;
// dy and y), the exps and outputs (of A), the outputs of Out where Out is not A. Where the types agree the buffers are
// one (the first input's, the acc's, the outputs'): each pass reads row d before it writes row d.
template <typename In, typename Out, int kInputs>
class TurnedColumns {
 public:
  using A = typename Io<In>::A;
  static constexpr int64_t kV = Io<In>::kV;
  explicit TurnedColumns(int64_t D)
      : acc_(new A[rows(D) * kV]), out_(std::is_same_v<Out, A> ? nullptr : new Out[rows(D) * kV]) {
    for (int i = 0; i < kInputs; ++i) {
      if (i > 0 || !std::is_same_v<In, A>) in_[i].reset(new In[rows(D) * kV]);
    }
  }
  static int64_t rows(int64_t D) { return std::min(D, kSumRows); }
  A* acc() const { return acc_.get(); }
  In* in(int i) const {
    if constexpr (std::is_same_v<In, A>) {
      if (i == 0) return acc_.get();
    }
    return in_[i].get();
  }
  Out* out() const {
    if constexpr (std::is_same_v<Out, A>) return acc_.get();
    else return out_.get();
  }

 private:
  std::unique_ptr<A[]> acc_;
  std::unique_ptr<In[]> in_[kInputs];
  std::unique_ptr<Out[]> out_;
};

// A group of up to kV columns in the lanes of one vector, as `segs` (n lanes in all) lay them out. Up to kSumRows
// rows the columns are turned once and softmax keeps its exps in the buffer; longer columns go through it a block of
// kSumRows rows at a time in each pass, softmax recomputing its exps (the same values), so that the buffers stay
// within L1/L2 whatever D (a group of 131072 rows turned whole is 8 MB of float).
template <typename In, typename Out, bool kLog>
void softmax_turned_cols_fwd(const In* x, Out* y, int64_t D, int64_t inner, const TurnedSegment* segs, int64_t nsegs,
                             int64_t n, const TurnedColumns<In, Out, 1>& buf) {
  using IO = Io<In>;
  using OO = Io<Out>;
  using A = typename IO::A;
  using V = typename IO::V;
  static_assert(std::is_same_v<A, typename OO::A>);
  constexpr int64_t kV = IO::kV;
  In* const xt = buf.in(0);  // [d - d0][lane]
  A* const et = buf.acc();
  Out* const yt = buf.out();
  const bool once = D <= kSumRows;
  const auto turn_in = [&](int64_t d0, int64_t d1) { turn_cols_in<In, kV>(x, inner, segs, nsegs, n, d0, d1, xt); };
  if (once) turn_in(0, D);
  V m(-std::numeric_limits<A>::infinity());
  for (int64_t d0 = 0; d0 < D; d0 += kSumRows) {
    const int64_t rows = std::min(D - d0, kSumRows);
    if (!once) turn_in(d0, d0 + rows);
    for (int64_t d = 0; d < rows; ++d) m = at::vec::maximum(m, IO::load(xt + d * kV));
  }
  V s(A(0));
  for (int64_t d0 = 0; d0 < D; d0 += kSumRows) {
    const int64_t rows = std::min(D - d0, kSumRows);
    if (!once) turn_in(d0, d0 + rows);
    V part(A(0));
    for (int64_t d = 0; d < rows; ++d) {
      const V e = exp_nonpos(IO::load(xt + d * kV) - m);  // lanes with a non-finite max: garbage, masked below
      part = part + e;
      if (!kLog && once) e.store(et + d * kV);
    }
    s = s + part;
  }
  const V c = nan_unless_finite(m, kLog ? s.log() : V(A(1)) / s);  // torch's NaN columns
  for (int64_t d0 = 0; d0 < D; d0 += kSumRows) {
    const int64_t rows = std::min(D - d0, kSumRows);
    if (!once) turn_in(d0, d0 + rows);
    for (int64_t d = 0; d < rows; ++d) {
      if constexpr (kLog) {
        OO::store(yt + d * kV, (IO::load(xt + d * kV) - m) - c);
      } else {
        OO::store(yt + d * kV, (once ? V::loadu(et + d * kV) : exp_nonpos(IO::load(xt + d * kV) - m)) * c);
      }
    }
    turn_cols_out<Out, kV>(yt, inner, segs, nsegs, d0, rows, y);
  }
}

// Task = (outer index, chunk of columns); x and y dense [outer, D, inner]. Each chunk: wide (strided_run_width), all
// of its columns at once; else a vector pair at a time in registers, then one vector, then, where the runs do not
// apply, the columns left (inner % kV a slab) in lanes across slabs (softmax_turned_cols_fwd), the tasks then
// TurnedTasks'.
template <typename In, typename Out, bool kLog>
void softmax_strided_fwd(const In* x, Out* y, const SoftmaxShape& shape) {
  using A = typename Io<In>::A;
  constexpr int64_t kV = Io<In>::kV, kBlock = 2 * kV;
  constexpr bool kScratch = !kLog && !std::is_same_v<Out, A>;
  const int64_t outer = shape.outer, D = shape.dim_size, inner = shape.inner;
  // The runs (wide implies them), or a slab's columns past its last vector in the runs' padded lanes.
  const bool lanes = strided_runs_apply(D, inner) || inner % kV != 0;
  if (const int64_t w = turned_group_width<In>(outer, D, inner, parallel_threads(), /*backward=*/false)) {
    const TurnedTasks<In> tasks(shape, w);
    parallel_for(tasks.count(), std::max<int64_t>(1, kGrain / (D * kV)), [&](int64_t t0, int64_t t1) {
      std::unique_ptr<A[]> scratch(kScratch && inner >= kV ? new A[D * kBlock] : nullptr);
      const TurnedColumns<In, Out, 1> buf(D);
      for (int64_t t = t0; t < t1; ++t) {
        tasks.run(
            t,
            [&](int64_t offset, int64_t c0, int64_t c1) {
              softmax_strided_block_fwd<In, Out, kLog>(x + offset, y + offset, D, inner, c0, c1, scratch.get(),
                                                       nullptr);
            },
            [&](const TurnedSegment* segs, int64_t nsegs, int64_t n) {
              softmax_turned_cols_fwd<In, Out, kLog>(x, y, D, inner, segs, nsegs, n, buf);
            });
      }
    });
    return;
  }
  const int64_t width = strided_run_width<In>(outer, D, inner, parallel_threads(), /*streaming=*/false);
  const bool wide = width > kBlock;
  const int64_t chunks = ceil_div(inner, width);
  parallel_for(outer * chunks, std::max<int64_t>(1, kGrain / (D * std::min(inner, width))),
               [&](int64_t t0, int64_t t1) {
                 std::unique_ptr<A[]> scratch(kScratch && !wide ? new A[D * kBlock] : nullptr);
                 const RunState<A> state(lanes ? width : 0);
                 for (int64_t t = t0; t < t1; ++t) {
                   const int64_t o = t / chunks, c0 = (t % chunks) * width, c1 = std::min(inner, c0 + width);
                   const int64_t offset = o * D * inner;
                   if (wide) {  // a last chunk under a vector pair too: the same arithmetic whatever the width
                     softmax_cols_fwd_wide<In, Out, kLog>(x + offset + c0, y + offset + c0, D, inner, c1 - c0,
                                                          chunks == 1, state);
                   } else {
                     softmax_strided_block_fwd<In, Out, kLog>(x + offset, y + offset, D, inner, c0, c1,
                                                              scratch.get(), lanes ? &state : nullptr);
                   }
                 }
               });
}

// Which rows softmax_short_rows_fwd / softmax_short_rows_bwd turn: those shorter than a vector pair, but in the AVX512
// build (kV = 16 float lanes, 16-bit inputs too) only forward rows under kFwdRowLoopMinDimAvx512 and backward rows
// under kBwdRowLoopMinDimAvx512 (float log_softmax's forward rows of kLogBlockedMinDim and more go to
// log_softmax_blocked_fwd before this rule); the row loop runs the longer ones as two padded vectors (mask blends). The AVX2 build (kV = 8) turns every row under 16: its
// row loop ran them 1.5-3.6x slower forward (rows of 10-15), its 16-bit backward 1.8-2.9x (rows of 9-15).
// Why (a 2-core Zen 4 VM, AVX512, 8 MB, ms, interleaved rounds, turned -> row loop, torch in brackets). Forward: rows of 27 / 31 softmax f32 1.174 -> 1.118 / 1.110 -> 0.975 (1.41 / 1.32), bf16
// 3.560 -> 2.821 / 3.631 -> 2.465, f16 2.671 -> 2.461 / 2.661 -> 2.154; log_softmax bf16 3.632 -> 3.164 / 3.624 ->
// 2.792, f16 2.765 -> 2.783 / 2.720 -> 2.467, f32 1.192 -> 1.226 / 1.134 -> 1.077 (1.10 / 1.05); at 24 turned still
// led (softmax f32 1.182 against 1.226, f16 2.689 against 2.798), and at 18-21 by 10-50%. Backward, 1.4-3.9x from 10
// on: softmax f32 rows of 16 1.087 -> 0.429 (0.389), 24 1.172 -> 0.462 (0.447), 31 1.124 -> 0.387 (0.417);
// log_softmax f32 16 1.365 -> 0.646 (0.620), 31 1.307 -> 0.581 (0.621); bf16 softmax 10 4.468 -> 2.861, 31 3.689 ->
// 1.107; log_softmax bf16 10 4.857 -> 4.601, 31 4.060 -> 1.752. At 3-6 log_softmax's turned backward led (f32 rows of
// 6 1.773 against 2.112: the row loop's element tail pays an exp an element).
constexpr int64_t kFwdRowLoopMinDimAvx512 = 27;
constexpr int64_t kBwdRowLoopMinDimAvx512 = 10;
template <typename In>
bool softmax_rows_turned(int64_t D, bool backward) {
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (Io<In>::kV == 16) return D < (backward ? kBwdRowLoopMinDimAvx512 : kFwdRowLoopMinDimAvx512);
#endif
  (void)backward;
  return D < 2 * Io<In>::kV;
}

template <typename In, typename Out>
void softmax_fwd_any(const In* x, Out* y, const SoftmaxShape& shape, bool log) {
  if (shape.inner == 1 && log && log_softmax_rows_blocked<In>(shape.dim_size)) {
    log_softmax_blocked_fwd<In, Out>(x, y, shape);
  } else if (shape.inner == 1 && softmax_rows_turned<In>(shape.dim_size, /*backward=*/false)) {
    if (log) softmax_short_rows_fwd<In, Out, true>(x, y, shape);
    else softmax_short_rows_fwd<In, Out, false>(x, y, shape);
  } else if (shape.inner == 1) {
    if (log) softmax_lastdim_fwd<In, Out, true>(x, y, shape);
    else softmax_lastdim_fwd<In, Out, false>(x, y, shape);
  } else {
    if (log) softmax_strided_fwd<In, Out, true>(x, y, shape);
    else softmax_strided_fwd<In, Out, false>(x, y, shape);
  }
}

// Backward. softmax: dx = y (dy - sum(dy y)); log_softmax: dx = dy - exp(y) sum(dy)
// (Epilogue::backward_term is what is summed, Epilogue::backward the map).
template <bool kLog>
struct VecBackward {
  template <typename V>
  static V term(const V& dy, const V& y) {
    if constexpr (kLog) return dy;
    else return dy * y;
  }
  template <typename V>
  static V map(const V& dy, const V& y, const V& sum) {
    if constexpr (kLog) return dy - exp_any(y) * sum;
    else return y * (dy - sum);
  }
};

// The backward of rows shorter than a vector pair, turned as softmax_short_rows_fwd turns them.
template <typename In, typename Out, bool kLog>
void softmax_short_rows_bwd(const In* dy, const In* y, Out* dx, const SoftmaxShape& shape) {
  using IO = Io<In>;
  using A = typename IO::A;
  using V = typename IO::V;
  constexpr int64_t kV = IO::kV;
  const int64_t D = shape.dim_size;
  for_row_blocks(shape.outer, D, kV, [&](int64_t r0, int64_t nr) {
    alignas(64) A g[2 * kV * kV], o[2 * kV * kV];  // [d][lane]
    turn_rows_in(dy + r0 * D, D, nr, D, kV, g);
    turn_rows_in(y + r0 * D, D, nr, D, kV, o);
    V s(A(0));
    for (int64_t d = 0; d < D; ++d) s = s + VecBackward<kLog>::term(V::loadu(g + d * kV), V::loadu(o + d * kV));
    for (int64_t d = 0; d < D; ++d) VecBackward<kLog>::map(V::loadu(g + d * kV), V::loadu(o + d * kV), s).store(g + d * kV);
    turn_rows_out(g, nr, D, kV, dx + r0 * D);
  });
}

// The 16-bit log_softmax backward takes exp(y) in its summing pass, which then reads dy and y as softmax's does, into a
// scratch row of acc_t (a task's, from the heap: at most kLogBwdExpFirstMaxDim elements, 4 MB of float); the second
// pass reads dy again and that row from cache: dx = dy - e s. Before, the summing pass read dy alone and the second
// read y too, converted it and took its exp, which left the load-convert-exp chain in the pass that writes.
// Measured (a 2-core VM, two threads, AVX512, separate processes alternating, fastact / torch ratios of the
// medians, before -> after; the VM's absolute times drifted 30% between runs): bf16 [32768, 1024] 1.06 / 1.12 ->
// 1.45 / 1.42; f16 [16384, 2048] 1.07 / 1.06 -> 1.28 / 1.37; bf16 [8192, 4096] 1.13 / 1.18 -> 1.51 / 1.31, f16
// 1.08 / 1.03 -> 1.29 / 1.27; bf16 [1024, 16384] 1.16 / 1.19 -> 1.39 / 1.33; bf16 [512, 65536] 1.17 / 1.22 ->
// 1.31 / 1.34; bf16 [131072, 256] 1.19 / 1.26 -> 1.32 / 1.28; f16 [524288, 64] 1.01 / 1.10 -> 1.11 / 1.08. Float
// rows lost (f32 [4096, 4096] 1.27 / 1.23 -> 1.19 / 1.21, [1024, 16384] 1.24 / 1.33 -> 1.13 / 1.11; [256, 65536]
// level, 1.08-1.33 -> 1.10-1.15): there y needs no conversion, and the scratch row's store and load cost more than
// the exp they move.
constexpr int64_t kLogBwdExpFirstMaxDim = int64_t{1} << 20;
// Vector pairs of a backward row held in registers (softmax_bwd_row_in_registers): 4 (float and 16-bit; 16 vectors of
// dy and y), 2 for double (not measured at 4).
template <typename In>
constexpr int kBwdRegisterPairs = sizeof(In) == 8 ? 2 : 4;
template <bool kLog, typename In>
bool log_softmax_bwd_exp_first(int64_t D) {
  return kLog && sizeof(In) == 2 && D > 2 * kBwdRegisterPairs<In> * Io<In>::kV &&  // past the in-register rows
         D <= kLogBwdExpFirstMaxDim;
}

// A backward row of at most kBwdRegisterPairs vector pairs (float and 16-bit: 4, D <= 8 kV) held in
// registers: dy and y loaded (and converted) once, padded past D (the padding's terms are 0 and its outputs dropped),
// summed, mapped and stored; the row loop below loads every element twice and pays its loop and tail logic a row.
// Why (2-core VMs, AVX512, 8 MB, fastact / torch): f32 softmax
// rows of 16 and 24 had fallen to 0.56-0.85 of torch's speed through the row loop (Zen 4); f16 softmax rows of 77-128
// ran at 0.86-1.04 (Xeon), 1.25-1.65 in registers, bf16 0.95-1.44 -> 1.09-1.70, the 16-bit log_softmax 1.04-1.36 ->
// 1.19-1.50 (two runs each, alternating builds).
// Where dx is kStreamBytes or more, the caller passes each row's place in a StreamStager. Rows of 3-4 pairs had
// taken the row loop instead, for its streaming stores (Xeon, 64 MB, two threads, three alternating runs, fastact /
// torch): f16 rows of 100 softmax / log_softmax 0.59-0.73 / 0.54-0.61 ->
// 1.07-1.25 / 1.25-1.47 (the row loop's heads and tails of single elements) with the row's aligned pairs streamed,
// bf16 rows of 128 1.05-1.16 / 1.21-1.46 -> 1.23-1.42 / 1.54-1.86; rows of two pairs too: f32 rows of 64 0.90-1.05 /
// 0.70-1.17 -> 1.14-1.31 / 1.19-2.51, bf16 1.09-2.18 / 1.00-1.22 -> 1.17-1.50 / 1.31-1.62. Float rows of 3-4 pairs
// (before, 2 for float) and every row streamed through the stager (StreamStager says why).
template <bool kLog, typename In, typename Out>
C10_ALWAYS_INLINE void softmax_bwd_row_in_registers(const In* dyr, const In* yr, Out* dxr, int64_t D) {
  using IO = Io<In>;
  using A = typename IO::A;
  using V = typename IO::V;
  constexpr int64_t kStep = 2 * IO::kV;
  constexpr int kPairs = kBwdRegisterPairs<In>;
  // Whole pairs in lane order where dy, y and dx are of one type (each pair is loaded and stored in one order: whole
  // ones in lane order, the padded last one in element order).
  constexpr bool kLanes = std::is_same_v<In, Out>;
  const auto load_pair = [](const In* p, int64_t n, V& a, V& b) {
    if (n == kStep) load2_in<kLanes>(p, a, b);
    else load2_tail(p, n, A(0), a, b);
  };
  V g[2 * kPairs], yv[2 * kPairs];
  V t(A(0));
#pragma GCC unroll 4
  for (int k = 0; k < kPairs; ++k) {
    const int64_t n = std::min(D - k * kStep, kStep);
    if (n <= 0) break;
    load_pair(dyr + k * kStep, n, g[2 * k], g[2 * k + 1]);
    load_pair(yr + k * kStep, n, yv[2 * k], yv[2 * k + 1]);
    t = t + (VecBackward<kLog>::term(g[2 * k], yv[2 * k]) + VecBackward<kLog>::term(g[2 * k + 1], yv[2 * k + 1]));
  }
  const V vs(hsum(t));
#pragma GCC unroll 4
  for (int k = 0; k < kPairs; ++k) {
    const int64_t n = std::min(D - k * kStep, kStep);
    if (n <= 0) break;
    const V d0 = VecBackward<kLog>::map(g[2 * k], yv[2 * k], vs);
    const V d1 = VecBackward<kLog>::map(g[2 * k + 1], yv[2 * k + 1], vs);
    if (n == kStep) store2_in<kLanes>(dxr + k * kStep, d0, d1);
    else store2_tail(dxr + k * kStep, n, d0, d1);
  }
}

// Rows of dx of at most this many bytes that the row loop streams through a StreamStager (not a head of plain stores
// up to the alignment, then vector pairs). Measured (Xeon, 64 MB, two threads, three alternating runs, ms against the
// head): f32 log_softmax rows of 197 13.2-15.3 -> 12.4-12.7, f16 rows of 257
// 17.1-19.0 -> 15.0-16.6, f32 softmax rows of 197 8.3-9.7 -> 7.9-8.7, bf16 rows of 197 level; longer rows lost (the
// buffer's copy costs more than their few shared lines save): f32 softmax rows of 577 8.2-9.2 -> 8.8-9.5, f16
// log_softmax rows of 577 16.1-18.1 -> 19.3-20.1, bf16 softmax rows of 1000 11.2 -> 11.9-12.3.
constexpr int64_t kStagedBwdRowBytes = 1024;
static_assert(kStagedBwdRowBytes <= StreamStager<double>::kMaxPiece * int64_t{sizeof(double)});

// The row loop of softmax_lastdim_bwd, one row a call of softmax_bwd_row: the summing pass (softmax_bwd_row_sum),
// then the writing pass (softmax_bwd_write_row), dx = map(dy, z, s) for z = y (BwdMapOutput), or with kExpFirst
// (log_softmax_bwd_exp_first) z = exp(y) from the scratch row e (BwdMapExpRow). The pointers, the sum and the flags
// (kExpFirst, kStream) are parameters, not a closure's references: vector stores may alias anything, so a value read
// through a reference is reloaded after every store, and a lambda that gcc left out of line (the plain stores') held
// the loop's index in memory. Measured on a 2-core Zen 3 VM (AVX2, one thread, 2 MB in cache): with the row in one
// lambda, bf16 softmax rows of 96-192 ran at 0.67-0.75x torch.
template <bool kLog>
struct BwdMapOutput {  // z = y: softmax dx = y (dy - s), log_softmax dx = dy - exp(y) s
  template <typename V>
  C10_ALWAYS_INLINE V vec(const V& g, const V& z, const V& s) const {
    return VecBackward<kLog>::map(g, z, s);
  }
  template <typename A>
  C10_ALWAYS_INLINE A scalar(A g, A z, A s) const {
    return Epilogue<kLog>{}.backward(g, z, s);
  }
};
struct BwdMapExpRow {  // z = exp(y), from the scratch row: dx = dy - z s
  template <typename V>
  C10_ALWAYS_INLINE V vec(const V& g, const V& z, const V& s) const {
    return g - z * s;
  }
  template <typename A>
  C10_ALWAYS_INLINE A scalar(A g, A z, A s) const {
    return g - z * s;
  }
};

// Sum over the row of term(dy, y) (vector pairs in cascaded blocks of kSumBlock, then the tail: padded where longer
// than kPaddedTailBwd, else element by element); with kExpFirst also e[d] = exp(y[d]).
template <bool kLog, bool kExpFirst, typename In>
C10_ALWAYS_INLINE typename Io<In>::A softmax_bwd_row_sum(const In* dyr, const In* yr, int64_t D,
                                                         typename Io<In>::A* e) {
  using IO = Io<In>;
  using A = typename IO::A;
  using V = typename IO::V;
  constexpr int64_t kStep = 2 * IO::kV;
  const int64_t vec_end = D - D % kStep;
  V total(A(0));
  for (int64_t blk = 0; blk < vec_end; blk += kSumBlock) {
    const int64_t blk_end = std::min(blk + kSumBlock, vec_end);
    V s0(A(0)), s1(A(0));
    for (int64_t i = blk; i < blk_end; i += kStep) {
      V g0, g1, y0, y1;
      // A sum: any order, but with kExpFirst e in element order, for the writing pass.
      load2_in<!kExpFirst>(dyr + i, g0, g1);
      load2_in<!kExpFirst>(yr + i, y0, y1);
      s0 = s0 + VecBackward<kLog>::term(g0, y0);
      s1 = s1 + VecBackward<kLog>::term(g1, y1);
      if constexpr (kExpFirst) {
        exp_any(y0).store(e + i);
        exp_any(y1).store(e + i + IO::kV);
      }
    }
    total = total + (s0 + s1);
  }
  const int64_t tail = D - vec_end;
  if (tail > kPaddedTailBwd) {  // the tail as two padded vectors (the padding's terms are 0)
    V g0, g1, y0, y1;
    load2_tail(dyr + vec_end, tail, A(0), g0, g1);
    load2_tail(yr + vec_end, tail, A(0), y0, y1);
    total = total + (VecBackward<kLog>::term(g0, y0) + VecBackward<kLog>::term(g1, y1));
    if constexpr (kExpFirst) store2_tail(e + vec_end, tail, exp_any(y0), exp_any(y1));
    return hsum(total);
  }
  A s = hsum(total);
  for (int64_t i = vec_end; i < D; ++i) {
    s += Epilogue<kLog>{}.backward_term(to_acc(dyr[i]), to_acc(yr[i]));
    if constexpr (kExpFirst) e[i] = std::exp(to_acc(yr[i]));
  }
  return s;
}

// dx over [i, end) of a row with plain stores: padded vector pairs (at most kStep elements each: 32 16-bit ones on
// AVX512, 16 on AVX2) while more than kPaddedTailBwd remain, then element by element. Returns end. It takes the row's
// tail after the vector pairs and, where dx is streamed directly (rows longer than kStagedBwdRowBytes), its head up
// to the stream alignment. Element by element, a 16-bit head (up to 31 elements, each converted, and log_softmax's an
// exp) had cost rows that start off the alignment up to 30% (Xeon, 64 MB, two threads, three alternating runs):
// f16 log_softmax rows of 197 0.71-0.73x torch -> 1.01-1.11x, f16 softmax rows
// of 577 0.90-1.03x -> 0.98-1.05x, f32 log_softmax rows of 197 0.90-0.94x -> 0.94-1.01x (rows of up to
// kStagedBwdRowBytes now go through a StreamStager instead).
template <typename In, typename Z, typename Out, typename Map>
C10_ALWAYS_INLINE int64_t softmax_bwd_write_plain(const In* dyr, const Z* z, Out* dxr, int64_t i, int64_t end,
                                                  const typename Io<In>::V& vs, typename Io<In>::A s,
                                                  const Map& map) {
  using IO = Io<In>;
  using A = typename IO::A;
  using V = typename IO::V;
  constexpr int64_t kStep = 2 * IO::kV;
  while (end - i > kPaddedTailBwd) {
    const int64_t n = std::min(end - i, kStep);
    V g0, g1, z0, z1;
    load2_tail(dyr + i, n, A(0), g0, g1);
    load2_tail(z + i, n, A(0), z0, z1);
    store2_tail(dxr + i, n, map.vec(g0, z0, vs), map.vec(g1, z1, vs));
    i += n;
  }
  for (; i < end; ++i) dxr[i] = from_acc<Out>(map.scalar(to_acc(dyr[i]), to_acc(z[i]), s));
  return i;
}

// The writing pass of a row: its first `head` elements plainly, its vector pairs (kStream: with streaming stores),
// its tail plainly.
template <bool kStream, typename In, typename Z, typename Out, typename Map>
C10_ALWAYS_INLINE void softmax_bwd_write_row(const In* dyr, const Z* z, Out* dxr, int64_t D, int64_t head,
                                             typename Io<In>::A s, const Map& map) {
  using IO = Io<In>;
  using V = typename IO::V;
  constexpr int64_t kStep = 2 * IO::kV;
  const V vs(s);
  int64_t i = softmax_bwd_write_plain(dyr, z, dxr, 0, head, vs, s, map);
  // Lane order where dy, z and dx are of one type; else (the fused casts, z = exp(y) in float) element order.
  constexpr bool kLanes = std::is_same_v<In, Z> && std::is_same_v<In, Out>;
  for (; i + kStep <= D; i += kStep) {
    V g0, g1, z0, z1;
    load2_in<kLanes>(dyr + i, g0, g1);
    load2_in<kLanes>(z + i, z0, z1);
    const V d0 = map.vec(g0, z0, vs), d1 = map.vec(g1, z1, vs);
    if constexpr (kStream) stream2_in<kLanes>(dxr + i, d0, d1);
    else store2_in<kLanes>(dxr + i, d0, d1);
  }
  softmax_bwd_write_plain(dyr, z, dxr, i, D, vs, s, map);
}

template <bool kLog, bool kExpFirst, bool kStream, typename In, typename Out>
void softmax_bwd_row(const In* dyr, const In* yr, Out* dxr, int64_t D, typename Io<In>::A* e) {
  const typename Io<In>::A s = softmax_bwd_row_sum<kLog, kExpFirst>(dyr, yr, D, e);
  const int64_t head =
      kStream ? std::min<int64_t>(D, int64_t((kStreamAlign - reinterpret_cast<std::uintptr_t>(dxr) % kStreamAlign) %
                                             kStreamAlign / sizeof(Out)))
              : 0;
  if constexpr (kExpFirst) softmax_bwd_write_row<kStream>(dyr, e, dxr, D, head, s, BwdMapExpRow{});
  else softmax_bwd_write_row<kStream>(dyr, yr, dxr, D, head, s, BwdMapOutput<kLog>{});
}

template <typename In, typename Out, bool kLog>
void softmax_lastdim_bwd(const In* dy, const In* y, Out* dx, const SoftmaxShape& shape) {
  using IO = Io<In>;
  using A = typename IO::A;
  constexpr int64_t kStep = 2 * IO::kV;
  const int64_t D = shape.dim_size;
  const bool large = shape.outer * D * int64_t{sizeof(Out)} >= kStreamBytes;  // streaming stores (kStreamBytes)
  const int64_t grain = std::max<int64_t>(1, kGrain / D);
  if (D <= kBwdRegisterPairs<In> * kStep) {  // softmax_bwd_row_in_registers
    static_assert(kBwdRegisterPairs<In> * kStep <= StreamStager<Out>::kMaxPiece);
    parallel_for(shape.outer, grain, [&](int64_t r0, int64_t r1) {
      for_each_output_row(dx, D, r0, r1, large, [&](int64_t r, Out* dxr) {
        softmax_bwd_row_in_registers<kLog, In, Out>(dy + r * D, y + r * D, dxr, D);
      });
    });
    return;
  }
  // Where dx is large, rows of up to kStagedBwdRowBytes go through a StreamStager; longer rows stream their vector
  // pairs after a head of plain stores up to the alignment.
  const bool staged = large && D * int64_t{sizeof(Out)} <= kStagedBwdRowBytes;
  const bool stream = large && !staged;
  // 16-bit log_softmax: exp(y) of the summing pass into a row of scratch (log_softmax_bwd_exp_first says why).
  const bool exp_first = log_softmax_bwd_exp_first<kLog, In>(D);
  const auto rows = [&](auto exp_first_c, auto stream_c) {
    constexpr bool kExpFirst = decltype(exp_first_c)::value;
    constexpr bool kStream = decltype(stream_c)::value;
    parallel_for(shape.outer, grain, [&](int64_t r0, int64_t r1) {
      std::unique_ptr<A[]> exp_row(kExpFirst ? new A[D] : nullptr);
      A* const e = exp_row.get();
      for_each_output_row(dx, D, r0, r1, staged, [&](int64_t r, Out* dxr) {
        softmax_bwd_row<kLog, kExpFirst, kStream>(dy + r * D, y + r * D, dxr, D, e);
      });
      if constexpr (kStream) stream_fence();
    });
  };
  const auto with_stream = [&](auto exp_first_c) {
    if (stream) rows(exp_first_c, std::true_type{});
    else rows(exp_first_c, std::false_type{});
  };
  if constexpr (kLog && sizeof(In) == 2) {
    if (exp_first) {
      with_stream(std::true_type{});
      return;
    }
  }
  with_stream(std::false_type{});
}

template <typename In, typename Out, bool kLog, int NV>
void softmax_cols_bwd(const In* dy, const In* y, Out* dx, int64_t D, int64_t inner) {
  using IO = Io<In>;
  using A = typename IO::A;
  using V = typename IO::V;
  using L = Lanes<IO, NV>;
  L s;
  for (auto& v : s.v) v = V(A(0));
  for (int64_t d0 = 0; d0 < D; d0 += kSumRows) {
    L part;
    for (auto& v : part.v) v = V(A(0));
    for (int64_t d = d0; d < std::min(D, d0 + kSumRows); ++d) {
      L g, o;
      g.load(dy + d * inner);
      o.load(y + d * inner);
      for (int k = 0; k < NV; ++k) part.v[k] = part.v[k] + VecBackward<kLog>::term(g.v[k], o.v[k]);
    }
    for (int k = 0; k < NV; ++k) s.v[k] = s.v[k] + part.v[k];
  }
  for (int64_t d = 0; d < D; ++d) {
    L g, o;
    g.load(dy + d * inner);
    o.load(y + d * inner);
    for (int k = 0; k < NV; ++k) g.v[k] = VecBackward<kLog>::map(g.v[k], o.v[k], s.v[k]);
    g.store(dx + d * inner);
  }
}

// The backward of a group of up to kV columns in lanes across slabs, as softmax_turned_cols_fwd takes them (dy and y
// turned, the sum, then dx; longer columns than kSumRows through the buffers a block of rows at a time in each pass).
template <typename In, typename Out, bool kLog>
void softmax_turned_cols_bwd(const In* dy, const In* y, Out* dx, int64_t D, int64_t inner, const TurnedSegment* segs,
                             int64_t nsegs, int64_t n, const TurnedColumns<In, Out, 2>& buf) {
  using IO = Io<In>;
  using A = typename IO::A;
  using V = typename IO::V;
  constexpr int64_t kV = IO::kV;
  In* const gt = buf.in(0);  // [d - d0][lane]
  In* const ot = buf.in(1);
  Out* const dt = buf.out();
  const bool once = D <= kSumRows;
  const auto turn_in = [&](int64_t d0, int64_t d1) {
    turn_cols_in<In, kV>(dy, inner, segs, nsegs, n, d0, d1, gt);
    turn_cols_in<In, kV>(y, inner, segs, nsegs, n, d0, d1, ot);
  };
  if (once) turn_in(0, D);
  V s(A(0));
  for (int64_t d0 = 0; d0 < D; d0 += kSumRows) {
    const int64_t rows = std::min(D - d0, kSumRows);
    if (!once) turn_in(d0, d0 + rows);
    V part(A(0));
    for (int64_t d = 0; d < rows; ++d)
      part = part + VecBackward<kLog>::term(IO::load(gt + d * kV), IO::load(ot + d * kV));
    s = s + part;
  }
  for (int64_t d0 = 0; d0 < D; d0 += kSumRows) {
    const int64_t rows = std::min(D - d0, kSumRows);
    if (!once) turn_in(d0, d0 + rows);
    for (int64_t d = 0; d < rows; ++d)
      Io<Out>::store(dt + d * kV, VecBackward<kLog>::map(IO::load(gt + d * kV), IO::load(ot + d * kV), s));
    turn_cols_out<Out, kV>(dt, inner, segs, nsegs, d0, rows, dx);
  }
}

// `width` columns from each row of dy / y / dx (rows `inner` apart); `whole`: they are all of the row (width ==
// inner), so that the slab is one block and the vector pair at row d's last columns runs on into row d + 1: there
// it is loaded and stored whole (the stored lanes past the row are written again with row d + 1; dx aliases
// neither input), but for the last row.
template <typename In, typename Out, bool kLog>
void softmax_cols_bwd_wide(const In* dy, const In* y, Out* dx, int64_t D, int64_t inner, int64_t width, bool whole,
                           const RunState<typename Io<In>::A>& state) {
  using IO = Io<In>;
  using A = typename IO::A;
  using V = typename IO::V;
  constexpr int64_t kV = IO::kV, kStep = 2 * kV;
  const int64_t full = width / kStep * kStep, tail = width - full;  // the tail in zero-filled lanes
  const int64_t padded = full + (tail > 0 ? kStep : 0);
  // Row d's pair of dy and y at its last columns: whole where it runs on into row d + 1, else the tail's lanes.
  const auto runs_on = [&](int64_t d) { return whole && d + 1 < D; };
  const auto load_tail = [&](int64_t d, V& g0, V& g1, V& y0, V& y1) {
    if (runs_on(d)) {
      IO::load2(dy + d * inner + full, g0, g1);
      IO::load2(y + d * inner + full, y0, y1);
    } else {
      load2_tail(dy + d * inner + full, tail, A(0), g0, g1);
      load2_tail(y + d * inner + full, tail, A(0), y0, y1);
    }
  };
  A* const sum = state.array(0);
  A* const part = state.array(1);
  std::fill(sum, sum + padded, A(0));
  for (int64_t d0 = 0; d0 < D; d0 += kSumRows) {
    std::fill(part, part + padded, A(0));
    for (int64_t d = d0; d < std::min(D, d0 + kSumRows); ++d) {
      V g0, g1, y0, y1;
      for (int64_t c = 0; c < full; c += kStep) {
        IO::load2(dy + d * inner + c, g0, g1);
        IO::load2(y + d * inner + c, y0, y1);
        (V::loadu(part + c) + VecBackward<kLog>::term(g0, y0)).store(part + c);
        (V::loadu(part + c + kV) + VecBackward<kLog>::term(g1, y1)).store(part + c + kV);
      }
      if (tail > 0) {
        load_tail(d, g0, g1, y0, y1);
        (V::loadu(part + full) + VecBackward<kLog>::term(g0, y0)).store(part + full);
        (V::loadu(part + full + kV) + VecBackward<kLog>::term(g1, y1)).store(part + full + kV);
      }
    }
    for (int64_t c = 0; c < padded; c += kV) (V::loadu(sum + c) + V::loadu(part + c)).store(sum + c);
  }
  for (int64_t d = 0; d < D; ++d) {
    V g0, g1, y0, y1;
    for (int64_t c = 0; c < full; c += kStep) {
      IO::load2(dy + d * inner + c, g0, g1);
      IO::load2(y + d * inner + c, y0, y1);
      Io<Out>::store2(dx + d * inner + c, VecBackward<kLog>::map(g0, y0, V::loadu(sum + c)),
                      VecBackward<kLog>::map(g1, y1, V::loadu(sum + c + kV)));
    }
    if (tail > 0) {
      load_tail(d, g0, g1, y0, y1);
      const V d0 = VecBackward<kLog>::map(g0, y0, V::loadu(sum + full));
      const V d1 = VecBackward<kLog>::map(g1, y1, V::loadu(sum + full + kV));
      if (runs_on(d)) Io<Out>::store2(dx + d * inner + full, d0, d1);
      else store2_tail(dx + d * inner + full, tail, d0, d1);
    }
  }
}

// Columns [c0, c1) of one slab: blocks of two vectors, then one vector (c1 - c0 a multiple of kV: the columns past a
// slab's last vector go in lanes across slabs, softmax_turned_cols_bwd); or, with `state` (where the runs apply at
// some thread count: strided_runs_apply), the columns past the last pair in the runs' lanes. As
// softmax_strided_block_fwd.
template <typename In, typename Out, bool kLog>
void softmax_strided_block_bwd(const In* dy, const In* y, Out* dx, int64_t D, int64_t inner, int64_t c0, int64_t c1,
                               const RunState<typename Io<In>::A>* state) {
  constexpr int64_t kV = Io<In>::kV;
  int64_t c = c0;
  for (; c + 2 * kV <= c1; c += 2 * kV) softmax_cols_bwd<In, Out, kLog, 2>(dy + c, y + c, dx + c, D, inner);
  if (state != nullptr) {
    if (c < c1) softmax_cols_bwd_wide<In, Out, kLog>(dy + c, y + c, dx + c, D, inner, c1 - c, /*whole=*/false, *state);
    return;
  }
  for (; c < c1; c += kV) softmax_cols_bwd<In, Out, kLog, 1>(dy + c, y + c, dx + c, D, inner);
}

// Task = (outer index, chunk of columns); dy, y and dx dense [outer, D, inner]. Each chunk: wide (strided_run_width),
// all of its columns at once; else softmax_strided_block_bwd; where the runs do not apply and inner is no multiple of
// kV, the tasks are TurnedTasks' (the columns left in lanes across slabs, softmax_turned_cols_bwd), as the forward's.
template <typename In, typename Out, bool kLog>
void softmax_strided_bwd(const In* dy, const In* y, Out* dx, const SoftmaxShape& shape) {
  constexpr int64_t kV = Io<In>::kV, kBlock = 2 * kV;
  const int64_t D = shape.dim_size, inner = shape.inner;
  if (const int64_t w = turned_group_width<In>(shape.outer, D, inner, parallel_threads(), /*backward=*/true)) {
    const TurnedTasks<In> tasks(shape, w);
    parallel_for(tasks.count(), std::max<int64_t>(1, kGrain / (D * kV)), [&](int64_t t0, int64_t t1) {
      const TurnedColumns<In, Out, 2> buf(D);
      for (int64_t t = t0; t < t1; ++t) {
        tasks.run(
            t,
            [&](int64_t offset, int64_t c0, int64_t c1) {
              softmax_strided_block_bwd<In, Out, kLog>(dy + offset, y + offset, dx + offset, D, inner, c0, c1,
                                                       nullptr);
            },
            [&](const TurnedSegment* segs, int64_t nsegs, int64_t n) {
              softmax_turned_cols_bwd<In, Out, kLog>(dy, y, dx, D, inner, segs, nsegs, n, buf);
            });
      }
    });
    return;
  }
  const int64_t width = strided_run_width<In>(shape.outer, D, inner, parallel_threads(), /*streaming=*/true);
  const bool wide = width > kBlock;
  const int64_t chunks = ceil_div(inner, width);
  parallel_for(shape.outer * chunks, std::max<int64_t>(1, kGrain / (D * std::min(inner, width))),
               [&](int64_t t0, int64_t t1) {
                 // The runs (wide implies them), or a slab's columns past its last vector in the runs' lanes.
                 const bool lanes = strided_runs_apply(D, inner) || inner % kV != 0;
                 const RunState<typename Io<In>::A> state(lanes ? width : 0);
                 for (int64_t t = t0; t < t1; ++t) {
                   const int64_t o = t / chunks, c0 = (t % chunks) * width, c1 = std::min(inner, c0 + width);
                   const int64_t offset = o * D * inner;
                   if (wide) {  // a last chunk under a vector pair too: the same arithmetic whatever the width
                     softmax_cols_bwd_wide<In, Out, kLog>(dy + offset + c0, y + offset + c0, dx + offset + c0, D,
                                                          inner, c1 - c0, chunks == 1, state);
                   } else {
                     softmax_strided_block_bwd<In, Out, kLog>(dy + offset, y + offset, dx + offset, D, inner, c0, c1,
                                                              lanes ? &state : nullptr);
                   }
                 }
               });
}

template <typename In, typename Out>
void softmax_bwd_any(const In* dy, const In* y, Out* dx, const SoftmaxShape& shape, bool log) {
  if (shape.inner == 1 && softmax_rows_turned<In>(shape.dim_size, /*backward=*/true)) {
    if (log) softmax_short_rows_bwd<In, Out, true>(dy, y, dx, shape);
    else softmax_short_rows_bwd<In, Out, false>(dy, y, dx, shape);
  } else if (shape.inner == 1) {
    if (log) softmax_lastdim_bwd<In, Out, true>(dy, y, dx, shape);
    else softmax_lastdim_bwd<In, Out, false>(dy, y, dx, shape);
  } else {
    if (log) softmax_strided_bwd<In, Out, true>(dy, y, dx, shape);
    else softmax_strided_bwd<In, Out, false>(dy, y, dx, shape);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The entry points (csrc/cpu/kernels.h: TypedKernels).

template <typename T>
void softmax_fwd(const T* x, T* y, const SoftmaxShape& shape, bool log) {
  softmax_fwd_any<T, T>(x, y, shape, log);
}
template <typename T>
void softmax_fwd_to_float(const T* x, float* y, const SoftmaxShape& shape, bool log) {
  softmax_fwd_any<T, float>(x, y, shape, log);
}
template <typename T>
void softmax_bwd(const T* dy, const T* y, T* dx, const SoftmaxShape& shape, bool log) {
  softmax_bwd_any<T, T>(dy, y, dx, shape, log);
}
template <typename T>
void softmax_bwd_from_float(const float* dy, const float* y, T* dx, const SoftmaxShape& shape, bool log) {
  softmax_bwd_any<float, T>(dy, y, dx, shape, log);
}

template <typename T>
int64_t softmax_strided_columns(const SoftmaxShape& shape, bool backward) {
  return strided_run_width<T>(shape.outer, shape.dim_size, shape.inner, parallel_threads(), /*streaming=*/backward);
}

template <typename T>
int64_t softmax_strided_lane_group(const SoftmaxShape& shape, bool backward) {
  return turned_group_width<T>(shape.outer, shape.dim_size, shape.inner, parallel_threads(), backward);
}

// The entry points of the kernel table (csrc/cpu/kernels.h), for every element type; the fused casts for
// the 16-bit types only.
#define FASTACT_SOFTMAX_ENTRIES(T)                                                                          \
  template void softmax_fwd<T>(const T*, T*, const SoftmaxShape&, bool);                                    \
  template void softmax_bwd<T>(const T*, const T*, T*, const SoftmaxShape&, bool);                          \
  template int64_t softmax_strided_columns<T>(const SoftmaxShape&, bool);                                   \
  template int64_t softmax_strided_lane_group<T>(const SoftmaxShape&, bool);
#define FASTACT_SOFTMAX_CAST_ENTRIES(T)                                                                     \
  template void softmax_fwd_to_float<T>(const T*, float*, const SoftmaxShape&, bool);                       \
  template void softmax_bwd_from_float<T>(const float*, const float*, T*, const SoftmaxShape&, bool);
FASTACT_SOFTMAX_ENTRIES(float)
FASTACT_SOFTMAX_ENTRIES(double)
FASTACT_SOFTMAX_ENTRIES(c10::Half)
FASTACT_SOFTMAX_ENTRIES(c10::BFloat16)
FASTACT_SOFTMAX_CAST_ENTRIES(c10::Half)
FASTACT_SOFTMAX_CAST_ENTRIES(c10::BFloat16)
#undef FASTACT_SOFTMAX_ENTRIES
#undef FASTACT_SOFTMAX_CAST_ENTRIES
}  // namespace CPU_CAPABILITY
}  // namespace fastact::cpu
