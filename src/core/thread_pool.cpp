// Job protocol. counter_ packs (job id << 32 | next task). A thread claims task i of job j with a compare-exchange
// from (j, i) to (j, i + 1), and only while i < n. The caller rewrites the job fields only after all n tasks of job j
// are done and after it has moved the counter to (j + 1, closed), so a successful claim proves that the fields the
// thread read just before it belong to job j. A worker that wakes late (descheduled, or still asleep) can therefore
// never run a task of the wrong job, and the caller never waits for a worker that has not shown up: it simply takes
// the remaining tasks itself. This matters on a small shared machine where a worker may lose its core for
// milliseconds.
#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <exception>
#include <mutex>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "core/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TESSERA_CPU_RELAX() _mm_pause()
#else
#define TESSERA_CPU_RELAX() std::this_thread::yield()
#endif

namespace tessera {
namespace {

thread_local bool t_in_worker = false;

constexpr uint64_t kClosed = 0xffffffffu;  // task index of a counter whose job is being set up (>= any task count)

// How long an idle worker keeps spinning before it sleeps. Ops of one decode step follow each other within
// microseconds, and a futex wake-up costs ~5-50 us, so a worker that spins across the gap saves that every op.
constexpr auto kSpin = std::chrono::microseconds(300);

// Sleep until *word != expected (or a spurious wake-up), and wake all sleepers. On Linux a raw futex: libstdc++'s
// std::atomic::wait spins and yields on its own before it sleeps, which we already did.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
#else
  word->wait(expected, std::memory_order_seq_cst);
#endif
}

uint64_t steady_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

void futex_wake(std::atomic<uint32_t>* word, int n) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, n, nullptr, nullptr, 0);
#else
  (void)n;
  word->notify_all();
#endif
}

void futex_wake_all(std::atomic<uint32_t>* word) { futex_wake(word, INT_MAX); }

static_assert(sizeof(std::atomic<uint32_t>) == 4 && std::atomic<uint32_t>::is_always_lock_free,
              "the futex needs a plain 32-bit word");

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::thread::hardware_concurrency());
  if (n_threads <= 0) n_threads = 1;
  n_threads_ = n_threads;
  // More threads than hardware threads: a spinning worker would hold a core that a worker with a task (or the caller)
  // needs, and with hundreds of them no job makes progress (issue 26: -t 999 on 2 cores). Such pools never spin.
  const unsigned hw = std::thread::hardware_concurrency();
  oversubscribed_ = hw > 0 && n_threads_ > static_cast<int>(hw);
  workers_.reserve(static_cast<size_t>(n_threads_ - 1));
  // Workers start from generation 0 rather than reading it when they start running: a worker scheduled late must not
  // miss a bump that already happened (the destructor's, in the worst case, which would then wait forever).
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_main(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_seq_cst);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(&generation_);
  for (auto& w : workers_) w.join();
}

bool ThreadPool::in_worker() { return t_in_worker; }

void ThreadPool::run(int64_t n_tasks, TaskFn fn, void* ctx) {
  TESSERA_CHECK(n_tasks < (int64_t{1} << 31), "thread pool: {} tasks in one parallel_for is more than 2^31", n_tasks);
  const uint64_t job = (counter_.load(std::memory_order_relaxed) >> 32) + 1;
  // Close the counter before touching the fields: a straggler that read the old (job, n) could otherwise pair the old
  // counter with the new task count and claim a task that does not exist. The release stores order this one first.
  counter_.store((job << 32) | kClosed, std::memory_order_relaxed);
  job_fn_.store(fn, std::memory_order_release);
  job_ctx_.store(ctx, std::memory_order_release);
  job_tasks_.store(n_tasks, std::memory_order_release);
  done_.store(0, std::memory_order_relaxed);
  counter_.store(job << 32, std::memory_order_release);
  // seq_cst pairs with the worker's sleepers_ increment: either it sees the new generation or we see it asleep.
  generation_.fetch_add(1, std::memory_order_seq_cst);
  // Wake no more sleepers than there are tasks for them: with an oversubscribed pool the rest would only be scheduled
  // to find nothing to do. A sleeper that stays asleep misses nothing (the caller takes whatever is left); it wakes on
  // a later job, reads the current generation and job, and its stale `seen` cannot make it run a wrong task.
  if (sleepers_.load(std::memory_order_seq_cst) > 0)
    futex_wake(&generation_, static_cast<int>(std::min<int64_t>(n_tasks - 1, n_threads_ - 1)));

  t_in_worker = true;
  work(0, job);
  t_in_worker = false;
  // Only a task a worker claimed before we ran out can still be running; wait for it.
  for (int spins = 0; done_.load(std::memory_order_acquire) != n_tasks; ++spins) {
    if (spins < 4096 && !oversubscribed_) {
      TESSERA_CPU_RELAX();
    } else {
      std::this_thread::yield();  // the worker holding the last task lost its core: give it ours
    }
  }
  if (error_) {
    std::exception_ptr e;
    std::swap(e, error_);
    std::rethrow_exception(e);
  }
}

void ThreadPool::work(int thread, uint64_t job) {
  for (;;) {
    uint64_t c = counter_.load(std::memory_order_acquire);
    if ((c >> 32) != job) return;
    // Read the job before claiming; the claim below validates what was read (see the protocol at the top).
    const TaskFn fn = job_fn_.load(std::memory_order_acquire);
    void* ctx = job_ctx_.load(std::memory_order_acquire);
    const int64_t n = job_tasks_.load(std::memory_order_acquire);
    const auto task = static_cast<int64_t>(c & 0xffffffffu);
    if (task >= n) return;
    if (!counter_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    uint64_t* spans = spans_.load(std::memory_order_acquire);
    if (spans != nullptr && spans[2 * thread] == 0) spans[2 * thread] = steady_ns();
    try {
      fn(ctx, task, thread);
    } catch (...) {
      // Kept for the caller to rethrow once every task has finished (the tasks still reference its stack).
      std::lock_guard<std::mutex> lock(error_mu_);
      if (!error_) error_ = std::current_exception();
    }
    // Before the release below, so the caller that sees every task done sees this end too.
    if (spans != nullptr) spans[2 * thread + 1] = steady_ns();
    done_.fetch_add(1, std::memory_order_release);
  }
}

void ThreadPool::worker_main(int thread) {
  t_in_worker = true;
  uint32_t seen = 0;
  for (;;) {
    const auto spin_until = std::chrono::steady_clock::now() + kSpin;
    uint32_t now = generation_.load(std::memory_order_acquire);
    for (int i = 0; now == seen && !oversubscribed_; ++i) {
      TESSERA_CPU_RELAX();
      if ((i & 255) == 255 && std::chrono::steady_clock::now() > spin_until) break;
      now = generation_.load(std::memory_order_acquire);
    }
    if (now == seen) {
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      futex_wait(&generation_, seen);
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
      now = generation_.load(std::memory_order_acquire);
    }
    seen = now;
    if (stop_.load(std::memory_order_acquire)) return;
    work(thread, counter_.load(std::memory_order_acquire) >> 32);
  }
}

}  // namespace tessera
