#include "tensor/affine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "util/error.h"

namespace tokenmill::affine {

void check_layout(int bits, int group, int64_t cols, std::string_view what) {
  if (!supported_bits(bits)) {
    fail(
        "{}: unsupported affine bit width {} (supported: 2, 3, 4, 5, 6, 8); check the "
        "quantization entry of config.json",
        what, bits);
  }
  if (!supported_group(group)) {
    fail(
        "{}: unsupported affine group size {} (supported: 32, 64, 128); check the "
        "quantization entry of config.json",
        what, group);
  }
  if (cols <= 0 || cols % group != 0) {
    fail(
        "{}: {} columns is not a positive multiple of the group size {}; the tensor shape "
        "does not match the quantization settings",
        what, cols, group);
  }
}

void pack_row(const uint8_t* q, int64_t cols, int bits, uint32_t* out) {
  int64_t words = words_per_row(cols, bits);
  std::memset(out, 0, static_cast<size_t>(words) * 4);
  const uint32_t mask = (1u << bits) - 1u;
  for (int64_t j = 0; j < cols; ++j) {
    uint64_t v = static_cast<uint64_t>(q[j] & mask);
    int64_t off = j * bits;
    int64_t w = off >> 5;
    int sh = static_cast<int>(off & 31);
    out[w] |= static_cast<uint32_t>(v << sh);
    if (sh + bits > 32) out[w + 1] |= static_cast<uint32_t>(v >> (32 - sh));
  }
}

void unpack_row(const uint32_t* row, int64_t cols, int bits, uint8_t* q) {
  for (int64_t j = 0; j < cols; ++j) q[j] = static_cast<uint8_t>(get(row, j, bits));
}

float load_scale(DType t, const void* p, int64_t i) {
  switch (t) {
    case DType::F32:
      return static_cast<const float*>(p)[i];
    case DType::BF16:
      return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::F16:
      return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default:
      fail("affine scales/biases of type {} are not supported (expected F32, F16 or BF16)",
           dtype_name(t));
  }
}

void quantize(const float* w, int64_t rows, int64_t cols, int bits, int group, uint32_t* packed,
              float* scales, float* biases) {
  check_layout(bits, group, cols, "affine::quantize");
  const float n_bins = static_cast<float>((1 << bits) - 1);
  const float eps = 1e-7f;
  const int64_t groups = cols / group;
  const int64_t words = words_per_row(cols, bits);
  std::vector<uint8_t> q(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float* wr = w + r * cols;
    for (int64_t g = 0; g < groups; ++g) {
      const float* x = wr + g * group;
      float hi = x[0], lo = x[0];
      for (int i = 1; i < group; ++i) {
        hi = std::max(hi, x[i]);
        lo = std::min(lo, x[i]);
      }
      const bool lo_edge = std::fabs(lo) > std::fabs(hi);
      float s = std::max((hi - lo) / n_bins, eps);
      if (!lo_edge) s = -s;
      const float edge = lo_edge ? lo : hi;
      const float q0 = std::nearbyint(edge / s);  // round half to even (default FP mode)
      float b = 0.0f;
      if (q0 != 0.0f) {
        s = edge / q0;
        b = edge;
      }
      for (int i = 0; i < group; ++i) {
        float v = std::nearbyint((x[i] - b) / s);
        v = std::min(std::max(v, 0.0f), n_bins);
        q[static_cast<size_t>(g * group + i)] = static_cast<uint8_t>(v);
      }
      scales[r * groups + g] = s;
      biases[r * groups + g] = b;
    }
    pack_row(q.data(), cols, bits, packed + r * words);
  }
}

void dequantize_row(const uint32_t* row, const void* scales, const void* biases, DType scale_dtype,
                    int64_t cols, int bits, int group, float* out) {
  for (int64_t g = 0; g < cols / group; ++g) {
    const float s = load_scale(scale_dtype, scales, g);
    const float b = load_scale(scale_dtype, biases, g);
    for (int64_t j = g * group; j < (g + 1) * group; ++j) {
      out[j] = s * static_cast<float>(get(row, j, bits)) + b;
    }
  }
}

}  // namespace tokenmill::affine
