// The eager entry points of fastact's Python functions (csrc/eager.cpp), as the method table of
// the fastact._C module (csrc/ops.cpp).
#pragma once

#include <Python.h>

namespace fastact {

PyMethodDef* eager_methods();

}  // namespace fastact
