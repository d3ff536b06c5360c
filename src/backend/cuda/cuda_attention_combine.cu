// The second pass of split-context decode attention (cuda_attention.cu,
// cuda_attention_split_tc.cu write the first pass's per-split partials: acc[D], m, l):
// out[t, h, :] = sum over splits of acc * exp(m - M) / sum of l * exp(m - M).
//
// Block (t * heads + h) of kCombineThreads threads: thread i takes split i's maximum and sum
// (the weights go to shared memory), warp w sums splits w, w + 8, ... over its lanes' dims
// (float4s at 4 * lane + 128 * c), and the warps' sums are added in warp order. Why: one thread
// walking every split serially (three passes of dependent loads) took ~0.3 ms per layer at 32k
// positions (258 splits).
//
// kHeld > 0 (at most kCombineWarps * kHeld splits, every decode context up to a few thousand
// positions): each warp loads its splits' sums into registers together with the maxima, so the
// pass after the dependent-launch wait is one L2 round trip instead of three (maxima, then
// weights, then sums). The arithmetic and its order are the loop form's: the same bits.
//
// kGated (an attention layer's decode output, CudaBackend::attention_out): the row is multiplied
// by sigmoid(gate) (q4d_prepare_kernel's arithmetic, so the same bits) and only its digits for
// the 4-bit output projection are written, by warp 0 (a head's D / 8 words; groups divide D).
// The gate is the attention front's output, two launches back: complete before the split pass
// (which waits for it) lets this launch start, so it loads before the wait.
#include <cuda_runtime.h>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv.h"
#include "backend/cuda/cuda_gemv_q4.cuh"

namespace tokenmill::cuda {
namespace {

constexpr int kCombineThreads = 256;
constexpr int kCombineWarps = kCombineThreads / 32;
constexpr int kCombineHeld = 8;  // splits a warp holds (kHeld) where the row has few enough

template <bool kGated, int kHeld>
__global__ void __launch_bounds__(kCombineThreads, 1)
    attention_combine_kernel(const float* __restrict__ ws, int splits, int D,
                             float* __restrict__ out, const float* __restrict__ gate, int heads,
                             Q4Act act) {
  __shared__ float w[kMaxSplits];  // exp(m_sp - M) for splits that saw positions, else 0
  __shared__ __align__(16) float part[kCombineWarps][256];
  __shared__ float red[32];
  const int64_t th = blockIdx.x;  // t * heads + h
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, chunks = D / 128;
  // D <= kCombineThreads: thread d finishes column d.
  const int d = static_cast<int>(threadIdx.x);
  float gv = 0.0f;
  if constexpr (kGated) {
    if (d < D) gv = gate[th * D + d];
  }
  pdl_begin();
  const float* base = ws + th * splits * (D + 2);
  // Every load of the row is issued here: this thread's split's maximum and sum, and (kHeld)
  // this warp's splits' sums (D + 2 floats per split: rows are 8-byte aligned only, so two
  // 8-byte loads per float4).
  float2 held[kHeld > 0 ? kHeld : 1][2][2];
  if constexpr (kHeld > 0) {
#pragma unroll
    for (int u = 0; u < kHeld; ++u) {
      const int sp = warp + kCombineWarps * u;
      if (sp >= splits) break;
      const float* p = base + sp * (D + 2) + 4 * lane;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        if (c >= chunks) break;
        held[u][c][0] = *reinterpret_cast<const float2*>(p + 128 * c);
        held[u][c][1] = *reinterpret_cast<const float2*>(p + 128 * c + 2);
      }
    }
  }
  float my_m = -INFINITY, my_l = 0.0f;
  if (kHeld > 0 && d < splits) {
    my_m = base[d * (D + 2) + D];
    my_l = base[d * (D + 2) + D + 1];
  }
  // Pass 1: M over splits (NaN anywhere: a missing block, the whole row is NaN).
  float mloc = -INFINITY;
  bool nan = false;
  for (int sp = d; sp < splits; sp += kCombineThreads) {
    const float m = kHeld > 0 ? my_m : base[sp * (D + 2) + D];
    nan |= m != m;
    mloc = fmaxf(mloc, m);
  }
  mloc = warp_max(mloc);
  if (lane == 0) red[warp] = mloc;
  nan = __syncthreads_or(nan);  // also publishes red
  const float M = warp_max(lane < kCombineWarps ? red[lane] : -INFINITY);
  // Pass 2: weights and L.
  float lloc = 0.0f;
  for (int sp = d; sp < splits; sp += kCombineThreads) {
    const float* p = base + sp * (D + 2);
    const float l = kHeld > 0 ? my_l : p[D + 1];
    const float f = l > 0.0f ? expf((kHeld > 0 ? my_m : p[D]) - M) : 0.0f;
    w[sp] = f;
    lloc += l * f;
  }
  const float L = block_sum(lloc, red);  // its barriers also publish w
  // Pass 3: each warp its splits, each lane its dims.
  float4 acc[2] = {make_float4(0.0f, 0.0f, 0.0f, 0.0f), make_float4(0.0f, 0.0f, 0.0f, 0.0f)};
  const auto add = [&](float f, const float2(&v)[2][2]) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      if (c >= chunks) break;
      acc[c].x += f * v[c][0].x, acc[c].y += f * v[c][0].y;
      acc[c].z += f * v[c][1].x, acc[c].w += f * v[c][1].y;
    }
  };
  if constexpr (kHeld > 0) {
#pragma unroll
    for (int u = 0; u < kHeld; ++u) {
      const int sp = warp + kCombineWarps * u;
      if (sp >= splits) break;
      const float f = w[sp];
      if (f != 0.0f) add(f, held[u]);
    }
  } else {
#pragma unroll 4
    for (int sp = warp; sp < splits; sp += kCombineWarps) {
      const float f = w[sp];
      if (f == 0.0f) continue;
      const float* p = base + sp * (D + 2) + 4 * lane;
      float2 v[2][2];
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        if (c >= chunks) break;
        v[c][0] = *reinterpret_cast<const float2*>(p + 128 * c);
        v[c][1] = *reinterpret_cast<const float2*>(p + 128 * c + 2);
      }
      add(f, v);
    }
  }
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    if (c < chunks) *reinterpret_cast<float4*>(&part[warp][128 * c + 4 * lane]) = acc[c];
  }
  __syncthreads();
  const float inv = nan ? NAN : 1.0f / L;
  if (d < D) {
    float v = 0.0f;
#pragma unroll
    for (int k = 0; k < kCombineWarps; ++k) v += part[k][d];
    if constexpr (kGated) {
      // Column d's sums are this thread's alone: part[0] takes the row.
      const float o = v * inv;
      part[0][d] = o * sigmoid_f(gv);
    } else {
      out[th * D + d] = v * inv;
    }
  }
  if constexpr (kGated) {
    __syncthreads();
    if (warp == 0) {
      const int words = D / 8;
      const bool live = lane < words;
      float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
      if (live) {
        const float* p = &part[0][8 * lane];
        const float nib[8] = {p[0], p[2], p[4], p[6], p[1], p[3], p[5], p[7]};  // nibble order
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = nib[i];
      }
      const int64_t t = th / heads, h = th - t * heads;
      q4d_store_word(v, live, t, h * words + lane, int64_t{heads} * D, act.group, act);
    }
  }
}

template <bool kGated>
void launch_typed(CUstream_st* st, const float* ws, int splits, int D, int rows, int heads,
                  float* out, const float* gate, const Q4Act& act) {
  const auto kernel = splits <= kCombineWarps * kCombineHeld
                          ? attention_combine_kernel<kGated, kCombineHeld>
                          : attention_combine_kernel<kGated, 0>;
  launch_pdl(kernel, dim3(static_cast<unsigned>(rows * heads)), dim3(kCombineThreads), 0, st, ws,
             splits, D, out, gate, heads, act);
}

}  // namespace

void launch_attention_combine(CUstream_st* st, const float* ws, int splits, int D, int rows,
                              int heads, float* out, const float* gate, const Q4Act& act) {
  TM_CUDA_REQUIRE(splits >= 1 && splits <= kMaxSplits && D % 128 == 0 && D <= kCombineThreads,
                  "attention combine: 1..256 splits of head_dim 128 or 256");
  if (gate != nullptr) {
    launch_typed<true>(st, ws, splits, D, rows, heads, out, gate, act);
  } else {
    launch_typed<false>(st, ws, splits, D, rows, heads, out, gate, act);
  }
  TM_CUDA_LAUNCHED();
}

}  // namespace tokenmill::cuda
