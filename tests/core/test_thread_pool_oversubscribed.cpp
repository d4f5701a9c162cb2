// A pool with far more threads than the machine has cores (issue 26: `-t 999` made no progress in 60 s because a
// thousand idle workers spun on two cores) must still finish back-to-back jobs in bounded time: workers that cannot
// all have a core must block, not spin.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "core/thread_pool.h"

namespace tessera {
namespace {

TEST(ThreadPoolOversubscribed, ManyThreadsOnFewCoresFinishQuickly) {
  const unsigned hw = std::thread::hardware_concurrency();
  const int threads = 999;  // what the issue typed
  const auto t0 = std::chrono::steady_clock::now();
  ThreadPool pool(threads);
  std::atomic<int64_t> sum{0};
  // ~ a decode step's worth of small ops, twice.
  // ~ two decode steps' worth of ops, each task a few microseconds of work as a matmul row block is.
  for (int job = 0; job < 600; ++job)
    pool.parallel_for(64, [&](int64_t task, int) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(5);
      while (std::chrono::steady_clock::now() < until) {
      }
      sum.fetch_add(task, std::memory_order_relaxed);
    });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(sum.load(), int64_t{600} * 64 * 63 / 2);
  // Spinning workers took minutes here; blocking ones take well under a second.
  EXPECT_LT(s, 5.0) << threads << " threads on " << hw << " hardware threads";
}

}  // namespace
}  // namespace tessera
