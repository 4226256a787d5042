// Every schema of the fastact library, in one place: generated from the op table (fastact/op_table.h).
// Device kernels register themselves in csrc/cpu/ops.cpp and csrc/cuda/*.cu, autograd in
// csrc/autograd.cpp, fake (meta) kernels in fastact/_ops.py (below: those of the internal
// double-backward ops). Importing fastact._C runs these registrations.
//
// `variant` (softmax family only) forces a kernel variant by name ("auto" lets the dispatcher
// choose); the public Python API never passes it — tests and benchmarks do.
#include <Python.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <string>
#include <type_traits>
#include <vector>

#include "fastact/op_table.h"

#include "eager.h"
#include "runtime_options.h"

extern "C" {
// Importing the module loads the library and runs the static registrations below; its functions are
// the eager entry points of fastact's Python API (csrc/eager.cpp). The environment knobs are read here,
// once, before any kernel runs.
PyMODINIT_FUNC PyInit__C(void) {
  fastact::set_runtime_options(fastact::runtime_options_from_environment());
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, fastact::eager_methods()};
  return PyModule_Create(&module_def);
}
}

namespace fastact {
namespace {

std::string param_arg(const char* param, const char* default_value) {
  return param == nullptr ? std::string() : std::string(", str ") + param + "=\"" + default_value + "\"";
}

// The schemas of one row of the op table (fastact/op_table.h), forward first.
std::vector<std::string> schemas_of(const optable::OpRow& row) {
  const std::string name = row.name;
  switch (row.kind) {
    case optable::Kind::kSoftmax:
      return {name + "(Tensor self, int dim, ScalarType? dtype=None, *, str variant=\"auto\") -> Tensor",
              name + "_backward(Tensor grad_output, Tensor output, int dim, ScalarType input_dtype, *, "
                     "str variant=\"auto\") -> Tensor"};
    case optable::Kind::kBias: {
      std::string param;
#define FASTACT_BIAS_PARAM(op, p, d) \
  if (name == #op) param = param_arg(p, d);
      FASTACT_OP_TABLE(FASTACT_OP_SKIP, FASTACT_OP_SKIP, FASTACT_BIAS_PARAM)
#undef FASTACT_BIAS_PARAM
      return {name + "(Tensor self, Tensor bias" + param + ") -> Tensor",
              name + "_backward(Tensor grad_output, Tensor self, Tensor bias" + param + ") -> (Tensor, Tensor)"};
    }
    case optable::Kind::kPointwise: {
      std::vector<std::string> out;
      optable::for_each_pointwise([&](auto* r) {
        using Row = std::remove_pointer_t<decltype(r)>;
        if (name != Row::kName) return;
        const std::string param = param_arg(Row::kParam, Row::kChoices[0]);
        const std::string saved = std::string("Tensor ") + Row::kSavedArg;
        out = {name + "(Tensor self" + param + ") -> Tensor",
               name + "_backward(Tensor grad_output, " + saved + param + ") -> Tensor",
               // grad * f''(s), the backward's derivative with respect to s (autograd.cpp, double backward); order
               // 3: grad * f'''(s) (triple backward).
               name + "_backward_grad(Tensor grad, " + saved + param + ", int order=2) -> Tensor"};
      });
      return out;
    }
  }
  return {};
}

// The fake (meta) kernel of the internal `<name>_backward_grad` ops, which the Python side does not list: the
// output is empty_like(s), as the CPU and CUDA kernels'.
at::Tensor backward_grad_meta(const at::Tensor& grad, const at::Tensor& s, int64_t) {
  (void)grad;
  return at::empty_like(s);
}
at::Tensor backward_grad_meta_p(const at::Tensor& grad, const at::Tensor& s, c10::string_view, int64_t order) {
  return backward_grad_meta(grad, s, order);
}

}  // namespace
}  // namespace fastact

// Every op of the table, in its order; then explain. Which kernel the op would run on this input, and why
// (fastact.explain): op is one of the table's forwards or the softmax family's backwards; dtype (the softmax
// family's only) is the op's own: the forward's output dtype, the backward's input_dtype.
TORCH_LIBRARY(fastact, m) {
  for (const fastact::optable::OpRow& row : fastact::optable::kOps) {
    for (const std::string& schema : fastact::schemas_of(row)) m.def(schema.c_str());
  }
  m.def("explain(Tensor self, str op, int dim=-1, *, ScalarType? dtype=None) -> str");
}

TORCH_LIBRARY_IMPL(fastact, Meta, m) {
  fastact::optable::for_each_pointwise([&](auto* row) {
    using Row = std::remove_pointer_t<decltype(row)>;
    if constexpr (fastact::optable::has_param<Row>()) m.impl(Row::kGradName, &fastact::backward_grad_meta_p);
    else m.impl(Row::kGradName, &fastact::backward_grad_meta);
  });
}
