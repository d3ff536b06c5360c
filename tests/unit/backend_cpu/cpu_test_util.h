// Shared helpers for the CPU backend tests: random inputs, double-precision reference
// dequantization written plainly from MODEL-SPEC A, and the two backends under test (portable
// scalar kernels and the SIMD kernels of this build).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "support/test_rng.h"
#include "tensor/affine.h"
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

// Float weight of type t (F32, F16, BF16) with normal entries.
inline TestWeight make_float_weight(Rng& rng, DType t, int64_t rows, int64_t cols,
                                    int64_t experts = 0) {
  TestWeight tw;
  const int64_t count = (experts ? experts : 1) * rows * cols;
  tw.data.resize(static_cast<size_t>(count) * dtype_size(t));
  tw.values.resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const float v = rng.normal(0.5f);
    if (t == DType::F32) {
      std::memcpy(tw.data.data() + i * 4, &v, 4);
      tw.values[i] = v;
    } else {
      const uint16_t h = t == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
      std::memcpy(tw.data.data() + i * 2, &h, 2);
      tw.values[i] = t == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  }
  tw.w.dtype = t;
  tw.w.data = tw.data.data();
  tw.w.rows = rows;
  tw.w.cols = cols;
  tw.w.experts = experts;
  return tw;
}

// MLX affine weight quantized from normal values; scales/biases stored as `sd`. The reference
// values decode the packed stream with the spec's formula (a 64-bit window over two words).
inline TestWeight make_affine_weight(Rng& rng, int bits, int group, DType sd, int64_t rows,
                                     int64_t cols, int64_t experts = 0) {
  TestWeight tw;
  const int64_t mats = experts ? experts : 1, groups = cols / group;
  const int64_t words = cols * bits / 32;
  std::vector<float> src(static_cast<size_t>(rows * cols)), s(static_cast<size_t>(rows * groups)),
      b(s.size());
  std::vector<uint32_t> packed(static_cast<size_t>(rows * words));
  tw.data.resize(static_cast<size_t>(mats * rows * words * 4));
  tw.scales.resize(static_cast<size_t>(mats * rows * groups) * dtype_size(sd));
  tw.biases.resize(tw.scales.size());
  tw.values.resize(static_cast<size_t>(mats * rows * cols));
  for (int64_t e = 0; e < mats; ++e) {
    for (auto& v : src) v = rng.normal(0.5f) + 0.1f;
    affine::quantize(src.data(), rows, cols, bits, group, packed.data(), s.data(), b.data());
    std::memcpy(tw.data.data() + e * rows * words * 4, packed.data(), packed.size() * 4);
    for (int64_t i = 0; i < rows * groups; ++i) {
      const int64_t at = e * rows * groups + i;
      if (sd == DType::F32) {
        std::memcpy(tw.scales.data() + at * 4, &s[i], 4);
        std::memcpy(tw.biases.data() + at * 4, &b[i], 4);
      } else {
        const uint16_t hs = sd == DType::BF16 ? f32_to_bf16(s[i]) : f32_to_f16(s[i]);
        const uint16_t hb = sd == DType::BF16 ? f32_to_bf16(b[i]) : f32_to_f16(b[i]);
        std::memcpy(tw.scales.data() + at * 2, &hs, 2);
        std::memcpy(tw.biases.data() + at * 2, &hb, 2);
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const uint32_t* row = packed.data() + r * words;
      for (int64_t j = 0; j < cols; ++j) {
        const int64_t off = j * bits;
        const uint64_t lo = row[off >> 5];
        const uint64_t hi = (off >> 5) + 1 < words ? row[(off >> 5) + 1] : 0;
        const uint64_t q = (((hi << 32) | lo) >> (off & 31)) & ((1u << bits) - 1);
        const int64_t gi = e * rows * groups + r * groups + j / group;
        tw.values[static_cast<size_t>((e * rows + r) * cols + j)] =
            scale_value(sd, tw.scales.data(), gi) * static_cast<double>(q) +
            scale_value(sd, tw.biases.data(), gi);
      }
    }
  }
  tw.w.dtype = DType::U32;
  tw.w.bits = bits;
  tw.w.group = group;
  tw.w.scale_dtype = sd;
  tw.w.data = tw.data.data();
  tw.w.scales = tw.scales.data();
  tw.w.biases = tw.biases.data();
  tw.w.rows = rows;
  tw.w.cols = cols;
  tw.w.experts = experts;
  return tw;
}

inline double silu_d(double x) {
  return x / (1.0 + std::exp(-x));
}
inline double sigmoid_d(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

}  // namespace tokenmill::test
