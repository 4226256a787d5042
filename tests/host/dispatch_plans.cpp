// The dispatcher (include/fastact/dispatch.h, pure host C++) on problems read from stdin, for
// tests/test_dispatch_host.py: the plans a modelled device gets, without a GPU. One problem a line:
//   depth in_bytes out_bytes acc_bytes backward log outer dim inner aligned
// (depth: standard | deep; backward, log, aligned: 0 | 1). As the torch ops build them (csrc/cuda/softmax_ops.cpp
// launch_forward / launch_backward): a workspace, term_uses_output = !log, every output (and the backward's inputs)
// on an allocator's alignment, aligned = 0 putting the forward's input 2 bytes off it. Not the backward's probed
// bwd_two_cta_threads: 0, dispatch.h's unprobed fallback. The device: argv[1..4] = sm_count max_cluster
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
  alignas(256) static char buf[512];  // the CUDA caching allocator's alignment, at least
  const void* base = buf;
  std::string depth;
  int in_bytes, out_bytes, acc_bytes, backward, log, aligned;
  long long outer, dim, inner;
  while (std::cin >> depth >> in_bytes >> out_bytes >> acc_bytes >> backward >> log >> outer >> dim >> inner >>
         aligned) {
    dev.memory_depth = depth == "deep" ? MemoryDepth::kDeep : MemoryDepth::kStandard;
    const void* x = aligned ? base : static_cast<const void*>(buf + 2);
    SoftmaxProblem p =
        backward ? softmax_backward_problem(base, base, out_bytes, base, in_bytes, acc_bytes, outer, dim, inner, dev)
                 : softmax_forward_problem(x, in_bytes, base, out_bytes, acc_bytes, outer, dim, inner,
                                           inner == 1 ? dim : 1, dev);
    p.workspace = true;
    p.term_uses_output = !log;
    std::cout << softmax_explain(p, choose_softmax(p)) << "\n";
  }
  return 0;
}
