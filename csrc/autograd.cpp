// Autograd for every fastact op, registered at the Autograd key: each forward saves what its
// backward op needs and the backward calls that op through the dispatcher, so autograd,
// torch.compile (AOTAutograd) and opcheck all see real ops. The backward ops are differentiable in
// turn (double backward, as torch's are): their derivatives below are torch ops and fastact ops,
// recorded when a backward runs with create_graph, so every higher derivative follows.
#include <ATen/ATen.h>
#include <ATen/FuncTorchTLS.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <vector>

#include "common.h"
#include "fastact/math.h"
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

// torch refuses C++ autograd Functions under torch.func transforms with an error that names none of
// fastact's ways around it: the public functions, which take fastact/_functorch.py's autograd
// Functions there. Called where an op would record its Function (so a transform reached the op
// directly, or through torch.compile's tracing of a transform), with torch's own test
// (FuncTorchTLS::checkSupportsCppAutogradFunction), to say that instead.
void check_no_transform(const char* op) {
  const auto& functorch = at::functorch::functorchTLSAccessor();
  if (!functorch) return;
  try {
    functorch->checkSupportsCppAutogradFunction();
  } catch (const c10::Error&) {
    TORCH_CHECK(false, "fastact::", op,
                ": under torch.func transforms (grad, vjp, jacrev, hessian, ...) call fastact's public functions "
                "(fastact.softmax, ...), not torch.ops.fastact directly; torch.compile of such a transform "
                "(torch.compile(torch.func.grad(f))) is not supported yet");
  }
}

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
    const Tensor y = ctx->get_saved_variables()[0];
    const auto input_dtype = static_cast<at::ScalarType>(ctx->saved_data["input_dtype"].toInt());
    const std::string variant = ctx->saved_data["variant"].toStringRef();
    Tensor dx = softmax_backward_op<kLog>().call(grads[0], y, ctx->saved_data["dim"].toInt(), input_dtype, variant);
    return {dx, Tensor(), Tensor(), Tensor()};
  }
};

template <bool kLog>
Tensor softmax_autograd(const Tensor& x, int64_t dim, std::optional<at::ScalarType> dtype,
                        c10::string_view variant) {
  if (plain(x)) return SoftmaxFunction<kLog>::call(x, dim, dtype, variant);
  check_no_transform(kLog ? "log_softmax" : "softmax");
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
    const Tensor x = ctx->get_saved_variables()[0];
    return {gelu_backward_op().call(grads[0], x, ctx->saved_data["approximate"].toStringRef()), Tensor()};
  }
};

Tensor gelu_autograd(const Tensor& x, c10::string_view approximate) {
  if (plain(x)) return GeluFunction::call(x, approximate);
  check_no_transform("gelu");
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
    const auto saved = ctx->get_saved_variables();
    auto [dx, dbias] = bias_gelu_backward_op().call(grads[0], saved[0], saved[1], ctx->saved_data["approximate"].toStringRef());
    return {dx, dbias, Tensor()};
  }
};

Tensor bias_gelu_autograd(const Tensor& x, const Tensor& bias, c10::string_view approximate) {
  if (plain(x) && plain(bias)) return BiasGeluFunction::call(x, bias, approximate);
  check_no_transform("bias_gelu");
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
    return {sigmoid_backward_op().call(grads[0], ctx->get_saved_variables()[0])};
  }
};

Tensor sigmoid_autograd(const Tensor& x) {
  if (plain(x)) return SigmoidFunction::call(x);
  check_no_transform("sigmoid");
  return SigmoidFunction::apply(x);
}

// ------------------------------------------------------------------------------------------------
// The backward ops' own derivatives (double backward). Each formula is in torch ops on the saved
// inputs and the incoming gradient g of the backward op's output, in float for 16-bit tensors (as
// the kernels compute), cast back to each input's dtype; where a derivative is the backward op
// itself (softmax's and gelu's with respect to grad_output), it calls that fastact op.

// Whether a backward op's call goes through its autograd Function: an input requires grad in grad
// mode (a backward run with create_graph), or carries a forward-mode tangent (which Function::apply
// refuses with an error, as it does for the forward ops, rather than dropping it). Otherwise (the
// first-order backward without create_graph) it runs below autograd directly: nothing to record.
bool record(std::initializer_list<Tensor> ts) {
  const bool grad_mode = at::GradMode::is_enabled();
  for (const Tensor& t : ts) {
    if (t.defined() && ((grad_mode && t.requires_grad()) || t._fw_grad(/*level=*/0).defined())) return true;
  }
  return false;
}

// float for half and bfloat16 (the kernels' accumulation type); float and double as they are.
Tensor opmath(const Tensor& t) { return at::isReducedFloatingType(t.scalar_type()) ? t.to(at::kFloat) : t; }

// d2/dx2 gelu(x). erf: gelu = x Phi(x), gelu' = Phi + x phi, gelu'' = phi(x) (2 - x^2). tanh: gelu =
// x (1 + t) / 2, t = tanh(u), u = k (x + c x^3): gelu'' = (1 - t^2) (u' + x (u'' - 2 t u'^2) / 2),
// u' = k (1 + 3 c x^2), u'' = 6 k c x (k = sqrt(2 / pi), c = 0.044715: math.h's GeluConstants). 1 - t^2
// as 1 / cosh(u)^2: the difference loses every digit as t nears 1 (in float, 0.14% off at |x| = 4,
// and 0 instead of 4e-6 at |x| = 5).
Tensor gelu_second_derivative(const Tensor& x, c10::string_view approximate) {
  using K = math::GeluConstants<double>;
  if (approximate == "tanh") {
    const double k = K::kBeta, c = K::kKappa;
    const Tensor x2 = x * x;
    const Tensor u = k * (x + c * x2 * x);
    const Tensor t = at::tanh(u);
    const Tensor sech2 = at::cosh(u).pow(-2);
    const Tensor du = k * (1 + 3 * c * x2);
    return sech2 * (du + 0.5 * x * (6 * k * c * x - 2 * t * du * du));
  }
  const Tensor x2 = x * x;
  return K::kInvSqrt2Pi * at::exp(-0.5 * x2) * (2 - x2);
}

// softmax: dx = y (dy - sum(dy y)), so d/d dy = y (g - sum(g y)) (softmax_backward itself) and
// d/dy = g (dy - sum(dy y)) - dy sum(g y). log_softmax: dx = dy - exp(y) sum(dy), so d/d dy =
// g - sum(g exp(y)) and d/dy = -g exp(y) sum(dy). Sums over `dim`, kept.
template <bool kLog>
struct SoftmaxBackwardFunction : torch::autograd::Function<SoftmaxBackwardFunction<kLog>> {
  static Tensor call(const Tensor& dy, const Tensor& y, int64_t dim, at::ScalarType input_dtype,
                     c10::string_view variant) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return softmax_backward_op<kLog>().call(dy, y, dim, input_dtype, variant);
  }
  static Tensor forward(AutogradContext* ctx, const Tensor& dy, const Tensor& y, int64_t dim,
                        at::ScalarType input_dtype, c10::string_view variant) {
    ctx->save_for_backward({dy, y});
    ctx->saved_data["dim"] = dim;
    return call(dy, y, dim, input_dtype, variant);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &dy = saved[0], &y = saved[1];
    const int64_t dim = ctx->saved_data["dim"].toInt();
    const Tensor dyf = opmath(dy), yf = opmath(y);
    const Tensor g = grads[0].to(yf.scalar_type());  // dx is in input_dtype
    Tensor grad_dy, grad_y;
    if constexpr (kLog) {
      const Tensor e = at::exp(yf);
      if (ctx->needs_input_grad(0)) grad_dy = (g - (g * e).sum(dim, true)).to(dy.scalar_type());
      if (ctx->needs_input_grad(1)) grad_y = (-g * e * dyf.sum(dim, true)).to(y.scalar_type());
    } else {
      if (ctx->needs_input_grad(0))
        grad_dy = softmax_backward_op<false>().call(g, yf, dim, g.scalar_type(), "auto").to(dy.scalar_type());
      if (ctx->needs_input_grad(1))
        grad_y = (g * (dyf - (dyf * yf).sum(dim, true)) - dyf * (g * yf).sum(dim, true)).to(y.scalar_type());
    }
    return {grad_dy, grad_y, Tensor(), Tensor(), Tensor()};
  }
};

template <bool kLog>
Tensor softmax_backward_autograd(const Tensor& dy, const Tensor& y, int64_t dim, at::ScalarType input_dtype,
                                 c10::string_view variant) {
  if (!record({dy, y})) return SoftmaxBackwardFunction<kLog>::call(dy, y, dim, input_dtype, variant);
  check_no_transform(kLog ? "log_softmax_backward" : "softmax_backward");
  return SoftmaxBackwardFunction<kLog>::apply(dy, y, dim, input_dtype, variant);
}

// dx = dy gelu'(x): d/d dy = g gelu'(x) (gelu_backward itself), d/dx = g dy gelu''(x).
struct GeluBackwardFunction : torch::autograd::Function<GeluBackwardFunction> {
  static Tensor call(const Tensor& dy, const Tensor& x, c10::string_view approximate) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return gelu_backward_op().call(dy, x, approximate);
  }
  static Tensor forward(AutogradContext* ctx, const Tensor& dy, const Tensor& x, c10::string_view approximate) {
    ctx->save_for_backward({dy, x});
    ctx->saved_data["approximate"] = std::string(approximate);
    return call(dy, x, approximate);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &dy = saved[0], &x = saved[1];
    const std::string approximate = ctx->saved_data["approximate"].toStringRef();
    Tensor grad_dy, grad_x;
    if (ctx->needs_input_grad(0)) grad_dy = gelu_backward_op().call(grads[0], x, approximate);
    if (ctx->needs_input_grad(1))
      grad_x = (opmath(grads[0]) * opmath(dy) * gelu_second_derivative(opmath(x), approximate)).to(x.scalar_type());
    return {grad_dy, grad_x, Tensor()};
  }
};

Tensor gelu_backward_autograd(const Tensor& dy, const Tensor& x, c10::string_view approximate) {
  if (!record({dy, x})) return GeluBackwardFunction::call(dy, x, approximate);
  check_no_transform("gelu_backward");
  return GeluBackwardFunction::apply(dy, x, approximate);
}

// (dx, dbias) = (dy gelu'(z), dx summed over all but the last dim), z = x + bias. With g and gb the
// gradients of dx and dbias, dx's elements see G = g + gb (broadcast): d/d dy = G gelu'(z),
// d/dx = G dy gelu''(z), d/dbias = that summed like dbias.
struct BiasGeluBackwardFunction : torch::autograd::Function<BiasGeluBackwardFunction> {
  static std::tuple<Tensor, Tensor> call(const Tensor& dy, const Tensor& x, const Tensor& bias,
                                         c10::string_view approximate) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return bias_gelu_backward_op().call(dy, x, bias, approximate);
  }
  static variable_list forward(AutogradContext* ctx, const Tensor& dy, const Tensor& x, const Tensor& bias,
                               c10::string_view approximate) {
    ctx->save_for_backward({dy, x, bias});
    ctx->saved_data["approximate"] = std::string(approximate);
    auto [dx, dbias] = call(dy, x, bias, approximate);
    return {dx, dbias};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &dy = saved[0], &x = saved[1], &bias = saved[2];
    const std::string approximate = ctx->saved_data["approximate"].toStringRef();
    const Tensor G = opmath(grads[0]) + opmath(grads[1]);
    const Tensor z = opmath(x) + opmath(bias);
    Tensor grad_dy, grad_x, grad_bias;
    if (ctx->needs_input_grad(0)) grad_dy = gelu_backward_op().call(G, z, approximate).to(dy.scalar_type());
    if (ctx->needs_input_grad(1) || ctx->needs_input_grad(2)) {
      const Tensor h = G * opmath(dy) * gelu_second_derivative(z, approximate);
      if (ctx->needs_input_grad(1)) grad_x = h.to(x.scalar_type());
      if (ctx->needs_input_grad(2)) {
        std::vector<int64_t> rows(static_cast<size_t>(std::max<int64_t>(x.dim() - 1, 0)));
        for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
        grad_bias = (rows.empty() ? h : h.sum(rows)).to(bias.scalar_type());
      }
    }
    return {grad_dy, grad_x, grad_bias, Tensor()};
  }
};

std::tuple<Tensor, Tensor> bias_gelu_backward_autograd(const Tensor& dy, const Tensor& x, const Tensor& bias,
                                                       c10::string_view approximate) {
  if (!record({dy, x, bias})) return BiasGeluBackwardFunction::call(dy, x, bias, approximate);
  check_no_transform("bias_gelu_backward");
  const variable_list out = BiasGeluBackwardFunction::apply(dy, x, bias, approximate);
  return {out[0], out[1]};
}

// dx = dy y (1 - y): d/d dy = g y (1 - y) (sigmoid_backward itself), d/dy = g dy (1 - 2 y).
struct SigmoidBackwardFunction : torch::autograd::Function<SigmoidBackwardFunction> {
  static Tensor call(const Tensor& dy, const Tensor& y) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return sigmoid_backward_op().call(dy, y);
  }
  static Tensor forward(AutogradContext* ctx, const Tensor& dy, const Tensor& y) {
    ctx->save_for_backward({dy, y});
    return call(dy, y);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &dy = saved[0], &y = saved[1];
    Tensor grad_dy, grad_y;
    if (ctx->needs_input_grad(0)) grad_dy = sigmoid_backward_op().call(grads[0], y);
    if (ctx->needs_input_grad(1)) grad_y = (opmath(grads[0]) * opmath(dy) * (1 - 2 * opmath(y))).to(y.scalar_type());
    return {grad_dy, grad_y};
  }
};

Tensor sigmoid_backward_autograd(const Tensor& dy, const Tensor& y) {
  if (!record({dy, y})) return SigmoidBackwardFunction::call(dy, y);
  check_no_transform("sigmoid_backward");
  return SigmoidBackwardFunction::apply(dy, y);
}

}  // namespace

TORCH_LIBRARY_IMPL(fastact, Autograd, m) {
  m.impl("softmax", &softmax_autograd<false>);
  m.impl("log_softmax", &softmax_autograd<true>);
  m.impl("gelu", &gelu_autograd);
  m.impl("bias_gelu", &bias_gelu_autograd);
  m.impl("sigmoid", &sigmoid_autograd);
  m.impl("softmax_backward", &softmax_backward_autograd<false>);
  m.impl("log_softmax_backward", &softmax_backward_autograd<true>);
  m.impl("gelu_backward", &gelu_backward_autograd);
  m.impl("bias_gelu_backward", &bias_gelu_backward_autograd);
  m.impl("sigmoid_backward", &sigmoid_backward_autograd);
}

}  // namespace fastact
