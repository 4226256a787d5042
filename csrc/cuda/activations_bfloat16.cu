// The bfloat16 instantiations of the activation kernels (see activations.h).
#include "cuda/activations.h"

namespace fastact::cuda {
template struct ActivationLaunchers<__nv_bfloat16>;
}  // namespace fastact::cuda
