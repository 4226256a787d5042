// Device helpers the grid-style diagnostics in bench/repro/ share (not part of the library): float and bfloat16
// values to and from float, and the (max, sum) pairs they fold across threads and CTAs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "fastact/math.h"

namespace repro {

FASTACT_DEVICE float to_f(float v) { return v; }
FASTACT_DEVICE float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> FASTACT_DEVICE T from_f(float v);
template <> FASTACT_DEVICE float from_f<float>(float v) { return v; }
template <> FASTACT_DEVICE __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// A softmax partial: the max of some values and the sum of their exps relative to it.
struct __align__(8) Pair { float m, s; };
FASTACT_DEVICE Pair combine(Pair a, Pair b) {
  const float M = fmaxf(a.m, b.m);
  return {M, a.s * __expf(a.m - M) + b.s * __expf(b.m - M)};
}
template <typename P> FASTACT_DEVICE P identity();
template <> FASTACT_DEVICE float identity<float>() { return 0.f; }
template <> FASTACT_DEVICE Pair identity<Pair>() { return {-3.0e38f, 0.f}; }
// A partial another CTA published, from L2 (after an acquire of the counter its writer released).
FASTACT_DEVICE float ld_part(const float* p) { return __ldcg(p); }
FASTACT_DEVICE Pair ld_part(const Pair* p) {
  const float2 v = __ldcg(reinterpret_cast<const float2*>(p));
  return {v.x, v.y};
}
FASTACT_DEVICE Pair shfl_pair(Pair p, int mask) {
  return {__shfl_xor_sync(0xffffffffu, p.m, mask), __shfl_xor_sync(0xffffffffu, p.s, mask)};
}

}  // namespace repro
