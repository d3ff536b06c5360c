// Paged KV append, the attention front, and causal GQA attention over the paged cache for few
// query rows (decode; prefill rows take cuda_attention_prefill.cu where the shape allows).
// One-pass attention (the fallback): one block of 4 warps per (query row, query head); warp w
// scores keys w, w+4, ... with an online softmax (running max, sum and F32 accumulator per warp),
// and the 4 partial states are merged at the end. head_dim <= 256 (8 values per lane).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv.h"
#include "backend/cuda/cuda_gemv_q4.cuh"
#include "backend/cuda/cuda_kv.cuh"

namespace tokenmill::cuda {
namespace {

constexpr int kAttnWarps = 4;
constexpr int kMaxDPerLane = 8;  // head_dim <= 256

template <typename T>
__global__ void kv_append_kernel(KVLayerView kv, KVPaging pg, SeqLayout seqs,
                                 const float* __restrict__ k, const float* __restrict__ v) {
  pdl_begin();
  const int t = blockIdx.x;
  const int s = seq_of(seqs.cu_seqlens, seqs.n_seqs, t);
  if (s < 0) return;
  const int64_t cp =
      cache_pos(pg.block_tables, pg.max_blocks_per_seq, kv.block_size, s, seqs.positions[t]);
  if (cp < 0) return;
  const int64_t row = static_cast<int64_t>(kv.kv_heads) * kv.head_dim;
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
    kv_store(static_cast<T*>(kv.k), cp * row + i, k[t * row + i]);
    kv_store(static_cast<T*>(kv.v), cp * row + i, v[t * row + i]);
  }
}

// The attention front fused (Backend::attention_front): block (t, h) takes query head h of
// token t, or kv head h - heads: its row into shared memory (a gated query head also copies its
// gate out), RMS norm, NeoX rotation of the first rot_dim dims, the write, and for a kv head
// the append of k and v to the cache slot. Seven launches per attention layer become one.
struct AttnFrontArgs {
  KVLayerView kv;
  KVPaging pg;
  SeqLayout seqs;
  const float *qp, *q_norm, *k_norm, *v;
  float *q, *gate, *k;
  int heads, half, rot_dim;
  bool gated;
  float eps;
};

// Token t's cache row (-1: outside its sequence's block table).
__device__ __forceinline__ int64_t token_cache_pos(const AttnFrontArgs& A, int t) {
  const int s = seq_of(A.seqs.cu_seqlens, A.seqs.n_seqs, t);
  return s < 0 ? -1
               : cache_pos(A.pg.block_tables, A.pg.max_blocks_per_seq, A.kv.block_size, s,
                           A.seqs.positions[t]);
}

template <typename T>
__global__ void attention_front_kernel(AttnFrontArgs A, RopeFreqs f) {
  extern __shared__ float row[];  // [head_dim]
  __shared__ float red[32];
  const int t = blockIdx.x, h = blockIdx.y;
  const int D = A.kv.head_dim, kvh = A.kv.kv_heads;
  const bool is_q = h < A.heads;
  const int hk = h - A.heads;
  // The norm's weight of this thread's first dim, constant: loaded before the wait.
  const int d0 = static_cast<int>(threadIdx.x);
  const float w0 = d0 < D ? (is_q ? A.q_norm : A.k_norm)[d0] : 0.0f;
  pdl_begin();
  const float* src;
  float* dst;
  const float* w;
  if (is_q) {
    src = A.qp + (static_cast<int64_t>(t) * A.heads + h) * D * (A.gated ? 2 : 1);
    dst = A.q + (static_cast<int64_t>(t) * A.heads + h) * D;
    w = A.q_norm;
  } else {
    dst = A.k + (static_cast<int64_t>(t) * kvh + hk) * D;
    src = dst;
    w = A.k_norm;
  }
  float ss = 0.0f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    const float x = src[i];
    row[i] = x;
    ss += x * x;
    if (is_q && A.gated) A.gate[(static_cast<int64_t>(t) * A.heads + h) * D + i] = src[D + i];
  }
  const float inv = 1.0f / sqrtf(block_sum(ss, red) / static_cast<float>(D) + A.eps);
  for (int i = threadIdx.x; i < D; i += blockDim.x) row[i] = row[i] * inv * (i == d0 ? w0 : w[i]);
  __syncthreads();
  const int64_t cp = is_q ? -1 : token_cache_pos(A, t);
  const float pos = static_cast<float>(A.seqs.positions[t]);
  const int64_t cache_row = static_cast<int64_t>(kvh) * D;
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    float y = row[i];
    if (i < A.rot_dim) {
      const int j = i < A.half ? i : i - A.half;
      float sn, cs;
      sincosf(pos * f.inv[j], &sn, &cs);
      y = i < A.half ? row[i] * cs - row[i + A.half] * sn : row[i] * cs + row[j] * sn;
    }
    dst[i] = y;
    if (cp >= 0) {
      const int64_t at = cp * cache_row + static_cast<int64_t>(hk) * D + i;
      kv_store(static_cast<T*>(A.kv.k), at, y);
      kv_store(static_cast<T*>(A.kv.v), at, A.v[(static_cast<int64_t>(t) * kvh + hk) * D + i]);
    }
  }
}

// The same for head_dim 128 * kI (16-byte aligned rows): a warp per (token, head), eight tokens
// of one head a block, lane l holding dims 4l + 128i in registers; the normed row goes through
// shared memory only for the rotation's partner dims. The block per (token, head) above, one
// value a thread, took 0.68 ms a layer for the 27B's 8k-token prompt (about 0.9 GB moved, 1.3
// TB/s; S29).
template <typename T, int kI>
__global__ void __launch_bounds__(256) attention_front_warp_kernel(AttnFrontArgs A, RopeFreqs f) {
  constexpr int D = 128 * kI;
  __shared__ float rows[8][D];
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int t = static_cast<int>(blockIdx.x) * 8 + warp, h = static_cast<int>(blockIdx.y);
  const int kvh = A.kv.kv_heads;
  const bool is_q = h < A.heads;
  const int hk = h - A.heads;
  float4 wv[kI];
#pragma unroll
  for (int i = 0; i < kI; ++i) {
    wv[i] = reinterpret_cast<const float4*>(is_q ? A.q_norm : A.k_norm)[lane + 32 * i];
  }
  // The step's layout (uploaded before the step's first kernel) is read before the wait too: the
  // cache row is a chain of three dependent loads (the sequence, the position, the block table).
  const bool live = t < A.seqs.n_tokens;
  const int64_t cp = is_q || !live ? -1 : token_cache_pos(A, t);
  const float pos = live ? static_cast<float>(A.seqs.positions[t]) : 0.0f;
  pdl_begin();
  if (!live) return;
  const float* src;
  float* dst;
  if (is_q) {
    src = A.qp + (static_cast<int64_t>(t) * A.heads + h) * D * (A.gated ? 2 : 1);
    dst = A.q + (static_cast<int64_t>(t) * A.heads + h) * D;
  } else {
    dst = A.k + (static_cast<int64_t>(t) * kvh + hk) * D;
    src = dst;
  }
  float4 x[kI];
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < kI; ++i) {
    x[i] = reinterpret_cast<const float4*>(src)[lane + 32 * i];
    ss += x[i].x * x[i].x + x[i].y * x[i].y + x[i].z * x[i].z + x[i].w * x[i].w;
  }
  if (is_q && A.gated) {
    float4* g4 = reinterpret_cast<float4*>(A.gate + (static_cast<int64_t>(t) * A.heads + h) * D);
#pragma unroll
    for (int i = 0; i < kI; ++i)
      g4[lane + 32 * i] = reinterpret_cast<const float4*>(src + D)[lane + 32 * i];
  }
  const float inv = 1.0f / sqrtf(warp_sum(ss) / static_cast<float>(D) + A.eps);
  float* const row = rows[warp];
#pragma unroll
  for (int i = 0; i < kI; ++i) {
    x[i] = make_float4(x[i].x * inv * wv[i].x, x[i].y * inv * wv[i].y, x[i].z * inv * wv[i].z,
                       x[i].w * inv * wv[i].w);
    reinterpret_cast<float4*>(row)[lane + 32 * i] = x[i];
  }
  __syncwarp();
  const int64_t at = cp * kvh * D + static_cast<int64_t>(hk) * D;
  const float4* v4 =
      reinterpret_cast<const float4*>(A.v + (static_cast<int64_t>(t) * kvh + hk) * D);
#pragma unroll
  for (int i = 0; i < kI; ++i) {
    const int d0 = 4 * lane + 128 * i;
    float y[4] = {x[i].x, x[i].y, x[i].z, x[i].w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int d = d0 + e;
      if (d < A.rot_dim) {
        const int j = d < A.half ? d : d - A.half;
        float sn, cs;
        sincosf(pos * f.inv[j], &sn, &cs);
        y[e] = d < A.half ? row[d] * cs - row[d + A.half] * sn : row[d] * cs + row[j] * sn;
      }
    }
    const float4 out = make_float4(y[0], y[1], y[2], y[3]);
    reinterpret_cast<float4*>(dst)[lane + 32 * i] = out;
    if (cp >= 0) {
      kv_store4(static_cast<T*>(A.kv.k) + at + d0, out);
      kv_store4(static_cast<T*>(A.kv.v) + at + d0, v4[lane + 32 * i]);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kAttnWarps * 32)
    attention_kernel(KVLayerView kv, KVPaging pg, SeqLayout seqs, const float* __restrict__ q,
                     int heads, float scale, float* __restrict__ out) {
  pdl_begin();
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
    const T* kp = static_cast<const T*>(kv.k) + cp * row + static_cast<int64_t>(kvh) * D;
    const T* vp = static_cast<const T*>(kv.v) + cp * row + static_cast<int64_t>(kvh) * D;
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxDPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < D) dot += qr[i] * kv_load(kp, d);
    }
    const float sc = scale * warp_sum(dot);
    const float mn = fmaxf(m, sc);
    const float c = expf(m - mn);  // 0 on the first key (m = -inf)
    const float e = expf(sc - mn);
    l = l * c + e;
#pragma unroll
    for (int i = 0; i < kMaxDPerLane; ++i) {
      const int d = lane + 32 * i;
      acc[i] = acc[i] * c + (d < D ? e * kv_load(vp, d) : 0.0f);
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

// ---- split-context decoding (few query rows, long contexts) ----
// Grid (split, kv head, query row). A block takes the GQA group of one kv head (R query heads
// share each K/V read) over one split of `positions` positions, a quarter of them per warp.
// Lane owns head dims c*128 + 4*lane + u (c < D/128, u < 4) of the queries, the K and V rows
// and the accumulators, so every K/V load is a coalesced 512-byte warp read. A warp takes
// kSplitStep positions at a time: their K and V rows load together (16 loads in flight per
// lane), scores are warp sums, and one online-softmax update covers the step. Warps merge in
// shared memory and the block writes (acc, m, l) per head to the workspace; a second kernel
// combines the splits of each (row, head).
//
// Why this shape: decode attention reads the cache once and computes little, so it is bound by
// loads in flight. A lane-per-position layout (each lane walking its own K row, 64 dependent
// 16-byte loads) took 54 us per layer at a 64-position context on the H200, one SM per 128
// positions.
constexpr int kMaxGroup = 8;        // query heads per kv head
constexpr int kSplitBudget = 2048;  // query rows x splits: bounds the workspace
constexpr int kSplitStep = 4;       // positions per warp step

template <int R, typename T>
__global__ void __launch_bounds__(kAttnWarps * 32) attention_split_kernel(SplitArgs a) {
  pdl_begin();
  constexpr int kDims = 8;  // per lane: D <= 256
  __shared__ float wm[kAttnWarps][R], wl[kAttnWarps][R];
  __shared__ __align__(16) float wacc[kAttnWarps][R][256];
  const int sp = blockIdx.x, kvh = blockIdx.y, t = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int D = a.kv.head_dim, chunks = D / 128;
  const int s = seq_of(a.seqs.cu_seqlens, a.seqs.n_seqs, t);
  const int64_t pos = s < 0 ? -1 : a.seqs.positions[t];
  const bool valid = s >= 0 && pos >= 0 && pos < a.pg.context_lens[s];
  const int per_warp = a.positions / kAttnWarps;
  const int64_t begin = static_cast<int64_t>(sp) * a.positions + warp * per_warp;
  const int64_t end = pos + 1 < begin + per_warp ? pos + 1 : begin + per_warp;
  const int64_t row = static_cast<int64_t>(a.kv.kv_heads) * D;
  float q[R][kDims], m[R], l[R], acc[R][kDims];
#pragma unroll
  for (int h = 0; h < R; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.0f;
    const float* qh = a.q + (static_cast<int64_t>(t) * a.heads + kvh * R + h) * D + 4 * lane;
#pragma unroll
    for (int c = 0; c < kDims / 4; ++c) {
      const float4 v = valid && c < chunks ? *reinterpret_cast<const float4*>(qh + c * 128)
                                           : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      q[h][4 * c] = v.x, q[h][4 * c + 1] = v.y, q[h][4 * c + 2] = v.z, q[h][4 * c + 3] = v.w;
      acc[h][4 * c] = acc[h][4 * c + 1] = acc[h][4 * c + 2] = acc[h][4 * c + 3] = 0.0f;
    }
  }
  bool bad = !valid;
  for (int64_t p0 = begin; valid && p0 < end; p0 += kSplitStep) {
    int64_t cp[kSplitStep];
    float4 k4[kSplitStep][kDims / 4], v4[kSplitStep][kDims / 4];
#pragma unroll
    for (int j = 0; j < kSplitStep; ++j) {
      cp[j] = -1;
      if (p0 + j < end) {
        cp[j] = cache_pos(a.pg.block_tables, a.pg.max_blocks_per_seq, a.kv.block_size, s, p0 + j);
        bad |= cp[j] < 0;
      }
#pragma unroll
      for (int c = 0; c < kDims / 4; ++c) {
        k4[j][c] = v4[j][c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (cp[j] >= 0 && c < chunks) {
          const int64_t off = cp[j] * row + static_cast<int64_t>(kvh) * D + c * 128 + 4 * lane;
          k4[j][c] = kv_load4(static_cast<const T*>(a.kv.k) + off);
          v4[j][c] = kv_load4(static_cast<const T*>(a.kv.v) + off);
        }
      }
    }
#pragma unroll
    for (int h = 0; h < R; ++h) {
      float x[kSplitStep];
      float mn = m[h];
#pragma unroll
      for (int j = 0; j < kSplitStep; ++j) {
        float d = 0.0f;
#pragma unroll
        for (int c = 0; c < kDims / 4; ++c) {
          d += q[h][4 * c] * k4[j][c].x + q[h][4 * c + 1] * k4[j][c].y +
               q[h][4 * c + 2] * k4[j][c].z + q[h][4 * c + 3] * k4[j][c].w;
        }
        d = warp_sum(d);  // every lane: cp[j] is the same across the warp
        x[j] = cp[j] >= 0 ? d * a.scale : -INFINITY;
        mn = fmaxf(mn, x[j]);
      }
      if (mn == -INFINITY) continue;  // no position of this step is in the cache
      const float f = expf(m[h] - mn);
      l[h] *= f;
#pragma unroll
      for (int i = 0; i < kDims; ++i) acc[h][i] *= f;
#pragma unroll
      for (int j = 0; j < kSplitStep; ++j) {
        const float e = expf(x[j] - mn);  // 0 for positions outside the cache
        l[h] += e;
#pragma unroll
        for (int c = 0; c < kDims / 4; ++c) {
          acc[h][4 * c] += e * v4[j][c].x;
          acc[h][4 * c + 1] += e * v4[j][c].y;
          acc[h][4 * c + 2] += e * v4[j][c].z;
          acc[h][4 * c + 3] += e * v4[j][c].w;
        }
      }
      m[h] = mn;
    }
  }
  bad = __any_sync(0xffffffffu, bad);
#pragma unroll
  for (int h = 0; h < R; ++h) {
    if (lane == 0) {
      wm[warp][h] = bad ? NAN : m[h];
      wl[warp][h] = l[h];
    }
#pragma unroll
    for (int c = 0; c < kDims / 4; ++c) {
      if (c >= chunks) break;
      *reinterpret_cast<float4*>(&wacc[warp][h][c * 128 + 4 * lane]) =
          make_float4(acc[h][4 * c], acc[h][4 * c + 1], acc[h][4 * c + 2], acc[h][4 * c + 3]);
    }
  }
  __syncthreads();
  write_split_partials<kAttnWarps>(
      [&](int w, int h) { return wm[w][h]; }, [&](int w, int h) { return wl[w][h]; },
      [&](int w, int h, int d) { return wacc[w][h][d]; }, R, D, valid, a.ws,
      (static_cast<int64_t>(t) * a.heads + kvh * R) * a.splits + sp, a.splits);
}

// Positions per split for a context capacity (the block-table width in positions) and a number
// of query rows: fixed for a recorded decode step, whatever the sequences' current lengths. The
// smallest power-of-two multiple of 32 that keeps the splits within kMaxSplits per row and the
// workspace within kSplitBudget rows x splits (0: the workspace cannot hold this many rows).
int split_positions(int context_capacity, int n_tokens) {
  const int64_t cap = context_capacity < 1 ? 1 : context_capacity;
  for (int64_t p = 32; p <= (int64_t{1} << 30); p *= 2) {
    const int64_t splits = (cap + p - 1) / p;
    if (splits <= kMaxSplits && splits * n_tokens <= kSplitBudget) return static_cast<int>(p);
    if (splits == 1) break;
  }
  return 0;
}

// Whether split-context decoding takes n_tokens query rows of head_dim (else no workspace).
bool split_takes(int n_tokens, int head_dim) {
  return n_tokens > 0 && n_tokens <= 64 && head_dim % 128 == 0 && head_dim <= 256;
}

int split_count(int context_capacity, int positions) {
  return static_cast<int>((int64_t{context_capacity < 1 ? 1 : context_capacity} + positions - 1) /
                          positions);
}

// Calls f(T{}) with T the cache's element type: float (F32) or uint16_t (BF16 bits).
template <class F>
void with_kv_type(DType dtype, F&& f) {
  if (dtype == DType::BF16) {
    f(uint16_t{});
  } else {
    f(float{});
  }
}

template <typename T>
void launch_split(cudaStream_t st, int group, dim3 grid, const SplitArgs& a) {
  using Kernel = void (*)(SplitArgs);
  static constexpr Kernel kKernels[kMaxGroup] = {
      attention_split_kernel<1, T>, attention_split_kernel<2, T>, attention_split_kernel<3, T>,
      attention_split_kernel<4, T>, attention_split_kernel<5, T>, attention_split_kernel<6, T>,
      attention_split_kernel<7, T>, attention_split_kernel<8, T>};
  launch_pdl(kKernels[group - 1], grid, dim3(kAttnWarps * 32), 0, st, a);
}

}  // namespace
}  // namespace tokenmill::cuda

namespace tokenmill {

size_t CudaBackend::attention_workspace_floats(int n_tokens, int heads, int head_dim,
                                               int context_capacity) const {
  if (!cuda::split_takes(n_tokens, head_dim)) return 0;
  const int positions = cuda::split_positions(context_capacity, n_tokens);
  if (positions == 0) return 0;
  const int splits = cuda::split_count(context_capacity, positions);
  return static_cast<size_t>(n_tokens) * heads * splits * (head_dim + 2);
}

// Not monotone in the capacity (a capacity just past a power of two doubles the positions per
// split and halves the splits), so a bound instead of the value at the largest capacity: the
// splits of t rows are at most kMaxSplits, kSplitBudget / t (split_positions keeps both) and
// the capacity's 32-position pieces (positions per split are at least 32).
size_t CudaBackend::max_attention_workspace_floats(int max_tokens, int heads, int head_dim,
                                                   int max_context_capacity) const {
  const int64_t pieces = (int64_t{std::max(max_context_capacity, 1)} + 31) / 32;
  size_t most = 0;
  for (int t = 1; t <= max_tokens && cuda::split_takes(t, head_dim); ++t) {
    const int64_t splits =
        std::min({int64_t{cuda::kMaxSplits}, int64_t{cuda::kSplitBudget} / t, pieces});
    most = std::max(most, static_cast<size_t>(t) * heads * splits * (head_dim + 2));
  }
  return most;
}

void CudaBackend::kv_append(const KVLayerView& kv, const KVPaging& paging, const SeqLayout& seqs,
                            const float* k, const float* v) {
  TM_CUDA_REQUIRE(supports_kv_dtype(kv.dtype), "kv_append: KV caches are F32 or BF16");
  if (seqs.n_tokens <= 0) return;
  cuda::with_kv_type(kv.dtype, [&](auto tag) {
    cuda::launch_pdl(cuda::kv_append_kernel<decltype(tag)>, static_cast<unsigned>(seqs.n_tokens),
                     128, 0, stream_, kv, paging, seqs, k, v);
  });
  TM_CUDA_LAUNCHED();
}

void CudaBackend::attention_front(const KVLayerView& kv, const KVPaging& paging,
                                  const SeqLayout& seqs, const float* qp, bool gated,
                                  const float* q_norm, const float* k_norm, float eps, int heads,
                                  int rot_dim, float theta, float* q, float* gate, float* k,
                                  const float* v) {
  TM_CUDA_REQUIRE(supports_kv_dtype(kv.dtype), "attention_front: KV caches are F32 or BF16");
  const int D = kv.head_dim;
  if (D < 1 || D > 1024 || rot_dim % 2 != 0 || rot_dim > D || heads + kv.kv_heads > 65535 ||
      (!gated && qp != q)) {
    Backend::attention_front(kv, paging, seqs, qp, gated, q_norm, k_norm, eps, heads, rot_dim,
                             theta, q, gate, k, v);
    return;
  }
  if (seqs.n_tokens <= 0) return;
  const cuda::AttnFrontArgs a{kv,   paging, seqs,  qp,          q_norm,  k_norm, v,  q,
                              gate, k,      heads, rot_dim / 2, rot_dim, gated,  eps};
  const auto al = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if ((D == 128 || D == 256) && al(qp) && al(q) && al(k) && al(v) && al(q_norm) && al(k_norm) &&
      (!gated || al(gate))) {
    const dim3 grid(static_cast<unsigned>((seqs.n_tokens + 7) / 8),
                    static_cast<unsigned>(heads + kv.kv_heads));
    cuda::with_kv_type(kv.dtype, [&](auto tag) {
      using T = decltype(tag);
      if (D == 128) {
        cuda::launch_pdl(cuda::attention_front_warp_kernel<T, 1>, grid, 256, 0, stream_, a,
                         cuda::rope_freqs(theta, rot_dim));
      } else {
        cuda::launch_pdl(cuda::attention_front_warp_kernel<T, 2>, grid, 256, 0, stream_, a,
                         cuda::rope_freqs(theta, rot_dim));
      }
    });
    TM_CUDA_LAUNCHED();
    return;
  }
  const dim3 grid(static_cast<unsigned>(seqs.n_tokens), static_cast<unsigned>(heads + kv.kv_heads));
  const int threads = std::min(256, (D + 31) / 32 * 32);
  cuda::with_kv_type(kv.dtype, [&](auto tag) {
    cuda::launch_pdl(cuda::attention_front_kernel<decltype(tag)>, grid, threads,
                     static_cast<size_t>(D) * sizeof(float), stream_, a,
                     cuda::rope_freqs(theta, rot_dim));
  });
  TM_CUDA_LAUNCHED();
}

namespace {
void check_attention(const KVLayerView& kv, int heads, bool kv_dtype_ok) {
  TM_CUDA_REQUIRE(kv.kv_heads > 0 && heads % kv.kv_heads == 0,
                  "attention: query heads must be a multiple of kv heads");
  TM_CUDA_REQUIRE(kv_dtype_ok, "attention: KV caches are F32 or BF16");
  TM_CUDA_REQUIRE(kv.head_dim > 0 && kv.head_dim <= 32 * cuda::kMaxDPerLane,
                  "attention: head_dim must be in 1..256");
  TM_CUDA_REQUIRE(heads <= 65535, "attention: too many heads");
}
}  // namespace

// Few query rows: the context split so all multiprocessors share the K/V reads. Launches the
// first pass into attn_ws_ and returns its split count, or 0 where it does not take the shape
// (no workspace for it).
int CudaBackend::attention_split(const KVLayerView& kv, const KVPaging& paging,
                                 const SeqLayout& seqs, const float* q, int heads, float scale,
                                 const cuda::L2Spans* next) {
  const int r = heads / kv.kv_heads;
  const int capacity = paging.max_blocks_per_seq * kv.block_size;
  const size_t need = attention_workspace_floats(seqs.n_tokens, heads, kv.head_dim, capacity);
  if (need == 0 || need > attn_ws_floats_ || attn_ws_ == nullptr || r > cuda::kMaxGroup) return 0;
  const int positions = cuda::split_positions(capacity, seqs.n_tokens);
  const cuda::SplitArgs a{
      kv,        paging,   seqs, q, heads, scale, cuda::split_count(capacity, positions),
      positions, attn_ws_, {}};
  // BF16 caches on sm_90: the tensor-core first pass, with its own split count.
  int splits = gemv_ws_.wgmma
                   ? cuda::launch_attention_split_tc(stream_, kv, paging, seqs, q, heads, scale,
                                                     a.splits, attn_ws_, gemv_ws_.sm_count, next)
                   : 0;
  if (splits == 0) {
    const dim3 grid(static_cast<unsigned>(a.splits), static_cast<unsigned>(kv.kv_heads),
                    static_cast<unsigned>(seqs.n_tokens));
    cuda::with_kv_type(kv.dtype,
                       [&](auto tag) { cuda::launch_split<decltype(tag)>(stream_, r, grid, a); });
    splits = a.splits;
  }
  TM_CUDA_LAUNCHED();
  return splits;
}

// Positions outside the sequence's block table, or queries past the context length, produce
// NaN rows (the model's batch validation rules them out; NaN keeps such a bug visible).
void CudaBackend::attention(const KVLayerView& kv, const KVPaging& paging, const SeqLayout& seqs,
                            const float* q, int heads, float scale, float* out) {
  check_attention(kv, heads, supports_kv_dtype(kv.dtype));
  if (seqs.n_tokens <= 0) return;
  if (const int splits = attention_split(kv, paging, seqs, q, heads, scale)) {
    cuda::launch_attention_combine(stream_, attn_ws_, splits, kv.head_dim, seqs.n_tokens, heads,
                                   out, nullptr, cuda::Q4Act{});
    return;
  }
  // Prefill in fast precision on sm_90 (not recorded, so the context lengths are the step's):
  // the wgmma kernel over an F16 copy of the contexts, where that copy fits the workspace
  // reserved for the step (grown only before any step was reserved: tests).
  if (prefill_precision_ == PrefillPrecision::kFast && gemv_ws_.wgmma && !recording_ &&
      seqs.n_tokens >= 64) {
    const size_t need = cuda::attention_prefill_wg_kv16_bytes(kv, paging, seqs, heads);
    if (need > 0 && (need <= kv16_bytes_ || !step_reserved_)) {
      grow_workspace(&kv16_, &kv16_bytes_, need, "prefill attention");
      if (cuda::launch_attention_prefill_wg(stream_, kv, paging, seqs, q, heads, scale, out, kv16_,
                                            gemv_ws_.encode_tiled)) {
        return;
      }
    }
  }
  // Many rows (prefill), or no workspace: the tensor-core kernel where it takes the shape.
  if (cuda::launch_attention_prefill(stream_, kv, paging, seqs, q, heads, scale, out,
                                     prefill_precision_ == PrefillPrecision::kFast)) {
    return;
  }
  const dim3 grid(static_cast<unsigned>(seqs.n_tokens), static_cast<unsigned>(heads));
  cuda::with_kv_type(kv.dtype, [&](auto tag) {
    cuda::launch_pdl(cuda::attention_kernel<decltype(tag)>, grid, cuda::kAttnWarps * 32, 0, stream_,
                     kv, paging, seqs, q, heads, scale, out);
  });
  TM_CUDA_LAUNCHED();
}

// Decode rows with a gate before a 4-bit output projection: the split-context attention, whose
// combine gates the rows and writes the projection's digits (no preparation launch), then the
// projection. Anything else: attention, then sigmoid_mul_linear or linear.
void CudaBackend::attention_out(const KVLayerView& kv, const KVPaging& paging,
                                const SeqLayout& seqs, const float* q, int heads, float scale,
                                const float* gate, const Weight& w, float* o, float* out) {
  const int64_t n = seqs.n_tokens, K = int64_t{heads} * kv.head_dim;
  if (gate != nullptr && n >= 1 && n <= cuda::kQ4DigitMaxRows && !w.experts &&
      kv.head_dim % 8 == 0 && kv.head_dim / 8 <= 32) {
    check_attention(kv, heads, supports_kv_dtype(kv.dtype));
    const cuda::DevMat m = cuda::make_devmat(w, 0);
    if (q4_digit_gemv_takes(m, n, K, kv.head_dim)) {
      const cuda::L2Spans next = cuda::l2_spans_of(m);
      if (const int splits = attention_split(kv, paging, seqs, q, heads, scale, &next)) {
        const cuda::Q4Act act =
            cuda::q4_act_layout(n, K, m.group, cuda::Q4Operands::kDigits, gemv_ws_);
        cuda::launch_attention_combine(stream_, attn_ws_, splits, kv.head_dim, static_cast<int>(n),
                                       heads, nullptr, gate, act);
        q4_gemv_prepared(m, act, n, out);
        return;
      }
    }
  }
  Backend::attention_out(kv, paging, seqs, q, heads, scale, gate, w, o, out);
}

}  // namespace tokenmill
