// Fork-join thread pool for the CPU backend. One pool object is created by whoever owns the
// backend and passed down; nothing here is global.
//
// A decode step issues a few hundred small parallel ops, so hand-off latency matters more than
// anything: workers spin briefly on an atomic generation counter before sleeping on a condition
// variable, and the caller spins on the pending count the same way.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tokenmill {

class ThreadPool {
 public:
  // threads <= 0: one per hardware thread.
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end, worker) over [0, n) split into contiguous ranges, at most one per
  // thread, the calling thread included; returns when all are done. Ranges are multiples of
  // `grain` except the last. Not reentrant: fn must not call run() on the same pool.
  void run(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn, int64_t grain = 1);

 private:
  void worker_loop(int index);
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  // The job: written by run() before generation_ is bumped (release), read by workers after
  // they see the new generation (acquire).
  const std::function<void(int64_t, int64_t, int)>* job_ = nullptr;
  int64_t job_n_ = 0, job_grain_ = 1;
  int job_parts_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace tokenmill
