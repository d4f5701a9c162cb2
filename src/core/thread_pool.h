// A persistent pool of worker threads for the CPU kernels.
//
// Decode runs ~300 small ops per token, so a dispatch must cost a few hundred nanoseconds, not the tens of
// microseconds of a thread spawn or a condition-variable round trip: workers are created once, spin on a generation
// counter for 300 us after each job (the next op usually follows within microseconds) and only then sleep on a futex.
// A pool with more threads than the machine has hardware threads never spins: its workers sleep at once.
// parallel_for type-erases the callable through a function pointer and a pointer to the caller's lambda, so a call
// allocates nothing. Measured dispatch cost (bench: ops/pool_dispatch, 2 threads, 4 empty tasks): ~0.3 us on the
// 2-core Zen 5 dev machine, ~0.6 us on a Xeon.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace tessera {

class ThreadPool {
 public:
  // n_threads <= 0: one per hardware thread. The calling thread counts as thread 0 and takes tasks too, so
  // ThreadPool(1) starts no worker and runs everything inline.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return n_threads_; }

  // Calls fn(task, thread) once for every task in [0, n_tasks), thread in [0, n_threads()), and returns when all have
  // finished. Tasks are handed out one at a time from a shared counter (dynamic scheduling): this machine is shared
  // and a static split would wait for the slowest core. Make tasks coarse enough (>= a few microseconds each) for the
  // counter not to matter. A parallel_for issued from inside a task runs inline with thread == 0, so kernels keep
  // per-thread scratch in thread_local storage rather than indexing it by `thread`.
  // An exception thrown by fn is rethrown here once all tasks have finished (the first one, if several threw); the
  // other tasks still run (run inline, the loop stops at the throw). Kernels validate their arguments before they
  // dispatch, so this is a safety net.
  template <typename F>
  void parallel_for(int64_t n_tasks, F&& fn) {
    if (n_tasks <= 0) return;
    if (n_threads_ == 1 || n_tasks == 1 || in_worker()) {
      for (int64_t i = 0; i < n_tasks; ++i) fn(i, 0);
      return;
    }
    using Fn = std::remove_reference_t<F>;
    run(
        n_tasks, [](void* ctx, int64_t task, int thread) { (*static_cast<Fn*>(ctx))(task, thread); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

  // Static split of [0, n) into one contiguous range per thread: fn(begin, end, thread). For work whose parts cost
  // the same and where contiguity matters more than balance.
  // One caller at a time: a pool is not meant to be driven from two threads at once.
  template <typename F>
  void parallel_range(int64_t n, F&& fn) {
    const int64_t parts = n < n_threads_ ? n : n_threads_;
    parallel_for(parts, [&](int64_t p, int thread) { fn(n * p / parts, n * (p + 1) / parts, thread); });
  }

  // True while the calling thread executes a task of some pool.
  static bool in_worker();

  // Task timing for traces (`tessera profile --trace`): while set, each task writes its thread's first start (if
  // spans[2 * thread] is still 0) and its end into spans[2 * thread] and spans[2 * thread + 1], as steady-clock ns;
  // a job's caller reads them after it returns. spans holds 2 * n_threads() values; nullptr (the default) turns it
  // off. Set it only between jobs.
  void set_task_spans(uint64_t* spans) { spans_.store(spans, std::memory_order_release); }

 private:
  using TaskFn = void (*)(void* ctx, int64_t task, int thread);
  void run(int64_t n_tasks, TaskFn fn, void* ctx);
  void worker_main(int thread);
  void work(int thread, uint64_t job);

  int n_threads_ = 1;
  std::atomic<uint64_t*> spans_{nullptr};
  bool oversubscribed_ = false;  // more threads than hardware threads: block at once instead of spinning
  std::vector<std::thread> workers_;

  // The current job; see thread_pool.cpp for why a late worker can never run a task of the wrong job.
  std::atomic<TaskFn> job_fn_{nullptr};
  std::atomic<void*> job_ctx_{nullptr};
  std::atomic<int64_t> job_tasks_{0};

  alignas(64) std::atomic<uint64_t> counter_{0};     // job id << 32 | next unclaimed task
  alignas(64) std::atomic<int64_t> done_{0};         // tasks of the current job finished
  alignas(64) std::atomic<uint32_t> generation_{0};  // bumped once per job; idle workers spin, then wait, on it
  std::atomic<int> sleepers_{0};
  std::mutex error_mu_;
  std::exception_ptr error_;  // first exception of the current job
  std::atomic<bool> stop_{false};
};

}  // namespace tessera
