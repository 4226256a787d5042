// Variant `strided`, staged mode (plan.staged): the backward of softmax over a dim that is not innermost,
// and the forward of 16-bit tensors, where the inner size (or a pointer) leaves no 128-bit vector per
// column, or a 2- or 4-byte backward's 128-bit D-rows start in the middle of a 32-byte sector, and D is
// short (dispatch.h strided_staged_shape says when). Every tensor is dense
// [outer, D, inner].
//
// A CTA owns a tile: `columns` consecutive columns [i0, i0 + w) of one outer index, all D rows. With
// element loads, a one-pass kernel must hold its column in registers (few CTAs an SM) or split it over
// threads and exchange partial dots; the streamed mode reads twice. Here the loads go to shared memory
// asynchronously, all of a tile's in flight at once without registers (dispatch.h kStridedStagedThreads
// has the measurements):
//   1. copy: every D-row's segment of grad_output and of output (of x, forward) goes to shared memory in the aligned
//      16-byte chunks that cover it (cp.async; a chunk that reaches past either end of the tensor
//      element by element), at row d, chunk k of the tile's buffer: the segment starts there at the
//      row's own misalignment `shift` (its address mod 16, in elements; V elements a chunk);
//   2. backward: G thread groups a column (G = 1 but for the 16-bit narrow tiles and the vector rows;
//      threads past the tile's width idle), each summing the terms of every G-th D-row from shared memory,
//      the G partial dots combined through shared memory; then each group writes its D-rows of grad_input,
//      element stores down the column (a warp: 32 consecutive columns of a D-row). Forward: G groups a
//      column, each a running (max, sum) over every G-th D-row, the G pairs combined likewise, then y.
// One HBM read of each input; with one group the reductions need no exchange between threads, with G
// one through shared memory after the stage.
// Shared memory: 2 x D x (columns + V) elements and, with G > 1, G x columns partial dots; forward D x
// (columns + V) elements and, with G > 1, G x columns (max, sum) pairs (dispatch.h softmax_strided_staged_backward_smem_bytes,
// softmax_strided_staged_forward_smem_bytes); the dispatcher keeps it to two CTAs an SM.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "fastact/copy_async.cuh"
#include "fastact/softmax/common.cuh"

namespace fastact::softmax_impl {

template <typename T>
inline constexpr int kStagedChunk = kStridedStagedChunkBytes / int(sizeof(T));  // elements of a chunk

// Where a D-row's segment starts in its first chunk, in elements (p is element-aligned).
template <typename T>
FASTACT_DEVICE int staged_shift(const T* p) {
  return static_cast<int>((reinterpret_cast<uintptr_t>(p) % kStridedStagedChunkBytes) / sizeof(T));
}

// Step 1: each D-row's segment [seg0 + d * inner, + w) of each staged tensor, in the chunks it touches,
// chunk k of the row to stage[d * pitch + k * V] (pitch = columns + V: every segment's chunks fit). A
// chunk that reaches past either end of a tensor [t, t + n) (only its first and last can) goes element
// by element, its own elements only (copy_async_16_within).
//
// Chunk k of D-row d's segment [off, off + w) of tensor t (n elements) to row[k * V] (row: the D-row's
// stage), if the segment reaches into it: the segment starts at its own shift in its first chunk. The
// copies ask L2 for whole lines (kLine): a tile's segment covers part of each D-row's lines and the
// neighbouring tiles the rest. H100, dim 1 of [*, D, 1023], fraction of the limit:
// backward f32 D = 100 0.936 -> 0.960, bf16 D = 100 / 257 / 700 0.910 / 0.697 /
// 0.709 -> 0.934 / 0.720 / 0.752; the bf16 forwards +0.5-1.7%.
template <typename T>
FASTACT_DEVICE void staged_copy_row_chunk(const T* __restrict__ t, int64_t n, int64_t off, int k, int w,
                                          T* __restrict__ row) {
  constexpr int V = kStagedChunk<T>;
  const int shift = staged_shift(t + off);
  if (k * V < shift + w) copy_async_16_within<true>(t + off - shift + k * V, t, n, row + k * V);
}

// Step 1's walk: copy(d, k) for every (D-row d < dim, chunk slot k < pitch / V) pair of the tile. The
// threads walk q = d * chunks + k blockDim.x apart: (d, k) advance by (stride / chunks, stride % chunks)
// with a carry, one division for the whole loop. (Lanes along a row's chunks instead left 15 of 32 idle
// at 17 chunks: H100, bf16 [820, 160, 1023], 353 against 312 us.)
template <typename T, typename Copy>
FASTACT_DEVICE void staged_walk(int dim, int pitch, const Copy& copy) {
  constexpr int V = kStagedChunk<T>;
  const int chunks = pitch / V;  // a D-row's chunk slots; those past its segment are skipped
  const int stride = blockDim.x;
  const int dd = stride / chunks, dk = stride - dd * chunks;
  int d = static_cast<int>(threadIdx.x) / chunks;
  int k = static_cast<int>(threadIdx.x) - d * chunks;
  for (; d < dim; d += dd) {
    copy(d, k);
    k += dk;
    if (k >= chunks) {
      k -= chunks;
      ++d;
    }
  }
}

// Step 2's read of column c of D-row d from a stage (its row 0 at `shift` in its chunk; row d at
// (shift + d * inner) mod V, computed per row rather than stepped, so that no D-row's index waits on
// the one before it), as A.
template <typename A, typename T>
FASTACT_DEVICE A staged_value(const T* __restrict__ stage, int pitch, int shift, int step, int c, int d) {
  constexpr int V = kStagedChunk<T>;
  AlignedVector<T, 1> v;
  v.val[0] = stage[d * pitch + c + ((shift + d * step) & (V - 1))];
  A a[1];
  to_acc(v, a);
  return a[0];
}

// The tile of CTA `tile` (first_tile + blockIdx.x): its first element seg0 = (o, D-row 0, column i0) in
// [outer, D, inner], its width w (the last tile of an outer index may be narrower), and n, the elements of
// a tensor.
struct StagedTile {
  int64_t seg0;
  int w;
  int64_t n;
};
FASTACT_DEVICE StagedTile staged_tile(int64_t tile, int64_t outer, int64_t dim, int64_t inner, int columns) {
  const int64_t per_outer = (inner + columns - 1) / columns;
  int64_t o = 0, t = 0;
  divmod_nonneg(tile, per_outer, o, t);
  const int64_t i0 = t * columns;
  return {o * dim * inner + i0, static_cast<int>(inner - i0 < columns ? inner - i0 : columns), outer * dim * inner};
}

// G thread groups a column (G x columns <= blockDim.x; the threads past them idle): thread (g, c) = g *
// columns + c sums the backward terms of column c's D-rows g, g + G, ...; with G > 1 the G partial dots
// meet in shared memory after the stage (G x columns accumulators, softmax_strided_staged_backward_smem_bytes)
// and every group adds its column's G, in the same order. Then each group writes its D-rows of grad_input.
template <typename in_t, typename out_t, typename Epi, int G>
__global__ __launch_bounds__(kStridedStagedThreads) void softmax_strided_staged_bwd_kernel(
    const out_t* __restrict__ grad_output,  // [outer, D, inner]
    const out_t* __restrict__ output,       // [outer, D, inner]
    in_t* __restrict__ grad_input,          // [outer, D, inner]
    int64_t outer, int64_t dim64, int64_t inner, int columns, Epi epi, int64_t first_tile) {
  using A = acc_t<out_t>;
  constexpr int V = kStagedChunk<out_t>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int dim = static_cast<int>(dim64);  // the dispatcher keeps D within a CTA's shared memory
  const int pitch = columns + V;
  out_t* s_dy = reinterpret_cast<out_t*>(smem_raw);
  out_t* s_y = s_dy + dim * pitch;
  const StagedTile tile = staged_tile(first_tile + blockIdx.x, outer, dim64, inner, columns);
  const int64_t seg0 = tile.seg0;
  const int w = tile.w;
  staged_walk<out_t>(dim, pitch, [&](int d, int k) {
    const int64_t off = seg0 + int64_t(d) * inner;
    staged_copy_row_chunk(grad_output, tile.n, off, k, w, s_dy + d * pitch);
    staged_copy_row_chunk(output, tile.n, off, k, w, s_y + d * pitch);
  });
  copy_async_commit();
  copy_async_wait<0>();
  __syncthreads();

  // Step 2.
  const int step = static_cast<int>(inner % V);
  const int shift_dy = staged_shift(grad_output + seg0);
  const int shift_y = staged_shift(output + seg0);
  if constexpr (G == 1) {
    // The wide tiles: a thread a column, as before groups (the grouped form below, at G = 1, ran float
    // [656, 100, 1023] 2.4% slower: 296.6 against 289.5 us).
    for (int c = threadIdx.x; c < w; c += blockDim.x) {
      // Column c's element of D-row d in each array.
      auto at = [&](const out_t* s, int shift, int d) { return staged_value<A>(s, pitch, shift, step, c, d); };
      A dot = A(0);
#pragma unroll 8
      for (int d = 0; d < dim; ++d) dot += epi.backward_term(at(s_dy, shift_dy, d), at(s_y, shift_y, d));
      in_t* dx = grad_input + seg0 + c;
#pragma unroll 8
      for (int d = 0; d < dim; ++d) {
        const A out[1] = {epi.backward(at(s_dy, shift_dy, d), at(s_y, shift_y, d), dot)};
        dx[int64_t(d) * inner] = from_acc<in_t>(out).val[0];
      }
    }
  } else {
    const int g = static_cast<int>(threadIdx.x) / columns;
    const int c = static_cast<int>(threadIdx.x) - g * columns;
    const bool active = g < G && c < w;
    auto at = [&](const out_t* s, int shift, int d) { return staged_value<A>(s, pitch, shift, step, c, d); };
    A dot = A(0);
    if (active) {
#pragma unroll 8
      for (int d = g; d < dim; d += G) dot += epi.backward_term(at(s_dy, shift_dy, d), at(s_y, shift_y, d));
    }
    A* part = reinterpret_cast<A*>(smem_raw + size_t(2) * dim * pitch * sizeof(out_t));  // after the stages
    if (active) part[g * columns + c] = dot;
    __syncthreads();
    if (!active) return;
    dot = part[c];
#pragma unroll
    for (int q = 1; q < G; ++q) dot += part[q * columns + c];
    in_t* dx = grad_input + seg0 + c;
#pragma unroll 8
    for (int d = g; d < dim; d += G) {
      const A out[1] = {epi.backward(at(s_dy, shift_dy, d), at(s_y, shift_y, d), dot)};
      dx[int64_t(d) * inner] = from_acc<in_t>(out).val[0];
    }
  }
}

// x: [outer, D, inner] (16-bit), y likewise. G thread groups a column (G x columns <= blockDim.x; the
// threads past them idle): thread (g, c) = g * columns + c takes column c's D-rows g, g + G, ... It keeps
// a running (max m, sum of exp(x - m)) over them, an exp an element: a value above m rescales the sum to
// it, as the online softmax. m starts at the lowest finite float (FiniteMaxSumOp's convention), so -inf
// adds exp(-inf) = 0 and never meets -inf; a value of +inf adds exp(inf - inf) = NaN, as torch's sum;
// NaN makes the sum NaN. With G > 1 the groups' (max, sum) pairs meet in shared memory after the stage
// (G x columns MaxSum<float>, softmax_strided_staged_forward_smem_bytes) and every group combines its
// column's G. Then each group writes its D-rows: KeepInput::out(x, M, row_constant(S)), as the cached
// strided kernels' raw rows (a column of -inf: M the lowest float, S = 0, NaN outputs, as torch). Two
// passes over the staged column, two exps an element (softmax; log_softmax: one). A warp reads 32
// consecutive columns of a D-row: no bank conflict.
template <typename in_t, typename out_t, typename Epi, int G>
__global__ __launch_bounds__(kStridedStagedThreads) void softmax_strided_staged_fwd_kernel(
    const in_t* __restrict__ x,  // [outer, D, inner]
    out_t* __restrict__ y,       // [outer, D, inner]
    int64_t outer, int64_t dim64, int64_t inner, int columns, Epi epi, int64_t first_tile) {
  using A = acc_t<out_t>;
  static_assert(std::is_same_v<A, float>, "staged forwards accumulate in float");
  using Terms = KeepInput<Epi>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int dim = static_cast<int>(dim64);  // the dispatcher keeps D within a CTA's shared memory
  const int pitch = columns + kStagedChunk<in_t>;
  in_t* s_x = reinterpret_cast<in_t*>(smem_raw);
  const StagedTile tile = staged_tile(first_tile + blockIdx.x, outer, dim64, inner, columns);
  const int64_t seg0 = tile.seg0;
  const int w = tile.w;
  staged_walk<in_t>(dim, pitch, [&](int d, int k) {
    staged_copy_row_chunk(x, tile.n, seg0 + int64_t(d) * inner, k, w, s_x + d * pitch);
  });
  copy_async_commit();
  copy_async_wait<0>();
  __syncthreads();

  const int step = static_cast<int>(inner % kStagedChunk<in_t>);
  const int shift = staged_shift(x + seg0);
  const int g = static_cast<int>(threadIdx.x) / columns;
  const int c = static_cast<int>(threadIdx.x) - g * columns;
  const bool active = g < G && c < w;
  auto at = [&](int d) { return staged_value<A>(s_x, pitch, shift, step, c, d); };
  MaxSum<A> st{std::numeric_limits<A>::lowest(), A(0)};
  if (active) {
    for (int d = g; d < dim; d += G) {
      const A v = at(d);
      if (v > st.max) {
        st.sum = st.sum * cached_exp(st.max - v) + cached_exp(v - v);  // exp(v - v): 1, or NaN at +inf
        st.max = v;
      } else {
        st.sum += cached_exp(v - st.max);
      }
    }
  }
  if constexpr (G > 1) {
    auto* part = reinterpret_cast<MaxSum<A>*>(smem_raw + size_t(dim) * pitch * sizeof(in_t));  // after the stage
    if (active) part[g * columns + c] = st;
    __syncthreads();
    if (!active) return;
    st = part[c];
#pragma unroll
    for (int q = 1; q < G; ++q) st = FiniteMaxSumOp()(st, part[q * columns + c]);
  }
  if (!active) return;
  const A cst = epi.row_constant(st.sum);
  out_t* yc = y + seg0 + c;
  for (int d = g; d < dim; d += G) {
    const A out[1] = {Terms::out(epi, at(d), st.max, cst)};
    yc[int64_t(d) * inner] = from_acc<out_t>(out).val[0];
  }
}

namespace detail {

// Launches staged kernel kKernel, a CTA a tile of `columns` columns over `groups` thread groups, `smem`
// bytes of shared memory a CTA (at most kMaxSmem, the attribute asked for), after the checks the plan must
// pass (V: a chunk's elements of the staged tensors). All of the SM's unified L1 / shared memory goes to
// shared memory: the tiles are sized for two CTAs an SM out of the whole 228 KB, and the kernels read
// global memory through cp.async.cg, past L1. A guarantee rather than a measured gain: on the H100
// the driver's own choice for 87 KB backward tiles (200 KB, ncu) also held two.
template <auto kKernel, int kMaxSmem, int V, typename... Args>
cudaError_t staged_launch(int64_t smem, int64_t outer, int64_t dim, int64_t inner, int threads, int columns,
                          int groups, cudaStream_t stream, Args... args) {
  if (threads != kStridedStagedThreads || columns < V || columns % V != 0 || int64_t(groups) * columns > threads ||
      dim < 1 || smem > kMaxSmem)
    return cudaErrorInvalidConfiguration;
  cudaError_t err = kernel_attribute_once<kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem>();
  if (err != cudaSuccess) return err;
  err = kernel_attribute_once<kKernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared>();
  if (err != cudaSuccess) return err;
  return launch_items<kKernel>(softmax_strided_staged_tiles(outer, inner, columns), threads, size_t(smem), 1, stream,
                               args...);
}

// launch(std::integral_constant<int, G>{}) for the G among kGroups (the groups strided_staged_shape gives) that
// equals `groups`; cudaErrorInvalidConfiguration for any other.
template <int... kGroups, typename Launch>
cudaError_t with_groups(int groups, const Launch& launch) {
  cudaError_t err = cudaErrorInvalidConfiguration;
  (void)((groups == kGroups && ((err = launch(std::integral_constant<int, kGroups>{})), true)) || ...);
  return err;
}

template <typename in_t, typename out_t, typename Epi>
cudaError_t strided_staged_backward(const out_t* dy, const out_t* y, in_t* dx, int64_t outer, int64_t dim,
                                    int64_t inner, int threads, int columns, int groups, cudaStream_t stream) {
  if constexpr (sizeof(out_t) > 4) {
    return cudaErrorInvalidValue;  // 2- and 4-byte elements only (strided_staged_shape)
  } else {
    const int64_t smem = softmax_strided_staged_backward_smem_bytes(dim, columns, sizeof(out_t), groups);
    return with_groups<1, 2, 4>(groups, [&](auto g) {
      return staged_launch<softmax_strided_staged_bwd_kernel<in_t, out_t, Epi, decltype(g)::value>,
                           kStridedStagedMaxSmem, kStagedChunk<out_t>>(smem, outer, dim, inner, threads, columns,
                                                                       groups, stream, dy, y, dx, outer, dim, inner,
                                                                       columns, Epi{});
    });
  }
}

template <typename in_t, typename out_t, typename Epi>
cudaError_t strided_staged_forward(const in_t* x, out_t* y, int64_t outer, int64_t dim, int64_t inner, int threads,
                                   int columns, int groups, cudaStream_t stream) {
  if constexpr (sizeof(in_t) != 2 || sizeof(out_t) != 2) {
    return cudaErrorInvalidValue;  // 16-bit x and y only (strided_staged_shape)
  } else {
    const int64_t smem = softmax_strided_staged_forward_smem_bytes(dim, columns, sizeof(in_t), groups);
    return with_groups<2, 4, 8>(groups, [&](auto g) {
      return staged_launch<softmax_strided_staged_fwd_kernel<in_t, out_t, Epi, decltype(g)::value>,
                           kStridedStagedForwardMaxSmem, kStagedChunk<in_t>>(smem, outer, dim, inner, threads,
                                                                             columns, groups, stream, x, y, outer,
                                                                             dim, inner, columns, Epi{});
    });
  }
}

}  // namespace detail
}  // namespace fastact::softmax_impl
