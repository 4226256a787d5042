// Autograd for every fastact op, registered at the Autograd key: each forward saves what its
// backward op needs and the backward calls that op through the dispatcher, so autograd,
// torch.compile (AOTAutograd) and opcheck all see real ops. The backward ops are differentiable in
// turn (double backward, as torch's are): their derivatives below are torch ops and fastact ops,
// recorded when a backward runs with create_graph, so every higher derivative follows.
#include <ATen/ATen.h>
#include <ATen/FuncTorchTLS.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <string>
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

// A pointwise op of the table (fastact/op_table.h): saves its input or its output, as the row says, and its
// param (as a string; empty for rows without one).
template <typename Row>
struct PointwiseFunction : torch::autograd::Function<PointwiseFunction<Row>> {
  static Tensor call(const Tensor& x, c10::string_view param) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return PointwiseHandles<Row>::forward(x, param);
  }
  static Tensor forward(AutogradContext* ctx, const Tensor& x, c10::string_view param) {
    Tensor y = call(x, param);
    ctx->save_for_backward({Row::kFromOutput ? y : x});
    ctx->saved_data["param"] = std::string(param);
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Tensor s = ctx->get_saved_variables()[0];
    return {PointwiseHandles<Row>::backward(grads[0], s, ctx->saved_data["param"].toStringRef()), Tensor()};
  }
};

template <typename Row>
Tensor pointwise_autograd(const Tensor& x, c10::string_view param) {
  if (plain(x)) return PointwiseFunction<Row>::call(x, param);
  check_no_transform(Row::kName);
  return PointwiseFunction<Row>::apply(x, param);
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

// A pointwise op's backward, dx = dy f'(s) (s its input or its output): d/d dy = g f'(s) (the backward op
// itself), d/ds = g dy f''(s) (the row's `_backward_grad` op, math.h's second derivative, in float for 16-bit
// tensors as the kernels compute, cast back to s's dtype).
template <typename Row>
struct PointwiseBackwardFunction : torch::autograd::Function<PointwiseBackwardFunction<Row>> {
  static Tensor call(const Tensor& dy, const Tensor& s, c10::string_view param) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return PointwiseHandles<Row>::backward(dy, s, param);
  }
  static Tensor forward(AutogradContext* ctx, const Tensor& dy, const Tensor& s, c10::string_view param) {
    ctx->save_for_backward({dy, s});
    ctx->saved_data["param"] = std::string(param);
    return call(dy, s, param);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &dy = saved[0], &s = saved[1];
    const std::string param = ctx->saved_data["param"].toStringRef();
    Tensor grad_dy, grad_s;
    if (ctx->needs_input_grad(0)) grad_dy = PointwiseHandles<Row>::backward(grads[0], s, param);
    if (ctx->needs_input_grad(1)) {
      grad_s = PointwiseHandles<Row>::backward_grad(opmath(grads[0]) * opmath(dy), opmath(s), param, 2)
                   .to(s.scalar_type());
    }
    return {grad_dy, grad_s, Tensor()};
  }
};

template <typename Row>
Tensor pointwise_backward_autograd(const Tensor& dy, const Tensor& s, c10::string_view param) {
  if (!record({dy, s})) return PointwiseBackwardFunction<Row>::call(dy, s, param);
  check_no_transform(Row::kBackwardName);
  return PointwiseBackwardFunction<Row>::apply(dy, s, param);
}

// The n-th derivative with respect to s of the row's backward at dy = 1 (n = 0: f'(s), or, for a row that saves
// its output, the backward's formula in the output), differentiated by torch from the row's torch twin (each
// pointwise row is named as its twin and takes its arguments): a row that saves its input differentiates the twin
// forward (`aten::gelu(self, approximate)`, `aten::silu(self)`) n + 1 times, one that saves its output the twin
// backward (`aten::sigmoid_backward(grad_output, output)`) n times; torch writes both to any order. Attached to
// s's graph where grad mode is on (a further derivative may follow), a plain value where it is off.
template <typename Row>
Tensor twin_derivative(const Tensor& s, c10::string_view param, int n) {
  const bool attached = torch::autograd::GradMode::is_enabled() && s.requires_grad();
  at::AutoGradMode grad_mode(true);
  const Tensor t = attached ? s : s.detach().requires_grad_(true);
  static const std::string name = std::string("aten::") + (Row::kFromOutput ? Row::kBackwardName : Row::kName);
  auto& dispatcher = c10::Dispatcher::singleton();
  Tensor d;
  if constexpr (Row::kFromOutput) {
    static const auto twin = dispatcher.findSchemaOrThrow(name.c_str(), "").typed<Tensor(const Tensor&, const Tensor&)>();
    d = twin.call(at::ones_like(t), t);
  } else if constexpr (optable::has_param<Row>()) {
    static const auto twin = dispatcher.findSchemaOrThrow(name.c_str(), "").typed<Tensor(const Tensor&, c10::string_view)>();
    d = twin.call(t, param);
  } else {
    static const auto twin = dispatcher.findSchemaOrThrow(name.c_str(), "").typed<Tensor(const Tensor&)>();
    d = twin.call(t);
  }
  for (int k = 0; k < n + (Row::kFromOutput ? 0 : 1); ++k) {
    if (!d.requires_grad()) return at::zeros_like(s);  // a polynomial's derivatives end: the rest are zero
    // elementwise: the gradient of the sum is the derivative at every element
    d = torch::autograd::grad({d}, {t}, {at::ones_like(d)}, /*retain_graph=*/true, /*create_graph=*/true)[0];
  }
  return attached ? d : d.detach();
}

// The double-backward op, out = a f''(s) (order 2): d/da = g f''(s) (itself), d/ds = g a f'''(s) (itself at
// order 3), so that the backward ops are differentiable twice (triple backward) from the functor alone (math.h
// Dual). Beyond, d/ds of order 3 (a fourth derivative and every higher one) is torch's: g a times the third
// derivative of the twin's backward (twin_derivative), in torch ops that autograd differentiates further.
template <typename Row>
struct PointwiseBackwardGradFunction : torch::autograd::Function<PointwiseBackwardGradFunction<Row>> {
  static Tensor call(const Tensor& a, const Tensor& s, c10::string_view param, int64_t order) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return PointwiseHandles<Row>::backward_grad(a, s, param, order);
  }
  static Tensor forward(AutogradContext* ctx, const Tensor& a, const Tensor& s, c10::string_view param,
                        int64_t order) {
    ctx->save_for_backward({a, s});
    ctx->saved_data["param"] = std::string(param);
    ctx->saved_data["order"] = order;
    return call(a, s, param, order);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &a = saved[0], &s = saved[1];
    const std::string param = ctx->saved_data["param"].toStringRef();
    const int64_t order = ctx->saved_data["order"].toInt();
    Tensor grad_a, grad_s;
    if (ctx->needs_input_grad(0)) grad_a = PointwiseHandles<Row>::backward_grad(grads[0], s, param, order);
    if (ctx->needs_input_grad(1)) {
      const Tensor ga = opmath(grads[0]) * opmath(a);
      grad_s = (order < 3 ? PointwiseHandles<Row>::backward_grad(ga, opmath(s), param, order + 1)
                          : ga * twin_derivative<Row>(opmath(s), param, static_cast<int>(order)))
                   .to(s.scalar_type());
    }
    return {grad_a, grad_s, Tensor(), Tensor()};
  }
};

template <typename Row>
Tensor pointwise_backward_grad_autograd(const Tensor& a, const Tensor& s, c10::string_view param, int64_t order) {
  if (!record({a, s})) return PointwiseBackwardGradFunction<Row>::call(a, s, param, order);
  check_no_transform(Row::kGradName);
  return PointwiseBackwardGradFunction<Row>::apply(a, s, param, order);
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
    using Gelu = PointwiseHandles<optable::gelu>;
    if (ctx->needs_input_grad(0)) grad_dy = Gelu::backward(G, z, approximate).to(dy.scalar_type());
    if (ctx->needs_input_grad(1) || ctx->needs_input_grad(2)) {
      const Tensor h = Gelu::backward_grad(G * opmath(dy), z, approximate, 2);
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

}  // namespace

TORCH_LIBRARY_IMPL(fastact, Autograd, m) {
  m.impl("softmax", &softmax_autograd<false>);
  m.impl("log_softmax", &softmax_autograd<true>);
  m.impl("bias_gelu", &bias_gelu_autograd);
  m.impl("softmax_backward", &softmax_backward_autograd<false>);
  m.impl("log_softmax_backward", &softmax_backward_autograd<true>);
  m.impl("bias_gelu_backward", &bias_gelu_backward_autograd);
  optable::for_each_pointwise([&](auto* row) {
    using Row = std::remove_pointer_t<decltype(row)>;
    if constexpr (optable::has_param<Row>()) {
      m.impl(Row::kName, &pointwise_autograd<Row>);
      m.impl(Row::kBackwardName, &pointwise_backward_autograd<Row>);
      m.impl(Row::kGradName, &pointwise_backward_grad_autograd<Row>);
    } else {
      m.impl(Row::kName, [](const Tensor& x) { return pointwise_autograd<Row>(x, ""); });
      m.impl(Row::kBackwardName,
             [](const Tensor& dy, const Tensor& s) { return pointwise_backward_autograd<Row>(dy, s, ""); });
      m.impl(Row::kGradName, [](const Tensor& a, const Tensor& s, int64_t order) {
        return pointwise_backward_grad_autograd<Row>(a, s, "", order);
      });
    }
  });
}

}  // namespace fastact
