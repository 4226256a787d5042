// The CUDA ops (host side, built by the host compiler) of softmax, log_softmax, softmax_backward and log_softmax_backward: layout planning
// (csrc/common.h), device guard, current stream, dtype dispatch, variant selection (the dispatcher in
// include/fastact/dispatch.h, or a forced `variant`), launch and launch check. The kernels themselves
// are instantiated per dtype in softmax_{float,double,half,bf16}.cu.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>

#include "common.h"
#include "cuda/softmax.h"
#include "cuda/utils.h"
#include "fastact/dispatch.h"

namespace fastact {
namespace {

SoftmaxVariant parse_variant(c10::string_view name, const char* op) {
  const std::string_view sv(name.data(), name.size());
  SoftmaxVariant v = SoftmaxVariant::kAuto;
  TORCH_CHECK(softmax_variant_from_name(sv, &v), op, ": unknown variant '", std::string(sv),
              "'; valid variants: ", softmax_variant_names());
  return v;
}

std::string describe(const SoftmaxProblem& p) {
  std::ostringstream s;
  s << "D=" << p.dim_size << ", outer=" << p.outer << ", inner=" << p.inner;
  if (p.inner == 1) s << ", row stride=" << p.row_stride;
  s << ", 16-byte aligned pointers: " << (p.aligned ? "yes" : "no");
  return s.str();
}

// The plan for a forced variant, or the dispatcher's choice for "auto".
SoftmaxPlan plan_for(SoftmaxVariant v, const SoftmaxProblem& p, const char* op) {
  if (v == SoftmaxVariant::kAuto) return choose_softmax(p);
  const char* why = softmax_variant_rejects(v, p);
  TORCH_CHECK(why == nullptr, op, ": variant '", softmax_variant_name(v), "' cannot take this input (", describe(p),
              "): ", why);
  return plan_softmax(v, p);
}

int acc_bytes_of(at::ScalarType t) { return t == at::kDouble ? 8 : 4; }

// The workspace a plan needs (dispatch.h softmax_workspace_bytes: grid plans, zeroed; strided split
// plans), from the caching allocator on the current stream (so CUDA graphs capture its memset);
// undefined when none.
at::Tensor workspace_for(const SoftmaxPlan& plan, int64_t outer, const at::Tensor& like) {
  const int64_t bytes = softmax_workspace_bytes(plan, outer);
  if (bytes == 0) return at::Tensor();
  const auto options = like.options().dtype(at::kByte);
  return softmax_workspace_zeroed(plan) ? at::zeros({bytes}, options) : at::empty({bytes}, options);
}

template <typename in_t, typename out_t>
void launch_forward(bool log, const SoftmaxForwardPlan& plan, SoftmaxVariant v, const char* op) {
  const SoftmaxGeometry& g = plan.geom;
  const auto* x = cuda::in_ptr<in_t>(plan.input);
  auto* y = cuda::out_ptr<out_t>(plan.output);
  const SoftmaxDeviceProps dev = cuda::softmax_device_props_cached(plan.input.get_device());
  SoftmaxProblem p = softmax_forward_problem(x, int(sizeof(in_t)), y, int(sizeof(out_t)),
                                             acc_bytes_of(plan.output.scalar_type()), g.outer, g.dim_size, g.inner,
                                             g.row_stride, dev);
  p.workspace = true;
  const SoftmaxPlan sp = plan_for(v, p, op);
  const at::Tensor ws = workspace_for(sp, g.outer, plan.output);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  FASTACT_CHECK_LAUNCH(cuda::softmax_forward_cuda(log, x, y, g.outer, g.dim_size, g.inner, g.row_stride, sp, stream,
                                                  ws.defined() ? ws.data_ptr() : nullptr),
                       op);
}

template <typename in_t, typename out_t>
void launch_backward(bool log, const SoftmaxBackwardPlan& plan, SoftmaxVariant v, const char* op) {
  const SoftmaxGeometry& g = plan.geom;
  const auto* dy = cuda::in_ptr<out_t>(plan.grad_output);
  const auto* y = cuda::in_ptr<out_t>(plan.output);
  auto* dx = cuda::out_ptr<in_t>(plan.grad_input);
  const SoftmaxDeviceProps dev = cuda::softmax_device_props_cached(plan.output.get_device());
  SoftmaxProblem p = softmax_backward_problem(dy, y, int(sizeof(out_t)), dx, int(sizeof(in_t)),
                                              acc_bytes_of(plan.output.scalar_type()), g.outer, g.dim_size, g.inner,
                                              dev);
  p.workspace = true;
  p.term_uses_output = !log;  // math.h kTermUsesOutput
  if (g.inner == 1) p.bwd_two_cta_threads = cuda::softmax_backward_two_cta_threads(log, dy, dx);  // long_row's rule
  const SoftmaxPlan sp = plan_for(v, p, op);
  const at::Tensor ws = workspace_for(sp, g.outer, plan.output);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  FASTACT_CHECK_LAUNCH(cuda::softmax_backward_cuda(log, dy, y, dx, g.outer, g.dim_size, g.inner, sp, stream,
                                                   ws.defined() ? ws.data_ptr() : nullptr),
                       op);
}

at::Tensor softmax_forward_op(const at::Tensor& x, int64_t dim, std::optional<at::ScalarType> dtype,
                              c10::string_view variant, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  const SoftmaxVariant v = parse_variant(variant, op);
  c10::cuda::CUDAGuard guard(x.device());
  const SoftmaxForwardPlan plan = plan_softmax_forward(x, dim, dtype, op);
  if (plan.input.numel() == 0) return plan.output;
  const at::ScalarType out_type = plan.output.scalar_type();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, plan.input.scalar_type(), "fastact_softmax", [&] {
    using in_t = scalar_t;
    if (out_type == plan.input.scalar_type()) {
      launch_forward<in_t, in_t>(log, plan, v, op);
    } else if constexpr (std::is_same_v<in_t, at::Half> || std::is_same_v<in_t, at::BFloat16>) {
      TORCH_INTERNAL_ASSERT(out_type == at::kFloat, op, ": unexpected fused output dtype ", out_type);
      launch_forward<in_t, float>(log, plan, v, op);
    } else {
      TORCH_INTERNAL_ASSERT(false, op, ": unexpected fused output dtype ", out_type);
    }
  });
  return plan.output;
}

at::Tensor softmax_backward_op(const at::Tensor& grad_output, const at::Tensor& output, int64_t dim,
                               at::ScalarType input_dtype, c10::string_view variant, bool log) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  const SoftmaxVariant v = parse_variant(variant, op);
  // Before the guard: a CPU operand must get this op's error, not the guard's.
  check_same_device(grad_output, output, op, "grad_output", "output");
  c10::cuda::CUDAGuard guard(output.device());
  const SoftmaxBackwardPlan plan = plan_softmax_backward(grad_output, output, dim, input_dtype, op);
  if (plan.output.numel() > 0) {
    const at::ScalarType compute = plan.compute_dtype;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, plan.output.scalar_type(), "fastact_softmax_backward",
                                    [&] {
                                      using out_t = scalar_t;
                                      if (compute == plan.output.scalar_type()) {
                                        launch_backward<out_t, out_t>(log, plan, v, op);
                                      } else if constexpr (std::is_same_v<out_t, float>) {
                                        if (compute == at::kHalf) {
                                          launch_backward<at::Half, float>(log, plan, v, op);
                                        } else {
                                          TORCH_INTERNAL_ASSERT(compute == at::kBFloat16, op,
                                                                ": unexpected fused grad_input dtype ", compute);
                                          launch_backward<at::BFloat16, float>(log, plan, v, op);
                                        }
                                      } else {
                                        TORCH_INTERNAL_ASSERT(false, op, ": unexpected fused grad_input dtype ",
                                                              compute);
                                      }
                                    });
  }
  at::Tensor grad_input = plan.grad_input;
  if (grad_input.scalar_type() != input_dtype) grad_input = grad_input.to(input_dtype);
  return grad_input;
}

at::Tensor softmax_cuda(const at::Tensor& x, int64_t dim, std::optional<at::ScalarType> dtype,
                        c10::string_view variant) {
  return softmax_forward_op(x, dim, dtype, variant, /*log=*/false);
}

at::Tensor log_softmax_cuda(const at::Tensor& x, int64_t dim, std::optional<at::ScalarType> dtype,
                            c10::string_view variant) {
  return softmax_forward_op(x, dim, dtype, variant, /*log=*/true);
}

at::Tensor softmax_backward_cuda(const at::Tensor& grad_output, const at::Tensor& output, int64_t dim,
                                 at::ScalarType input_dtype, c10::string_view variant) {
  return softmax_backward_op(grad_output, output, dim, input_dtype, variant, /*log=*/false);
}

at::Tensor log_softmax_backward_cuda(const at::Tensor& grad_output, const at::Tensor& output, int64_t dim,
                                     at::ScalarType input_dtype, c10::string_view variant) {
  return softmax_backward_op(grad_output, output, dim, input_dtype, variant, /*log=*/true);
}

}  // namespace

std::string explain_softmax_cuda(const at::Tensor& x, int64_t dim, bool log, bool backward,
                                 std::optional<at::ScalarType> dtype) {
  const char* op = backward ? (log ? "log_softmax_backward" : "softmax_backward") : (log ? "log_softmax" : "softmax");
  const SoftmaxExplainTypes t = softmax_explain_types(x.scalar_type(), dtype, backward, op);
  TORCH_CHECK(x.is_cuda(), op, ": explain_softmax_cuda expects a CUDA tensor, got one on ", x.device());
  dim = wrap_dim(dim, x.dim(), "explain");
  if (x.numel() == 0) return "variant=none: the tensor is empty, nothing is launched";
  c10::cuda::CUDAGuard guard(x.device());
  // The layout the op would hand the kernels (csrc/common.h), without allocating: a dense tensor in
  // place, last-dim rows with a stride in place (forward only), anything else as a fresh dense copy
  // in empty_like's layout (a meta tensor gives its strides; aligned: a null pointer stands for it).
  SoftmaxGeometry g;
  const void* ptr = nullptr;
  if (t.cast_first) {  // x.to(dtype)
    g = dense_geometry(at::empty_like(x, x.options().device(at::kMeta).dtype(t.out)), dim);
  } else if (is_dense(x)) {
    g = dense_geometry(x, dim);
    ptr = x.const_data_ptr();
  } else if (auto rs = backward ? std::nullopt : collapsed_row_stride(x, dim)) {
    g.outer = x.numel() / x.size(dim);
    g.dim_size = x.size(dim);
    g.row_stride = *rs;
    ptr = x.const_data_ptr();
  } else {
    g = dense_geometry(at::empty_like(x, x.options().device(at::kMeta)), dim);
  }
  const SoftmaxDeviceProps dev = cuda::softmax_device_props_cached(x.get_device());
  const int in_elem = static_cast<int>(c10::elementSize(t.in));
  const int out_elem = static_cast<int>(c10::elementSize(t.out));
  const int acc = acc_bytes_of(t.out);
  SoftmaxProblem p =
      backward ? softmax_backward_problem(ptr, ptr, out_elem, ptr, in_elem, acc, g.outer, g.dim_size, g.inner, dev)
               : softmax_forward_problem(ptr, in_elem, nullptr, out_elem, acc, g.outer, g.dim_size, g.inner,
                                         g.row_stride, dev);
  p.workspace = true;  // as the ops (workspace_for)
  p.term_uses_output = !log;  // as launch_backward
  if (backward && g.inner == 1) {  // as launch_backward, for grad_input in t.in
    if (t.in == t.out) {
      AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, t.out, "explain", [&] {
        const cuda::cuda_type<scalar_t>* none = nullptr;
        p.bwd_two_cta_threads = cuda::softmax_backward_two_cta_threads(log, none, none);
      });
    } else {  // the fused cast: float grad_output and output, a 16-bit grad_input
      const float* dy = nullptr;
      AT_DISPATCH_REDUCED_FLOATING_TYPES(t.in, "explain", [&] {
        const cuda::cuda_type<scalar_t>* dx = nullptr;
        p.bwd_two_cta_threads = cuda::softmax_backward_two_cta_threads(log, dy, dx);
      });
    }
  }
  const SoftmaxPlan plan = choose_softmax(p);
  // the prose, then the plan's fields on a line of their own (dispatch.h softmax_plan_fields: what tests read)
  return softmax_explain(p, plan) + t.note + "\n" + softmax_plan_fields(p, plan);
}

TORCH_LIBRARY_IMPL(fastact, CUDA, m) {
  m.impl("softmax", &softmax_cuda);
  m.impl("log_softmax", &log_softmax_cuda);
  m.impl("softmax_backward", &softmax_backward_cuda);
  m.impl("log_softmax_backward", &log_softmax_backward_cuda);
}

}  // namespace fastact
