// Decode matmul bandwidth on any backend: Backend::linear (and linear_multi) at n = 1, 4, 16, 64
// activation rows over Qwen3.5-27B-sized matrices in bf16, 4-bit and 8-bit, rotating through
// enough copies that the weights never sit in a cache (>= 512 MB per format). Prints the
// weight GB/s of each kernel and its share of the read bandwidth Backend::read_probe measures
// on the same device. Weights are dummy values filled where they live (Backend::fill_random).
// Then a size sweep of the 4-bit GEMV at n = 1 (0.3-100 MB matrices, the 35B-A3B's experts to
// the 27B's MLP): microseconds per call when the calls run back to back as in a decode step
// (recorded once and replayed where the backend records, so launch costs are the device's, not
// the host's), and a least-squares line: fixed microseconds per call + bytes at a marginal rate.
//
//   tm_bench_linear_ops [--device cpu|cuda|auto] [--reps N] [--formats bf16,q4g64,q8g64]
//                       [--rows 1,4,16,64] [--no-sweep]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "app/backend_select.h"
#include "app/bench_probe.h"

namespace {

using namespace tokenmill;
using Clock = std::chrono::steady_clock;

struct Format {
  const char* name;
  int bits;  // 0 = bf16
};
constexpr Format kFormats[] = {{"bf16", 0}, {"q4g64", 4}, {"q8g64", 8}};

// `copies` device matrices of one shape and format, filled with random values.
std::vector<Weight> make_weights(Backend& be, const Format& f, int64_t rows, int64_t cols,
                                 int copies, std::vector<void*>& owned) {
  std::vector<Weight> ws;
  for (int c = 0; c < copies; ++c) {
    Weight w;
    w.rows = rows;
    w.cols = cols;
    auto make = [&](DType dt, int64_t n, float sd, uint64_t seed) {
      void* p = be.alloc(static_cast<size_t>(n) * dtype_size(dt));
      owned.push_back(p);
      be.fill_random(p, dt, n, sd, seed);
      return p;
    };
    if (f.bits == 0) {
      w.dtype = DType::BF16;
      w.data = make(DType::BF16, rows * cols, 0.02f, 10 + c);
    } else {
      w.dtype = DType::U32;
      w.bits = f.bits;
      w.group = 64;
      w.scale_dtype = DType::BF16;
      w.data = make(DType::U32, rows * cols * f.bits / 32, 0.0f, 20 + c);
      w.scales = make(DType::BF16, rows * (cols / 64), 0.001f, 30 + c);
      w.biases = make(DType::BF16, rows * (cols / 64), 0.01f, 40 + c);
    }
    // The backend's own arrangement (4-bit tiles on CUDA), as for a loaded model.
    const Weight packed = be.pack_weight(w);
    release_replaced(be, w, packed, owned);
    ws.push_back(packed);
  }
  return ws;
}

// Best GB/s of weight bytes over `reps` passes through all copies.
double time_linear(Backend& be, const std::vector<Weight>& ws, const float* x, int64_t n,
                   float* out, int reps) {
  double best = 0;
  for (int r = 0; r < reps + 1; ++r) {
    be.synchronize();
    const auto t0 = Clock::now();
    for (const Weight& w : ws) be.linear(x, n, w, out);
    be.synchronize();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (r > 0)
      best = std::max(best, static_cast<double>(ws.size() * ws[0].total_bytes()) / s / 1e9);
  }
  return best;
}

// Microseconds per call of `ws` run back to back (each matrix once per pass), best of `reps`
// passes; recorded and replayed where the backend can.
double us_per_call(Backend& be, const std::vector<Weight>& ws, const float* x, float* out,
                   int reps) {
  int64_t rec = -1;
  if (be.can_record()) {
    be.synchronize();
    be.begin_recording();
    for (const Weight& w : ws) be.linear(x, 1, w, out);
    rec = be.end_recording(true);
  }
  double best = 1e30;
  for (int r = 0; r < reps + 1; ++r) {
    be.synchronize();
    const auto t0 = Clock::now();
    if (rec >= 0) {
      be.replay(rec);
    } else {
      for (const Weight& w : ws) be.linear(x, 1, w, out);
    }
    be.synchronize();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (r > 0) best = std::min(best, s * 1e6 / static_cast<double>(ws.size()));
  }
  if (rec >= 0) be.forget_recording(rec);
  return best;
}

void size_sweep(Backend& be, const float* x, float* out, double bw, int reps) {
  std::printf("\n4-bit g64 GEMV, 1 row, calls back to back%s:\n",
              be.can_record() ? " (replayed recording)" : "");
  std::printf("%-14s %10s %10s %10s %8s\n", "shape", "MB", "us/call", "GB/s", "% bw");
  const Format q4{"q4g64", 4};
  std::vector<double> mb, us;
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{512, 2048},
                                                                           {2048, 2048},
                                                                           {8192, 2048},
                                                                           {5120, 6144},
                                                                           {16480, 5120},
                                                                           {5120, 17408},
                                                                           {34816, 5120}}) {
    std::vector<void*> owned;
    const double bytes = rows * cols * (0.5 + 4.0 / 64);
    const int copies = static_cast<int>(std::clamp(512e6 / bytes, 4.0, 256.0));
    std::vector<Weight> ws = make_weights(be, q4, rows, cols, copies, owned);
    const double t = us_per_call(be, ws, x, out, reps);
    std::printf("%6lldx%-7lld %10.2f %10.2f %10.1f %7.1f%%\n", static_cast<long long>(rows),
                static_cast<long long>(cols), bytes / 1e6, t, bytes / t / 1e3,
                100.0 * bytes / t / 1e3 / bw);
    mb.push_back(bytes / 1e6);
    us.push_back(t);
    be.synchronize();
    for (void* p : owned) be.free(p);
  }
  // us = a + b * MB by least squares: a is the fixed cost of a call, 1e3 / b the marginal GB/s.
  const double k = static_cast<double>(mb.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < mb.size(); ++i) {
    sx += mb[i], sy += us[i], sxx += mb[i] * mb[i], sxy += mb[i] * us[i];
  }
  const double b = (k * sxy - sx * sy) / (k * sxx - sx * sx), a = (sy - b * sx) / k;
  std::printf("fit: %.2f us per call + bytes at %.1f GB/s (%.1f%% of the read bandwidth)\n", a,
              1e3 / b, 100.0 * 1e3 / b / bw);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Decode matmul bandwidth of a backend"};
  app::DeviceOptions dev;
  int reps = 5;
  std::vector<std::string> formats;
  for (const Format& f : kFormats) formats.emplace_back(f.name);
  std::vector<int64_t> row_counts{1, 4, 16, 64};
  bool no_sweep = false;
  app::add_device_options(app, dev);
  app.add_option("--reps", reps, "Timed passes (best is reported)")->capture_default_str();
  app.add_option("--formats", formats, "Weight formats to time")
      ->delimiter(',')
      ->check(CLI::IsMember(std::vector<std::string>(formats)))
      ->capture_default_str();
  app.add_option("--rows", row_counts, "Activation row counts to time")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{64}))
      ->capture_default_str();
  app.add_flag("--no-sweep", no_sweep, "Skip the 1-row 4-bit size sweep");
  CLI11_PARSE(app, argc, argv);

  app::BackendHandle h = app::make_backend(dev);
  Backend& be = *h.backend;
  const double bw = app::measure_read_bandwidth(be, *h.pool);
  std::printf("%s\nread bandwidth (read_probe): %.1f GB/s\n\n", be.name().c_str(), bw);

  const int64_t H = 5120, I = 17408;  // the 27B shape: MLP up (I x H) and down (H x I)
  constexpr int64_t kMaxN = 64;       // --rows is checked against it
  void* x = be.alloc(static_cast<size_t>(kMaxN * I) * 4);
  void* out = be.alloc(static_cast<size_t>(kMaxN * I) * 4 * 3);
  be.fill_random(x, DType::F32, kMaxN * I, 1.0f, 1);
  std::printf("%-8s %-14s %6s %10s %8s\n", "format", "shape", "rows", "GB/s", "% bw");
  for (const Format& f : kFormats) {
    if (std::find(formats.begin(), formats.end(), f.name) == formats.end()) continue;
    for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{I, H}, {H, I}}) {
      std::vector<void*> owned;
      const double bytes = f.bits ? rows * cols * (f.bits / 8.0 + 4.0 / 64) : rows * cols * 2.0;
      const int copies = static_cast<int>(std::max(2.0, 512e6 / bytes));
      std::vector<Weight> ws = make_weights(be, f, rows, cols, copies, owned);
      for (int64_t n : row_counts) {
        const double gbs =
            time_linear(be, ws, static_cast<const float*>(x), n, static_cast<float*>(out), reps);
        std::printf("%-8s %6lldx%-7lld %6lld %10.1f %7.1f%%\n", f.name,
                    static_cast<long long>(rows), static_cast<long long>(cols),
                    static_cast<long long>(n), gbs, 100.0 * gbs / bw);
      }
      // gate and up of one layer in one call at 1 row, as the model runs them
      if (rows == I && std::find(row_counts.begin(), row_counts.end(), 1) != row_counts.end()) {
        double best = 0;
        for (int r = 0; r < reps + 1; ++r) {
          be.synchronize();
          const auto t0 = Clock::now();
          for (size_t c = 0; c + 1 < ws.size(); c += 2) {
            const Weight* pair[] = {&ws[c], &ws[c + 1]};
            float* outs[] = {static_cast<float*>(out), static_cast<float*>(out) + I};
            be.linear_multi(static_cast<const float*>(x), 1, pair, outs, 2);
          }
          be.synchronize();
          const double s = std::chrono::duration<double>(Clock::now() - t0).count();
          const double moved = static_cast<double>(ws.size() / 2 * 2 * ws[0].total_bytes());
          if (r > 0) best = std::max(best, moved / s / 1e9);
        }
        std::printf("%-8s %-14s %6d %10.1f %7.1f%%\n", f.name, "multi 2x up", 1, best,
                    100.0 * best / bw);
      }
      be.synchronize();
      for (void* p : owned) be.free(p);
    }
  }
  if (!no_sweep) size_sweep(be, static_cast<const float*>(x), static_cast<float*>(out), bw, reps);
  be.free(x);
  be.free(out);
  return 0;
}
