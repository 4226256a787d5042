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

#include "fastact/math.h"

namespace fastact {

FASTACT_DEVICE void copy_async_16(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
#else
  *static_cast<uint4*>(smem) = *static_cast<const uint4*>(gmem);
#endif
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
