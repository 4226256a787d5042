// Host-side helpers shared by the CPU and CUDA adapters: argument checks with torch's errors, and
// the layout planning that turns any tensor into the [outer, D, inner] problem the kernels take.
//
// Layout rule (the fake kernels in fastact/_ops.py follow it too): outputs are
// `at::empty_like(input, dtype)`, which keeps a dense (non-overlapping, gap-free) input's strides and
// gives anything else dense strides in the input's own dim order (not necessarily contiguous: a
// sliced transpose stays transposed). A dense input is read in place, in its memory order, whatever
// its strides; inputs with gaps or overlaps (slices, expands) are first copied into
// `empty_like(input)` — except the common "rows with a stride" case (e.g. `x[..., 1:]`, or a chunk
// of the last dim) of a last-dim softmax and of the elementwise ops, which the kernels read in place
// through a row stride, and one row repeated (`row.expand(n, cols)`, row stride 0) of the
// elementwise ops. The elementwise ops make that copy in their output's memory, the kernel then
// computing it in place, so that they allocate what torch's allocate (the output) and no more.
// For an input that is not dense, torch's output (TensorIterator's, empty_like's) is contiguous
// (dims of stride 0 have no order to keep), and so is fastact's.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/ops/empty_like.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fastact/element_rows.h"
#include "fastact/op_table.h"

namespace fastact {

// Whether a torch.func transform (grad, vmap, jvp, ...) is active in this thread: the dispatch-key
// test behind torch._C._are_functorch_transforms_active.
inline bool functorch_active() {
  const c10::DispatchKeySet included = c10::impl::tls_local_dispatch_key_set().included_;
  return included.has(c10::DispatchKey::FuncTorchDynamicLayerFrontMode) ||
         included.has(c10::DispatchKey::FuncTorchDynamicLayerBackMode);
}

inline bool is_supported_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

// "softmax: expected a floating point tensor (float32, float64, float16 or bfloat16) for x, got Long". A dtype
// the kernels lack is a NotImplementedError in Python, as torch's ("... not implemented for 'Long'").
inline void check_floating(const at::Tensor& t, const char* op, const char* arg) {
  TORCH_CHECK_NOT_IMPLEMENTED(is_supported_dtype(t.scalar_type()), op,
                              ": expected a floating point tensor (float32, float64, float16 or bfloat16) for ", arg,
                              ", got ", t.scalar_type());
}

// torch's unary float ops (torch.sigmoid) take integer and bool tensors and compute on them converted to
// the default dtype (torch.get_default_dtype(), float32 unless set): a float tensor comes back. The
// ops with that rule call this first; any other dtype passes unchanged (complex then fails the
// floating check).
inline at::Tensor integral_to_default_float(const at::Tensor& x) {
  if (!at::isIntegralType(x.scalar_type(), /*includeBool=*/true)) return x;
  return x.to(c10::get_default_dtype_as_scalartype());
}

// The tensor integral_to_default_float makes of an integer x, on the meta device (no memory): what
// explain describes for an op that converts integer inputs (a fresh dense tensor, laid out as
// empty_like(x)).
inline at::Tensor integral_to_default_float_meta(const at::Tensor& x) {
  return at::empty_like(x, x.options().device(at::kMeta).dtype(c10::get_default_dtype_as_scalartype()));
}

inline void check_same_device(const at::Tensor& a, const at::Tensor& b, const char* op, const char* arg_a,
                              const char* arg_b) {
  TORCH_CHECK(a.device() == b.device(), op, ": expected ", arg_a, " and ", arg_b,
              " on the same device, got ", a.device(), " and ", b.device());
}

inline void check_same_shape(const at::Tensor& a, const at::Tensor& b, const char* op, const char* arg_a,
                             const char* arg_b) {
  TORCH_CHECK(a.sizes() == b.sizes(), op, ": expected ", arg_a, " and ", arg_b, " of the same shape, got ",
              a.sizes(), " and ", b.sizes());
}

inline void check_same_dtype(const at::Tensor& a, const at::Tensor& b, const char* op, const char* arg_a,
                             const char* arg_b) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), op, ": expected ", arg_a, " and ", arg_b,
              " of the same dtype, got ", a.scalar_type(), " and ", b.scalar_type());
}

enum class GeluApprox { kNone, kTanh };

// torch's own message for a bad `approximate`, so code that catches it keeps working.
inline GeluApprox parse_gelu_approx(std::string_view s, const char* op) {
  if (s == "none") return GeluApprox::kNone;
  if (s == "tanh") return GeluApprox::kTanh;
  TORCH_CHECK(false, op, ": approximate argument must be either none or tanh, got '", std::string(s), "'");
}

// ---- the pointwise ops of fastact/op_table.h: the argument handling CPU and CUDA share -----------------

// The input a pointwise op computes on: an integer or bool input converted to the default dtype where the row
// says so (torch.sigmoid's rule), then checked for a supported floating type.
template <typename Row>
at::Tensor pointwise_input(const at::Tensor& input) {
  const at::Tensor x =
      Row::kIntegral == optable::Integral::kToDefaultFloat ? integral_to_default_float(input) : input;
  check_floating(x, Row::kName, "input");
  return x;
}

// A c10::string_view (the schemas' `str` arguments) as a std::string_view.
inline std::string_view sv(c10::string_view s) { return std::string_view(s.data(), s.size()); }

// The functor choice of a param value (optable::choice_of), with torch's message for a bad one (F.gelu's:
// "approximate argument must be either none or tanh").
template <typename Row>
int pointwise_choice(std::string_view value, const char* op) {
  const int choice = optable::choice_of<Row>(value);
  if constexpr (optable::has_param<Row>()) {
    TORCH_CHECK(choice >= 0, op, ": ", Row::kParam, " argument must be either ", Row::kChoices[0], " or ",
                Row::kChoices[1], ", got '", std::string(value), "'");
  }
  return choice;
}

// The order of a `<name>_backward_grad` op: 2 (a f''(s)) or 3 (a f'''(s)).
inline void check_grad_order(int64_t order, const char* op) {
  TORCH_CHECK(order == 2 || order == 3, op, ": order must be 2 or 3, got ", order);
}

// ---- explain's op names, from the op table ----------------------------------------------------------------

// An op name explain may be asked about: a row's forward, or its backward (name + "_backward").
struct ExplainOp {
  bool known = false;
  optable::Kind kind = optable::Kind::kPointwise;
  bool backward = false;
};

inline ExplainOp explain_op(std::string_view op) {
  constexpr std::string_view kSuffix = "_backward";
  const bool backward = op.size() > kSuffix.size() && op.substr(op.size() - kSuffix.size()) == kSuffix;
  const std::string_view base = backward ? op.substr(0, op.size() - kSuffix.size()) : op;
  for (const optable::OpRow& row : optable::kOps) {
    if (base == row.name) return {true, row.kind, backward};
  }
  return {};
}

// The ops the CPU explain takes, as its error lists them: the softmax family's forwards, then their backwards,
// then every other op's forward ("softmax, log_softmax, softmax_backward, log_softmax_backward, gelu, ...").
inline std::string explain_op_list() {
  std::string s;
  const auto add = [&s](const std::string& name) { s += (s.empty() ? "" : ", ") + name; };
  for (const optable::OpRow& row : optable::kOps)
    if (row.kind == optable::Kind::kSoftmax) add(row.name);
  for (const optable::OpRow& row : optable::kOps)
    if (row.kind == optable::Kind::kSoftmax) add(std::string(row.name) + "_backward");
  for (const optable::OpRow& row : optable::kOps)
    if (row.kind != optable::Kind::kSoftmax) add(row.name);
  return s;
}

// The elementwise ops (every op but the softmax family's), each forward then its backward: the CUDA explain's
// list for them.
inline std::string explain_elementwise_op_list() {
  std::string s;
  for (const optable::OpRow& row : optable::kOps) {
    if (row.kind == optable::Kind::kSoftmax) continue;
    s += (s.empty() ? "" : ", ") + std::string(row.name) + ", " + row.name + "_backward";
  }
  return s;
}

// The softmax family fuses exactly these dtype conversions into its kernels; anything else is cast
// (forward) or computed in the wider type and cast (backward) around a same-dtype kernel.
inline bool fused_softmax_cast(at::ScalarType narrow, at::ScalarType wide) {
  return narrow == wide || (wide == at::kFloat && (narrow == at::kHalf || narrow == at::kBFloat16));
}

// explain's dtype belongs to the softmax family (the forward's output dtype, the backward's input_dtype); the
// elementwise ops take none.
inline void check_explain_dtype(const std::string& op, std::optional<at::ScalarType> dtype) {
  TORCH_CHECK(!dtype, "explain: dtype applies to softmax, log_softmax and their backwards, not to ", op);
}

// The element types a softmax-family op runs its kernel on, as plan_softmax_forward / plan_softmax_backward pick
// them, for explain(op, x, dim, dtype=...). xt is the type of x, the forward's input or the backward's saved output;
// dtype the op's own (the forward's output dtype, the backward's input_dtype; none: xt). Checks what the ops check of
// both.
struct SoftmaxExplainTypes {
  at::ScalarType in;   // forward: what the kernel reads; backward: grad_input as the kernel writes it
  at::ScalarType out;  // forward: the output; backward: grad_output and output
  bool cast_first;     // forward: the op reads x.to(dtype), a fresh dense tensor (a cast the kernels do not fuse)
  std::string note;    // "" without a conversion, else "; ..." saying where it happens
};
inline SoftmaxExplainTypes softmax_explain_types(at::ScalarType xt, std::optional<at::ScalarType> dtype,
                                                 bool backward, const char* op) {
  // The forward casts any real input given a dtype; else, and in the backward, x is floating.
  TORCH_CHECK_NOT_IMPLEMENTED(
      is_supported_dtype(xt) || (!backward && dtype && at::isIntegralType(xt, /*includeBool=*/true)), op,
      ": expected a floating point tensor (float32, float64, float16 or bfloat16) for ", backward ? "output" : "input",
      ", got ", xt);
  TORCH_CHECK_NOT_IMPLEMENTED(!dtype || is_supported_dtype(*dtype), op, ": expected ",
                              backward ? "input_dtype" : "dtype", " to be float32, float64, float16 or bfloat16, got ",
                              *dtype);
  const at::ScalarType given = dtype.value_or(xt);
  SoftmaxExplainTypes t;
  if (backward) {
    const bool fused = fused_softmax_cast(given, xt);
    t = {fused ? given : xt, xt, false, ""};
    if (given != xt) {
      t.note = fused ? std::string("; ") + c10::toString(xt) + " grad_output and output, " + c10::toString(given) +
                           " grad_input written by the kernel"
                     : std::string("; computed in ") + c10::toString(xt) + ", grad_input then cast to " +
                           c10::toString(given);
    }
  } else {
    const bool fused = fused_softmax_cast(xt, given);
    t = {fused ? xt : given, given, !fused, ""};
    if (given != xt) {
      t.note = fused ? std::string("; the ") + c10::toString(xt) + " input read as it is, the output written in " +
                           c10::toString(given)
                     : std::string("; the ") + c10::toString(xt) + " input first cast to " + c10::toString(given) +
                           " (a fresh dense tensor)";
    }
  }
  return t;
}

// True when the tensor's elements occupy exactly numel() consecutive slots of memory, in some
// order of its dims (transposes and permutes of contiguous tensors are dense; slices are not).
inline bool is_dense(const at::Tensor& t) { return t.is_non_overlapping_and_dense(); }

// A dense copy laid out exactly as `at::empty_like(t)` (so, as every output made from t).
inline at::Tensor dense_copy(const at::Tensor& t) { return at::empty_like(t).copy_(t); }

// Dims of a dense tensor ordered outermost-first in memory: t.permute(order) is contiguous.
inline std::vector<int64_t> memory_order(const at::Tensor& t) {
  std::vector<int64_t> order(t.dim());
  std::iota(order.begin(), order.end(), 0);
  // Larger stride first; for equal strides (size-1 dims) keep the logical order.
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return t.stride(a) > t.stride(b); });
  return order;
}

// grad_output against the forward's input or output (the elementwise backward ops, CPU and CUDA).
inline void check_grad(const at::Tensor& grad, const at::Tensor& t, const char* op, const char* arg) {
  check_floating(grad, op, "grad_output");
  check_floating(t, op, arg);
  check_same_shape(grad, t, op, "grad_output", arg);
  check_same_dtype(grad, t, op, "grad_output", arg);
  check_same_device(grad, t, op, "grad_output", arg);
}

// bias_gelu and its backward: x of at least 1 dim, bias 1-d over x's last dim, same dtype and device.
inline void check_bias_gelu(const at::Tensor& x, const at::Tensor& bias, const char* op) {
  check_floating(x, op, "input");
  check_floating(bias, op, "bias");
  TORCH_CHECK(x.dim() >= 1, op, ": expected input of at least 1 dim (bias is added over the last), got a 0-d tensor");
  TORCH_CHECK(bias.dim() == 1 && bias.size(0) == x.size(-1), op, ": expected bias of shape [", x.size(-1), "], got ",
              bias.sizes());
  check_same_dtype(x, bias, op, "input", "bias");
  check_same_device(x, bias, op, "input", "bias");
}

// torch's IndexError for a dim out of range, with the op's name (at::maybe_wrap_dim's message has
// none). Returns the wrapped dim; a 0-d tensor takes dims -1 and 0, as in torch.
inline int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t n = std::max<int64_t>(ndim, 1);
  TORCH_CHECK_INDEX(dim >= -n && dim < n, op, ": dim ", dim, " out of range for a tensor of ", ndim,
                    " dims (expected to be in range of [", -n, ", ", n - 1, "])");
  return dim < 0 ? dim + n : dim;
}

// The softmax problem as the kernels see it: `input` viewed as [outer, dim_size, inner] in memory,
// row r of the inner == 1 case starting at input_ptr + r * row_stride; `output` (and the backward's
// other tensors) are dense [outer, dim_size, inner].
struct SoftmaxGeometry {
  int64_t outer = 1;
  int64_t dim_size = 1;
  int64_t inner = 1;
  int64_t row_stride = 1;  // input elements from one row to the next; meaningful when inner == 1
};

// Geometry of softmax over `dim` of a dense tensor, in its memory order.
inline SoftmaxGeometry dense_geometry(const at::Tensor& t, int64_t dim) {
  SoftmaxGeometry g;
  if (t.dim() == 0) return g;
  if (t.size(dim) == 1) {
    // Every element is a row of its own, so any memory order is the rows' order: one "last-dim"
    // problem of numel rows of length 1 (a transposed [N, 1] would otherwise look like inner = N).
    g.outer = t.numel();
    return g;
  }
  const auto order = memory_order(t);
  const int64_t pos = std::find(order.begin(), order.end(), dim) - order.begin();
  for (int64_t i = 0; i < pos; ++i) g.outer *= t.size(order[i]);
  g.dim_size = t.size(dim);
  for (int64_t i = pos + 1; i < t.dim(); ++i) g.inner *= t.size(order[i]);
  if (g.inner == 1) {
    g.row_stride = g.dim_size;
  }
  return g;
}

// For a last-dim softmax of a tensor whose last dim is unit-stride and whose other dims collapse
// into one uniformly strided "rows" dim (x[..., a:b] of a contiguous tensor, for instance):
// the row stride in elements. nullopt when the tensor is not of that form.
inline std::optional<int64_t> collapsed_row_stride(const at::Tensor& t, int64_t dim) {
  const int64_t n = t.dim();
  if (n == 0 || dim != n - 1) return std::nullopt;
  if (t.size(n - 1) > 1 && t.stride(n - 1) != 1) return std::nullopt;
  if (n == 1) return t.size(0);
  // Walk the outer dims innermost-first: each must step by (rows below it) * row_stride.
  const int64_t row_stride = t.stride(n - 2);
  if (row_stride < t.size(n - 1) && t.size(n - 2) > 1) return std::nullopt;  // overlapping rows
  int64_t rows_below = 1;
  for (int64_t k = n - 2; k >= 0; --k) {
    if (t.size(k) != 1 && t.stride(k) != rows_below * row_stride) return std::nullopt;
    rows_below *= t.size(k);
  }
  return row_stride;
}

struct SoftmaxForwardPlan {
  at::Tensor input;   // what the kernel reads: x, x cast to the output dtype, or a dense copy
  at::Tensor output;  // allocated, dense, same memory order as `input` (or contiguous)
  SoftmaxGeometry geom;
};

// Validates and plans softmax/log_softmax forward. Handles the optional output dtype: the fused
// casts of `fused_softmax_cast` stay in the kernel, other requested dtypes cast the input first
// (exactly torch's `softmax(x, dim, dtype)` = `softmax(x.to(dtype), dim)`, an integer x included).
inline SoftmaxForwardPlan plan_softmax_forward(const at::Tensor& x, int64_t dim,
                                               std::optional<at::ScalarType> dtype, const char* op) {
  // With a dtype, torch casts any real input first (integers and bools included); without one the
  // input must be floating, as torch's softmax kernels require.
  if (!dtype || !at::isIntegralType(x.scalar_type(), /*includeBool=*/true)) check_floating(x, op, "input");
  const at::ScalarType out_dtype = dtype.value_or(x.scalar_type());
  TORCH_CHECK_NOT_IMPLEMENTED(is_supported_dtype(out_dtype), op,
                              ": expected dtype to be float32, float64, float16 or bfloat16, got ", out_dtype);
  dim = wrap_dim(dim, x.dim(), op);

  SoftmaxForwardPlan p;
  p.input = fused_softmax_cast(x.scalar_type(), out_dtype) ? x : x.to(out_dtype);
  p.output = at::empty_like(p.input, p.input.options().dtype(out_dtype));
  if (p.input.numel() == 0) return p;
  if (is_dense(p.input)) {
    p.geom = dense_geometry(p.input, dim);
  } else if (auto rs = collapsed_row_stride(p.input, dim)) {
    p.geom.outer = p.input.numel() / p.input.size(dim);
    p.geom.dim_size = p.input.size(dim);
    p.geom.row_stride = *rs;
  } else {
    p.input = dense_copy(p.input);
    p.geom = dense_geometry(p.input, dim);
  }
  return p;
}

struct SoftmaxBackwardPlan {
  at::Tensor grad_output;  // dense, same memory order as output
  at::Tensor output;       // dense
  at::Tensor grad_input;   // allocated, dense, same memory order
  at::ScalarType compute_dtype;  // the dtype the kernel writes; grad_input may need a cast after
  SoftmaxGeometry geom;
};

// Plans softmax/log_softmax backward: grad_input = f(grad_output, output) in `input_dtype`.
inline SoftmaxBackwardPlan plan_softmax_backward(const at::Tensor& grad_output, const at::Tensor& output,
                                                 int64_t dim, at::ScalarType input_dtype, const char* op) {
  check_floating(grad_output, op, "grad_output");
  check_floating(output, op, "output");
  check_same_shape(grad_output, output, op, "grad_output", "output");
  check_same_dtype(grad_output, output, op, "grad_output", "output");
  check_same_device(grad_output, output, op, "grad_output", "output");
  TORCH_CHECK_NOT_IMPLEMENTED(is_supported_dtype(input_dtype), op,
                              ": expected input_dtype to be float32, float64, float16 or bfloat16, got ", input_dtype);
  dim = wrap_dim(dim, output.dim(), op);

  SoftmaxBackwardPlan p;
  p.output = is_dense(output) ? output : dense_copy(output);
  p.grad_output = grad_output;
  if (grad_output.strides() != p.output.strides() && grad_output.numel() > 1) {
    // One copy into output's memory order, so both are walked with one geometry.
    p.grad_output = at::empty_like(p.output).copy_(grad_output);
  }
  const bool fused = fused_softmax_cast(input_dtype, output.scalar_type());
  p.compute_dtype = fused ? input_dtype : output.scalar_type();
  p.grad_input = at::empty_like(p.output, p.output.options().dtype(p.compute_dtype));
  if (output.numel() > 0) p.geom = dense_geometry(p.output, dim);
  return p;
}

// A second operand walked in the same memory order as `like` (a copy only when the strides differ).
inline at::Tensor in_layout_of(const at::Tensor& t, const at::Tensor& like) {
  if (t.strides() == like.strides() || t.numel() <= 1) return t;
  return at::empty_like(like, t.options()).copy_(t);
}

// Whether every row of t (its last dim, unit-stride) is one and the same row of memory: t is
// row.expand(..., cols), as broadcasting makes one (a per-feature tensor over a batch). Read in place
// at row stride 0 (nothing is ever written through an input). t.dim() >= 1.
inline bool is_repeated_row(const at::Tensor& t) {
  const int64_t n = t.dim();
  if (t.size(n - 1) > 1 && t.stride(n - 1) != 1) return false;
  for (int64_t k = 0; k < n - 1; ++k) {
    if (t.size(k) != 1 && t.stride(k) != 0) return false;
  }
  return true;
}

// The row stride at which an elementwise kernel reads input t beside its output out (dense): out's row
// length when t is in out's memory order (t is then read at out's offsets), t's row stride when out is
// contiguous and t a uniformly strided stack of rows, 0 when out is contiguous and t one row repeated;
// nullopt when t must be copied first.
inline std::optional<int64_t> element_read_stride(const at::Tensor& out, const at::Tensor& t) {
  const int64_t cols = out.dim() == 0 ? 1 : out.size(-1);
  if (t.strides() == out.strides() || t.numel() <= 1) return cols;
  if (out.is_contiguous() && t.dim() > 0) {
    if (const auto rs = collapsed_row_stride(t, t.dim() - 1)) return rs;
    if (is_repeated_row(t)) return 0;
  }
  return std::nullopt;
}

// How an elementwise op reads its input x (explain): element_read_stride beside the output the op
// allocates, empty_like(x) (here on the meta device: no memory), and that output's row length.
struct ElementRead {
  std::optional<int64_t> stride;
  int64_t cols;
};

inline ElementRead element_read_of(const at::Tensor& x) {
  const at::Tensor out = at::empty_like(x, x.options().device(at::kMeta));
  return {element_read_stride(out, x), out.dim() == 0 ? 1 : out.size(-1)};
}

// The row stride at which bias_gelu's forward reads x as [rows, H]: H for a contiguous x, x's row
// stride for a strided stack of rows (collapsed_row_stride: a chunk of the last dim), 0 for one row
// repeated (is_repeated_row), read in place; nullopt: x is made contiguous first. x.dim() >= 1.
inline std::optional<int64_t> bias_gelu_row_stride(const at::Tensor& x) {
  if (x.is_contiguous()) return x.size(-1);
  if (const auto rs = collapsed_row_stride(x, x.dim() - 1)) return rs;
  if (is_repeated_row(x)) return 0;
  return std::nullopt;
}

// x as bias_gelu's kernels read it (forward and backward, CPU and CUDA): in place where
// bias_gelu_row_stride allows, else a contiguous copy; row r at x.data + r * row_stride. The copy
// goes into `out` when given (the op's contiguous output, which the kernel then writes in place).
struct BiasGeluInput {
  at::Tensor x;
  int64_t row_stride;
};

inline BiasGeluInput bias_gelu_input(const at::Tensor& x, const at::Tensor& out = at::Tensor()) {
  if (const std::optional<int64_t> rs = bias_gelu_row_stride(x)) return {x, *rs};
  return {out.defined() ? out.copy_(x) : x.contiguous(), x.size(-1)};
}

// bias_gelu_backward's operands as its kernels read them: dy contiguous, x per bias_gelu_input. An
// operand that must be copied is copied into dx (contiguous, the op's output; the kernels read each
// element of their inputs before they write that element of dx, on the same thread), the first
// such, so that the op allocates no more than dx where one operand needs a copy.
struct BiasGeluBackwardOperands {
  at::Tensor dy;
  BiasGeluInput x;
};

inline BiasGeluBackwardOperands bias_gelu_backward_operands(const at::Tensor& dx, const at::Tensor& dy,
                                                            const at::Tensor& x) {
  BiasGeluBackwardOperands ops;
  ops.dy = dy.is_contiguous() ? dy : dx.copy_(dy);
  ops.x = bias_gelu_input(x, dy.is_contiguous() ? dx : at::Tensor());
  return ops;
}

// The inputs of an elementwise op as its kernels read them (ElementRows), given its output `out`
// (empty_like of its main input, so dense). An input in out's memory order is read at out's offsets;
// when out is contiguous, an input that is a uniformly strided stack of rows (collapsed_row_stride:
// x[..., a:b], a chunk of the last dim) or one row repeated (stride 0) is read in place, row by row;
// anything else is first copied into out's layout (element_read_stride): the first such input into
// out itself, which the kernel then writes in place (every elementwise kernel reads an element of its
// inputs before it writes that element of the output, on the same thread), so that the op allocates
// only its output, as torch's does; a second such input into a tensor of its own. out.numel() > 0.
struct ElementOperands {
  at::Tensor in0, in1;  // what the kernel reads (in1 undefined for a unary op); either may be out
  ElementRows rows;
};

inline ElementOperands element_operands(at::Tensor& out, const at::Tensor& in0,
                                        const at::Tensor& in1 = at::Tensor()) {
  const int64_t n = out.numel();
  const int64_t cols = out.dim() == 0 ? 1 : out.size(-1);
  ElementRows g{n / cols, cols, cols, cols};
  bool out_taken = false;
  const auto place = [&](const at::Tensor& t, int64_t& stride) {
    if (!t.defined()) return t;
    if (const auto s = element_read_stride(out, t)) {
      stride = *s;
      return t;
    }
    if (out_taken) return in_layout_of(t, out);
    out_taken = true;
    return out.copy_(t);
  };
  ElementOperands ops;
  ops.in0 = place(in0, g.stride0);
  ops.in1 = place(in1, g.stride1);
  ops.rows = g.is_flat() ? ElementRows::flat(n) : g;
  return ops;
}

}  // namespace fastact
