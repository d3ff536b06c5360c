#include "util/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TM_CPU_RELAX() _mm_pause()
#else
#define TM_CPU_RELAX() std::this_thread::yield()
#endif

namespace tokenmill {

namespace {
// Spin iterations (each a pause, ~40-140 cycles) before blocking: long enough to cover the gap
// between consecutive ops of a decode step, short enough not to burn a core when idle.
constexpr int kSpins = 20000;

// Part p of n items split into `parts` grain-aligned ranges.
void part_range(int64_t n, int64_t grain, int parts, int p, int64_t* b, int64_t* e) {
  int64_t chunks = (n + grain - 1) / grain;
  int64_t per = chunks / parts, extra = chunks % parts;
  int64_t cb = p * per + std::min<int64_t>(p, extra);
  int64_t ce = cb + per + (p < extra ? 1 : 0);
  *b = std::min(n, cb * grain);
  *e = std::min(n, ce * grain);
}
}  // namespace

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn,
                     int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  int64_t chunks = (n + grain - 1) / grain;
  int parts = static_cast<int>(std::min<int64_t>(chunks, size()));
  if (parts <= 1) {
    fn(0, n, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    job_grain_ = grain;
    job_parts_ = parts;
    pending_.store(parts - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  start_cv_.notify_all();
  int64_t b, e;
  part_range(n, grain, parts, 0, &b, &e);
  fn(b, e, 0);
  for (int i = 0; i < kSpins && pending_.load(std::memory_order_acquire) != 0; ++i) TM_CPU_RELAX();
  if (pending_.load(std::memory_order_acquire) != 0) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return pending_.load(std::memory_order_acquire) == 0; });
  }
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    // Spin for the next generation, then sleep.
    int spins = 0;
    while (generation_.load(std::memory_order_acquire) == seen && !stop_.load() && spins < kSpins) {
      TM_CPU_RELAX();
      ++spins;
    }
    const std::function<void(int64_t, int64_t, int)>* job;
    int64_t n, grain;
    int parts;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
      if (stop_.load()) return;
      seen = generation_.load();
      job = job_;
      n = job_n_;
      grain = job_grain_;
      parts = job_parts_;
    }
    if (index < parts) {
      int64_t b, e;
      part_range(n, grain, parts, index, &b, &e);
      (*job)(b, e, index);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lock(mu_);
        done_cv_.notify_all();
      }
    }
  }
}

}  // namespace tokenmill
