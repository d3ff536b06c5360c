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

// x [n, w.cols] (host) through backend b's linear on the device (w uploaded to b): returns
// [n, w.rows] on the host; the device buffers are freed.
inline std::vector<float> device_linear(Backend& b, const std::vector<float>& x, int64_t n,
                                        const Weight& w) {
  std::vector<float> got(static_cast<size_t>(n * w.rows));
  auto* dx = static_cast<float*>(b.alloc(x.size() * sizeof(float)));
  auto* dout = static_cast<float*>(b.alloc(got.size() * sizeof(float)));
  b.upload(dx, x.data(), x.size() * sizeof(float));
  b.linear(dx, n, w, dout);
  b.download(got.data(), dout, got.size() * sizeof(float));
  b.free(dx);
  b.free(dout);
  return got;
}

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

  // A BF16 paged cache whose contexts are filled with random values: sequence s holds ctx[s]
  // positions in blocks shuffled over the cache, and its last rows[s] positions are the step's
  // query rows. The host layout and paging (seqs, pg, kv) and their device copies (d*).
  struct FilledCache {
    std::vector<int32_t> tables, cu = {0}, positions, ctx;
    std::vector<uint16_t> kc, vc;
    int max_blocks = 0, tokens = 0;
    SeqLayout seqs, dseqs;
    KVPaging pg, dpg;
    KVLayerView kv, dkv;
    FilledCache() = default;
    FilledCache(FilledCache&&) = default;  // the views point into the vectors: moves keep them
    FilledCache(const FilledCache&) = delete;
  };
  FilledCache filled_bf16_cache(Rng& rng, const std::vector<int>& ctx, const std::vector<int>& rows,
                                int block_size, int kv_heads, int D) {
    FilledCache c;
    const int S = static_cast<int>(ctx.size());
    c.max_blocks = (*std::max_element(ctx.begin(), ctx.end()) + block_size - 1) / block_size;
    int num_blocks = 0;
    for (int n : ctx) num_blocks += (n + block_size - 1) / block_size;
    std::vector<int32_t> phys(num_blocks);
    for (int i = 0; i < num_blocks; ++i) phys[i] = i;
    std::shuffle(phys.begin(), phys.end(), rng.gen);
    c.tables.assign(static_cast<size_t>(S) * c.max_blocks, -1);
    for (int s = 0, next = 0; s < S; ++s) {
      for (int b = 0; b * block_size < ctx[s]; ++b) {
        c.tables[static_cast<size_t>(s) * c.max_blocks + b] = phys[next++];
      }
    }
    const size_t cache_n = static_cast<size_t>(num_blocks) * block_size * kv_heads * D;
    c.kc.resize(cache_n);
    c.vc.resize(cache_n);
    for (size_t i = 0; i < cache_n; ++i) {
      c.kc[i] = f32_to_bf16(rng.normal());
      c.vc[i] = f32_to_bf16(rng.normal());
    }
    c.ctx.assign(ctx.begin(), ctx.end());
    for (int s = 0; s < S; ++s) {
      for (int r = rows[s]; r > 0; --r) c.positions.push_back(ctx[s] - r);
      c.cu.push_back(c.cu.back() + rows[s]);
    }
    c.tokens = c.cu.back();
    c.seqs = SeqLayout{S, c.tokens, c.cu.data(), c.positions.data(),
                       *std::max_element(rows.begin(), rows.end())};
    c.pg = KVPaging{c.tables.data(), c.max_blocks, c.ctx.data(),
                    *std::max_element(ctx.begin(), ctx.end())};
    c.kv = KVLayerView{c.kc.data(), c.vc.data(), block_size, kv_heads, D, DType::BF16};
    c.dkv = KVLayerView{up(c.kc), up(c.vc), block_size, kv_heads, D, DType::BF16};
    c.dseqs = c.seqs;
    c.dseqs.cu_seqlens = up(c.cu);
    c.dseqs.positions = up(c.positions);
    c.dpg = c.pg;
    c.dpg.block_tables = up(c.tables);
    c.dpg.context_lens = up(c.ctx);
    return c;
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
