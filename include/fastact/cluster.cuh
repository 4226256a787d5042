// Thread-block cluster primitives (sm_90): the relaxed cluster barrier that publishes the mbarriers'
// setup, and the pieces of a push exchange (mbarrier + st.async) through which CTAs trade partials.
// Compiled to nothing below sm_90, where the host never launches a cluster.
//
// Why a push exchange, not the cluster barrier and distributed shared memory reads:
// `barrier.cluster.arrive` (release, the default) compiles to MEMBAR.ALL.GPU before the arrive: the
// thread waits until every earlier global store of its own is acknowledged. In a kernel that stores
// one row and then reduces the next, each reduction stalled the cluster until the previous row's
// stores had drained, and a CTA whose memory others read must wait for them at exit. st.async writes
// a value into a peer CTA's shared memory and counts its bytes on an mbarrier there; waiting on that
// mbarrier orders only those bytes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "fastact/math.h"

namespace fastact {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FASTACT_SM90_DEVICE 1
#else
#define FASTACT_SM90_DEVICE 0
#endif

// Arrive with no ordering (no MEMBAR): for a barrier that orders only what a fence before it orders.
// Every thread of the warp must execute it together.
FASTACT_DEVICE void cluster_arrive_relaxed() {
#if FASTACT_SM90_DEVICE
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
#endif
}
// Waits (.acquire) until every thread of the cluster has arrived.
FASTACT_DEVICE void cluster_wait() {
#if FASTACT_SM90_DEVICE
  __cluster_barrier_wait();
#endif
}

// This CTA's rank in its cluster of `cluster` CTAs: the launcher's clusters are 1-D and consecutive in
// blockIdx.x, so it equals %cluster_ctarank (and is 0 without a cluster).
FASTACT_DEVICE int cluster_rank(int cluster) { return static_cast<int>(blockIdx.x % static_cast<unsigned>(cluster)); }

// ------------------------------------------------------------------------------------------------
// mbarrier (a 64-bit shared-memory object counting arrivals and transferred bytes per phase).

FASTACT_DEVICE uint32_t smem_address(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// One thread, before any other use; then fence_mbarrier_init() and a cluster barrier before a peer
// may signal it.
FASTACT_DEVICE void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
#if FASTACT_SM90_DEVICE
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(arrivals) : "memory");
#else
  (void)bar;
  (void)arrivals;
#endif
}

// Makes this thread's earlier mbarrier_init visible to the cluster (with the barrier that follows).
FASTACT_DEVICE void fence_mbarrier_init() {
#if FASTACT_SM90_DEVICE
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// This thread's arrival on its own CTA's mbarrier, announcing `bytes` more to come this phase.
FASTACT_DEVICE void mbarrier_arrive_expect_bytes(uint64_t* bar, uint32_t bytes) {
#if FASTACT_SM90_DEVICE
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
#else
  (void)bar;
  (void)bytes;
#endif
}

// Waits until the phase of parity `parity` of `bar` is complete; what was counted on it is then
// visible to this thread (acquire).
FASTACT_DEVICE void mbarrier_wait_parity(uint64_t* bar, uint32_t parity) {
#if FASTACT_SM90_DEVICE
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(smem_address(bar)),
      "r"(parity)
      : "memory");
#else
  (void)bar;
  (void)parity;
#endif
}

// Writes v to *dst in the CTA of cluster rank `rank` (dst: this CTA's address of the same variable)
// and counts sizeof(V) bytes on that CTA's mbarrier `bar` (likewise this CTA's address). V: 4, 8 or
// 16 bytes, dst aligned to its size.
template <typename V>
FASTACT_DEVICE void push_to_peer(const V& v, V* dst, uint64_t* bar, int rank) {
  static_assert(sizeof(V) == 4 || sizeof(V) == 8 || sizeof(V) == 16, "one st.async of 1, 2 or 4 words");
#if FASTACT_SM90_DEVICE
  uint32_t remote_dst, remote_bar;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote_dst) : "r"(smem_address(dst)), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote_bar) : "r"(smem_address(bar)), "r"(rank));
  uint32_t w[sizeof(V) / 4];
  memcpy(w, &v, sizeof(V));
  if constexpr (sizeof(V) == 4) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(remote_dst),
                 "r"(w[0]), "r"(remote_bar)
                 : "memory");
  } else if constexpr (sizeof(V) == 8) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];\n" ::"r"(
                     remote_dst),
                 "r"(w[0]), "r"(w[1]), "r"(remote_bar)
                 : "memory");
  } else {
    asm volatile(
        "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(
            remote_dst),
        "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]), "r"(remote_bar)
        : "memory");
  }
#else
  (void)v;
  (void)dst;
  (void)bar;
  (void)rank;
#endif
}

}  // namespace fastact
