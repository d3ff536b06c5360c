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
// Spin iterations (each a pause, ~40-140 cycles) before a worker blocks: long enough to cover
// the gap between consecutive ops of a decode step, short enough not to burn a core when idle.
constexpr int kSpins = 20000;
// Pause iterations run() spins for a started piece before yielding its core between checks
// (the piece's thread may be waiting for that core on a loaded machine).
constexpr int kWaitSpins = 2000;
// Pieces per thread: more balance the load and let a thread absorb a late one's share in finer
// steps; each claim is one atomic on a line the owner usually holds already.
constexpr int64_t kPiecesPerThread = 4;

constexpr uint64_t kGenMask = 0xffffffffu;
uint64_t run_word(uint64_t gen, uint64_t next, uint64_t end) {
  return ((gen & kGenMask) << 32) | (next << 16) | end;
}
}  // namespace

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  runs_ = std::make_unique<Run[]>(static_cast<size_t>(threads));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  wake_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_piece(int64_t piece, int index) {
  const int64_t b = piece * job_step_;
  const int64_t e = std::min(job_n_, b + job_step_);
  (*job_)(b, e, index);
  done_.fetch_add(1, std::memory_order_acq_rel);
}

void ThreadPool::work(uint64_t gen, int index) {
  const int threads = size();
  for (int k = 0; k < threads; ++k) {
    const bool own = k == 0;
    Run& r = runs_[static_cast<size_t>((index + k) % threads)];
    uint64_t cur = r.word.load(std::memory_order_acquire);
    for (;;) {
      if ((cur >> 32) != (gen & kGenMask)) return;  // a newer job: ours is finished
      const uint64_t next = (cur >> 16) & 0xffffu, end = cur & 0xffffu;
      if (next >= end) break;
      const uint64_t want = own ? cur + (uint64_t{1} << 16) : cur - 1;
      if (!r.word.compare_exchange_weak(cur, want, std::memory_order_acq_rel,
                                        std::memory_order_acquire)) {
        continue;  // cur now holds the current word
      }
      // The piece is ours, so run() is still waiting for it and the job fields are this
      // generation's.
      run_piece(static_cast<int64_t>(own ? next : end - 1), index);
      cur = r.word.load(std::memory_order_acquire);
    }
  }
}

void ThreadPool::run(int64_t n, Fn fn, int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t chunks = (n + grain - 1) / grain;
  if (chunks <= 1 || workers_.empty()) {
    fn(0, n, 0);
    return;
  }
  const int threads = size();
  // Pieces of whole grains, about kPiecesPerThread per thread (at most 2^16 - 1 in all).
  const int64_t want = std::min<int64_t>({chunks, kPiecesPerThread * threads, 0xffff});
  const int64_t step = (chunks + want - 1) / want * grain;
  job_ = &fn;
  job_n_ = n;
  job_step_ = step;
  job_pieces_ = (n + step - 1) / step;
  done_.store(0, std::memory_order_relaxed);
  const uint64_t gen = ++gen_;
  for (int t = 0; t < threads; ++t) {
    const auto b = static_cast<uint64_t>(job_pieces_ * t / threads);
    const auto e = static_cast<uint64_t>(job_pieces_ * (t + 1) / threads);
    runs_[static_cast<size_t>(t)].word.store(run_word(gen, b, e), std::memory_order_release);
  }
  // seq_cst store then seq_cst load of sleepers_ (a worker increments sleepers_ before it checks
  // generation_ under the mutex): either it sees this generation or it is notified.
  generation_.store(gen, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    wake_cv_.notify_all();
  }
  work(gen, 0);
  for (int i = 0; done_.load(std::memory_order_acquire) != job_pieces_; ++i) {
    if (i < kWaitSpins) {
      TM_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    // Spin for the next generation, then sleep.
    uint64_t gen = generation_.load(std::memory_order_acquire);
    for (int spins = 0; gen == seen && spins < kSpins; ++spins) {
      TM_CPU_RELAX();
      gen = generation_.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_cv_.wait(lock, [&] {
          return stop_.load() || generation_.load(std::memory_order_seq_cst) != seen;
        });
      }
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
      gen = generation_.load(std::memory_order_acquire);
    }
    if (stop_.load()) return;
    seen = gen;
    work(gen, index);
  }
}

}  // namespace tokenmill
