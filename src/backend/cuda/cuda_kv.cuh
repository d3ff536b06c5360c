// Internal to backend/cuda: paged KV cache addressing and element loads, shared by the decode
// attention kernels (cuda_attention.cu) and the prefill kernel (cuda_attention_prefill.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/backend.h"

namespace tokenmill::cuda {

// Cache row (in units of kv_heads*head_dim... as a position index) of position p of sequence s,
// or -1 when the block table has no block there.
__device__ __forceinline__ int64_t cache_pos(const int32_t* tables, int max_blocks, int block_size,
                                             int s, int64_t p) {
  const int64_t b = p / block_size;
  if (b >= max_blocks) return -1;
  const int32_t block = tables[static_cast<int64_t>(s) * max_blocks + b];
  if (block < 0) return -1;
  return static_cast<int64_t>(block) * block_size + p % block_size;
}

// KV cache elements: F32, or BF16 kept as its 16 bits (uint16_t), rounded to nearest even when
// stored (as the CPU backend rounds). Loads widen to F32.
__device__ __forceinline__ float kv_load(const float* p, int64_t i) {
  return p[i];
}
__device__ __forceinline__ float kv_load(const uint16_t* p, int64_t i) {
  return __uint_as_float(static_cast<uint32_t>(p[i]) << 16);
}
__device__ __forceinline__ void kv_store(float* p, int64_t i, float x) {
  p[i] = x;
}
__device__ __forceinline__ void kv_store(uint16_t* p, int64_t i, float x) {
  p[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x));
}
// Four consecutive elements to a 16-byte (F32) or 8-byte (BF16) aligned address.
__device__ __forceinline__ void kv_store4(float* p, float4 x) {
  *reinterpret_cast<float4*>(p) = x;
}
__device__ __forceinline__ void kv_store4(uint16_t* p, float4 x) {
  const auto b = [](float f) {
    return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(f)));
  };
  *reinterpret_cast<uint2*>(p) = make_uint2(b(x.x) | b(x.y) << 16, b(x.z) | b(x.w) << 16);
}
// Four consecutive elements from a 16-byte (F32) or 8-byte (BF16) aligned address.
__device__ __forceinline__ float4 kv_load4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ float4 kv_load4(const uint16_t* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                     __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
}

// Eight BF16 values (16 bytes) as F16, rounded to nearest (exact in F16's normal range): the
// prefill attention kernels' K and V operands over a BF16 cache. The second form converts in
// place at p.
__device__ __forceinline__ uint4 bf16x8_to_f16x8(uint4 u) {
  uint32_t* w = reinterpret_cast<uint32_t*>(&u);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const __half2 h =
        __floats2half2_rn(__uint_as_float(w[k] << 16), __uint_as_float(w[k] & 0xffff0000u));
    w[k] = *reinterpret_cast<const uint32_t*>(&h);
  }
  return u;
}
__device__ __forceinline__ void bf16x8_to_f16x8(__half* p) {
  *reinterpret_cast<uint4*>(p) = bf16x8_to_f16x8(*reinterpret_cast<const uint4*>(p));
}

// The arguments of a split-context decode kernel (the first pass; the combine kernel finishes).
struct SplitArgs {
  KVLayerView kv;
  KVPaging pg;
  SeqLayout seqs;
  const float* q;
  int heads;
  float scale;
  int splits;
  int positions;  // the CUDA-core kernel's positions per split (a multiple of its warps' steps);
                  // the tensor-core pass spreads each row's context over the splits itself
  float* ws;      // [n_tokens, heads, splits] x (D + 2): acc[D], m, l
  L2Spans next;   // the tensor-core pass: what to start towards L2 after its wait
};

// The end of a split-context decode kernel's block: merges its W warps' online-softmax states
// of query heads h < R and writes, per head, the split's partial acc[D] (relative to the merged
// max), m and l at ws[(slot0 + h * splits) * (D + 2)], the combine kernel's input. m_at(w, h),
// l_at(w, h) and acc_at(w, h, d) read warp w's state (written before the block barrier the
// caller passed); a warp's NaN m (it met a missing cache block) makes the head NaN, and an
// invalid row NaN throughout.
template <int W, class MAt, class LAt, class AccAt>
__device__ __forceinline__ void write_split_partials(MAt m_at, LAt l_at, AccAt acc_at, int R, int D,
                                                     bool valid, float* ws, int64_t slot0,
                                                     int splits) {
  for (int i = threadIdx.x; i < R * (D + 2); i += blockDim.x) {
    const int h = i / (D + 2), d = i % (D + 2);
    float mt = -INFINITY;
    for (int w = 0; w < W; ++w) mt = fmaxf(mt, m_at(w, h));
    float v = 0.0f;
    if (d == D) {
      v = mt;
    } else {
      for (int w = 0; w < W; ++w) {
        if (l_at(w, h) > 0.0f) {
          v += (d < D ? acc_at(w, h, d) : l_at(w, h)) * expf(m_at(w, h) - mt);
        } else if (m_at(w, h) != m_at(w, h)) {
          v = NAN;
        }
      }
    }
    if (!valid) v = NAN;
    ws[(slot0 + static_cast<int64_t>(h) * splits) * (D + 2) + d] = v;
  }
}

}  // namespace tokenmill::cuda
