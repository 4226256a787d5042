// The float32 and float64 instantiations of the activation kernels (see activations.h).
#include "cuda/activations.h"

namespace fastact::cuda {
template struct ActivationLaunchers<float>;
template struct ActivationLaunchers<double>;
}  // namespace fastact::cuda
