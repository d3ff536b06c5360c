// Internal to the 4-bit digit GEMVs (cuda_gemv_q4d.cu) and the fused MoE expert MLP
// (cuda_moe_mlp.cu): the integer mma, one 16-row tile's dot product over a range of groups
// against 8-bit activation digits, and the router's picks made inside a launch.
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv.h"
#include "backend/cuda/cuda_gemv_q4.cuh"

namespace tokenmill::cuda {

__device__ __forceinline__ void imma(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                     uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Groups [k0, k1) of one 16-row tile for CB column blocks of two activation rows. Lane (g, t)
// holds words [t*W, t*W+W) of rows g and g+8 of each group (the tile layout); word i of the
// lane feeds one mma with its even nibbles at k = 4t..4t+3 and its odd ones at k = 16+4t.. (the
// digit planes hold the activations in that order). The lane's B column g is digit g&3 of row
// g>>2 of the column block.
template <int G, int CB, int U, int ST, bool kSharedX = false>
struct Q4DigitDot {
  using Stream = Q4TileStream<G, U, ST>;
  using Buf = typename Stream::Buf;
  static constexpr int W = Stream::W;
  Stream ws;
  const uint2* xbase;
  const float2* sbase;
  uint32_t xoff[CB];  // this lane's B column (uint2 units)
  uint32_t soff[CB];  // per-group {2^-e, sum} of this lane's C row (float2 units)
  bool has_x[CB], has_s[CB];
  bool odd;

  __device__ Q4DigitDot(const Q4Tile& q, const Q4Act& act, int end, int l2_groups = 0)
      : ws(q.m, q.r0, end) {
    ws.l2_groups = l2_groups;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    odd = (t & 1) != 0;
    const int groups = static_cast<int>(q.m.cols / G);
    const int64_t words = q.m.cols / 8;
    xbase = reinterpret_cast<const uint2*>(act.x);
    sbase = reinterpret_cast<const float2*>(act.sums);
#pragma unroll
    for (int cb = 0; cb < CB; ++cb) {
      const int xr = 2 * cb + (g >> 2), sr = 2 * cb + (t >> 1);
      has_x[cb] = xr < q.ncols;
      has_s[cb] = sr < q.ncols;
      xoff[cb] =
          static_cast<uint32_t>(((q.cbase + (has_x[cb] ? xr : 0)) * 4 + (g & 3)) * words + t * W);
      soff[cb] = static_cast<uint32_t>((q.cbase + (has_s[cb] ? sr : 0)) * groups);
    }
  }

  // kSharedX: the activations are in shared memory (generic loads), else read-only global.
  template <class T>
  __device__ __forceinline__ static T load_act(const T* p) {
    if constexpr (kSharedX) {
      return *p;
    } else {
      return __ldg(p);
    }
  }

  // The activations of U groups for each column block: digit words and {2^-e, sum}.
  struct XBuf {
    uint2 x[CB][U][W];
    float2 s[CB][U];
  };

  __device__ __forceinline__ void load_x(XBuf& xb, int base) const {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int grp = base + u < ws.k1 ? base + u : ws.k1 - 1;  // past the end: unused
#pragma unroll
      for (int cb = 0; cb < CB; ++cb) {
#pragma unroll
        for (int i = 0; i < W; ++i) {
          xb.x[cb][u][i] =
              has_x[cb] ? load_act(xbase + (xoff[cb] + grp * (G / 8) + i)) : make_uint2(0, 0);
        }
        xb.s[cb][u] = has_s[cb] ? load_act(sbase + (soff[cb] + grp)) : make_float2(0.0f, 0.0f);
      }
    }
  }

  __device__ __forceinline__ void compute(const Buf& b, const XBuf& xb, int base,
                                          float (&tot)[CB][2]) const {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int grp = base + u;
      if (grp >= ws.k1) break;
      uint32_t ev[W][2], od[W][2];  // [word][row g, row g+8]: even and odd nibbles
#pragma unroll
      for (int i = 0; i < W; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t w = b.w[u][h * W + i];
          ev[i][h] = w & 0x0F0F0F0Fu;
          od[i][h] = (w >> 4) & 0x0F0F0F0Fu;
        }
      }
      float sc[2], bi[2];
      q4_scales<ST>(b.s[u], sc, bi);
#pragma unroll
      for (int cb = 0; cb < CB; ++cb) {
        int c[4] = {0, 0, 0, 0};
#pragma unroll
        for (int i = 0; i < W; ++i) {
          imma(c, ev[i][0], ev[i][1], od[i][0], od[i][1], xb.x[cb][u][i].x, xb.x[cb][u][i].y);
        }
        const float2 fx = xb.s[cb][u];
        const float X = odd ? fx.y : 0.0f;  // odd lanes add the bias term
        // 256 c0 + c1 in integers, then one conversion: |c0| < 2^17, so the sum fits an int32,
        // and the one rounding to F32 is the one fmaf(256, c0, c1) over exact floats would do.
        tot[cb][0] += (sc[0] * fx.x) * static_cast<float>(c[0] * 256 + c[1]) + bi[0] * X;
        tot[cb][1] += (sc[1] * fx.x) * static_cast<float>(c[2] * 256 + c[3]) + bi[1] * X;
      }
    }
  }

  // The activations load one buffer ahead of their use, like the weights: loaded where they are
  // used, each group waited an L2 round trip (they are L1 misses one time in two).
  __device__ __forceinline__ void run(int k0, float (&tot)[CB][2]) const {
#pragma unroll
    for (int cb = 0; cb < CB; ++cb) tot[cb][0] = tot[cb][1] = 0.0f;
    XBuf x0, x1;  // the activations of buffer 0 and buffer 1
    ws.run(
        k0,
        [&](const Buf& b, int base, auto which) {
          if constexpr (decltype(which)::value == 0) {
            if (base + U < ws.k1) load_x(x1, base + U);
            compute(b, x0, base, tot);
          } else {
            if (base + U < ws.k1) load_x(x0, base + U);
            compute(b, x1, base, tot);
          }
        },
        [&] { load_x(x0, k0); });
  }
};

// Q4Picks: after the wait, the router's picks into shared memory (returned: the slots' ids), the
// residual add shared over the launch's `blocks` blocks (this one is `block`), block 0 writing
// the ids and weights. Every thread of every block comes here (a block barrier).
__device__ __forceinline__ const int32_t* q4_make_picks(const Q4Slots& sl, int64_t block,
                                                        int64_t blocks) {
  __shared__ int32_t ids[kQ4PickMaxTokens * kQ4PickMaxK];
  __shared__ float weights[kQ4PickMaxTokens * kQ4PickMaxK];
  constexpr int kPer = kQ4PickMaxExperts / 32;
  const Q4Picks& p = sl.picks;
  wait_for_previous_grid();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (warp < p.tokens) {
    const float* l = p.logits + int64_t{warp} * p.experts;
    float v[kPer];
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int e = lane + 32 * u;
      v[u] = e < p.experts ? __ldcg(l + e) : -INFINITY;
    }
    topk_softmax_warp_regs(v, p.experts, sl.k, p.renormalize, ids + warp * sl.k,
                           weights + warp * sl.k);
  }
  if (p.y != nullptr) {
    const int64_t n4 = p.resid_floats / 4;
    for (int64_t i = block * blockDim.x + threadIdx.x; i < n4; i += blocks * blockDim.x) {
      float4* x4 = reinterpret_cast<float4*>(p.x) + i;
      const float4 a = *x4, b = reinterpret_cast<const float4*>(p.y)[i];
      *x4 = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
    }
  }
  __syncthreads();
  if (block == 0) {
    for (int i = threadIdx.x; i < p.tokens * sl.k; i += blockDim.x) {
      p.ids[i] = ids[i];
      p.weights[i] = weights[i];
    }
  }
  return ids;
}

}  // namespace tokenmill::cuda
