// Typed dispatcher handles of fastact's ops (schemas: ops.cpp), for the C++ code that calls them:
// autograd.cpp (below the autograd key, and the backward ops at it) and eager.cpp (the Python
// functions' entry points). Each handle is looked up once per process, on first use.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <string>
#include <tuple>
#include <type_traits>

#include "fastact/op_table.h"

namespace fastact {

template <typename Signature>
c10::TypedOperatorHandle<Signature> op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

using SoftmaxFwdSig = at::Tensor(const at::Tensor&, int64_t, std::optional<at::ScalarType>, c10::string_view);
using BiasGeluFwdSig = at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view);
using SoftmaxBwdSig = at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, at::ScalarType, c10::string_view);
using BiasGeluBwdSig =
    std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&, c10::string_view);

// "fastact::<name><suffix>", the qualified name of an op of the table.
inline std::string qualified(const char* name, const char* suffix = "") {
  return std::string("fastact::") + name + suffix;
}

template <bool kLog>
const c10::TypedOperatorHandle<SoftmaxFwdSig>& softmax_op() {
  static const auto handle = op_handle<SoftmaxFwdSig>(qualified(optable::softmax_row_name(kLog)).c_str());
  return handle;
}

inline const c10::TypedOperatorHandle<BiasGeluFwdSig>& bias_gelu_op() {
  static const auto handle = op_handle<BiasGeluFwdSig>(qualified(optable::kBiasRowName).c_str());
  return handle;
}

template <bool kLog>
const c10::TypedOperatorHandle<SoftmaxBwdSig>& softmax_backward_op() {
  static const auto handle =
      op_handle<SoftmaxBwdSig>(qualified(optable::softmax_row_name(kLog), "_backward").c_str());
  return handle;
}

inline const c10::TypedOperatorHandle<BiasGeluBwdSig>& bias_gelu_backward_op() {
  static const auto handle = op_handle<BiasGeluBwdSig>(qualified(optable::kBiasRowName, "_backward").c_str());
  return handle;
}

// The pointwise ops of the table (fastact/op_table.h), by row: the forward `name(self[, param])`, the backward
// `name_backward(grad_output, s[, param])` and the double-backward op `name_backward_grad(grad, s[, param],
// order)`.
// call() takes the param as a string either way (ignored by rows without one).
template <typename Row>
struct PointwiseHandles {
  static constexpr bool kParam = optable::has_param<Row>();
  using FwdSig = std::conditional_t<kParam, at::Tensor(const at::Tensor&, c10::string_view), at::Tensor(const at::Tensor&)>;
  using BinSig = std::conditional_t<kParam, at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view),
                                    at::Tensor(const at::Tensor&, const at::Tensor&)>;
  using GradSig = std::conditional_t<kParam, at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view, int64_t),
                                     at::Tensor(const at::Tensor&, const at::Tensor&, int64_t)>;

  static at::Tensor forward(const at::Tensor& x, c10::string_view param) {
    static const auto handle = op_handle<FwdSig>(qualified(Row::kName).c_str());
    if constexpr (kParam) return handle.call(x, param);
    else return handle.call(x);
  }
  static at::Tensor backward(const at::Tensor& dy, const at::Tensor& s, c10::string_view param) {
    static const auto handle = op_handle<BinSig>(qualified(Row::kBackwardName).c_str());
    return call(handle, dy, s, param);
  }
  static at::Tensor backward_grad(const at::Tensor& a, const at::Tensor& s, c10::string_view param, int64_t order) {
    static const auto handle = op_handle<GradSig>(qualified(Row::kGradName).c_str());
    if constexpr (kParam) return handle.call(a, s, param, order);
    else return handle.call(a, s, order);
  }

 private:
  static at::Tensor call(const c10::TypedOperatorHandle<BinSig>& h, const at::Tensor& a, const at::Tensor& s,
                         c10::string_view param) {
    if constexpr (kParam) return h.call(a, s, param);
    else return h.call(a, s);
  }
};

}  // namespace fastact
