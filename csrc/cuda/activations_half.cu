// The float16 instantiations of the activation kernels (see activations.h).
#include "cuda/activations.h"

namespace fastact::cuda {
template struct ActivationLaunchers<__half>;
}  // namespace fastact::cuda
