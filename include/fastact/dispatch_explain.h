// explain's text for a softmax plan (fastact.explain): the prose, and the plan's fields in a machine-readable line
// that tests read (softmax_plan_fields). Presentation only: dispatch.h decides the plans.
#pragma once

#include <cstdio>
#include <string>
#include <utility>

#include "fastact/dispatch.h"

namespace fastact {

namespace softmax_detail {
// Whether strided plan `s` is the streamed element backward of strided_element_stream_shape.
inline bool strided_element_streams(const SoftmaxProblem& p, const SoftmaxPlan& s) {
  StridedStreamShape e;
  const int64_t line = strided_line_columns(p, 1);
  const bool wide = prefer(kElementStreamWide, p, 1) && line * p.out_bytes == kStridedRowBytes;
  return s.vec == 1 && p.backward && s.streaming && strided_element_stream_shape(p, line, wide, &e) &&
         e.threads == s.threads && e.columns == s.columns && e.cluster == s.cluster;
}
}  // namespace softmax_detail

// The preference rows that shaped plan `s` of `p` (at most 4), for explain and the tests.
inline int softmax_plan_rows(const SoftmaxProblem& p, const SoftmaxPlan& s, const pref::Row* out[4]) {
  using namespace softmax_detail;
  const int w = softmax_vec_width(p), row_vec = softmax_rows_vectorizable(p) ? w : 1;
  const bool edges = softmax_rows_edge_vectorizable(p), resident = s.mode == SoftmaxMode::kResident;
  const bool cached = s.mode == SoftmaxMode::kStrided && !s.staged && !s.streaming;
  SoftmaxPlan c;
  const bool yielded = s.mode == SoftmaxMode::kGrid && s.variant == SoftmaxVariant::kLongRow &&
                       plan_cluster(p, edges ? w : row_vec, edges, &c) && cluster_backward_yields_to_grid(p, c);
  const struct { bool on; Pick pick; int vec; bool edges; } checks[] = {
      {s.variant == SoftmaxVariant::kVec && p.dim_size <= softmax_warp_max_dim(p.acc_bytes), kVecOverWarp, row_vec,
       edges},
      {s.variant == SoftmaxVariant::kLongRow && clusters_available(p) &&
           p.dim_size <= int64_t(kVecMaxThreadsWithClusters) * softmax_resident_elems(p, w),
       kVecMaxThreads, row_vec, false},
      {s.two_pass, kTwoPass, row_vec, false},
      {s.one_unit, kOneUnit, row_vec, false},
      {s.full_cache, kFullCache, s.vec, s.edges},
      {s.packed, kWarpPacked, s.vec, false},
      {s.mode == SoftmaxMode::kWarp && s.threads == kWarpSmallBlockThreads, kWarpSmallBlocks, s.vec, false},
      {yielded, kGridOverCluster, c.vec, c.edges},
      {s.variant == SoftmaxVariant::kLongRow && resident, kDeepClusters, s.vec, s.edges},
      {resident && s.prefetch && !(s.raw && s.smem_elems > 0), kLongRowPrefetch, s.vec, false},
      {resident && s.prefetch && s.raw && s.smem_elems > 0, kRawRegsPrefetch, s.vec, false},
      {cached, kStridedSmallCtas, s.vec, false},
      {cached && s.prefetch, kStridedPrefetch, s.vec, false},
      {cached && s.vec == 1 && s.cluster > 1, kStridedElementCluster, s.vec, false},
      {s.mode == SoftmaxMode::kStrided && strided_element_streams(p, s), kElementStreamWide, 1, false},
      {s.staged, softmax_columns_vectorizable(p) ? kStagedVec : kStaged, softmax_columns_vectorizable(p) ? w : 1, false},
  };
  int n = 0;
  for (const auto& k : checks) {
    const Row* r = k.on ? row_for(k.pick, p, k.vec, k.edges) : nullptr;
    if (r && r->value && n < 4) out[n++] = r;
  }
  return n;
}

// The plan in a stable machine-readable form (explain's second line; tests parse it):
// "plan: variant=vec mode=resident vec=8 threads=256 ... flags=two_pass rows=two-pass".
inline std::string softmax_plan_fields(const SoftmaxProblem& p, const SoftmaxPlan& s) {
  constexpr const char* kModes[] = {"warp", "resident", "split", "strided", "grid"};
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "plan: variant=%s mode=%s vec=%d threads=%d cluster=%d warp_log2=%d chunks=%lld group_rows=%lld "
                "workspace_bytes=%lld columns=%d groups=%d elems_per_thread=%d smem_elems=%d flags=",
                softmax_variant_name(s.variant), kModes[int(s.mode)], s.vec, s.threads, s.cluster, s.warp_log2,
                static_cast<long long>(s.chunks), static_cast<long long>(s.group_rows),
                static_cast<long long>(softmax_workspace_bytes(s, p.outer)), s.columns, s.groups, s.elems_per_thread,
                s.smem_elems);
  std::string out = buf, flags;
  const std::pair<bool, const char*> named[] = {
      {s.streaming, "streaming"}, {s.staged, "staged"}, {s.prefetch, "prefetch"},   {s.edges, "edges"},
      {s.raw, "raw"},             {s.shifted, "shifted"}, {s.two_pass, "two_pass"}, {s.one_unit, "one_unit"},
      {s.full_cache, "full_cache"}, {s.packed, "packed"}};
  for (const auto& [on, name] : named) if (on) flags += (flags.empty() ? "" : ",") + std::string(name);
  out += flags.empty() ? "-" : flags;
  out += " rows=";
  const pref::Row* rows[4];
  const int n = softmax_plan_rows(p, s, rows);
  for (int i = 0; i < n; ++i) out += (i ? "," : "") + std::string(rows[i]->name);
  if (n == 0) out += "-";
  return out;
}

// Why the dispatcher's plan `s` of `p` (choose_softmax) is what it is: the structural reason (the preference rows
// follow it in softmax_explain).
inline const char* softmax_plan_why(const SoftmaxProblem& p, const SoftmaxPlan& s) {
  using namespace softmax_detail;
  switch (s.variant) {
    case SoftmaxVariant::kStrided:
      return s.staged ? "the softmax dim is not innermost; element accesses (or a 128-bit backward whose D-rows start "
                        "off a 32-byte sector) at short D: each tile's D-rows copied to shared memory in aligned "
                        "16-byte chunks, a column a thread or a few thread groups: one read"
             : !s.streaming ? "the softmax dim is not innermost: threads along inner, D split over threads (and a "
                              "cluster) with the tile cached: one read"
             : strided_element_streams(p, s) ? "the softmax dim is not innermost; a backward of element accesses, "
                                               "streamed in the shape whose tiles in flight fit L2: two reads, the "
                                               "second mostly from L2"
             : s.chunks > 1 ? "the softmax dim is not innermost; D too long to cache, and too few tiles of columns "
                              "to fill the device: D split into chunks, a CTA each, partials through a workspace, two "
                              "reads"
                            : "the softmax dim is not innermost; D too long to cache a tile of columns: two reads";
    case SoftmaxVariant::kWarp: return "short rows: a warp (or part of one) per row, the row in registers";
    case SoftmaxVariant::kScalar:
      return "the row fits one block's registers; not 16-byte aligned (or D / row stride not a multiple of the vector "
             "width): element accesses";
    case SoftmaxVariant::kVec:
      return s.edges ? "the row fits one block's registers; aligned bases, rows off the vector width: 128-bit "
                       "accesses, each row's head and tail elements one at a time"
             : s.shifted ? "the row fits one block's registers; 16-bit input rows off the alignment, an aligned "
                           "output: 128-bit accesses, the input staged in shared memory in aligned 16-byte chunks and "
                           "realigned"
                         : "the row fits one block's registers; aligned: 128-bit accesses";
    default: break;
  }
  const bool vectorizable =
      softmax_rows_vectorizable(p) || softmax_rows_edge_vectorizable(p) || softmax_rows_shift_vectorizable(p);
  const int64_t elems = softmax_resident_elems(p, vectorizable ? softmax_vec_width(p) : 1);
  return s.mode == SoftmaxMode::kGrid
             ? "the row is longer than a cluster caches (or no clusters, or a backward whose cluster CTAs would run "
               "one an SM): split over CTAs anywhere on the device, each caching its slice, combined through global "
               "memory: one read"
         : s.mode != SoftmaxMode::kResident ? "the row is longer than the device caches (or no workspace): online "
                                              "max+sum per chunk, then a write pass"
         : s.smem_elems > 0 ? "the row is longer than one block caches: split over a thread-block cluster, cached in "
                              "registers and shared memory, combined through distributed shared memory: one read"
         : p.dim_size <= int64_t(kVecMaxThreadsWithClusters) * elems
             ? "a 16-bit forward row past 320 threads of one block on a deep-memory device: split over a "
               "thread-block cluster, cached in registers, combined through distributed shared memory: one read"
             : "the row is longer than one block caches: split over a thread-block cluster, cached in registers, "
               "combined through distributed shared memory: one read";
}

// explain's note on a cluster backward of 128-bit accesses whose two-CTA size was probed
// (SoftmaxProblem::bwd_two_cta_threads): whether other CTAs share its SMs.
inline const char* resident_backward_occupancy(const SoftmaxProblem& p, const SoftmaxPlan& s) {
  if (!p.backward || p.bwd_two_cta_threads <= 0 || s.cluster == 1 || s.vec == 1 || s.edges) return "";
  return s.threads <= softmax_detail::cluster_backward_two_cta_threads(p.bwd_two_cta_threads, p.out_bytes) ? ", at least two CTAs an SM"
                                                                                            : ", one CTA an SM";
}

// The dispatcher's plan `s` of `p` explained:
// "variant=vec: D=4096, outer=8, inner=1: <why> [<configuration>]; preference: <row> (<its reason>)"
inline std::string softmax_explain(const SoftmaxProblem& p, const SoftmaxPlan& s) {
  char buf[512];
  const char* access = s.vec == 1 ? "element accesses"
                       : s.edges  ? "128-bit accesses, head and tail elements one at a time"
                       : s.shifted ? "128-bit accesses, the input's rows staged in shared memory and realigned"
                                  : "128-bit accesses";
  int n = std::snprintf(buf, sizeof(buf), "variant=%s: D=%lld, outer=%lld, inner=%lld", softmax_variant_name(s.variant),
                        static_cast<long long>(p.dim_size), static_cast<long long>(p.outer),
                        static_cast<long long>(p.inner));
  std::string out(buf, n > 0 ? size_t(n) : 0);
  out += ": ";
  out += softmax_plan_why(p, s);
  switch (s.mode) {
    case SoftmaxMode::kWarp:
      n = std::snprintf(buf, sizeof(buf), " [%d lanes per row, %d elements per lane, %s%s]",
                        (1 << s.warp_log2) / s.elems_per_thread, s.elems_per_thread, access,
                        s.packed                           ? ", rows packed several a warp (a deep-memory device)"
                        : s.threads == kWarpSmallBlockThreads ? ", blocks of two warps (a deep-memory device)"
                                                               : "");
      break;
    case SoftmaxMode::kResident:
      if (s.smem_elems > 0) {
        n = std::snprintf(buf, sizeof(buf),
                          " [%d CTA(s) x %d threads x %d elements per row (%s%d in shared memory), %s%s]", s.cluster,
                          s.threads, s.elems_per_thread, s.raw ? "the rest kept as loaded, " : "", s.smem_elems, access,
                          s.prefetch ? ", the rows ahead prefetched into L2" : "");
      } else {
        n = std::snprintf(buf, sizeof(buf), " [%d CTA(s) x %d threads x %d elements per row%s, %s%s%s]", s.cluster,
                          s.threads, s.elems_per_thread, s.raw ? " (kept as loaded)" : "", access,
                          s.two_pass   ? ", two passes: dy and y loaded again after the all-reduce (L1 / L2 evict_last, "
                                         "then evict_first)"
                          : s.one_unit   ? ", one unit a thread (a deep-memory device)"
                          : s.full_cache ? ", the whole register cache a thread (a deep-memory device)"
                                         : "",
                          resident_backward_occupancy(p, s));
      }
      break;
    case SoftmaxMode::kSplit:
      n = std::snprintf(buf, sizeof(buf), " [%lld chunk(s) per row, %lld rows per launch pair, %d threads, %s]",
                        static_cast<long long>(s.chunks), static_cast<long long>(s.group_rows), s.threads, access);
      break;
    case SoftmaxMode::kStrided:
      if (s.staged) {
        n = std::snprintf(buf, sizeof(buf), " [%d column(s) x %d threads per CTA, cluster %d, staged in shared "
                          "memory, %d thread group(s) a column, 16-byte copies in, element stores out]", s.columns,
                          s.threads, s.cluster, s.groups);
      } else if (s.chunks > 1) {
        n = std::snprintf(buf, sizeof(buf), " [%d column(s) x %d threads per CTA, cluster %d, streamed twice, %lld "
                          "chunks of D, %s]", s.columns, s.threads, s.cluster, static_cast<long long>(s.chunks), access);
      } else {
        n = std::snprintf(buf, sizeof(buf), " [%d column(s) x %d threads per CTA, cluster %d, %s, %s]", s.columns,
                          s.threads, s.cluster,
                          s.streaming  ? "streamed twice"
                          : s.prefetch ? "cached, the tiles ahead prefetched into L2"
                                       : "cached",
                          access);
      }
      break;
    case SoftmaxMode::kGrid:
      n = std::snprintf(buf, sizeof(buf),
                        " [%lld CTA(s) x %d threads x %d elements per row (%d in shared memory), partials through "
                        "global memory, %s]",
                        static_cast<long long>(s.chunks), s.threads, s.elems_per_thread, s.smem_elems, access);
      break;
  }
  if (n > 0) out.append(buf, size_t(n));
  const pref::Row* rows[4];  // the measured choices that shaped the plan (docs/dispatch.md, by name)
  for (int i = 0, k = softmax_plan_rows(p, s, rows); i < k; ++i)
    out += (i ? "; " : "; preference: ") + std::string(rows[i]->name) + " (" + rows[i]->why + ")";
  return out;
}

}  // namespace fastact
