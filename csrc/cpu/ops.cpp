// The CPU kernels of every fastact op, as torch sees them: argument checks and layout planning
// (csrc/common.h), dtype dispatch, and the call into the kernel table of the instruction set in
// use (csrc/cpu/kernels.h). Also the threading layer of csrc/cpu/parallel.h (oneTBB).
#include "common.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "pointwise_ops.h"
#include "fastact/dispatch.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <tuple>

namespace fastact::cpu {

// ---------------------------------------------------------------------------------------------
// Threads.
//
// fork(). oneTBB supports fork() only while it has no worker threads (its state in the child still
// counts the parent's workers, which the child does not have, and may hold locks that threads of
// the parent held at the fork). A child that uses that state runs on its calling thread alone (the
// "woken" workers do not exist), or hangs in task_arena::execute when another thread of the parent
// was inside the arena at the fork (its arena slot stays taken in the child). The workers cannot be
// shut down before the fork either: tbb::finalize (task_scheduler_handle) waits for them only once
// no other thread holds a reference to the scheduler, and every thread that has ever called into
// oneTBB (task_arena::execute, enqueue or initialize: each registers its caller) holds one until it
// exits; a Python thread that ran a fastact op is alive at the fork more often than not (finalize
// then returns false). Nor can the child fall back on ATen's pool: GNU OpenMP hangs in a child
// forked after the forking thread ran a parallel region (torch's own ops do too, which is why
// DataLoader workers run at one thread).
//
// So a process forked after this one had started oneTBB never calls into oneTBB again (a
// pthread_atfork child handler marks it, inherited by its own children): its parallel regions run
// on ForkedPool below, plain threads of its own started on first use, with the same chunks (the
// kernels' results do not depend on the chunks, so the bits are the same too). Such a pool is
// itself dropped, not used, at a further fork, for the same reasons. A process that forks before
// its first parallel fastact op keeps oneTBB in the child.

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::atomic<bool> g_tbb_started{false};  // this process (or its parent) has created an arena
std::atomic<bool> g_forked{false};       // forked after g_tbb_started: oneTBB is not to be touched

// The parallel region the calling thread is running chunks of (ForkedPool's workers and callers), if
// any: a parallel_for inside stays on the thread, as inside an ATen parallel region.
thread_local bool t_in_pool = false;

// Threads of a forked process (see above). run() hands the chunks of one parallel_for to up to
// threads - 1 workers and the calling thread, which take them in order from a shared counter (so a
// worker that wakes late takes what is left, as with the arena's stealing). One parallel_for at a
// time; a second caller waits for the first. Workers are started when first needed, then sleep on
// a condition variable between jobs; they are never joined (the process exits with them asleep).
class ForkedPool {
 public:
  void run(int threads, int64_t chunks, int64_t n, const void* ctx, RangeFn fn) {
    Job job{fn, ctx, n, chunks};
    std::lock_guard<std::mutex> one_job(run_mu_);
    const int workers = static_cast<int>(std::min<int64_t>(threads, chunks)) - 1;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (; started_ < workers; ++started_) std::thread(&ForkedPool::worker, this, started_, epoch_).detach();
      job_ = &job;
      want_ = workers;
      pending_ = workers;
      ++epoch_;
    }
    wake_.notify_all();
    drain(job);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  struct Job {
    RangeFn fn;
    const void* ctx;
    int64_t n, chunks;
    std::atomic<int64_t> next{0};
  };

  static void drain(Job& job) {
    t_in_pool = true;
    for (int64_t c; (c = job.next.fetch_add(1, std::memory_order_relaxed)) < job.chunks;) {
      job.fn(job.ctx, c * job.n / job.chunks, (c + 1) * job.n / job.chunks);
    }
    t_in_pool = false;
  }

  // Worker `index` takes part in a job when index < want_ (jobs of fewer threads leave the rest asleep).
  void worker(int index, uint64_t seen) {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      wake_.wait(lock, [&] { return epoch_ != seen; });
      seen = epoch_;
      if (index >= want_) continue;
      Job* job = job_;
      lock.unlock();
      drain(*job);
      lock.lock();
      if (--pending_ == 0) done_.notify_all();
    }
  }

  std::mutex run_mu_;  // held by the caller of run() for the whole job
  std::mutex mu_;      // guards what follows
  std::condition_variable wake_, done_;
  Job* job_ = nullptr;
  uint64_t epoch_ = 0;  // the number of jobs posted
  int want_ = 0;        // workers [0, want_) take part in job epoch_
  int pending_ = 0;     // of those, the ones not yet done with it
  int started_ = 0;     // worker threads started
};

// The forked process's pool, created on first use. At a further fork it is dropped, not destroyed
// (its mutexes may be held by threads that do not exist in the child, its workers are gone).
std::atomic<ForkedPool*> g_forked_pool{nullptr};

ForkedPool& forked_pool() {
  ForkedPool* pool = g_forked_pool.load(std::memory_order_acquire);
  if (pool) return *pool;
  auto* fresh = new ForkedPool;
  if (g_forked_pool.compare_exchange_strong(pool, fresh, std::memory_order_acq_rel)) return *fresh;
  delete fresh;  // another thread's came first
  return *pool;
}

void after_fork_in_child() {
  if (g_tbb_started.load(std::memory_order_relaxed)) g_forked.store(true, std::memory_order_relaxed);
  g_forked_pool.store(nullptr, std::memory_order_relaxed);
}

// oneTBB's cap on the threads an arena runs (global_control::max_allowed_parallelism: the machine's
// cores, or the process's CPU affinity, unless set lower): an arena of more threads still runs that
// many. Read once.
int tbb_thread_limit() {
  static const int limit = static_cast<int>(
      std::max<size_t>(1, tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism)));
  return limit;
}

// The arena for the current thread count, created on first use and replaced when the thread count
// changes (torch.set_num_threads). Callers hold a reference while they run, so a replaced arena
// lives until its last user returns.
std::shared_ptr<tbb::task_arena> arena_for(int threads) {
  struct Cache {
    std::mutex mu;
    int threads = 0;
    std::shared_ptr<tbb::task_arena> arena;
  };
  static Cache* cache = new Cache;  // never destroyed: no TBB teardown in static destructors
  static const int registered = [] {
    g_tbb_started.store(true, std::memory_order_relaxed);
    return pthread_atfork(nullptr, nullptr, &after_fork_in_child);
  }();
  (void)registered;
  std::lock_guard<std::mutex> lock(cache->mu);
  if (cache->threads != threads) {
    cache->arena = std::make_shared<tbb::task_arena>(threads);
    cache->threads = threads;
  }
  return cache->arena;
}

}  // namespace

// Chunks per thread. More than one, so that the calling thread starts at once and a worker that
// wakes late (tens of microseconds from sleep on a VM) takes its share of what is left instead of
// a fixed half: with one static chunk per thread a late worker adds its whole delay to the op.
// 8 keeps the per-chunk overhead (about a microsecond) near 1% of a chunk of the sizes that thread.
constexpr int64_t kChunksPerThread = 8;

// Inside an ATen parallel region (a torch op's at::parallel_for calling us), stay on this thread as
// ATen itself does. Else torch's thread count, as many as really run: oneTBB runs no more than
// tbb_thread_limit() (torch.set_num_threads(4) on two cores runs two); a forked process's own pool
// starts as many as asked for, as torch's does.
int parallel_threads() {
  if (t_in_pool || at::in_parallel_region()) return 1;
  const int threads = at::get_num_threads();
  if (threads <= 1 || g_forked.load(std::memory_order_relaxed)) return threads;
  return std::min(threads, tbb_thread_limit());
}

void parallel_for_erased(int64_t n, int64_t grain, const void* ctx, RangeFn fn) {
  const int threads = parallel_threads();
  const int64_t max_chunks = ceil_div(n, std::max<int64_t>(grain, 1));
  if (threads <= 1 || max_chunks <= 1) {
    fn(ctx, 0, n);
    return;
  }
  const int64_t chunks = std::min<int64_t>(max_chunks, threads * kChunksPerThread);
  if (g_forked.load(std::memory_order_relaxed)) {
    forked_pool().run(threads, chunks, n, ctx, fn);
    return;
  }
  const auto arena = arena_for(threads);
  // Equal chunks, one task each (simple_partitioner splits the index range down to single
  // chunks): the calling thread works through them from the front while workers steal the
  // largest pending halves.
  arena->execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<int64_t>(0, chunks, 1),
        [&](const tbb::blocked_range<int64_t>& r) {
          for (int64_t c = r.begin(); c < r.end(); ++c) fn(ctx, c * n / chunks, (c + 1) * n / chunks);
        },
        tbb::simple_partitioner());
  });
}

// How explain names the threads a parallel_for runs on (parallel_threads()).
std::string threads_note() {
  std::ostringstream s;
  const int threads = parallel_threads(), asked = at::get_num_threads();
  s << threads << (threads == 1 ? " thread" : " threads");
  if (g_forked.load(std::memory_order_relaxed)) {
    s << " (fastact's own: this process was forked after oneTBB had started, which oneTBB does not support";
  } else {
    s << " (oneTBB";
    if (threads < asked) s << "; torch.get_num_threads() is " << asked << ", oneTBB runs at most " << threads << " here";
  }
  s << "; small inputs stay on the calling thread)";
  return s.str();
}

// ---------------------------------------------------------------------------------------------
// The kernel table of this machine: torch's own choice of instruction set (at::get_cpu_capability,
// which honours ATEN_CPU_CAPABILITY), capped by the builds that exist.

namespace {

const KernelTable& select_table() {
  const std::string cap = at::get_cpu_capability();
#if defined(FASTACT_HAVE_AVX512)
  if (cap == "AVX512") return AVX512::kernel_table();
#endif
#if defined(FASTACT_HAVE_AVX2)
  if (cap == "AVX512" || cap == "AVX2") return AVX2::kernel_table();
#endif
  return DEFAULT::kernel_table();
}

const KernelTable& kernels() {
  static const KernelTable& table = select_table();
  return table;
}

// ---------------------------------------------------------------------------------------------
// Argument checks.

// The CUDA variants are dispatch.h's names (softmax_variant_from_name); on the CPU only "auto" runs.
void check_cpu_variant(c10::string_view variant, const char* op) {
  const std::string_view v = sv(variant);
  if (v == "auto") return;
  SoftmaxVariant cuda = SoftmaxVariant::kAuto;
  TORCH_CHECK(!softmax_variant_from_name(v, &cuda), op, ": variant '", std::string(v),
              "' is a CUDA kernel; on the CPU only 'auto' is accepted");
  TORCH_CHECK(false, op, ": unknown variant '", std::string(v), "'; expected one of ", softmax_variant_names(),
              " (on the CPU only 'auto')");
}

bool parse_tanh(c10::string_view approximate, const char* op) {
  return parse_gelu_approx(sv(approximate), op) == GeluApprox::kTanh;
}

SoftmaxShape to_shape(const SoftmaxGeometry& g) { return {g.outer, g.dim_size, g.inner, g.row_stride}; }

// ---------------------------------------------------------------------------------------------
// Softmax family.

template <bool kLog>
at::Tensor softmax_cpu(const at::Tensor& x, int64_t dim, std::optional<at::ScalarType> dtype,
                       c10::string_view variant) {
  constexpr const char* op = kLog ? "log_softmax" : "softmax";
  check_cpu_variant(variant, op);
  const SoftmaxForwardPlan p = plan_softmax_forward(x, dim, dtype, op);
  if (p.input.numel() == 0) return p.output;
  const SoftmaxShape shape = to_shape(p.geom);
  const at::ScalarType in = p.input.scalar_type();
  if (in == p.output.scalar_type()) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, in, op, [&] {
      kernels().of<scalar_t>().softmax_fwd(p.input.const_data_ptr<scalar_t>(), p.output.mutable_data_ptr<scalar_t>(),
                                          shape, kLog);
    });
  } else {  // the fused half/bfloat16 -> float cast (fused_softmax_cast)
    TORCH_INTERNAL_ASSERT(p.output.scalar_type() == at::kFloat);
    AT_DISPATCH_REDUCED_FLOATING_TYPES(in, op, [&] {
      kernels().of<scalar_t>().softmax_fwd_to_float(p.input.const_data_ptr<scalar_t>(),
                                                   p.output.mutable_data_ptr<float>(), shape, kLog);
    });
  }
  return p.output;
}

template <bool kLog>
at::Tensor softmax_backward_cpu(const at::Tensor& grad_output, const at::Tensor& output, int64_t dim,
                                at::ScalarType input_dtype, c10::string_view variant) {
  constexpr const char* op = kLog ? "log_softmax_backward" : "softmax_backward";
  check_cpu_variant(variant, op);
  const SoftmaxBackwardPlan p =
      plan_softmax_backward(grad_output, output, dim, input_dtype, op);
  if (p.output.numel() > 0) {
    const SoftmaxShape shape = to_shape(p.geom);
    const at::ScalarType t = p.output.scalar_type();
    if (p.compute_dtype == t) {
      AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, t, op, [&] {
        kernels().of<scalar_t>().softmax_bwd(p.grad_output.const_data_ptr<scalar_t>(),
                                            p.output.const_data_ptr<scalar_t>(),
                                            p.grad_input.mutable_data_ptr<scalar_t>(), shape, kLog);
      });
    } else {  // float gradients of a half/bfloat16 input, written as the input's dtype
      TORCH_INTERNAL_ASSERT(t == at::kFloat);
      AT_DISPATCH_REDUCED_FLOATING_TYPES(p.compute_dtype, op, [&] {
        kernels().of<scalar_t>().softmax_bwd_from_float(p.grad_output.const_data_ptr<float>(),
                                                       p.output.const_data_ptr<float>(),
                                                       p.grad_input.mutable_data_ptr<scalar_t>(), shape, kLog);
      });
    }
  }
  return p.compute_dtype == input_dtype ? p.grad_input : p.grad_input.to(input_dtype);
}

// ---------------------------------------------------------------------------------------------
// Elementwise ops: the output is empty_like(input) (common.h's layout rule); the inputs are read in
// place where element_operands allows it (in the output's memory order, or as strided or repeated rows
// beside a contiguous output) and copied into the output's layout otherwise, the first such input into
// the output itself.

// The pointwise ops of fastact/op_table.h: forward, backward (dx = dy f'(s), s the input or the output) and
// the backward's derivative with respect to s (a f''(s), for double backward), one template per row.
template <typename Row>
struct PointwiseCpu {
  static int index() { return optable::index<Row>(); }

  static at::Tensor forward(const at::Tensor& input, c10::string_view param) {
    const at::Tensor x = pointwise_input<Row>(input);
    return run_forward(x, pointwise_choice<Row>(sv(param), Row::kName));
  }
  static at::Tensor run_forward(const at::Tensor& x, int choice) {
    at::Tensor y = at::empty_like(x);
    if (y.numel() == 0) return y;
    const ElementOperands in = element_operands(y, x);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), Row::kName, [&] {
      kernels().of<scalar_t>().pointwise_fwd[index()](in.in0.const_data_ptr<scalar_t>(),
                                                      y.mutable_data_ptr<scalar_t>(), in.rows, choice);
    });
    return y;
  }
  // The backward (kGrad false) or its derivative (kGrad true), checked (pointwise_ops.h's contract).
  template <bool kGrad>
  static at::Tensor binary(const at::Tensor& grad, const at::Tensor& s, c10::string_view param, int64_t order) {
    constexpr const char* op = kGrad ? Row::kGradName : Row::kBackwardName;
    check_grad(grad, s, op, Row::kSavedWhat);
    check_grad_order(order, op);
    return run_binary<kGrad>(grad, s, pointwise_choice<Row>(sv(param), op), static_cast<int>(order));
  }
  // A binary op of (grad, s) in s's layout.
  template <bool kGrad>
  static at::Tensor run_binary(const at::Tensor& grad, const at::Tensor& s, int choice, int order) {
    at::Tensor out = at::empty_like(s);
    if (out.numel() == 0) return out;
    const ElementOperands in = element_operands(out, grad, s);
    constexpr const char* op = kGrad ? Row::kGradName : Row::kBackwardName;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, s.scalar_type(), op, [&] {
      const TypedKernels<scalar_t>& k = kernels().of<scalar_t>();
      const scalar_t* a = in.in0.const_data_ptr<scalar_t>();
      const scalar_t* b = in.in1.const_data_ptr<scalar_t>();
      if (kGrad) k.pointwise_bwd_grad[index()](a, b, out.mutable_data_ptr<scalar_t>(), in.rows, choice, order);
      else k.pointwise_bwd[index()](a, b, out.mutable_data_ptr<scalar_t>(), in.rows, choice);
    });
    return out;
  }
};

// bias_gelu: x read in place when contiguous, a strided stack of rows or one row repeated, else copied
// into y first and computed there in place (bias_gelu_input); output contiguous, one pass.
at::Tensor bias_gelu_cpu(const at::Tensor& x, const at::Tensor& bias, c10::string_view approximate) {
  check_bias_gelu(x, bias, "bias_gelu");
  const bool tanh = parse_tanh(approximate, "bias_gelu");
  at::Tensor y = at::empty(x.sizes(), x.options());
  if (y.numel() == 0) return y;
  const BiasGeluInput xin = bias_gelu_input(x, y);
  const at::Tensor bc = bias.contiguous();
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "bias_gelu", [&] {
    kernels().of<scalar_t>().bias_gelu_fwd(xin.x.const_data_ptr<scalar_t>(), xin.row_stride,
                                          bc.const_data_ptr<scalar_t>(), y.mutable_data_ptr<scalar_t>(), rows, cols,
                                          tanh);
  });
  return y;
}

std::tuple<at::Tensor, at::Tensor> bias_gelu_backward_cpu(const at::Tensor& grad_output, const at::Tensor& x,
                                                          const at::Tensor& bias, c10::string_view approximate) {
  check_bias_gelu(x, bias, "bias_gelu_backward");
  check_grad(grad_output, x, "bias_gelu_backward", "input");
  const bool tanh = parse_tanh(approximate, "bias_gelu_backward");
  at::Tensor dx = at::empty(x.sizes(), x.options());
  at::Tensor dbias = at::empty(bias.sizes(), bias.options());
  if (x.numel() == 0) {
    dbias.zero_();
    return {dx, dbias};
  }
  // dy contiguous and x read in place where they can be, else one of them copied into dx first.
  const BiasGeluBackwardOperands in = bias_gelu_backward_operands(dx, grad_output, x);
  const BiasGeluInput& xin = in.x;
  const at::Tensor bc = bias.contiguous();
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "bias_gelu_backward", [&] {
    kernels().of<scalar_t>().bias_gelu_bwd(in.dy.const_data_ptr<scalar_t>(), xin.x.const_data_ptr<scalar_t>(),
                                          xin.row_stride, bc.const_data_ptr<scalar_t>(),
                                          dx.mutable_data_ptr<scalar_t>(),
                                          dbias.mutable_data_ptr<scalar_t>(), rows, cols, tanh);
  });
  return {dx, dbias};
}

// ---------------------------------------------------------------------------------------------
// explain: the CPU path the op takes on this input, and why.

std::string explain_cpu(const at::Tensor& self, c10::string_view op_name, int64_t dim,
                        std::optional<at::ScalarType> dtype) {
  const std::string op(sv(op_name));
  const ExplainOp which = explain_op(op);
  const bool softmax_op = which.kind == optable::Kind::kSoftmax;
  TORCH_CHECK(which.known && (softmax_op || !which.backward), "explain: unknown op '", op, "'; expected one of ",
              explain_op_list());

  const KernelTable& table = kernels();
  std::ostringstream s;
  if (softmax_op) {
    const bool backward = op.size() > 9 && op.compare(op.size() - 9, 9, "_backward") == 0;
    // An integral input without a dtype: described as computed in float (the ops reject it).
    const bool integral = at::isIntegralType(self.scalar_type(), /*includeBool=*/true);
    const SoftmaxExplainTypes types =
        softmax_explain_types(integral && !dtype ? at::kFloat : self.scalar_type(), dtype, backward, op.c_str());
    dim = wrap_dim(dim, self.dim(), "explain");
    SoftmaxGeometry g;
    std::string layout;
    if (self.numel() == 0) {
      layout = "empty input: nothing to compute";
    } else if (types.cast_first) {
      g = dense_geometry(at::empty_like(self, self.options().device(at::kMeta).dtype(types.out)), dim);
      layout = "a fresh dense copy";
    } else if (is_dense(self)) {
      g = dense_geometry(self, dim);
      layout = "dense input read in place in its memory order";
    } else if (auto rs = (backward ? std::optional<int64_t>() : collapsed_row_stride(self, dim))) {
      g.outer = self.numel() / self.size(dim);
      g.dim_size = self.size(dim);
      g.row_stride = *rs;
      layout = "rows read in place through their stride";
    } else {
      // The copy the op makes: dense in self's dim order (empty_like), here without the memory.
      g = dense_geometry(at::empty_like(self, self.options().device(at::kMeta)), dim);
      layout = "input has gaps or overlaps: copied into a dense tensor first";
    }
    // Vector lanes of the arithmetic: half and bfloat16 compute in float, double has half as many.
    const int64_t lanes = types.out == at::kDouble ? table.float_lanes / 2 : table.float_lanes;
    if (g.inner == 1) {
      s << "variant=cpu_lastdim: " << op << " over rows of D=" << g.dim_size << " (outer=" << g.outer
        << ", row stride " << g.row_stride << "; " << layout << "); "
        << (backward ? "each row in two cache-resident passes (the row sum, then dx)"
                     : "each row in three cache-resident passes (max, sum of exp, write)")
        << ", " << lanes << "-lane SIMD along the row, rows split across threads";
    } else {
      s << "variant=cpu_strided: " << op << " over D=" << g.dim_size << " at a stride of " << g.inner
        << " elements (outer=" << g.outer << ", inner=" << g.inner << "; " << layout << "); "
        << lanes << "-lane SIMD across the contiguous inner dim, each lane a column with its own "
        << (backward ? "sum" : "max and sum");
      const SoftmaxShape shape{g.outer, g.dim_size, g.inner};
      // The plan of the type the kernel reads (the fused backward's float dy and y: softmax_bwd_from_float).
      const at::ScalarType read = backward ? types.out : types.in;
      const auto [columns, group] = AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, read, "explain", [&] {
        const TypedKernels<scalar_t>& k = table.of<scalar_t>();
        return std::pair(k.softmax_strided_columns(shape, backward), k.softmax_strided_lane_group(shape, backward));
      });
      const int64_t body = group > 0 ? g.inner - g.inner % lanes : g.inner;  // the columns of whole vectors
      s << (group > 0 ? "; " : ", no transposing copy; ");
      if (columns > 2 * lanes) {
        s << "tasks of (outer index, " << std::min(columns, g.inner) << " adjacent columns"
          << (columns >= g.inner ? ": whole slabs" : "") << "), the columns' state in buffers, each row a run";
      } else if (body > 0) {
        // Float backwards of slabs wider than a vector keep the columns past their last vector pair in their own
        // tasks, in padded lanes (softmax_kernels.cpp turned_group_width).
        const int64_t padded = group == 0 && g.inner % lanes != 0 ? g.inner % (2 * lanes) : 0;
        if (padded == g.inner) {
          s << "tasks of (outer index, " << g.inner << " columns: whole slabs) in padded lanes";
        } else {
          s << "tasks of (outer index, " << std::min(columns, body) << " columns), a vector pair at a time in "
            << "registers";
          if (padded > 0) s << ", each slab's last " << padded << " columns in padded lanes";
        }
      }
      if (group > 0) {
        s << (body > 0 ? ", then each slab's last " : "each slab's ") << g.inner % lanes << " columns in vector lanes "
          << "across slabs (tasks of " << group << " such columns of consecutive slabs, turned through buffers, "
          << "a lane a column)";
      }
      s << ", split across threads";
    }
    s << types.note;
  } else {
    check_explain_dtype(op, dtype);
    // An op that computes an integer input in the default dtype (sigmoid) reads that copy.
    const optable::PointwiseInfo* row = optable::find_pointwise(op);
    const bool converts = row && row->integral == optable::Integral::kToDefaultFloat &&
                          at::isIntegralType(self.scalar_type(), /*includeBool=*/true);
    const at::Tensor x = converts ? integral_to_default_float_meta(self) : self;
    s << "kernel=cpu_elementwise: " << op << " over " << self.numel() << " elements";
    if (converts) s << " (the " << self.scalar_type() << " input converted to " << x.scalar_type() << " first)";
    if (which.kind == optable::Kind::kBias) {
      s << (self.dim() >= 1 && bias_gelu_row_stride(self) ? " (input read in place"
                                                            : " (input copied into the output first, computed there in place")
        << ", bias added in registers: one pass)";
    } else {
      const auto [stride, cols] = element_read_of(x);
      if (!stride) {
        s << " (input has gaps or overlaps: copied into the output first, computed there in place)";
      } else if (*stride == 0 && self.numel() > cols) {
        s << " (" << self.numel() / cols << " rows of " << cols
          << ", every one the same input row, read in place; output contiguous)";
      } else if (*stride != cols && self.numel() > cols) {
        s << " (" << self.numel() / cols << " rows of " << cols << ", input rows " << *stride
          << " elements apart read in place; output contiguous)";
      } else {
        s << " (dense input read in place in its memory order)";
      }
    }
  }
  s << "; ISA " << table.isa << " (" << table.float_lanes << " float lanes), " << threads_note();
  return s.str();
}

}  // namespace
}  // namespace fastact::cpu

TORCH_LIBRARY_IMPL(fastact, CPU, m) {
  using namespace fastact::cpu;
  m.impl("softmax", &softmax_cpu<false>);
  m.impl("log_softmax", &softmax_cpu<true>);
  m.impl("softmax_backward", &softmax_backward_cpu<false>);
  m.impl("log_softmax_backward", &softmax_backward_cpu<true>);
  fastact::register_pointwise_ops<PointwiseCpu>(m);
  m.impl("bias_gelu", &bias_gelu_cpu);
  m.impl("bias_gelu_backward", &bias_gelu_backward_cpu);
  m.impl("explain", &explain_cpu);
}
