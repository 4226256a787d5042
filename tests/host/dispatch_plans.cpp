// The dispatcher (include/fastact/dispatch.h, pure host C++) on problems read from stdin, for
// tests/test_dispatch_host.py: the plans a modelled device gets, without a GPU. One problem a line:
//   depth in_bytes out_bytes acc_bytes backward outer dim inner aligned
// (depth: standard | deep; backward, aligned: 0 | 1). The device: argv[1..4] = sm_count max_cluster
// wide_cluster_threads l2_mib (cc 9.0, prefetch on). Prints softmax_explain(p, choose_softmax(p)) a line.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "fastact/dispatch.h"

int main(int argc, char** argv) {
  using namespace fastact;
  if (argc != 5) {
    std::fprintf(stderr, "usage: dispatch_plans sm_count max_cluster wide_cluster_threads l2_mib < problems\n");
    return 2;
  }
  SoftmaxDeviceProps dev;
  dev.sm_count = std::atoi(argv[1]);
  dev.cc_major = 9;
  dev.max_cluster = std::atoi(argv[2]);
  dev.wide_cluster_threads = std::atoi(argv[3]);
  dev.l2_bytes = int64_t(std::atoi(argv[4])) << 20;
  alignas(16) static char aligned_buf[64];
  std::string depth;
  int in_bytes, out_bytes, acc_bytes, backward, aligned;
  long long outer, dim, inner;
  while (std::cin >> depth >> in_bytes >> out_bytes >> acc_bytes >> backward >> outer >> dim >> inner >> aligned) {
    dev.memory_depth = depth == "deep" ? MemoryDepth::kDeep : MemoryDepth::kStandard;
    const void* ptr = aligned ? static_cast<const void*>(aligned_buf) : static_cast<const void*>(aligned_buf + 2);
    SoftmaxProblem p =
        backward ? softmax_backward_problem(ptr, ptr, out_bytes, ptr, in_bytes, acc_bytes, outer, dim, inner, dev)
                 : softmax_forward_problem(ptr, in_bytes, ptr, out_bytes, acc_bytes, outer, dim, inner,
                                           inner == 1 ? dim : 1, dev);
    p.workspace = true;  // as the torch ops
    std::cout << softmax_explain(p, choose_softmax(p)) << "\n";
  }
  return 0;
}
