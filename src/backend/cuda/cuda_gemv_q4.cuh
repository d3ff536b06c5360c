// Internal to the 4-bit GEMVs (cuda_gemv_q4.cu: F16 operands, cuda_gemv_q4d.cu: 8-bit digits):
// what both read of the tile layout (see "The tile layout" in cuda_q4_pack.cu).
#pragma once

#include <cuda_fp16.h>

#include <type_traits>

#include "backend/cuda/cuda_gemv.h"

namespace tokenmill::cuda {

// Where tile t lives: slot (MoE) or activation columns, job, first row, and the matrix.
struct Q4Tile {
  DevMat m;
  float* out;
  int64_t r0, cbase;
  int ncols;
  bool bad_expert;
};

__device__ __forceinline__ Q4Tile q4_tile(const GemvJobs& jobs, int64_t t, int64_t tiles_per_slot,
                                          int n, const int32_t* ids, int64_t x_div) {
  const int64_t slot = t / tiles_per_slot, jt = t - slot * tiles_per_slot;
  int j = 0;
  while (j + 1 < jobs.count && jt >= jobs.first_tile[j + 1]) ++j;
  Q4Tile q{jobs.m[j], jobs.out[j], (jt - jobs.first_tile[j]) * 16, 0, n, false};
  if (ids != nullptr) {
    const int e = ids[slot];
    q.out += slot * q.m.rows;
    q.bad_expert = e < 0 || e >= q.m.experts;
    if (!q.bad_expert) q.m = at_expert(q.m, e);
    q.cbase = slot / x_div;
    q.ncols = 1;
  }
  return q;
}

// A lane's scales and biases of one (tile, group) block: rows g and g+8, one 8-byte load (F32:
// 16 bytes).
template <int ST>
using Q4ScaleVec = std::conditional_t<ST == kF32, uint4, uint2>;

// Scale and bias of rows g (h = 0) and g+8 (h = 1).
template <int ST>
__device__ __forceinline__ void q4_scales(const Q4ScaleVec<ST>& v, float (&sc)[2], float (&bi)[2]) {
  if constexpr (ST == kF32) {
    sc[0] = __uint_as_float(v.x), bi[0] = __uint_as_float(v.y);
    sc[1] = __uint_as_float(v.z), bi[1] = __uint_as_float(v.w);
  } else if constexpr (ST == kBF16) {
    sc[0] = __uint_as_float(v.x << 16), bi[0] = __uint_as_float(v.x & 0xffff0000u);
    sc[1] = __uint_as_float(v.y << 16), bi[1] = __uint_as_float(v.y & 0xffff0000u);
  } else {
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&v.x));
    const float2 c = __half22float2(*reinterpret_cast<const __half2*>(&v.y));
    sc[0] = a.x, bi[0] = a.y, sc[1] = c.x, bi[1] = c.y;
  }
}

}  // namespace tokenmill::cuda
