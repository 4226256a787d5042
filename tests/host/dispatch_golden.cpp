// Every plan of the softmax dispatcher (include/fastact/dispatch.h) for problems read from stdin, for the golden-plan
// test (tests/test_dispatch_host.py, tests/host/dispatch_golden.txt.gz): the dispatcher's choice and the plan of every
// forced variant, all SoftmaxPlan fields but the reason text, and the workspace the launcher would ask for. No GPU.
//
// One problem a line, 21 integers (the device, then the call):
//   sm_count cc_major max_cluster wide_cluster_threads l2_mib prefetch deep
//   in_bytes out_bytes acc_bytes backward log outer dim inner row_stride off_a off_b off_c bwd_two_cta workspace
// off_a / off_b / off_c: byte offsets from a 256-byte aligned base of the forward's x / y (off_c unused) or the
// backward's grad_output / output / grad_input. As the torch ops build the problem (csrc/cuda/softmax_ops.cpp):
// term_uses_output = !log; the backward's row stride is D whatever the line says.
// Prints the line, " | ", then the plans: auto's first, then warp vec scalar long_row strided split grid, each "x"
// where the variant rejects the problem (softmax_variant_rejects).
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>

#include "fastact/dispatch.h"

namespace {

using namespace fastact;

std::string encode(const SoftmaxPlan& s, int64_t outer) {
  std::string flags;
  if (s.streaming) flags += 'S';
  if (s.staged) flags += 'T';
  if (s.prefetch) flags += 'P';
  if (s.edges) flags += 'E';
  if (s.raw) flags += 'R';
  if (s.shifted) flags += 'H';
  if (s.two_pass) flags += '2';
  if (s.one_unit) flags += '1';
  if (s.full_cache) flags += 'F';
  if (s.packed) flags += 'K';
  if (flags.empty()) flags = "-";
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%s/%d/v%d/t%d/c%d/w%d/k%lld/g%lld/b%lld/n%d/G%d/e%d/m%d/%s/W%lld%s",
                softmax_variant_name(s.variant), int(s.mode), s.vec, s.threads, s.cluster, s.warp_log2,
                static_cast<long long>(s.chunks), static_cast<long long>(s.group_rows),
                static_cast<long long>(s.workspace_bytes), s.columns, s.groups, s.elems_per_thread, s.smem_elems,
                flags.c_str(), static_cast<long long>(softmax_workspace_bytes(s, outer)),
                softmax_workspace_zeroed(s) ? "z" : "");
  return buf;
}

}  // namespace

int main() {
  alignas(256) static char buf[1024];
  std::string line;
  const SoftmaxVariant forced[] = {SoftmaxVariant::kWarp,    SoftmaxVariant::kVec,     SoftmaxVariant::kScalar,
                                   SoftmaxVariant::kLongRow, SoftmaxVariant::kStrided, SoftmaxVariant::kSplit,
                                   SoftmaxVariant::kGrid};
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    std::istringstream in(line);
    long long v[21];
    for (long long& x : v) {
      if (!(in >> x)) {
        std::fprintf(stderr, "dispatch_golden: bad line: %s\n", line.c_str());
        return 2;
      }
    }
    SoftmaxDeviceProps dev;
    dev.sm_count = int(v[0]);
    dev.cc_major = int(v[1]);
    dev.max_cluster = int(v[2]);
    dev.wide_cluster_threads = int(v[3]);
    dev.l2_bytes = int64_t(v[4]) << 20;
    dev.prefetch = v[5] != 0;
    dev.memory_depth = v[6] ? MemoryDepth::kDeep : MemoryDepth::kStandard;
    const int in_bytes = int(v[7]), out_bytes = int(v[8]), acc_bytes = int(v[9]);
    const bool backward = v[10] != 0, log = v[11] != 0;
    const int64_t outer = v[12], dim = v[13], inner = v[14], row_stride = v[15];
    const void* a = buf + v[16];
    const void* b = buf + v[17];
    const void* c = buf + v[18];
    SoftmaxProblem p = backward ? softmax_backward_problem(a, b, out_bytes, c, in_bytes, acc_bytes, outer, dim, inner,
                                                           dev)
                                : softmax_forward_problem(a, in_bytes, b, out_bytes, acc_bytes, outer, dim, inner,
                                                          row_stride, dev);
    p.term_uses_output = !log;
    p.bwd_two_cta_threads = int(v[19]);
    p.workspace = v[20] != 0;
    std::string out = line + " | " + encode(choose_softmax(p), outer);
    for (SoftmaxVariant f : forced) {
      out += ' ';
      out += softmax_variant_rejects(f, p) != nullptr ? std::string("x") : encode(plan_softmax(f, p), outer);
    }
    std::cout << out << '\n';
  }
  return 0;
}
