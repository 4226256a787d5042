// Diagnostic (not part of the library; bench/NOTES.md, fiftieth session): the softmax / log_softmax of aligned rows,
// forward and backward, under launch plans the dispatcher does not pick, through the library's own plan launchers
// (launch.cuh softmax_forward / softmax_backward with a SoftmaxPlan), so every row runs the library's kernels as
// compiled:
//
//   kind 0  the dispatcher's plan (choose_softmax; no workspace, so no grid mode)
//   kind 1  split, forced (plan_softmax(kSplit))
//   kind 2  long_row, forced (plan_softmax(kLongRow))
//   kind 3  vec, the kernel sized for the longest row, `threads` threads a CTA
//   kind 4  backward: vec, one unit of dy and y a thread, the kernel sized for it (plan.one_unit)
//   kind 5  backward: vec in two passes over the row, `threads` threads a CTA, one or two units a pass
//           (plan.two_pass)
//   kind 6  forward: warp, packed (plan.packed: kWarpPackedAccesses 128-bit accesses a lane, several rows a warp)
//   kind 7  warp, not packed (one 128-bit access a lane where the row has them), blocks of kWarpBlockThreads
//   kind 8  forward: warp, not packed, blocks of kWarpSmallBlockThreads (where softmax_warp_small_blockable)
//
// A shared library for softmax_bwd_plans_diag.py (ctypes), one dtype a build:
//
//   nvcc -std=c++17 -O3 -arch=sm_90 --expt-relaxed-constexpr -Iinclude -Xcompiler -fPIC -shared \
//        -DDIAG_DTYPE=<0 bf16 | 1 f16 | 2 f32 | 3 bf16 in, f32 out> -o libsmplans_<dtype>.so \
//        bench/repro/softmax_bwd_plans_diag.cu
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "fastact/softmax/launch.cuh"

#ifndef DIAG_DTYPE
#define DIAG_DTYPE 0
#endif

namespace {

using namespace fastact;
// In: the forward's input and the backward's grad_input; Out: the forward's output and the backward's grad_output
// and output (the torch ops' dtype= casts: bfloat16 inputs, float outputs, where DIAG_DTYPE is 3).
using In = std::conditional_t<DIAG_DTYPE == 0 || DIAG_DTYPE == 3, __nv_bfloat16,
                              std::conditional_t<DIAG_DTYPE == 1, __half, float>>;
using Out = std::conditional_t<DIAG_DTYPE == 3, float, In>;
constexpr int kW = softmax_vec_width(sizeof(In), sizeof(Out));

// The tensors of a call: forward x = a, y = c (b unused); backward dy = a, y = b, dx = c.
struct Tensors {
  const void* a;
  const void* b;
  void* c;
};

// The plan of `kind` (above) for rows x dim; false where the kind cannot run it.
template <typename Epi>
bool diag_plan(bool fwd, int kind, int threads, const Tensors& t, int64_t rows, int64_t dim, SoftmaxPlan* out) {
  int device = 0;
  SoftmaxDeviceProps dev;
  if (cudaGetDevice(&device) != cudaSuccess || softmax_device_props(device, &dev) != cudaSuccess) return false;
  SoftmaxProblem p =
      fwd ? softmax_forward_problem(static_cast<const In*>(t.a), static_cast<Out*>(t.c), rows, dim, 1, dim, dev)
          : softmax_backward_problem(static_cast<const Out*>(t.a), static_cast<const Out*>(t.b),
                                     static_cast<In*>(t.c), rows, dim, 1, dev);
  if (!fwd) {
    p.term_uses_output = Epi::kTermUsesOutput;
    p.bwd_two_cta_threads = softmax_impl::detail::block_backward_two_cta_threads<In, Out, Epi>();
  }
  if (kind == 0) {
    *out = choose_softmax(p);
    return true;
  }
  if (kind >= 6 && kind <= 8) {
    if (softmax_variant_rejects(SoftmaxVariant::kWarp, p) != nullptr) return false;
    SoftmaxPlan s = plan_softmax(SoftmaxVariant::kWarp, p);
    s.packed = kind == 6;
    s.threads = kind == 8 ? kWarpSmallBlockThreads : kWarpBlockThreads;
    if (s.packed && (!fwd || !softmax_warp_packable(s.warp_log2, s.vec))) return false;
    if (kind == 8 && (!fwd || !softmax_warp_small_blockable(s.warp_log2, s.vec, p.in_bytes, p.out_bytes)))
      return false;
    s.elems_per_thread = softmax_warp_elems_per_thread(s.warp_log2, s.vec, p.backward, p.out_bytes, s.packed);
    *out = s;
    return true;
  }
  if (kind == 1 || kind == 2) {
    const SoftmaxVariant v = kind == 1 ? SoftmaxVariant::kSplit : SoftmaxVariant::kLongRow;
    if (softmax_variant_rejects(v, p) != nullptr) return false;
    *out = plan_softmax(v, p);
    return true;
  }
  if (dim % kW != 0 || (fwd && kind > 3)) return false;
  SoftmaxPlan s;
  s.variant = SoftmaxVariant::kVec;
  s.mode = SoftmaxMode::kResident;
  s.vec = kW;
  s.cluster = 1;
  s.threads = threads;
  s.one_unit = kind == 4;
  s.two_pass = kind == 5;
  if (kind == 4) s.threads = int(softmax_detail::round_up(dim / kW, 32));
  *out = s;
  return kind >= 3 && kind <= 5;
}

template <typename Epi>
int run(bool fwd, int kind, int threads, const Tensors& t, int64_t rows, int64_t dim, cudaStream_t s) {
  SoftmaxPlan plan;
  if (!diag_plan<Epi>(fwd, kind, threads, t, rows, dim, &plan)) return 1000;
  if (fwd && kind == 3) plan.elems_per_thread = int(softmax_detail::ceil_div(dim, threads));
  return static_cast<int>(
      fwd ? softmax_forward<In, Out, Epi>(static_cast<const In*>(t.a), static_cast<Out*>(t.c), rows, dim, 1, dim,
                                          plan, s)
          : softmax_backward<In, Out, Epi>(static_cast<const Out*>(t.a), static_cast<const Out*>(t.b),
                                           static_cast<In*>(t.c), rows, dim, 1, plan, s));
}

}  // namespace

// fwd: 1 forward (a = x, c = y), 0 backward (a = dy, b = y, c = dx); log: 0 softmax, 1 log_softmax; tensors
// [rows, dim] dense. A cudaError_t, or 1000: the kind does not take it.
extern "C" int diag_run(int fwd, int log, int kind, int threads, const void* a, const void* b, void* c, int64_t rows,
                        int64_t dim, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const Tensors t{a, b, c};
  return log ? run<math::LogSoftmaxEpilogue>(fwd, kind, threads, t, rows, dim, s)
             : run<math::SoftmaxEpilogue>(fwd, kind, threads, t, rows, dim, s);
}

// The plan kind 0 (the dispatcher) takes, as [variant, threads, elems_per_thread, two_pass, one_unit, chunks,
// group_rows, cluster, packed]; 1000 where there is none.
extern "C" int diag_auto_plan(int fwd, int log, const void* a, const void* b, void* c, int64_t rows, int64_t dim,
                              int64_t* fields) {
  SoftmaxPlan s;
  const Tensors t{a, b, c};
  const bool ok = log ? diag_plan<math::LogSoftmaxEpilogue>(fwd, 0, 0, t, rows, dim, &s)
                      : diag_plan<math::SoftmaxEpilogue>(fwd, 0, 0, t, rows, dim, &s);
  if (!ok) return 1000;
  const int64_t f[] = {int64_t(s.variant), s.threads, s.elems_per_thread, s.two_pass, s.one_unit, s.chunks,
                       s.group_rows, s.cluster, s.packed};
  for (int i = 0; i < 9; ++i) fields[i] = f[i];
  return 0;
}
