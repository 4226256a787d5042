// What the standalone diagnostics in bench/repro/ share (not part of the library): the error check, the
// random inputs and the CUDA-event timing. Host code only; torch-free, as the diagnostics are.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

// Exits with the error's name and the line where a CUDA call failed.
#define CK(...)                                                                                  \
  do {                                                                                           \
    cudaError_t e_ = (__VA_ARGS__);                                                              \
    if (e_ != cudaSuccess) {                                                                     \
      std::printf("CUDA %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);            \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

namespace repro {

// n values of a 32-bit LCG from seed 12345, each f(s >> 8) of the state's top 24 bits.
template <typename F>
std::vector<float> lcg_values(int64_t n, F f) {
  std::vector<float> h(n);
  uint32_t s = 12345;
  for (int64_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    h[i] = f(s >> 8);
  }
  return h;
}

// Uniform in [-4, 4): the softmax inputs.
inline std::vector<float> uniform_inputs(int64_t n) {
  return lcg_values(n, [](uint32_t b) { return (b * (1.0f / 16777216.0f) - 0.5f) * 8.f; });
}

inline float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The median in us of launch() over calls - skip timed calls (the first `skip` are warm-up), each timed by a
// pair of CUDA events on the default stream; before() runs ahead of each call, outside the events.
template <typename Launch, typename Before>
float median_us(Launch launch, Before before, int calls = 25, int skip = 3) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> ts;
  for (int it = 0; it < calls; ++it) {
    before();
    CK(cudaEventRecord(a));
    CK(launch());
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    if (it >= skip) ts.push_back(ms * 1e3f);
  }
  CK(cudaGetLastError());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return median(ts);
}

template <typename Launch>
float median_us(Launch launch) {
  return median_us(launch, [] {});
}

}  // namespace repro
