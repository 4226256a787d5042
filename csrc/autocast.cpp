// Autocast for fastact's ops, as torch's own: under torch.autocast("cuda"), torch runs softmax and
// log_softmax in float32 (its CUDA float32 list): a float16 or bfloat16 input gives a float32 output.
// fastact does the same by fusing that cast into the kernel (the dtype argument: a 16-bit input read as
// it is, float32 written), so the float32 copy of the input torch makes is never materialised. gelu,
// bias_gelu and sigmoid are on no autocast list: they run in their input's dtype, with or without
// autocast, which the fallthrough below the autocast keys already does. The CPU autocast lists do not
// hold softmax either.
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include "op_handles.h"

namespace fastact {
namespace {

template <bool kLog>
at::Tensor softmax_autocast_cuda(const at::Tensor& x, int64_t dim, std::optional<at::ScalarType> dtype,
                                 c10::string_view variant) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  // torch's float32 policy (at::autocast::cached_cast): a CUDA float16 / bfloat16 tensor becomes
  // float32; other dtypes and devices pass unchanged. An explicit dtype is the output's, as in torch.
  const bool cast = !dtype && x.is_cuda() && at::isReducedFloatingType(x.scalar_type());
  return softmax_op<kLog>().call(x, dim, cast ? std::optional<at::ScalarType>(at::kFloat) : dtype, variant);
}

}  // namespace

TORCH_LIBRARY_IMPL(fastact, AutocastCUDA, m) {
  m.impl("softmax", &softmax_autocast_cuda<false>);
  m.impl("log_softmax", &softmax_autocast_cuda<true>);
}

}  // namespace fastact
