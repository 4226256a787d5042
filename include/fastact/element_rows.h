// How the operands of an elementwise op lie in memory (torch-free; the CPU and CUDA kernels share it).
//
// The op reads one or two inputs and writes one output of n = rows * cols elements. Each input is
// `rows` rows of `cols` consecutive elements, row r of input k starting stride_k elements after row
// r - 1; the output is dense, row r at out + r * cols. Dense operands in one memory order (what
// most calls see: contiguous, transposed or permuted alike) are one flat array: ElementRows::flat(n).
// A view that is a uniformly strided stack of rows, such as x[..., a:b] or a chunk of the last dim
// (the gate half of a GeGLU projection), is read in place this way instead of being copied first.
#pragma once

#include <cstdint>

#include "fastact/math.h"

namespace fastact {

struct ElementRows {
  int64_t rows = 1;
  int64_t cols = 0;
  int64_t stride0 = 0;  // elements from one row of the first input to the next
  int64_t stride1 = 0;  // the same for the second input (cols for unary ops)

  static constexpr ElementRows flat(int64_t n) { return {1, n, n, n}; }
  constexpr int64_t numel() const { return rows * cols; }
  // Every operand at the output's offsets: the flat kernels over numel() elements apply.
  constexpr bool is_flat() const { return rows <= 1 || (stride0 == cols && stride1 == cols); }
};

// Unsigned division by a divisor fixed at launch as one multiply and a shift (Granlund and
// Montgomery), for dividends below 2^31: with l = ceil(log2 d) and p = 31 + l, mul = ceil(2^p / d)
// < 2^32 and n / d = (n * mul) >> p exactly (the rounding error n * (mul - 2^p / d) / 2^p stays
// below 2^31 / 2^p <= 1 / d, too little to reach the next integer). Divisors beyond 2^31 give
// quotient 0 for every such dividend (mul = 0). The elementwise rows kernels divide an access
// index by the accesses a row holds, once per access; a hardware-less 32-bit division costs about
// twenty instructions there.
struct RowDivider {
  uint64_t mul = 0;
  int shift = 0;

  RowDivider() = default;
  explicit RowDivider(int64_t d) {
    if (d > (int64_t{1} << 31)) return;  // every dividend < 2^31 < d
    int l = 0;
    while ((int64_t{1} << l) < d) ++l;
    shift = 31 + l;
    mul = ((uint64_t{1} << shift) + static_cast<uint64_t>(d) - 1) / static_cast<uint64_t>(d);
  }
  // n / d for 0 <= n < 2^31.
  FASTACT_HOST_DEVICE uint32_t quotient(uint32_t n) const { return static_cast<uint32_t>((n * mul) >> shift); }
};

}  // namespace fastact
