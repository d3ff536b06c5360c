// Fork-join thread pool for the CPU backend. One pool object is created by whoever owns the
// backend and passed down; nothing here is global.
//
// A decode step issues a few hundred small parallel ops, so hand-off latency matters more than
// anything, and on a shared machine a worker may be descheduled at any moment. So:
// - [0, n) is cut into a few pieces per thread, and thread t owns a contiguous run of them: it
//   claims its own pieces front to back (a GEMV streams one contiguous stretch of the weight per
//   thread, which the hardware prefetchers follow), then takes unclaimed pieces from the back of
//   the other threads' runs. The calling thread does the same, so when a worker is late it runs
//   that worker's pieces itself and only ever waits for pieces another thread has started;
// - workers spin briefly on an atomic generation counter before sleeping on a condition
//   variable, and run() touches the mutex only when a worker is actually asleep;
// - the job is passed as a non-owning callable reference (no std::function allocation).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace tokenmill {

class ThreadPool {
 public:
  // A non-owning reference to a callable void(int64_t begin, int64_t end, int worker); the
  // callable must outlive the run() call (a lambda argument does).
  class Fn {
   public:
    template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, Fn>>>
    Fn(F&& f)  // NOLINT(google-explicit-constructor): lambdas convert implicitly
        : obj_(const_cast<void*>(static_cast<const void*>(&f))),
          call_([](void* o, int64_t b, int64_t e, int w) {
            (*static_cast<std::remove_reference_t<F>*>(o))(b, e, w);
          }) {}
    void operator()(int64_t b, int64_t e, int w) const { call_(obj_, b, e, w); }

   private:
    void* obj_;
    void (*call_)(void*, int64_t, int64_t, int);
  };

  // threads <= 0: one per hardware thread.
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end, worker) over disjoint ranges covering [0, n) and returns when all are
  // done. Ranges are multiples of `grain` except the last one; a thread may get several ranges
  // or none (the calling thread, worker 0, may run all of them). `worker` < size() identifies
  // the thread running the range (for per-thread scratch). Not reentrant: fn must not call run()
  // on the same pool, and only one thread may call run() at a time.
  void run(int64_t n, Fn fn, int64_t grain = 1);

 private:
  // One thread's run of pieces: (generation << 32) | (next << 16) | end. The owner takes `next`
  // (next + 1), others take `end - 1` (end - 1); a CAS that fails once the word belongs to
  // another generation, so a late worker never takes a piece of a newer job, and never reads the
  // job's fields unless it holds an unfinished piece.
  struct alignas(64) Run {
    std::atomic<uint64_t> word{0};
  };

  void worker_loop(int index);
  // Claims and runs pieces of job `gen` (own run first, then the others') until none are left.
  void work(uint64_t gen, int index);
  void run_piece(int64_t piece, int index);

  std::vector<std::thread> workers_;
  std::unique_ptr<Run[]> runs_;  // size() runs
  std::mutex mu_;
  std::condition_variable wake_cv_;
  // The job, written by run() before the generation is published (release).
  const Fn* job_ = nullptr;
  int64_t job_n_ = 0, job_step_ = 1, job_pieces_ = 0;
  alignas(64) std::atomic<int64_t> done_{0};  // pieces finished of the current job
  alignas(64) std::atomic<uint64_t> generation_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  uint64_t gen_ = 0;  // run()'s thread only
};

}  // namespace tokenmill
