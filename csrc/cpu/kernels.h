// The CPU kernels as csrc/cpu/ops.cpp sees them: one table of plain function pointers per
// instruction set. The kernel files (setup.py ISA_SOURCES: softmax_kernels.cpp,
// elementwise_kernels.cpp and the table's kernels.cpp) are compiled once per ISA (DEFAULT, AVX2,
// AVX512, each inside its own `namespace CPU_CAPABILITY`) and each build defines its
// `kernel_table()`; ops.cpp picks one at run time from torch's CPU capability.
//
// Torch-free on purpose (c10 scalar types only): the kernel files must not see ATen/torch headers whose
// inline code would be compiled once per ISA (see the ODR note in csrc/cpu/vec_io.h).
//
// Conventions for every kernel below:
// - element counts and sizes are int64_t; nothing is called with an empty problem;
// - "dense [outer, D, inner]" means element (o, d, i) at o * D * inner + d * inner + i;
// - half and bfloat16 compute in float, float in float, double in double (fastact::acc_t);
// - kernels parallelise themselves (csrc/cpu/parallel.h) and run small problems on the calling
//   thread; their results do not depend on the thread count, to the bit;
// - outputs never alias inputs (the ops allocate them): the strided softmax's runs write a row's
//   last vector pair whole, over the start of the next row, before reading that row. One exception:
//   an elementwise kernel (gelu, sigmoid, bias_gelu, forward and backward) may be given its output
//   as one of its inputs, at the output's own offsets (the ops copy an input they cannot read in
//   place into the output first); each reads an element of its inputs before it writes that element.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <type_traits>

#include "fastact/element_rows.h"
#include "fastact/op_table.h"

namespace fastact::cpu {

// softmax over D, the tensor seen as [outer, D, inner] (csrc/common.h: SoftmaxGeometry).
struct SoftmaxShape {
  int64_t outer = 1;
  int64_t dim_size = 1;
  int64_t inner = 1;
  // Forward input only, inner == 1 only: elements from one row to the next (rows may be strided,
  // e.g. x[..., 1:]). Outputs and the backward's tensors are dense (row stride dim_size).
  int64_t row_stride = 1;
};

// The kernels of one element type T (float, double, c10::Half, c10::BFloat16).
template <typename T>
struct TypedKernels {
  // y = softmax or log_softmax of x; x per SoftmaxShape, y dense [outer, D, inner].
  void (*softmax_fwd)(const T* x, T* y, const SoftmaxShape& shape, bool log);
  // The fused cast of torch.softmax(x, dtype=float32) for half/bfloat16 x; nullptr for float/double.
  void (*softmax_fwd_to_float)(const T* x, float* y, const SoftmaxShape& shape, bool log);
  // dx from dy and the forward's output y, all dense [outer, D, inner]:
  // softmax dx = y * (dy - sum(dy * y)), log_softmax dx = dy - exp(y) * sum(dy).
  void (*softmax_bwd)(const T* dy, const T* y, T* dx, const SoftmaxShape& shape, bool log);
  // The fused backward of a half/bfloat16 input whose forward produced float: float dy and y,
  // dx written as T. nullptr for float/double.
  void (*softmax_bwd_from_float)(const float* dy, const float* y, T* dx, const SoftmaxShape& shape, bool log);
  // For explain: the columns a task of the strided softmax (inner > 1) of T takes at the current thread count,
  // the forward's or the backward's: a run of adjacent columns, or where runs do not apply a vector pair's.
  int64_t (*softmax_strided_columns)(const SoftmaxShape& shape, bool backward);
  // For explain: where the strided softmax of T (the forward's or the backward's) takes each slab's last inner % lanes
  // columns in vector lanes across consecutive slabs (the runs do not apply), the columns a lane group takes at the
  // current thread count (1 to lanes); else 0.
  int64_t (*softmax_strided_lane_group)(const SoftmaxShape& shape, bool backward);

  // Elementwise, the operands laid out as g (fastact/element_rows.h: ElementRows::flat(n) for n
  // consecutive elements of any dense memory order; else inputs as strided rows, the output dense).
  // The pointwise ops (fastact/op_table.h), indexed by optable::index<Row>(); choice: the functor the op's
  // param picks (optable::choice_of). y = f(x); dx = dy * f'(s), s the input x or the output y, as the row
  // saves; out = a * f''(s) (the backward's derivative with respect to s; order 3: a * f'''(s)).
  void (*pointwise_fwd[optable::kNumPointwise])(const T* x, T* y, const ElementRows& g, int choice);
  void (*pointwise_bwd[optable::kNumPointwise])(const T* dy, const T* s, T* dx, const ElementRows& g, int choice);
  void (*pointwise_bwd_grad[optable::kNumPointwise])(const T* a, const T* s, T* out, const ElementRows& g,
                                                     int choice, int order);

  // y = gelu(x + bias), x [rows, cols] with row r at x + r * x_stride, y contiguous, bias [cols].
  void (*bias_gelu_fwd)(const T* x, int64_t x_stride, const T* bias, T* y, int64_t rows, int64_t cols,
                        bool tanh_approx);
  // dx = dy * gelu'(x + bias) (dy, dx contiguous [rows, cols]; x row r at x + r * x_stride) and dbias = dx
  // summed over rows ([cols]), the sum in acc_t over a fixed partition: bit-identical from run to run and
  // for any number of threads.
  void (*bias_gelu_bwd)(const T* dy, const T* x, int64_t x_stride, const T* bias, T* dx, T* dbias, int64_t rows,
                        int64_t cols, bool tanh_approx);
};

struct KernelTable {
  const char* isa;  // "DEFAULT", "AVX2" or "AVX512"
  int float_lanes;  // floats per SIMD register in this build
  TypedKernels<float> f32;
  TypedKernels<double> f64;
  TypedKernels<c10::Half> f16;
  TypedKernels<c10::BFloat16> bf16;

  template <typename T>
  constexpr const TypedKernels<T>& of() const {
    if constexpr (std::is_same_v<T, float>) return f32;
    else if constexpr (std::is_same_v<T, double>) return f64;
    else if constexpr (std::is_same_v<T, c10::Half>) return f16;
    else return bf16;
  }
};

#if defined(CPU_CAPABILITY)
// Inside one ISA build: the entry points that softmax_kernels.cpp and elementwise_kernels.cpp define
// (instantiated for the four element types; the fused casts for half and bfloat16 only) and kernels.cpp
// gathers into that build's table. Each is the TypedKernels<T> member of its name; the pointwise ops'
// come through fill_pointwise_kernels.
namespace CPU_CAPABILITY {
template <typename T>
void softmax_fwd(const T* x, T* y, const SoftmaxShape& shape, bool log);
template <typename T>
void softmax_fwd_to_float(const T* x, float* y, const SoftmaxShape& shape, bool log);
template <typename T>
void softmax_bwd(const T* dy, const T* y, T* dx, const SoftmaxShape& shape, bool log);
template <typename T>
void softmax_bwd_from_float(const float* dy, const float* y, T* dx, const SoftmaxShape& shape, bool log);
template <typename T>
int64_t softmax_strided_columns(const SoftmaxShape& shape, bool backward);
template <typename T>
int64_t softmax_strided_lane_group(const SoftmaxShape& shape, bool backward);
// Sets the pointwise_* members of k (elementwise_kernels.cpp).
template <typename T>
void fill_pointwise_kernels(TypedKernels<T>& k);
template <typename T>
void bias_gelu_fwd(const T* x, int64_t x_stride, const T* bias, T* y, int64_t rows, int64_t cols, bool tanh_approx);
template <typename T>
void bias_gelu_bwd(const T* dy, const T* x, int64_t x_stride, const T* bias, T* dx, T* dbias, int64_t rows,
                   int64_t cols, bool tanh_approx);
}  // namespace CPU_CAPABILITY
#endif

// One table per ISA build; only those of the builds that exist are defined (ops.cpp sees
// FASTACT_HAVE_<ISA>).
namespace DEFAULT {
const KernelTable& kernel_table();
}
namespace AVX2 {
const KernelTable& kernel_table();
}
namespace AVX512 {
const KernelTable& kernel_table();
}

}  // namespace fastact::cpu
