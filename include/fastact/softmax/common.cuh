// Pieces every softmax kernel shares: the forward-cache adapter over the math epilogues, the
// NaN-preserving online (max, sum) combine, the row and column all-reductions (warp -> block ->
// cluster), and the launch helper (plain or cluster launch, 1-D grid).
//
// Conventions of all softmax kernels:
//   * in_t / out_t are the element types (forward: x / y; backward: grad_input / grad_output and
//     output); A = acc_t<out_t> is the arithmetic type (float, or double for double).
//   * Sizes and offsets are int64_t. Grids are 1-D, one work item (row block, row, tile, chunk) per
//     CTA or cluster: a loop carried across work items costs registers that the cached row needs.
//     Beyond 2^30 blocks the host launches again from a later first item.
//   * Reductions are deterministic: fixed trees; atomics only order (grid.cuh's tickets and arrival
//     counters), they never sum; every thread (and every CTA of a cluster or of a grid-mode row) ends
//     with bitwise the same row statistics.
//   * torch semantics for non-finite rows: padding and masked lanes hold -inf (forward) or 0
//     (backward), which never changes a finite result, and a row of all -inf, or one holding NaN or
//     +inf, gives NaN as torch does.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>

#include "fastact/cluster.cuh"
#include "fastact/dispatch.h"
#include "fastact/grid_sync.cuh"
#include "fastact/math.h"
#include "fastact/reduce.cuh"
#include "fastact/vec.cuh"

namespace fastact::softmax_impl {

template <typename A>
FASTACT_HOST_DEVICE A neg_inf() {
  return -std::numeric_limits<A>::infinity();
}

// q = a / b, r = a % b for a >= 0, b > 0. 64-bit division is a subroutine call on the GPU (whose
// calling convention forces spills in a kernel that holds a row in registers); take the inline 32-bit
// path whenever both operands fit, which is every tensor below 2^32 elements.
FASTACT_DEVICE void divmod_nonneg(int64_t a, int64_t b, int64_t& q, int64_t& r) {
  if (((a | b) >> 32) == 0) {
    const uint32_t q32 = static_cast<uint32_t>(a) / static_cast<uint32_t>(b);
    q = q32;
    r = a - int64_t(q32) * b;
  } else {
    q = a / b;
    r = a - q * b;
  }
}

// Conversions between element vectors and accumulation values: static_cast per element by default;
// for the 16-bit types, PackedElementConvert below.
template <typename T>
struct ElementConvert {
  template <typename A, int N>
  static FASTACT_DEVICE void to_acc(const AlignedVector<T, N>& v, A (&out)[N]) {
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = static_cast<A>(v.val[k]);
  }
  template <typename A, int N>
  static FASTACT_DEVICE AlignedVector<T, N> from_acc(const A (&in)[N]) {
    AlignedVector<T, N> v;
#pragma unroll
    for (int k = 0; k < N; ++k) v.val[k] = static_cast<T>(in[k]);
    return v;
  }
};

// The two 16-bit float layouts: IEEE half and bfloat16.
enum class Packed16 { kHalf, kBFloat16 };

// ElementConvert for a 2-byte T holding kKind's bits: CUDA's __half / __nv_bfloat16 (specialised
// below; the torch adapter instantiates the kernels with these, c10's types reinterpreted). Whole
// 32-bit words, two elements at a time: a 16-bit type's own conversion goes through its 16-bit member,
// and ptxas then gives every element a register of its own, which spilled the register-bound kernels
// (H100, bf16 softmax over dim 0 of [16384, 8192], __nv_bfloat16 by element: 500 us, 0.36 of the limit,
// where c10::BFloat16 by words ran at 0.77). Widening is exact;
// narrowing rounds to nearest even (as c10::Half(float) and c10::BFloat16(float) do on the device).
template <typename T, Packed16 kKind>
struct PackedElementConvert {
  static_assert(sizeof(T) == 2, "a 16-bit element");
  template <typename A, int N>
  static FASTACT_DEVICE void to_acc(const AlignedVector<T, N>& v, A (&out)[N]) {
    if constexpr (N % 2 == 0) {
      if constexpr (kKind == Packed16::kHalf) {
        const auto* w = reinterpret_cast<const __half2*>(&v);
#pragma unroll
        for (int i = 0; i < N / 2; ++i) {
          const float2 f = __half22float2(w[i]);
          out[2 * i] = static_cast<A>(f.x);
          out[2 * i + 1] = static_cast<A>(f.y);
        }
      } else {
        const auto* w = reinterpret_cast<const unsigned*>(&v);
#pragma unroll
        for (int i = 0; i < N / 2; ++i) {
          out[2 * i] = static_cast<A>(__uint_as_float(w[i] << 16));              // low half: element 2i
          out[2 * i + 1] = static_cast<A>(__uint_as_float(w[i] & 0xffff0000u));  // high half: element 2i+1
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) {
        unsigned short b;
        memcpy(&b, &v.val[i], 2);
        if constexpr (kKind == Packed16::kHalf) {
          out[i] = static_cast<A>(__half2float(__ushort_as_half(b)));
        } else {
          out[i] = static_cast<A>(__uint_as_float(static_cast<unsigned>(b) << 16));
        }
      }
    }
  }
  template <typename A, int N>
  static FASTACT_DEVICE AlignedVector<T, N> from_acc(const A (&in)[N]) {
    AlignedVector<T, N> v;
    if constexpr (N % 2 == 0) {
#pragma unroll
      for (int i = 0; i < N / 2; ++i) {
        const float lo = static_cast<float>(in[2 * i]), hi = static_cast<float>(in[2 * i + 1]);
        if constexpr (kKind == Packed16::kHalf) {
          reinterpret_cast<__half2*>(&v)[i] = __floats2half2_rn(lo, hi);
        } else {
          reinterpret_cast<__nv_bfloat162*>(&v)[i] = __floats2bfloat162_rn(lo, hi);
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const float f = static_cast<float>(in[i]);
        unsigned short b;
        if constexpr (kKind == Packed16::kHalf) {
          b = __half_as_ushort(__float2half_rn(f));
        } else {
          b = __bfloat16_as_ushort(__float2bfloat16_rn(f));
        }
        memcpy(&v.val[i], &b, 2);
      }
    }
    return v;
  }
};

template <>
struct ElementConvert<__half> : PackedElementConvert<__half, Packed16::kHalf> {};
template <>
struct ElementConvert<__nv_bfloat16> : PackedElementConvert<__nv_bfloat16, Packed16::kBFloat16> {};

// m[k] = max(m[k], v[j][k] for j < n): the elementwise max of n loaded vectors (the strided forward's
// rows kept as loaded), each converted and compared.
template <typename T, typename A, int N, int R>
FASTACT_DEVICE void element_max_converted(const AlignedVector<T, N> (&v)[R], int n, A (&m)[N]) {
#pragma unroll
  for (int j = 0; j < R; ++j) {
    if (j < n) {
      A w[N];
      ElementConvert<T>::template to_acc<A, N>(v[j], w);
#pragma unroll
      for (int k = 0; k < N; ++k) m[k] = MaxOp<A>()(m[k], w[k]);
    }
  }
}

// The same as a trait: PackedElementMax below for the 16-bit types (specialised after it for CUDA's):
// packed 16-bit max, exact and without conversions, half an
// instruction an element where converting and comparing take two.
template <typename T>
struct ElementMax {
  template <typename A, int N, int R>
  static FASTACT_DEVICE void into(const AlignedVector<T, N> (&v)[R], int n, A (&m)[N]) {
    element_max_converted(v, n, m);
  }
};

// ElementMax for a 16-bit T: a running max of the loaded 32-bit words, two elements each, by
// max.f16x2 / max.bf16x2 (sm_80+; NaN as fmaxf), widened once at the end. Exact: a max of 16-bit values
// is one of them.
template <typename T, Packed16 kKind>
struct PackedElementMax {
  static_assert(sizeof(T) == 2, "two elements a 32-bit word");
  template <typename A, int N, int R>
  static FASTACT_DEVICE void into(const AlignedVector<T, N> (&v)[R], int n, A (&m)[N]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (N % 2 == 0) {
      constexpr unsigned kNegInf = kKind == Packed16::kHalf ? 0xfc00fc00u : 0xff80ff80u;
      AlignedVector<T, N> acc;
      auto* mw = reinterpret_cast<unsigned*>(&acc);
#pragma unroll
      for (int i = 0; i < N / 2; ++i) mw[i] = kNegInf;
#pragma unroll
      for (int j = 0; j < R; ++j) {
        if (j < n) {
          const auto* w = reinterpret_cast<const unsigned*>(&v[j]);
#pragma unroll
          for (int i = 0; i < N / 2; ++i) mw[i] = max2(mw[i], w[i]);
        }
      }
      A w[N];
      ElementConvert<T>::template to_acc<A, N>(acc, w);
#pragma unroll
      for (int k = 0; k < N; ++k) m[k] = MaxOp<A>()(m[k], w[k]);
      return;
    }
#endif
    element_max_converted(v, n, m);
  }

 private:
  static FASTACT_DEVICE unsigned max2(unsigned a, unsigned b) {
    unsigned r = a;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (kKind == Packed16::kHalf) {
      asm("max.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    } else {
      asm("max.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    }
#else
    (void)b;
#endif
    return r;
  }
};

template <>
struct ElementMax<__half> : PackedElementMax<__half, Packed16::kHalf> {};
template <>
struct ElementMax<__nv_bfloat16> : PackedElementMax<__nv_bfloat16, Packed16::kBFloat16> {};

template <typename A, typename T, int N>
FASTACT_DEVICE void to_acc(const AlignedVector<T, N>& v, A (&out)[N]) {
  ElementConvert<T>::template to_acc<A, N>(v, out);
}
template <typename T, typename A, int N>
FASTACT_DEVICE AlignedVector<T, N> from_acc(const A (&in)[N]) {
  return ElementConvert<T>::template from_acc<A, N>(in);
}

// LoadDependence (vec.cuh) in the softmax backwards: a value reduced over a row, made to depend on loads whose
// values it does not use, unchanged. Why: log_softmax's backward reduces grad_output alone and reads the output
// only after the reduction, and ptxas issued the output's loads after the reduction's first shuffle, once
// grad_output had arrived: a row waited on two memory latencies where softmax's backward, which reduces both,
// waits on one. Folded into the reduced value, the output's loads go out with grad_output's. take() belongs in
// the loop that adds the row's terms, under its guard: a loop of its own, guarded again, cost ptxas's predicates
// registers (P2R). Where: output_loads_with_reduction.
// Whether a backward with epilogue Epi and outputs out_t takes its output's loads into its reduction
// (LoadDependence): log_softmax with float outputs. H100, us, without -> with the dependence:
// 8 MB f32 [209, 10000] 6.80 -> 6.12 (torch 6.20), [419, 5000] 5.97 -> 5.70,
// [3634, 577] 6.10 -> 5.71; 256 MB [67041, 1001] 275.1 -> 268.3; lost: 8 MB [13981, 150] 5.69 -> 6.21,
// [69, 30000] 7.45 -> 7.71. 16-bit outputs lose: there the later loads overlap the reduction (8 MB
// [64, 65536] bf16 7.19 -> 8.03, the cluster's exchange being long) or the kernel is bound by issue
// (256 MB bf16 [26843545, 5] 289.7 -> 373.3). double: not measured.
template <typename Epi, typename out_t>
constexpr bool output_loads_with_reduction() {
  return !Epi::kTermUsesOutput && sizeof(out_t) == 4;
}

// exp(d), d <= 0 (an element minus a max), in the kernels that cache the row (ForwardCache): in float
// the SFU's ex2.approx.ftz of d * log2(e): a multiply and one MUFU, where exp2f adds a compare and two
// predicated multiplies per element to produce subnormal results, and expf twice that. Why: the
// 16-bit forwards are bound by issue, not memory (ncu on the H100: 0.68 instructions a cycle per
// scheduler in the long-row and strided bf16 forwards). Error: ex2.approx's 2 ulp plus the product's
// rounding, |d| * 2^-24 relative: under 1e-6 where d > -16 (values above 1e-7); far below the float
// tolerances. A result below 2^-126 (d < -87.3) is 0 where torch gives a subnormal: an absolute error
// under 1.2e-38.
FASTACT_DEVICE float cached_exp(float d) { return math::exp_sfu(d); }
FASTACT_DEVICE double cached_exp(double d) { return math::exp_(d); }

// How a kernel that holds the row in registers applies an epilogue. Per element it keeps
// t = keep(x, m) and sums term(t, m), for a max m; once the row's max M and c = row_constant(sum) are
// known it writes out(epi, t, M, f), f = factor(m, M, c).
//   Two reductions (warp and strided kernels): m = M, the row's max; f = c.
//   One reduction (block kernel): m is the thread's own max, so the thread's (m, sum) pair and the
//   row's pairs combine in a single all-reduce (OnlineOp); factor rescales: exp(m - M) * c for
//   softmax, c otherwise. A thread whose max is -inf keeps against max_base(m) = 0 (below), so its
//   kept exp(-inf - 0) are 0, and its factor exp(-inf - M) is 0 too (NaN for a row of all -inf, as
//   torch).
// KeepInput (log_softmax, and every epilogue in kernels that cache the input as loaded): keep x, sum
// exp(x - m), write epi.forward(x, M, c). ForwardCache<Softmax> keeps exp(x - m) instead, so exp runs
// once per element; out = kept * f, SoftmaxEpilogue::forward's formula when m = M.
struct KeepInputTerms {
  static constexpr bool kKeepsInput = true;  // keep() is the identity: a cache of the input stays as it is
  template <typename A>
  static FASTACT_DEVICE A keep(A x, A /*max*/) {
    return x;
  }
  template <typename A>
  static FASTACT_DEVICE A term(A kept, A max) {
    return cached_exp(kept - max);
  }
  template <typename A>
  static FASTACT_DEVICE A factor(A /*own_max*/, A /*row_max*/, A c) {
    return c;
  }
};

template <typename Epi>
struct KeepInput : KeepInputTerms {
  template <typename A>
  static FASTACT_DEVICE A out(const Epi& epi, A kept, A row_max, A f) {
    return epi.forward(kept, row_max, f);
  }
};

// Softmax from the input itself: exp(x - M) * c with the cached kernels' exp (two exps per element).
template <>
struct KeepInput<math::SoftmaxEpilogue> : KeepInputTerms {
  template <typename A>
  static FASTACT_DEVICE A out(const math::SoftmaxEpilogue&, A kept, A row_max, A f) {
    return cached_exp(kept - row_max) * f;
  }
};

template <typename Epi>
struct ForwardCache : KeepInput<Epi> {};

template <>
struct ForwardCache<math::SoftmaxEpilogue> {
  static constexpr bool kKeepsInput = false;
  template <typename A>
  static FASTACT_DEVICE A keep(A x, A max) {
    return cached_exp(x - max);
  }
  template <typename A>
  static FASTACT_DEVICE A term(A kept, A /*max*/) {
    return kept;
  }
  template <typename A>
  static FASTACT_DEVICE A factor(A own_max, A row_max, A c) {
    return cached_exp(own_max - row_max) * c;  // exp(x - M) / sum = exp(x - m) * exp(m - M) / sum
  }
  template <typename A>
  static FASTACT_DEVICE A out(const math::SoftmaxEpilogue&, A kept, A /*row_max*/, A f) {
    return kept * f;
  }
};

// The base that values with max m are exponentiated against, exp(x - base): m, or 0 when m is -inf
// (every value -inf or NaN, or none), so that the terms are exp(-inf) = 0 (or NaN), never
// exp(-inf + inf). Used by the one-reduction form and by the online (max, sum) combines.
template <typename A>
FASTACT_DEVICE A max_base(A m) {
  return m == neg_inf<A>() ? A(0) : m;
}

// Combine of two (max, sum of exp(x - max)) partials that keeps NaN: a partial whose max is -inf
// (it saw only -inf, or NaN, or nothing) contributes sum * 0, which is 0 unless its sum is NaN.
// Commutative bit for bit (so butterfly reductions agree in every lane). reduce.cuh's MaxSumOp drops
// such a partial's sum instead, which would lose a NaN that torch propagates.
template <typename A>
struct OnlineOp {
  FASTACT_DEVICE MaxSum<A> operator()(MaxSum<A> a, MaxSum<A> b) const {
    const A m = a.max > b.max ? a.max : b.max;
    const A ms = max_base(m);
    return {m, a.sum * math::exp_(a.max - ms) + b.sum * math::exp_(b.max - ms)};
  }
  static FASTACT_HOST_DEVICE MaxSum<A> identity() { return {neg_inf<A>(), A(0)}; }
};

// Combine of (max, sum) partials whose max is never -inf (the raw strided forward starts its maxes at
// the lowest finite float, so a thread without finite values holds (lowest, 0), or a NaN sum): no
// max_base select, the cached kernels' exp (ex2.approx), and the two products and their sum each
// rounded on its own (no FMA contraction), so that op(a, b) and op(b, a) agree bit for bit
// (butterflies give every lane the same value). A +inf max gives exp(inf - inf) = NaN, as torch.
struct FiniteMaxSumOp {
  FASTACT_DEVICE MaxSum<float> operator()(MaxSum<float> a, MaxSum<float> b) const {
    const float m = fmaxf(a.max, b.max);
    return {m, __fadd_rn(__fmul_rn(a.sum, cached_exp(a.max - m)), __fmul_rn(b.sum, cached_exp(b.max - m)))};
  }
};

// Folds N values into a running (max, sum): one exp per value plus one rescale per batch. Masked
// values are -inf and add exp(-inf) = 0.
template <typename A, int N>
FASTACT_DEVICE void online_update(MaxSum<A>& st, const A (&v)[N]) {
  A m = st.max;
#pragma unroll
  for (int i = 0; i < N; ++i) m = v[i] > m ? v[i] : m;
  const A ms = max_base(m);
  A s = st.sum * math::exp_(st.max - ms);
#pragma unroll
  for (int i = 0; i < N; ++i) s += math::exp_(v[i] - ms);
  st.max = m;
  st.sum = s;
}

template <typename A, int N, int M>
FASTACT_DEVICE void online_update(MaxSum<A>& st, const A (&v)[N][M]) {
  A m = st.max;
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int k = 0; k < M; ++k) m = v[i][k] > m ? v[i][k] : m;
  }
  const A ms = max_base(m);
  A s = st.sum * math::exp_(st.max - ms);
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int k = 0; k < M; ++k) s += math::exp_(v[i][k] - ms);
  }
  st.max = m;
  st.sum = s;
}

// ------------------------------------------------------------------------------------------------
// Row all-reduce: one value per thread, reduced over the block and then over the cluster.

// Two buffers, used alternately by successive rounds (`round` counts them): a buffer is rewritten
// two rounds later, after every thread has passed the intervening round's barrier, i.e. after every
// thread finished reading it. So one barrier per round suffices.
//
// In a cluster, each CTA pushes its block's value into slot cta[ring][its rank] of every CTA
// (push_to_peer) and waits on its own bar[ring] until all `cluster` values have landed: no cluster
// barrier, whose release would wait for this thread's earlier global stores (cluster.cuh). A ring is
// reused two rounds later for the same reason as above: a peer pushes round r + 2 only once it holds
// round r + 1's values, which this CTA pushes after its block barrier of round r + 1, which every
// thread passes after reading round r's slots. bar[ring] completes one phase per use: round r waits
// for parity (r / 2) % 2.
template <typename V>
struct RowScratch {
  V warp[2][kWarpSize];
  alignas(16) V cta[2][kMaxCluster];
  uint64_t bar[2];
};

// The cluster exchange of pushed partials (row_allreduce, column_allreduce), on two mbarriers bar[2]
// used alternately by rounds: round r counts its bytes on bar[r % 2], whose (r / 2)-th phase it is.
//
// Every thread of a kernel that exchanges in a cluster (cluster > 1) calls exchange_init first: one
// thread sets the mbarriers up, and every thread arrives on the cluster barrier, which round 0 waits on
// before pushing into a peer (so the loads in between overlap it).
FASTACT_DEVICE void exchange_init(uint64_t* bar, int cluster) {
  if (cluster > 1) {
    if (threadIdx.x == 0) {
      mbarrier_init(&bar[0], 1);
      mbarrier_init(&bar[1], 1);
      fence_mbarrier_init();
    }
    __syncwarp();
    cluster_arrive_relaxed();
  }
}

// Opens round r of the exchange, in which this CTA receives `bytes` from its peers: returns the
// mbarrier to push them to (push_to_peer) and to wait on (exchange_wait). Every thread calls it.
FASTACT_DEVICE uint64_t* exchange_begin(uint64_t* bar, int r, uint32_t bytes) {
  if (r == 0) cluster_wait();  // every CTA's mbarriers are set up (exchange_init)
  uint64_t* b = &bar[r & 1];
  if (threadIdx.x == 0) mbarrier_arrive_expect_bytes(b, bytes);
  return b;
}

// Waits until every byte of round r has landed in this CTA's shared memory.
FASTACT_DEVICE void exchange_wait(uint64_t* bar, int r) {
  mbarrier_wait_parity(&bar[r & 1], static_cast<uint32_t>(r >> 1) & 1u);
}

// The block's part of row_allreduce: every thread ends with the block's value (same tree in every
// warp). `ring`: the round's buffers.
template <typename V, typename Op>
FASTACT_DEVICE V block_allreduce(V v, Op op, RowScratch<V>& sm, int ring) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  v = warp_reduce(v, op);
  if (lane == 0) sm.warp[ring][warp] = v;
  __syncthreads();
  // Every warp reduces the per-warp partials itself (same tree everywhere): no second barrier.
  return warp_reduce(lane < num_warps ? sm.warp[ring][lane] : Op::identity(), op);
}

// blockDim.x a multiple of 32; every thread of every CTA of the cluster calls it with the same
// `cluster` (1: no cluster; > 1: after exchange_init(sm.bar)). Result: valid, and bitwise identical,
// in every thread of the cluster.
template <typename V, typename Op>
FASTACT_DEVICE V row_allreduce(V v, Op op, RowScratch<V>& sm, int& round, int cluster) {
  const int r = round++;
  const int ring = r & 1;
  v = block_allreduce(v, op, sm, ring);
  if (cluster > 1) {
    const int lane = threadIdx.x % kWarpSize;
    uint64_t* bar = exchange_begin(sm.bar, r, static_cast<uint32_t>(cluster * sizeof(V)));
    const int rank = cluster_rank(cluster);
    if (static_cast<int>(threadIdx.x) < cluster) push_to_peer(v, &sm.cta[ring][rank], bar, threadIdx.x);
    exchange_wait(sm.bar, r);
    v = warp_reduce(lane < cluster ? sm.cta[ring][lane] : Op::identity(), op);
  }
  return v;
}

// A row's CTAs anywhere on the device, no cluster (grid.cuh): `size` CTAs, this one of rank `rank`,
// trading partials through global memory: `slots`, one 16-byte slot per rank, and the `arrived`
// counter, zero before the kernel (grid_sync.cuh says why the CTAs may wait for each other). A CTA
// waits at most `wait_ns`; one that gives up sets *gave_up (shared memory) and leaves its slice to the
// launch's last CTA, which computes it again with `folded` set: every partial of the row is published
// by then, so row_allreduce only folds them (grid.cuh's grid_next).
struct GridExchange {
  unsigned char* slots;
  unsigned* arrived;
  int* gave_up;
  uint64_t wait_ns;
  int size;
  int rank;
  int folded;     // the row's partials are all published: fold them, publish nothing, wait for nothing
  unsigned next;  // grid_next: the next entry of the list of tasks given up
};

// The fold of a row's `size` published partials, in rank order (lane-strided, then the warp's tree;
// lane 0's value): called by a whole warp; the same in every CTA that folds them.
template <typename V, typename Op>
FASTACT_DEVICE V grid_fold(const unsigned char* slots, int size, Op op) {
  const int lane = threadIdx.x % kWarpSize;
  V p = Op::identity();
  for (int q = lane; q < size; q += kWarpSize) p = op(p, load_slot_gpu<V>(slots + 16 * int64_t(q)));
  return warp_reduce(p, op);
}

// row_allreduce over a GridExchange: thread 0 stores the block's value in slot `rank` and increments
// `arrived` (release); warp 0 waits (acquire) until all `size` CTAs have arrived, folds the slots
// (grid_fold: bitwise the same result in every CTA) and hands the result to the block through shared
// memory (one more block barrier). A slot is written once and never overwritten during the kernel, so
// no CTA waits for another's reads, and none waits at exit. If the wait times out, *g.gave_up is set
// and the result is meaningless (row_gave_up). With g.folded: the fold alone (the block's value unused).
template <typename V, typename Op>
FASTACT_DEVICE V row_allreduce(V v, Op op, RowScratch<V>& sm, int& round, const GridExchange& g) {
  static_assert(sizeof(V) <= 16, "a partial fits its 16-byte slot");
  const int ring = (round++) & 1;
  if (g.folded) {
    __syncthreads();  // every thread has read the previous slice's result from sm.cta
    if (threadIdx.x < kWarpSize) {
      (void)load_acquire_gpu(g.arrived);  // == size: the row's CTAs released their slots with it
      const V p = grid_fold<V>(g.slots, g.size, op);
      if (threadIdx.x == 0) sm.cta[ring][0] = p;
    }
    __syncthreads();
    return sm.cta[ring][0];
  }
  v = block_allreduce(v, op, sm, ring);
  if (threadIdx.x == 0) {
    *reinterpret_cast<V*>(g.slots + 16 * int64_t(g.rank)) = v;
    arrive_release_gpu(g.arrived);
  }
  if (threadIdx.x < kWarpSize) {
    const bool all = __all_sync(0xffffffffu, wait_at_least_gpu(g.arrived, static_cast<unsigned>(g.size), g.wait_ns));
    if (all) {
      const V p = grid_fold<V>(g.slots, g.size, op);
      if (threadIdx.x == 0) sm.cta[ring][0] = p;
    } else if (threadIdx.x == 0) {
      *g.gave_up = 1;
    }
  }
  __syncthreads();
  return sm.cta[ring][0];
}

// Whether the row's exchange gave up (resident_forward / resident_backward then store nothing): never
// for a cluster.
FASTACT_DEVICE constexpr bool row_gave_up(int /*cluster*/) { return false; }
FASTACT_DEVICE bool row_gave_up(const GridExchange& g) { return !g.folded && *g.gave_up != 0; }

// ------------------------------------------------------------------------------------------------
// Column all-reduce (strided kernel): thread tid owns column c = tid % C (C = `columns`) of D-group
// tid / C, and holds L lanes (the elements of its vector along inner); threads with the same c split D.
// Reduces each (column, lane) over all threads of its column, in the block and then the cluster. How
// tid splits into (D-group, column) is the kernel's column map (a line's int, or AnyColumns, below);
// with AnyColumns, the blockDim.x % C threads past the last whole D-group contribute nothing.
//
// Dynamic shared memory (ColumnScratch): two mbarriers (kColumnBarrierBytes), then V values
// red[2][R][C * L + 1], res[2][C][L], cta[2][cluster][C][L], where R, the representatives per column,
// is one per warp when C < 32 is a power of two (the warp first reduces its own D-groups by shuffles,
// column_warp_levels: a reduce-scatter, so that each of its C * L values is folded by one lane and
// written from there) and one per D-group otherwise; red's rows are padded by one value so that the
// folding lanes below spread over the banks (at most 2-way conflicts for 4-byte values, where P lanes
// of each of 32 / P values read).
// Size: softmax_strided_smem_bytes (dispatch.h). Buffers alternate by round as in RowScratch (each
// round has two block barriers). In a cluster, each CTA pushes its block's C * L values into slots
// cta[ring][its rank] of every CTA, as row_allreduce does (after exchange_init), and folds its own
// slots in rank order: bitwise the same result in every CTA, and no CTA reads another's memory.
// blockDim.x a multiple of 32 (and, for a line, of C). Result: valid in every thread, identical
// for a column.
template <typename V>
struct ColumnScratch {
  uint64_t* bar;  // [2], the cluster exchange's
  V* values;
};

template <typename V>
FASTACT_DEVICE ColumnScratch<V> column_scratch(unsigned char* smem) {
  return {reinterpret_cast<uint64_t*>(smem), reinterpret_cast<V*>(smem + kColumnBarrierBytes)};
}

// Column maps: how thread index i of a strided tile of C columns splits into D-group i / C and column
// i % C, and G, the whole D-groups of the block. A kernel parameter:
//   int (a line): C a power of two dividing blockDim.x: shifts.
//   AnyColumns (any_columns on the host): any C <= blockDim.x (whole outer indices, strided.cuh); the
//     threads past G * C idle. i / C = (i * magic) >> 21, magic = ceil(2^21 / C), for i < 1024: exact,
//     since i * magic / 2^21 = i / C + i * e / (C * 2^21) with e = magic * C - 2^21 < C and i * e <
//     2^20. A multiply, not a division by a runtime value (~20 instructions).
// Lines stay a plain int: passed as a struct (a kernel parameter copied once rather than reloaded where
// used), the same shifts made some kernels at their 64-register cap spill and lose 2-4% (H100).
struct AnyColumns {
  int columns, whole_groups;
  unsigned magic;
  FASTACT_DEVICE int group(int i) const { return static_cast<int>((static_cast<unsigned>(i) * magic) >> 21); }
  FASTACT_DEVICE int column(int i) const { return i - group(i) * columns; }
};

inline AnyColumns any_columns(int columns, int threads) {
  return {columns, threads / columns, ((1u << 21) + static_cast<unsigned>(columns) - 1) / static_cast<unsigned>(columns)};
}

template <typename Cols>
constexpr bool kAnyColumns = std::is_same_v<Cols, AnyColumns>;
FASTACT_DEVICE int map_columns(int columns) { return columns; }
FASTACT_DEVICE int map_columns(const AnyColumns& m) { return m.columns; }

// For each of the `values` q, store(q, the fold over i < n of load(i, q)). P consecutive lanes fold
// one value (each a strided share of the n partials, then shuffles), P a power of two <= 32, <= n,
// with values * P <= blockDim.x: the block's threads fold side by side instead of one thread per value
// walking all n partials in a dependent chain. The order depends only on (n, values, blockDim.x), so
// every CTA of a cluster folds the same partials to the same bits.
template <typename V, typename Op, typename Load, typename Store>
FASTACT_DEVICE void fold_partials(int n, int values, Op op, Load load, Store store) {
  const int nthreads = blockDim.x;
  int P = 1;
  while (P * 2 <= n && P * 2 <= kWarpSize && values * P * 2 <= nthreads) P *= 2;
  const int log_p = __ffs(P) - 1;  // shifts, not a division by a runtime value (~20 instructions)
  const int active = values * P;
  const int span = (active + kWarpSize - 1) / kWarpSize * kWarpSize;  // whole warps: shuffles below
  for (int i = threadIdx.x; i < span; i += nthreads) {
    const int q = (i >> log_p) < values ? (i >> log_p) : values - 1;  // lanes past `active` read, never write
    const int p = i & (P - 1);
    V r = load(p, q);
    for (int jj = p + P; jj < n; jj += P) r = op(r, load(jj, q));
    for (int mask = P / 2; mask > 0; mask /= 2) r = op(r, shfl_xor(r, mask, kWarpSize));
    if (p == 0 && i < active) store(q, r);
  }
}

// The in-warp levels of column_allreduce (C < 32): level q pairs lanes l and l ^ (C << q), while
// C << q < 32. kLen: the values a lane still holds at level kLevel (L halved per level, at least 1).
template <int L, int kLevel, typename V, typename Op>
FASTACT_DEVICE void column_warp_levels(V (&vals)[L], Op op, int C, int lane, int& off) {
  if constexpr (kLevel < 5) {
    constexpr int kLen = (L >> kLevel) > 0 ? (L >> kLevel) : 1;
    const int mask = C << kLevel;
    if (mask < kWarpSize) {
      if constexpr (kLen > 1) {
        constexpr int h = kLen / 2;
        const bool up = (lane & mask) != 0;
#pragma unroll
        for (int i = 0; i < h; ++i) {
          const V keep = up ? vals[i + h] : vals[i];
          const V send = up ? vals[i] : vals[i + h];
          vals[i] = op(keep, shfl_xor(send, mask, kWarpSize));
        }
        off += up ? h : 0;
      } else {
        vals[0] = op(vals[0], shfl_xor(vals[0], mask, kWarpSize));
      }
      column_warp_levels<L, kLevel + 1>(vals, op, C, lane, off);
    }
  }
}

template <int L, typename V, typename Op, typename Cols>
FASTACT_DEVICE void column_allreduce(V (&vals)[L], Op op, ColumnScratch<V> sm, int& round, Cols cols,
                                     int cluster) {
  const int r = round++;
  const int ring = r & 1;
  const int nthreads = blockDim.x;
  const int tid = threadIdx.x;
  const int lane = tid % kWarpSize;
  const int C = map_columns(cols);
  const int log_c = __ffs(C) - 1;  // lines
  const bool warp_levels = C < kWarpSize && (!kAnyColumns<Cols> || (C & (C - 1)) == 0);
  const int R = [&] {
    if constexpr (kAnyColumns<Cols>) return warp_levels ? nthreads / kWarpSize : cols.whole_groups;
    else return C < kWarpSize ? nthreads / kWarpSize : nthreads >> log_c;
  }();
  // One D-group a column, one CTA: each thread's values are already its column's fold. No shared memory
  // and no barrier (softmax_strided_smem_bytes reserves none for it).
  if (!warp_levels && R == 1 && cluster == 1) return;
  const int CL = C * L;
  const int stride = CL + 1;                                 // red's padded row
  V* red = sm.values + ring * R * stride;                    // [R][C * L + 1]
  V* res = sm.values + 2 * R * stride + ring * CL;           // [C][L]
  V* cta = sm.values + 2 * R * stride + 2 * CL + ring * cluster * CL;  // [cluster][C * L]
  const int c = [&] {
    if constexpr (kAnyColumns<Cols>) return cols.column(tid);
    else return tid & (C - 1);
  }();
  const int j = [&] {
    if constexpr (kAnyColumns<Cols>) return warp_levels ? tid / kWarpSize : cols.group(tid);
    else return C < kWarpSize ? tid / kWarpSize : tid >> log_c;
  }();
  if (warp_levels) {
    // Lanes l and l ^ mask (mask = C, 2C, ..., 16) hold the same column. Reduce-scatter while a lane
    // holds more than one value: it keeps half of its values (the upper half where lane & mask) and
    // folds in its partner's copy of that half, so each level moves and combines half as many values
    // as the level before (L/2 + L/4 + ... in all, not L per level). Then, with one value left, the
    // butterfly. The lane ends with values [off, off + len) of its column's L; each is folded by
    // exactly one lane (and, after a butterfly, held by its partners alike).
    int off = 0;
    column_warp_levels<L, 0>(vals, op, C, lane, off);
    // Lanes write their values of the warp's row of red; after butterfly levels (the masks from C * L
    // up), only the lanes with those bits clear.
    const int len = C * L >= kWarpSize ? C * L / kWarpSize : 1;
    const int butterfly_bits = C * L >= kWarpSize ? 0 : (kWarpSize - 1) & ~(C * L - 1);
    if ((lane & butterfly_bits) == 0) {
#pragma unroll
      for (int k = 0; k < L; ++k) {
        if (k < len) red[j * stride + c * L + off + k] = vals[k];
      }
    }
  } else if (!kAnyColumns<Cols> || j < R) {
#pragma unroll
    for (int k = 0; k < L; ++k) red[j * stride + c * L + k] = vals[k];
  }
  __syncthreads();
  const auto from_red = [&](int i, int q) { return red[i * stride + q]; };
  if (cluster > 1) {
    uint64_t* bar = exchange_begin(sm.bar, r, static_cast<uint32_t>(cluster * CL * sizeof(V)));
    const int rank = cluster_rank(cluster);
    fold_partials<V>(R, CL, op, from_red, [&](int q, V v) {
      for (int rk = 0; rk < cluster; ++rk) push_to_peer(v, &cta[rank * CL + q], bar, rk);
    });
    exchange_wait(sm.bar, r);
    fold_partials<V>(cluster, CL, op, [&](int rk, int q) { return cta[rk * CL + q]; },
                     [&](int q, V v) { res[q] = v; });
  } else {
    fold_partials<V>(R, CL, op, from_red, [&](int q, V v) { res[q] = v; });
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < L; ++k) vals[k] = res[c * L + k];
}

// ------------------------------------------------------------------------------------------------
// Launching.

constexpr int kMaxDevices = 64;

// Sets kKernel's attribute kAttr to kValue on the current device, once per device (the attribute
// belongs to the device's context).
template <auto kKernel, cudaFuncAttribute kAttr, int kValue>
cudaError_t kernel_attribute_once() {
  static std::once_flag once[kMaxDevices];
  static cudaError_t result[kMaxDevices];
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
  std::call_once(once[device], [device] { result[device] = cudaFuncSetAttribute(kKernel, kAttr, kValue); });
  return result[device];
}

// Lets kKernel run in clusters larger than 8 (non-portable), once per device.
template <auto kKernel>
cudaError_t allow_large_clusters() {
  return kernel_attribute_once<kKernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1>();
}

// Makes `config` launch clusters of `cluster` CTAs along x; `attr` holds the attribute.
inline void set_cluster_launch(cudaLaunchConfig_t& config, cudaLaunchAttribute& attr, int cluster) {
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned>(cluster);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  config.attrs = &attr;
  config.numAttrs = 1;
}

// How many clusters of `cluster` (>= 2) CTAs of `threads` threads of kKernel, with `smem` bytes of
// dynamic shared memory each, the current device runs at once; 0 when none fit or the query fails
// (clusters of more than kMaxPortableCluster need allow_large_clusters<kKernel>() first).
template <auto kKernel>
int max_active_clusters(int cluster, int threads, size_t smem) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(cluster), 1, 1);
  config.blockDim = dim3(static_cast<unsigned>(threads), 1, 1);
  config.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr;
  set_cluster_launch(config, attr, cluster);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kKernel, &config) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return clusters;
}

// The tiles (CTAs, or clusters of `cluster` > 1 CTAs) of kKernel that the current device runs at once at
// this launch shape, as the occupancy queries give it; 0 where they fail (their error cleared). The
// queries cost microseconds, so the answer is kept per device, kernel and shape. The L2 prefetches'
// distances are fractions of it (strided.cuh strided_forward, long_row.cuh cluster_forward).
template <auto kKernel>
int64_t resident_tiles(int threads, int cluster, size_t smem) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  // Never destroyed (as csrc/cpu's arena cache): a launch during static destruction still finds them.
  static auto* mu = new std::mutex;
  static auto* known = new std::map<std::tuple<int, int, int, size_t>, int64_t>;
  const auto key = std::make_tuple(device, threads, cluster, smem);
  {
    std::lock_guard<std::mutex> lock(*mu);
    const auto it = known->find(key);
    if (it != known->end()) return it->second;
  }
  int64_t resident = 0;
  if (cluster > 1) {
    if (cluster <= kMaxPortableCluster || allow_large_clusters<kKernel>() == cudaSuccess)
      resident = max_active_clusters<kKernel>(cluster, threads, smem);  // 0, its error cleared, where it fails
    else
      (void)cudaGetLastError();
  } else {
    int sms = 0, per_sm = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess &&
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, threads, smem) == cudaSuccess)
      resident = int64_t(per_sm) * sms;
    else
      (void)cudaGetLastError();
  }
  std::lock_guard<std::mutex> lock(*mu);
  known->emplace(key, resident);
  return resident;
}

// Launches kKernel on a 1-D grid of `blocks` blocks (a multiple of `cluster`), as clusters of
// `cluster` CTAs along x when cluster > 1. Returns the launch error, if any.
template <auto kKernel, typename... Args>
cudaError_t launch(int64_t blocks, int threads, size_t smem, int cluster, cudaStream_t stream, Args... args) {
  if (blocks <= 0) return cudaSuccess;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks), 1, 1);
  config.blockDim = dim3(static_cast<unsigned>(threads), 1, 1);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr;
  if (cluster > 1) {
    if (cluster > kMaxPortableCluster) {
      const cudaError_t err = allow_large_clusters<kKernel>();
      if (err != cudaSuccess) return err;
    }
    set_cluster_launch(config, attr, cluster);
  }
  return cudaLaunchKernelEx(&config, kKernel, args...);
}

// Launches kKernel over `items` work items, `cluster` CTAs each (a cluster when > 1), at most
// kMaxGridBlocks blocks per launch; the kernel's last argument is the index of its launch's first item.
template <auto kKernel, typename... Args>
cudaError_t launch_items(int64_t items, int threads, size_t smem, int cluster, cudaStream_t stream, Args... args) {
  const int64_t cap = kMaxGridBlocks / cluster;
  for (int64_t first = 0; first < items; first += cap) {
    const int64_t n = items - first < cap ? items - first : cap;
    const cudaError_t err = launch<kKernel>(n * cluster, threads, smem, cluster, stream, args..., first);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace fastact::softmax_impl
