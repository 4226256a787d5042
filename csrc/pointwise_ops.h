// Registration of the pointwise rows of fastact/op_table.h at one device's dispatch key (csrc/cpu/ops.cpp,
// csrc/cuda/activations.cu): each row's three ops, with its param where the row has one and without it where it has
// none, bound to the device's implementation Impl<Row>, which provides
//   forward(input, param)                       the op,
//   binary<kGrad>(grad, s, param, order)        its backward (kGrad false; order unused) or the backward's
//                                               derivative with respect to s (kGrad true: `<name>_backward_grad`).
// A row without a param passes "" (its only functor).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <type_traits>

#include "fastact/op_table.h"

namespace fastact {

template <template <typename> class Impl>
void register_pointwise_ops(torch::Library& m) {
  using at::Tensor;
  optable::for_each_pointwise([&](auto* row) {
    using Row = std::remove_pointer_t<decltype(row)>;
    using K = Impl<Row>;
    if constexpr (optable::has_param<Row>()) {
      m.impl(Row::kName, +[](const Tensor& x, c10::string_view p) { return K::forward(x, p); });
      m.impl(Row::kBackwardName,
             +[](const Tensor& g, const Tensor& s, c10::string_view p) { return K::template binary<false>(g, s, p, 2); });
      m.impl(Row::kGradName, +[](const Tensor& g, const Tensor& s, c10::string_view p, int64_t order) {
        return K::template binary<true>(g, s, p, order);
      });
    } else {
      m.impl(Row::kName, +[](const Tensor& x) { return K::forward(x, ""); });
      m.impl(Row::kBackwardName, +[](const Tensor& g, const Tensor& s) { return K::template binary<false>(g, s, "", 2); });
      m.impl(Row::kGradName,
             +[](const Tensor& g, const Tensor& s, int64_t order) { return K::template binary<true>(g, s, "", order); });
    }
  });
}

}  // namespace fastact
