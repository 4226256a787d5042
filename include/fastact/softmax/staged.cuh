// Variant `strided`, staged mode (plan.staged): the backward of softmax over a dim that is not innermost,
// where the inner size (or a pointer) leaves no 128-bit vector per column and D is short (dispatch.h
// strided_staged_columns says when). Every tensor is dense [outer, D, inner].
//
// A CTA owns a tile: `columns` consecutive columns [i0, i0 + w) of one outer index, all D rows. With
// element loads, a one-pass kernel must hold its column in registers (few CTAs an SM) or split it over
// threads and exchange partial dots; the streamed mode reads twice. Here the loads go to shared memory
// asynchronously, all of a tile's in flight at once without registers (dispatch.h kStridedStagedThreads
// has the measurements):
//   1. copy: every D-row's segment of grad_output and of output goes to shared memory in the aligned
//      16-byte chunks that cover it (cp.async; a chunk that reaches past either end of the tensor
//      element by element), at row d, chunk k of the tile's buffer: the segment starts there at the
//      row's own misalignment `shift` (its address mod 16, in elements; V elements a chunk);
//   2. a thread per column (threads past the tile's width idle) sums its column's backward terms from
//      shared memory, then writes grad_input, element stores down the column (a warp: 32 consecutive
//      columns of a D-row).
// One HBM read of each input; the dot needs no exchange between threads.
// Shared memory: 2 x D x (columns + V) elements (dispatch.h softmax_strided_staged_smem_bytes); the
// dispatcher keeps it to two CTAs an SM.
#pragma once

#include <cstdint>

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

// Step 1: D-row d's segment [seg0 + d * inner, + w) of grad_output and of output, in the chunks it
// touches, chunk k of the row to stage[d * pitch + k * V] of each (pitch = columns + V: every segment's
// chunks fit). A chunk that reaches past either end of a tensor [t, t + n) (only its first and last
// can) goes element by element, its own elements only.
template <typename T>
FASTACT_DEVICE void staged_copy_chunk(const T* src, const T* t, int64_t n, T* dst) {
  constexpr int V = kStagedChunk<T>;
  const auto a = reinterpret_cast<uintptr_t>(src);
  const auto lo = reinterpret_cast<uintptr_t>(t);
  const auto hi = reinterpret_cast<uintptr_t>(t + n);
  if (a >= lo && a + kStridedStagedChunkBytes <= hi) {
    copy_async_16(dst, src);
    return;
  }
#pragma unroll
  for (int e = 0; e < V; ++e) {
    const uintptr_t ae = a + uintptr_t(e) * sizeof(T);
    if (ae >= lo && ae < hi) dst[e] = src[e];
  }
}

template <typename T>
FASTACT_DEVICE void staged_copy(const T* __restrict__ dy, const T* __restrict__ y, int64_t n, int64_t seg0,
                                int64_t inner, int dim, int w, int pitch, T* __restrict__ s_dy,
                                T* __restrict__ s_y) {
  constexpr int V = kStagedChunk<T>;
  const int chunks = pitch / V;  // a D-row's chunk slots; those past its segment are skipped
  const int stride = blockDim.x;
  // The threads walk q = d * chunks + k over every (D-row, chunk) pair, blockDim.x apart: (d, k) advance
  // by (stride / chunks, stride % chunks) with a carry, one division for the whole loop. (Lanes along a
  // row's chunks instead left 15 of 32 idle at 17 chunks: H100, bf16 [820, 160, 1023], 353 against
  // 312 us.)
  const int dd = stride / chunks, dk = stride - dd * chunks;
  int d = static_cast<int>(threadIdx.x) / chunks;
  int k = static_cast<int>(threadIdx.x) - d * chunks;
  for (; d < dim; d += dd) {
    const int64_t off = seg0 + int64_t(d) * inner;
    const int sdy = staged_shift(dy + off), sy = staged_shift(y + off);
    if (k * V < sdy + w) staged_copy_chunk(dy + off - sdy + k * V, dy, n, s_dy + d * pitch + k * V);
    if (k * V < sy + w) staged_copy_chunk(y + off - sy + k * V, y, n, s_y + d * pitch + k * V);
    k += dk;
    if (k >= chunks) {
      k -= chunks;
      ++d;
    }
  }
}

template <typename in_t, typename out_t, typename Epi>
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
  const int64_t per_outer = (inner + columns - 1) / columns;
  int64_t o = 0, t = 0;
  divmod_nonneg(first_tile + blockIdx.x, per_outer, o, t);
  const int64_t i0 = t * columns;
  const int w = static_cast<int>(inner - i0 < columns ? inner - i0 : columns);
  const int64_t seg0 = o * dim64 * inner + i0;
  const int64_t n = outer * dim64 * inner;
  staged_copy(grad_output, output, n, seg0, inner, dim, w, pitch, s_dy, s_y);
  copy_async_commit();
  copy_async_wait<0>();
  __syncthreads();

  // Step 2. Row d of a tensor starts at (its row 0's shift + d * inner) mod V in its chunks: computed
  // per row rather than stepped, so that no D-row's index waits on the one before it.
  const int step = static_cast<int>(inner % V);
  const int shift_dy = staged_shift(grad_output + seg0);
  const int shift_y = staged_shift(output + seg0);
  auto value = [](const out_t* s, int i) {
    AlignedVector<out_t, 1> v;
    v.val[0] = s[i];
    A a[1];
    to_acc(v, a);
    return a[0];
  };
  for (int c = threadIdx.x; c < w; c += blockDim.x) {
    // Column c's element of D-row d in each array.
    auto at = [&](const out_t* s, int shift, int d) {
      return value(s, d * pitch + c + ((shift + d * step) & (V - 1)));
    };
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
}

namespace detail {

template <typename in_t, typename out_t, typename Epi>
cudaError_t strided_staged_backward(const out_t* dy, const out_t* y, in_t* dx, int64_t outer, int64_t dim,
                                    int64_t inner, int threads, int columns, cudaStream_t stream) {
  if constexpr (sizeof(out_t) > 4) {
    return cudaErrorInvalidValue;  // 2- and 4-byte elements only (strided_staged_columns)
  } else {
    constexpr auto kKernel = softmax_strided_staged_bwd_kernel<in_t, out_t, Epi>;
    constexpr int V = kStagedChunk<out_t>;
    const int64_t smem = softmax_strided_staged_smem_bytes(dim, columns, sizeof(out_t));
    if (threads != kStridedStagedThreads || columns < V || columns % V != 0 || dim < 1 ||
        smem > kStridedStagedMaxSmem)
      return cudaErrorInvalidConfiguration;
    cudaError_t err = kernel_attribute_once<kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kStridedStagedMaxSmem>();
    if (err != cudaSuccess) return err;
    // All of the SM's unified L1 / shared memory as shared memory: the tiles are sized for two CTAs an SM
    // out of the whole 228 KB (kStridedStagedMaxSmem), and the kernel reads global memory through
    // cp.async.cg, past L1. A guarantee rather than a measured gain: on the H100 the driver's own
    // choice for 87 KB tiles (200 KB, ncu) also held two.
    err = kernel_attribute_once<kKernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared>();
    if (err != cudaSuccess) return err;
    return launch_items<kKernel>(softmax_strided_staged_tiles(outer, inner, columns), threads, size_t(smem), 1,
                                 stream, dy, y, dx, outer, dim, inner, columns, Epi{});
  }
}

}  // namespace detail
}  // namespace fastact::softmax_impl
