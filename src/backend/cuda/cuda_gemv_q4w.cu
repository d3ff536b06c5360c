// Weight-stationary 4-bit GEMV for 17..64 activation rows (batched decode, speculative verify,
// grouped MoE prefill chunks) where the wgmma kernel (cuda_gemv_q4g.cu) does not run: group 32,
// GPUs other than sm_90. The same arithmetic as cuda_gemv_q4.cu (mma.sync m16n8k16, F16
// operands, the weights' nibbles exact, activations hi + lo, scale and bias per group), with
// the work divided so each activation byte serves more weight bytes.
//
// Why: the one-tile-per-warp kernel read, for every 16-row weight tile, all n activation rows of
// each group (16 KB per 512 weight bytes at 64 rows), and each of its warps walked its own k
// range, so nearby warps shared nothing in L1: ncu showed it at 5.8% of the read bandwidth at
// 64 rows, waiting on activation loads and on one dependent mma chain per column block. Here:
// - a warp holds kTiles tiles and multiplies each activation fragment it loads by all of them
//   (kTiles times fewer activation loads per mma);
// - the four warps of a block take adjacent tiles over the same k range (stream-K divides block
//   tiles, not warp tiles) and the block stages each group's activations in shared memory one
//   group ahead (cp.async), read back with 128-bit loads at compile-time offsets;
// - column blocks go in batches of four with an accumulator each, so a warp has kTiles x 4
//   independent mma chains in flight instead of one.
// Measured (docs/PERFORMANCE.md, S9 notes): 5.8% -> 6.5% of the bandwidth at 64 rows, 27B batch
// 64 +7%. The activation stalls are gone; what bounds it now is about 7 instructions per mma
// (the FP32 epilogue per group, nibble unpacking, staging) at two warps per scheduler.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv_q4.cuh"

namespace tokenmill::cuda {
namespace {

constexpr int kWarps = 4;                     // per block; they share the block's k range
constexpr int kTiles = 2;                     // 16-row tiles per warp
constexpr int kBlockTiles = kWarps * kTiles;  // stream-K's unit
// Fewest groups per block: a small matrix split one group per block spends its time in fixups
// (each reads 2 KB of partials per warp from every block of the tile).
constexpr int kMinSteps = 8;

__device__ __forceinline__ uint4 lds128(const uint4* p) {
  uint4 v;
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(a));
  return v;
}

// One block's share of the prepared activations: a group's CB*4 rows, hi and lo parts
// ("segments" of G halves, row r's part p is segment 2r + p), and their group sums, in shared
// memory, two groups' buffers. A segment's G/8 16-byte chunks are followed by a pad chunk (none
// at group 32) so the 8 lanes of a quarter warp, reading chunks t*W + w of two segments, hit
// distinct banks (two-way at group 128). Rows at or past ncols are zeros.
template <int G, int CB>
struct Q4ActStage {
  static constexpr int kRows = CB * 4;
  static constexpr int kChunks = G / 8;  // 16-byte chunks per segment
  static constexpr int kStride = G == 32 ? 4 : kChunks + 1;
  static constexpr int kBufChunks = kRows * 2 * kStride;
  static constexpr size_t kBytes = 2 * (kBufChunks * 16 + kRows * sizeof(float));
};

// The weights of a warp's T consecutive tiles, groups [k0, k1), double-buffered like
// Q4TileStream, and the block's activations for each group staged in shared memory one group
// ahead (cp.async by all the block's threads). Tiles past the job's last one (the numbering pads
// each job to whole blocks) reread the last valid tile; a warp with none loads no weights but
// still stages and meets the block's barriers.
template <int G, int T, int CB, int ST>
struct Q4WarpStream {
  static constexpr int W = G / 32;
  static constexpr int kSB = ST == kF32 ? 4 : 2;
  static constexpr int kBlockBytes = 256 * W;
  using SVec = Q4ScaleVec<ST>;
  using Stage = Q4ActStage<G, CB>;
  struct Buf {
    uint32_t w[T][2 * W];
    SVec s[T];
  };
  const uint8_t *pw, *ps;
  uint32_t dw[T], ds[T];  // byte offsets of tile i's data and scales from tile 0's
  int k1;
  bool active;
  // Staging: the source of this block's rows, and how many rows are read.
  const __half* ax;
  const float* asums;
  int64_t ld, K;
  int groups, ncols, rows;
  uint4* sx;  // [2][kBufChunks]
  float* ss;  // [2][kRows]

  __device__ Q4WarpStream(const DevMat& m, int64_t r0, int end, int valid, const Q4Act& act,
                          int64_t cbase, int ncols_, void* smem)
      : k1(end), active(valid > 0), ncols(ncols_) {
    const int lane = threadIdx.x & 31, g = lane >> 2;
    groups = static_cast<int>(m.cols / G);
    const int64_t first_block = (r0 >> 4) * groups;
    pw = m.data + (first_block * 32 + lane) * (8 * W);
    ps = m.scales + (first_block * 8 + g) * 4 * kSB;
#pragma unroll
    for (int i = 0; i < T; ++i) {
      const uint32_t ti = static_cast<uint32_t>(max(min(i, valid - 1), 0));
      dw[i] = ti * static_cast<uint32_t>(groups * kBlockBytes);
      ds[i] = ti * static_cast<uint32_t>(groups * 32 * kSB);
    }
    ld = act.ld;
    K = act.ld / 2;
    ax = act.x + cbase * act.ld;
    asums = act.sums + cbase * groups;
    // Column blocks run in batches of 4 (Q4WideDot): rows up to the batch holding the last one.
    rows = min(Stage::kRows, (ncols + 15) / 16 * 16);
    sx = static_cast<uint4*>(smem);
    ss = reinterpret_cast<float*>(sx + 2 * Stage::kBufChunks);
  }

  __device__ __forceinline__ void load(Buf& b, int grp) const {
    if (!active || grp >= k1) return;
#pragma unroll
    for (int i = 0; i < T; ++i) {
      const uint8_t* p = pw + dw[i] + static_cast<uint32_t>(grp) * kBlockBytes;
      if constexpr (W == 1) {
        const uint2 v = __ldcs(reinterpret_cast<const uint2*>(p));
        b.w[i][0] = v.x, b.w[i][1] = v.y;
      } else {
#pragma unroll
        for (int q = 0; q < W / 2; ++q) {
          const uint4 v = __ldcs(reinterpret_cast<const uint4*>(p) + q);
          b.w[i][4 * q] = v.x, b.w[i][4 * q + 1] = v.y, b.w[i][4 * q + 2] = v.z,
                     b.w[i][4 * q + 3] = v.w;
        }
      }
      b.s[i] =
          __ldcs(reinterpret_cast<const SVec*>(ps + ds[i] + static_cast<uint32_t>(grp) * 32 * kSB));
    }
  }

  // All threads of the block: group grp's activations into buffer `buf` (one commit group, empty
  // past k1).
  __device__ __forceinline__ void stage(int buf, int grp) const {
    if (grp < k1) {
      // Chunk i = threadIdx.x + kThreads * k is chunk i % kChunks of segment i / kChunks: a
      // thread's chunk column is fixed and its segments step by kThreads / kChunks (powers of
      // two, so this is shifts and masks).
      constexpr int kThreads = kWarps * 32;
      constexpr int kIters = (Stage::kRows * 2 * Stage::kChunks + kThreads - 1) / kThreads;
      const int c = threadIdx.x % Stage::kChunks;
      const __half* src0 = ax + static_cast<int64_t>(grp) * G + c * 8;
      uint4* dst = sx + buf * Stage::kBufChunks + c;
#pragma unroll 1
      for (int k = 0; k < kIters; ++k) {
        const int seg = (threadIdx.x + kThreads * k) / Stage::kChunks;
        const int r = seg >> 1;
        if (seg < Stage::kRows * 2 && r < rows) {
          const bool live = r < ncols;
          cp_async16(smem_addr(dst + seg * Stage::kStride),
                     src0 + (live ? r * ld + (seg & 1) * K : 0), live ? 16 : 0);
        }
      }
      if (threadIdx.x < rows) {
        const int r = threadIdx.x;
        const bool live = r < ncols;
        cp_async4(smem_addr(ss + buf * Stage::kRows + r), asums + (live ? r : 0) * groups + grp,
                  live ? 4 : 0);
      }
    }
    cp_async_commit();
  }

  // compute(weights, group, activation buffer) for each group of [k0, k1). The first weights
  // load before the wait for the kernel before (it prepares the activations).
  template <class Compute>
  __device__ __forceinline__ void run(int k0, Compute&& compute) const {
    Buf b0, b1;
    load(b0, k0);
    pdl_begin();
    stage(0, k0);
    for (int base = k0; base < k1; base += 2) {
      load(b1, base + 1);
      stage(1, base + 1);
      cp_async_wait<1>();
      __syncthreads();
      if (active) compute(b0, base, 0);
      __syncthreads();  // buffer 0 is restaged next
      load(b0, base + 2);
      stage(0, base + 2);
      cp_async_wait<1>();
      __syncthreads();
      if (active && base + 1 < k1) compute(b1, base + 1, 1);
      __syncthreads();
    }
    cp_async_wait<0>();
  }
};

// d = A*B with a zero accumulator (no moves to clear one).
__device__ __forceinline__ void mma_f16_zero(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%10,%10,%10,%10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f));
}

// tot[i][cb][h]: weight row 16*i + g + 8*h of the warp's tiles, activation row 4*cb + t (lane
// g = lane/4, t = lane%4), scaled by 2^e of that row (colscale). The B operand of column block
// cb is 4 activation rows, hi and lo parts side by side (column 2i: row i's hi, 2i+1: its lo),
// exactly as in cuda_gemv_q4.cu, so the lane's C pair is hi + lo of its activation row.
template <int G, int T, int CB, int ST>
struct Q4WideDot {
  using Stream = Q4WarpStream<G, T, CB, ST>;
  using Stage = typename Stream::Stage;
  using Buf = typename Stream::Buf;
  static constexpr int W = Stream::W;
  // Column blocks per batch (T x CBB independent mma chains); two at group 128, whose four words
  // per lane double the unpacked weights' registers (four spilled there).
  static constexpr int CBB = CB < 4 ? CB : W >= 4 ? 2 : 4;
  Stream ws;
  int xlane, slane;  // this lane's first chunk (B column) and sum (C row) in a buffer
  int ncols;

  __device__ Q4WideDot(const Q4Tile& q, const Q4Act& act, int end, int valid, void* smem)
      : ws(q.m, q.r0, end, valid, act, q.cbase, q.ncols, smem) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    xlane = ((g >> 1) * 2 + (g & 1)) * Stage::kStride + t * W;
    slane = t;
    ncols = q.ncols;
  }

  __device__ __forceinline__ void compute(const Buf& b, int buf, float (&tot)[T][CB][2]) const {
    uint32_t ea[T][W][4], eb[T][W][4];
    float sc[T][2], bi[T][2];
#pragma unroll
    for (int i = 0; i < T; ++i) {
#pragma unroll
      for (int w = 0; w < W; ++w) {
        q4_unpack_word(b.w[i][w], ea[i][w]);
        q4_unpack_word(b.w[i][W + w], eb[i][w]);
      }
      q4_scales<ST>(b.s[i], sc[i], bi[i]);
    }
    const uint4* xs = ws.sx + buf * Stage::kBufChunks + xlane;
    const float* ss = ws.ss + buf * Stage::kRows + slane;
#pragma unroll
    for (int cb0 = 0; cb0 < CB; cb0 += CBB) {
      if (cb0 * 4 >= ncols) break;  // the same for the whole warp
      uint4 x[CBB][W];
      float X[CBB];
#pragma unroll
      for (int j = 0; j < CBB; ++j) {
        // Column block cb's rows 4cb.. are segments 8cb..: a compile-time offset.
#pragma unroll
        for (int w = 0; w < W; ++w) x[j][w] = lds128(xs + (cb0 + j) * 8 * Stage::kStride + w);
        X[j] = ss[(cb0 + j) * 4];
      }
      float d[T][CBB][4];
#pragma unroll
      for (int w = 0; w < W; ++w) {
#pragma unroll
        for (int j = 0; j < CBB; ++j)
#pragma unroll
          for (int i = 0; i < T; ++i) {
            if (w == 0) {
              mma_f16_zero(d[i][j], ea[i][w][0], eb[i][w][0], ea[i][w][1], eb[i][w][1], x[j][w].x,
                           x[j][w].y);
            } else {
              mma_f16(d[i][j], ea[i][w][0], eb[i][w][0], ea[i][w][1], eb[i][w][1], x[j][w].x,
                      x[j][w].y);
            }
          }
#pragma unroll
        for (int j = 0; j < CBB; ++j)
#pragma unroll
          for (int i = 0; i < T; ++i)
            mma_f16(d[i][j], ea[i][w][2], eb[i][w][2], ea[i][w][3], eb[i][w][3], x[j][w].z,
                    x[j][w].w);
      }
#pragma unroll
      for (int i = 0; i < T; ++i)
#pragma unroll
        for (int j = 0; j < CBB; ++j) {
          // Three FMAs per output (hi, lo, bias term), no separate adds.
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float& o = tot[i][cb0 + j][h];
            o = fmaf(sc[i][h], d[i][j][2 * h], o);
            o = fmaf(sc[i][h], d[i][j][2 * h + 1], o);
            o = fmaf(bi[i][h], X[j], o);
          }
        }
    }
  }

  __device__ __forceinline__ void run(int k0, float (&tot)[T][CB][2]) const {
#pragma unroll
    for (int i = 0; i < T; ++i)
#pragma unroll
      for (int cb = 0; cb < CB; ++cb) tot[i][cb][0] = tot[i][cb][1] = 0.0f;
    ws.run(k0, [&](const Buf& b, int, int buf) { compute(b, buf, tot); });
  }
};

// Stream-K over block tiles (kBlockTiles 16-row tiles, each job's tiles padded to whole block
// tiles); warp w of a block takes tiles [w*kTiles, w*kTiles + kTiles) of the block tile over the
// block's k range, and its split tiles are combined per warp (streamk_fixup's sub-units).
// kChunks: grouped MoE rows (launch_q4_gemv_chunks), tiles_per_chunk padded tiles per chunk.
// Dynamic shared memory: Q4ActStage<G, CB>::kBytes.
template <int G, int CB, int ST, bool kChunks>
__global__ void __launch_bounds__(kWarps * 32, 2)
    q4w_gemv_kernel(GemvJobs jobs, Q4Act act, int n, StreamK sk, const int32_t* chunks,
                    int64_t tiles_per_chunk) {
  extern __shared__ uint4 q4w_smem[];
  constexpr int T = kTiles;
  const int64_t unit = blockIdx.x;
  if (unit >= sk.warps) return;  // the whole block
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  streamk_for_each(sk, unit, [&](int64_t btile, int64_t k0, int64_t k1) {
    const Q4Tile q =
        q4_jobs_tile<kChunks>(jobs, btile * kBlockTiles + warp * T,
                              kChunks ? tiles_per_chunk : sk.tiles * kBlockTiles, n, chunks);
    // Padding tiles (no block computes them) still stage and meet the barriers.
    const int64_t valid64 = (q.m.rows + 15) / 16 - q.r0 / 16;
    const int valid = static_cast<int>(valid64 < 0 ? 0 : valid64 < T ? valid64 : T);
    float tot[T][CB][2];
    Q4WideDot<G, T, CB, ST>(q, act, static_cast<int>(k1), valid, q4w_smem)
        .run(static_cast<int>(k0), tot);
    if (valid == 0) return;
    if (k0 > 0 || k1 < sk.steps) {
      auto& flat = reinterpret_cast<float(&)[T * CB * 2]>(tot);
      if (!streamk_fixup(sk, unit, btile, k0 > 0 ? 0 : 1, flat, warp, kWarps)) return;
    }
#pragma unroll
    for (int cb = 0; cb < CB; ++cb) {
      const int c = cb * 4 + t;  // activation row
      if (c >= q.ncols) continue;
      const float scale = act.colscale[(kChunks ? q.cbase : 0) + c];
#pragma unroll
      for (int i = 0; i < T; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t r = q.r0 + 16 * i + g + 8 * h;
          if (r < q.m.rows) q.out[c * q.m.rows + r] = tot[i][cb][h] * scale;
        }
    }
  });
}

template <int G, int CB, int ST, bool kChunks>
void launch_typed(cudaStream_t st, const GemvJobs& jobs, const Q4Act& act, int n,
                  int64_t block_tiles, const GemvWorkspace& ws, const int32_t* chunks,
                  int64_t tiles_per_chunk) {
  const auto kernel = q4w_gemv_kernel<G, CB, ST, kChunks>;
  constexpr size_t smem = Q4ActStage<G, CB>::kBytes;
  if constexpr (smem > 48 * 1024) {
    TM_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(smem)));
  }
  const StreamK sk =
      plan_streamk(reinterpret_cast<const void*>(kernel), kWarps * 32, block_tiles,
                   jobs.m[0].cols / G, 32 * kTiles * CB * 2, ws, kMinSteps, kWarps, smem);
  launch_pdl(kernel, dim3(static_cast<unsigned>(sk.warps)), dim3(kWarps * 32), smem, st, jobs, act,
             n, sk, chunks, tiles_per_chunk);
}

template <int G, int CB, bool kChunks>
void launch_scale(cudaStream_t st, const GemvJobs& jobs, const Q4Act& act, int n,
                  int64_t block_tiles, const GemvWorkspace& ws, const int32_t* chunks,
                  int64_t tiles_per_chunk) {
  with_scale_type(jobs.m[0].sdtype, [&](auto sd) {
    launch_typed<G, CB, decltype(sd)::value, kChunks>(st, jobs, act, n, block_tiles, ws, chunks,
                                                      tiles_per_chunk);
  });
}

template <int CB, bool kChunks>
void launch_cb(cudaStream_t st, const GemvJobs& jobs, const Q4Act& act, int n, int64_t block_tiles,
               const GemvWorkspace& ws, const int32_t* chunks, int64_t tiles_per_chunk) {
  switch (act.group) {
    case 32:
      launch_scale<32, CB, kChunks>(st, jobs, act, n, block_tiles, ws, chunks, tiles_per_chunk);
      break;
    case 64:
      launch_scale<64, CB, kChunks>(st, jobs, act, n, block_tiles, ws, chunks, tiles_per_chunk);
      break;
    default:
      launch_scale<128, CB, kChunks>(st, jobs, act, n, block_tiles, ws, chunks, tiles_per_chunk);
  }
}

}  // namespace

void launch_q4w_gemv(cudaStream_t st, GemvJobs jobs, const Q4Act& act, int n,
                     const GemvWorkspace& ws) {
  TM_CUDA_REQUIRE(jobs.count >= 1 && jobs.count <= kMaxGemvJobs && n > 16 && n <= kQ4GemvMaxRows &&
                      act.operands == Q4Operands::kF16,
                  "q4 wide gemv: 1..4 matrices, 17..64 rows of F16 operands");
  jobs.shared_offset = 0;
  const int64_t block_tiles = q4_number_tiles(jobs, act, kBlockTiles) / kBlockTiles;
  if (n <= 32) {
    launch_cb<8, false>(st, jobs, act, n, block_tiles, ws, nullptr, 0);
  } else {
    launch_cb<kQ4WideCB, false>(st, jobs, act, n, block_tiles, ws, nullptr, 0);
  }
  TM_CUDA_LAUNCHED();
}

void launch_q4_gemv_chunks(cudaStream_t st, GemvJobs jobs, const Q4Act& act, const int32_t* chunks,
                           int64_t n_chunks, const GemvWorkspace& ws) {
  if (act.operands == Q4Operands::kF16Gmma) {
    launch_q4g_gemv_chunks(st, jobs, act, chunks, n_chunks, ws);
    return;
  }
  TM_CUDA_REQUIRE(jobs.count >= 1 && jobs.count <= kMaxGemvJobs && n_chunks >= 1,
                  "q4 gemv chunks: 1..4 matrices and at least one chunk");
  TM_CUDA_REQUIRE(act.operands == Q4Operands::kF16 && reinterpret_cast<uintptr_t>(chunks) % 16 == 0,
                  "q4 gemv chunks: F16 operands and a 16-byte aligned chunk list");
  jobs.shared_offset = 0;
  const int64_t tiles_per_chunk = q4_number_tiles(jobs, act, kBlockTiles);
  launch_cb<kQ4WideCB, true>(st, jobs, act, kQ4GemvMaxRows,
                             tiles_per_chunk / kBlockTiles * n_chunks, ws, chunks, tiles_per_chunk);
  TM_CUDA_LAUNCHED();
}

}  // namespace tokenmill::cuda
