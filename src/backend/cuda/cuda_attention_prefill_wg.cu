// Causal GQA prefill attention at PrefillPrecision::kFast over a BF16 cache on Hopper's warpgroup
// MMA (wgmma, sm_90a): head_dim 128 or 256, even query-head groups up to 8.
//
// Why: the mma.sync kernel (cuda_attention_prefill.cu) is bound by its instruction stream (S30
// ncu on the 27B shape at 8k tokens: 8.1 ms a layer, about 100 TFLOP/s of causal products, 6% of
// its instructions mma). One wgmma m64n64k16 does the work of 32 mma.sync m16n8k16 with one
// issue and reads its B operand straight from shared memory (no ldmatrix), and the tensor copy
// engine fills the stages (one thread, no per-thread address arithmetic).
//
// Work: a block takes 64 consecutive tokens of one sequence and two query heads of one kv head
// (heads 2i and 2i + 1 of the group): warpgroup w (warps 4w..4w+3) owns head 2i + w's 64 rows,
// and both read every K/V tile once loaded. Thread 0 fills two stages of 64 keys' K and V from
// kv16 (the context's keys and values as F16, gather_context_f16_kernel) by the copy engine, one
// tile ahead; every warp releases a stage through an mbarrier once its products are done.
// Per tile of 64 keys: S = Q K^T (the warpgroup's queries as F16 in shared memory, written once;
// K K-major), the online softmax in registers (wgmma's accumulator is mma.sync m16n8's layout per
// warp, so the softmax is the mma.sync kernel's), then O += P V (P from registers as the A
// fragment, V MN-major and read transposed).
// Numerics as the mma.sync kernel's fast form: Q and P rounded to F16 (11 significant bits), K
// and V exact (BF16 values inside F16's range), F32 accumulation.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kv.cuh"
#include "backend/cuda/cuda_wgmma.cuh"

namespace tokenmill::cuda {
namespace {

constexpr int kWgRows = 64;   // query rows of a warpgroup (the wgmma's M)
constexpr int kWgKeys = 64;   // keys per tile (the scores' N)
constexpr int kWgStages = 2;  // K/V stages; a power of two
// Two warpgroups. A ninth (producer) warp would cost registers: ptxas sizes a block of 9 warps
// like one of 12 (three warps on some scheduler), 168 registers a thread, and the output
// accumulators alone take 128 at head_dim 256.
constexpr int kWgWarps = 8;
constexpr int kWgThreads = 32 * kWgWarps;
constexpr int kWgMaxGroup = 8;

// Shared memory from a 1024-byte aligned base: the two warpgroups' queries, then the stages (K
// then V, each kAtoms column atoms of 64 rows x 128 bytes), then the mbarriers (full, empty).
template <int D>
struct WgSmem {
  static constexpr int kAtoms = D / 64;
  static constexpr uint32_t kAtomBytes = 64 * 128;  // 64 rows (queries or keys) of one atom
  static_assert(kWgRows == 64 && kWgKeys == 64, "one atom height for Q, K and V");
  static constexpr uint32_t kQBytes = kAtoms * kAtomBytes;
  static constexpr uint32_t kTileBytes = kAtoms * kAtomBytes;
  static constexpr uint32_t kStageOff = 2 * kQBytes;
  static constexpr uint32_t kStageBytes = 2 * kTileBytes;
  static constexpr uint32_t kBarOff = kStageOff + kWgStages * kStageBytes;
  static constexpr size_t kBytes = kBarOff + 2 * 8 * kWgStages + 1024;  // + alignment slack
};

struct WgArgs {
  SeqLayout seqs;
  KVPaging pg;     // the block tables: a position without a block makes the rows reaching it NaN
  const float* q;  // [n_tokens, heads, D]
  float* out;      // [n_tokens, heads, D]
  int heads;
  int kv_heads;
  int group;          // query heads per kv head (even)
  int max_ctx;        // kv16 rows per sequence
  int pg_block_size;  // the cache's positions per block
  float scale_log2;   // softmax scale * log2(e), > 0
};

// Every sequence's context as F16 rows: K at kv16[(s * max_ctx + p) * kv_heads + h][D], V the
// same after n_seqs * max_ctx rows. Positions past the context: zeros. A position without a
// cache block: K NaN (rows whose keys reach it come out NaN, as in the other attention kernels),
// V zero. A 16-byte piece a thread.
__global__ void gather_context_f16_kernel(KVLayerView kv, KVPaging pg, int n_seqs, int max_ctx,
                                          __half* kv16) {
  pdl_begin();
  const int row_pieces = kv.kv_heads * kv.head_dim / 8;
  const int64_t rows = static_cast<int64_t>(n_seqs) * max_ctx;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * row_pieces) return;
  const int64_t row = i / row_pieces;
  const int piece = static_cast<int>(i - row * row_pieces);
  const int s = static_cast<int>(row / max_ctx), p = static_cast<int>(row % max_ctx);
  const int64_t cache_row = static_cast<int64_t>(kv.kv_heads) * kv.head_dim;
  uint4 k = make_uint4(0u, 0u, 0u, 0u), v = k;
  if (p < pg.context_lens[s]) {
    const int64_t r = cache_pos(pg.block_tables, pg.max_blocks_per_seq, kv.block_size, s, p);
    if (r >= 0) {
      const uint16_t* kc = static_cast<const uint16_t*>(kv.k) + r * cache_row + piece * 8;
      const uint16_t* vc = static_cast<const uint16_t*>(kv.v) + r * cache_row + piece * 8;
      k = bf16x8_to_f16x8(*reinterpret_cast<const uint4*>(kc));
      v = bf16x8_to_f16x8(*reinterpret_cast<const uint4*>(vc));
    } else {
      k = make_uint4(0x7e007e00u, 0x7e007e00u, 0x7e007e00u, 0x7e007e00u);  // F16 NaNs
    }
  }
  __half* const k_out = kv16 + row * cache_row + piece * 8;
  *reinterpret_cast<uint4*>(k_out) = k;
  *reinterpret_cast<uint4*>(k_out + rows * cache_row) = v;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ uint32_t f16x2_bits(float a, float b) {
  const __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// The warpgroup's 64 query rows of head h (tokens t0.., rows at or past t_end zero) as F16 in the
// K-major swizzled layout at q_s (generic pointer to the 1024-aligned region): row r's 16-byte
// chunk c of atom a at a * kAtomBytes + r * 128 + ((c ^ (r % 8)) * 16).
template <int D>
__device__ __forceinline__ void stage_queries(const WgArgs& a, int t0, int t_end, int h,
                                              uint8_t* q_s, int tid) {
  using L = WgSmem<D>;
  constexpr int kChunks = D / 8;  // 16-byte F16 chunks of a row
#pragma unroll 4
  for (int i = tid; i < kWgRows * kChunks; i += 128) {
    const int r = i / kChunks, c8 = i % kChunks;
    const int t = t0 + r;
    uint4 hv = make_uint4(0u, 0u, 0u, 0u);
    if (t < t_end) {
      const float4* src = reinterpret_cast<const float4*>(
          a.q + (static_cast<int64_t>(t) * a.heads + h) * D + c8 * 8);
      const float4 x0 = src[0], x1 = src[1];
      hv = make_uint4(f16x2_bits(x0.x, x0.y), f16x2_bits(x0.z, x0.w), f16x2_bits(x1.x, x1.y),
                      f16x2_bits(x1.z, x1.w));
    }
    const uint32_t off = (c8 >> 3) * L::kAtomBytes + r * 128 + (((c8 & 7) ^ (r & 7)) << 4);
    *reinterpret_cast<uint4*>(q_s + off) = hv;
  }
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <int D>
__global__ void __launch_bounds__(kWgThreads, 1)
    attention_prefill_wg_kernel(WgArgs a, const __grid_constant__ CUtensorMap kmap,
                                const __grid_constant__ CUtensorMap vmap) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = WgSmem<D>;
  extern __shared__ uint8_t wg_smem[];
  __shared__ int s_kmax, s_missing;
  const uint32_t raw = smem_addr(wg_smem);
  const uint32_t base = (raw + 1023) & ~1023u;
  uint8_t* const gbase = wg_smem + (base - raw);
  pdl_begin();

  // This block's tile, head pair and kv head: tiles numbered sequence by sequence, then pairs,
  // kv heads fastest; blocks take them last first. A tile's keys grow with its position, and
  // blocks start in index order: every head's longest tiles start first, so the launch does not
  // end on a wave of long blocks with the other multiprocessors idle.
  const int pairs = a.group / 2;
  int b = static_cast<int>(gridDim.x - 1 - blockIdx.x);
  const int kvh = b % a.kv_heads;
  b /= a.kv_heads;
  const int pair = b % pairs;
  const SeqTile span = seq_tile(a.seqs.cu_seqlens, a.seqs.n_seqs, b / pairs, kWgRows);
  if (span.s < 0) return;  // past the last tile (the grid is an upper bound)
  const int s = span.s, t0 = span.t0, t_end = span.t_end;
  // Positions at or past max_ctx have no row in kv16 (max_context_len is exact for unrecorded
  // steps; a smaller one would be a caller's bug): such rows come out NaN, not wrong.
  const int ctx = min(a.pg.context_lens[s], a.max_ctx);
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const uint32_t full0 = base + L::kBarOff, empty0 = full0 + 8 * kWgStages;
  if (threadIdx.x == 0) {
    s_kmax = -1;
    s_missing = INT_MAX;
    for (int st = 0; st < kWgStages; ++st) {
      mbar_init(full0 + 8 * st, 1);
      mbar_init(empty0 + 8 * st, kWgWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x < kWgRows) {
    const int t = t0 + static_cast<int>(threadIdx.x);
    if (t < t_end) {
      const int p = a.seqs.positions[t];
      if (p >= 0 && p < ctx) atomicMax(&s_kmax, p);
    }
  }
  __syncthreads();
  const int kmax = s_kmax;
  const int tiles = kmax < 0 ? 0 : kmax / kWgKeys + 1;
  // The first position up to kmax without a cache block (rows at or past it are NaN, as in the
  // other attention kernels; the copy's NaN keys there would make them NaN too, but through the
  // tensor cores' NaN handling, which this does not rely on).
  for (int b = static_cast<int>(threadIdx.x); b * a.pg_block_size <= kmax; b += kWgThreads) {
    if (b >= a.pg.max_blocks_per_seq ||
        a.pg.block_tables[static_cast<int64_t>(s) * a.pg.max_blocks_per_seq + b] < 0) {
      atomicMin(&s_missing, b * a.pg_block_size);
    }
  }
  __syncthreads();
  const int missing = s_missing;

  // Tile j's K and V into stage j % kWgStages by the copy engine, once every warp released the
  // tile that stage held (the (j / kWgStages - 1)-th completion of its empty barrier). Keys past
  // the context are zeros (or another sequence's rows, or past the tensor: zero-filled), masked.
  const int row0 = s * a.max_ctx;
  const auto load_tile = [&](int j) {
    const int st = j & (kWgStages - 1);
    const uint32_t full = full0 + 8 * st;
    if (j >= kWgStages) mbar_wait(empty0 + 8 * st, ((j / kWgStages) - 1) & 1);
    mbar_expect(full, L::kStageBytes);
    const uint32_t kdst = base + L::kStageOff + st * L::kStageBytes;
#pragma unroll
    for (int at = 0; at < L::kAtoms; ++at) {
      tma_load_3d(kdst + at * L::kAtomBytes, &kmap, at * 64, kvh, row0 + j * kWgKeys, full);
      tma_load_3d(kdst + L::kTileBytes + at * L::kAtomBytes, &vmap, at * 64, kvh,
                  row0 + j * kWgKeys, full);
    }
  };
  if (threadIdx.x == 0 && tiles > 0) load_tile(0);

  const int wg = warp >> 2, wq = warp & 3;
  const int h = kvh * a.group + 2 * pair + wg;
  stage_queries<D>(a, t0, t_end, h, gbase + wg * L::kQBytes, static_cast<int>(threadIdx.x) & 127);
  fence_proxy_async_smem();
  // The warpgroup's queries written (barriers 1 and 2, each its warpgroup's 128 threads; a
  // constant id each, so ptxas reserves two barriers, not all sixteen).
  if (wg == 0) {
    asm volatile("bar.sync 1, 128;" ::: "memory");
  } else {
    asm volatile("bar.sync 2, 128;" ::: "memory");
  }
  const uint32_t q_s = base + wg * L::kQBytes;

  // Rows g and g + 8 of the warp's 16: position (-1: no such token, -2: outside the context,
  // written as NaN); keys past a row's position are masked.
  const int g = lane >> 2, c = lane & 3;
  const auto row_pos = [&](int r) {
    const int t = t0 + r;
    if (t >= t_end) return -1;
    const int p = a.seqs.positions[t];
    return p >= 0 && p < ctx ? p : -2;
  };
  const int pos_a = row_pos(16 * wq + g), pos_b = row_pos(16 * wq + g + 8);
  const int warp_kmin =
      __reduce_min_sync(0xffffffffu, min(pos_a < 0 ? INT_MAX : pos_a, pos_b < 0 ? INT_MAX : pos_b));

  // o[n][4j + e]: row g (e < 2) or g + 8 of the warp's rows, column 64n + 8j + 2c + (e & 1).
  float o[L::kAtoms][32];
#pragma unroll
  for (int n = 0; n < L::kAtoms; ++n) {
#pragma unroll
    for (int i = 0; i < 32; ++i) o[n][i] = 0.0f;
  }
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
  for (int j = 0; j < tiles; ++j) {
    // The next tile is copied while this one is computed: thread 0 waits until both warpgroups
    // released the stage it goes into (the tile before this one), so they keep within a tile.
    if (threadIdx.x == 0 && j + 1 < tiles) load_tile(j + 1);
    const int st = j & (kWgStages - 1);
    mbar_wait(full0 + 8 * st, (j / kWgStages) & 1);
    const uint32_t k_s = base + L::kStageOff + st * L::kStageBytes, v_s = k_s + L::kTileBytes;

    // S = Q K^T: sc[4n + e], keys 8n + 2c + (e & 1) of the tile, rows as o's.
    float sc[32];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t off = (kk >> 2) * L::kAtomBytes + (kk & 3) * 32;
      wgmma_ss_n64(sc, gmma_desc(q_s + off), gmma_desc(k_s + off), kk > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 32; ++i) fence_operand(sc[i]);

    // Online softmax, base 2, as the mma.sync kernel's: scores unscaled until the exponent's FMA;
    // masks on the tiles that reach past the warp's lowest position only.
    const int p0 = j * kWgKeys;
    if (p0 + kWgKeys - 1 > warp_kmin) {
#pragma unroll
      for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int p = p0 + 8 * n + 2 * c + e;
          if (p > pos_a) sc[4 * n + e] = -INFINITY;
          if (p > pos_b) sc[4 * n + 2 + e] = -INFINITY;
        }
      }
    }
    float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      mx_a = fmaxf(mx_a, fmaxf(sc[4 * n], sc[4 * n + 1]));
      mx_b = fmaxf(mx_b, fmaxf(sc[4 * n + 2], sc[4 * n + 3]));
    }
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, off));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, off));
    }
    const float nm_a = fmaxf(m_a, mx_a * a.scale_log2), nm_b = fmaxf(m_b, mx_b * a.scale_log2);
    const float base_a = nm_a == -INFINITY ? 0.0f : nm_a;  // no key yet: every p is 0
    const float base_b = nm_b == -INFINITY ? 0.0f : nm_b;
    const float alpha_a = exp2f(m_a - base_a), alpha_b = exp2f(m_b - base_b);
    m_a = nm_a, m_b = nm_b;
    float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        sc[4 * n + e] = exp2f(fmaf(sc[4 * n + e], a.scale_log2, -base_a));
        sc[4 * n + 2 + e] = exp2f(fmaf(sc[4 * n + 2 + e], a.scale_log2, -base_b));
        sum_a += sc[4 * n + e];
        sum_b += sc[4 * n + 2 + e];
      }
    }
    l_a = l_a * alpha_a + sum_a;
    l_b = l_b * alpha_b + sum_b;
    if (__any_sync(0xffffffffu, alpha_a != 1.0f || alpha_b != 1.0f)) {
#pragma unroll
      for (int n = 0; n < L::kAtoms; ++n) {
#pragma unroll
        for (int i = 0; i < 32; i += 4) {
          o[n][i] *= alpha_a, o[n][i + 1] *= alpha_a, o[n][i + 2] *= alpha_b,
              o[n][i + 3] *= alpha_b;
        }
      }
    }

    // O += P V, 16 keys a k-step: P's accumulator layout is the A fragment's (n-tiles 2kk and
    // 2kk + 1); V's rows are the k-step's keys (1024-byte atoms of 8 keys), its columns N.
    uint32_t pa[kWgKeys / 16][4];
#pragma unroll
    for (int kk = 0; kk < kWgKeys / 16; ++kk) {
      pa[kk][0] = f16x2_bits(sc[8 * kk], sc[8 * kk + 1]);
      pa[kk][1] = f16x2_bits(sc[8 * kk + 2], sc[8 * kk + 3]);
      pa[kk][2] = f16x2_bits(sc[8 * kk + 4], sc[8 * kk + 5]);
      pa[kk][3] = f16x2_bits(sc[8 * kk + 6], sc[8 * kk + 7]);
    }
    // The P V wgmmas' register operands (o accumulates, pa is read) fenced on both sides of
    // the asynchronous wgmmas: written before them, read after the wait.
    const auto fence_pv = [&] {
#pragma unroll
      for (int n = 0; n < L::kAtoms; ++n) {
#pragma unroll
        for (int i = 0; i < 32; ++i) fence_operand(o[n][i]);
      }
#pragma unroll
      for (int kk = 0; kk < kWgKeys / 16; ++kk) {
#pragma unroll
        for (int i = 0; i < 4; ++i) fence_word(pa[kk][i]);
      }
    };
    fence_pv();
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kWgKeys / 16; ++kk) {
#pragma unroll
      for (int n = 0; n < L::kAtoms; ++n) {
        wgmma_n64<1>(o[n], pa[kk],
                     gmma_desc_mn(v_s + n * L::kAtomBytes + kk * 16 * 128, L::kAtomBytes), 1);
      }
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_pv();
    if (lane == 0) mbar_arrive(empty0 + 8 * st);  // this warp is done with the stage
  }

#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {
    l_a += __shfl_xor_sync(0xffffffffu, l_a, off);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, off);
  }
  const float nan = __int_as_float(0x7fc00000);
  const float inv_a = pos_a == -2 || pos_a >= missing ? nan : 1.0f / l_a;
  const float inv_b = pos_b == -2 || pos_b >= missing ? nan : 1.0f / l_b;
  float* const out_a = a.out + (static_cast<int64_t>(t0 + 16 * wq + g) * a.heads + h) * D + 2 * c;
  float* const out_b = out_a + static_cast<int64_t>(8) * a.heads * D;
#pragma unroll
  for (int n = 0; n < L::kAtoms; ++n) {
#pragma unroll
    for (int jn = 0; jn < 8; ++jn) {
      const int col = 64 * n + 8 * jn;
      if (pos_a != -1) {
        *reinterpret_cast<float2*>(out_a + col) =
            make_float2(o[n][4 * jn] * inv_a, o[n][4 * jn + 1] * inv_a);
      }
      if (pos_b != -1) {
        *reinterpret_cast<float2*>(out_b + col) =
            make_float2(o[n][4 * jn + 2] * inv_b, o[n][4 * jn + 3] * inv_b);
      }
    }
  }
#else
  __trap();  // launched only on sm_90 devices (GemvWorkspace::wgmma)
#endif
}

// kv16's K or V rows as a 3-D tensor [rows][kv_heads][D] of halves for the copy engine: boxes of
// 64 halves (128 bytes) x 1 head x 64 rows, 128-byte swizzled, rows past the end read as zeros.
CUtensorMap kv16_tensor_map(const __half* rows_base, int64_t rows, int kv_heads, int D,
                            void* encode_tiled) {
  CUtensorMap map{};
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(D), static_cast<cuuint64_t>(kv_heads),
                              static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(D) * 2,
                                 static_cast<cuuint64_t>(kv_heads) * D * 2};
  const cuuint32_t box[3] = {64, 1, static_cast<cuuint32_t>(kWgKeys)};
  const cuuint32_t elem[3] = {1, 1, 1};
  const auto encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(encode_tiled);
  const CUresult r =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3, const_cast<__half*>(rows_base), dims,
             strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TM_CUDA_REQUIRE(r == CUDA_SUCCESS, "prefill attention: cuTensorMapEncodeTiled failed");
  return map;
}

template <int D>
void launch_wg_d(cudaStream_t st, const WgArgs& a, dim3 grid, const __half* kv16, int64_t rows,
                 int kv_heads, void* encode_tiled) {
  const auto kernel = attention_prefill_wg_kernel<D>;
  constexpr size_t smem = WgSmem<D>::kBytes;
  TM_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem)));
  const CUtensorMap kmap = kv16_tensor_map(kv16, rows, kv_heads, D, encode_tiled);
  const CUtensorMap vmap =
      kv16_tensor_map(kv16 + rows * kv_heads * D, rows, kv_heads, D, encode_tiled);
  launch_pdl(kernel, grid, dim3(kWgThreads), smem, st, a, kmap, vmap);
  TM_CUDA_LAUNCHED();
}

}  // namespace

size_t attention_prefill_wg_kv16_bytes(const KVLayerView& kv, const KVPaging& pg,
                                       const SeqLayout& seqs, int heads) {
  const int D = kv.head_dim;
  const int r = kv.kv_heads > 0 ? heads / kv.kv_heads : 0;
  if (kv.dtype != DType::BF16 || (D != 128 && D != 256) || r < 2 || r % 2 != 0 || r > kWgMaxGroup ||
      seqs.n_seqs <= 0 || pg.max_context_len <= 0) {
    return 0;
  }
  return 2 * static_cast<size_t>(seqs.n_seqs) * static_cast<size_t>(pg.max_context_len) *
         kv.kv_heads * D * sizeof(__half);
}

bool launch_attention_prefill_wg(CUstream_st* st, const KVLayerView& kv, const KVPaging& pg,
                                 const SeqLayout& seqs, const float* q, int heads, float scale,
                                 float* out, void* kv16, void* encode_tiled) {
  const int D = kv.head_dim;
  if (attention_prefill_wg_kv16_bytes(kv, pg, seqs, heads) == 0 || encode_tiled == nullptr ||
      kv16 == nullptr || !(scale > 0.0f) || reinterpret_cast<uintptr_t>(q) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(out) % 8 != 0 || seqs.n_tokens <= 0) {
    return false;
  }
  const int group = heads / kv.kv_heads;
  const int64_t rows = static_cast<int64_t>(seqs.n_seqs) * pg.max_context_len;
  auto* const k16 = static_cast<__half*>(kv16);
  const int64_t pieces = rows * kv.kv_heads * D / 8;
  launch_pdl(gather_context_f16_kernel, static_cast<unsigned>((pieces + 255) / 256), dim3(256), 0,
             st, kv, pg, seqs.n_seqs, pg.max_context_len, k16);
  TM_CUDA_LAUNCHED();
  const WgArgs a{seqs,
                 pg,
                 q,
                 out,
                 heads,
                 kv.kv_heads,
                 group,
                 pg.max_context_len,
                 kv.block_size,
                 scale * 1.4426950408889634f};
  // Tiles start at each sequence's first token: at most n_tokens / 64 + n_seqs of them.
  const int64_t blocks =
      static_cast<int64_t>((seqs.n_tokens + kWgRows - 1) / kWgRows + seqs.n_seqs) * (group / 2) *
      kv.kv_heads;
  TM_CUDA_REQUIRE(blocks < (int64_t{1} << 31), "prefill attention: too many tiles");
  const dim3 grid(static_cast<unsigned>(blocks));
  if (D == 256) {
    launch_wg_d<256>(st, a, grid, k16, rows, kv.kv_heads, encode_tiled);
  } else {
    launch_wg_d<128>(st, a, grid, k16, rows, kv.kv_heads, encode_tiled);
  }
  return true;
}

}  // namespace tokenmill::cuda
