// Paged KV append and causal GQA attention over the paged cache. Attention: one block of 4
// warps per (query row, query head); warp w scores keys w, w+4, ... with an online softmax
// (running max, sum and F32 accumulator per warp), and the 4 partial states are merged at the
// end. head_dim <= 256 (8 values per lane).
#include <cuda_runtime.h>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_common.cuh"

namespace tokenmill::cuda {
namespace {

constexpr int kAttnWarps = 4;
constexpr int kMaxDPerLane = 8;  // head_dim <= 256

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

__global__ void kv_append_kernel(KVLayerView kv, KVPaging pg, SeqLayout seqs,
                                 const float* __restrict__ k, const float* __restrict__ v) {
  const int t = blockIdx.x;
  const int s = seq_of(seqs.cu_seqlens, seqs.n_seqs, t);
  if (s < 0) return;
  const int64_t cp =
      cache_pos(pg.block_tables, pg.max_blocks_per_seq, kv.block_size, s, seqs.positions[t]);
  if (cp < 0) return;
  const int64_t row = static_cast<int64_t>(kv.kv_heads) * kv.head_dim;
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
    kv.k[cp * row + i] = k[t * row + i];
    kv.v[cp * row + i] = v[t * row + i];
  }
}

__global__ void __launch_bounds__(kAttnWarps * 32)
    attention_kernel(KVLayerView kv, KVPaging pg, SeqLayout seqs, const float* __restrict__ q,
                     int heads, float scale, float* __restrict__ out) {
  __shared__ float s_m[kAttnWarps], s_l[kAttnWarps];
  __shared__ float s_acc[kAttnWarps][kMaxDPerLane * 32];
  const int t = blockIdx.x, h = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int D = kv.head_dim, r = heads / kv.kv_heads, kvh = h / r;
  float* o = out + (static_cast<int64_t>(t) * heads + h) * D;
  const int s = seq_of(seqs.cu_seqlens, seqs.n_seqs, t);
  const int64_t pos = s < 0 ? -1 : seqs.positions[t];
  if (s < 0 || pos < 0 || pos >= pg.context_lens[s]) {
    // Invalid layout: NaN output (the model validates batches; this keeps errors visible).
    for (int d = threadIdx.x; d < D; d += blockDim.x) o[d] = __int_as_float(0x7fc00000);
    return;
  }
  const float* qh = q + (static_cast<int64_t>(t) * heads + h) * D;
  float qr[kMaxDPerLane], acc[kMaxDPerLane];
#pragma unroll
  for (int i = 0; i < kMaxDPerLane; ++i) {
    const int d = lane + 32 * i;
    qr[i] = d < D ? qh[d] : 0.0f;
    acc[i] = 0.0f;
  }
  const int64_t row = static_cast<int64_t>(kv.kv_heads) * D;
  float m = -INFINITY, l = 0.0f;
  bool bad = false;
  for (int64_t p = warp; p <= pos; p += kAttnWarps) {
    const int64_t cp = cache_pos(pg.block_tables, pg.max_blocks_per_seq, kv.block_size, s, p);
    if (cp < 0) {
      bad = true;
      break;
    }
    const float* kp = kv.k + cp * row + static_cast<int64_t>(kvh) * D;
    const float* vp = kv.v + cp * row + static_cast<int64_t>(kvh) * D;
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxDPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < D) dot += qr[i] * kp[d];
    }
    const float sc = scale * warp_sum(dot);
    const float mn = fmaxf(m, sc);
    const float c = expf(m - mn);  // 0 on the first key (m = -inf)
    const float e = expf(sc - mn);
    l = l * c + e;
#pragma unroll
    for (int i = 0; i < kMaxDPerLane; ++i) {
      const int d = lane + 32 * i;
      acc[i] = acc[i] * c + (d < D ? e * vp[d] : 0.0f);
    }
    m = mn;
  }
  if (lane == 0) {
    s_m[warp] = bad ? NAN : m;
    s_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kMaxDPerLane; ++i) s_acc[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  float mt = -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) mt = fmaxf(mt, s_m[w]);
  float lt = 0.0f;
  for (int w = 0; w < kAttnWarps; ++w) {
    if (s_m[w] != s_m[w]) lt = NAN;  // a missing block: NaN
    if (s_l[w] > 0.0f) lt += s_l[w] * expf(s_m[w] - mt);
  }
  const float inv = 1.0f / lt;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float a = 0.0f;
    for (int w = 0; w < kAttnWarps; ++w) {
      if (s_l[w] > 0.0f) a += s_acc[w][d] * expf(s_m[w] - mt);
    }
    o[d] = a * inv;
  }
}

}  // namespace
}  // namespace tokenmill::cuda

namespace tokenmill {

void CudaBackend::kv_append(const KVLayerView& kv, const KVPaging& paging, const SeqLayout& seqs,
                            const float* k, const float* v) {
  if (seqs.n_tokens <= 0) return;
  cuda::kv_append_kernel<<<static_cast<unsigned>(seqs.n_tokens), 128, 0, stream_>>>(kv, paging,
                                                                                    seqs, k, v);
  TM_CUDA_LAUNCHED();
}

// Positions outside the sequence's block table, or queries past the context length, produce
// NaN rows (the model's batch validation rules them out; NaN keeps such a bug visible).
void CudaBackend::attention(const KVLayerView& kv, const KVPaging& paging, const SeqLayout& seqs,
                            const float* q, int heads, float scale, float* out) {
  TM_CUDA_REQUIRE(kv.kv_heads > 0 && heads % kv.kv_heads == 0,
                  "attention: query heads must be a multiple of kv heads");
  TM_CUDA_REQUIRE(kv.head_dim > 0 && kv.head_dim <= 32 * cuda::kMaxDPerLane,
                  "attention: head_dim must be in 1..256");
  TM_CUDA_REQUIRE(heads <= 65535, "attention: too many heads");
  if (seqs.n_tokens <= 0) return;
  const dim3 grid(static_cast<unsigned>(seqs.n_tokens), static_cast<unsigned>(heads));
  cuda::attention_kernel<<<grid, cuda::kAttnWarps * 32, 0, stream_>>>(kv, paging, seqs, q, heads,
                                                                      scale, out);
  TM_CUDA_LAUNCHED();
}

}  // namespace tokenmill
