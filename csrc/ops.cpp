// Every schema of the fastact library, in one place. Device kernels register themselves in
// csrc/cpu/ops.cpp and csrc/cuda/*.cu, autograd in csrc/autograd.cpp, fake (meta) kernels in
// fastact/_ops.py. Importing fastact._C runs these registrations.
//
// `variant` (softmax family only) forces a kernel variant by name ("auto" lets the dispatcher
// choose); the public Python API never passes it — tests and benchmarks do.
#include <Python.h>
#include <torch/library.h>

#include "eager.h"

extern "C" {
// Importing the module loads the library and runs the static registrations below; its functions are
// the eager entry points of fastact's Python API (csrc/eager.cpp).
PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, fastact::eager_methods()};
  return PyModule_Create(&module_def);
}
}

TORCH_LIBRARY(fastact, m) {
  m.def("softmax(Tensor self, int dim, ScalarType? dtype=None, *, str variant=\"auto\") -> Tensor");
  m.def("log_softmax(Tensor self, int dim, ScalarType? dtype=None, *, str variant=\"auto\") -> Tensor");
  m.def(
      "softmax_backward(Tensor grad_output, Tensor output, int dim, ScalarType input_dtype, *, "
      "str variant=\"auto\") -> Tensor");
  m.def(
      "log_softmax_backward(Tensor grad_output, Tensor output, int dim, ScalarType input_dtype, *, "
      "str variant=\"auto\") -> Tensor");
  m.def("gelu(Tensor self, str approximate=\"none\") -> Tensor");
  m.def("gelu_backward(Tensor grad_output, Tensor self, str approximate=\"none\") -> Tensor");
  m.def("bias_gelu(Tensor self, Tensor bias, str approximate=\"tanh\") -> Tensor");
  m.def(
      "bias_gelu_backward(Tensor grad_output, Tensor self, Tensor bias, str approximate=\"tanh\") -> "
      "(Tensor, Tensor)");
  m.def("sigmoid(Tensor self) -> Tensor");
  m.def("sigmoid_backward(Tensor grad_output, Tensor output) -> Tensor");
  // Which kernel the op would run on this input, and why (fastact.explain). op is one of
  // softmax, log_softmax, softmax_backward, log_softmax_backward, gelu, bias_gelu, sigmoid; dtype (the softmax
  // family's only) is the op's own: the forward's output dtype, the backward's input_dtype.
  m.def("explain(Tensor self, str op, int dim=-1, *, ScalarType? dtype=None) -> str");
}
