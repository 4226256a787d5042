// The header-only library alone (include/, no torch), with CUDA's own 16-bit types: the torch adapter
// instantiates the softmax kernels with c10::Half / c10::BFloat16, so nothing else runs them with __half /
// __nv_bfloat16, whose element conversions (ElementConvert, ElementMax in softmax/common.cuh) are the
// header's own. For each type, softmax and log_softmax, forward and backward, over shapes that take every
// variant family (warp rows, block rows, long rows, the strided cached and staged tiles, the split mode),
// auto and each forced variant that accepts the shape: outputs poisoned with NaN bytes first, compared
// with a float64 host reference from the same 16-bit inputs. Run by tests/test_header_only.py; prints a
// line per failure and the summary "header_only: <cases> cases (<refused> refused), <failed> failed".
//
//   nvcc -std=c++17 -O3 -arch=sm_90 --expt-relaxed-constexpr -Iinclude -o header_only tests/cuda/header_only_16bit.cu
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <vector>

#include "fastact/softmax/launch.cuh"

namespace {

#define CHECK_CUDA(...)                                                                          \
  do {                                                                                           \
    const cudaError_t e_ = (__VA_ARGS__);                                                        \
    if (e_ != cudaSuccess) {                                                                     \
      std::printf("CUDA %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);            \
      std::exit(2);                                                                              \
    }                                                                                            \
  } while (0)

float to_float(__half v) { return __half2float(v); }
float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> T from_float(float v);
template <> __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
// The spacing of T's subnormals: no result rounded to T is closer than half of it to the exact value (half's
// outputs reach them: softmax of [-6, 6) inputs over 128 elements gives y down to ~1e-7, and dx alike).
template <typename T> double subnormal_step();
template <> double subnormal_step<__half>() { return std::ldexp(1.0, -24); }
template <> double subnormal_step<__nv_bfloat16>() { return std::ldexp(1.0, -133); }

struct Shape {
  int64_t outer, dim, inner;
};

// Uniform in [-lo, hi) from a 32-bit LCG.
std::vector<float> lcg(int64_t n, uint32_t seed, float lo, float hi) {
  std::vector<float> v(n);
  uint32_t s = seed;
  for (int64_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    v[i] = lo + (hi - lo) * ((s >> 8) * (1.0f / 16777216.0f));
  }
  return v;
}

struct Counts {
  int cases = 0, refused = 0, failed = 0;
};

// The float64 reference of every column (o, i) of a dense [outer, D, inner] tensor.
template <typename F>
void for_each_column(const Shape& s, F f) {
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t i = 0; i < s.inner; ++i) f(o * s.dim * s.inner + i, s.inner);
}

template <typename T, bool kLog>
void run_shape(const char* tname, const Shape& s, Counts& counts) {
  using Epi = std::conditional_t<kLog, fastact::math::LogSoftmaxEpilogue, fastact::math::SoftmaxEpilogue>;
  const int64_t n = s.outer * s.dim * s.inner;
  std::vector<T> hx(n), hdy(n), hy(n), hdx(n);
  {
    const std::vector<float> x = lcg(n, 12345u + uint32_t(s.dim), -6.f, 6.f);
    const std::vector<float> dy = lcg(n, 777u + uint32_t(s.inner), -1.f, 1.f);
    for (int64_t i = 0; i < n; ++i) {
      hx[i] = from_float<T>(x[i]);
      hdy[i] = from_float<T>(dy[i]);
    }
  }
  T *x, *y, *dy, *dx;
  CHECK_CUDA(cudaMalloc(&x, n * sizeof(T)));
  CHECK_CUDA(cudaMalloc(&y, n * sizeof(T)));
  CHECK_CUDA(cudaMalloc(&dy, n * sizeof(T)));
  CHECK_CUDA(cudaMalloc(&dx, n * sizeof(T)));
  CHECK_CUDA(cudaMemcpy(x, hx.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dy, hdy.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  const char* op = kLog ? "log_softmax" : "softmax";
  const fastact::SoftmaxVariant variants[] = {
      fastact::SoftmaxVariant::kAuto,    fastact::SoftmaxVariant::kWarp,    fastact::SoftmaxVariant::kVec,
      fastact::SoftmaxVariant::kScalar,  fastact::SoftmaxVariant::kLongRow, fastact::SoftmaxVariant::kStrided,
      fastact::SoftmaxVariant::kSplit};
  for (const fastact::SoftmaxVariant v : variants) {
    const char* vname = fastact::softmax_variant_name(v);
    // Forward: y against the reference from x.
    CHECK_CUDA(cudaMemset(y, 0xff, n * sizeof(T)));
    cudaError_t e = fastact::softmax_forward<T, T, Epi>(x, y, s.outer, s.dim, s.inner, s.dim, v, nullptr);
    if (e == cudaErrorInvalidValue && v != fastact::SoftmaxVariant::kAuto) {
      (void)cudaGetLastError();
      counts.refused += 2;
      continue;
    }
    CHECK_CUDA(e);
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(hy.data(), y, n * sizeof(T), cudaMemcpyDeviceToHost));
    int bad = 0;
    double worst = 0;
    for_each_column(s, [&](int64_t base, int64_t step) {
      double m = -INFINITY, sum = 0;
      for (int64_t d = 0; d < s.dim; ++d) m = std::fmax(m, double(to_float(hx[base + d * step])));
      for (int64_t d = 0; d < s.dim; ++d) sum += std::exp(double(to_float(hx[base + d * step])) - m);
      for (int64_t d = 0; d < s.dim; ++d) {
        const double xv = to_float(hx[base + d * step]);
        const double ref = kLog ? xv - m - std::log(sum) : std::exp(xv - m) / sum;
        const double got = to_float(hy[base + d * step]);
        // One rounding to 16 bits (half an ulp: 2^-9 of |ref| for bf16, or of a subnormal step) plus float
        // arithmetic.
        const double err = std::fabs(got - ref), tol = std::ldexp(std::fabs(ref), -7) + 1e-5 + subnormal_step<T>();
        if (!(err <= tol)) ++bad;
        worst = std::fmax(worst, err / tol);
      }
    });
    ++counts.cases;
    if (bad) {
      ++counts.failed;
      std::printf("FAILED %s %s fwd [%lld, %lld, %lld] variant %s: %d of %lld elements off (worst %.3g x tol)\n", tname,
                  op, (long long)s.outer, (long long)s.dim, (long long)s.inner, vname, bad, (long long)n, worst);
    }
    // Backward: dx against the reference from the y just checked and dy.
    CHECK_CUDA(cudaMemset(dx, 0xff, n * sizeof(T)));
    e = fastact::softmax_backward<T, T, Epi>(dy, y, dx, s.outer, s.dim, s.inner, v, nullptr);
    if (e == cudaErrorInvalidValue && v != fastact::SoftmaxVariant::kAuto) {
      (void)cudaGetLastError();
      ++counts.refused;
      continue;
    }
    CHECK_CUDA(e);
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(hdx.data(), dx, n * sizeof(T), cudaMemcpyDeviceToHost));
    bad = 0;
    worst = 0;
    for_each_column(s, [&](int64_t base, int64_t step) {
      double dot = 0;  // softmax: sum dy * y; log_softmax: sum dy
      for (int64_t d = 0; d < s.dim; ++d) {
        const double g = to_float(hdy[base + d * step]), o = to_float(hy[base + d * step]);
        dot += kLog ? g : g * o;
      }
      for (int64_t d = 0; d < s.dim; ++d) {
        const double g = to_float(hdy[base + d * step]), o = to_float(hy[base + d * step]);
        const double ref = kLog ? g - std::exp(o) * dot : o * (g - dot);
        const double got = to_float(hdx[base + d * step]);
        // One rounding to 16 bits (as above), plus float arithmetic on terms of size |y| (|dy| + |dot|).
        const double scale = kLog ? std::fabs(g) + std::exp(o) * std::fabs(dot) : std::fabs(o) * (std::fabs(g) + std::fabs(dot));
        const double err = std::fabs(got - ref), tol = std::ldexp(std::fabs(ref), -7) + 1e-5 * scale + subnormal_step<T>();
        if (!(err <= tol)) ++bad;
        worst = std::fmax(worst, err / tol);
      }
    });
    ++counts.cases;
    if (bad) {
      ++counts.failed;
      std::printf("FAILED %s %s bwd [%lld, %lld, %lld] variant %s: %d of %lld elements off (worst %.3g x tol)\n", tname,
                  op, (long long)s.outer, (long long)s.dim, (long long)s.inner, vname, bad, (long long)n, worst);
    }
  }
  CHECK_CUDA(cudaFree(x));
  CHECK_CUDA(cudaFree(y));
  CHECK_CUDA(cudaFree(dy));
  CHECK_CUDA(cudaFree(dx));
}

template <typename T>
void run_type(const char* tname, Counts& counts) {
  const Shape shapes[] = {
      {3000, 128, 1},    // warp rows (128-bit)
      {1000, 33, 1},     // warp rows, element accesses
      {257, 4096, 1},    // block rows
      {5, 40000, 1},     // long rows
      {2, 4, 400000},    // short D over a long inner
      {1, 8192, 512},    // dim 0: strided cached tiles (a cluster where the device has them)
      {3, 1024, 256},    // strided, dim 1
      {16, 100, 1023},   // strided, element accesses (staged tiles)
      {2, 300000, 8},    // a very long strided D (split or streaming)
  };
  for (const Shape& s : shapes) {
    run_shape<T, false>(tname, s, counts);
    run_shape<T, true>(tname, s, counts);
  }
}

}  // namespace

int main() {
  Counts counts;
  run_type<__half>("half", counts);
  run_type<__nv_bfloat16>("bf16", counts);
  std::printf("header_only: %d cases (%d refused), %d failed\n", counts.cases, counts.refused, counts.failed);
  return counts.failed == 0 && counts.cases > 0 ? 0 : 1;
}
