// Autograd for every fastact op, registered at the Autograd key: each forward saves what its
// backward op needs and the backward calls that op through the dispatcher, so autograd,
// torch.compile (AOTAutograd) and opcheck all see real ops. Backward ops are not themselves
// differentiable (no double backward).
#include <torch/autograd.h>
#include <torch/library.h>

#include "op_handles.h"

namespace fastact {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using at::Tensor;

// True when no input carries autograd state (no requires_grad, no forward-mode tangent, not a view
// of such a tensor): then there is nothing to record, and calling the op below autograd directly
// skips Function::apply building a node it would throw away (~1.5 us a call, which dominates on
// small tensors).
bool plain(const Tensor& t) { return !t.defined() || t.unsafeGetTensorImpl()->autograd_meta() == nullptr; }

using SoftmaxBwdSig = Tensor(const Tensor&, const Tensor&, int64_t, at::ScalarType, c10::string_view);

// softmax and log_softmax differ only in which pair of ops they call.
template <bool kLog>
struct SoftmaxFunction : torch::autograd::Function<SoftmaxFunction<kLog>> {
  static Tensor call(const Tensor& x, int64_t dim, std::optional<at::ScalarType> dtype, c10::string_view variant) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return softmax_op<kLog>().call(x, dim, dtype, variant);
  }
  static Tensor forward(AutogradContext* ctx, const Tensor& x, int64_t dim, std::optional<at::ScalarType> dtype,
                        c10::string_view variant) {
    Tensor y = call(x, dim, dtype, variant);
    ctx->save_for_backward({y});
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["input_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["variant"] = std::string(variant);
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto bwd = op_handle<SoftmaxBwdSig>(kLog ? "fastact::log_softmax_backward" : "fastact::softmax_backward");
    const Tensor y = ctx->get_saved_variables()[0];
    const auto input_dtype = static_cast<at::ScalarType>(ctx->saved_data["input_dtype"].toInt());
    const std::string variant = ctx->saved_data["variant"].toStringRef();
    Tensor dx = bwd.call(grads[0], y, ctx->saved_data["dim"].toInt(), input_dtype, variant);
    return {dx, Tensor(), Tensor(), Tensor()};
  }
};

template <bool kLog>
Tensor softmax_autograd(const Tensor& x, int64_t dim, std::optional<at::ScalarType> dtype,
                        c10::string_view variant) {
  if (plain(x)) return SoftmaxFunction<kLog>::call(x, dim, dtype, variant);
  return SoftmaxFunction<kLog>::apply(x, dim, dtype, variant);
}

struct GeluFunction : torch::autograd::Function<GeluFunction> {
  static Tensor call(const Tensor& x, c10::string_view approximate) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return gelu_op().call(x, approximate);
  }
  static Tensor forward(AutogradContext* ctx, const Tensor& x, c10::string_view approximate) {
    ctx->save_for_backward({x});
    ctx->saved_data["approximate"] = std::string(approximate);
    return call(x, approximate);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto bwd = op_handle<Tensor(const Tensor&, const Tensor&, c10::string_view)>("fastact::gelu_backward");
    const Tensor x = ctx->get_saved_variables()[0];
    return {bwd.call(grads[0], x, ctx->saved_data["approximate"].toStringRef()), Tensor()};
  }
};

Tensor gelu_autograd(const Tensor& x, c10::string_view approximate) {
  if (plain(x)) return GeluFunction::call(x, approximate);
  return GeluFunction::apply(x, approximate);
}

struct BiasGeluFunction : torch::autograd::Function<BiasGeluFunction> {
  static Tensor call(const Tensor& x, const Tensor& bias, c10::string_view approximate) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return bias_gelu_op().call(x, bias, approximate);
  }
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& bias, c10::string_view approximate) {
    ctx->save_for_backward({x, bias});
    ctx->saved_data["approximate"] = std::string(approximate);
    return call(x, bias, approximate);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto bwd = op_handle<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, c10::string_view)>(
        "fastact::bias_gelu_backward");
    const auto saved = ctx->get_saved_variables();
    auto [dx, dbias] = bwd.call(grads[0], saved[0], saved[1], ctx->saved_data["approximate"].toStringRef());
    return {dx, dbias, Tensor()};
  }
};

Tensor bias_gelu_autograd(const Tensor& x, const Tensor& bias, c10::string_view approximate) {
  if (plain(x) && plain(bias)) return BiasGeluFunction::call(x, bias, approximate);
  return BiasGeluFunction::apply(x, bias, approximate);
}

struct SigmoidFunction : torch::autograd::Function<SigmoidFunction> {
  static Tensor call(const Tensor& x) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return sigmoid_op().call(x);
  }
  static Tensor forward(AutogradContext* ctx, const Tensor& x) {
    Tensor y = call(x);
    ctx->save_for_backward({y});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto bwd = op_handle<Tensor(const Tensor&, const Tensor&)>("fastact::sigmoid_backward");
    return {bwd.call(grads[0], ctx->get_saved_variables()[0])};
  }
};

Tensor sigmoid_autograd(const Tensor& x) { return plain(x) ? SigmoidFunction::call(x) : SigmoidFunction::apply(x); }

}  // namespace

TORCH_LIBRARY_IMPL(fastact, Autograd, m) {
  m.impl("softmax", &softmax_autograd<false>);
  m.impl("log_softmax", &softmax_autograd<true>);
  m.impl("gelu", &gelu_autograd);
  m.impl("bias_gelu", &bias_gelu_autograd);
  m.impl("sigmoid", &sigmoid_autograd);
}

}  // namespace fastact
