// CUDA kernels of the pointwise ops (fastact/op_table.h) and bias_gelu, forward and backward: the torch side. Checks (the
// errors torch raises), layouts (outputs as the fake kernels in fastact/_ops.py state), the device
// guard, the current stream, dtype dispatch, the launch check; the kernels are in
// include/fastact/elementwise.cuh, instantiated per dtype in activations_{float,half,bfloat16}.cu.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <iomanip>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "common.h"
#include "cuda/activations.h"
#include "cuda/utils.h"
#include "pointwise_ops.h"

namespace fastact::cuda {
namespace {

// Layout of the elementwise ops: the output is at::empty_like(t), exactly what the fake kernel
// returns (a dense t keeps its strides, anything else gets empty_like's dense layout); the operands
// are read in place where element_operands (common.h) allows it — in that same memory order, or as a
// strided stack of rows or one row repeated beside a contiguous output — and copied into the output's
// layout otherwise, the first such operand into the output itself (on the stream, before the kernel,
// which then computes in place: each thread loads its elements of every input before it stores
// them), so that the op allocates only its output, as torch's does.

// The pointwise ops of fastact/op_table.h: forward, backward (dx = dy f'(s), s the input or the output) and the
// backward's derivative with respect to s (a f''(s), for double backward), one template per row.
template <typename Row>
struct PointwiseCuda {
  static at::Tensor run_forward(const at::Tensor& x, int choice) {
    at::Tensor y = at::empty_like(x);
    if (y.numel() == 0) return y;
    const ElementOperands in = element_operands(y, x);
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), Row::kName, [&] {
      FASTACT_CHECK_LAUNCH(ActivationLaunchers<cuda_type<scalar_t>>::pointwise(
                               optable::index<Row>(), choice, PointwiseDirection::kForward, in_ptr<scalar_t>(in.in0),
                               nullptr, out_ptr<scalar_t>(y), in.rows, stream),
                           Row::kName);
    });
    return y;
  }
  static at::Tensor forward(const at::Tensor& input, c10::string_view param) {
    c10::cuda::OptionalCUDAGuard guard(input.device());
    const at::Tensor x = pointwise_input<Row>(input);
    return run_forward(x, pointwise_choice<Row>(sv(param), Row::kName));
  }
  // The backward (kGrad false) or its derivative (kGrad true); the output is empty_like(s), as the fake kernel's.
  template <bool kGrad>
  static at::Tensor binary(const at::Tensor& grad, const at::Tensor& s, c10::string_view param, int64_t order) {
    constexpr const char* op = kGrad ? Row::kGradName : Row::kBackwardName;
    check_grad(grad, s, op, Row::kSavedWhat);
    check_grad_order(order, op);
    const int choice = pointwise_choice<Row>(sv(param), op);
    c10::cuda::OptionalCUDAGuard guard(s.device());
    at::Tensor out = at::empty_like(s);
    if (out.numel() == 0) return out;
    const ElementOperands in = element_operands(out, grad, s);
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    const PointwiseDirection dir = !kGrad     ? PointwiseDirection::kBackward
                                   : order == 3 ? PointwiseDirection::kBackwardGrad3
                                                : PointwiseDirection::kBackwardGrad;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, s.scalar_type(), op, [&] {
      FASTACT_CHECK_LAUNCH(ActivationLaunchers<cuda_type<scalar_t>>::pointwise(
                               optable::index<Row>(), choice, dir, in_ptr<scalar_t>(in.in0), in_ptr<scalar_t>(in.in1),
                               out_ptr<scalar_t>(out), in.rows, stream),
                           op);
    });
    return out;
  }
};

// bias_gelu: x read in place when contiguous, a strided stack of rows or one row repeated, else copied
// into y first and computed there in place (bias_gelu_input); output contiguous, one pass in memory
// order (the bias read through the cache with each access).
at::Tensor bias_gelu_cuda(const at::Tensor& x, const at::Tensor& bias, c10::string_view approximate) {
  check_bias_gelu(x, bias, "bias_gelu");
  const GeluApprox approx = parse_gelu_approx(approximate, "bias_gelu");
  c10::cuda::OptionalCUDAGuard guard(x.device());
  at::Tensor y = at::empty(x.sizes(), x.options());
  if (y.numel() == 0) return y;
  const BiasGeluInput xin = bias_gelu_input(x, y);
  const at::Tensor bc = bias.contiguous();
  const int64_t H = x.size(-1), rows = x.numel() / H, xs = xin.row_stride;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "bias_gelu", [&] {
    using T = cuda_type<scalar_t>;
    const T* xp = in_ptr<scalar_t>(xin.x);
    const T* bp = in_ptr<scalar_t>(bc);
    T* yp = out_ptr<scalar_t>(y);
    FASTACT_CHECK_LAUNCH(ActivationLaunchers<T>::bias_gelu(xp, xs, bp, yp, rows, H, approx, stream), "bias_gelu");
  });
  return y;
}

// bias_gelu_backward: one pass over dy and x writes dx and per-row-group column sums of dx (acc_t, in a
// workspace from the caching allocator), a second small kernel adds those up in a fixed order into
// dbias: deterministic, no atomics.
std::tuple<at::Tensor, at::Tensor> bias_gelu_backward_cuda(const at::Tensor& grad_output, const at::Tensor& x,
                                                           const at::Tensor& bias, c10::string_view approximate) {
  check_bias_gelu(x, bias, "bias_gelu_backward");
  check_grad(grad_output, x, "bias_gelu_backward", "input");
  const GeluApprox approx = parse_gelu_approx(approximate, "bias_gelu_backward");
  c10::cuda::OptionalCUDAGuard guard(x.device());
  at::Tensor dx = at::empty(x.sizes(), x.options());
  if (x.numel() == 0) return {dx, at::zeros(bias.sizes(), bias.options())};
  at::Tensor dbias = at::empty(bias.sizes(), bias.options());
  // dy contiguous and x read in place where they can be, else one of them copied into dx first.
  const BiasGeluBackwardOperands in = bias_gelu_backward_operands(dx, grad_output, x);
  const BiasGeluInput& xin = in.x;
  const at::Tensor& gc = in.dy;
  const at::Tensor bc = bias.contiguous();
  const int64_t H = x.size(-1), rows = x.numel() / H, xs = xin.row_stride;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "bias_gelu_backward", [&] {
    using T = cuda_type<scalar_t>;
    using A = acc_t<T>;
    const T* gp = in_ptr<scalar_t>(gc);
    const T* xp = in_ptr<scalar_t>(xin.x);
    const T* bp = in_ptr<scalar_t>(bc);
    T* dxp = out_ptr<scalar_t>(dx);
    const int vec = bias_gelu_vec<T>(H, gp, xp, bp, dxp);
    const auto plan = elementwise::plan_bias_gelu(rows, H, xs % vec == 0 ? vec : 1);
    at::Tensor workspace;  // [row_groups, H] in acc_t; none when one group writes dbias directly
    A* wp = nullptr;
    if (const int64_t n = plan.workspace_elems(H); n > 0) {
      workspace = at::empty({plan.row_groups, H}, x.options().dtype(std::is_same_v<A, double> ? at::kDouble : at::kFloat));
      wp = workspace.mutable_data_ptr<A>();
    }
    FASTACT_CHECK_LAUNCH(ActivationLaunchers<T>::bias_gelu_backward(gp, xp, xs, bp, dxp, out_ptr<scalar_t>(dbias), wp,
                                                                    rows, H, plan, approx, stream),
                         "bias_gelu_backward");
  });
  return {dx, dbias};
}

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    default: return c10::toString(t);
  }
}

}  // namespace

std::string explain_elementwise_cuda(const at::Tensor& x, const std::string& op) {
  const ExplainOp which = explain_op(op);
  TORCH_CHECK(which.known && which.kind != optable::Kind::kSoftmax, "explain: unknown elementwise op '", op,
              "'; expected one of ", explain_elementwise_op_list());
  const bool bias = which.kind == optable::Kind::kBias;
  const bool backward = op.size() > 9 && op.compare(op.size() - 9, 9, "_backward") == 0;
  const int arity = backward ? 2 : 1;
  const int esize = static_cast<int>(x.element_size());
  const int width = kVecBytes / esize;  // elements per 128-bit access
  const std::string dtype = dtype_name(x.scalar_type());
  // The vector shapes depend on the device's memory depth (memory_depth.cuh).
  const DeviceMemory memory = device_memory(x.device().index());
  const auto depth_note = [&memory] {
    std::ostringstream d;
    d << "memory depth " << (memory.depth == MemoryDepth::kDeep ? "deep" : "standard");
    if (memory.forced) {
      d << " (FASTACT_MEMORY_DEPTH)";
    } else {
      d << " (" << std::fixed << std::setprecision(1) << memory.bytes_per_sm_cycle << " DRAM bytes an SM cycle; deep from "
        << kDeepMemoryBytesPerSmCycle << ")";
    }
    return d.str();
  };
  std::ostringstream s;

  if (bias) {
    if (x.dim() == 0) return "kernel=none: " + op + " needs an input of at least 1 dim (the op raises for a 0-d tensor)";
    const int64_t H = x.size(-1);
    if (x.numel() == 0) {
      s << "kernel=none: empty input, nothing to launch" << (backward ? " (dbias = zeros)" : "");
      return s.str();
    }
    const int64_t rows = x.numel() / H;
    const bool contiguous = x.is_contiguous();
    const std::optional<int64_t> row_stride = bias_gelu_row_stride(x);
    if (!backward && !contiguous && row_stride && rows > 1) {
      // A strided stack of rows: elementwise_rows_kernel, the bias its second input at row stride 0.
      const ElementRows g{rows, H, *row_stride, 0};
      using elementwise::EltMath;
      const elementwise::EltShape vs =
          elementwise::elementwise_rows_shape(esize, 2, true, EltMath::kTanh, true, memory.depth);
      const bool vec = elementwise::element_rows_vec(g, vs.access_bytes / esize, x.const_data_ptr(), nullptr, nullptr);
      const elementwise::EltShape shape =
          elementwise::elementwise_rows_shape(esize, 2, vec, EltMath::kTanh, true, memory.depth);
      s << "kernel=elementwise_rows_" << (vec ? "vec" : "scalar") << ": " << op << " over [" << rows << ", " << H
        << "] " << dtype << " (input rows " << *row_stride << " elements apart read in place; output contiguous), "
        << "the bias as a second input at row stride 0; " << (vec ? vs.access_bytes / esize : 1)
        << " elements per access, " << shape.threads << " threads a block";
      if (vec) s << ", " << depth_note();
      return s.str();
    }
    // A contiguous x (or, backward, a strided stack of rows) is read in place, anything else copied into a
    // fresh (aligned) contiguous tensor.
    const bool in_place = contiguous || (backward && row_stride);
    const bool rows_aligned = !in_place || (is_vec_aligned(x.const_data_ptr()) && *row_stride % width == 0);
    const int vec = H % width == 0 && rows_aligned ? width : 1;
    s << "kernel=" << (vec > 1 ? "bias_gelu_vec" : "bias_gelu_scalar") << ": " << op << " over [" << rows << ", " << H
      << "] " << dtype;
    if (!contiguous) {
      s << (in_place ? " (input rows " + std::to_string(*row_stride) + " elements apart read in place)"
                     : std::string(" (input not contiguous: copied into the output first, computed there in place)"));
    }
    s << "; ";
    if (vec > 1) {
      s << vec << " x " << dtype << " per 128-bit access (last dim a multiple of " << width
        << ", pointers 16-byte aligned; the bias is assumed aligned too)";
    } else if (H % width != 0) {
      s << "scalar: last dim " << H << " is not a multiple of the vector width " << width;
    } else {
      s << "scalar: the input's rows do not start 16-byte aligned";
    }
    if (!backward) {
      const int unroll = elementwise::bias_gelu_forward_unroll(esize, vec > 1);
      s << "; one tile of " << elementwise::kEltThreads << " threads x " << unroll << " accesses per block in memory "
        << "order, grid " << elementwise::elementwise_grid(rows * H, elementwise::kEltThreads, vec, unroll)
        << " blocks; each access reads its bias vector too (L1/L2-resident)";
      return s.str();
    }
    const auto p = elementwise::plan_bias_gelu(rows, H, vec);
    s << "; block " << p.tx << " accesses along a row x " << p.ty << " rows (" << p.threads()
      << " threads, bias in registers), " << p.rows_per_thread << " rows a thread loaded at once"
      << (p.steps > 1 ? ", " + std::to_string(p.steps) + " batches a block" : std::string()) << "; grid "
      << p.col_tiles << " column strip" << (p.col_tiles == 1 ? "" : "s") << " x " << p.row_groups << " row group"
      << (p.row_groups == 1 ? "" : "s") << " of up to " << p.rows_per_block() << " rows";
    if (p.row_groups > 1) {
      s << "; dbias: per-group column sums in a [" << p.row_groups << ", " << H << "] "
        << (esize == 8 ? "float64" : "float32")
        << " workspace, then bias_grad_reduce_kernel adds them in a fixed order (deterministic)";
    } else {
      s << "; dbias: one row group, so its column sums are written straight to dbias (deterministic)";
    }
    return s.str();
  }

  if (x.numel() == 0) return "kernel=none: empty input, nothing to launch";
  const int64_t n = x.numel();
  // How the op reads x (element_operands; the backward's grad_output is assumed dense beside the
  // output, as autograd passes it, and 16-byte aligned): at the output's offsets, by rows, or copied.
  const auto [stride, cols] = element_read_of(x);
  ElementRows g = ElementRows::flat(n);
  if (stride && *stride != cols) g = {n / cols, cols, backward ? cols : *stride, backward ? *stride : cols};
  const bool rows = !g.is_flat();
  // The shape depends on the functor, which a row's param picks (gelu's `approximate`) and explain() does not
  // take: report the first choice's, and the second's where it differs.
  using elementwise::EltMath;
  const optable::PointwiseInfo& row = *optable::find_pointwise(std::string_view(op).substr(0, op.size() - (backward ? 9 : 0)));
  const bool two_choices = row.param != nullptr && row.choices[1] != nullptr;
  const EltMath math = row.cost[0];
  const auto shape_of = [&](int eb, int ar, bool v, EltMath m) {
    return rows ? elementwise::elementwise_rows_shape(eb, ar, v, m, false, memory.depth)
                : elementwise::elementwise_shape(eb, ar, v, m, memory.depth);
  };
  const int vec_access = shape_of(esize, arity, true, math).access_bytes / esize;
  const void* p = x.const_data_ptr();
  // A copy is made into the output, a fresh (aligned) dense tensor.
  const bool aligned = !stride ? true
                       : rows  ? elementwise::element_rows_vec(g, vec_access, p, backward ? p : nullptr, p)
                               : is_vec_aligned(p);
  const elementwise::EltShape shape = shape_of(esize, arity, aligned, math);
  const elementwise::EltShape other_shape = shape_of(esize, arity, aligned, two_choices ? row.cost[1] : math);
  const int vec = aligned ? shape.access_bytes / esize : 1;
  const int unroll = shape.unroll;
  const int64_t grid = rows ? elementwise::ceil_div(n / vec, int64_t{shape.threads} * unroll)
                            : elementwise::elementwise_grid(n, shape.threads, vec, unroll);
  s << "kernel=" << (rows ? "elementwise_rows_" : "elementwise_") << (aligned ? "vec" : "scalar") << ": " << op
    << " over " << n << " " << dtype << " elements";
  if (rows) {
    s << " (" << g.rows << " rows of " << cols << ", input rows " << *stride
      << " elements apart read in place; output contiguous)";
  } else {
    s << (stride ? " (dense input read in place in its memory order)"
                 : " (input has gaps or overlaps: copied into the output first, computed there in place)");
  }
  s << "; ";
  if (aligned) {
    s << vec << " x " << dtype << " per " << shape.access_bytes * 8 << "-bit access, " << unroll << " access"
      << (unroll == 1 ? "" : "es") << " per thread and operand, " << shape.threads << " threads a block";
    if (two_choices && (other_shape.unroll != unroll || other_shape.access_bytes != shape.access_bytes ||
                        other_shape.threads != shape.threads)) {
      s << " (" << row.param << "='" << row.choices[0] << "'; '" << row.choices[1] << "': "
        << other_shape.access_bytes * 8 << "-bit, " << other_shape.unroll << " access"
        << (other_shape.unroll == 1 ? "" : "es") << ", " << other_shape.threads << " threads)";
    }
    s << ", all loads issued before the arithmetic, " << depth_note();
    // The 16-bit math form (math.h functor's Narrow) of the first choice that has one in this direction.
    for (int c = 0; c < (two_choices ? 2 : 1); ++c) {
      if (esize != 2 || row.narrow_forward[c] == nullptr || (backward && !row.narrow_backward[c])) continue;
      const bool every_choice = !two_choices || (row.narrow_forward[1 - c] != nullptr &&
                                                 (!backward || row.narrow_backward[1 - c]));
      s << ", 16-bit math form (math.h " << row.narrow_forward[c];
      if (!every_choice) s << ", " << row.param << "='" << row.choices[c] << "'";
      s << ": float math to under 1e-5, for results rounded to 16 bits)";
      break;
    }
    if (shape.min_blocks > 0) {
      s << ", at most " << 65536 / (shape.min_blocks * shape.threads) << " registers a thread (full occupancy)";
    }
    if (backward) s << " (grad_output assumed in the same layout and 16-byte aligned)";
  } else if (rows) {
    s << "scalar: rows of " << cols << " elements " << *stride << " apart, from a data pointer "
      << reinterpret_cast<std::uintptr_t>(p) % kVecBytes << " bytes past a 16-byte boundary, allow no "
      << vec_access << "-element accesses; " << unroll << " element loads per thread and operand";
  } else {
    const auto misalign = reinterpret_cast<std::uintptr_t>(p) % kVecBytes;
    s << "scalar: the input's data pointer is not 16-byte aligned (" << misalign << " bytes past), " << unroll
      << " element loads per thread and operand";
  }
  if (rows) {
    s << "; " << shape.threads << " threads x " << grid << " blocks, " << int64_t{shape.threads} * unroll
      << " accesses each, the row of each access by a multiply-shift division";
    return s.str();
  }
  s << "; " << shape.threads << " threads x " << grid << " blocks, one tile of "
    << int64_t{shape.threads} * unroll * vec << " elements each";
  return s.str();
}

}  // namespace fastact::cuda

TORCH_LIBRARY_IMPL(fastact, CUDA, m) {
  using namespace fastact::cuda;
  fastact::register_pointwise_ops<PointwiseCuda>(m);
  m.impl("bias_gelu", &bias_gelu_cuda);
  m.impl("bias_gelu_backward", &bias_gelu_backward_cuda);
}
