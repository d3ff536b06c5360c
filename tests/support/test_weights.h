// Host weights for the backend tests: random float matrices and MLX affine matrices (quantized
// from random values), held with their bytes. The CPU tests add exact reference values
// (backend_cpu/cpu_test_util.h); the CUDA tests compare against the CPU backend instead.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "support/test_rng.h"
#include "tensor/affine.h"
#include "tensor/dtype.h"

namespace tokenmill::test {

struct HostWeight {
  Weight w;
  std::vector<uint8_t> data, scales, biases;
};

// Points each weight at its own bytes (a copy of a HostWeight still points at the original's).
inline void rebind(std::vector<HostWeight>& ws) {
  for (HostWeight& hw : ws) {
    hw.w.data = hw.data.data();
    if (hw.w.quantized()) {
      hw.w.scales = hw.scales.data();
      hw.w.biases = hw.biases.data();
    }
  }
}

inline HostWeight float_weight(Rng& rng, DType t, int64_t rows, int64_t cols, int64_t experts) {
  HostWeight h;
  const int64_t count = (experts ? experts : 1) * rows * cols;
  h.data.resize(static_cast<size_t>(count) * dtype_size(t));
  for (int64_t i = 0; i < count; ++i) {
    const float v = rng.normal(0.5f);
    if (t == DType::F32) {
      std::memcpy(h.data.data() + i * 4, &v, 4);
    } else {
      const uint16_t b = t == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
      std::memcpy(h.data.data() + i * 2, &b, 2);
    }
  }
  h.w.dtype = t;
  h.w.data = h.data.data();
  h.w.rows = rows;
  h.w.cols = cols;
  h.w.experts = experts;
  return h;
}

inline HostWeight affine_weight(Rng& rng, int bits, int group, DType sd, int64_t rows, int64_t cols,
                                int64_t experts) {
  HostWeight h;
  const int64_t mats = experts ? experts : 1, groups = cols / group, words = cols * bits / 32;
  std::vector<float> src(static_cast<size_t>(rows * cols)), s(static_cast<size_t>(rows * groups)),
      b(s.size());
  std::vector<uint32_t> packed(static_cast<size_t>(rows * words));
  h.data.resize(static_cast<size_t>(mats * rows * words * 4));
  h.scales.resize(static_cast<size_t>(mats * rows * groups) * dtype_size(sd));
  h.biases.resize(h.scales.size());
  for (int64_t e = 0; e < mats; ++e) {
    for (auto& v : src) v = rng.normal(0.5f) + 0.1f;
    affine::quantize(src.data(), rows, cols, bits, group, packed.data(), s.data(), b.data());
    std::memcpy(h.data.data() + e * rows * words * 4, packed.data(), packed.size() * 4);
    for (int64_t i = 0; i < rows * groups; ++i) {
      const int64_t at = e * rows * groups + i;
      if (sd == DType::F32) {
        std::memcpy(h.scales.data() + at * 4, &s[i], 4);
        std::memcpy(h.biases.data() + at * 4, &b[i], 4);
      } else {
        const uint16_t hs = sd == DType::BF16 ? f32_to_bf16(s[i]) : f32_to_f16(s[i]);
        const uint16_t hb = sd == DType::BF16 ? f32_to_bf16(b[i]) : f32_to_f16(b[i]);
        std::memcpy(h.scales.data() + at * 2, &hs, 2);
        std::memcpy(h.biases.data() + at * 2, &hb, 2);
      }
    }
  }
  h.w.dtype = DType::U32;
  h.w.bits = bits;
  h.w.group = group;
  h.w.scale_dtype = sd;
  h.w.data = h.data.data();
  h.w.scales = h.scales.data();
  h.w.biases = h.biases.data();
  h.w.rows = rows;
  h.w.cols = cols;
  h.w.experts = experts;
  return h;
}

}  // namespace tokenmill::test
