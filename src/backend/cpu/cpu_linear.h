// Internal to backend/cpu: the matrix-multiply kernels behind CpuBackend::linear and ::moe.
// out[i, r] = sum_k x[i, k] * W[r, k] for a row range [r0, r1) of W, F32 accumulation, with W
// in its storage format (F32, F16, BF16 or MLX affine) dequantized on the fly.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/backend.h"

namespace tokenmill::cpu {

// One matrix of a Weight (an expert's, for stacked weights), as byte pointers and strides.
struct MatView {
  DType dtype = DType::F32;  // F32, F16, BF16, or U32 for affine
  int bits = 0;              // 0 = float
  int group = 0;
  DType scale_dtype = DType::BF16;
  const uint8_t* data = nullptr;
  const uint8_t* scales = nullptr;  // [rows, groups] of scale_dtype
  const uint8_t* biases = nullptr;
  int64_t rows = 0, cols = 0;
  int64_t row_bytes = 0;  // bytes of one row of `data`
  int64_t groups = 0;     // cols / group (affine)
};

// Validates the weight's format and resolves matrix `expert` (0 for a plain matrix).
MatView resolve(const Weight& w, int expert);

// Reads scale/bias number idx of the matrix.
inline float load_sb(DType t, const uint8_t* p, int64_t idx) {
  if (t == DType::BF16) {
    uint16_t h;
    __builtin_memcpy(&h, p + idx * 2, 2);
    return bf16_to_f32(h);
  }
  if (t == DType::F32) {
    float f;
    __builtin_memcpy(&f, p + idx * 4, 4);
    return f;
  }
  uint16_t h;
  __builtin_memcpy(&h, p + idx * 2, 2);
  return f16_to_f32(h);
}

// Unpacks group g of an affine row (whole groups start on a U32 word boundary since
// group*bits is a multiple of 32) into q[0..group).
void unpack_group(const MatView& m, const uint8_t* row, int64_t g, uint8_t* q);

// ---- GEMV: n <= CpuBackend::kGemvMaxRows activation rows, each weight row streamed once ----
// Floats of per-call prepared activations gemv_prepare writes (0 for float weights).
size_t gemv_prep_floats(const MatView& m, int64_t n);
// Prepares x for the affine kernels: per row, x permuted into the order the ISA unpacks
// quantized values in, followed by per-group sums of x (for the bias term).
void gemv_prepare(bool scalar, const MatView& m, const float* x, int64_t ldx, int64_t n,
                  float* prep);
void gemv_rows(bool scalar, const MatView& m, const float* x, int64_t ldx, const float* prep,
               int64_t n, float* out, int64_t ldo, int64_t r0, int64_t r1);

// ---- GEMM: cache-blocked, a tile of W dequantized once into per-thread F32 scratch and reused
// across all activation rows of the block ----
constexpr int64_t kGemmTileRows = 64;   // rows of W per tile (a multiple of every ISA's NR)
constexpr int64_t kGemmTileCols = 128;  // columns per tile (a multiple of every group size)
size_t gemm_scratch_floats();
// out[i0..i1, r0..r1) = x[i0..i1) @ W[r0..r1)^T with r1 - r0 <= kGemmTileRows.
void gemm_tile(bool scalar, const MatView& m, const float* x, int64_t ldx, int64_t i0, int64_t i1,
               float* out, int64_t ldo, int64_t r0, int64_t r1, float* scratch);

// Dequantizes W[r, k0 .. k0+len) into out (k0 and len multiples of the group for affine).
void dequantize_segment(const MatView& m, int64_t r, int64_t k0, int64_t len, float* out);

// A row range of one product, for work lists spanning several matrices (MoE experts).
struct LinearTask {
  MatView m;
  const float* x = nullptr;
  int64_t ldx = 0, n = 0;
  const float* prep = nullptr;  // gemv_prepare output when n <= 8 and m is affine
  float* out = nullptr;
  int64_t ldo = 0, r0 = 0, r1 = 0;
};
// GEMV over [r0, r1) when n <= 8, else GEMM tiles; scratch: gemm_scratch_floats() floats.
void run_task(bool scalar, const LinearTask& t, float* scratch);

}  // namespace tokenmill::cpu
