#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "core/thread_pool.h"
#include "cpu_test_util.h"

namespace tessera {
namespace {

TEST(ThreadPool, EveryTaskRunsExactlyOnceOnAValidThread) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    ASSERT_EQ(pool.n_threads(), threads);
    for (int64_t n : {0, 1, 2, 3, 7, 64, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::atomic<bool> bad_thread{false};
      pool.parallel_for(n, [&](int64_t task, int thread) {
        hits[static_cast<size_t>(task)].fetch_add(1);
        if (thread < 0 || thread >= threads) bad_thread = true;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "threads " << threads;
      EXPECT_FALSE(bad_thread.load());
    }
  }
}

// Many tiny jobs back to back, as decode issues them: exercises the hand-over between jobs (a late worker must never
// run a task of the next job, and the caller must not return before the job's tasks finish).
TEST(ThreadPool, BackToBackJobsStayConsistent) {
  for (int threads : {2, 3}) {
    ThreadPool pool(threads);
    std::vector<int64_t> out(8, 0);
    int64_t expected = 0;
    for (int job = 0; job < 20000; ++job) {
      const int64_t n = 1 + job % 8;
      pool.parallel_for(n, [&](int64_t task, int) { out[static_cast<size_t>(task)] += job; });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[static_cast<size_t>(i)], job) << "job " << job;
      for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = 0;
      expected += n;
    }
    EXPECT_GT(expected, 0);
  }
}

TEST(ThreadPool, WorkersWakeAfterSleeping) {
  ThreadPool pool(2);
  for (int round = 0; round < 3; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // longer than the spin: workers are asleep
    std::atomic<int> sum{0};
    pool.parallel_for(100, [&](int64_t task, int) { sum += static_cast<int>(task); });
    EXPECT_EQ(sum.load(), 4950);
  }
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(2);
  std::atomic<int> inner{0};
  pool.parallel_for(4, [&](int64_t, int) {
    EXPECT_TRUE(ThreadPool::in_worker());
    pool.parallel_for(3, [&](int64_t, int thread) {
      EXPECT_EQ(thread, 0);
      inner += 1;
    });
  });
  EXPECT_EQ(inner.load(), 12);
  EXPECT_FALSE(ThreadPool::in_worker());
}

TEST(ThreadPool, ParallelRangeCoversTheRangeOnce) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 5, 100}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.parallel_range(n, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)] += 1;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1);
    }
  }
}

TEST(ThreadPool, ExceptionReachesTheCallerAfterAllTasksFinish) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    std::atomic<int> ran{0};
    EXPECT_THROW(pool.parallel_for(50,
                                   [&](int64_t task, int) {
                                     ran += 1;
                                     if (task == 7) throw std::runtime_error("task 7");
                                   }),
                 std::runtime_error);
    // Inline (one thread) stops at the throw; with workers, every task runs before the caller sees it.
    EXPECT_EQ(ran.load(), threads == 1 ? 8 : 50);
    std::atomic<int> after{0};
    pool.parallel_for(10, [&](int64_t, int) { after += 1; });  // the pool is still usable
    EXPECT_EQ(after.load(), 10);
  }
}

TEST(ThreadPool, DefaultUsesHardwareThreads) {
  ThreadPool pool;
  EXPECT_GE(pool.n_threads(), 1);
}

}  // namespace
}  // namespace tessera
