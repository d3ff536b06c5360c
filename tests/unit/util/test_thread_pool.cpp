#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "util/thread_pool.h"

namespace tokenmill {
namespace {

TEST(ThreadPool, CoversEveryIndexExactlyOnce) {
  ThreadPool pool(3);
  for (int64_t n : {1, 2, 5, 64, 1000, 12345}) {
    for (int64_t grain : {1, 4, 16, 100}) {
      std::vector<std::atomic<int>> hits(n);
      pool.run(
          n,
          [&](int64_t b, int64_t e, int) {
            // Ranges start on a grain boundary and only the last may be short.
            EXPECT_EQ(b % grain, 0);
            EXPECT_TRUE((e - b) % grain == 0 || e == n) << "b=" << b << " e=" << e;
            for (int64_t i = b; i < e; ++i) hits[i]++;
          },
          grain);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
    }
  }
}

// Per-thread scratch relies on this: a worker index is < size() and never used by two threads
// at the same time.
TEST(ThreadPool, WorkerIndexIsExclusive) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> busy(static_cast<size_t>(pool.size()));
  std::atomic<int> bad{0};
  for (int rep = 0; rep < 200; ++rep) {
    pool.run(64, [&](int64_t, int64_t, int w) {
      if (w < 0 || w >= pool.size()) {
        bad++;
        return;
      }
      if (busy[static_cast<size_t>(w)].fetch_add(1) != 0) bad++;
      std::this_thread::yield();  // widen the window in which an overlap would show
      busy[static_cast<size_t>(w)].fetch_sub(1);
    });
  }
  EXPECT_EQ(bad.load(), 0);
}

// Many back-to-back small jobs (the decode pattern): each sees exactly its own ranges, also when
// a worker arrives after the caller has already finished the job.
TEST(ThreadPool, BackToBackJobsDoNotMix) {
  ThreadPool pool(2);
  std::vector<int64_t> sums(5000, 0);
  for (size_t j = 0; j < sums.size(); ++j) {
    std::atomic<int64_t> sum{0};
    const int64_t n = 1 + static_cast<int64_t>(j % 37);
    pool.run(n, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) sum += i + static_cast<int64_t>(j) * 1000;
    });
    sums[j] = sum.load();
    ASSERT_EQ(sums[j], n * (n - 1) / 2 + n * static_cast<int64_t>(j) * 1000) << "job " << j;
  }
}

// After the workers have gone to sleep (longer than their spin), run() still completes and
// covers everything.
TEST(ThreadPool, WakesSleepingWorkers) {
  ThreadPool pool(3);
  for (int rep = 0; rep < 3; ++rep) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    std::vector<std::atomic<int>> hits(300);
    pool.run(300, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
}

// A slow worker (here: one whose piece sleeps, as a descheduled thread would) holds up only the
// piece it took: the caller runs every other piece itself instead of waiting.
TEST(ThreadPool, CallerRunsUnclaimedPieces) {
  ThreadPool pool(2);
  pool.run(2, [](int64_t, int64_t, int) {});  // the worker is now awake and spinning
  std::atomic<int> by_caller{0}, pieces{0};
  pool.run(
      8,
      [&](int64_t, int64_t, int w) {
        pieces++;
        if (w == 0) {
          by_caller++;
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
      },
      1);
  EXPECT_EQ(pieces.load(), 8);
  // The worker sleeps 100 ms in its first piece; the caller takes at least all but that one.
  EXPECT_GE(by_caller.load(), 7);
}

TEST(ThreadPool, SingleThreadRunsInline) {
  ThreadPool pool(1);
  EXPECT_EQ(pool.size(), 1);
  int calls = 0;
  pool.run(100, [&](int64_t b, int64_t e, int w) {
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 100);
    EXPECT_EQ(w, 0);
    ++calls;
  });
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace tokenmill
