// Typed dispatcher handles of fastact's ops (schemas: ops.cpp), for the C++ code that calls them:
// autograd.cpp (below the autograd key, and the backward ops at it) and eager.cpp (the Python
// functions' entry points). Each handle is looked up once per process, on first use.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <tuple>

namespace fastact {

template <typename Signature>
c10::TypedOperatorHandle<Signature> op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

using SoftmaxFwdSig = at::Tensor(const at::Tensor&, int64_t, std::optional<at::ScalarType>, c10::string_view);
using GeluFwdSig = at::Tensor(const at::Tensor&, c10::string_view);
using BiasGeluFwdSig = at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view);
using SigmoidFwdSig = at::Tensor(const at::Tensor&);
using SoftmaxBwdSig = at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, at::ScalarType, c10::string_view);
using GeluBwdSig = at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view);
using BiasGeluBwdSig =
    std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&, c10::string_view);
using SigmoidBwdSig = at::Tensor(const at::Tensor&, const at::Tensor&);

template <bool kLog>
const c10::TypedOperatorHandle<SoftmaxFwdSig>& softmax_op() {
  static const auto handle = op_handle<SoftmaxFwdSig>(kLog ? "fastact::log_softmax" : "fastact::softmax");
  return handle;
}

inline const c10::TypedOperatorHandle<GeluFwdSig>& gelu_op() {
  static const auto handle = op_handle<GeluFwdSig>("fastact::gelu");
  return handle;
}

inline const c10::TypedOperatorHandle<BiasGeluFwdSig>& bias_gelu_op() {
  static const auto handle = op_handle<BiasGeluFwdSig>("fastact::bias_gelu");
  return handle;
}

inline const c10::TypedOperatorHandle<SigmoidFwdSig>& sigmoid_op() {
  static const auto handle = op_handle<SigmoidFwdSig>("fastact::sigmoid");
  return handle;
}

template <bool kLog>
const c10::TypedOperatorHandle<SoftmaxBwdSig>& softmax_backward_op() {
  static const auto handle =
      op_handle<SoftmaxBwdSig>(kLog ? "fastact::log_softmax_backward" : "fastact::softmax_backward");
  return handle;
}

inline const c10::TypedOperatorHandle<GeluBwdSig>& gelu_backward_op() {
  static const auto handle = op_handle<GeluBwdSig>("fastact::gelu_backward");
  return handle;
}

inline const c10::TypedOperatorHandle<BiasGeluBwdSig>& bias_gelu_backward_op() {
  static const auto handle = op_handle<BiasGeluBwdSig>("fastact::bias_gelu_backward");
  return handle;
}

inline const c10::TypedOperatorHandle<SigmoidBwdSig>& sigmoid_backward_op() {
  static const auto handle = op_handle<SigmoidBwdSig>("fastact::sigmoid_backward");
  return handle;
}

}  // namespace fastact
