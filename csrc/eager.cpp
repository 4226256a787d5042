// The eager entry points behind fastact's Python functions: one unboxed dispatcher call per op.
//
// Why: torch.ops.fastact.softmax.default(x, dim, None) matches its Python arguments against the
// schema into a stack of IValues and dispatches boxed, ~1.4 us a call more than a native binding
// (docs/performance.md, "Per-call overhead"), which is most of a small tensor's cost. These functions take
// the common case, a plain torch.Tensor (or Parameter) and no __torch_function__ mode, and call the
// op's typed handle with the GIL released, as torch's own bindings do. The dispatcher still runs
// every key (autograd, inference mode, dispatch modes, the CUDA kernel and its device guard): only
// the Python argument handling is shorter. Anything else returns NotImplemented and the Python
// function calls the OpOverload, which handles subclasses, modes and argument errors as before (or,
// under a torch.func transform, fastact/_functorch.py's autograd.Functions). Any
// torch function mode turns the shortcut off, torch's own included (`with torch.device(...)`,
// torch.set_default_device): such calls cost the OpOverload's time, with the same results.
// Under torch.compile dynamo never reaches these (fastact/__init__.py skips them while dynamo
// traces), so graphs hold the registered ops.
#include "common.h"
#include "eager.h"
#include "op_handles.h"
#include "fastact/dispatch.h"

#include <ATen/PythonTorchFunctionTLS.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace fastact {
namespace {

using at::Tensor;

// A torch.Tensor or Parameter (not a subclass) without a forward-mode tangent (torch.autograd.forward_ad;
// level 0, the level torch's own kernels look at), with no torch function mode and no torch.func
// transform active: what the OpOverload would call the op on unchanged. A tangent or a transform
// goes to fastact/_functorch.py, whose autograd.Functions have the jvps the C++ ones lack.
bool plain_tensor(PyObject* obj) {
  return THPVariable_CheckExact(obj) && !at::impl::torch_function_mode_enabled() && !functorch_active() &&
         !THPVariable_Unpack(obj)._fw_grad(/*level=*/0).defined();
}

bool as_int(PyObject* obj, int64_t& out) {
  if (!PyLong_CheckExact(obj)) return false;
  int overflow = 0;
  out = PyLong_AsLongLongAndOverflow(obj, &overflow);
  if (overflow != 0 || (out == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    return false;
  }
  return true;
}

bool as_string(PyObject* obj, std::string_view& out) {
  if (!PyUnicode_CheckExact(obj)) return false;
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(obj, &size);
  if (data == nullptr) {
    PyErr_Clear();
    return false;
  }
  out = std::string_view(data, static_cast<size_t>(size));
  return true;
}

PyObject* not_implemented() { Py_RETURN_NOTIMPLEMENTED; }

// Runs call() with the GIL released and returns its tensor as a Python object; a C++ exception
// (the op's, the first call's handle lookup, the wrap) becomes the Python exception torch's own
// bindings raise for it, never an escape into CPython.
template <typename Call>
PyObject* run(Call&& call) {
  Tensor result;
  std::exception_ptr error;
  PyThreadState* state = PyEval_SaveThread();
  try {
    result = call();
  } catch (...) {
    error = std::current_exception();
  }
  PyEval_RestoreThread(state);
  try {
    if (error) std::rethrow_exception(error);
    return THPVariable_Wrap(std::move(result));
  } catch (...) {
    torch::translate_exception_to_python(std::current_exception());
    return nullptr;
  }
}

bool arity(const char* name, Py_ssize_t nargs, Py_ssize_t want) {
  if (nargs == want) return true;
  PyErr_Format(PyExc_TypeError, "fastact._C.%s takes %zd positional arguments (%zd given)", name, want, nargs);
  return false;
}

bool arity(const char* name, Py_ssize_t nargs, Py_ssize_t least, Py_ssize_t most) {
  if (least <= nargs && nargs <= most) return true;
  PyErr_Format(PyExc_TypeError, "fastact._C.%s takes %zd to %zd positional arguments (%zd given)", name, least, most,
               nargs);
  return false;
}

// None, or a torch.dtype (exactly): softmax's optional output dtype.
bool as_optional_dtype(PyObject* obj, std::optional<at::ScalarType>& out) {
  if (obj == Py_None) {
    out = std::nullopt;
    return true;
  }
  if (!THPDtype_Check(obj)) return false;
  out = reinterpret_cast<THPDtype*>(obj)->scalar_type;
  return true;
}

// softmax(input, dim) or softmax(input, dim, dtype).
template <bool kLog>
PyObject* softmax(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (!arity(optable::softmax_row_name(kLog), nargs, 2, 3)) return nullptr;
  int64_t dim = 0;
  std::optional<at::ScalarType> dtype;
  if (!plain_tensor(args[0]) || !as_int(args[1], dim) || (nargs == 3 && !as_optional_dtype(args[2], dtype)))
    return not_implemented();
  const Tensor& x = THPVariable_Unpack(args[0]);
  return run([&] { return softmax_op<kLog>().call(x, dim, dtype, "auto"); });
}

// A pointwise op of the table: name(input) or name(input, param).
template <typename Row>
PyObject* pointwise(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  constexpr bool kParam = optable::has_param<Row>();
  if (!arity(Row::kName, nargs, kParam ? 2 : 1)) return nullptr;
  std::string_view param;
  if (!plain_tensor(args[0]) || (kParam && !as_string(args[1], param))) return not_implemented();
  const Tensor& x = THPVariable_Unpack(args[0]);
  return run([&] { return PointwiseHandles<Row>::forward(x, param); });
}

PyObject* bias_gelu(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (!arity("bias_gelu", nargs, 3)) return nullptr;
  std::string_view approximate;
  if (!plain_tensor(args[0]) || !plain_tensor(args[1]) || !as_string(args[2], approximate))
    return not_implemented();
  const Tensor& x = THPVariable_Unpack(args[0]);
  const Tensor& bias = THPVariable_Unpack(args[1]);
  return run([&] { return bias_gelu_op().call(x, bias, approximate); });
}

// The names the softmax family's `variant` argument takes (the fake kernels check it as the real ones do).
PyObject* softmax_variant_names(PyObject*, PyObject*) { return PyUnicode_FromString(fastact::softmax_variant_names()); }

template <typename F>
PyCFunction fastcall(F* f) {
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(f));
}

// The method table: one entry per op of the table (fastact/op_table.h), in its order, then the helpers. The
// text signatures (before "--") give inspect.signature its answer. Built once, on the module's creation; the
// strings live as long as the process.
PyMethodDef* build_methods() {
  static std::vector<std::string> docs;  // stable: reserved before any pointer into it is taken
  static std::vector<PyMethodDef> table;
  docs.reserve(optable::kNumOps);
  for (const optable::OpRow& row : optable::kOps) {
    const std::string name = row.name;
    PyCFunction fn = nullptr;
    std::string doc;
    switch (row.kind) {
      case optable::Kind::kSoftmax:
        fn = name == optable::softmax_row_name(true) ? fastcall(&softmax<true>) : fastcall(&softmax<false>);
        doc = name + "($module, input, dim, dtype=None, /)\n--\n\nfastact::" + name +
              "(input, dim, dtype); NotImplemented if not a plain tensor.";
        break;
      case optable::Kind::kBias:
        fn = fastcall(&bias_gelu);
        doc = name + "($module, input, bias, approximate, /)\n--\n\nfastact::" + name +
              "; NotImplemented if not plain tensors.";
        break;
      case optable::Kind::kPointwise:
        optable::for_each_pointwise([&](auto* r) {
          using Row = std::remove_pointer_t<decltype(r)>;
          if (name != Row::kName) return;
          fn = fastcall(&pointwise<Row>);
          const std::string param = optable::has_param<Row>() ? std::string(", ") + Row::kParam : std::string();
          doc = name + "($module, input" + param + ", /)\n--\n\nfastact::" + name +
                "; NotImplemented if not a plain tensor.";
        });
        break;
    }
    docs.push_back(std::move(doc));
    table.push_back({row.name, fn, METH_FASTCALL, docs.back().c_str()});
  }
  table.push_back({"softmax_variant_names", &softmax_variant_names, METH_NOARGS,
                   "softmax_variant_names($module, /)\n--\n\nThe softmax family's variant names, comma-separated."});
  table.push_back({nullptr, nullptr, 0, nullptr});
  return table.data();
}

}  // namespace

PyMethodDef* eager_methods() {
  static PyMethodDef* methods = build_methods();
  return methods;
}

}  // namespace fastact
