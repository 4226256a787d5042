// The op table of the C++ side: every fastact op declared once, in the order the API lists them. Everything
// per op in csrc/ is generated or generic from it: the schemas (csrc/ops.cpp), the dispatcher handles
// (op_handles.h), autograd with double backward (autograd.cpp), the eager entry points `_C.<name>`
// (eager.cpp), the CPU and CUDA kernels of the pointwise ops (cpu/ops.cpp, cuda/activations.cu), explain's
// op list. Torch-free: names, kinds and math.h functors only.
//
// Kinds:
//   SOFTMAX(name, log)   a softmax-family op over a dim: `name(Tensor self, int dim, ScalarType? dtype=None, *,
//                        str variant="auto")` and `name_backward(grad_output, output, dim, input_dtype, *, variant)`;
//                        its own kernels (softmax/*.cuh, cpu/softmax_kernels.cpp); log: the log_softmax epilogue.
//   POINTWISE(name, saves, integral, param, choice0, Functor0, choice1, Functor1)
//                        one input, elementwise: `name(Tensor self[, str param="choice0"]) -> Tensor`,
//                        `name_backward(Tensor grad_output, Tensor self|output[, str param]) -> Tensor`
//                        (dx = dy f'(s), s what `saves` names) and the internal `name_backward_grad(Tensor grad,
//                        Tensor self|output[, str param]) -> Tensor` (grad f''(s): the backward's derivative with
//                        respect to s, for double backward). `param` (nullptr: none) picks Functor0 or Functor1
//                        (math.h functors) by its value, choice0 or choice1; without one both are the same functor.
//                        integral: how an integer or bool input is met (Integral below).
//   BIAS(name, param, default)  bias_gelu: `name(Tensor self, Tensor bias, str param=default)`, its own kernels.
//
// Adding a pointwise op: its functor in math.h (forward, derivative, second derivative, kCost, optionally a
// 16-bit Narrow form), one POINTWISE row here, and, where the generic lane-by-lane form would be slow, its SIMD
// form in csrc/cpu/elementwise_kernels.cpp (VecForm).
#pragma once

#include <cstddef>
#include <cstring>
#include <string_view>
#include <type_traits>

#include "fastact/math.h"

// The rows. Each consumer passes one macro per kind (FASTACT_OP_SKIP for the kinds it does not take).
#define FASTACT_OP_TABLE(SOFTMAX, POINTWISE, BIAS)                                                                   \
  SOFTMAX(softmax, false)                                                                                            \
  SOFTMAX(log_softmax, true)                                                                                         \
  POINTWISE(gelu, kInput, kRefuse, "approximate", "none", ::fastact::math::GeluErf, "tanh", ::fastact::math::GeluTanh) \
  BIAS(bias_gelu, "approximate", "tanh")                                                                             \
  POINTWISE(sigmoid, kOutput, kToDefaultFloat, nullptr, nullptr, ::fastact::math::Sigmoid, nullptr,                  \
            ::fastact::math::Sigmoid)                                                                                \
  POINTWISE(silu, kInput, kRefuse, nullptr, nullptr, ::fastact::math::Silu, nullptr, ::fastact::math::Silu)

#define FASTACT_OP_SKIP(...)

namespace fastact::optable {

enum class Kind { kSoftmax, kPointwise, kBias };

// What a pointwise op's backward reads besides grad_output: the forward's input (argument `self`, as torch's
// gelu_backward) or its output (argument `output`, as torch's sigmoid_backward; the functor then has
// derivative_from_output).
enum class Saves { kInput, kOutput };

// An integer or bool input: refused with the floating-point check's error (F.gelu, F.silu refuse them), or
// computed converted to the default dtype, as torch.sigmoid does.
enum class Integral { kRefuse, kToDefaultFloat };

// One row of any kind, for code that walks every op (schemas, explain's op list, the eager method table).
struct OpRow {
  const char* name;
  Kind kind;
};

#define FASTACT_OPROW_SOFTMAX(name, log) OpRow{#name, Kind::kSoftmax},
#define FASTACT_OPROW_POINTWISE(name, ...) OpRow{#name, Kind::kPointwise},
#define FASTACT_OPROW_BIAS(name, ...) OpRow{#name, Kind::kBias},
inline constexpr OpRow kOps[] = {FASTACT_OP_TABLE(FASTACT_OPROW_SOFTMAX, FASTACT_OPROW_POINTWISE, FASTACT_OPROW_BIAS)};
#undef FASTACT_OPROW_SOFTMAX
#undef FASTACT_OPROW_POINTWISE
#undef FASTACT_OPROW_BIAS
inline constexpr int kNumOps = static_cast<int>(sizeof(kOps) / sizeof(kOps[0]));

// The name of the softmax-kind row with (log) or without the log_softmax epilogue, and of the bias row.
constexpr const char* softmax_row_name(bool log) {
#define FASTACT_SOFTMAX_NAME(name, is_log) \
  if (log == is_log) return #name;
  FASTACT_OP_TABLE(FASTACT_SOFTMAX_NAME, FASTACT_OP_SKIP, FASTACT_OP_SKIP)
#undef FASTACT_SOFTMAX_NAME
  return nullptr;
}
#define FASTACT_BIAS_NAME(name, ...) #name
inline constexpr const char* kBiasRowName = FASTACT_OP_TABLE(FASTACT_OP_SKIP, FASTACT_OP_SKIP, FASTACT_BIAS_NAME);
#undef FASTACT_BIAS_NAME

// A pointwise row as a type (optable::gelu, optable::sigmoid, ...), for the code templated on the op.
template <Saves kSaves_, Integral kIntegral_, typename F0, typename F1>
struct PointwiseRow {
  static constexpr Saves kSaves = kSaves_;
  static constexpr bool kFromOutput = kSaves_ == Saves::kOutput;
  static constexpr Integral kIntegral = kIntegral_;
  using Functor0 = F0;
  using Functor1 = F1;
  // The backward's second argument in schemas and error messages.
  static constexpr const char* kSavedArg = kFromOutput ? "output" : "self";
  static constexpr const char* kSavedWhat = kFromOutput ? "output" : "input";
};

#define FASTACT_POINTWISE_TYPE(name_, saves, integral, param, choice0, F0, choice1, F1)              \
  struct name_ : PointwiseRow<Saves::saves, Integral::integral, F0, F1> {                            \
    static constexpr const char* kName = #name_;                                                     \
    static constexpr const char* kBackwardName = #name_ "_backward";                                 \
    static constexpr const char* kGradName = #name_ "_backward_grad";                                \
    static constexpr const char* kParam = param;                                                     \
    static constexpr const char* kChoices[2] = {choice0, choice1};                                   \
  };
FASTACT_OP_TABLE(FASTACT_OP_SKIP, FASTACT_POINTWISE_TYPE, FASTACT_OP_SKIP)
#undef FASTACT_POINTWISE_TYPE

// The pointwise rows in table order; index<Row>() is a row's position among them.
template <typename... Rows>
struct RowList {
  static constexpr int kSize = sizeof...(Rows);
};
struct EndOfRows {};
#define FASTACT_POINTWISE_NAME(name, ...) name,
using PointwiseRowsWithEnd = RowList<FASTACT_OP_TABLE(FASTACT_OP_SKIP, FASTACT_POINTWISE_NAME, FASTACT_OP_SKIP) EndOfRows>;
#undef FASTACT_POINTWISE_NAME
inline constexpr int kNumPointwise = PointwiseRowsWithEnd::kSize - 1;

namespace detail {
template <typename Fn, typename Row, typename... Rest>
constexpr void for_each_row(Fn&& fn, RowList<Row, Rest...>*) {
  if constexpr (!std::is_same_v<Row, EndOfRows>) {
    fn(static_cast<Row*>(nullptr));
    for_each_row(fn, static_cast<RowList<Rest...>*>(nullptr));
  }
}
template <typename Target, typename Row, typename... Rest>
constexpr int index_of(RowList<Row, Rest...>*) {
  if constexpr (std::is_same_v<Target, Row>) return 0;
  else return 1 + index_of<Target>(static_cast<RowList<Rest...>*>(nullptr));
}
}  // namespace detail

// fn(static_cast<Row*>(nullptr)) for every pointwise row, in table order.
template <typename Fn>
constexpr void for_each_pointwise(Fn&& fn) {
  detail::for_each_row(fn, static_cast<PointwiseRowsWithEnd*>(nullptr));
}

template <typename Row>
constexpr int index() {
  return detail::index_of<Row>(static_cast<PointwiseRowsWithEnd*>(nullptr));
}

template <typename Row>
constexpr bool has_param() {
  return Row::kParam != nullptr;
}

// The choice a param value names (0 or 1), or -1 for none of them. A row without a param has only choice 0.
template <typename Row>
int choice_of(std::string_view value) {
  if constexpr (has_param<Row>()) {
    for (int c = 0; c < 2; ++c) {
      if (Row::kChoices[c] != nullptr && value == Row::kChoices[c]) return c;
    }
    return -1;
  } else {
    return 0;
  }
}

// Calls fn(functor) with the functor of `choice` (Functor0 or Functor1).
template <typename Row, typename Fn>
decltype(auto) with_functor(int choice, Fn&& fn) {
  if (choice == 1) return fn(typename Row::Functor1{});
  return fn(typename Row::Functor0{});
}

// What code that does not depend on the functor's type needs of a pointwise row (explain, error messages).
struct PointwiseInfo {
  const char* name;
  const char* backward_name;
  const char* param;       // nullptr: none
  const char* choices[2];  // the param's values (nullptr where the row has fewer)
  bool from_output;
  Integral integral;
  EltMath cost[2];                // of each choice's functor
  const char* narrow_forward[2];  // the 16-bit forward functor's name where there is one, else nullptr
  bool narrow_backward[2];        // whether the backward takes that 16-bit functor too
};

template <typename F>
constexpr const char* narrow_name() {
  if constexpr (math::NarrowOf<F>::kHas) return math::NarrowOf<F>::type::kName;
  else return nullptr;
}

template <typename Row>
constexpr PointwiseInfo info() {
  using F0 = typename Row::Functor0;
  using F1 = typename Row::Functor1;
  constexpr bool kOut = Row::kFromOutput;
  return {Row::kName,
          Row::kBackwardName,
          Row::kParam,
          {Row::kChoices[0], Row::kChoices[1]},
          kOut,
          Row::kIntegral,
          {F0::kCost, F1::kCost},
          {narrow_name<F0>(), narrow_name<F1>()},
          {!std::is_same_v<math::NarrowBackwardOf<F0, kOut>, F0>, !std::is_same_v<math::NarrowBackwardOf<F1, kOut>, F1>}};
}

namespace detail {
template <typename... Rows>
constexpr auto infos(RowList<Rows...>*) {
  struct Table {
    PointwiseInfo rows[sizeof...(Rows) - 1];
  };
  Table t{};
  int i = 0;
  for_each_pointwise([&](auto* row) { t.rows[i++] = info<std::remove_pointer_t<decltype(row)>>(); });
  return t;
}
}  // namespace detail

inline constexpr auto kPointwiseTable = detail::infos(static_cast<PointwiseRowsWithEnd*>(nullptr));

// The pointwise row named `name` (its forward's name), or nullptr.
inline const PointwiseInfo* find_pointwise(std::string_view name) {
  for (const PointwiseInfo& p : kPointwiseTable.rows) {
    if (name == p.name) return &p;
  }
  return nullptr;
}

}  // namespace fastact::optable
