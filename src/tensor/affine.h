// MLX "affine" quantization: the bit layout, quantizer and dequantizer (MODEL-SPEC section A).
//
// A quantized matrix [rows, cols] stores each row as one little-endian bit stream packed in U32
// words (element j occupies bits [j*bits, (j+1)*bits), least significant bit first, values may
// straddle words), plus per-group scale s and bias b ([rows, cols/group]); w = s*q + b.
// Scales can be negative: nothing here assumes s > 0.
#pragma once

#include <cstdint>
#include <string_view>

#include "tensor/dtype.h"

namespace tokenmill::affine {

inline bool supported_bits(int bits) {
  return bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
}
inline bool supported_group(int group) {
  return group == 32 || group == 64 || group == 128;
}

// Throws tokenmill::Error naming `what` unless bits and group are supported and cols is a
// positive multiple of group (which makes every row a whole number of U32 words).
void check_layout(int bits, int group, int64_t cols, std::string_view what);

// U32 words per packed row (cols*bits is a multiple of 32 after check_layout).
inline int64_t words_per_row(int64_t cols, int bits) {
  return cols * bits / 32;
}

// Element j of a packed row. Reads word (j*bits)/32 and, only when the value straddles it,
// the next word, so it never reads past the row's last word.
inline uint32_t get(const uint32_t* row, int64_t j, int bits) {
  int64_t off = j * bits;
  int64_t w = off >> 5;
  int sh = static_cast<int>(off & 31);
  uint64_t window = row[w];
  if (sh + bits > 32) window |= static_cast<uint64_t>(row[w + 1]) << 32;
  return static_cast<uint32_t>(window >> sh) & ((1u << bits) - 1u);
}

// Packs cols values q[j] < 2^bits into words_per_row(cols, bits) words (overwritten).
void pack_row(const uint8_t* q, int64_t cols, int bits, uint32_t* out);
// Unpacks a packed row into cols values.
void unpack_row(const uint32_t* row, int64_t cols, int bits, uint8_t* q);

// Reads element i of a scale/bias array of type t (F32, F16 or BF16).
float load_scale(DType t, const void* p, int64_t i);

// Quantizes a row-major F32 matrix exactly as MLX's affine quantizer does for float32 input
// (all arithmetic in F32, round half to even):
//   hi = max w, lo = min w over the group, n = 2^bits - 1;
//   s = max((hi - lo)/n, 1e-7), negated unless |lo| > |hi|; edge = |lo| > |hi| ? lo : hi;
//   q0 = round(edge/s); if q0 != 0 { s = edge/q0; b = edge } else b = 0;
//   q = clip(round((w - b)/s), 0, n).
// packed: [rows, words_per_row]; scales, biases: [rows, cols/group] F32.
void quantize(const float* w, int64_t rows, int64_t cols, int bits, int group, uint32_t* packed,
              float* scales, float* biases);

// Dequantizes one packed row: out[j] = s[j/group]*q[j] + b[j/group], for j < cols.
// scales/biases point at the row's first group; their type is scale_dtype.
void dequantize_row(const uint32_t* row, const void* scales, const void* biases, DType scale_dtype,
                    int64_t cols, int bits, int group, float* out);

// One element of a packed row (same arguments as dequantize_row).
inline float dequantize_element(const uint32_t* row, const void* scales, const void* biases,
                                DType scale_dtype, int64_t j, int bits, int group) {
  int64_t g = j / group;
  return load_scale(scale_dtype, scales, g) * static_cast<float>(get(row, j, bits)) +
         load_scale(scale_dtype, biases, g);
}

}  // namespace tokenmill::affine
