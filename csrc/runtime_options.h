// fastact's environment knobs, read in one place: the extension's import (csrc/ops.cpp) turns them into the
// headers' RuntimeOptions (include/fastact/runtime_options.h), before any kernel runs. What each does:
// docs/architecture.md, "Environment knobs". A FASTACT_MEMORY_DEPTH other than the two named is ignored.
//   FASTACT_MAX_CLUSTER=1|8|16      the largest thread-block cluster (1: none; 8: portable sizes only)
//   FASTACT_PREFETCH=0|1            the L2 prefetches of the work ahead (0: off)
//   FASTACT_MEMORY_DEPTH=standard|deep   the memory-depth class every device takes
//   FASTACT_GRID_WAIT_US=N          how long a grid-mode CTA waits for the rest of its row, microseconds
#pragma once

#include <cstdlib>
#include <cstring>

#include "fastact/runtime_options.h"

namespace fastact {

inline RuntimeOptions runtime_options_from_environment() {
  RuntimeOptions o;
  // any integer: softmax/launch.cuh probe_clusters rounds it down to 16, 8 or 1
  if (const char* v = std::getenv("FASTACT_MAX_CLUSTER")) o.max_cluster = std::atoi(v);
  if (const char* v = std::getenv("FASTACT_PREFETCH")) o.prefetch = std::atoi(v) != 0;
  if (const char* v = std::getenv("FASTACT_MEMORY_DEPTH")) {
    if (std::strcmp(v, "deep") == 0 || std::strcmp(v, "standard") == 0) {
      o.force_memory_depth = true;
      o.memory_depth = v[0] == 'd' ? MemoryDepth::kDeep : MemoryDepth::kStandard;
    }
  }
  if (const char* v = std::getenv("FASTACT_GRID_WAIT_US")) o.grid_wait_ns = int64_t(std::strtoull(v, nullptr, 10)) * 1000;
  return o;
}

}  // namespace fastact
