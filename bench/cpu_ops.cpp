// CPU backend decode bandwidth: measures the machine's read bandwidth with a STREAM-like read
// loop over a 1 GiB buffer on every pool thread, then GEMV (n = 1) through CpuBackend::linear
// over several large matrices (together far larger than the caches) and prints weight GB/s
// and the percentage of the measured bandwidth. Also a prefill GEMM figure (GFLOP/s).
//
//   tm_bench_cpu_ops [--reps N] [--threads T]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_simd.h"
#include "tensor/affine.h"
#include "util/thread_pool.h"

namespace {

using Clock = std::chrono::steady_clock;
using tokenmill::CpuBackend;
using tokenmill::DType;
using tokenmill::ThreadPool;
using tokenmill::Weight;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Stats {
  double best = 0, worst = 1e30, median = 0;
};
Stats summarize(std::vector<double> v) {  // v: GB/s per repetition
  std::sort(v.begin(), v.end());
  return {v.back(), v.front(), v[v.size() / 2]};
}

// Sum of every float of each thread's slice with 8 independent vector accumulators.
template <class S>
float read_slice(const float* p, int64_t n) {
  using V = typename S::V;
  constexpr int W = S::W;
  V a[8];
  for (auto& x : a) x = S::zero();
  for (int64_t i = 0; i + 8 * W <= n; i += 8 * W) {
    for (int u = 0; u < 8; ++u) a[u] = S::add(a[u], S::load(p + i + u * W));
  }
  for (int u = 1; u < 8; ++u) a[0] = S::add(a[0], a[u]);
  return S::reduce(a[0]);
}

Stats measure_read_bandwidth(ThreadPool& pool, int reps) {
  const int64_t n = (int64_t{1} << 30) / 4;
  std::vector<float> buf(static_cast<size_t>(n), 1.0f);
  std::vector<float> sums(static_cast<size_t>(pool.size()));
  std::vector<double> gbs;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    pool.run(
        n,
        [&](int64_t b, int64_t e, int t) {
          sums[static_cast<size_t>(t)] = read_slice<tokenmill::cpu::BestIsa>(buf.data() + b, e - b);
        },
        1 << 16);
    gbs.push_back(static_cast<double>(n) * 4 / seconds_since(t0) / 1e9);
  }
  if (sums[0] != sums[0]) std::printf("(impossible)\n");  // keep the sums observable
  return summarize(gbs);
}

struct Mat {
  std::vector<uint8_t> data, scales, biases;
  Weight w;
};

Mat make_bf16(int64_t rows, int64_t cols, std::mt19937& rng) {
  Mat m;
  m.data.resize(static_cast<size_t>(rows * cols * 2));
  std::normal_distribution<float> nd(0.0f, 0.02f);
  auto* p = reinterpret_cast<uint16_t*>(m.data.data());
  for (int64_t i = 0; i < rows * cols; ++i) p[i] = tokenmill::f32_to_bf16(nd(rng));
  m.w.dtype = DType::BF16;
  m.w.rows = rows;
  m.w.cols = cols;
  m.w.data = m.data.data();
  return m;
}

Mat make_affine(int64_t rows, int64_t cols, int bits, int group, std::mt19937& rng) {
  Mat m;
  const int64_t words = cols * bits / 32, groups = cols / group;
  m.data.resize(static_cast<size_t>(rows * words * 4));
  m.scales.resize(static_cast<size_t>(rows * groups * 2));
  m.biases.resize(m.scales.size());
  // Random codes and scales: the kernels' speed does not depend on the values.
  auto* d = reinterpret_cast<uint32_t*>(m.data.data());
  for (int64_t i = 0; i < rows * words; ++i) d[i] = static_cast<uint32_t>(rng());
  auto* s = reinterpret_cast<uint16_t*>(m.scales.data());
  auto* b = reinterpret_cast<uint16_t*>(m.biases.data());
  for (int64_t i = 0; i < rows * groups; ++i) {
    s[i] = tokenmill::f32_to_bf16((rng() % 2 ? 1.0f : -1.0f) * 0.001f);
    b[i] = tokenmill::f32_to_bf16(-0.008f);
  }
  m.w.dtype = DType::U32;
  m.w.bits = bits;
  m.w.group = group;
  m.w.scale_dtype = DType::BF16;
  m.w.rows = rows;
  m.w.cols = cols;
  m.w.data = m.data.data();
  m.w.scales = m.scales.data();
  m.w.biases = m.biases.data();
  return m;
}

// GEMV over the matrices in turn; returns weight GB/s per repetition (one pass over all).
Stats bench_gemv(CpuBackend& be, std::vector<Mat>& mats, int64_t n, int reps) {
  const int64_t cols = mats[0].w.cols, rows = mats[0].w.rows;
  std::vector<float> x(static_cast<size_t>(n * cols), 0.5f), out(static_cast<size_t>(n * rows));
  size_t bytes = 0;
  for (auto& m : mats) bytes += m.w.total_bytes();
  for (auto& m : mats) be.linear(x.data(), n, m.w, out.data());  // warm-up (page faults)
  std::vector<double> gbs;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    for (auto& m : mats) be.linear(x.data(), n, m.w, out.data());
    gbs.push_back(static_cast<double>(bytes) / seconds_since(t0) / 1e9);
  }
  return summarize(gbs);
}

double bench_gemm_gflops(CpuBackend& be, Mat& m, int64_t n) {
  std::vector<float> x(static_cast<size_t>(n * m.w.cols), 0.25f);
  std::vector<float> out(static_cast<size_t>(n * m.w.rows));
  be.linear(x.data(), n, m.w, out.data());
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    auto t0 = Clock::now();
    be.linear(x.data(), n, m.w, out.data());
    best = std::min(best, seconds_since(t0));
  }
  return 2.0 * static_cast<double>(n * m.w.rows * m.w.cols) / best / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 7, threads = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::max(1, std::atoi(argv[i + 1]));
    if (std::strcmp(argv[i], "--threads") == 0) threads = std::atoi(argv[i + 1]);
  }
  ThreadPool pool(threads);
  CpuBackend be(pool);
  std::printf("cpu_ops: %d threads, kernels %s, %d repetitions (best / median / worst)\n",
              pool.size(), be.isa(), reps);
  const Stats bw = measure_read_bandwidth(pool, reps);
  std::printf("read bandwidth (1 GiB, all threads): %.1f / %.1f / %.1f GB/s\n", bw.best, bw.median,
              bw.worst);

  std::mt19937 rng(1);
  const int64_t R = 8192, C = 8192;
  auto report = [&](const char* what, const Stats& s) {
    std::printf("%-34s %6.1f / %6.1f / %6.1f GB/s  = %5.1f%% of read bandwidth (best/best)\n", what,
                s.best, s.median, s.worst, 100.0 * s.best / bw.best);
  };
  {
    std::vector<Mat> mats;
    for (int i = 0; i < 4; ++i) mats.push_back(make_bf16(R, C, rng));  // 4 x 128 MiB
    report("gemv n=1 bf16 8192x8192 x4", bench_gemv(be, mats, 1, reps));
    report("gemv n=4 bf16 8192x8192 x4", bench_gemv(be, mats, 4, reps));
    Mat g = make_bf16(4096, 4096, rng);
    std::printf("gemm n=256 bf16 4096x4096: %.1f GFLOP/s\n", bench_gemm_gflops(be, g, 256));
  }
  {
    std::vector<Mat> mats;
    for (int i = 0; i < 8; ++i) mats.push_back(make_affine(R, C, 4, 64, rng));  // 8 x 34 MiB
    report("gemv n=1 affine4 g64 8192x8192 x8", bench_gemv(be, mats, 1, reps));
    report("gemv n=4 affine4 g64 8192x8192 x8", bench_gemv(be, mats, 4, reps));
    Mat g = make_affine(4096, 4096, 4, 64, rng);
    std::printf("gemm n=256 affine4 g64 4096x4096: %.1f GFLOP/s\n", bench_gemm_gflops(be, g, 256));
  }
  {
    std::vector<Mat> mats;
    for (int i = 0; i < 4; ++i) mats.push_back(make_affine(R, C, 8, 64, rng));
    report("gemv n=1 affine8 g64 8192x8192 x4", bench_gemv(be, mats, 1, reps));
    std::vector<Mat> m3;
    for (int i = 0; i < 6; ++i) m3.push_back(make_affine(R, C, 3, 64, rng));
    report("gemv n=1 affine3 g64 8192x8192 x6", bench_gemv(be, m3, 1, reps));
  }
  return 0;
}
