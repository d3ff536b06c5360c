#include "app/bench_probe.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <random>
#include <vector>

namespace tokenmill::app {

namespace {
using Clock = std::chrono::steady_clock;

std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      if (p != std::string::npos) return line.substr(p + 2);
    }
  }
  return "unknown CPU";
}
}  // namespace

bool is_cpu_backend(const Backend& backend) {
  return backend.name().rfind("cpu", 0) == 0;
}

std::string describe_device(Backend& backend, int threads) {
  if (is_cpu_backend(backend))
    return backend.name() + ": " + cpu_model_name() + ", " + std::to_string(threads) + " threads";
  return backend.name();
}

double measure_read_bandwidth(Backend& backend, ThreadPool& pool) {
  if (!is_cpu_backend(backend)) return 0.0;
  const size_t n = (size_t{1} << 30) / sizeof(uint64_t);
  std::vector<uint64_t> buf(n);
  pool.run(
      static_cast<int64_t>(n),
      [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i)
          buf[static_cast<size_t>(i)] = static_cast<uint64_t>(i) * 2654435761u;
      },
      4096);
  double best = 0;
  std::vector<uint64_t> partial(static_cast<size_t>(pool.size()) * 8);
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = Clock::now();
    pool.run(
        static_cast<int64_t>(n),
        [&](int64_t b, int64_t e, int w) {
          // Four independent accumulators keep several loads in flight.
          uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
          const uint64_t* p = buf.data();
          int64_t i = b;
          for (; i + 4 <= e; i += 4) {
            s0 += p[i];
            s1 += p[i + 1];
            s2 += p[i + 2];
            s3 += p[i + 3];
          }
          for (; i < e; ++i) s0 += p[i];
          partial[static_cast<size_t>(w) * 8] = s0 + s1 + s2 + s3;
        },
        1 << 16);
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, n * sizeof(uint64_t) / s / 1e9);
  }
  volatile uint64_t sink = 0;
  for (uint64_t v : partial) sink = sink + v;
  return best;
}

double measure_bf16_matmul(Backend& backend) {
  const int64_t rows = 2048, cols = 2048, n = 128;
  std::vector<uint16_t> w(static_cast<size_t>(rows * cols));
  std::mt19937 r(1);
  for (auto& x : w) x = static_cast<uint16_t>(0x3c00 + (r() & 0xff));  // small positive bf16 values
  std::vector<float> x(static_cast<size_t>(n * cols), 0.5f);
  Weight host;
  host.dtype = DType::BF16;
  host.rows = rows;
  host.cols = cols;
  host.data = w.data();
  Weight dw = backend.upload_weight(host);
  void* dx = backend.alloc(x.size() * 4);
  void* dy = backend.alloc(static_cast<size_t>(n * rows) * 4);
  backend.upload(dx, x.data(), x.size() * 4);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    backend.synchronize();
    auto t0 = Clock::now();
    backend.linear(static_cast<float*>(dx), n, dw, static_cast<float*>(dy));
    backend.synchronize();
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, 2.0 * rows * cols * n / s / 1e12);
  }
  backend.free(dx);
  backend.free(dy);
  return best;
}

}  // namespace tokenmill::app
