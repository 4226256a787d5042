// The launchers' runtime options. The headers read no environment: the library that hosts the kernels sets these
// once, before its first launch (fastact's torch adapter reads them from FASTACT_* variables, csrc/runtime_options.h);
// a program that uses the headers alone gets the defaults. Torch-free and CUDA-free.
#pragma once

#include <cstdint>

#include "fastact/memory_depth.h"
#include "fastact/softmax_shapes.h"

namespace fastact {

struct RuntimeOptions {
  // Largest thread-block cluster the softmax kernels use on sm_90: 16, 8 (portable sizes only) or 1 (none); other
  // values round down to one of those. The device's own limit applies below it (softmax/launch.cuh probe_clusters).
  int max_cluster = kMaxCluster;
  // The L2 prefetches of the work ahead where they pay (dispatch.h SoftmaxDeviceProps::prefetch).
  bool prefetch = true;
  // The memory-depth class every device takes instead of the measured one (memory_depth.cuh).
  bool force_memory_depth = false;
  MemoryDepth memory_depth = MemoryDepth::kStandard;
  // How long a grid-mode CTA waits for the rest of its row (softmax/grid.cuh; kGridWaitNs).
  int64_t grid_wait_ns = kGridWaitNs;
};

namespace runtime_options_detail {
inline RuntimeOptions& storage() {
  static RuntimeOptions options;
  return options;
}
}  // namespace runtime_options_detail

// What the launchers read. The device properties built from them are cached per device on first use, so set them
// before the first launch.
inline const RuntimeOptions& runtime_options() { return runtime_options_detail::storage(); }
inline void set_runtime_options(const RuntimeOptions& options) { runtime_options_detail::storage() = options; }

}  // namespace fastact
