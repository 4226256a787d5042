// Asynchronous 16-byte copies global -> shared (cp.async, sm_80+), for kernels that keep part of
// what they load in shared memory: a copy in flight holds no register, so it stays in flight while
// the thread issues its other loads and computes, whatever ptxas schedules around them.
//
// Where each thread copies into slots only it reads, completion needs no barrier: cp.async.wait_group
// makes a thread's own copies visible to it (block.cuh's ShiftedRow reads its neighbour's slot, and waits
// at a block barrier after the wait). .cg: cached in L2 only, the data is used once. Below
// sm_80 the copy is a plain load and store.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "fastact/math.h"

namespace fastact {

// kLine: the copy asks L2 to fill the whole 128-byte line from memory (.L2::128B), for copies that read
// a piece of each line while other CTAs read the rest at about the same time (vec.cuh load_vector_line
// says why; staged.cuh's tiles).
template <bool kLine = false>
FASTACT_DEVICE void copy_async_16(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if constexpr (kLine)
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
  else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
#else
  *static_cast<uint4*>(smem) = *static_cast<const uint4*>(gmem);
#endif
}

// The 16-byte chunk at src (16-byte aligned, as dst) of a tensor whose elements are [t, t + n): copied
// whole (copy_async_16, kLine as there) where it lies inside, else element by element, its elements
// inside only (plain loads and stores; the rest of dst left as it is). For chunks that may reach past
// either end of a tensor (softmax/staged.cuh's tiles, block.cuh's ShiftedRow).
template <bool kLine = false, typename T>
FASTACT_DEVICE void copy_async_16_within(const T* src, const T* t, int64_t n, T* dst) {
  constexpr int V = 16 / int(sizeof(T));
  const auto a = reinterpret_cast<uintptr_t>(src);
  const auto lo = reinterpret_cast<uintptr_t>(t);
  const auto hi = reinterpret_cast<uintptr_t>(t + n);
  if (a >= lo && a + 16 <= hi) {
    copy_async_16<kLine>(dst, src);
    return;
  }
#pragma unroll
  for (int e = 0; e < V; ++e) {
    const uintptr_t ae = a + uintptr_t(e) * sizeof(T);
    if (ae >= lo && ae < hi) dst[e] = src[e];
  }
}

// Closes the group of the copies issued since the last commit (an empty group is fine).
FASTACT_DEVICE void copy_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most kPending of this thread's most recent groups are still in flight.
template <int kPending>
FASTACT_DEVICE void copy_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

}  // namespace fastact
