// Decode GEMV (1..16 activation rows) for the common weight formats: bf16 and MLX affine 8-bit
// on CUDA cores (4-bit goes to the tensor-core kernels of cuda_gemv_q4*.cu). Each lane streams
// 16-byte chunks of a weight row (8 bf16 or 16 8-bit values) with streaming loads, two chunks
// in flight per row; a warp works on kRowsPerWarp rows at once so one load of an x chunk
// serves several rows (without that, re-reading x from L1 would cost more than the weights).
// Several matrices of the same input (q/k/v, gate/up, the GDN input projections) run in one
// launch. Accumulation is F32; affine rows use w = s*q + b as s*(q.x) + b*sum(x) per chunk.
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv.h"

namespace tokenmill::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kRowsPerWarp = 4;  // a tile: rows one warp computes together

__device__ __forceinline__ float load_scale(const DevMat& m, const uint8_t* p, int64_t i) {
  return load_sb(m.sdtype, p, i);
}

// Steps [k0, k1) of one tile (RPW rows of one job); a step is two 16-byte chunks per
// lane, 64 chunks per row. Returns the warp-reduced sums (every lane holds all of them).
// waited: false until this warp has passed the dependent-launch wait, which comes right after
// its first step's weight loads are issued (weights are constant; x comes from the kernel
// before).
template <int N, class C, int RPW>
__device__ __forceinline__ void fast_tile_dot(const DevMat& m, int64_t r0, const float* x,
                                              int64_t ldx, int n, int64_t k0, int64_t k1,
                                              float (&acc)[N][RPW], bool& waited) {
  const int lane = threadIdx.x & 31;
  const int64_t chunks = m.row_bytes / 16;
  constexpr int V = C::kValues;
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int r = 0; r < RPW; ++r) acc[i][r] = 0.0f;
  // All loads of a step are issued before any math (bytes in flight are what a bandwidth-bound
  // kernel lives on).
  for (int64_t step = k0; step < k1; ++step) {
    const int64_t c0 = step * 64 + lane;
    uint4 wq[2][RPW];
    [[maybe_unused]] float sc[2][RPW], bi[2][RPW];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t c = c0 + 32 * h < chunks ? c0 + 32 * h : c0 < chunks ? c0 : 0;
#pragma unroll
      for (int r = 0; r < RPW; ++r) {
        const int64_t row = r0 + r < m.rows ? r0 + r : r0;  // duplicate a valid row past the end
        wq[h][r] = __ldcs(reinterpret_cast<const uint4*>(m.data + row * m.row_bytes) + c);
        if constexpr (kAffine<C>) {
          const int64_t g = row * m.groups + c * V / m.group;
          sc[h][r] = load_scale(m, m.scales, g);
          bi[h][r] = load_scale(m, m.biases, g);
        }
      }
    }
    if (!waited) {
      pdl_begin();
      waited = true;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t c = c0 + 32 * h;
      if (c >= chunks) break;
#pragma unroll
      for (int i = 0; i < N; ++i) {
        if (i >= n) break;
        float xv[V];
        const float4* xp = reinterpret_cast<const float4*>(x + i * ldx + c * V);
#pragma unroll
        for (int q = 0; q < V / 4; ++q) {
          const float4 t = __ldg(xp + q);
          xv[4 * q] = t.x, xv[4 * q + 1] = t.y, xv[4 * q + 2] = t.z, xv[4 * q + 3] = t.w;
        }
        float xsum = 0.0f;
        if constexpr (kAffine<C>) {
#pragma unroll
          for (int q = 0; q < V; ++q) xsum += xv[q];
        }
#pragma unroll
        for (int r = 0; r < RPW; ++r) {
          float wv[V];
          C::decode(wq[h][r], wv);
          float d = 0.0f;
#pragma unroll
          for (int q = 0; q < V; ++q) d = fmaf(wv[q], xv[q], d);
          if constexpr (kAffine<C>) {
            acc[i][r] += sc[h][r] * d + bi[h][r] * xsum;
          } else {
            acc[i][r] += d;
          }
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if (i >= n) break;
#pragma unroll
    for (int r = 0; r < RPW; ++r) acc[i][r] = warp_sum(acc[i][r]);
  }
}

// Each warp takes an equal range of the flattened (tile, step) work (cuda_streamk.cuh). Lane l
// owns results 2l and 2l+1 of the tile's [N][RPW] sums for the stream-K fixup and the
// output.
// 8-bit chunks hold more live values: at bf16's block counts the 8-bit kernels spilled
// 140-444 bytes.
template <int N, class C, int RPW>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, kAffine<C> ? (N == 1   ? 4
                                                                     : N <= 4 ? 3
                                                                              : 2)
                                                                  : (N == 1   ? 6
                                                                     : N <= 4 ? 4
                                                                              : 3))
    gemv_fast_kernel(GemvJobs jobs, const float* __restrict__ x, int64_t ldx, int n, StreamK sk) {
  __shared__ LocalFixup<2> fixup;
  streamk_local_fixup_begin(sk, fixup);
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (w >= sk.warps) return;
  const int lane = threadIdx.x & 31;
  bool waited = false;  // the wait follows the first weight loads (fast_tile_dot)
  streamk_for_each(sk, w, [&](int64_t tile, int64_t k0, int64_t k1, bool last_part) {
    int j = 0;
    while (j + 1 < jobs.count && tile >= jobs.first_tile[j + 1]) ++j;
    const DevMat& m = jobs.m[j];
    const int64_t r0 = (tile - jobs.first_tile[j]) * RPW;
    float acc[N][RPW];
    fast_tile_dot<N, C, RPW>(m, r0, x, ldx, n, k0, k1, acc, waited);
    // The range's last part: the next launch's weights towards L2 (cuda_l2_prefetch.h), the
    // entry read now and the prefetch issued once the fixup's count is in (the read's latency
    // under the fixup's round trips, nothing held through the loop) or after the output.
    L2PrefetchPart next;
    if (last_part) next = l2_prefetch_part(jobs.next, w, sk.warps);
    float mine[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
      for (int r = 0; r < RPW; ++r) {
        const int e = i * RPW + r;
        if (e == 2 * lane) mine[0] = acc[i][r];
        if (e == 2 * lane + 1) mine[1] = acc[i][r];
      }
    if (k0 > 0 || k1 < sk.steps) {
      const auto counted = [&] {
        next.issue();
        next.len = 0;
      };
      if (sk.local > 0 ? !streamk_local_fixup(sk, mine, fixup, counted)
                       : !streamk_fixup(sk, w, tile, k0 > 0 ? 0 : 1, mine, 0, 1, counted)) {
        return;
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int e = 2 * lane + h, i = e / RPW;
      const int64_t r = r0 + e % RPW;
      if (i < n && r < m.rows) jobs.out[j][i * m.rows + r] = mine[h];
    }
    next.issue();
  });
}

// Rows per tile: kRowsPerWarp share each load of x; a small single-row GEMV (a MoE router:
// 256x2048 at 8 bits, 130 warps of 4-row tiles, one per SM) takes one row per warp instead, for
// four times the warps: the kernel is bound by each warp's instruction latency there (ncu: 7.8
// cycles per issue, 11.9 us for 0.5 MB).
template <int N, class C, int RPW = kRowsPerWarp>
void launch_n(cudaStream_t st, GemvJobs jobs, int64_t tiles, const float* x, int64_t ldx, int n,
              const GemvWorkspace& ws) {
  const int64_t steps = (jobs.m[0].row_bytes / 16 + 63) / 64;
  if constexpr (N == 1 && RPW == kRowsPerWarp) {
    if (tiles * steps < 4 * static_cast<int64_t>(ws.sm_count)) {
      int64_t single = 0;
      for (int j = 0; j < jobs.count; ++j) {
        jobs.first_tile[j] = single;
        single += jobs.m[j].rows;
      }
      jobs.first_tile[jobs.count] = single;
      launch_n<1, C, 1>(st, jobs, single, x, ldx, n, ws);
      return;
    }
  }
  const auto kernel = gemv_fast_kernel<N, C, RPW>;
  StreamK sk =
      plan_streamk(reinterpret_cast<const void*>(kernel), kWarpsPerBlock * 32, tiles, steps, 64, ws,
                   1, 1, 0, N <= 2 ? TileAlign::kWholeTiles : TileAlign::kNone);
  plan_local_fixup(sk, reinterpret_cast<const void*>(kernel), kWarpsPerBlock * 32, 0);
  launch_streamk(sk, kernel,
                 dim3(static_cast<unsigned>((sk.warps + kWarpsPerBlock - 1) / kWarpsPerBlock)),
                 dim3(kWarpsPerBlock * 32), 0, st, jobs, x, ldx, n, sk);
}

template <class C>
void launch_kind(cudaStream_t st, const GemvJobs& jobs, int64_t tiles, const float* x, int64_t ldx,
                 int n, const GemvWorkspace& ws) {
  if (n == 1) {
    launch_n<1, C>(st, jobs, tiles, x, ldx, n, ws);
  } else if (n <= 2) {
    launch_n<2, C>(st, jobs, tiles, x, ldx, n, ws);
  } else if (n <= 4) {
    launch_n<4, C>(st, jobs, tiles, x, ldx, n, ws);
  } else if (n <= 8) {
    launch_n<8, C>(st, jobs, tiles, x, ldx, n, ws);
  } else {
    launch_n<16, C>(st, jobs, tiles, x, ldx, n, ws);
  }
  TM_CUDA_LAUNCHED();
}

}  // namespace

GemvKind fast_gemv_kind(const DevMat& m) {
  if (m.bits == 0) {
    return m.dtype == kBF16 && m.cols % 8 == 0 && m.row_bytes % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(m.data) % 16 == 0
               ? GemvKind::kBf16
               : GemvKind::kNone;
  }
  if (m.bits == 4) return q4_mma_eligible(m) ? GemvKind::kQ4 : GemvKind::kNone;
  if (m.bits != 8 || m.row_bytes % 16 != 0 || reinterpret_cast<uintptr_t>(m.data) % 16 != 0) {
    return GemvKind::kNone;
  }
  return m.group % 16 == 0 ? GemvKind::kQ8 : GemvKind::kNone;
}

// Steps per stream-K warp from which split tiles are fixed up by peeking (StreamK::peek).
constexpr int64_t kPeekMinSteps = 10;
// Tile-aligned launches keep at least this share of the wave's warps (in percent).
constexpr int64_t kAlignMinPercent = 75;

StreamK plan_streamk(const void* kernel, int threads, int64_t tiles, int64_t steps, int slot_floats,
                     const GemvWorkspace& ws, int min_steps, int subs, size_t smem,
                     TileAlign align) {
  int per_sm = 0;
  TM_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  StreamK sk;
  sk.tiles = tiles;
  sk.steps = steps;
  const int64_t resident =
      static_cast<int64_t>(std::max(per_sm, 1)) * ws.sm_count * (threads / 32) / subs;
  // Wide partials (the 64-row 4-bit GEMV: 1,024 floats per slot) may cap the warps below one
  // full wave; the division stays exact, only occupancy drops.
  const int64_t by_partials =
      static_cast<int64_t>(ws.partial_floats / (2 * static_cast<size_t>(slot_floats) * subs));
  const int64_t by_min_steps = (tiles * steps + min_steps - 1) / min_steps;
  sk.warps =
      std::max<int64_t>(1, std::min({resident, by_min_steps, ws.max_warps / subs, by_partials}));
  sk.partials = ws.partials;
  sk.counters = ws.counters;
  sk.slot_floats = slot_floats;
  // Tile-aligned: with k = floor(warps / tiles) warps a tile, every range lies inside one tile
  // and ends on a tile boundary or on a split point, so no warp crosses from one tile into the
  // next. A crossing warp stores, fences and counts the first tile's partial in the middle of
  // its range (rarely the last, so it gains nothing by waiting) and starts the next tile's
  // stream empty. On the H200 the 27B's 320-tile projections crossed at 9% of their warps and
  // gate+up (2,176 tiles on a 2,640-warp wave) at 81%; aligned (2,560 and 2,176 warps),
  // batch 1 gained 3% though fewer warps ran. Only where measured to gain: launches of 1-2 rows
  // (applied to every launch, batches 4 and 64 lost 2%).
  // Whole tiles, where tiles outnumber warps: k = ceil(tiles / warps) tiles a warp and no tile
  // split (the 27B's bf16 gate+up, 8,704 four-row tiles, and LM head): 27B bf16 batch 1 +0.9%.
  // The 4-bit GEMV's LM head (15,520 tiles) did not gain, so it keeps the equal ranges.
  if (align != TileAlign::kNone && sk.warps > tiles) {
    const int64_t aligned = sk.warps / tiles * tiles;
    if (aligned * 100 >= sk.warps * kAlignMinPercent) sk.warps = aligned;
  } else if (align == TileAlign::kWholeTiles && sk.warps < tiles) {
    const int64_t per = (tiles + sk.warps - 1) / sk.warps, whole = (tiles + per - 1) / per;
    if (whole * 100 >= sk.warps * kAlignMinPercent) {
      sk.warps = whole;
      sk.tiles_per_warp = per;
    }
  }
  // Peeking (streamk_fixup) when ranges are long: on the H200 27B q4g64 batch 1 +0.9%, batch
  // 64 +1.5%, bf16 +0.8%. With the 35B-A3B's 8-9 steps a warp it cost 0.7%: a tile's warps then
  // finish together, and those that are not last pay the counter's read on top of their count.
  sk.peek = tiles * steps >= kPeekMinSteps * sk.warps;
  TM_CUDA_REQUIRE(static_cast<size_t>(sk.warps) * subs * 2 * slot_floats <= ws.partial_floats,
                  "gemv: stream-K partial workspace too small");
  return sk;
}

void plan_local_fixup(StreamK& sk, const void* kernel, int threads, size_t smem) {
  const int block_warps = threads / 32;
  if (sk.tiles_per_warp > 0 || sk.warps <= sk.tiles || sk.warps % sk.tiles != 0) return;
  const int64_t k = sk.warps / sk.tiles;
  if (k > 16) return;  // a cluster of at most 4 blocks (the first warp adds 15 partials)
  if (block_warps % k == 0 && block_warps / k <= 2) {  // streamk_local_fixup's barriers 1 and 2
    sk.local = static_cast<int>(k);
    sk.cluster = 1;
    sk.peek = false;
    return;
  }
  // A cluster of whole blocks holding whole tiles: lcm(k, block warps) warps (k = 3: three
  // blocks of four warps, four tiles), every cluster full.
  int64_t cluster_warps = k;
  while (cluster_warps % block_warps != 0) cluster_warps += k;
  const int cluster = static_cast<int>(cluster_warps / block_warps);
  if (cluster > 4 || sk.warps % cluster_warps != 0) return;
  for (int rank = 0; rank < cluster; ++rank) {  // the blocks' LocalFixup capacity
    const int firsts = local_fixup_firsts(static_cast<int>(k), block_warps, rank);
    if (firsts > kLocalFixupFirsts || firsts * (k - 1) > kLocalFixupSlots) return;
  }
  // A cluster launch must still be one wave: every cluster resident at once.
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(sk.warps / block_warps));
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  if (static_cast<int64_t>(clusters) * cluster * block_warps < sk.warps) return;
  sk.local = static_cast<int>(k);
  sk.cluster = cluster;
  sk.peek = false;
}

void launch_gemv_fast(cudaStream_t st, GemvKind kind, GemvJobs jobs, const float* x, int64_t ldx,
                      int n, const GemvWorkspace& ws) {
  TM_CUDA_REQUIRE(jobs.count >= 1 && jobs.count <= kMaxGemvJobs, "gemv: 1..4 matrices per call");
  TM_CUDA_REQUIRE(n >= 1 && n <= (kind == GemvKind::kQ4 ? kQ4GemvMaxRows : 16),
                  "gemv: 1..16 activation rows (4-bit: 1..64)");
  TM_CUDA_REQUIRE(reinterpret_cast<uintptr_t>(x) % 16 == 0 && ldx % 4 == 0,
                  "gemv: activations must be 16-byte aligned");
  if (kind == GemvKind::kQ4) {
    const Q4Act act = launch_q4_prepare(st, x, ldx, n, jobs.m[0].cols, jobs.m[0].group,
                                        q4_operands_for(n, false, jobs.m[0].group, ws), ws);
    launch_q4_gemv(st, jobs, act, n, Q4Slots{}, 0, ws);
    return;
  }
  int64_t tiles = 0;
  for (int j = 0; j < jobs.count; ++j) {
    TM_CUDA_REQUIRE(jobs.m[j].row_bytes == jobs.m[0].row_bytes, "gemv: matrices of one width");
    jobs.first_tile[j] = tiles;
    tiles += (jobs.m[j].rows + kRowsPerWarp - 1) / kRowsPerWarp;
  }
  jobs.first_tile[jobs.count] = tiles;
  switch (kind) {
    case GemvKind::kBf16:
      launch_kind<Bf16Chunk>(st, jobs, tiles, x, ldx, n, ws);
      break;
    case GemvKind::kQ8:
      launch_kind<Q8Chunk>(st, jobs, tiles, x, ldx, n, ws);
      break;
    default:
      TM_CUDA_REQUIRE(false, "gemv: no fast kernel for this weight format");
  }
}

}  // namespace tokenmill::cuda
