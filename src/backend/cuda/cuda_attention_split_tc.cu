// Split-context decode attention on the tensor cores, for BF16 KV caches on sm_90: the first
// pass of flash-decoding for few query rows (decode, speculative verify) over long contexts. It
// writes the same per-split partials (acc[D], m, l) as the CUDA-core split kernel
// (cuda_attention.cu), whose combine kernel finishes the rows.
//
// Shape. Grid (split, kv head, query row); each row's context is spread over all the splits at
// run time (whole 16-position tiles), so a short context in a graph recorded for a long capacity
// still keeps the splits busy. A block's 4 warps take the split's tiles in turn (warp w: tiles
// w, w + 4, ...), each warp with its own 3-stage ring in shared memory: lane l copies the K
// (l < 16) or V row of position l % 16 of a tile with one bulk copy onto the stage's mbarrier.
// No block barrier until the warps merge at the end.
//
// Arithmetic per tile (exact to F32 rounding, as the CPU over the same BF16 cache):
//  - scores: S = [Q_hi; Q_lo] K^T, one m16n8k16 BF16 mma per 16 dims and 8 positions, rows
//    0-7 the query heads' BF16 high parts and rows 8-15 their low parts (q - hi, rounded), so
//    a thread's c0 + c2 is its head's score to about 16 significant bits of q (K is exact
//    BF16); a fresh accumulator per 32 dims, added in F32 (a long chain of the tensor cores'
//    F32 accumulation drifts: cuda_attention_prefill.cu);
//  - output: O^T (16 dims x 8 heads) += V^T P^T, P split into BF16 hi and lo as two mmas. The
//    scores' accumulator layout is already P^T's B fragment (head = lane / 4, positions 2 *
//    (lane % 4) + {0, 1}), so P never leaves the registers. Each m-tile's product is a fresh
//    accumulator folded in as O = O * rescale + d.
// Up to 8 query heads per kv head (the mma's 8 columns), head_dim 128 or 256.
//
// Why: the CUDA-core split kernel (a lane per 4 dims, warp sums per position) is issue-bound at
// long contexts: 0.85 TB/s over the 27B's 2.1 GB of BF16 K/V at 32k.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kv.cuh"

namespace tokenmill::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kStages = 3;  // per warp
constexpr int kTile = 16;   // positions per warp step
constexpr int kRowPad = 8;  // BF16 padding per shared row: ldmatrix's 8 rows on distinct banks
constexpr int kHeads = 8;   // query heads per kv head (the mma's n)

template <int D>
struct SplitTcLayout {
  static constexpr int kRowBytes = (D + kRowPad) * 2;
  static constexpr int kHalfBytes = kTile * kRowBytes;  // K or V of one stage
  static constexpr int kStageBytes = 2 * kHalfBytes;
  static constexpr int kWarpBytes = kStages * kStageBytes;
  // + one mbarrier per stage per warp
  static constexpr size_t kSmem = static_cast<size_t>(kWarps) * kWarpBytes + 8 * kWarps * kStages;
  static_assert(kHeads * D * 4 <= kWarpBytes, "the warp's merge rows fit its ring");
};

__device__ __forceinline__ uint32_t bf16x2_bits(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}
// BF16 hi = bf16(a, b) and lo = bf16(a - hi, b - hi), element a in the low half.
__device__ __forceinline__ void split_bf16(float a, float b, uint32_t& hi, uint32_t& lo) {
  hi = bf16x2_bits(a, b);
  lo = bf16x2_bits(a - __uint_as_float(hi << 16), b - __uint_as_float(hi & 0xffff0000u));
}

template <int D>
__global__ void __launch_bounds__(kWarps * 32, 1) attention_split_tc_kernel(SplitArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using L = SplitTcLayout<D>;
  constexpr int kSteps = D / 16;  // k-steps of the scores, m-tiles of the output
  extern __shared__ __align__(16) uint8_t tc_smem[];
  __shared__ float wm[kWarps][kHeads], wl[kWarps][kHeads];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q4 = lane & 3;
  const int sp = blockIdx.x, kvh = blockIdx.y, t = blockIdx.z;
  const uint32_t ring =
      static_cast<uint32_t>(__cvta_generic_to_shared(tc_smem)) + warp * L::kWarpBytes;
  const uint32_t bars = static_cast<uint32_t>(__cvta_generic_to_shared(tc_smem)) +
                        kWarps * L::kWarpBytes + 8 * kStages * warp;
  if (lane == 0) {
    for (int s = 0; s < kStages; ++s) mbar_init(bars + 8 * s, 32);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncwarp();
  // The step's layout (positions, context lengths, block tables) was written before the kernel
  // this launch depends on started, so it is read before the wait.
  const int R = a.heads / a.kv.kv_heads;
  const int s = seq_of(a.seqs.cu_seqlens, a.seqs.n_seqs, t);
  const int64_t pos = s < 0 ? -1 : a.seqs.positions[t];
  const bool valid = s >= 0 && pos >= 0 && pos < a.pg.context_lens[s];
  // This split's positions [begin, end) of the row's pos + 1: whole tiles, spread evenly.
  const int64_t n = valid ? pos + 1 : 0;
  const int64_t per = ((n + kTile - 1) / kTile + a.splits - 1) / a.splits * kTile;
  const int64_t begin = sp * per;
  const int64_t end = begin + per < n ? begin + per : n;
  const int tiles = end > begin ? static_cast<int>((end - begin + kTile - 1) / kTile) : 0;
  const int mine = tiles > warp ? (tiles - warp + kWarps - 1) / kWarps : 0;

  // Lane l's copy: the K (l < 16) or V row of position l % 16 of the warp's i-th tile, clamped
  // to the split's last position (a real row: its score is masked, its P is 0, and no stale
  // shared memory reaches the product). A missing block copies nothing and poisons the split.
  const int64_t row = static_cast<int64_t>(a.kv.kv_heads) * D;
  const auto* cache = static_cast<const uint16_t*>(lane < 16 ? a.kv.k : a.kv.v);
  bool bad = false;
  // The rows of earlier steps (below the sequence's first position in this step) are in the
  // cache before the wait; this step's rows only after it (the attention front, the kernel
  // before, writes them). pass 0: every row; 1: earlier steps' rows; 2: this step's rows.
  const int64_t fresh = s < 0 ? 0 : a.seqs.positions[a.seqs.cu_seqlens[s]];
  auto issue = [&](int i, int stage, int pass) {
    int64_t p = begin + static_cast<int64_t>(warp + kWarps * i) * kTile + (lane & 15);
    if (p >= end) p = end - 1;
    if ((pass == 1 && p >= fresh) || (pass == 2 && p < fresh)) return;
    const int64_t cp = cache_pos(a.pg.block_tables, a.pg.max_blocks_per_seq, a.kv.block_size, s, p);
    const uint32_t bar = bars + 8 * stage;
    if (cp < 0) {
      bad = true;
      mbar_arrive(bar);
      return;
    }
    const uint32_t dst =
        ring + stage * L::kStageBytes + (lane >> 4) * L::kHalfBytes + (lane & 15) * L::kRowBytes;
    mbar_expect(bar, D * 2);
    bulk_copy_g2s(dst, cache + cp * row + static_cast<int64_t>(kvh) * D, D * 2, bar);
  };
  for (int i = 0; i < kStages && i < mine; ++i) issue(i, i, 1);
  pdl_begin();
  for (int i = 0; i < kStages && i < mine; ++i) issue(i, i, 2);
  // The output projection after this pass is started towards L2 while the DRAM is otherwise
  // idle (the pass is latency-bound on its copies).
  if (warp == 0 && a.next.count > 0) {
    l2_prefetch_spans(a.next, (int64_t{t} * gridDim.y + kvh) * gridDim.x + sp,
                      int64_t{gridDim.x} * gridDim.y * gridDim.z);
  }

  // Q's A fragments: row g the high part of head g, row g + 8 its low part, at dims 16 k +
  // 2 q4 + {0, 1} (registers 0, 1) and + 8 (registers 2, 3); zero for heads >= R.
  uint32_t qa[kSteps][4];
  {
    const bool on = valid && g < R;
    const float* qh = a.q + (static_cast<int64_t>(t) * a.heads + kvh * R + (on ? g : 0)) * D;
#pragma unroll
    for (int k = 0; k < kSteps; ++k) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float2 v = on ? *reinterpret_cast<const float2*>(qh + 16 * k + 8 * h + 2 * q4)
                            : make_float2(0.0f, 0.0f);
        split_bf16(v.x, v.y, qa[k][2 * h], qa[k][2 * h + 1]);
      }
    }
  }

  // Online softmax of head g (quad-uniform m and the quad's partial l), and O^T's fragments:
  // o[j] = (dims 16 j + g, heads 2 q4 + {0, 1}) in [0], [1] and dims + 8 in [2], [3].
  float m = -INFINITY, l = 0.0f;
  float o[kSteps][4];
#pragma unroll
  for (int j = 0; j < kSteps; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  // ldmatrix row addresses of lane l: K non-transposed (matrix l / 8 = 8 dims of 32), V
  // transposed (matrix l / 8: positions 8 * (l / 16), dims 8 * (l / 8 % 2) of an m-tile).
  const uint32_t k_lane = (lane & 7) * L::kRowBytes + (lane >> 3) * 16;
  const uint32_t v_lane =
      L::kHalfBytes + ((lane & 7) + 8 * (lane >> 4)) * L::kRowBytes + ((lane >> 3) & 1) * 16;
  int stage = 0;
  uint32_t phase = 0;
  for (int i = 0; i < mine; ++i) {
    const uint32_t st = ring + stage * L::kStageBytes;
    mbar_wait(bars + 8 * stage, phase);
    // Scores of the tile's two 8-position halves.
    float sc[2][4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sc[h][0] = sc[h][1] = sc[h][2] = sc[h][3] = 0.0f;
#pragma unroll
      for (int c = 0; c < D / 32; ++c) {
        uint32_t kb[4];
        ldmatrix_x4(kb, st + k_lane + h * 8 * L::kRowBytes + c * 64);
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        mma_bf16(d, qa[2 * c][0], qa[2 * c][1], qa[2 * c][2], qa[2 * c][3], kb[0], kb[1]);
        mma_bf16(d, qa[2 * c + 1][0], qa[2 * c + 1][1], qa[2 * c + 1][2], qa[2 * c + 1][3], kb[2],
                 kb[3]);
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[h][e] += d[e];
      }
    }
    // Head g's scores at positions 8 h + 2 q4 + e of the tile, masked past the split's end.
    const int64_t p0 = begin + static_cast<int64_t>(warp + kWarps * i) * kTile;
    float x[2][2], mx = -INFINITY;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool in = p0 + 8 * h + 2 * q4 + e < end;
        x[h][e] = in ? (sc[h][e] + sc[h][2 + e]) * a.scale : -INFINITY;
        mx = fmaxf(mx, x[h][e]);
      }
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mn = fmaxf(m, mx);  // finite: every tile has its first position
    const float f = expf(m - mn);   // 0 on the first tile
    m = mn;
    uint32_t phi[2], plo[2];
    float psum = 0.0f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float e0 = expf(x[h][0] - mn), e1 = expf(x[h][1] - mn);
      psum += e0 + e1;
      split_bf16(e0, e1, phi[h], plo[h]);
    }
    l = l * f + psum;
    // The rescale of the output's heads 2 q4 and 2 q4 + 1 (quads 2 q4 and 2 q4 + 1 hold them).
    const float fa = __shfl_sync(0xffffffffu, f, 8 * q4);
    const float fb = __shfl_sync(0xffffffffu, f, 8 * q4 + 4);
#pragma unroll
    for (int j = 0; j < kSteps; ++j) {
      uint32_t va[4];
      ldmatrix_x4_trans(va, st + v_lane + j * 32);
      float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      mma_bf16(d, va[0], va[1], va[2], va[3], plo[0], plo[1]);
      mma_bf16(d, va[0], va[1], va[2], va[3], phi[0], phi[1]);
      o[j][0] = fmaf(o[j][0], fa, d[0]);
      o[j][1] = fmaf(o[j][1], fb, d[1]);
      o[j][2] = fmaf(o[j][2], fa, d[2]);
      o[j][3] = fmaf(o[j][3], fb, d[3]);
    }
    __syncwarp();  // every lane's reads of this stage are done before it is refilled
    if (i + kStages < mine) issue(i + kStages, stage, 0);
    if (++stage == kStages) stage = 0, phase ^= 1u;
  }
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  bad = __any_sync(0xffffffffu, bad);

  // Merge the warps: each writes m, l and its O rows (heads x D floats) over its own ring, whose
  // copies have all completed.
  float* wo = reinterpret_cast<float*>(tc_smem + warp * L::kWarpBytes);
  if (q4 == 0) {
    wm[warp][g] = bad ? NAN : m;
    wl[warp][g] = l;
  }
#pragma unroll
  for (int j = 0; j < kSteps; ++j) {
    wo[(2 * q4) * D + 16 * j + g] = o[j][0];
    wo[(2 * q4 + 1) * D + 16 * j + g] = o[j][1];
    wo[(2 * q4) * D + 16 * j + g + 8] = o[j][2];
    wo[(2 * q4 + 1) * D + 16 * j + g + 8] = o[j][3];
  }
  __syncthreads();
  write_split_partials<kWarps>(
      [&](int w, int h) { return wm[w][h]; }, [&](int w, int h) { return wl[w][h]; },
      [&](int w, int h, int d) {
        return reinterpret_cast<const float*>(tc_smem + w * L::kWarpBytes)[h * D + d];
      },
      R, D, valid, a.ws, (static_cast<int64_t>(t) * a.heads + kvh * R) * a.splits + sp, a.splits);
#endif
}

}  // namespace

int launch_attention_split_tc(CUstream_st* st, const KVLayerView& kv, const KVPaging& pg,
                              const SeqLayout& seqs, const float* q, int heads, float scale,
                              int max_splits, float* ws, int sm_count, const L2Spans* next) {
  const int R = kv.kv_heads > 0 ? heads / kv.kv_heads : 0;
  if (kv.dtype != DType::BF16 || R < 1 || R > kHeads ||
      (kv.head_dim != 128 && kv.head_dim != 256) || max_splits < 1 || seqs.n_tokens < 1 ||
      sm_count < 1) {
    return 0;
  }
  // One block per multiprocessor (the rings take most of its shared memory): as many splits as
  // fill one wave, within the workspace's.
  const int64_t others = int64_t{kv.kv_heads} * seqs.n_tokens;
  const int splits =
      static_cast<int>(std::clamp<int64_t>(sm_count / others, 1, int64_t{max_splits}));
  const SplitArgs a{kv, pg, seqs, q, heads, scale, splits, 0, ws, next ? *next : L2Spans{}};
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(kv.kv_heads),
                  static_cast<unsigned>(seqs.n_tokens));
  auto run = [&](auto kernel, size_t smem) {
    TM_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(smem)));
    launch_pdl(kernel, grid, dim3(kWarps * 32), smem, st, a);
  };
  if (kv.head_dim == 256) {
    run(attention_split_tc_kernel<256>, SplitTcLayout<256>::kSmem);
  } else {
    run(attention_split_tc_kernel<128>, SplitTcLayout<128>::kSmem);
  }
  return splits;
}

}  // namespace tokenmill::cuda
