// An aligned vector of N elements for 128-bit loads and stores, one generic type for every dtype
// (the MemoryAccess.cuh pattern), and the host-side test for whether a pointer can use it.
#pragma once

#include <cstdint>

#include "fastact/math.h"

namespace fastact {

// Bytes one vector access moves: 16, the widest load a thread can issue (LDG.E.128).
constexpr int kVecBytes = 16;

// Elements of T in one 128-bit access: 4 float, 8 half/bfloat16, 2 double.
template <typename T>
constexpr int vec_width() {
  return kVecBytes / static_cast<int>(sizeof(T));
}

template <typename T, int N>
struct alignas(sizeof(T) * N) AlignedVector {
  T val[N];
};

template <typename T, int N>
FASTACT_DEVICE AlignedVector<T, N> load_vector(const T* p) {  // p must be aligned to sizeof(T) * N
  return *reinterpret_cast<const AlignedVector<T, N>*>(p);
}

template <typename T, int N>
FASTACT_DEVICE void store_vector(T* p, const AlignedVector<T, N>& v) {  // p aligned likewise
  *reinterpret_cast<AlignedVector<T, N>*>(p) = v;
}

// Host side: may `p` be read with AlignedVector<T, vec_width<T>()>? (nullptr counts as aligned.)
inline bool is_vec_aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % kVecBytes == 0; }

}  // namespace fastact
