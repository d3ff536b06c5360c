// Internal to backend/cuda (.cu files): the recurrent delta rule's per-column update, shared by
// delta_rule_parts_kernel (cuda_gdn.cu) and the one-sequence decode mixer (cuda_gdn_decode.cu).
#pragma once

#include <cuda_runtime.h>

namespace tokenmill::cuda {

// Register form for Dk <= 128: kParts threads share a column (thread d*kParts + p holds rows
// i = p*Dk/kParts ... of column d), so a column costs Dk/kParts registers and the kS and o dot
// products finish with two shuffles. Same operation order per row as the CPU reference; the
// sums are split in kParts partial sums.
constexpr int kRegDk = 128;
constexpr int kParts = 4;
constexpr int kRowsPerPart = kRegDk / kParts;

// Sum of a thread's four partial sums over the kParts adjacent lanes of its column (all lanes
// take part in the shuffles).
__device__ __forceinline__ float column_sum(const float (&p)[4]) {
  float v = (p[0] + p[1]) + (p[2] + p[3]);
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  return v;
}

// One token's update of a thread's rows [i0, i0 + kRowsPerPart) of column d when k_dim ==
// kRegDk (q and k in shared memory, 16-byte aligned), the CPU reference's order per row; returns
// o_d (the column's kParts threads are adjacent lanes and all take part in the shuffles).
__device__ __forceinline__ float delta_token_full(float (&col)[kRowsPerPart],
                                                  const float* __restrict__ qs,
                                                  const float* __restrict__ ks, int i0, float a,
                                                  float bt, float vt) {
  // Four partial sums per thread (rows j % 4): the dependent FMA chains are a quarter as long.
  float kp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int j4 = 0; j4 < kRowsPerPart / 4; ++j4) {
    const float4 k4 = reinterpret_cast<const float4*>(ks + i0)[j4];
    const float kv[4] = {k4.x, k4.y, k4.z, k4.w};
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      col[4 * j4 + u] *= a;
      kp[u] += kv[u] * col[4 * j4 + u];
    }
  }
  const float delta = bt * (vt - column_sum(kp));
  float op[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int j4 = 0; j4 < kRowsPerPart / 4; ++j4) {
    const float4 k4 = reinterpret_cast<const float4*>(ks + i0)[j4];
    const float4 q4 = reinterpret_cast<const float4*>(qs + i0)[j4];
    const float kv[4] = {k4.x, k4.y, k4.z, k4.w}, qv[4] = {q4.x, q4.y, q4.z, q4.w};
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      col[4 * j4 + u] += kv[u] * delta;
      op[u] += qv[u] * col[4 * j4 + u];
    }
  }
  return column_sum(op);
}

}  // namespace tokenmill::cuda
