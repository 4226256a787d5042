// Device-scope synchronisation through global memory, for CTAs that trade partials without a
// cluster (softmax/grid.cuh): a task ticket, a release increment, an acquire wait, and a load that
// reads L2 rather than a possibly stale L1 line. sm_70+ (the PTX memory model's .release/.acquire).
//
// Why CTAs may wait for each other at all: a kernel that does so takes its work items from a ticket
// (grid_ticket) in the order its CTAs start, and a row's CTAs are consecutive tickets, so every CTA
// that holds a lower ticket has started. A row whose CTAs are not all resident yet waits only for CTAs
// that start once any other resident CTA (a row complete on the device) finishes, provided the device
// holds a row's CTAs at once: the host keeps a row within one CTA an SM (dispatch.h plan_grid). Other
// kernels on the device at the same time (other streams, other processes under MPS) may hold the
// slots such a row needs, themselves waiting: so a wait is bounded (wait_at_least_gpu's timeout), and
// a CTA that gives up hands its work to the launch's last CTA (softmax/grid.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "fastact/math.h"

namespace fastact {

// The next work item of the launch: counter's old value (relaxed; the counter starts at zero).
FASTACT_DEVICE unsigned long long grid_ticket(unsigned long long* counter) { return atomicAdd(counter, 1ull); }

// Adds one to *counter, ordered after every earlier write of this thread (release, device scope).
FASTACT_DEVICE void arrive_release_gpu(unsigned* counter) {
#if defined(__CUDA_ARCH__)
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(counter) : "memory");
#else
  (void)counter;
#endif
}

// *counter (acquire, device scope): what the writers of the values it counts wrote before their
// arrive_release_gpu is visible to this thread afterwards.
FASTACT_DEVICE unsigned load_acquire_gpu(const unsigned* counter) {
  unsigned v = 0;
#if defined(__CUDA_ARCH__)
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(counter) : "memory");
#else
  (void)counter;
#endif
  return v;
}

// Adds one to *counter (acquire and release, device scope); returns the old value.
FASTACT_DEVICE unsigned fetch_add_acq_rel_gpu(unsigned* counter) {
  unsigned old = 0;
#if defined(__CUDA_ARCH__)
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(old) : "l"(counter) : "memory");
#else
  (void)counter;
#endif
  return old;
}

// The GPU's nanosecond clock.
FASTACT_DEVICE uint64_t global_timer_ns() {
  uint64_t t = 0;
#if defined(__CUDA_ARCH__)
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
#endif
  return t;
}

// Waits until *counter >= target (true), or `timeout_ns` has passed (false), backing off between
// polls (the wait is for CTAs on other SMs that are still loading; a tight loop would take issue
// slots from the CTAs sharing this SM).
FASTACT_DEVICE bool wait_at_least_gpu(const unsigned* counter, unsigned target, uint64_t timeout_ns) {
  const uint64_t start = global_timer_ns();
  while (load_acquire_gpu(counter) < target) {
    if (global_timer_ns() - start > timeout_ns) return false;
#if defined(__CUDA_ARCH__)
    __nanosleep(128);
#endif
  }
  return true;
}

// V (at most 16 bytes) from a 16-byte aligned slot, read from L2 (relaxed, device scope), after an
// acquire of the counter its writer released.
template <typename V>
FASTACT_DEVICE V load_slot_gpu(const unsigned char* slot) {
  static_assert(sizeof(V) <= 16, "one 16-byte slot");
  uint32_t w[4] = {0, 0, 0, 0};
#if defined(__CUDA_ARCH__)
  asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
               : "l"(slot)
               : "memory");
#else
  (void)slot;
#endif
  V v;
  memcpy(&v, w, sizeof(V));
  return v;
}

}  // namespace fastact
