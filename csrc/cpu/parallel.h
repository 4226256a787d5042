// The one way the CPU kernels use threads: parallel_for over an index range, on oneTBB workers
// inside a task_arena sized by at::get_num_threads() (capped by what oneTBB runs), or, in a process
// forked after oneTBB had started (which oneTBB does not support), on plain threads of fastact's own
// (csrc/cpu/ops.cpp says why).
//
// The TBB side (the arena, tbb::parallel_for) lives in csrc/cpu/ops.cpp, an ordinary translation
// unit: the per-ISA builds of the kernel files call it through a type-erased function pointer, so no
// TBB or std template that the AVX2/AVX512 objects would instantiate (and that the linker could
// then pick for the whole library) is compiled with wide-vector flags.
#pragma once

#include <cstdint>

namespace fastact::cpu {

using RangeFn = void (*)(const void* ctx, int64_t begin, int64_t end);

// Splits [0, n) into equal contiguous chunks, each at least `grain` long and a few per thread
// (boundaries fixed by n, grain and the thread count; which thread runs which chunk is not), and
// runs fn(ctx, begin, end) on each, the calling thread taking part. Runs fn(ctx, 0, n) inline when
// one chunk is all there is, when torch is set to one thread, or when called from inside a
// parallel region. Kernels whose results must not depend on the split (the bias gradient) make
// their own fixed partition and use this only to run its pieces.
void parallel_for_erased(int64_t n, int64_t grain, const void* ctx, RangeFn fn);

// The threads a parallel_for called from here would run on: torch's thread count, but no more than
// oneTBB runs (its max_allowed_parallelism: the process's CPUs); 1 inside a parallel region.
int parallel_threads();

// parallel_for(n, grain, [&](int64_t begin, int64_t end) { ... }). The first test keeps small
// problems free of any call into the threading layer.
template <typename F>
inline void parallel_for(int64_t n, int64_t grain, const F& f) {
  if (n <= 0) return;
  if (n <= grain) {
    f(int64_t(0), n);
    return;
  }
  parallel_for_erased(n, grain, &f, [](const void* ctx, int64_t b, int64_t e) { (*static_cast<const F*>(ctx))(b, e); });
}

}  // namespace fastact::cpu
