// Shared helpers for the CUDA backend tests: both backends (the CPU reference and CUDA device
// 0), device buffers, and comparisons. Every test compares the CUDA backend with the CPU
// backend on the same random inputs. Without a CUDA device the tests skip (the only skip).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "support/test_rng.h"
#include "support/test_weights.h"
#include "util/thread_pool.h"

namespace tokenmill::cudatest {

using test::affine_weight;
using test::float_weight;
using test::HostWeight;
using test::rebind;
using test::Rng;

// Skips the calling test when no CUDA device is visible (and says so on stdout).
#define TM_REQUIRE_CUDA_DEVICE()                                                       \
  do {                                                                                 \
    if (::tokenmill::cuda_device_count() == 0) {                                       \
      std::printf("[  SKIPPED ] no CUDA device present: CUDA backend test not run\n"); \
      GTEST_SKIP() << "no CUDA device present";                                        \
    }                                                                                  \
  } while (0)

class CudaVsCpu : public ::testing::Test {
 protected:
  void SetUp() override {
    TM_REQUIRE_CUDA_DEVICE();
    gpu = make_cuda_backend(0);
  }
  void TearDown() override {
    if (!gpu) return;
    gpu->synchronize();
    for (void* p : bufs_) gpu->free(p);
  }

  // Device copy of a host vector (freed at teardown).
  template <class T>
  T* up(const std::vector<T>& v) {
    void* p = gpu->alloc(std::max<size_t>(v.size(), 1) * sizeof(T));
    bufs_.push_back(p);
    if (!v.empty()) gpu->upload(p, v.data(), v.size() * sizeof(T));
    return static_cast<T*>(p);
  }
  // Device buffer of n floats filled with NaN: every element an op must write is checked.
  float* poisoned(size_t n) {
    return up(std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()));
  }
  template <class T>
  std::vector<T> down(const T* p, size_t n) {
    std::vector<T> v(n);
    gpu->download(v.data(), p, n * sizeof(T));
    return v;
  }

  ThreadPool pool{3};
  std::unique_ptr<CpuBackend> cpu = std::make_unique<CpuBackend>(pool);
  std::unique_ptr<Backend> gpu;

 private:
  std::vector<void*> bufs_;
};

// |got - want| <= tol * (|want| + rms(want)) elementwise (the rms term keeps cancellations
// near zero from failing a correct result); NaN or size mismatch fails. Returns the worst
// ratio of error to allowance (< 1 passes).
inline double expect_close(const std::vector<float>& got, const std::vector<float>& want,
                           double tol, const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  if (got.size() != want.size()) return INFINITY;
  double ss = 0;
  for (float w : want) ss += double{w} * w;
  const double rms = want.empty() ? 0.0 : std::sqrt(ss / static_cast<double>(want.size()));
  double worst = 0;
  size_t bad = 0, first_bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double allow = tol * (std::fabs(double{want[i]}) + rms) + 1e-30;
    const double err = std::fabs(double{got[i]} - want[i]);
    const double r = std::isnan(err) ? INFINITY : err / allow;
    if (r > worst) worst = r;
    if (!(r <= 1.0) && bad++ == 0) first_bad = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements off; first at "
                     << first_bad << ": cuda " << got[first_bad] << " vs cpu " << want[first_bad]
                     << " (tolerance " << tol << " relative)";
  return worst;
}

}  // namespace tokenmill::cudatest
