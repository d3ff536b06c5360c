// Causal GQA attention for many query rows (prefill chunks) on the tensor cores: flash attention
// with mma.sync m16n8k16, F16 operands and F32 accumulation, over the paged cache.
//
// Shape. A block takes one kv head and 16 * TT consecutive tokens of one sequence; its warps are
// (token tile, query head of the GQA group) pairs, so R query heads share every K/V tile the
// block loads. Each warp holds the online-softmax state (max, sum, F32 output accumulators) of
// its 16 rows. For head dims of 128 and 256 at groups up to 6, two warps share each such pair,
// each with half of head_dim's accumulators (128 of them a thread at 256 held one warp to a
// scheduler's share of 1.5): twelve warps a block. Per tile of kKeys keys: the K and V rows are
// read from the cache, split into F16 hi + lo parts in shared memory; S = Q K^T and O += P V run as
// three F16 products each (hi*hi + hi*lo + lo*hi), about 22 significant bits per operand: prefill
// then agrees with the F32 decode kernels (and the CPU) to F32 rounding, as the prefill GEMM does
// (cuda_gemm.cu). PrefillPrecision::kFast (--prefill-precision fast): hi*hi only, one pass per
// product. Over a BF16 cache K and V are exact in F16 (8 significant bits), so their lo parts are
// not stored and lo*hi is skipped: two passes per product (a BF16 value below 2^-17 rounds to F16's
// subnormal spacing, 2^-25 at most, far below the output's F32 rounding at real scales); and
// their tiles are copied from the cache by cp.async two stages deep, the next tile in flight
// while this one is computed, then converted to F16 in place.
// Invariant: |q|, |k|, |v| stay inside the F16 range (65504), as normed queries and keys and the
// values of real models do.
//
// Why: the one-pass kernel (cuda_attention.cu) walks the keys of each (row, head) with warp
// sums; at an 8k-token prompt it took 192 ms per attention layer on the H200, 47% of the
// prefill.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <type_traits>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kv.cuh"

namespace tokenmill::cuda {
namespace {

constexpr int kKeys = 32;  // keys per tile
constexpr int kPad = 8;    // F16 padding per shared row: ldmatrix rows hit distinct banks
// Warps per block (R * TT * halves) at most: 12 with head_dim split over two warps (halves 2:
// half the output accumulators), or fast up to head_dim 128 (queries without lo parts, so twelve
// warps' queries and the K/V stages fit in shared memory, and 64 accumulators fit 168 registers
// a thread); otherwise 8 (128 accumulators a thread at head_dim 256 need more registers). The
// kernel is bound by each warp's latency, so twelve warps on a multiprocessor instead of six pay.
constexpr int max_warps(int D, bool fast, int halves) {
  return halves == 2 || (fast && D <= 128) ? 12 : 8;
}
// Named barriers of the warp pairs that split a query tile's head_dim (0 is __syncthreads').
// Invariant: with pairs, every warp runs every tile (keys past its rows are masked, the same
// result), so all warps pass the same sequence of barriers. Where pairs skipped the tiles past
// their rows, racecheck reported WAR hazards on the V stages (7,424 at S29), though a block
// barrier separates each read from the next copy; with the same sequence everywhere, 0.
__device__ __forceinline__ void pair_barrier(int pair) {
  asm volatile("bar.sync %0, 64;" ::"r"(pair + 1) : "memory");
}
constexpr int kMaxGroup = 8;  // query heads per kv head

struct PrefillArgs {
  KVLayerView kv;
  KVPaging pg;
  SeqLayout seqs;
  const float* q;  // [n_tokens, heads, D]
  float* out;      // [n_tokens, heads, D]
  int heads;
  int group;         // R: query heads per kv head
  int tok_tiles;     // TT: 16-token tiles per block
  float scale_log2;  // softmax scale * log2(e): scores are exponentiated base 2
};

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const __half* p) {
  ldmatrix_x4(r, static_cast<uint32_t>(__cvta_generic_to_shared(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const __half* p) {
  ldmatrix_x4_trans(r, static_cast<uint32_t>(__cvta_generic_to_shared(p)));
}

__device__ __forceinline__ uint32_t half2_bits(__half2 h) {
  return *reinterpret_cast<uint32_t*>(&h);
}
// F16 hi and lo = f16(x - hi) of a pair, element a in the low half.
__device__ __forceinline__ void split_pair(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __half2 h = __floats2half2_rn(a, b);
  const float2 f = __half22float2(h);
  hi = half2_bits(h);
  lo = half2_bits(__floats2half2_rn(a - f.x, b - f.y));
}
// x's hi parts at p[0..3], its lo parts at p[lo_off..lo_off+3] (8-byte aligned); kFast: hi only.
template <bool kFast>
__device__ __forceinline__ void store_split4(__half* p, int lo_off, float4 x) {
  uint32_t h0, l0, h1, l1;
  split_pair(x.x, x.y, h0, l0);
  split_pair(x.z, x.w, h1, l1);
  *reinterpret_cast<uint2*>(p) = make_uint2(h0, h1);
  if constexpr (!kFast) *reinterpret_cast<uint2*>(p + lo_off) = make_uint2(l0, l1);
}

// Three-pass product into a fresh accumulator: d = (ah + al)(bh + bl) without al*bl, the small
// terms first. The caller adds d to its running sum in F32: the tensor cores' F32 accumulation
// truncates, and a long chain of mma.sync into one accumulator drifted ~1e-5 relative off the
// CPU (measured); a fresh accumulator per step keeps that error per step.
// kFast (PrefillPrecision::kFast): ah * bh only; kBExact (b exact in F16, bl zero): no ah * bl.
template <bool kFast, bool kBExact>
__device__ __forceinline__ void mma3(float (&d)[4], const uint32_t (&ah)[4],
                                     const uint32_t (&al)[4], uint32_t bh0, uint32_t bh1,
                                     uint32_t bl0, uint32_t bl1) {
  d[0] = d[1] = d[2] = d[3] = 0.0f;
  if constexpr (!kFast) {
    mma_f16(d, al[0], al[1], al[2], al[3], bh0, bh1);
    if constexpr (!kBExact) mma_f16(d, ah[0], ah[1], ah[2], ah[3], bl0, bl1);
  }
  mma_f16(d, ah[0], ah[1], ah[2], ah[3], bh0, bh1);
}
// d += the same products, in place: for O, whose chain per tile is short (the scores' chain
// runs over all of head_dim).
template <bool kFast, bool kBExact>
__device__ __forceinline__ void mma3_acc(float (&d)[4], const uint32_t (&ah)[4],
                                         const uint32_t (&al)[4], uint32_t bh0, uint32_t bh1,
                                         uint32_t bl0, uint32_t bl1) {
  if constexpr (!kFast) {
    mma_f16(d, al[0], al[1], al[2], al[3], bh0, bh1);
    if constexpr (!kBExact) mma_f16(d, ah[0], ah[1], ah[2], ah[3], bl0, bl1);
  }
  mma_f16(d, ah[0], ah[1], ah[2], ah[3], bh0, bh1);
}
__device__ __forceinline__ void add4(float (&acc)[4], const float (&d)[4]) {
  acc[0] += d[0], acc[1] += d[1], acc[2] += d[2], acc[3] += d[3];
}

// Shared memory: Q [warps][hi, lo][16][LD] (fast: [warps][hi][16][LD]), K [hi, lo][kKeys][LD],
// V likewise (F16, LD = D + kPad), then the cache rows of two tiles' keys. Over a BF16 cache (no
// lo parts) the K and V regions hold two stages of hi parts instead: [stage][kKeys][LD] each.
template <bool kFast>
constexpr int q_rows_per_warp() {
  return kFast ? 16 : 32;
}
// With kHalves 2, a pair of warps shares its query tile's rows, and each warp then has a slot
// of 16 x 32 floats for its partial scores.
template <int D, bool kFast, int kHalves>
constexpr size_t prefill_smem_bytes(int warps) {
  return (static_cast<size_t>(warps / kHalves) * q_rows_per_warp<kFast>() + 4 * kKeys) *
             (D + kPad) * sizeof(__half) +
         2 * kKeys * sizeof(int64_t) +
         (kHalves == 2 ? static_cast<size_t>(warps) * 16 * 32 * sizeof(float) : 0);
}

// kHalves 2: warps 2i and 2i + 1 take query tile i, each half of head_dim: half of Q K^T (the
// partial scores added through shared memory, so both hold the same sums), the same softmax,
// and P V for its half of the output.
template <int D, typename T, bool kFast, int kHalves>
__global__ void __launch_bounds__(max_warps(D, kFast, kHalves) * 32, 1)
    attention_prefill_kernel(PrefillArgs a) {
  constexpr int LD = D + kPad;
  constexpr int kDH = D / kHalves;                        // this warp's columns of head_dim
  constexpr int kDimTiles = kDH / 8;                      // n-tiles of the warp's output
  constexpr bool kKVExact = std::is_same_v<T, uint16_t>;  // a BF16 cache: K and V exact in F16
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int s_kmax, s_missing;
  const int warps = static_cast<int>(blockDim.x) >> 5;
  __half* const q_s = reinterpret_cast<__half*>(smem);
  constexpr int kQRows = q_rows_per_warp<kFast>();
  __half* const k_s = q_s + (warps / kHalves) * kQRows * LD;
  __half* const v_s = k_s + 2 * kKeys * LD;
  int64_t* const key_row = reinterpret_cast<int64_t*>(v_s + 2 * kKeys * LD);
  float* const partial = reinterpret_cast<float*>(key_row + 2 * kKeys);  // [warps][16][32]
  pdl_begin();

  // This block's tile: tiles are numbered sequence by sequence.
  const int tile_tokens = 16 * a.tok_tiles;
  int b = static_cast<int>(blockIdx.x), s = -1, t0 = 0, t_end = 0;
  for (int i = 0; i < a.seqs.n_seqs; ++i) {
    const int lo = a.seqs.cu_seqlens[i], hi = a.seqs.cu_seqlens[i + 1];
    const int nt = (hi - lo + tile_tokens - 1) / tile_tokens;
    if (b < nt) {
      s = i, t0 = lo + b * tile_tokens, t_end = hi;
      break;
    }
    b -= nt;
  }
  if (s < 0) return;  // past the last tile (the grid is an upper bound)
  const int ctx = a.pg.context_lens[s];
  const int kvh = static_cast<int>(blockIdx.y);
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, c = lane & 3;
  const int half = warp % kHalves, qi = warp / kHalves;  // qi: the warp's query tile and head
  const int h = kvh * a.group + qi % a.group;
  const int tok0 = t0 + (qi / a.group) * 16;
  // Rows g and g + 8 of the warp's tile: position (-1: no such token, -2: outside the context,
  // written as NaN); keys past a row's position are masked.
  const auto row_pos = [&](int r) {
    const int t = tok0 + r;
    if (t >= t_end) return -1;
    const int p = a.seqs.positions[t];
    return p >= 0 && p < ctx ? p : -2;
  };
  const int pos_a = row_pos(g), pos_b = row_pos(g + 8);
  if (threadIdx.x == 0) s_kmax = -1, s_missing = INT_MAX;
  __syncthreads();
  if (c == 0) atomicMax(&s_kmax, max(pos_a, pos_b));
  const int warp_kmax = __reduce_max_sync(0xffffffffu, max(pos_a, pos_b));

  // The warp's queries (its half of head_dim), split, into shared memory.
  __half* const qw = q_s + qi * kQRows * LD;
  for (int i = lane; i < 16 * kDH / 4; i += 32) {
    const int r = i / (kDH / 4), d = half * kDH + (i % (kDH / 4)) * 4;
    const int t = tok0 + r;
    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (t < t_end) {
      x = *reinterpret_cast<const float4*>(a.q + (static_cast<int64_t>(t) * a.heads + h) * D + d);
    }
    store_split4<kFast>(qw + r * LD + d, 16 * LD, x);
  }
  __syncthreads();
  const int kmax = s_kmax;

  float o[kDimTiles][4];
#pragma unroll
  for (int n = 0; n < kDimTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
  const int64_t cache_row = static_cast<int64_t>(a.kv.kv_heads) * D;
  const T* const kc = static_cast<const T*>(a.kv.k) + static_cast<int64_t>(kvh) * D;
  const T* const vc = static_cast<const T*>(a.kv.v) + static_cast<int64_t>(kvh) * D;
  // ldmatrix addressing: lane l gives row l % 8 of matrix l / 8.
  const int mi = lane >> 3, mr = lane & 7;

  // One tile of kKeys keys from p0, its K and V (F16 hi parts, lo parts kKeys rows below) in
  // ks and vs: the scores, the online softmax and O += P V for the warp's 16 rows.
  const auto tile_update = [&](int p0, const __half* ks, const __half* vs) {
    // S = Q K^T for the warp's 16 rows x kKeys keys.
    float sc[kKeys / 8][4];
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll 2
    for (int kd = half * (kDH / 16); kd < (half + 1) * (kDH / 16); ++kd) {
      uint32_t qh[4], ql[4] = {};
      const __half* qp = qw + ((mi & 1) * 8 + mr) * LD + kd * 16 + (mi >> 1) * 8;
      ldsm_x4(qh, qp);
      if constexpr (!kFast) ldsm_x4(ql, qp + 16 * LD);
#pragma unroll
      for (int nb = 0; nb < kKeys / 16; ++nb) {
        uint32_t kh[4], kl[4] = {};
        const __half* kp = ks + (nb * 16 + (mi >> 1) * 8 + mr) * LD + kd * 16 + (mi & 1) * 8;
        ldsm_x4(kh, kp);
        if constexpr (!kFast && !kKVExact) ldsm_x4(kl, kp + kKeys * LD);
        if constexpr (kFast) {
          // One F16 pass: the products chain in place; the tensor cores' truncating F32
          // accumulation is far below the operands' F16 rounding, and the fresh accumulator
          // and the adds (8 instructions a product) are gone.
          mma3_acc<kFast, kKVExact>(sc[2 * nb], qh, ql, kh[0], kh[1], kl[0], kl[1]);
          mma3_acc<kFast, kKVExact>(sc[2 * nb + 1], qh, ql, kh[2], kh[3], kl[2], kl[3]);
        } else {
          float d0[4], d1[4];
          mma3<kFast, kKVExact>(d0, qh, ql, kh[0], kh[1], kl[0], kl[1]);
          mma3<kFast, kKVExact>(d1, qh, ql, kh[2], kh[3], kl[2], kl[3]);
          add4(sc[2 * nb], d0);
          add4(sc[2 * nb + 1], d1);
        }
      }
    }
    if constexpr (kHalves == 2) {
      // The pair's partial scores summed: both warps then hold the same (commutative) sums.
      float* const mine = partial + warp * 16 * 32 + lane;
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) mine[(4 * n + e) * 32] = sc[n][e];
      }
      pair_barrier(qi);
      const float* const other = partial + (warp ^ 1) * 16 * 32 + lane;
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[n][e] += other[(4 * n + e) * 32];
      }
    }
    // Online softmax, base 2. Thread holds keys p0 + 8n + 2c + {0, 1} of rows g (sc[n][0..1])
    // and g + 8 (sc[n][2..3]); a row's max and sum are over the quad's 4 lanes.
    float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int p = p0 + 8 * n + 2 * c + e;
        sc[n][e] = p <= pos_a ? sc[n][e] * a.scale_log2 : -INFINITY;
        sc[n][2 + e] = p <= pos_b ? sc[n][2 + e] * a.scale_log2 : -INFINITY;
        mx_a = fmaxf(mx_a, sc[n][e]);
        mx_b = fmaxf(mx_b, sc[n][2 + e]);
      }
    }
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, off));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, off));
    }
    const float nm_a = fmaxf(m_a, mx_a), nm_b = fmaxf(m_b, mx_b);
    // A row with no key yet keeps max -inf: exponentiate against 0 (every p is then 0).
    const float base_a = nm_a == -INFINITY ? 0.0f : nm_a;
    const float base_b = nm_b == -INFINITY ? 0.0f : nm_b;
    const float alpha_a = exp2f(m_a - base_a), alpha_b = exp2f(m_b - base_b);
    m_a = nm_a, m_b = nm_b;
    float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        sc[n][e] = exp2f(sc[n][e] - base_a);
        sc[n][2 + e] = exp2f(sc[n][2 + e] - base_b);
        sum_a += sc[n][e];
        sum_b += sc[n][2 + e];
      }
    }
    l_a = l_a * alpha_a + sum_a;
    l_b = l_b * alpha_b + sum_b;
    // Once a row's max settles, most tiles leave it (alpha 1): then the warp skips the rescale
    // of its 64-128 accumulators a thread (the same bits: x * 1 = x).
    if (__any_sync(0xffffffffu, alpha_a != 1.0f || alpha_b != 1.0f)) {
#pragma unroll
      for (int n = 0; n < kDimTiles; ++n) {
        o[n][0] *= alpha_a, o[n][1] *= alpha_a, o[n][2] *= alpha_b, o[n][3] *= alpha_b;
      }
    }
    // O += P V, 16 keys per step; P's accumulator layout is the A fragment's.
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      uint32_t ph[4], pl[4];
      split_pair(sc[2 * kk][0], sc[2 * kk][1], ph[0], pl[0]);
      split_pair(sc[2 * kk][2], sc[2 * kk][3], ph[1], pl[1]);
      split_pair(sc[2 * kk + 1][0], sc[2 * kk + 1][1], ph[2], pl[2]);
      split_pair(sc[2 * kk + 1][2], sc[2 * kk + 1][3], ph[3], pl[3]);
#pragma unroll
      for (int dn = 0; dn < kDH / 16; ++dn) {
        uint32_t vh[4], vl[4] = {};
        const __half* vp =
            vs + (kk * 16 + (mi & 1) * 8 + mr) * LD + half * kDH + dn * 16 + (mi >> 1) * 8;
        ldsm_x4_trans(vh, vp);
        if constexpr (!kFast && !kKVExact) ldsm_x4_trans(vl, vp + kKeys * LD);
        mma3_acc<kFast, kKVExact>(o[2 * dn], ph, pl, vh[0], vh[1], vl[0], vl[1]);
        mma3_acc<kFast, kKVExact>(o[2 * dn + 1], ph, pl, vh[2], vh[3], vl[2], vl[3]);
      }
    }
  };

  if constexpr (kKVExact) {
    // A BF16 cache row is copied as it is (cp.async, no registers) into one of two stages while
    // the tile before is computed; each thread then converts the chunks it copied to F16 in
    // place (the same rounding as a conversion in registers). key_row holds two tiles' cache
    // rows, slot = tile & 1, written one iteration before the copies that read them, each
    // write and read separated by a barrier (racecheck: 0 hazards).
    const int tiles = kmax < 0 ? 0 : kmax / kKeys + 1;
    constexpr int kChunks = kKeys * D / 8;  // 16-byte chunks of K (or V) per tile
    const auto find_rows = [&](int tile) {
      if (threadIdx.x < kKeys) {
        const int p = tile * kKeys + static_cast<int>(threadIdx.x);
        int64_t r = -1;
        if (p <= kmax) {
          r = cache_pos(a.pg.block_tables, a.pg.max_blocks_per_seq, a.kv.block_size, s, p);
          if (r < 0) atomicMin(&s_missing, p);
        }
        key_row[(tile & 1) * kKeys + threadIdx.x] = r;
      }
    };
    // Chunk i of a tile: K for i < kChunks, else V; key (i % kChunks) / (D / 8).
    const auto chunk_dst = [&](int tile, int i) {
      const int which = i / kChunks, rem = i - which * kChunks;
      return (which ? v_s : k_s) + (tile & 1) * kKeys * LD + (rem / (D / 8)) * LD +
             (rem % (D / 8)) * 8;
    };
    const auto copy_tile = [&](int tile) {
      if (tile < tiles) {
        const int64_t* rows = key_row + (tile & 1) * kKeys;
        for (int i = static_cast<int>(threadIdx.x); i < 2 * kChunks;
             i += static_cast<int>(blockDim.x)) {
          const int which = i / kChunks, rem = i - which * kChunks;
          const int64_t r = rows[rem / (D / 8)];
          __half* dst = chunk_dst(tile, i);
          if (r >= 0) {
            cp_async16(smem_addr(dst), (which ? vc : kc) + r * cache_row + (rem % (D / 8)) * 8);
          } else {  // keys past the range (or without a block): zeros
            *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
          }
        }
      }
      cp_async_commit();  // an empty group past the last tile keeps the count uniform
    };
    find_rows(0);
    find_rows(1);
    __syncthreads();
    copy_tile(0);
    for (int tile = 0; tile < tiles; ++tile) {
      copy_tile(tile + 1);
      cp_async_wait<1>();  // this thread's copies of `tile` have landed
      for (int i = static_cast<int>(threadIdx.x); i < 2 * kChunks;
           i += static_cast<int>(blockDim.x)) {
        bf16x8_to_f16x8(chunk_dst(tile, i));
      }
      __syncthreads();
      // Slot tile & 1 is free once every thread is past the barrier: copy_tile(tile) read it
      // before (in the previous iteration, or before the loop); copy_tile(tile + 2) reads it
      // after the barrier that ends this iteration.
      find_rows(tile + 2);
      const int p0 = tile * kKeys;
      if (kHalves == 2 || p0 <= warp_kmax) {
        tile_update(p0, k_s + (tile & 1) * kKeys * LD, v_s + (tile & 1) * kKeys * LD);
      }
      __syncthreads();  // the stage is copied into again at the next tile
    }
  } else {
    for (int p0 = 0; p0 <= kmax; p0 += kKeys) {
      __syncthreads();  // the previous tile's readers are done
      if (threadIdx.x < kKeys) {
        const int p = p0 + static_cast<int>(threadIdx.x);
        int64_t r = -1;
        if (p <= kmax) {
          r = cache_pos(a.pg.block_tables, a.pg.max_blocks_per_seq, a.kv.block_size, s, p);
          if (r < 0) atomicMin(&s_missing, p);
        }
        key_row[threadIdx.x] = r;
      }
      __syncthreads();
      for (int i = static_cast<int>(threadIdx.x); i < kKeys * D / 4;
           i += static_cast<int>(blockDim.x)) {
        const int key = i / (D / 4), d = (i % (D / 4)) * 4;
        const int64_t r = key_row[key];
        float4 kx = make_float4(0.0f, 0.0f, 0.0f, 0.0f), vx = kx;  // keys past the range: zeros
        if (r >= 0) {
          kx = kv_load4(kc + r * cache_row + d);
          vx = kv_load4(vc + r * cache_row + d);
        }
        store_split4<kFast || kKVExact>(k_s + key * LD + d, kKeys * LD, kx);
        store_split4<kFast || kKVExact>(v_s + key * LD + d, kKeys * LD, vx);
      }
      __syncthreads();
      if (kHalves == 1 && p0 > warp_kmax) continue;  // every key is past this warp's rows
      tile_update(p0, k_s, v_s);
    }
  }

#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {
    l_a += __shfl_xor_sync(0xffffffffu, l_a, off);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, off);
  }
  // NaN rows: outside the context, or a key up to the row's position had no cache block.
  const int missing = s_missing;
  const float nan = __int_as_float(0x7fc00000);
  const float inv_a = pos_a == -2 || pos_a >= missing ? nan : 1.0f / l_a;
  const float inv_b = pos_b == -2 || pos_b >= missing ? nan : 1.0f / l_b;
  float* const out_a =
      a.out + (static_cast<int64_t>(tok0 + g) * a.heads + h) * D + half * kDH + 2 * c;
  float* const out_b = out_a + static_cast<int64_t>(8) * a.heads * D;
#pragma unroll
  for (int n = 0; n < kDimTiles; ++n) {
    if (pos_a != -1) {
      *reinterpret_cast<float2*>(out_a + 8 * n) = make_float2(o[n][0] * inv_a, o[n][1] * inv_a);
    }
    if (pos_b != -1) {
      *reinterpret_cast<float2*>(out_b + 8 * n) = make_float2(o[n][2] * inv_b, o[n][3] * inv_b);
    }
  }
}

template <int D, typename T, bool kFast, int kHalves>
void launch_prefill_d(cudaStream_t st, const PrefillArgs& a, dim3 grid, int warps) {
  const auto kernel = attention_prefill_kernel<D, T, kFast, kHalves>;
  constexpr size_t most = prefill_smem_bytes<D, kFast, kHalves>(max_warps(D, kFast, kHalves));
  TM_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(most)));
  launch_pdl(kernel, grid, dim3(warps * 32), prefill_smem_bytes<D, kFast, kHalves>(warps), st, a);
  TM_CUDA_LAUNCHED();
}

// split: head_dim over warp pairs (head dims of 128 and 256 only).
template <typename T, bool kFast>
bool launch_prefill_t(cudaStream_t st, const PrefillArgs& a, dim3 grid, int warps, int D,
                      bool split) {
  switch (D) {
    case 32:
      launch_prefill_d<32, T, kFast, 1>(st, a, grid, warps);
      return true;
    case 64:
      launch_prefill_d<64, T, kFast, 1>(st, a, grid, warps);
      return true;
    case 128:
      split ? launch_prefill_d<128, T, kFast, 2>(st, a, grid, warps)
            : launch_prefill_d<128, T, kFast, 1>(st, a, grid, warps);
      return true;
    case 256:
      split ? launch_prefill_d<256, T, kFast, 2>(st, a, grid, warps)
            : launch_prefill_d<256, T, kFast, 1>(st, a, grid, warps);
      return true;
    default:
      return false;
  }
}

}  // namespace

bool launch_attention_prefill(CUstream_st* st, const KVLayerView& kv, const KVPaging& pg,
                              const SeqLayout& seqs, const float* q, int heads, float scale,
                              float* out, bool fast) {
  const int D = kv.head_dim, r = heads / kv.kv_heads;
  if ((D != 32 && D != 64 && D != 128 && D != 256) || r < 1 || r > kMaxGroup ||
      reinterpret_cast<uintptr_t>(q) % 16 != 0 || reinterpret_cast<uintptr_t>(out) % 8 != 0 ||
      seqs.n_tokens <= 0 || seqs.n_seqs <= 0) {
    return false;
  }
  // Wide heads of groups up to 6: head_dim split over warp pairs, as many 16-token tiles as 12
  // warps hold. Otherwise exact: at least 4 warps where the group allows; fast: as many tiles as
  // the block's warps hold.
  const bool split = D >= 128 && 2 * r <= max_warps(D, false, 2);
  const int halves = split ? 2 : 1;
  const int tok_tiles = split    ? std::max(1, max_warps(D, fast, 2) / (2 * r))
                        : fast   ? std::max(1, max_warps(D, true, 1) / r)
                        : r >= 4 ? 1
                                 : 4 / r;
  const int tile_tokens = 16 * tok_tiles;
  PrefillArgs a{kv, pg, seqs, q, out, heads, r, tok_tiles, scale * 1.4426950408889634f};
  // Tiles start at each sequence's first token: at most n_tokens / tile + n_seqs of them.
  const dim3 grid(
      static_cast<unsigned>((seqs.n_tokens + tile_tokens - 1) / tile_tokens + seqs.n_seqs),
      static_cast<unsigned>(kv.kv_heads));
  const int warps = r * tok_tiles * halves;
  if (kv.dtype == DType::BF16) {
    return fast ? launch_prefill_t<uint16_t, true>(st, a, grid, warps, D, split)
                : launch_prefill_t<uint16_t, false>(st, a, grid, warps, D, split);
  }
  return fast ? launch_prefill_t<float, true>(st, a, grid, warps, D, split)
              : launch_prefill_t<float, false>(st, a, grid, warps, D, split);
}

}  // namespace tokenmill::cuda
