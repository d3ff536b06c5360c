// Shared helpers for the CPU backend tests: random inputs, double-precision reference
// dequantization written plainly from MODEL-SPEC A, and the two backends under test (portable
// scalar kernels and the SIMD kernels of this build).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "support/test_rng.h"
#include "support/test_weights.h"
#include "tensor/dtype.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace tokenmill::test {

// Both kernel sets. Three threads on purpose: uneven splits of every parallel loop.
struct Backends {
  ThreadPool pool{3};
  std::unique_ptr<CpuBackend> scalar =
      std::make_unique<CpuBackend>(pool, CpuBackendOptions{.scalar_kernels = true});
  std::unique_ptr<CpuBackend> simd = std::make_unique<CpuBackend>(pool);
  std::vector<CpuBackend*> all() { return {scalar.get(), simd.get()}; }
};

// A weight with its storage, plus the exact values it represents (as double) for references.
struct TestWeight {
  Weight w;
  std::vector<uint8_t> data, scales, biases;
  std::vector<double> values;  // [experts or 1, rows, cols] dequantized exactly from storage
};

inline double scale_value(DType t, const uint8_t* p, int64_t i) {
  if (t == DType::F32) {
    float f;
    std::memcpy(&f, p + i * 4, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p + i * 2, 2);
  return t == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

// Takes a shared builder's weight (support/test_weights.h); its storage moves, so w's pointers
// stay valid. values are filled by the caller.
inline TestWeight take(HostWeight h) {
  TestWeight tw;
  tw.w = h.w;
  tw.data = std::move(h.data);
  tw.scales = std::move(h.scales);
  tw.biases = std::move(h.biases);
  return tw;
}

// Float weight of type t (F32, F16, BF16) with normal entries.
inline TestWeight make_float_weight(Rng& rng, DType t, int64_t rows, int64_t cols,
                                    int64_t experts = 0) {
  TestWeight tw = take(float_weight(rng, t, rows, cols, experts));
  const size_t count = tw.data.size() / dtype_size(t);
  tw.values.resize(count);
  for (size_t i = 0; i < count; ++i) tw.values[i] = scale_value(t, tw.data.data(), i);
  return tw;
}

// MLX affine weight quantized from normal values; scales/biases stored as `sd`. The reference
// values decode the packed stream with the spec's formula (a 64-bit window over two words).
inline TestWeight make_affine_weight(Rng& rng, int bits, int group, DType sd, int64_t rows,
                                     int64_t cols, int64_t experts = 0) {
  TestWeight tw = take(affine_weight(rng, bits, group, sd, rows, cols, experts));
  const int64_t mats = experts ? experts : 1, groups = cols / group;
  const int64_t words = cols * bits / 32;
  tw.values.resize(static_cast<size_t>(mats * rows * cols));
  const auto word = [&](int64_t i) {
    uint32_t v;
    std::memcpy(&v, tw.data.data() + i * 4, 4);
    return uint64_t{v};
  };
  for (int64_t e = 0; e < mats; ++e) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t row = (e * rows + r) * words;
      for (int64_t j = 0; j < cols; ++j) {
        const int64_t off = j * bits;
        const uint64_t lo = word(row + (off >> 5));
        const uint64_t hi = (off >> 5) + 1 < words ? word(row + (off >> 5) + 1) : 0;
        const uint64_t q = (((hi << 32) | lo) >> (off & 31)) & ((1u << bits) - 1);
        const int64_t gi = e * rows * groups + r * groups + j / group;
        tw.values[static_cast<size_t>((e * rows + r) * cols + j)] =
            scale_value(sd, tw.scales.data(), gi) * static_cast<double>(q) +
            scale_value(sd, tw.biases.data(), gi);
      }
    }
  }
  return tw;
}

inline double silu_d(double x) {
  return x / (1.0 + std::exp(-x));
}
inline double sigmoid_d(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

}  // namespace tokenmill::test
