// Internal to the 4-bit GEMVs (cuda_gemv_q4.cu: F16 operands, cuda_gemv_q4d.cu: 8-bit digits)
// and the kernels that prepare their digits (cuda_moe_route.cu): the digits' store and what the
// GEMVs read of the tile layout (see "The tile layout" in cuda_q4_pack.cu).
#pragma once

#include <cuda.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv.h"

namespace tokenmill::cuda {

// The digits of one 8-value word (v in nibble order 0,2,4,6,1,3,5,7): the four digit planes
// 8 bytes (dw[digit]) and its group's {2^-e, sum of the group's values} (NaN, NaN when the group
// holds a non-finite value). Called by whole warps (shuffles); a group's G/8 words are aligned
// lanes of one warp.
struct Q4dWord {
  uint2 dw[4];
  float2 sums;
};
__device__ __forceinline__ Q4dWord q4d_word(const float (&v)[8], int group) {
  float m = 0.0f;
  bool nan = false;
#pragma unroll
  for (int p = 0; p < 8; ++p) {
    m = fmaxf(m, fabsf(v[p]));
    nan |= isnan(v[p]);
  }
  if (nan) m = INFINITY;  // fmaxf drops NaN
  const int wpg = group / 8;
  for (int o = 1; o < wpg; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  const bool finite = m <= FLT_MAX;
  // 2^e puts m in [2^29, 2^30); e <= 126 keeps 2^e and 2^-e normal floats (groups below ~2^-97
  // lose resolution, as F32 itself does there).
  int e = 0;
  if (m > 0.0f && finite) {
    e = min(29 - (static_cast<int>((__float_as_uint(m) >> 23) & 0xff) - 127), 126);
  }
  const float f = __uint_as_float(static_cast<uint32_t>(e + 127) << 23);
  float sum = 0.0f;
  uint32_t dw[4][2] = {};
#pragma unroll
  for (int p = 0; p < 8; ++p) {
    const float s = finite ? rintf(v[p] * f) : 0.0f;  // |s| < 2^30: exact in int32
    sum += s;
    int q = static_cast<int>(s);
    const int sh = 8 * (p & 3);
#pragma unroll
    for (int d = 3; d >= 1; --d) {
      const int digit = static_cast<int8_t>(q & 0xff);
      dw[d][p >> 2] |= static_cast<uint32_t>(digit & 0xff) << sh;
      q = (q - digit) >> 8;
    }
    dw[0][p >> 2] |= static_cast<uint32_t>(q & 0xff) << sh;
  }
  for (int o = 1; o < wpg; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const float back = __uint_as_float(static_cast<uint32_t>(127 - e) << 23);
  Q4dWord w;
#pragma unroll
  for (int d = 0; d < 4; ++d) w.dw[d] = make_uint2(dw[d][0], dw[d][1]);
  w.sums = finite ? make_float2(back, sum * back) : make_float2(NAN, NAN);
  return w;
}

// q4d_word's digits of word j of K/8 of activation row c, stored as planes [row][digit][K/8] of
// 8 bytes per word, and per (row, group) its sums. `live` false for lanes past the row (they
// still take part in the shuffles).
__device__ __forceinline__ void q4d_store_word(const float (&v)[8], bool live, int64_t c, int64_t j,
                                               int64_t K, int group, const Q4Act& act) {
  const Q4dWord w = q4d_word(v, group);
  if (!live) return;
  const int64_t words = K / 8;
  uint2* planes = reinterpret_cast<uint2*>(act.x) + c * 4 * words;
#pragma unroll
  for (int d = 0; d < 4; ++d) planes[d * words + j] = w.dw[d];
  const int wpg = group / 8;
  if (j % wpg == 0) reinterpret_cast<float2*>(act.sums)[c * (K / group) + j / wpg] = w.sums;
}

// The activations prepared in gmma order (Q4Operands::kF16Gmma) as a 2-D tensor of [rows, 2K]
// halves for the copy engine: boxes of 64 halves (128 bytes) x n_box rows, 128-byte swizzled,
// rows past the end read as zeros (cuda_gemv_q4g.cu).
CUtensorMap q4_act_tensor_map(const Q4Act& act, int n_box, const GemvWorkspace& ws);

// Where tile t lives: slot (MoE) or activation columns, job, first row, and the matrix.
struct Q4Tile {
  DevMat m;
  float* out;
  int64_t r0, cbase;
  int ncols;
  bool bad_expert;
};

__device__ __forceinline__ Q4Tile q4_tile(const GemvJobs& jobs, int64_t t, int64_t tiles_per_slot,
                                          int n, const Q4Slots& sl) {
  const int64_t slot = t / tiles_per_slot, jt = t - slot * tiles_per_slot;
  int j = 0;
  while (j + 1 < jobs.count && jt >= jobs.first_tile[j + 1]) ++j;
  Q4Tile q{jobs.m[j], jobs.out[j], (jt - jobs.first_tile[j]) * 16, 0, n, false};
  if (sl.ids != nullptr) {
    const int64_t token = slot / sl.per_token;
    const int js = static_cast<int>(slot - token * sl.per_token);
    q.out += slot * q.m.rows;
    if (js == sl.k) {
      q.m = jobs.m[j + jobs.shared_offset];
    } else {
      const int e = sl.ids[token * sl.k + js];
      q.bad_expert = e < 0 || e >= q.m.experts;
      if (!q.bad_expert) q.m = at_expert(q.m, e);
    }
    q.cbase = slot / sl.x_div;
    q.ncols = 1;
  }
  return q;
}

// Tile t of a launch over plain jobs (tiles_per_slot: all padded tiles) or, kChunks, over
// grouped MoE chunks (tiles_per_slot padded tiles per chunk; chunk c is chunks[4c .. 4c+3] =
// {expert, first prepared row, rows, unused}, uploaded before the MoE layer's kernels run).
template <bool kChunks>
__device__ __forceinline__ Q4Tile q4_jobs_tile(const GemvJobs& jobs, int64_t t,
                                               int64_t tiles_per_slot, int n,
                                               const int32_t* chunks) {
  if constexpr (kChunks) {
    const int64_t ci = t / tiles_per_slot;
    Q4Tile q = q4_tile(jobs, t - ci * tiles_per_slot, tiles_per_slot, n, Q4Slots{});
    const int4 c = reinterpret_cast<const int4*>(chunks)[ci];
    q.m = at_expert(q.m, c.x);
    q.cbase = c.y;
    q.ncols = c.z;
    q.out += static_cast<int64_t>(c.y) * q.m.rows;
    return q;
  } else {
    return q4_tile(jobs, t, tiles_per_slot, n, Q4Slots{});
  }
}

// The four f16x2 mma operands of one word of 8 nibbles (v_i in bits [4i, 4i+4)): the exact
// integers (v0, v4), (16*v1, 16*v5), (v2, v6), (16*v3, 16*v7) (see cuda_gemv_q4.cu's file
// comment: v | 0x6400 is the f16 1024 + v, and the 1024 goes before the mma).
__device__ __forceinline__ uint32_t q4_minus_1024(uint32_t v) {
  uint32_t r;
  asm("sub.f16x2 %0, %1, %2;" : "=r"(r) : "r"(v), "r"(0x64006400u));
  return r;
}
__device__ __forceinline__ void q4_unpack_word(uint32_t w, uint32_t (&e)[4]) {
  e[0] = q4_minus_1024((w & 0x000F000Fu) | 0x64006400u);
  e[1] = q4_minus_1024((w & 0x00F000F0u) | 0x64006400u);
  const uint32_t h = w >> 8;
  e[2] = q4_minus_1024((h & 0x000F000Fu) | 0x64006400u);
  e[3] = q4_minus_1024((h & 0x00F000F0u) | 0x64006400u);
}

// The wgmma / m16n8k16 A fragments of one group from a lane's words (row g's W words, then row
// g + 8's): k-step 2w + p is {row g e[2p], row g+8 e[2p], row g e[2p+1], row g+8 e[2p+1]} of
// word w (e: q4_unpack_word's integers).
template <int W>
__device__ __forceinline__ void q4_fragments(const uint32_t (&words)[2 * W],
                                             uint32_t (&a)[2 * W][4]) {
#pragma unroll
  for (int w = 0; w < W; ++w) {
    uint32_t ea[4], eb[4];
    q4_unpack_word(words[w], ea);
    q4_unpack_word(words[W + w], eb);
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      a[2 * w + p][0] = ea[2 * p];
      a[2 * w + p][1] = eb[2 * p];
      a[2 * w + p][2] = ea[2 * p + 1];
      a[2 * w + p][3] = eb[2 * p + 1];
    }
  }
}

// BatchPrecision::kFast: q4_fragments' integers become the weights, digit * scale + bias in F16
// (rows g and g + 8: sc[h], bi[h]). Register i of a fragment is row g + 8 (i & 1)'s; registers 2
// and 3 hold 16 * digit (the activations they meet are a sixteenth of theirs), so their bias is
// 16 * bias: each becomes 16 * (digit * scale + bias), which rounds as digit * scale + bias does.
template <int KS>
__device__ __forceinline__ void q4_fast_weights(uint32_t (&a)[KS][4], const float (&sc)[2],
                                                const float (&bi)[2]) {
  uint32_t s2[2], b2[2][2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    asm("cvt.rn.f16x2.f32 %0, %1, %1;" : "=r"(s2[h]) : "f"(sc[h]));
    asm("cvt.rn.f16x2.f32 %0, %1, %1;" : "=r"(b2[0][h]) : "f"(bi[h]));
    asm("cvt.rn.f16x2.f32 %0, %1, %1;" : "=r"(b2[1][h]) : "f"(16.0f * bi[h]));
  }
#pragma unroll
  for (int k = 0; k < KS; ++k) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      asm("fma.rn.f16x2 %0, %0, %1, %2;" : "+r"(a[k][i]) : "r"(s2[i & 1]), "r"(b2[i >> 1][i & 1]));
    }
  }
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

// The exact wgmma GEMVs' per-group step: tot += scale * acc + bias * X for a group's finished
// products acc (the accumulator fragment: weight row g + 8h, activation row 8j + 2t + e) with
// rows g and g + 8's scales and biases; X, the activation rows' group sums, from shared memory at
// xs (this lane's first pair; row block j 32 bytes further). Every row block, rows past the
// valid ones included (their sums are zeros): no branch while wgmmas may run.
template <int N>
__device__ __forceinline__ void q4_group_epilogue(float (&tot)[N / 2], const float (&acc)[N / 2],
                                                  const float (&sc)[2], const float (&bi)[2],
                                                  uint32_t xs) {
#pragma unroll
  for (int j = 0; j < N / 8; ++j) {
    float2 X;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(X.x), "=f"(X.y) : "r"(xs + 32 * j));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float& o0 = tot[4 * j + 2 * h];
      float& o1 = tot[4 * j + 2 * h + 1];
      o0 = fmaf(sc[h], acc[4 * j + 2 * h], fmaf(bi[h], X.x, o0));
      o1 = fmaf(sc[h], acc[4 * j + 2 * h + 1], fmaf(bi[h], X.y, o1));
    }
  }
}

// A warp's 16-row tile of a wgmma GEMV's output (acc[4j + 2h + e]: weight row g + 8h of tile
// `warp` of q's block tile, activation row 8j + 2t + e), times the rows' scales colscale[c].
template <int N>
__device__ __forceinline__ void q4_store_tile(const Q4Tile& q, const float (&acc)[N / 2],
                                              const float* colscale, int warp) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < N / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int c = 8 * j + 2 * t + e;  // activation row
      if (c >= q.ncols) continue;
      const float scale = colscale[c];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t r = q.r0 + 16 * warp + g + 8 * h;
        if (r < q.m.rows) q.out[c * q.m.rows + r] = acc[4 * j + 2 * h + e] * scale;
      }
    }
  }
}

// The weights of one 16-row tile, groups [k0, k1), streamed the same way by both GEMVs: U groups
// per buffer, two buffers, the next one loading while the other is used. Lane (g = lane/4,
// t = lane%4) gets words [t*W, t*W+W) of rows g and g+8 of each group (one 8W-byte load) and
// its rows' scales and biases (one 8- or 16-byte load). Offsets inside a tile are 32-bit; the
// tile's base pointers are computed once.
template <int G, int U, int ST>
struct Q4TileStream {
  static constexpr int W = G / 32;
  static constexpr int kSB = ST == kF32 ? 4 : 2;  // bytes per scale
  static constexpr int kBlockBytes = 256 * W;     // one tile-group of data: 32 lanes x 8W bytes
  using SVec = Q4ScaleVec<ST>;
  struct Buf {
    uint32_t w[U][2 * W];  // row g's W words, then row g+8's
    SVec s[U];             // scale g, bias g, scale g+8, bias g+8
  };
  const uint8_t *pw, *ps;
  int k1;
  int l2_groups = 0;  // groups past the first two buffers asked of L2 before the wait

  __device__ Q4TileStream(const DevMat& m, int64_t r0, int end) : k1(end) {
    const int lane = threadIdx.x & 31, g = lane >> 2;
    const int groups = static_cast<int>(m.cols / G);
    const int64_t first_block = (r0 >> 4) * groups;
    pw = m.data + (first_block * 32 + lane) * (8 * W);
    ps = m.scales + (first_block * 8 + g) * 4 * kSB;
  }

  __device__ __forceinline__ void load(Buf& b, int base) const {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int grp = base + u;
      if (grp < k1) {
        const uint8_t* p = pw + static_cast<uint32_t>(grp) * kBlockBytes;
        if constexpr (W == 1) {
          const uint2 v = __ldcs(reinterpret_cast<const uint2*>(p));
          b.w[u][0] = v.x, b.w[u][1] = v.y;
        } else {
#pragma unroll
          for (int i = 0; i < W / 2; ++i) {
            const uint4 v = __ldcs(reinterpret_cast<const uint4*>(p) + i);
            b.w[u][4 * i] = v.x, b.w[u][4 * i + 1] = v.y, b.w[u][4 * i + 2] = v.z,
                       b.w[u][4 * i + 3] = v.w;
          }
        }
        b.s[u] = __ldcs(reinterpret_cast<const SVec*>(ps + static_cast<uint32_t>(grp) * 32 * kSB));
      }
    }
  }

  template <class Compute>
  __device__ __forceinline__ void run(int k0, Compute&& compute) const {
    run(k0, compute, [] {});
  }

  // compute(buf, first group of buf, buffer index as an integral_constant) for each buffer of
  // [k0, k1). Both buffers' weights load before the wait for the kernel before (launch_pdl: the
  // activations it prepares), so 2U groups are in flight while it finishes; the next kernel may
  // be scheduled after the wait. after_wait() runs once the activations are readable (it may
  // start loading them).
  // Measured (H100, one build, the second buffer loaded after the wait or before it): 27B
  // q4g64 batch 1 139.3 -> 141.7 tok/s, 35B-A3B 450 -> 455: a short range (the 35B-A3B's 8-11
  // groups a warp) waited a DRAM round trip less.
  template <class Compute, class AfterWait>
  __device__ __forceinline__ void run(int k0, Compute&& compute, AfterWait&& after_wait) const {
    Buf b0, b1;
    load(b0, k0);
    load(b1, k0 + U);
    // The next l2_groups groups of the range towards L2 while the kernel before finishes (the
    // DRAM is otherwise idle then): lane 0 the weights, lane 1 the scales (lane 1 is row 0's
    // too, g = 0), each one contiguous run in the tile layout.
    const int lane = threadIdx.x & 31;
    const int p0 = k0 + 2 * U, pn = min(k1 - p0, l2_groups);
    if (pn > 0 && lane < 2) {
      const uint8_t* at = lane == 0 ? pw + static_cast<uint32_t>(p0) * kBlockBytes
                                    : ps + static_cast<uint32_t>(p0) * 32 * kSB;
      const uint32_t bytes = static_cast<uint32_t>(pn) * (lane == 0 ? kBlockBytes : 32 * kSB);
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(at), "r"(bytes));
    }
    pdl_begin();
    after_wait();
    for (int base = k0; base < k1; base += 2 * U) {
      compute(b0, base, std::integral_constant<int, 0>{});
      load(b0, base + 2 * U);
      compute(b1, base + U, std::integral_constant<int, 1>{});
      load(b1, base + 3 * U);
    }
  }
};

}  // namespace tokenmill::cuda
