// The memory-depth classes of memory_depth.cuh, without CUDA (dispatch.h, which the CPU build includes, plans by them).
#pragma once

namespace fastact {

// kStandard: the H100 and devices like it, the class whose shapes were tuned on the H100.
// kDeep: devices whose DRAM moves at least kDeepMemoryBytesPerSmCycle bytes per SM per SM cycle (the H200), whose
// kernels need more bytes in flight a thread and more threads an SM.
enum class MemoryDepth { kStandard, kDeep };

// Between the H100's 12.8 and the H200's 18.8 DRAM bytes per SM cycle.
constexpr double kDeepMemoryBytesPerSmCycle = 16.0;

}  // namespace fastact
