// The header-only library alone (include/, no torch), with CUDA's own 16-bit types: the torch adapter
// instantiates the softmax kernels with c10::Half / c10::BFloat16, so nothing else runs them with __half /
// __nv_bfloat16, whose element conversions (ElementConvert, ElementMax in softmax/common.cuh) are the
// header's own. For each type, softmax and log_softmax, forward and backward, through the workspace-free
// launchers of softmax/launch.cuh (auto, and each forced variant they take: warp, vec, scalar, long_row,
// strided, split; the grid mode and the strided split mode need a workspace, which these launchers do not
// have) over shapes whose plans (H100) are: warp rows in 128-bit and in element accesses, block rows, long
// rows over a cluster, rows split in two launches, and the strided cached, streamed and staged tiles.
// Outputs are poisoned with NaN bytes first and compared with a float64 host reference from the same 16-bit
// inputs; a forced variant may be refused only where softmax_variant_rejects says so. Run by
// tests/test_header_only.py; prints a line per failure and the summary
// "header_only: <cases> cases (<refused> refused), <failed> failed".
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
// The tolerance of one rounding to T: half an ulp is at most 2^-11 (half) / 2^-8 (bfloat16) of the value, and in
// the subnormal range at most half of the subnormal step (half's outputs go there: softmax of [-6, 6) inputs over
// 128 elements gives y down to ~1e-7, and dx alike).
template <typename T> double half_ulp_rel();
template <> double half_ulp_rel<__half>() { return std::ldexp(1.0, -11); }
template <> double half_ulp_rel<__nv_bfloat16>() { return std::ldexp(1.0, -8); }
template <typename T> double subnormal_step();
template <> double subnormal_step<__half>() { return std::ldexp(1.0, -24); }
template <> double subnormal_step<__nv_bfloat16>() { return std::ldexp(1.0, -133); }
// Float arithmetic before the rounding, relative to the terms: exp, the column sums (partial sums of at most a
// few thousand terms a thread, then fixed trees), the division or the log.
constexpr double kFloatRel = 1e-4;

struct Shape {
  int64_t outer, dim, inner;
};

// Uniform in [lo, hi) from a 32-bit LCG.
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

// One case checked: `bad` of its n elements outside their tolerance, the worst at `worst` times it.
void report(Counts& counts, int64_t bad, double worst, const char* tname, const char* op, const char* dir,
            const Shape& s, const char* vname, int64_t n) {
  ++counts.cases;
  if (bad == 0) return;
  ++counts.failed;
  std::printf("FAILED %s %s %s [%lld, %lld, %lld] variant %s: %lld of %lld elements off (worst %.3g x tol)\n", tname, op,
              dir, (long long)s.outer, (long long)s.dim, (long long)s.inner, vname, (long long)bad, (long long)n, worst);
}

// Whether the launch of variant v was a refusal, as softmax_variant_rejects predicted (`rejects`): the launcher
// must then have returned cudaErrorInvalidValue, and auto is never refused; anything else is a failure.
bool refused(Counts& counts, bool rejects, cudaError_t e, fastact::SoftmaxVariant v, const char* tname, const char* op,
             const char* dir, const Shape& s, const char* vname) {
  if (!rejects) return false;
  if (v == fastact::SoftmaxVariant::kAuto || e != cudaErrorInvalidValue) {
    std::printf("FAILED %s %s %s [%lld, %lld, %lld] variant %s: refused, launcher returned %s\n", tname, op, dir,
                (long long)s.outer, (long long)s.dim, (long long)s.inner, vname, cudaGetErrorString(e));
    ++counts.failed;
  }
  (void)cudaGetLastError();
  return true;
}

// f(offset of D-row 0, stride between D-rows) for every column (o, i) of a dense [outer, D, inner] tensor.
template <typename F>
void for_each_column(const Shape& s, F f) {
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t i = 0; i < s.inner; ++i) f(o * s.dim * s.inner + i, s.inner);
}

template <typename T, bool kLog>
void run_shape(const char* tname, const Shape& s, Counts& counts) {
  using Epi = std::conditional_t<kLog, fastact::math::LogSoftmaxEpilogue, fastact::math::SoftmaxEpilogue>;
  using fastact::SoftmaxDeviceProps;
  using fastact::SoftmaxProblem;
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
  // The forward's float64 reference and its tolerance, the same for every variant.
  std::vector<double> ref(n), tol(n);
  for_each_column(s, [&](int64_t base, int64_t step) {
    double m = -INFINITY, sum = 0;
    for (int64_t d = 0; d < s.dim; ++d) m = std::fmax(m, double(to_float(hx[base + d * step])));
    for (int64_t d = 0; d < s.dim; ++d) sum += std::exp(double(to_float(hx[base + d * step])) - m);
    for (int64_t d = 0; d < s.dim; ++d) {
      const int64_t i = base + d * step;
      const double xm = double(to_float(hx[i])) - m;
      ref[i] = kLog ? xm - std::log(sum) : std::exp(xm) / sum;
      // log_softmax: float error absolute, on terms of size |x - max| + log(sum).
      tol[i] = (half_ulp_rel<T>() + kFloatRel) * std::fabs(ref[i]) + subnormal_step<T>() +
               (kLog ? 1e-5 * (1.0 + std::fabs(xm) + std::log(sum)) : 0.0);
    }
  });
  int device = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  SoftmaxDeviceProps dev;  // as the launchers see the current device
  CHECK_CUDA(fastact::softmax_device_props(device, &dev));
  const fastact::SoftmaxVariant variants[] = {
      fastact::SoftmaxVariant::kAuto,    fastact::SoftmaxVariant::kWarp,    fastact::SoftmaxVariant::kVec,
      fastact::SoftmaxVariant::kScalar,  fastact::SoftmaxVariant::kLongRow, fastact::SoftmaxVariant::kStrided,
      fastact::SoftmaxVariant::kSplit};
  for (const fastact::SoftmaxVariant v : variants) {
    const char* vname = fastact::softmax_variant_name(v);
    // Forward: y against the reference from x. A forced variant is refused only where the dispatcher says it
    // cannot take the problem, and then with cudaErrorInvalidValue; every other error fails the run.
    const bool fwd_refused =
        fastact::softmax_variant_rejects(v, fastact::softmax_forward_problem(x, y, s.outer, s.dim, s.inner, s.dim, dev)) !=
        nullptr;
    CHECK_CUDA(cudaMemset(y, 0xff, n * sizeof(T)));
    cudaError_t e = fastact::softmax_forward<T, T, Epi>(x, y, s.outer, s.dim, s.inner, s.dim, v, nullptr);
    if (refused(counts, fwd_refused, e, v, tname, op, "fwd", s, vname)) {
      counts.refused += 2;  // and its backward
      continue;
    }
    CHECK_CUDA(e);
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(hy.data(), y, n * sizeof(T), cudaMemcpyDeviceToHost));
    int64_t bad = 0;
    double worst = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double err = std::fabs(double(to_float(hy[i])) - ref[i]);
      if (!(err <= tol[i])) ++bad;
      worst = std::fmax(worst, err / tol[i]);
    }
    report(counts, bad, worst, tname, op, "fwd", s, vname, n);
    // Backward: dx against the reference from the y just checked and dy.
    SoftmaxProblem bp = fastact::softmax_backward_problem(dy, y, dx, s.outer, s.dim, s.inner, dev);
    bp.term_uses_output = Epi::kTermUsesOutput;  // as the launcher sets it
    if (s.inner == 1) bp.bwd_two_cta_threads = fastact::softmax_impl::detail::block_backward_two_cta_threads<T, T, Epi>();
    if (v == fastact::SoftmaxVariant::kAuto)
      std::printf("%s %s bwd [%lld, %lld, %lld]: %s\n", tname, op, static_cast<long long>(s.outer),
                  static_cast<long long>(s.dim), static_cast<long long>(s.inner),
                  fastact::softmax_explain(bp, fastact::choose_softmax(bp)).c_str());
    const bool bwd_refused = fastact::softmax_variant_rejects(v, bp) != nullptr;
    CHECK_CUDA(cudaMemset(dx, 0xff, n * sizeof(T)));
    e = fastact::softmax_backward<T, T, Epi>(dy, y, dx, s.outer, s.dim, s.inner, v, nullptr);
    if (refused(counts, bwd_refused, e, v, tname, op, "bwd", s, vname)) {
      ++counts.refused;
      continue;
    }
    CHECK_CUDA(e);
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(hdx.data(), dx, n * sizeof(T), cudaMemcpyDeviceToHost));
    bad = 0;
    worst = 0;
    for_each_column(s, [&](int64_t base, int64_t step) {
      double dot = 0, absdot = 0;  // softmax: sum dy * y; log_softmax: sum dy (and the sum of the terms' sizes)
      for (int64_t d = 0; d < s.dim; ++d) {
        const double g = to_float(hdy[base + d * step]), o = to_float(hy[base + d * step]);
        dot += kLog ? g : g * o;
        absdot += kLog ? std::fabs(g) : std::fabs(g * o);
      }
      for (int64_t d = 0; d < s.dim; ++d) {
        const double g = to_float(hdy[base + d * step]), o = to_float(hy[base + d * step]);
        const double r = kLog ? g - std::exp(o) * dot : o * (g - dot);
        const double got = to_float(hdx[base + d * step]);
        // One rounding to T, plus float arithmetic on terms of size |dy| and the dot's terms times y (exp(y)).
        const double scale = kLog ? std::fabs(g) + std::exp(o) * absdot : std::fabs(o) * (std::fabs(g) + absdot);
        const double err = std::fabs(got - r);
        const double t = (half_ulp_rel<T>() + kFloatRel) * std::fabs(r) + 1e-5 * scale + subnormal_step<T>();
        if (!(err <= t)) ++bad;
        worst = std::fmax(worst, err / t);
      }
    });
    report(counts, bad, worst, tname, op, "bwd", s, vname, n);
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
      {257, 4096, 1},    // block rows (16-bit softmax backward: two passes, a unit a thread)
      {67, 4104, 1},     // the same, 544 threads for the row's 513 units
      {9, 12288, 1},     // the same, two units a thread
      {5, 8200, 1},      // the same, two units a thread, some threads holding one
      {5, 40000, 1},     // long rows over a cluster; forced split: rows in two launches
      {2, 4, 400000},    // short D over a long inner
      {1, 8192, 512},    // dim 0: strided cached tiles over a cluster
      {3, 1024, 256},    // strided, dim 1
      {16, 100, 1023},   // strided, element accesses: the forward cached, the backward streamed
      {40, 257, 1023},   // strided, element accesses: staged tiles (16-bit, forward and backward)
      {2, 300000, 8},    // a very long strided D: streamed tiles over a cluster
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
