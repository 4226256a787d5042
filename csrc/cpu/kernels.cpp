// The kernel table of one instruction set (csrc/cpu/kernels.h): the entry points of
// softmax_kernels.cpp and elementwise_kernels.cpp, compiled with this file once per ISA (setup.py
// ISA_SOURCES), inside `namespace CPU_CAPABILITY` (csrc/cpu/vec_io.h has the scheme and its ODR rules).

#include "cpu/kernels.h"
#include "cpu/vec_io.h"

#include <cstdlib>
#include <type_traits>

#define FASTACT_STRINGIFY_(x) #x
#define FASTACT_STRINGIFY(x) FASTACT_STRINGIFY_(x)

namespace fastact::cpu {
namespace CPU_CAPABILITY {

#if defined(CPU_CAPABILITY_AVX512)
bool g_avx512_bf16 = false;  // vec_io.h
#endif

namespace {

template <typename T>
TypedKernels<T> make_kernels() {
  constexpr bool kReduced = std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>;
  TypedKernels<T> k{};
  k.softmax_fwd = &softmax_fwd<T>;
  k.softmax_bwd = &softmax_bwd<T>;
  k.softmax_strided_columns = &softmax_strided_columns<T>;
  k.softmax_strided_lane_group = &softmax_strided_lane_group<T>;
  if constexpr (kReduced) {
    k.softmax_fwd_to_float = &softmax_fwd_to_float<T>;
    k.softmax_bwd_from_float = &softmax_bwd_from_float<T>;
  }
  fill_pointwise_kernels(k);
  k.bias_gelu_fwd = &bias_gelu_fwd<T>;
  k.bias_gelu_bwd = &bias_gelu_bwd<T>;
  return k;
}

// Built on first use (fill_pointwise_kernels is in another file, so not at compile time).
const KernelTable& table() {
  static const KernelTable t{
      FASTACT_STRINGIFY(CPU_CAPABILITY), static_cast<int>(Vectorized<float>::size()),
      make_kernels<float>(),             make_kernels<double>(),
      make_kernels<c10::Half>(),         make_kernels<c10::BFloat16>(),
  };
  return t;
}

}  // namespace

const KernelTable& kernel_table() {
#if defined(CPU_CAPABILITY_AVX512) && defined(__GNUC__)
  // FASTACT_NO_AVX512_BF16=1 keeps the emulated conversion (bit-for-bit ATen's, denormals
  // included); tests use it to cover that path on CPUs that have the instruction.
  static const bool detected = [] {
    const char* off = std::getenv("FASTACT_NO_AVX512_BF16");
    g_avx512_bf16 = __builtin_cpu_supports("avx512bf16") && !(off && off[0] == '1');
    return true;
  }();
  (void)detected;
#endif
  return table();
}

}  // namespace CPU_CAPABILITY
}  // namespace fastact::cpu
