// The softmax dispatcher: which kernel variant, in which launch shape, runs a softmax problem. Pure host C++ (no
// torch, no CUDA): a function of the geometry [outer, D, inner], the element sizes, the alignment and a few device
// properties. docs/dispatch.md describes the variants and holds the measurement behind every preference row.
//
//   Eligibility: what can run a problem. Alignment (softmax_rows_vectorizable and kin), capacity (registers and
//     shared memory: softmax_shapes.h, whose shapes the kernels share; clusters: cluster_cap), workspace
//     (plan_grid, the strided split mode). softmax_variant_rejects says why a forced variant cannot.
//   Preference: kPreferences, an ordered table of measured choices. A row applies where the problem matches its
//     direction, op, dtype class, device class, access and D range; for each Pick the first applying row decides.
//   Planning: plan_softmax builds a variant's launch shape from both (the search orders below are preferences
//     too: smallest CTAs first, clusters only where they fill the device); choose_softmax picks the variant.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "fastact/memory_depth.h"
#include "fastact/softmax_shapes.h"

namespace fastact {

enum class SoftmaxVariant : int { kAuto = 0, kWarp, kVec, kScalar, kLongRow, kStrided, kSplit, kGrid };
inline constexpr int kNumSoftmaxVariants = 8;
inline const char* softmax_variant_name(SoftmaxVariant v) {
  constexpr const char* kNames[] = {"auto", "warp", "vec", "scalar", "long_row", "strided", "split", "grid"};
  const int i = static_cast<int>(v);
  return i >= 0 && i < kNumSoftmaxVariants ? kNames[i] : "?";
}
inline const char* softmax_variant_names() { return "auto, warp, vec, scalar, long_row, strided, split, grid"; }
// false for an unknown name (the caller reports softmax_variant_names()).
inline bool softmax_variant_from_name(std::string_view name, SoftmaxVariant* out) {
  for (int i = 0; i < kNumSoftmaxVariants; ++i)
    if (name == softmax_variant_name(static_cast<SoftmaxVariant>(i))) return *out = static_cast<SoftmaxVariant>(i), true;
  return false;
}

// Softmax over D = dim_size of a tensor viewed as [outer, D, inner]. inner 1: rows of D, the input's row_stride
// apart, every other tensor dense; inner > 1: columns of D at stride inner, every tensor dense.
struct SoftmaxProblem {
  int64_t outer = 1, dim_size = 1, inner = 1;
  int64_t row_stride = 1;  // input elements between rows when inner == 1 (== dim_size when dense)
  int in_bytes = 4;        // forward: input element; backward: grad_input element
  int out_bytes = 4;       // forward: output element; backward: grad_output and output element
  int acc_bytes = 4;       // accumulation type: 4 (float) or 8 (double)
  bool backward = false;
  bool aligned = false;      // every pointer aligned to its 128-bit access (softmax_vec_width elements)
  bool out_aligned = false;  // forward: the output pointer is (softmax_rows_shift_vectorizable); backward: = aligned
  int sm_count = 132, cc_major = 9;
  int max_cluster = 1, wide_cluster_threads = 0;  // SoftmaxDeviceProps
  int64_t l2_bytes = 50 << 20;
  bool prefetch = true;
  // Backward: the largest CTA of which two of block.cuh's 128-bit backward fit an SM, as the occupancy query gives
  // it for the registers the compiler chose (launch.cuh block_backward_two_cta_threads); 0: not probed.
  int bwd_two_cta_threads = 0;
  bool workspace = false;         // the caller provides softmax_workspace_bytes (the torch ops do)
  bool term_uses_output = false;  // backward: softmax's term reads y (math.h kTermUsesOutput); log_softmax's not
  MemoryDepth memory_depth = MemoryDepth::kStandard;
};

// What the dispatcher needs of the device, read once per device (softmax/launch.cuh softmax_device_props).
struct SoftmaxDeviceProps {
  int sm_count = 0, cc_major = 0;
  int max_cluster = 1;  // largest cluster the device schedules for these kernels: 1 (none), 8 or 16
  // Largest block (512, 1024; 0: neither) at which clusters of 16 hold >= 90% of the CTAs the device holds without.
  int wide_cluster_threads = 0;
  int64_t l2_bytes = 0;
  bool prefetch = true;  // the L2 prefetches allowed (RuntimeOptions::prefetch; fastact: FASTACT_PREFETCH=0: not)
  MemoryDepth memory_depth = MemoryDepth::kStandard;
};

enum class SoftmaxMode : int { kWarp, kResident, kSplit, kStrided, kGrid };

// How a variant runs a problem: filled by plan_softmax, read by the launchers and explain.
struct SoftmaxPlan {
  SoftmaxVariant variant = SoftmaxVariant::kAuto;
  SoftmaxMode mode = SoftmaxMode::kWarp;
  int vec = 1;             // elements per access: softmax_vec_width (128-bit) or 1
  int threads = 0;         // per block
  int cluster = 1;         // CTAs per row (resident) or per tile (strided)
  int warp_log2 = 0;       // warp: log2 of the padded row
  int64_t chunks = 1;      // split: CTAs per row; grid: CTAs per row; strided: chunks of D (> 1: the split mode)
  int64_t group_rows = 0;  // split with chunks > 1: rows per (stats, write) launch pair
  int64_t workspace_bytes = 0;  // strided split mode: bytes of the partials
  int columns = 0;         // strided: column vectors per block
  int groups = 1;          // strided staged: thread groups a column
  bool streaming = false;  // strided: D too long to cache, read twice
  bool staged = false;     // strided: tiles through shared memory in 16-byte chunks (softmax/staged.cuh)
  bool prefetch = false;   // L2 prefetch of the work ahead (strided cached, long_row 16-bit shared-memory forwards)
  bool edges = false;      // vec, long_row: rows off the 128-bit alignment, head and tail elements one at a time
  bool raw = false;        // long_row forward: the register cache kept as loaded
  bool shifted = false;    // vec forward: the input's rows staged and realigned
  bool two_pass = false;   // vec backward: dy and y read again after the all-reduce
  bool one_unit = false;   // vec backward: one unit of dy and y a thread
  bool full_cache = false;  // vec: the whole register cache a thread
  bool packed = false;      // warp forward: kWarpPackedAccesses a lane, several rows a warp
  int elems_per_thread = 0;  // cached elements per thread (resident, strided, warp, grid)
  int smem_elems = 0;        // long_row, grid: of those, the ones in shared memory
};

// ---- Eligibility -------------------------------------------------------------------------------------------------

inline int softmax_vec_width(const SoftmaxProblem& p) { return softmax_vec_width(p.in_bytes, p.out_bytes); }
// Rows move in 128-bit accesses: aligned, D and the row stride multiples of the width.
inline bool softmax_rows_vectorizable(const SoftmaxProblem& p) {
  const int w = softmax_vec_width(p);
  return p.aligned && p.inner == 1 && p.dim_size % w == 0 && (p.row_stride % w == 0 || p.outer == 1);
}
// Rows off the width whose every tensor's row r starts at the same offset from the alignment: 128-bit bodies, head
// and tail elements one at a time (the resident kernels: block.cuh RowEdges) [rows-edges].
inline bool softmax_rows_edge_vectorizable(const SoftmaxProblem& p) {
  const int w = softmax_vec_width(p);
  return p.aligned && p.inner == 1 && p.dim_size % w != 0 && (p.outer == 1 || (p.row_stride - p.dim_size) % w == 0);
}
// 16-bit forward rows each off the alignment by its own amount, into an aligned output: vec realigns them through
// shared memory (block.cuh ShiftedRow) [rows-shifted].
inline bool softmax_rows_shift_vectorizable(const SoftmaxProblem& p) {
  const int w = softmax_vec_width(p);
  return !p.backward && p.inner == 1 && softmax_rows_shift_supported(w, p.in_bytes, p.out_bytes) && p.out_aligned &&
         p.dim_size % w == 0 && !softmax_rows_vectorizable(p) && !softmax_rows_edge_vectorizable(p);
}
inline bool softmax_columns_vectorizable(const SoftmaxProblem& p) {
  return p.aligned && p.inner > 1 && p.inner % softmax_vec_width(p) == 0;
}
inline int softmax_resident_elems(const SoftmaxProblem& p, int vec) {
  return softmax_resident_elems(p.backward, vec, p.out_bytes, p.acc_bytes);
}
// Largest row one block caches (vec: the 128-bit width; scalar: 1).
inline int64_t softmax_block_capacity(const SoftmaxProblem& p, int vec) {
  return int64_t(kResidentMaxThreads) * softmax_resident_elems(p, vec);
}

// The dispatcher's view of a forward call x -> y; a null pointer counts as aligned (a tensor about to be allocated).
inline SoftmaxProblem softmax_forward_problem(const void* x, int in_bytes, const void* y, int out_bytes, int acc_bytes,
                                              int64_t outer, int64_t dim, int64_t inner, int64_t row_stride,
                                              const SoftmaxDeviceProps& dev) {
  SoftmaxProblem p;
  p.outer = outer, p.dim_size = dim, p.inner = inner, p.row_stride = row_stride;
  p.in_bytes = in_bytes, p.out_bytes = out_bytes, p.acc_bytes = acc_bytes;
  const int w = softmax_vec_width(in_bytes, out_bytes);
  p.out_aligned = softmax_ptr_aligned(y, int64_t(w) * out_bytes);
  p.aligned = softmax_ptr_aligned(x, int64_t(w) * in_bytes) && p.out_aligned;
  p.sm_count = dev.sm_count, p.cc_major = dev.cc_major, p.max_cluster = dev.max_cluster;
  p.wide_cluster_threads = dev.wide_cluster_threads, p.l2_bytes = dev.l2_bytes, p.prefetch = dev.prefetch;
  p.memory_depth = dev.memory_depth;
  return p;
}
// ... of a backward call: grad_output and output (out_bytes) -> grad_input (in_bytes), all dense.
inline SoftmaxProblem softmax_backward_problem(const void* grad_output, const void* output, int out_bytes,
                                               const void* grad_input, int in_bytes, int acc_bytes, int64_t outer,
                                               int64_t dim, int64_t inner, const SoftmaxDeviceProps& dev) {
  SoftmaxProblem p = softmax_forward_problem(grad_output, out_bytes, output, out_bytes, acc_bytes, outer, dim, inner,
                                             dim, dev);
  p.in_bytes = in_bytes;
  p.backward = true;
  const int64_t w = softmax_vec_width(in_bytes, out_bytes);
  p.aligned = softmax_ptr_aligned(grad_output, w * out_bytes) && softmax_ptr_aligned(output, w * out_bytes) &&
              softmax_ptr_aligned(grad_input, w * in_bytes);
  p.out_aligned = p.aligned;
  return p;
}

namespace softmax_detail {
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }
inline int64_t pow2_ceil(int64_t a) { int64_t p = 1; while (p < a) p *= 2; return p; }
inline int64_t pow2_floor(int64_t a) { int64_t p = 1; while (p * 2 <= a) p *= 2; return p; }
inline int log2_ceil(int64_t a) { int l = 0; while ((int64_t(1) << l) < a) ++l; return l; }
inline bool clusters_available(const SoftmaxProblem& p) { return p.cc_major >= 9 && p.max_cluster >= 2; }
// Largest cluster of `threads`-thread CTAs: 16 only where such clusters fill the device (wide_cluster_threads),
// unless `any_size` (a last resort, or CTAs known to share SMs).
inline int cluster_cap(const SoftmaxProblem& p, int threads, bool any_size) {
  const int cap = std::min(p.max_cluster, kMaxCluster);
  return cap <= kMaxPortableCluster || any_size || threads <= p.wide_cluster_threads ? cap : kMaxPortableCluster;
}
// Threads the device holds with every SM full (2048 on sm_80 and sm_90; fewer elsewhere only tightens the L2 check).
constexpr int kSmMaxThreads = 2048;
inline int64_t device_threads(const SoftmaxProblem& p) { return int64_t(p.sm_count) * kSmMaxThreads; }
// The two-CTA size of the 128-bit block backward where the probe is missing: nvcc 13.0's for sm_90.
inline int cluster_backward_two_cta_threads(int probed, int out_bytes) {
  return probed > 0 ? probed : out_bytes == 4 ? 576 : 512;
}
}  // namespace softmax_detail

// ---- Preference --------------------------------------------------------------------------------------------------

namespace pref {
enum Pick : uint8_t {
  kVecOverWarp,       // rows the warp kernel holds go to vec
  kVecMaxThreads,     // value: vec's largest CTA where clusters exist (default kVecMaxThreadsWithClusters)
  kTwoPass,           // value: threads to which one unit a thread, else two (block.cuh two-pass backward)
  kOneUnit,           // vec backward of one unit a thread
  kFullCache,         // vec keeps the whole register cache a thread
  kWarpPacked,        // warp forward, several rows a warp
  kWarpSmallBlocks,   // warp forward in kWarpSmallBlockThreads blocks
  kGridOverCluster,   // value: largest CTA of a 16-CTA backward cluster, too large for two an SM, that yields to grid
  kDeepClusters,      // long_row cluster shapes of the deep class
  kLongRowPrefetch,   // value: input / L2 from which the 16-bit shared-memory cluster forward prefetches
  kRawRegsPrefetch,   // ... the shape with a register part besides
  kStridedSmallCtas,  // value: CTA threads of strided cached forwards (whole lines, smallest CTAs first)
  kStridedHalfLines,  // value: largest cluster of half lines, for raw 16-bit rows past one small CTA
  kStridedPrefetch,   // strided cached forward prefetches the tiles ahead
  kStridedShortDThreads,  // value: threads a short-D strided forward of element accesses widens to (default 128)
  kStridedElementCluster,  // value: largest CTA of the 16-column cluster of 16-bit element forwards
  kElementStreamWide,  // element backwards stream at short D too
  kStaged,            // strided element accesses through shared memory (softmax/staged.cuh)
  kStagedVec,         // ... 128-bit backwards whose D-rows start off a 32-byte sector
};
enum Dir : uint8_t { kFwd = 1, kBwd = 2, kEither = 3 };
enum Op : uint8_t { kSoftmax = 1, kLog = 2, kAnyOp = 3 };
enum Types : uint8_t { kF32 = 1, kF64 = 2, k16 = 4, kCast = 8 };  // kCast: 16-bit x / dx, float y / dy
constexpr uint8_t kAnyType = 15;
enum Dev : uint8_t { kAnyDev = 0, kDeep = 1, kSm80 = 2, kSm90 = 4, kClusters = 8 };  // all required
enum Access : uint8_t { kAnyAccess, kVector, kEdges, kElements, kOddUnits };  // kOddUnits: vector, units not 2^n
constexpr int64_t kNoMax = INT64_MAX;

struct Row {
  Pick pick;
  uint8_t dir, op, types, dev, access;
  int64_t d_min, d_max;
  int value;
  const char* name;  // docs/dispatch.md's heading for the row's measurement
  const char* why;
};

constexpr int kVecMaxThreadsWithClusters = 512;  // two CTAs an SM overlap load, reduce and store [vec-512]
constexpr int kStridedRawCtaThreads = 256;       // [strided-small-ctas]
// rows of 16-bit forwards into float that one portable cluster of the shared-memory shape holds (8 x 512 x 64)
constexpr int64_t kCastPortableRow = int64_t(kMaxPortableCluster) * kClusterSmemMaxThreads * 64;

// {pick, direction, op (backwards only), dtype classes, device requirements, access, D from, D to, value, name, why}
inline constexpr Row kPreferences[] = {
    {kVecOverWarp, kBwd, kAnyOp, kF32, kAnyDev, kVector, 512, kNoMax, 1, "vec-bwd-f32",
     "float backwards of aligned rows: vec's block leads warp from 512"},
    {kVecOverWarp, kBwd, kAnyOp, k16 | kCast | kF64, kAnyDev, kVector, 896, kNoMax, 1, "vec-bwd-aligned",
     "aligned backwards: vec leads warp from 896 (crossover 777-888)"},
    {kVecOverWarp, kBwd, kAnyOp, k16, kAnyDev, kEdges, 769, kNoMax, 1, "vec-bwd-edges16",
     "16-bit backwards off the width: vec's 128-bit body beats warp's element loads past 768"},
    {kVecOverWarp, kFwd, kAnyOp, kF32, kDeep, kVector, 512, kNoMax, 1, "vec-fwd-deep-f32",
     "deep memory, float forwards: vec's one-warp block keeps the whole register cache"},
    {kVecOverWarp, kFwd, kAnyOp, kCast, kDeep, kVector, 1024, kNoMax, 1, "vec-fwd-deep-cast",
     "deep memory, 16-bit into float: vec stores whole 512-byte runs"},
    {kWarpPacked, kFwd, kAnyOp, kAnyType, kDeep, kOddUnits, 0, kNoMax, 1, "warp-packed",
     "deep memory: rows of units not a power of two packed several a warp, no idle lanes"},
    {kWarpSmallBlocks, kFwd, kAnyOp, k16, kDeep, kVector, 513, kNoMax, 1, "warp-small-blocks",
     "deep memory, 16-bit rows of 1024 padded: blocks of two warps free SM slots sooner"},
    {kVecMaxThreads, kFwd, kAnyOp, k16, kDeep, kVector, 0, kNoMax, 320, "vec-deep-fwd16",
     "deep memory, 16-bit forwards: clusters of two from 321 threads"},
    {kTwoPass, kBwd, kSoftmax, k16, kSm80 | kDeep, kVector, 2048, 16384, 512, "two-pass",
     "softmax 16-bit backwards: dy and y reloaded from L1 / L2, one unit to 512 threads"},
    {kTwoPass, kBwd, kSoftmax, k16, kSm80, kVector, 2048, 16384, kResidentMaxThreads, "two-pass",
     "softmax 16-bit backwards: dy and y reloaded from L1 / L2 after the all-reduce"},
    {kOneUnit, kBwd, kAnyOp, k16, kDeep, kVector, 0, 4096, 1, "vec-one-unit",
     "deep memory, 16-bit backwards: a kernel of one unit a thread, twice the threads an SM"},
    {kFullCache, kFwd, kAnyOp, kF32, kDeep, kAnyAccess, 0, kNoMax, 1, "vec-full-cache",
     "deep memory: more bytes in flight a thread"},
    {kFullCache, kBwd, kLog, kF32 | k16, kDeep, kAnyAccess, 0, kNoMax, 1, "vec-full-cache",
     "deep memory, log_softmax backwards: more bytes in flight a thread"},
    {kGridOverCluster, kBwd, kAnyOp, kF32 | k16, kDeep, kVector, 0, kNoMax, kResidentMaxThreads, "grid-over-cluster",
     "a 16-CTA backward cluster of one CTA an SM: the grid mode's CTAs run two an SM"},
    {kGridOverCluster, kBwd, kAnyOp, kF32 | k16, kAnyDev, kVector, 0, kNoMax, kResidentMaxThreads - 32,
     "grid-over-cluster", "a 16-CTA backward cluster of one CTA an SM: the grid mode's CTAs run two an SM"},
    {kDeepClusters, kFwd, kAnyOp, kCast, kDeep, kAnyAccess, 0, kCastPortableRow, 0, "cluster-deep-shapes",
     "16-bit into float that a portable shared-memory cluster holds: the standard shapes pair their stores"},
    {kDeepClusters, kEither, kAnyOp, kAnyType, kDeep, kAnyAccess, 0, kNoMax, 1, "cluster-deep-shapes",
     "deep memory: register part as loaded first, small shared-memory CTAs in clusters of 16"},
    {kLongRowPrefetch, kFwd, kAnyOp, k16 | kCast, kAnyDev, kVector, 0, kNoMax, 1, "long-row-prefetch",
     "16-bit slices in shared memory: the rows ahead into L2, on inputs past L2"},
    {kRawRegsPrefetch, kFwd, kAnyOp, k16 | kCast, kDeep, kVector, 0, kNoMax, 4, "long-row-prefetch",
     "deep memory: the register-part shape prefetches too, on inputs past 4 x L2"},
    {kStridedSmallCtas, kFwd, kAnyOp, k16 | kCast, kClusters, kVector, 0, kNoMax, kStridedRawCtaThreads,
     "strided-small-ctas", "raw 16-bit columns: whole lines in CTAs of 256, clusters of small CTAs first"},
    {kStridedSmallCtas, kFwd, kAnyOp, kF32, kClusters | kDeep, kVector, 0, kNoMax, kStridedRawCtaThreads,
     "strided-small-ctas", "deep memory, float columns: the raw rows' whole lines in small CTAs"},
    {kStridedHalfLines, kFwd, kAnyOp, k16 | kCast, kClusters | kDeep, kVector, 0, kNoMax, kMaxPortableCluster,
     "strided-deep-half-lines", "deep memory, raw 16-bit columns past one CTA: half lines, no prefetch"},
    {kStridedPrefetch, kFwd, kAnyOp, kF32 | k16 | kCast, kAnyDev, kVector, 8, kNoMax, 1, "strided-prefetch",
     "cached forwards of 128-bit columns past L2: the tiles ahead into L2"},
    {kStridedShortDThreads, kFwd, kAnyOp, kF32, kAnyDev, kElements, 0, kNoMax, 512, "strided-f32-elements",
     "float element forwards over whole lines: 512-thread tiles"},
    {kStridedElementCluster, kFwd, kAnyOp, k16 | kCast, kClusters, kElements, 0, kNoMax, 320,
     "strided-16-element-cluster", "16-bit element forwards: 16 columns over a cluster of CTAs of <= 320"},
    {kElementStreamWide, kBwd, kAnyOp, kF32 | k16 | kCast, kAnyDev, kElements, 64, kNoMax, 1,
     "strided-element-stream", "element backwards over whole lines stream at short D too"},
    {kStaged, kBwd, kAnyOp, kF32 | k16 | kCast, kSm90, kElements, 64, kNoMax, 1, "strided-staged",
     "element backwards: D-rows copied to shared memory in aligned 16-byte chunks"},
    {kStaged, kFwd, kAnyOp, k16, kSm90, kElements, 64, kNoMax, 1, "strided-staged-fwd",
     "16-bit element forwards: D-rows through shared memory, thread groups a column"},
    {kStagedVec, kBwd, kAnyOp, kF32 | k16, kSm90, kVector, 64, kNoMax, 1, "strided-staged-vec",
     "128-bit backwards whose D-rows start off a 32-byte sector: staged tiles waste fewer sectors"},
};

inline uint8_t type_class(const SoftmaxProblem& p) {
  if (p.acc_bytes == 8) return kF64;
  if (p.in_bytes == p.out_bytes) return p.in_bytes == 4 ? kF32 : p.in_bytes == 2 ? k16 : 0;
  return p.in_bytes == 2 && p.out_bytes == 4 ? kCast : 0;
}
inline uint8_t device_class(const SoftmaxProblem& p) {
  return (p.memory_depth == MemoryDepth::kDeep ? kDeep : 0) | (p.cc_major >= 8 ? kSm80 : 0) |
         (p.cc_major == 9 ? kSm90 : 0) | (softmax_detail::clusters_available(p) ? kClusters : 0);
}
inline bool access_matches(uint8_t a, const SoftmaxProblem& p, int vec, bool edges) {
  const int64_t units = p.dim_size / vec;
  switch (a) {
    case kVector: return vec > 1 && !edges;
    case kEdges: return edges;
    case kElements: return vec == 1 && !edges;
    case kOddUnits: return vec > 1 && !edges && (units & (units - 1)) != 0;
    default: return true;
  }
}
// The row that decides `pick` for `p` accessed `vec` at a time (`edges`: rows off the width), or null.
inline const Row* row_for(Pick pick, const SoftmaxProblem& p, int vec, bool edges = false) {
  const uint8_t dir = p.backward ? kBwd : kFwd, op = p.term_uses_output ? kSoftmax : kLog;
  for (const Row& r : kPreferences) {
    if (r.pick == pick && (r.dir & dir) && (!p.backward || (r.op & op)) && (r.types & type_class(p)) &&
        (r.dev & device_class(p)) == r.dev && access_matches(r.access, p, vec, edges) && p.dim_size >= r.d_min &&
        p.dim_size <= r.d_max)
      return &r;
  }
  return nullptr;
}
// The deciding row's value; 0 where none applies.
inline int prefer(Pick pick, const SoftmaxProblem& p, int vec, bool edges = false) {
  const Row* r = row_for(pick, p, vec, edges);
  return r ? r->value : 0;
}
}  // namespace pref

// ---- Planning ----------------------------------------------------------------------------------------------------

namespace softmax_detail {
using namespace pref;

// Search orders and shape constants (docs/dispatch.md, under each name).
constexpr int kVecForwardAccesses = 4, kVecBackwardAccesses = 2;  // 128-bit accesses a vec thread aims at [vec-accesses]
constexpr int kClusterThreads[] = {256, 512, kResidentMaxThreads};  // cluster CTAs, small first [cluster-order]
constexpr int kClusterBackwardMinThreads = 512;
constexpr int kDeepClusterWideThreads = 256;  // deep: shared-memory CTAs up to this take 16-CTA clusters early
constexpr int kDeepClusterRawThreads[] = {128, 256, 512};  // deep: the register-part CTAs, tried first
constexpr int kDeepClusterRawMinThreads = 128;
constexpr int kGridThreads[] = {512, kResidentMaxThreads};  // grid CTAs: two an SM first
// split [split]: CTAs an SM a launch, shortest chunk, most chunks a row (K^2 parking traffic), L2 reuse share, most
// launch pairs a call.
constexpr int kSplitCtasPerSm = 4, kL2ReuseDivisor = 3;
constexpr int64_t kSplitMinChunk = 2048, kSplitMaxChunks = 64, kSplitMaxGroups = 128;
// strided [strided-shapes]: a D-row's line, small-CTA floor, streaming CTA, the single-CTA cap with clusters, half
// lines, the narrowest element tile, DRAM sector.
constexpr int kStridedRowBytes = 128, kStridedMinThreads = 128, kStridedStreamThreads = 512;
constexpr int kStridedClusterAbove = 512, kStridedMinRowBytes = 64, kStridedMinElementColumns = 16;
constexpr int kStridedSectorBytes = 32, kStridedWholeOuterUnits = 128;
constexpr int kStridedRawClusterThreads[] = {256, kStridedClusterAbove, kStridedMaxThreads};
// element backwards, streamed [strided-element-stream]: a thread's share of its column, CTAs tried.
constexpr int64_t kStridedElementStreamBytes = 64;
constexpr int kStridedElementStreamThreads[] = {512, 1024};
constexpr int kStridedElementStreamWideThreads = 256, kStridedElementStreamWideLines = 2;
constexpr int kStridedSplitMinRows = 16, kStridedSplitWaves = 1;  // [strided-split]
// staged [strided-staged]: tile widths and the D-tables.
constexpr int kStridedStagedRowBytes = 512, kStridedStagedMinRowBytes = 256, kStridedStagedForwardMinRowBytes = 64;
constexpr int kStridedStagedCtasPerSm = 2;
constexpr int64_t kStridedStagedVecBackwardColumns = 64;
constexpr int kStridedStagedVecBackwardGroups = 2;
struct StagedTile { int64_t max_dim; int row_bytes, groups; };  // for D up to max_dim; row_bytes 0: not staged
constexpr StagedTile kStagedNarrowBackward[] = {{kNoMax, 128, 2}, {kNoMax, 64, 4}, {kNoMax, 64, 2}, {kNoMax, 64, 1}};
constexpr StagedTile kStagedVec16Backward[] = {{95, 256, 1}, {128, 128, 2}, {299, 0, 0}, {398, 128, 4}, {400, 128, 2}};
constexpr StagedTile kStagedForward[] = {{79, 256, 2}, {111, 128, 2}, {143, 128, 4}, {256, 64, 4}};
template <size_t N>
const StagedTile* staged_tile(const StagedTile (&table)[N], int64_t dim) {
  for (const StagedTile& t : table) if (dim <= t.max_dim) return &t;
  return nullptr;
}

inline bool softmax_cluster_smem_eligible(const SoftmaxProblem& p, int vec) {
  return !p.backward && softmax_cluster_smem_supported(vec, p.in_bytes, p.acc_bytes);
}

// vec and scalar: a block a row, the row in registers; vec aims at fewer accesses a thread within 512 threads.
inline SoftmaxPlan plan_block(const SoftmaxProblem& p, SoftmaxVariant v, int vec, bool edges = false) {
  SoftmaxPlan s;
  s.variant = v, s.mode = SoftmaxMode::kResident, s.vec = vec, s.edges = edges;
  s.elems_per_thread = softmax_resident_elems(p, vec);
  s.threads = int(round_up(ceil_div(p.dim_size, s.elems_per_thread), 32));
  if (v != SoftmaxVariant::kVec) return s;
  const int e = (p.backward ? kVecBackwardAccesses : kVecForwardAccesses) * vec;
  const int64_t t = round_up(ceil_div(p.dim_size, e), 32);
  if (e < s.elems_per_thread && t <= kVecMaxThreadsWithClusters) {
    if (prefer(kFullCache, p, vec, edges)) s.full_cache = true;
    else s.elems_per_thread = e, s.threads = int(t);
  }
  const int64_t rows_vec = softmax_rows_vectorizable(p) ? vec : 1;
  if (const int one_unit_threads = prefer(kTwoPass, p, rows_vec, edges)) {
    s.two_pass = true;
    s.elems_per_thread = (p.dim_size <= int64_t(one_unit_threads) * vec ? 1 : 2) * vec;
    s.threads = int(round_up(ceil_div(p.dim_size, s.elems_per_thread), 32));
  } else if (prefer(kOneUnit, p, rows_vec, edges)) {
    s.one_unit = true, s.full_cache = false, s.elems_per_thread = vec;
    s.threads = int(round_up(ceil_div(p.dim_size, vec), 32));
  }
  return s;
}

// The most threads a vec CTA takes where clusters exist; longer rows go to long_row.
inline int softmax_vec_max_threads(const SoftmaxProblem& p) {
  const int v = prefer(kVecMaxThreads, p, softmax_rows_vectorizable(p) ? softmax_vec_width(p) : 1);
  return v ? v : kVecMaxThreadsWithClusters;
}

// Whether a long_row cluster forward prefetches the rows ahead into L2.
inline bool long_row_prefetches(const SoftmaxProblem& p, int vec, bool smem_slice, bool raw_regs) {
  if (!p.prefetch || !smem_slice) return false;
  const int multiple = prefer(raw_regs ? kRawRegsPrefetch : kLongRowPrefetch, p, vec);
  return multiple > 0 && p.outer * p.dim_size * p.in_bytes >= multiple * p.l2_bytes;
}

// The row over a cluster; false where no cluster the device takes caches it. Shapes in the order tried (threads,
// part of the slice in shared memory, a register part as loaded besides): register-only CTAs small first; the
// shared-memory CTAs (at most kClusterSmemMaxThreads) in place of larger ones; the register-part shapes last, or
// first of the shared-memory ones on the deep class. Clusters that fill the device first, then any (last resort).
inline bool plan_cluster(const SoftmaxProblem& p, int vec, bool edges, SoftmaxPlan* out) {
  if (!clusters_available(p)) return false;
  const bool with_smem = !edges && softmax_cluster_smem_eligible(p, vec);
  const bool raw = softmax_resident_raw(p.backward, vec, p.in_bytes, p.acc_bytes);
  const int reg_e = raw ? softmax_resident_raw_elems(p.in_bytes) : softmax_resident_elems(p, vec);
  const int smem_e = with_smem ? softmax_cluster_smem_elems(p.in_bytes) : 0;
  const int smem_total = with_smem ? softmax_cluster_smem_reg_elems(p.in_bytes, p.acc_bytes) + smem_e : 0;
  const bool raw_regs = with_smem && softmax_cluster_smem_raw_regs(p.backward, vec, p.in_bytes, p.acc_bytes);
  const bool deep = prefer(kDeepClusters, p, vec, edges) != 0;
  struct Shape { int threads; bool smem, raw_regs; } shapes[12];
  int n = 0;
  for (int t : kClusterThreads)
    if ((!p.backward || t >= kClusterBackwardMinThreads) && (!with_smem || t < kClusterSmemMaxThreads))
      shapes[n++] = {t, false, false};
  if (raw_regs && deep) for (int t : kDeepClusterRawThreads) shapes[n++] = {t, true, true};
  if (with_smem) for (int t : kClusterThreads) if (t <= kClusterSmemMaxThreads) shapes[n++] = {t, true, false};
  if (raw_regs && !deep) for (int t : kClusterThreads) if (t <= kClusterSmemMaxThreads) shapes[n++] = {t, true, true};
  for (bool last_resort : {false, true}) {
    for (int i = 0; i < n; ++i) {
      const Shape& sh = shapes[i];
      const int e = sh.raw_regs ? reg_e + smem_e : sh.smem ? smem_total : reg_e;
      const int64_t s = std::max<int64_t>(2, pow2_ceil(ceil_div(p.dim_size, int64_t(sh.threads) * e)));
      if (s > cluster_cap(p, sh.threads, last_resort || (deep && sh.smem && sh.threads <= kDeepClusterWideThreads)))
        continue;
      // raw register CTAs stop at portable clusters where the shared-memory CTAs can take the row
      if (raw && with_smem && !sh.smem && s > kMaxPortableCluster) continue;
      if (sh.raw_regs && !last_resort && !deep) continue;  // the register-part shapes: only where no other takes it
      const int64_t threads = ceil_div(ceil_div(p.dim_size, s), e);  // the fewest that cache the row over s CTAs
      if (sh.raw_regs && deep && threads < kDeepClusterRawMinThreads) continue;
      SoftmaxPlan plan;
      plan.variant = SoftmaxVariant::kLongRow, plan.mode = SoftmaxMode::kResident, plan.vec = vec;
      plan.edges = edges, plan.raw = raw && (!sh.smem || sh.raw_regs), plan.elems_per_thread = e;
      plan.smem_elems = sh.smem ? smem_e : 0, plan.prefetch = long_row_prefetches(p, vec, sh.smem, sh.raw_regs);
      plan.cluster = int(s), plan.threads = int(round_up(threads, 32));
      *out = plan;
      return true;
    }
  }
  return false;
}

// split: online max+sum per chunk, then a write pass; several CTAs a row where rows are few, rows grouped so that
// the second read hits L2; the partials parked in the output's own memory.
inline SoftmaxPlan plan_split(const SoftmaxProblem& p, SoftmaxVariant v, int vec, bool one_block_per_row) {
  SoftmaxPlan s;
  s.variant = v, s.mode = SoftmaxMode::kSplit, s.vec = vec, s.threads = kSplitThreads, s.group_rows = p.outer;
  const int64_t d = p.dim_size, row_bytes = d * (p.backward ? 2 * p.out_bytes : p.in_bytes);
  int64_t group = std::min(std::max<int64_t>(1, p.l2_bytes / kL2ReuseDivisor / std::max<int64_t>(row_bytes, 1)), p.outer);
  if (ceil_div(p.outer, group) > kSplitMaxGroups) group = ceil_div(p.outer, kSplitMaxGroups);
  int64_t k = std::min({ceil_div(int64_t(kSplitCtasPerSm) * p.sm_count, group), kSplitMaxChunks, d / kSplitMinChunk});
  // each chunk's output bytes hold 16 bytes of alignment slack plus the K parked partials
  const int64_t dst_bytes = p.backward ? p.in_bytes : p.out_bytes, units = d / vec;
  while (k > 1 && (units / k) * vec * dst_bytes < int64_t(kSplitSlotBytes) * (k + 1)) --k;
  if (!one_block_per_row && k >= 2) s.chunks = k, s.group_rows = group;
  return s;
}

// grid: the row over CTAs anywhere on the device, partials through a zeroed workspace; every CTA of a row resident
// at once (at most sm_count). `forced`: at least two CTAs, so that short rows exchange too.
inline bool plan_grid(const SoftmaxProblem& p, SoftmaxVariant v, int vec, bool forced, SoftmaxPlan* out) {
  if (!p.workspace || p.inner != 1 || p.sm_count < 2) return false;
  int e = softmax_resident_elems(p, vec), smem_e = 0, max_threads = kResidentMaxThreads;
  if (!p.backward && softmax_cluster_smem_eligible(p, vec)) {
    smem_e = softmax_cluster_smem_elems(p.in_bytes);
    e = softmax_cluster_smem_reg_elems(p.in_bytes, p.acc_bytes) + smem_e, max_threads = kClusterSmemMaxThreads;
  } else if (p.backward && softmax_grid_bwd_smem_elems(vec, p.out_bytes) > 0) {
    smem_e = softmax_grid_bwd_smem_elems(vec, p.out_bytes), e += smem_e, max_threads = kGridBwdSmemMaxThreads;
  }
  for (int t : kGridThreads) {
    if (t > max_threads) break;
    const int64_t g = std::max<int64_t>(forced ? 2 : 1, ceil_div(p.dim_size, int64_t(t) * e));
    if (g > p.sm_count || p.outer * g > kMaxGridBlocks) continue;
    SoftmaxPlan s;
    s.variant = v, s.mode = SoftmaxMode::kGrid, s.vec = vec, s.elems_per_thread = e, s.smem_elems = smem_e;
    s.chunks = g, s.threads = int(round_up(ceil_div(ceil_div(p.dim_size, g), e), 32));
    *out = s;
    return true;
  }
  return false;
}

// A long_row backward cluster of 16 CTAs too large for two an SM gives way to the grid mode.
inline bool cluster_backward_yields_to_grid(const SoftmaxProblem& p, const SoftmaxPlan& s) {
  const int most = prefer(kGridOverCluster, p, s.vec, s.edges);
  return most > 0 && s.cluster > kMaxPortableCluster && s.threads <= most &&
         s.threads > cluster_backward_two_cta_threads(p.bwd_two_cta_threads, p.out_bytes);
}

// strided: a tile's line, 128 bytes of a D-row, within one outer index's column vectors, a power of two.
inline int64_t strided_line_columns(const SoftmaxProblem& p, int vec) {
  const int64_t c = std::max<int64_t>(1, kStridedRowBytes / (int64_t(vec) * (p.backward ? p.out_bytes : p.in_bytes)));
  return std::min(c, pow2_floor(p.inner / vec));
}

struct StridedStreamShape { int threads = 0, columns = 0, cluster = 1; };

// The streamed shape of an element backward: each thread's share of its column (ceil(D / D-groups) D-rows of dy and
// of y) closest to kStridedElementStreamBytes, then columns nearest 32, then the first tried (no cluster first,
// narrow columns first, `wide`: 256-thread CTAs and two lines too; then clusters, small first). Only shapes whose
// tiles in flight fit L2 with every SM full; none: false.
inline bool strided_element_stream_shape(const SoftmaxProblem& p, int64_t line, bool wide, StridedStreamShape* out) {
  const int64_t target = kStridedElementStreamBytes, wide_cap = pow2_floor(p.inner);
  const int64_t widest = !wide ? line : std::min(line * kStridedElementStreamWideLines, wide_cap);
  const int64_t narrowest = std::min<int64_t>(line, kStridedMinElementColumns);
  int64_t best_hi = 0, best_lo = 1, best_dist = 0;
  bool found = false;
  auto consider = [&](int cl, int64_t cols, int threads) {
    if (cols > threads) return;
    const int64_t groups = int64_t(threads / cols) * cl;
    if (cl > 1 && groups > p.dim_size) return;
    const int64_t bytes = ceil_div(p.dim_size, groups) * p.out_bytes;
    if (device_threads(p) * bytes * 2 > p.l2_bytes) return;
    const int64_t hi = std::max(bytes, target), lo = std::min(bytes, target), dist = std::abs(log2_ceil(cols) - 5);
    if (!found || hi * best_lo < best_hi * lo || (hi * best_lo == best_hi * lo && dist < best_dist)) {
      found = true, best_hi = hi, best_lo = lo, best_dist = dist;
      if (out) *out = {threads, int(cols), cl};
    }
  };
  for (int64_t cols = narrowest; cols <= widest; cols *= 2) {
    if (wide) consider(1, cols, kStridedElementStreamWideThreads);
    for (int threads : kStridedElementStreamThreads) consider(1, cols, threads);
  }
  if (clusters_available(p))
    for (int threads : kStridedElementStreamThreads)
      for (int cl = 2; cl <= cluster_cap(p, threads, false); cl *= 2)
        for (int64_t cols = narrowest; cols <= line; cols *= 2) consider(cl, cols, threads);
  return found;
}

struct StagedShape { int64_t columns = 0; int groups = 1; };  // columns 0: not staged

// The staged tile, where a kStaged / kStagedVec row applies. Width W: the 128-bit backward off a sector, float 64
// columns x 2 groups, 16-bit kStagedVec16Backward; element backwards the widest power of two of <= 512 bytes a D-row
// whose two arrays fit, if >= 256 bytes, else (16-bit) kStagedNarrowBackward; forwards kStagedForward, past it the
// widest of 256 / 128 / 64 bytes that fits with 256 / W groups. W at most the inner's largest power of two; the
// inner's tiles evened out (to 16-byte chunks); enough tiles for two CTAs on every SM.
inline StagedShape strided_staged_shape(const SoftmaxProblem& p, int vec) {
  if (!prefer(vec == 1 ? kStaged : kStagedVec, p, vec)) return {};
  const int bytes = p.backward ? p.out_bytes : p.in_bytes;  // what is staged: dy and y, or x
  const int64_t cap = pow2_floor(p.inner);
  int64_t w = 0;
  int groups = 1;
  auto fits_bwd = [&](int64_t cols, int g) {
    return softmax_strided_staged_backward_smem_bytes(p.dim_size, cols, bytes, g) <= kStridedStagedMaxSmem;
  };
  if (vec != 1) {
    if (p.inner * p.out_bytes % kStridedSectorBytes == 0) return {};  // D-rows on a sector: the cached plan
    const StagedTile* t = p.out_bytes == 4 ? nullptr : staged_tile(kStagedVec16Backward, p.dim_size);
    if (p.out_bytes == 4) w = kStridedStagedVecBackwardColumns, groups = kStridedStagedVecBackwardGroups;
    else if (t == nullptr || t->row_bytes == 0) return {};
    else w = t->row_bytes / bytes, groups = t->groups;
    if (!fits_bwd(w, groups)) return {};
  } else if (p.backward) {
    w = std::min<int64_t>(kStridedStagedRowBytes / bytes, cap);
    while (w * bytes >= kStridedStagedMinRowBytes && !fits_bwd(w, 1)) w /= 2;
    if (w * bytes < kStridedStagedMinRowBytes) {  // 16-bit, stopped by shared memory: the narrow tiles
      if (bytes != 2 || fits_bwd(kStridedStagedMinRowBytes / bytes, 1)) return {};
      w = 0;
      for (const StagedTile& n : kStagedNarrowBackward)
        if (fits_bwd(n.row_bytes / bytes, n.groups)) { w = n.row_bytes / bytes, groups = n.groups; break; }
      if (w == 0) return {};
    }
  } else if (const StagedTile* t = staged_tile(kStagedForward, p.dim_size)) {
    w = t->row_bytes / bytes, groups = t->groups;
  } else {
    for (w = 256 / bytes; w * bytes >= kStridedStagedForwardMinRowBytes; w /= 2) {
      groups = int(kStridedStagedThreads / w);
      if (softmax_strided_staged_forward_smem_bytes(p.dim_size, w, bytes, groups) <= kStridedStagedForwardMaxSmem)
        break;
    }
    if (w * bytes < kStridedStagedForwardMinRowBytes) return {};
  }
  if (w > cap) return {};
  const int64_t cols = round_up(ceil_div(p.inner, ceil_div(p.inner, w)), kStridedStagedChunkBytes / bytes);
  if (softmax_strided_staged_tiles(p.outer, p.inner, cols) < int64_t(kStridedStagedCtasPerSm) * p.sm_count) return {};
  return {cols, groups};
}

// Whether a cached strided forward prefetches the tiles ahead into L2.
inline bool strided_prefetches(const SoftmaxProblem& p, int vec) {
  return p.prefetch && prefer(kStridedPrefetch, p, vec) && p.outer * p.dim_size * p.inner * p.in_bytes >= p.l2_bytes;
}

// strided: threads along inner (128-bit column vectors where aligned), D split over threads with a shared-memory
// combine, the tile cached in registers (over a cluster for long D); D too long: streamed twice (over a cluster, or
// D cut into chunks through the workspace, where the tiles leave the device short of threads). Element accesses at
// short D (and 16-bit forwards, and 128-bit backwards off a sector): staged.
inline SoftmaxPlan plan_strided(const SoftmaxProblem& p) {
  SoftmaxPlan s;
  s.variant = SoftmaxVariant::kStrided, s.mode = SoftmaxMode::kStrided;
  s.vec = softmax_columns_vectorizable(p) ? softmax_vec_width(p) : 1;
  const int kv = softmax_strided_rows(p.backward, s.vec, p.in_bytes, p.out_bytes, p.acc_bytes);  // D-rows a thread
  s.elems_per_thread = kv * s.vec;
  const int load_bytes = p.backward ? p.out_bytes : p.in_bytes;
  const int64_t inner_units = p.inner / s.vec, total_cols = p.outer * inner_units, d = p.dim_size;
  const int64_t c_line = strided_line_columns(p, s.vec), g_needed = ceil_div(d, kv);  // D-groups that cache a column
  int64_t c = c_line;
  const bool elements = s.vec == 1, clusters = clusters_available(p);
  auto smem_ok = [&](int64_t threads, int64_t cols, int64_t cluster, bool streaming) {
    const int value_bytes = softmax_strided_value_bytes(p.backward, streaming, p.acc_bytes);
    return softmax_strided_smem_bytes(threads, cols, s.vec, cluster, value_bytes) <= kStridedMaxSmem;
  };
  auto threads_for = [](int64_t cols, int64_t groups) { return round_up(cols * groups, std::max<int64_t>(cols, 32)); };
  const int single_cap = clusters ? kStridedClusterAbove : kStridedMaxThreads;
  auto streamed = [&](int64_t cols, int64_t threads, int cl) {
    s.columns = int(cols), s.threads = int(threads), s.cluster = cl, s.streaming = true;
    return s;
  };
  auto stream = [&] {  // whole lines (or whole outer indices), over a cluster or split where the device is short
    const bool whole = inner_units % c_line != 0 && inner_units <= kStridedWholeOuterUnits &&
                       smem_ok(kStridedStreamThreads, inner_units, 1, true);
    const int64_t cols = whole ? inner_units : c_line;
    const int64_t threads = whole ? kStridedStreamThreads : threads_for(c_line, ceil_div(kStridedStreamThreads, c_line));
    const int64_t tiles = softmax_strided_tiles(p.outer, p.inner, s.vec, cols);
    int cl = 1;
    if (clusters)  // the smallest cluster that fills the device, leaving every CTA a D-row a thread
      while (cl < cluster_cap(p, int(threads), false) && tiles * threads * cl < device_threads(p) &&
             int64_t(cl) * 2 * (threads / cols) <= d)
        cl *= 2;
    while (cl > 1 && !smem_ok(threads, cols, cl, true)) cl /= 2;
    if (p.workspace && p.sm_count > 0 && tiles > 0 && tiles * threads * cl < device_threads(p)) {
      const int64_t chunks = std::min(ceil_div(kStridedSplitWaves * device_threads(p), tiles * threads),
                                      d / (int64_t(kStridedSplitMinRows) * (threads / cols)));
      if (chunks >= 2 && smem_ok(threads, cols, 1, true)) {
        streamed(cols, threads, 1);
        s.chunks = chunks;
        s.workspace_bytes = tiles * chunks * cols * s.vec * softmax_strided_value_bytes(p.backward, true, p.acc_bytes);
        return s;
      }
    }
    return streamed(cols, threads, cl);
  };
  const int small_cap = prefer(kStridedSmallCtas, p, s.vec);  // raw 16-bit rows; the deep class's float forwards
  const int half_cluster = prefer(kStridedHalfLines, p, s.vec);
  const bool half_lines = half_cluster > 0 && c * s.vec * load_bytes == kStridedRowBytes && c * g_needed > small_cap &&
                          pow2_ceil(ceil_div(c / 2 * g_needed, small_cap)) <=
                              std::min(half_cluster, cluster_cap(p, small_cap, false));
  const int cta_cap = small_cap ? small_cap : single_cap;
  auto cached = [&](int64_t cols, int64_t cl, int64_t threads) {
    s.columns = int(cols), s.cluster = int(cl), s.threads = int(threads), s.streaming = false;
    s.prefetch = strided_prefetches(p, s.vec) && !half_lines;
    return s;
  };
  if (const StagedShape staged = strided_staged_shape(p, s.vec); staged.columns > 0) {
    s.vec = 1, s.columns = int(staged.columns), s.groups = staged.groups, s.threads = kStridedStagedThreads;
    s.staged = true, s.elems_per_thread = 0;
    return s;
  }
  if (elements && p.backward) {  // streamed where a shape's tiles fit L2: past one CTA, or at any D where wide
    const bool wide = prefer(kElementStreamWide, p, 1) && c_line * p.out_bytes == kStridedRowBytes;
    StridedStreamShape e;
    if ((wide || c * g_needed > single_cap) && strided_element_stream_shape(p, c_line, wide, &e) &&
        smem_ok(e.threads, e.columns, e.cluster, true))
      return streamed(e.columns, e.threads, e.cluster);
  }
  const bool whole_line = c_line * load_bytes == kStridedRowBytes;
  if (half_lines) c /= 2;
  if (c * g_needed > cta_cap && !small_cap && clusters) {
    // narrower lines in one CTA rather than a cluster (64 bytes; element accesses down to 16 columns)
    int64_t h = c;
    while (h * g_needed > kStridedClusterAbove &&
           (h / 2 * s.vec * load_bytes >= kStridedMinRowBytes || (elements && h / 2 >= kStridedMinElementColumns)))
      h /= 2;
    if (h * g_needed <= kStridedClusterAbove) c = h;
    const int elem_cta = prefer(kStridedElementCluster, p, s.vec);
    if (elem_cta && whole_line && h * g_needed > kStridedClusterAbove && h == kStridedMinElementColumns) {
      for (int64_t cl = 2; cl <= std::min(cluster_cap(p, elem_cta, false), kMaxPortableCluster); cl *= 2) {
        const int64_t threads = threads_for(h, ceil_div(g_needed, cl));
        if (threads <= elem_cta && smem_ok(threads, h, cl, false)) return cached(h, cl, threads);
      }
    }
  }
  if (c * g_needed <= cta_cap) {  // short D: widen the tile until a block has enough threads
    const int wide_threads = whole_line ? prefer(kStridedShortDThreads, p, s.vec) : 0;
    const int64_t min_threads = wide_threads ? wide_threads : kStridedMinThreads;
    while (c * 2 * g_needed <= min_threads && c * 2 <= pow2_ceil(total_cols) &&
           smem_ok(threads_for(c * 2, g_needed), c * 2, 1, false))
      c *= 2;
    return cached(c, 1, threads_for(c, g_needed));
  }
  if (!clusters) return stream();
  for (int t : kStridedRawClusterThreads) {
    if (!small_cap && t < kStridedClusterAbove) continue;
    const int64_t cl = pow2_ceil(ceil_div(c * g_needed, t));
    if (cl > cluster_cap(p, t, false)) continue;
    const int64_t threads = threads_for(c, ceil_div(g_needed, cl));
    if (smem_ok(threads, c, cl, false)) return cached(c, cl, threads);
  }
  if (elements && p.backward) return stream();
  // D too long for those: narrower tiles (down to a sector, 16 element columns) over the largest cluster
  const int64_t groups = ceil_div(g_needed, cluster_cap(p, kStridedClusterAbove, true));
  int64_t n = c_line;
  while (n > 1 && n * groups > kStridedClusterAbove) n /= 2;
  if (n * groups <= kStridedClusterAbove && n * s.vec * load_bytes >= kStridedSectorBytes &&
      (!elements || n >= kStridedMinElementColumns)) {
    const int64_t cl = pow2_ceil(ceil_div(n * g_needed, kStridedClusterAbove));
    const int64_t threads = threads_for(n, ceil_div(g_needed, cl));
    if (smem_ok(threads, n, cl, false)) return cached(n, cl, threads);
  }
  return stream();
}

}  // namespace softmax_detail

// nullptr if `v` can run `p`, else why not.
inline const char* softmax_variant_rejects(SoftmaxVariant v, const SoftmaxProblem& p) {
  const bool rows = p.inner == 1;
  if (v == SoftmaxVariant::kAuto) return nullptr;
  if (v == SoftmaxVariant::kStrided)
    return rows ? "inner == 1 (the softmax dim is contiguous); 'warp', 'vec', 'scalar', 'long_row', 'split' and 'grid' "
                  "take it"
                : nullptr;
  if (!rows) return "inner > 1 (the softmax dim is not the innermost in memory); only 'strided' takes it";
  const int w = softmax_vec_width(p);
  if (v == SoftmaxVariant::kWarp && p.dim_size > softmax_warp_max_dim(p.acc_bytes))
    return "D exceeds the warp variant's limit (1024 elements; 512 for float64)";
  if (v == SoftmaxVariant::kVec && !softmax_rows_vectorizable(p) && !softmax_rows_edge_vectorizable(p) &&
      !softmax_rows_shift_vectorizable(p))
    return "it needs 16-byte aligned pointers and an input row stride equal to the row length modulo the 128-bit "
           "vector width, so that every tensor's rows start at the same offset from that alignment (or, forward, "
           "16-bit rows the vector width divides into an aligned output) ('scalar' takes any layout)";
  if (v == SoftmaxVariant::kVec && p.dim_size > softmax_block_capacity(p, w))
    return "the row does not fit one block's registers (1024 threads x 32 elements forward, x 8-32 backward); "
           "'long_row' takes it";
  SoftmaxPlan s;
  if (v == SoftmaxVariant::kGrid && !p.workspace) return "it needs a workspace from the caller (the torch ops provide one)";
  if (v == SoftmaxVariant::kGrid &&
      !softmax_detail::plan_grid(p, v, softmax_rows_vectorizable(p) ? w : 1, true, &s))
    return "the row is longer than one CTA an SM caches ('long_row' and 'split' take it)";
  return nullptr;
}

// The launch plan of variant `v` (not kAuto) on `p`; `v` must not reject `p`.
inline SoftmaxPlan plan_softmax(SoftmaxVariant v, const SoftmaxProblem& p) {
  using namespace softmax_detail;
  const int w = softmax_vec_width(p), row_vec = softmax_rows_vectorizable(p) ? w : 1;
  const bool edges = softmax_rows_edge_vectorizable(p);  // D % w != 0, so row_vec == 1
  SoftmaxPlan s;
  switch (v) {
    case SoftmaxVariant::kWarp:
      s.variant = v, s.mode = SoftmaxMode::kWarp, s.vec = row_vec, s.warp_log2 = log2_ceil(p.dim_size);
      s.threads = prefer(kWarpSmallBlocks, p, s.vec) &&
                          softmax_warp_small_blockable(s.warp_log2, s.vec, p.in_bytes, p.out_bytes)
                      ? kWarpSmallBlockThreads
                      : kWarpBlockThreads;
      s.packed = softmax_warp_packable(s.warp_log2, s.vec) && prefer(kWarpPacked, p, s.vec);
      s.elems_per_thread = softmax_warp_elems_per_thread(s.warp_log2, s.vec, p.backward, p.out_bytes, s.packed);
      return s;
    case SoftmaxVariant::kVec:
      s = plan_block(p, v, w, edges);
      s.shifted = softmax_rows_shift_vectorizable(p);
      return s;
    case SoftmaxVariant::kScalar:
      return p.dim_size <= softmax_block_capacity(p, 1) ? plan_block(p, v, 1) : plan_split(p, v, 1, true);
    case SoftmaxVariant::kLongRow: {
      SoftmaxPlan g;
      if (plan_cluster(p, edges ? w : row_vec, edges, &s))
        return cluster_backward_yields_to_grid(p, s) && plan_grid(p, v, row_vec, false, &g) ? g : s;
      return plan_grid(p, v, row_vec, false, &s) ? s : plan_split(p, v, row_vec, false);
    }
    case SoftmaxVariant::kGrid:
      return plan_grid(p, v, row_vec, true, &s) ? s : SoftmaxPlan{};
    case SoftmaxVariant::kSplit: return plan_split(p, v, row_vec, false);
    case SoftmaxVariant::kStrided: return plan_strided(p);
    case SoftmaxVariant::kAuto: break;
  }
  return SoftmaxPlan{};
}

// The dispatcher: strided for inner > 1; warp for rows it holds (unless a kVecOverWarp row says vec); vec (aligned)
// or scalar for rows one block caches; long_row beyond.
inline SoftmaxPlan choose_softmax(const SoftmaxProblem& p) {
  using namespace softmax_detail;
  if (p.inner > 1) return plan_softmax(SoftmaxVariant::kStrided, p);
  const int w = softmax_vec_width(p);
  if (p.dim_size <= softmax_warp_max_dim(p.acc_bytes) &&
      !prefer(kVecOverWarp, p, softmax_rows_vectorizable(p) ? w : 1, softmax_rows_edge_vectorizable(p)))
    return plan_softmax(SoftmaxVariant::kWarp, p);
  const bool vectorizable =
      softmax_rows_vectorizable(p) || softmax_rows_edge_vectorizable(p) || softmax_rows_shift_vectorizable(p);
  const int64_t elems = softmax_resident_elems(p, vectorizable ? w : 1);
  if (p.dim_size <= (clusters_available(p) ? softmax_vec_max_threads(p) : kResidentMaxThreads) * elems)
    return plan_softmax(vectorizable ? SoftmaxVariant::kVec : SoftmaxVariant::kScalar, p);
  return plan_softmax(SoftmaxVariant::kLongRow, p);
}

// The workspace the launcher needs for `s` on `outer` rows (0: none): grid plans (zeroed), strided split plans.
inline bool softmax_workspace_zeroed(const SoftmaxPlan& s) { return s.mode == SoftmaxMode::kGrid; }
inline int64_t softmax_workspace_bytes(const SoftmaxPlan& s, int64_t outer) {
  if (s.mode == SoftmaxMode::kStrided) return s.workspace_bytes;
  return s.mode == SoftmaxMode::kGrid ? softmax_grid_workspace(outer, s.chunks).bytes : 0;
}

}  // namespace fastact

#include "fastact/dispatch_explain.h"  // explain's text, for the callers that print plans
