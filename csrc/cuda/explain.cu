// The CUDA kernel of fastact::explain: which kernel an op runs on this input, and why. The softmax
// family asks the dispatcher (csrc/cuda/softmax_ops.cpp), the elementwise ops their launcher's policy.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <string>

#include "common.h"
#include "cuda/activations.h"
#include "cuda/softmax.h"

namespace fastact::cuda {
namespace {

std::string explain_cuda(const at::Tensor& x, c10::string_view op_view, int64_t dim,
                         std::optional<at::ScalarType> dtype) {
  const std::string op(op_view);
  const ExplainOp which = explain_op(op);
  if (which.known && which.kind == optable::Kind::kSoftmax) {
    const bool log = op.rfind("log_", 0) == 0;
    return explain_softmax_cuda(x, dim, log, which.backward, dtype);
  }
  std::string s;
  const optable::PointwiseInfo* row = optable::find_pointwise(op);
  if (row && row->integral == optable::Integral::kToDefaultFloat &&
      at::isIntegralType(x.scalar_type(), /*includeBool=*/true)) {
    // An op that computes an integer input in the default dtype (sigmoid): the kernel reads that (fresh,
    // aligned) copy.
    const at::Tensor converted = integral_to_default_float_meta(x);
    s = explain_elementwise_cuda(converted, op) + "; the " + std::string(c10::toString(x.scalar_type())) +
        " input is first converted to " + c10::toString(converted.scalar_type());
  } else {
    s = explain_elementwise_cuda(x, op);
  }
  check_explain_dtype(op, dtype);  // after the op's name is known to be one (explain_elementwise_cuda's check)
  return s;
}

}  // namespace

TORCH_LIBRARY_IMPL(fastact, CUDA, m) { m.impl("explain", &explain_cuda); }

}  // namespace fastact::cuda
