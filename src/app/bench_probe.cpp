#include "app/bench_probe.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <random>
#include <vector>

#include "app/backend_select.h"

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

std::string describe_device(Backend& backend, int threads) {
  if (is_cpu_backend(backend))
    return backend.name() + ": " + cpu_model_name() + ", " + std::to_string(threads) + " threads";
  return backend.name();
}

double measure_read_bandwidth(Backend& backend, ThreadPool& pool) {
  (void)pool;
  // Far beyond every cache: 1 GiB on the CPU (its L3 is tens of MB), 4 GiB on a GPU (its L2 is
  // tens of MB and a short kernel would be dominated by launch latency).
  const size_t bytes = is_cpu_backend(backend) ? size_t{1} << 30 : size_t{4} << 30;
  void* buf = backend.alloc(bytes);
  void* sink = backend.alloc(64);
  backend.fill_random(buf, DType::U32, static_cast<int64_t>(bytes / 4), 0.0f, 7);
  backend.read_probe(buf, bytes, sink);  // warm-up: first touch, clocks
  backend.synchronize();
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = Clock::now();
    backend.read_probe(buf, bytes, sink);
    backend.synchronize();
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, bytes / s / 1e9);
  }
  backend.free(sink);
  backend.free(buf);
  return best;
}

double measure_bf16_matmul(Backend& backend) {
  // A GPU needs a prefill-sized product to show its rate (2048 x 2048 x 128 is launch overhead
  // there); the CPU's rate is reached at the small size, which keeps the bench quick.
  const bool gpu = backend.name().rfind("cuda", 0) == 0;
  const int64_t rows = gpu ? 8192 : 2048, cols = gpu ? 8192 : 2048, n = gpu ? 2048 : 128;
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
