// Internal to backend/cuda (.cu files): stream-K work division for the decode GEMVs.
//
// Why: a decode GEMV is one wave of blocks or a little more, and a partial last wave runs at a
// fraction of the bandwidth while it takes as long as a full one (measured: a 17408x5120 bf16
// GEMV launched 1,088 blocks for 1,056 resident slots and lost a third of its time to the 32
// left over). So the launch has as many warps as fit on the device at once (or fewer, lined up
// with the tiles: plan_streamk), and the flattened work (tiles x k-steps) is cut into equal
// contiguous ranges, one per warp (or whole tiles a warp: StreamK::tiles_per_warp).
//
// A tile whose steps are split between warps is combined deterministically: each warp writes its
// partial to its own slot (slot 0 if its range started inside the tile, else slot 1), then bumps
// the tile's counter; the warp that arrives last adds the partials in warp order, writes the
// output and resets the counter to zero (ready for the next launch or graph replay). The sum
// order is fixed by the partition, never by timing. With long ranges (StreamK::peek) the warp
// holding a tile's first steps first reads the counter: if every other warp of the tile has
// counted, it is the last one and adds its own partial from registers in its place, with no
// store, fence or count of its own.
//
// A split tile's counter is the one of its first warp (the warp holding its first step): no two
// split tiles share a first warp (a warp holding the first steps of tiles t < t' holds all of t,
// which is then not split), so `warps` counters suffice however many tiles there are. (Indexed
// by tile, a 248,320-row LM head in 16-row tiles reached past the workspace's counters.)
//
// Local fixups (StreamK::local): in a tile-aligned launch whose tiles' warps all sit in one block
// (local divides the block's warps) or in a cluster of blocks holding whole tiles (lcm(local,
// the block's warps) warps: k = 3, three blocks of four warps, four tiles),
// the partials meet in shared memory instead (streamk_local_fixup): no global stores, fences,
// counters or L2 round trips between a tile's last warp and its output. H100, batch 1, against
// the global fixups in the same build: 27B q4g64 134.5 -> 136.9 tok/s (its input projections run
// 2 warps a tile in a block, the output and down projections 8 warps a tile in clusters of two
// blocks), 27B bf16 52.6 -> 53.4 (output and down projections, 2 warps a tile), 35B-A3B q4g64
// 434 -> 454 (output projections, and the experts' gate+up at 4 warps a tile).
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"

namespace tokenmill::cuda {

struct StreamK {
  int64_t tiles = 0;          // work tiles (a tile: the rows one warp computes together)
  int64_t steps = 0;          // k-steps per tile
  int64_t warps = 0;          // warps (or units of several warps) launched (<= tiles * steps)
  float* partials = nullptr;  // [warps][subs][2][slot_floats]
  int* counters = nullptr;    // [warps][subs], zero outside a launch
  int slot_floats = 0;
  // Each warp's range holds many steps: the warp that finishes a split tile last is usually the
  // one holding its first steps (at the end of its range), long after the others stored theirs.
  // That warp then reads the tile's counter before storing its own partial (streamk_fixup). The
  // tile's other warps reach it at the start of their ranges, early: they store and count.
  bool peek = false;

  // > 0: whole tiles instead of equal ranges, warp w taking tiles [w * k, (w + 1) * k) (the
  // last warp fewer): no tile is split.
  int64_t tiles_per_warp = 0;

  // > 0: local fixups (streamk_local_fixup), `local` warps a tile (warps == tiles * local, each
  // warp one part of one tile), in one block (cluster == 1) or in clusters of `cluster` blocks
  // holding whole tiles (cluster * the block's warps == lcm(local, the block's warps), launched
  // with that cluster size).
  int local = 0;
  int cluster = 1;

  __device__ int64_t total() const { return tiles * steps; }
  __device__ int64_t lo(int64_t w) const {
    return tiles_per_warp > 0 ? min(w * tiles_per_warp, tiles) * steps : w * total() / warps;
  }
  // The warp whose range holds flattened step p (the largest w with lo(w) <= p).
  __device__ int64_t warp_of(int64_t p) const {
    return tiles_per_warp > 0 ? p / steps / tiles_per_warp : ((p + 1) * warps - 1) / total();
  }
};

// Calls f(tile, k0, k1) for each part of a tile (steps [k0, k1)) in warp w's range, in order;
// f(tile, k0, k1, last) when f takes it, last true for the range's last part.
template <class F>
__device__ __forceinline__ void streamk_for_each(const StreamK& sk, int64_t w, F&& f) {
  const int64_t end = sk.lo(w + 1);
  for (int64_t p = sk.lo(w); p < end;) {
    const int64_t tile = p / sk.steps, k0 = p - tile * sk.steps;
    const int64_t k1 = min(sk.steps, end - tile * sk.steps);
    p = tile * sk.steps + k1;
    if constexpr (std::is_invocable_v<F, int64_t, int64_t, int64_t, bool>) {
      f(tile, k0, k1, p == end);
    } else {
      f(tile, k0, k1);
    }
  }
}

// A slot holds a warp's kCount floats per lane vector-interleaved: lane l's value i at
// ((i / V) * 32 + l) * V + i % V, V = 4, 2 or 1 floats as kCount allows. Each V-wide access of
// the warp then covers 32 * V contiguous floats. (Lane-major slots made each scalar access of
// the warp touch 32 lines: ncu put 37% of the 64-row wgmma GEMV's samples on writing and
// reading its 4 KB per warp of partials.)
template <int kCount>
struct FixupVec {
  static constexpr int V = kCount % 4 == 0 ? 4 : kCount % 2 == 0 ? 2 : 1;
  static_assert(kCount % V == 0, "whole vectors");

  __device__ __forceinline__ static void store(float* slot, int lane, const float (&v)[kCount]) {
#pragma unroll
    for (int c = 0; c < kCount / V; ++c) {
      float* p = slot + (c * 32 + lane) * V;
      if constexpr (V == 4) {
        *reinterpret_cast<float4*>(p) =
            make_float4(v[4 * c], v[4 * c + 1], v[4 * c + 2], v[4 * c + 3]);
      } else if constexpr (V == 2) {
        *reinterpret_cast<float2*>(p) = make_float2(v[2 * c], v[2 * c + 1]);
      } else {
        *p = v[c];
      }
    }
  }
  // Past L1 (other SMs wrote the slot).
  __device__ __forceinline__ static void load(const float* slot, int lane, float (&v)[kCount]) {
#pragma unroll
    for (int c = 0; c < kCount / V; ++c) {
      const float* p = slot + (c * 32 + lane) * V;
      if constexpr (V == 4) {
        const float4 q = __ldcg(reinterpret_cast<const float4*>(p));
        v[4 * c] = q.x, v[4 * c + 1] = q.y, v[4 * c + 2] = q.z, v[4 * c + 3] = q.w;
      } else if constexpr (V == 2) {
        const float2 q = __ldcg(reinterpret_cast<const float2*>(p));
        v[2 * c] = q.x, v[2 * c + 1] = q.y;
      } else {
        v[c] = __ldcg(p);
      }
    }
  }
};

// Called by all 32 lanes of the warp that computed steps [k0, k1) of tile t, a strict part of it,
// with its `vals` (this lane's share, kCount floats). A unit of work may be several warps (a
// block), each computing its own part `sub` of `subs` of the unit's tiles: each sub-unit then has
// its own partial slots and counters ([warps][subs] of each). Writes them to the warp's slot and
// returns true on the one warp that must now write the tile's output; `vals` then holds the lane's
// share of the complete sums, added in warp order.
//
// The last warp reads the other warps' partials in batches of independent loads: read one after
// another (one L2 round trip each), the 32 partials of a small MoE matrix split 32 ways took
// about 15 us, ten times the matrix's own reading.
//
// counted() runs on every warp once its count is in (what a caller does there waits for nothing
// and holds no registers through the partials' reads).
struct NoCounted {
  __device__ void operator()() const {}
};
template <int kCount, class Counted = NoCounted>
__device__ __forceinline__ bool streamk_fixup(const StreamK& sk, int64_t w, int64_t t, int slot,
                                              float (&vals)[kCount], int sub = 0, int subs = 1,
                                              Counted&& counted = NoCounted{}) {
  using Vec = FixupVec<kCount>;
  const int lane = threadIdx.x & 31;
  const int64_t w0 = sk.warp_of(t * sk.steps), w1 = sk.warp_of((t + 1) * sk.steps - 1);
  int* counter = sk.counters + w0 * subs + sub;
  // Peeking: when every other warp of the tile has counted, this one is last without storing,
  // fencing and counting its own partial (its values stay in registers, added in their place).
  bool own_in_regs = false;
  float own[kCount];
  if (sk.peek && slot == 1) {
    int seen = 0;
    if (lane == 0) {
      asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
    }
    own_in_regs = __shfl_sync(0xffffffffu, seen, 0) == static_cast<int>(w1 - w0);
  }
  if (own_in_regs) {
#pragma unroll
    for (int i = 0; i < kCount; ++i) own[i] = vals[i];
    counted();
  } else {
    Vec::store(sk.partials + ((w * subs + sub) * 2 + slot) * sk.slot_floats, lane, vals);
    __threadfence();
    __syncwarp();
    int last = 0;
    if (lane == 0) last = atomicAdd(counter, 1) == static_cast<int>(w1 - w0);
    last = __shfl_sync(0xffffffffu, last, 0);
    counted();
    if (!last) return false;
    __threadfence();
  }
  // Up to 8 floats of loads in flight per lane (more made the 4-bit GEMV spill).
  constexpr int kBatch = kCount <= 2 ? 8 : kCount <= 4 ? 4 : kCount <= 8 ? 2 : 1;
#pragma unroll
  for (int i = 0; i < kCount; ++i) vals[i] = 0.0f;
  for (int64_t base = w0; base <= w1; base += kBatch) {
    float got[kBatch][kCount];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int64_t ww = min(base + b, w1);  // past w1: a repeated load, not added
      // The slot warp ww stored to, without 64-bit divisions (dozens of instructions each, on
      // the launch's critical path): w0's range holds t's first step, so it started at or
      // before the tile (slot 1), and every later warp of the tile started inside it (slot 0).
      const int64_t slot = ww == w0 ? 1 : 0;
      if (own_in_regs && ww == w) {
#pragma unroll
        for (int i = 0; i < kCount; ++i) got[b][i] = own[i];
      } else {
        Vec::load(sk.partials + ((ww * subs + sub) * 2 + slot) * sk.slot_floats, lane, got[b]);
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (base + b > w1) break;
#pragma unroll
      for (int i = 0; i < kCount; ++i) vals[i] += got[b][i];
    }
  }
  if (lane == 0) *counter = 0;
  return true;
}

// A tile's partials in shared memory: [kCount][32] floats (lane-major per value:
// conflict-free), the slots of streamk_local_fixup.
template <int kCount>
struct LocalFixupSlots {
  float v[kCount * 32];
};

// One block's local fixup state. Launches with local fixups run blocks of four warps, so a
// block holds at most two first warps of cluster tiles (k = 3) and at most 15 incoming partials
// (k = 16 in clusters of four); plan_local_fixup checks the shape against both.
constexpr int kLocalFixupSlots = 16;
constexpr int kLocalFixupFirsts = 2;
template <int kCount>
struct LocalFixup {
  LocalFixupSlots<kCount> slots[kLocalFixupSlots];  // in a block: warp wl's; in a cluster: the
                                                    // block's first warps' incoming, k - 1 each
  uint64_t bars[kLocalFixupFirsts];                 // in a cluster: a first warp's incoming bytes
};

// First warps of cluster tiles (k warps a tile) in cluster block `rank` of `warps` warps: the
// multiples of k in [rank * warps, (rank + 1) * warps).
__host__ __device__ inline int local_fixup_firsts(int k, int warps, int rank) {
  return ((rank + 1) * warps + k - 1) / k - (rank * warps + k - 1) / k;
}

// Every thread of a launch with local fixups calls this before any warp's streamk_local_fixup,
// best before its dependent-launch wait (nothing here depends on the kernel before). In a
// cluster: each first warp's mbarrier, expecting its k - 1 partials, is initialized and the
// cluster told so (a relaxed arrive, waited for only by the warps that push).
template <int kCount>
__device__ __forceinline__ void streamk_local_fixup_begin(const StreamK& sk,
                                                          LocalFixup<kCount>& fx) {
  if (sk.local == 0 || sk.cluster == 1) return;
  if (threadIdx.x == 0) {
    const int warps = static_cast<int>(blockDim.x >> 5), k = sk.local;
    const int rank = static_cast<int>(cooperative_groups::this_cluster().block_rank());
    const int n = local_fixup_firsts(k, warps, rank);
    for (int o = 0; o < n; ++o) {
      const uint32_t bar = smem_addr(&fx.bars[o]);
      mbar_init(bar, 1);
      mbar_expect(bar, (k - 1) * kCount * 32 * 4);
    }
    fence_mbarrier_init();
  }
  __syncwarp();
  cluster_arrive_relaxed();
}

// The local form of streamk_fixup (StreamK::local > 0), called once by every warp of the launch
// with its part's `vals`. Returns true on the tile's first warp, whose vals then hold the complete
// sums added in warp order, as streamk_fixup adds them; false on the others. counted() as there.
// In a block: named barriers. In a cluster, the other warps push their partials into the first
// warp's block by asynchronous stores that count on its mbarrier, and return: no cluster barrier
// on the tile's path (a barrier's release waited for every earlier memory operation, and kept
// every block alive until the slowest), and the first warp reads its partials locally.
template <int kCount, class Counted = NoCounted>
__device__ __forceinline__ bool streamk_local_fixup(const StreamK& sk, float (&vals)[kCount],
                                                    LocalFixup<kCount>& fx,
                                                    Counted&& counted = NoCounted{}) {
  const int lane = threadIdx.x & 31, wl = threadIdx.x >> 5;
  const int k = sk.local;
  if (sk.cluster == 1) {
    const int first = wl - wl % k;
    // Named barrier per tile of the block (0 is __syncthreads'): its k warps only, so warps of
    // the block past the launch's end (whole tiles of them) take no part. Immediate ids 1 and 2
    // (blocks of 4 warps hold at most two split tiles): with an id in a register ptxas reserves
    // all 16 barriers, and the H200 then held 4 blocks a multiprocessor instead of 5.
    const unsigned count = 32 * k;
    const bool second = wl >= k;  // k = 2: warps 2 and 3 (k = 4: none)
    if (wl != first) {
#pragma unroll
      for (int i = 0; i < kCount; ++i) fx.slots[wl].v[i * 32 + lane] = vals[i];
      if (second) {
        asm volatile("bar.arrive 2, %0;" ::"r"(count) : "memory");
      } else {
        asm volatile("bar.arrive 1, %0;" ::"r"(count) : "memory");
      }
      counted();
      return false;
    }
    if (second) {
      asm volatile("bar.sync 2, %0;" ::"r"(count) : "memory");
    } else {
      asm volatile("bar.sync 1, %0;" ::"r"(count) : "memory");
    }
    counted();
#pragma unroll 4
    for (int j = 1; j < k; ++j) {
#pragma unroll
      for (int i = 0; i < kCount; ++i) vals[i] += fx.slots[wl + j].v[i * 32 + lane];
    }
    return true;
  }
  // A cluster holds whole tiles: its warp cw is part cw % k of one of them (k = 3: a cluster of
  // three blocks, four tiles, a tile's warps possibly in two blocks). First warp f sits in block
  // fb as its o-th first warp; its incoming slots are [o (k - 1), (o + 1) (k - 1)).
  const int warps = static_cast<int>(blockDim.x >> 5);
  const int cw = static_cast<int>(cooperative_groups::this_cluster().block_rank()) * warps + wl;
  const int f = cw - cw % k, fb = f / warps;
  const int o = f / k - (fb * warps + k - 1) / k;
  const uint32_t bar = smem_addr(&fx.bars[o]);
  if (cw != f) {
    cluster_wait();  // block fb's mbarriers are initialized (every block arrived in its begin)
    const uint32_t dst = cluster_addr(smem_addr(&fx.slots[o * (k - 1) + (cw - f - 1)].v[lane]), fb);
    const uint32_t rbar = cluster_addr(bar, fb);
#pragma unroll
    for (int i = 0; i < kCount; ++i) st_async_cluster(dst + i * 32 * 4, vals[i], rbar);
    counted();
    return false;
  }
  mbar_wait_cluster(bar, 0);
  counted();
  const LocalFixupSlots<kCount>* in = fx.slots + o * (k - 1);
#pragma unroll 4
  for (int j = 0; j < k - 1; ++j) {
#pragma unroll
    for (int i = 0; i < kCount; ++i) vals[i] += in[j].v[i * 32 + lane];
  }
  return true;
}

}  // namespace tokenmill::cuda
