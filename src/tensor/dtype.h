// Element types as they appear in checkpoints and buffers, with bf16/f16 <-> f32 conversion.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace tokenmill {

enum class DType : uint8_t {
  F64,
  F32,
  F16,
  BF16,
  F8_E4M3,
  F8_E5M2,
  F8_E8M0,
  I64,
  I32,
  I16,
  I8,
  U64,
  U32,
  U16,
  U8,
  BOOL,
};

// Bytes per element.
size_t dtype_size(DType t);
// The safetensors spelling ("BF16", "F32", ...).
const char* dtype_name(DType t);
// Parses a safetensors dtype string; returns false when unknown.
bool parse_dtype(std::string_view s, DType* out);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Converts n elements of a float type (F32, F16, BF16, F64) to f32.
void convert_to_f32(DType t, const void* src, float* dst, size_t n);

}  // namespace tokenmill
