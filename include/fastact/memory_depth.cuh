// How deep a device's memory pipeline is, as the launchers see it (torch-free, host side): the CUDA query; the
// class itself is in memory_depth.h, which the CPU-compiled dispatcher includes too.
//
// A kernel near the DRAM limit must keep bandwidth x latency bytes in flight (Little's law), and the
// arithmetic between its loads competes with fewer cycles per byte on a device whose DRAM is fast for
// its SMs. The measure here is the DRAM bytes a device moves per SM per SM clock cycle at its peak:
//
//   2 x memory clock x bus width / 8  /  (SMs x SM clock)   (HBM moves data on both clock edges)
//
// H100 SXM (HBM3, 2619 MHz x 5120 bits, 132 SMs at 1980 MHz): 12.8; H200 (HBM3e, 3201 MHz x 6144
// bits, the same SMs): 18.8; A100 80GB: 13.4. At or above kDeepMemoryBytesPerSmCycle a device is
// kDeep: its elementwise kernels take more bytes a thread (elementwise.cuh elementwise_shape says
// which) and the 16-bit softmax vec backward one unit a thread (dispatch.h row vec-one-unit),
// from diags on both machines (docs/performance.md, memory depth). Where a CUDA attribute is
// missing (zero, or an error) the device is kStandard, the class whose shapes were tuned on the H100.
//
// runtime_options().force_memory_depth (fastact: FASTACT_MEMORY_DEPTH=standard or =deep) overrides the measure,
// once per device: the tests force each class on whatever GPU runs them, and a user can pick the other shapes for
// a device this rule places wrongly. By public specifications the rule also calls the H100 NVL (~16.5), the H20
// and the B200 deep; only the H100 SXM and the H200 were measured.
#pragma once

#include <cuda_runtime.h>

#include <mutex>

#include "fastact/memory_depth.h"
#include "fastact/runtime_options.h"

namespace fastact {

// What the launchers and explain() know of one device's memory.
struct DeviceMemory {
  double bytes_per_sm_cycle = 0;  // 0 where an attribute was missing
  MemoryDepth depth = MemoryDepth::kStandard;
  bool forced = false;  // depth set by the runtime options, not by bytes_per_sm_cycle
};

namespace memory_depth_detail {
constexpr int kMaxDevices = 64;

inline DeviceMemory measure(int device) {
  DeviceMemory m;
  int mem_khz = 0, bus_bits = 0, sms = 0, sm_khz = 0;
  const bool queried = cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, device) == cudaSuccess &&
                       cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) == cudaSuccess &&
                       cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess &&
                       cudaDeviceGetAttribute(&sm_khz, cudaDevAttrClockRate, device) == cudaSuccess;
  if (!queried) {
    (void)cudaGetLastError();  // a failed query leaves no error behind for the next launch check
  } else if (sms > 0 && sm_khz > 0) {
    m.bytes_per_sm_cycle = 2.0 * mem_khz * (bus_bits / 8.0) / (double(sms) * sm_khz);
  }
  m.depth = m.bytes_per_sm_cycle >= kDeepMemoryBytesPerSmCycle ? MemoryDepth::kDeep : MemoryDepth::kStandard;
  if (runtime_options().force_memory_depth) {
    m.depth = runtime_options().memory_depth;
    m.forced = true;
  }
  return m;
}
}  // namespace memory_depth_detail

// `device`'s memory, measured once per device per process (a device index past the cache: measured on
// every call).
inline DeviceMemory device_memory(int device) {
  using memory_depth_detail::kMaxDevices;
  if (device < 0 || device >= kMaxDevices) return memory_depth_detail::measure(device);
  static std::once_flag once[kMaxDevices];
  static DeviceMemory cache[kMaxDevices];
  std::call_once(once[device], [device] { cache[device] = memory_depth_detail::measure(device); });
  return cache[device];
}

// The current device's depth (the torch adapter's device guard has made the tensors' device current).
inline MemoryDepth current_memory_depth() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return MemoryDepth::kStandard;
  }
  return device_memory(device).depth;
}

}  // namespace fastact
