// 4-bit GEMV for 17..64 activation rows in BatchPrecision::kFast at groups of 64 (Hopper's
// wgmma, sm_90a): the register-fed form of cuda_gemv_q4g.cu's fast pass, with the same
// arithmetic (F16 weights, digit * scale + bias rounded once, times the activations' hi parts,
// accumulated in F32 across the groups by the wgmmas). The exact pass in the same form (the
// digits times hi and lo parts, scale and bias per group in F32, as cuda_gemv_q4g.cu) is written
// and compiled but routed only in a build with -DTM_Q4F_EXACT=1 until it has run on a GPU.
//
// Why: in cuda_gemv_q4g.cu every group of a block tile's weights passes through shared memory
// (a cp.async and an arrival per thread, then a shared load and the unpacking per warp) before a
// warpgroup-wide wgmma can use it. Measured by ablation (H200, S55): that staging alone, with no
// unpacking and no wgmmas, moves the weights at 35% of the read probe, and the wgmma then holds
// each warpgroup to its slowest warp's staging (the whole kernel: 22%).
//
// Here each warp loads its own 16-row tile's weights straight into registers: the tile layout
// (cuda_q4_pack.cu) gives lane (g, t) words [2t, 2t + 2) of rows g and g + 8 of a group, the
// wgmma A fragment's words, as one 16-byte load, and the rows' scales and biases as one 8-byte
// load (F32: 16). A ring of kDepth groups in registers keeps kDepth groups of loads in flight
// per warp. Only the activations go through shared memory: thread 0 stages each group's hi parts
// (N rows x 128 bytes, 128-byte swizzled, the layout the wgmma descriptor names) by the tensor
// copy engine into a ring of kStages stages, kAhead groups ahead, on the stage's full mbarrier;
// each warp releases a stage on its empty mbarrier once the wgmmas that read it are done. No warp
// waits for another warp's weights.
//
// Work division: as cuda_gemv_q4g.cu, a block is three warpgroups (12 warps) over a block tile of
// 192 rows, warp w the 16-row tile w. Stream-K's steps are rounds of kDepth groups: within a
// round the ring's index is a compile-time constant (the round is unrolled). A matrix whose
// groups are not a whole number of rounds pads its last round: the padded groups' weights and
// scales load as zeros, so their products are exact zeros, over a copy of the last real group's
// activations (finite values). No branch skips a wgmma: where one sat in a conditional block
// ptxas serialized every wgmma of the kernel (its warnings C7511 / C7512).
#include <cuda.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv_q4.cuh"
#include "backend/cuda/cuda_wgmma.cuh"

// Groups in flight per warp (the register ring; even: the A fragments alternate between two
// sets from group to group). 4 measured fastest (S56, the 27B's MLP shapes at 64 rows, H200 and
// H100): 8 (168 registers) 3-10% slower, 6 and 2 slower too. A deeper ring did not keep more
// loads usefully in flight: at 8, ncu put 37% of the long-scoreboard stalls on the round's first
// read of the ring (a warp has six scoreboards for its 16 loads in flight, so that read likely
// waited for later loads sharing its scoreboard), and at the register cap ptxas recomputed
// addresses every group (172 instructions a warp per group).
#ifndef TM_Q4F_DEPTH
#define TM_Q4F_DEPTH 4
#endif
// Groups whose activations are staged ahead of the one in use (the fast pass's 16 stages; the
// exact pass stages 4 of its 8 ahead).
#ifndef TM_Q4F_AHEAD
#define TM_Q4F_AHEAD 8
#endif
// Warpgroups a block (each warp one 16-row tile of the block tile).
#ifndef TM_Q4F_WARPGROUPS
#define TM_Q4F_WARPGROUPS 3
#endif

namespace tokenmill::cuda {
namespace {

constexpr int kGroup = 64;
constexpr int kWarps = 4 * TM_Q4F_WARPGROUPS;
constexpr int kThreads = 32 * kWarps;
constexpr int kBlockTiles = kWarps;  // 16-row tiles per block tile, one per warp
constexpr int kDepth = TM_Q4F_DEPTH;
static_assert(kDepth >= 2 && kDepth % 2 == 0, "an even register depth");
// Fewest groups per block (as the other 4-bit kernels): fixups read every block's partials.
constexpr int kMinGroups = 8;

// The activations' ring. kFast: a stage is the group's hi parts (N rows of 64 halves); exact:
// the hi and lo parts, then the rows' group sums (the bias term's), so half as many stages fit.
// kStages is a power of two (slot and phase by mask and shift); stages are staged kAhead groups
// ahead, so a stage is restaged kStages - kAhead groups after its use and warps may run that far
// apart.
template <int N, bool kFast>
struct Q4fSmem {
  static constexpr int kParts = kFast ? 1 : 2;
  static constexpr int kPartBytes = N * 128;
  static constexpr int kSumOff = kParts * kPartBytes;
  // 1024-byte aligned (the swizzle's atom)
  static constexpr int kStageBytes = (kSumOff + (kFast ? 0 : N * 4) + 1023) / 1024 * 1024;
  static constexpr int kStages = kFast ? 16 : 8;
  static constexpr int kAhead = kFast ? TM_Q4F_AHEAD : kStages / 2;
  static_assert((kStages & (kStages - 1)) == 0 && kAhead < kStages, "stage ring");
  // + alignment, + two mbarriers per stage (full, empty)
  static constexpr size_t kBytes = static_cast<size_t>(kStages) * kStageBytes + 1024 + 16 * kStages;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
constexpr int kKSteps = kGroup / 16;
constexpr int kTileGroupBytes = 512;  // one 16-row tile's group of weights: 32 lanes x 16 bytes

// Predicated loads past L1 (each weight byte is read once); zeros where !pred. Early-clobber
// outputs: they are written before the address is read.
__device__ __forceinline__ void ldg_pred(uint4& r, const void* p, bool pred) {
  asm volatile(
      "{\n.reg .pred q;\nsetp.ne.b32 q, %5, 0;\n"
      "mov.b32 %0, 0;\nmov.b32 %1, 0;\nmov.b32 %2, 0;\nmov.b32 %3, 0;\n"
      "@q ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"
      : "=&r"(r.x), "=&r"(r.y), "=&r"(r.z), "=&r"(r.w)
      : "l"(p), "r"(static_cast<int>(pred)));
}
__device__ __forceinline__ void ldg_pred(uint2& r, const void* p, bool pred) {
  asm volatile(
      "{\n.reg .pred q;\nsetp.ne.b32 q, %3, 0;\n"
      "mov.b32 %0, 0;\nmov.b32 %1, 0;\n"
      "@q ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];\n}\n"
      : "=&r"(r.x), "=&r"(r.y)
      : "l"(p), "r"(static_cast<int>(pred)));
}

// One 16-row tile's groups in a warp's registers: words (row g's two, then row g + 8's) and the
// rows' scale vector, kDepth groups.
template <int ST>
struct Q4fRing {
  uint4 w[kDepth];
  Q4ScaleVec<ST> s[kDepth];
};

// One block tile's part, rounds [r0, r1) (groups [k0, k_pad), of which those below k_end are
// real): the warp's weight loads, the staging of the activations (thread 0; exact: also threads
// below N, each its row's group sum), the wgmmas.
// acc[4j + 2h + e]: weight row g + 8h of the warp's tile, activation row 8j + 2t + e (the wgmma
// accumulator fragment), before the rows' power-of-two scales.
// Exact (BatchPrecision::kExact): the A fragments are the digits themselves, exact in F16, times
// the activations' hi and lo parts into a fresh accumulator each group, then scale * that + bias
// * the group's sum added in F32 (cuda_gemv_q4g.cu's arithmetic); the next group's fragments are
// unpacked while a group's wgmmas run.
template <int N, int ST, bool kFast>
struct Q4fPart {
  using Smem = Q4fSmem<N, kFast>;
  static constexpr int kStages = Smem::kStages;
  static constexpr int kAhead = Smem::kAhead;
  static constexpr int kStagers = kFast ? 1 : N;  // threads that stage a group
  static constexpr int kSB = ST == kF32 ? 4 : 2;  // bytes per scale
  uint32_t smem, bars;
  const CUtensorMap* tmap;
  int row0;                // the activations' first row
  const uint8_t *pw, *ps;  // this lane's words and scales at group 0
  int k0, k_end, k_pad;
  uint32_t uses0;  // the block's stage uses before this part (one phase of a stage each)
  // Exact: where the lo parts start (halves), this thread's row's group sums, the rows.
  int K, ncols;
  const float* sumsrc;

  __device__ __forceinline__ uint32_t full(int slot) const { return bars + 8 * slot; }
  __device__ __forceinline__ uint32_t empty(int slot) const { return bars + 8 * (kStages + slot); }

  __device__ Q4fPart(const DevMat& m, int64_t r0_rows, int valid, const Q4Act& act, int64_t cbase,
                     int ncols_, int64_t r0, int64_t r1, uint32_t smem_, const CUtensorMap* tmap_,
                     uint32_t uses)
      : smem(smem_),
        bars(smem_ + kStages * Smem::kStageBytes),
        tmap(tmap_),
        row0(static_cast<int>(cbase)),
        uses0(uses),
        K(static_cast<int>(act.ld / 2)),
        ncols(ncols_) {
    const int groups = static_cast<int>(m.cols / kGroup);
    const int r = static_cast<int>(threadIdx.x);
    sumsrc = act.sums + (cbase + (r < ncols ? r : 0)) * groups;
    k0 = static_cast<int>(r0) * kDepth;
    k_pad = static_cast<int>(r1) * kDepth;
    k_end = min(k_pad, groups);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
    // Tiles past the job's end reread its last tile (they write no output).
    const int tile = min(warp, max(valid - 1, 0));
    const int64_t first_block = ((r0_rows >> 4) + tile) * groups;
    pw = m.data + (first_block * 32 + lane) * 16;
    ps = m.scales + (first_block * 8 + g) * 4 * kSB;
  }

  // Group grp's words and scales into ring slot u (zeros past the real groups).
  __device__ __forceinline__ void load(Q4fRing<ST>& ring, int u, int grp) const {
    const bool real = grp < k_end;
    ldg_pred(ring.w[u], pw + static_cast<uint32_t>(grp) * kTileGroupBytes, real);
    ldg_pred(ring.s[u], ps + static_cast<uint32_t>(grp) * 32 * kSB, real);
  }

  // Threads below kStagers: group grp's activations (a padded group: the last real one's) into
  // stage use's slot, once every warp has released the slot's previous use; thread 0 by the copy
  // engine, exact: each thread its row's group sum by cp.async (rows past ncols: zeros).
  __device__ __forceinline__ void stage(uint32_t use, int grp) const {
    const int slot = static_cast<int>(use % kStages);
    mbar_wait(empty(slot), ((use / kStages) & 1) ^ 1);
    if (threadIdx.x == 0) {
      mbar_expect(full(slot), Smem::kParts * Smem::kPartBytes);
      const uint32_t base = smem + slot * Smem::kStageBytes;
      const int src = min(grp, k_end - 1);
      tma_load_2d(base, tmap, src * kGroup, row0, full(slot));
      if constexpr (!kFast) {
        tma_load_2d(base + Smem::kPartBytes, tmap, K + src * kGroup, row0, full(slot));
      }
    }
    if constexpr (!kFast) {
      const uint32_t base = smem + slot * Smem::kStageBytes;
      cp_async4(base + Smem::kSumOff + threadIdx.x * 4, sumsrc + min(grp, k_end - 1),
                static_cast<int>(threadIdx.x) < ncols ? 4 : 0);
      cp_async_arrive(full(slot));
    }
  }

  // The A fragments of ring slot u; kFast: the weights, digit * scale + bias in F16; exact: the
  // digits, with the rows' scales and biases in sb (sc[0], sc[1], bi[0], bi[1]).
  __device__ __forceinline__ static void unpack(const Q4fRing<ST>& ring, int u,
                                                uint32_t (&a)[kKSteps][4], float (&sb)[4]) {
    const uint32_t words[4] = {ring.w[u].x, ring.w[u].y, ring.w[u].z, ring.w[u].w};
    q4_fragments<2>(words, a);
    float sc[2], bi[2];
    q4_scales<ST>(ring.s[u], sc, bi);
    if constexpr (kFast) {
      q4_fast_weights(a, sc, bi);
    } else {
      sb[0] = sc[0], sb[1] = sc[1], sb[2] = bi[0], sb[3] = bi[1];
    }
  }

  // The group's wgmmas (A from a, B from stage `slot`) into acc, committed, not waited for;
  // acc starts from zero at the part's first group.
  __device__ __forceinline__ void mma(int slot, const uint32_t (&a)[kKSteps][4],
                                      float (&acc)[N / 2], bool first) const {
    // The descriptor's address field is the shared address / 16: a k-step (32 bytes) is + 2.
    const uint64_t d0 = gmma_desc(smem + slot * Smem::kStageBytes);
#pragma unroll
    for (int i = 0; i < N / 2; ++i) fence_operand(acc[i]);
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < kKSteps; ++s) {
      if constexpr (kFast) {
        wgmma<N>(acc, a[s], d0 + 2 * s, s > 0 || !first ? 1 : 0);
      } else {
        wgmma<N>(acc, a[s], d0 + 2 * s, s > 0 ? 1 : 0);
        wgmma<N>(acc, a[s], d0 + (Smem::kPartBytes >> 4) + 2 * s, 1);  // the lo parts
      }
    }
    wgmma_commit();
  }

  // Exact, after the group's wgmmas were waited for: scale * acc + bias * the rows' group sums
  // (stage `slot`'s) into tot.
  __device__ __forceinline__ void epilogue(int slot, float (&acc)[N / 2], const float (&sb)[4],
                                           float (&tot)[N / 2]) const {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) fence_operand(acc[i]);
    const float sc[2] = {sb[0], sb[1]}, bi[2] = {sb[2], sb[3]};
    q4_group_epilogue<N>(tot, acc, sc, bi,
                         smem + slot * Smem::kStageBytes + Smem::kSumOff + (threadIdx.x & 3) * 8);
  }

  // This warp is done with stage use's slot (its wgmmas waited for): lane 0 arrives on the empty
  // mbarrier where `pred`, predicated rather than branched (wgmmas are in flight).
  __device__ __forceinline__ void release(uint32_t use, bool pred) const {
    __syncwarp();
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.u32 p, %1, 0;\n@p mbarrier.arrive.shared::cta.b64 _, "
        "[%0];\n}" ::"r"(empty(static_cast<int>(use % kStages))),
        "r"(static_cast<uint32_t>(pred && (threadIdx.x & 31) == 0))
        : "memory");
  }

  // The first round's weights load before the wait for the kernel that prepares the
  // activations (launch_pdl); the activations only after it.
  __device__ __forceinline__ void start(Q4fRing<ST>& ring) const {
#pragma unroll
    for (int u = 0; u < kDepth; ++u) load(ring, u, k0 + u);
    pdl_begin();
    if (threadIdx.x < kStagers) {
      for (int s = 0; s < kAhead && k0 + s < k_pad; ++s) stage(uses0 + s, k0 + s);
    }
  }

  // tot: the part's sums (kFast: the wgmmas' accumulators themselves).
  __device__ __forceinline__ void run(float (&tot)[N / 2]) const {
    if constexpr (kFast) {
      run_fast(tot);
    } else {
      run_exact(tot);
    }
  }

  __device__ __forceinline__ void run_fast(float (&tot)[N / 2]) const {
    Q4fRing<ST> ring;
    start(ring);
    uint32_t a[2][kKSteps][4];
    float sb[4];  // unused (kFast folds the scales into the fragments)
    {
      for (int base = k0; base < k_pad; base += kDepth) {
#pragma unroll
        for (int u = 0; u < kDepth; ++u) {
          const int grp = base + u;
          const uint32_t use = uses0 + static_cast<uint32_t>(grp - k0);
          if (threadIdx.x == 0 && grp + kAhead < k_pad) stage(use + kAhead, grp + kAhead);
          // Registers only (ring slot u, then its next load): overlaps the activations' wait.
          unpack(ring, u, a[u & 1], sb);
          load(ring, u, grp + kDepth);
          mbar_wait(full(static_cast<int>(use % kStages)), (use / kStages) & 1);
          mma(static_cast<int>(use % kStages), a[u & 1], tot, grp == k0);
          // grp - 1's wgmmas (which read the other A set and grp - 1's stage) are done past this.
          wgmma_wait<1>();
#pragma unroll
          for (int s = 0; s < kKSteps; ++s) {
#pragma unroll
            for (int i = 0; i < 4; ++i) fence_word(a[(u + 1) & 1][s][i]);
          }
          release(use - 1, grp > k0);
        }
      }
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < N / 2; ++i) fence_operand(tot[i]);
      release(uses0 + static_cast<uint32_t>(k_pad - 1 - k0), true);
    }
  }

  __device__ __forceinline__ void run_exact(float (&tot)[N / 2]) const {
    Q4fRing<ST> ring;
    start(ring);
    uint32_t a[2][kKSteps][4];
    float sb[2][4];
    // acc needs no initial values (each group's first wgmma ignores them).
    float acc[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) tot[i] = 0.0f;
    unpack(ring, 0, a[0], sb[0]);
    load(ring, 0, k0 + kDepth);
    for (int base = k0; base < k_pad; base += kDepth) {
#pragma unroll
      for (int u = 0; u < kDepth; ++u) {
        const int grp = base + u, next = (u + 1) % kDepth;
        const uint32_t use = uses0 + static_cast<uint32_t>(grp - k0);
        const int slot = static_cast<int>(use % kStages);
        if (threadIdx.x < kStagers && grp + kAhead < k_pad) stage(use + kAhead, grp + kAhead);
        mbar_wait(full(slot), (use / kStages) & 1);
        mma(slot, a[u & 1], acc, false);
        // grp + 1's fragments (ring slot `next`, then its next load) while grp's wgmmas run
        // (past the part's end: zeros, never multiplied).
        unpack(ring, next, a[(u + 1) & 1], sb[(u + 1) & 1]);
        load(ring, next, grp + 1 + kDepth);
        wgmma_wait<0>();
#pragma unroll
        for (int s = 0; s < kKSteps; ++s) {
#pragma unroll
          for (int i = 0; i < 4; ++i) fence_word(a[u & 1][s][i]);  // read by the wgmmas until here
        }
        epilogue(slot, acc, sb[u & 1], tot);
        release(use, true);
      }
    }
  }
};
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// Stream-K over block tiles x rounds (each job's tiles padded to whole block tiles). Dynamic
// shared memory: Q4fSmem<N>::kBytes. tmap: the prepared activations as [rows, 2K] halves in
// boxes of 64 x N, 128-byte swizzled (q4_act_tensor_map).
template <int N, int ST, bool kFast>
__global__ void __launch_bounds__(kThreads, 1)
    q4f_gemv_kernel(GemvJobs jobs, Q4Act act, int n, StreamK sk,
                    const __grid_constant__ CUtensorMap tmap) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t q4f_smem[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(q4f_smem));
  const uint32_t smem = (raw + 1023) & ~1023u;
  const int64_t unit = blockIdx.x;
  if (unit >= sk.warps) return;  // the whole block
  const int warp = threadIdx.x >> 5;
  using Smem = Q4fSmem<N, kFast>;
  if (threadIdx.x == 0) {
    const uint32_t bars = smem + Smem::kStages * Smem::kStageBytes;
    for (int s = 0; s < Smem::kStages; ++s) {
      // Thread 0's arrival with the copy engine's bytes; exact: and each stager's cp.async.
      mbar_init(bars + 8 * s, kFast ? 1 : N + 1);
      mbar_init(bars + 8 * (Smem::kStages + s), kWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  uint32_t uses = 0;
  streamk_for_each(sk, unit, [&](int64_t btile, int64_t r0, int64_t r1) {
    const Q4Tile q =
        q4_jobs_tile<false>(jobs, btile * kBlockTiles, sk.tiles * kBlockTiles, n, nullptr);
    const int64_t valid64 = (q.m.rows + 15) / 16 - q.r0 / 16;
    const int valid = static_cast<int>(valid64 < kBlockTiles ? valid64 : kBlockTiles);
    float acc[N / 2];
    const Q4fPart<N, ST, kFast> part(q.m, q.r0, valid, act, q.cbase, q.ncols, r0, r1, smem, &tmap,
                                     uses);
    part.run(acc);
    uses += static_cast<uint32_t>(part.k_pad - part.k0);
    if (warp >= valid) return;  // a padding tile
    if (r0 > 0 || r1 < sk.steps) {
      if (!streamk_fixup(sk, unit, btile, r0 > 0 ? 0 : 1, acc, warp, kWarps)) return;
    }
    q4_store_tile<N>(q, acc, act.colscale, warp);
  });
#else
  __trap();  // launched only on sm_90 devices (GemvWorkspace::wgmma)
#endif
}

template <int N, int ST, bool kFast>
void launch_typed(cudaStream_t st, const GemvJobs& jobs, const Q4Act& act, int n,
                  int64_t block_tiles, const GemvWorkspace& ws) {
  const auto kernel = q4f_gemv_kernel<N, ST, kFast>;
  constexpr size_t smem = Q4fSmem<N, kFast>::kBytes;
  TM_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem)));
  const int64_t rounds = (jobs.m[0].cols / kGroup + kDepth - 1) / kDepth;
  StreamK sk = plan_streamk(reinterpret_cast<const void*>(kernel), kThreads, block_tiles, rounds,
                            32 * (N / 2), ws, (kMinGroups + kDepth - 1) / kDepth, kWarps, smem);
  const CUtensorMap map = q4_act_tensor_map(act, N, ws);
  launch_pdl(kernel, dim3(static_cast<unsigned>(sk.warps)), dim3(kThreads), smem, st, jobs, act, n,
             sk, map);
}

template <int N, bool kFast>
void launch_scale(cudaStream_t st, const GemvJobs& jobs, const Q4Act& act, int n,
                  int64_t block_tiles, const GemvWorkspace& ws) {
  with_scale_type(jobs.m[0].sdtype, [&](auto sd) {
    launch_typed<N, decltype(sd)::value, kFast>(st, jobs, act, n, block_tiles, ws);
  });
}

template <bool kFast>
void launch_rows(cudaStream_t st, const GemvJobs& jobs, const Q4Act& act, int n,
                 int64_t block_tiles, const GemvWorkspace& ws) {
  if (n <= 32) {
    launch_scale<32, kFast>(st, jobs, act, n, block_tiles, ws);
  } else {
    launch_scale<64, kFast>(st, jobs, act, n, block_tiles, ws);
  }
}

}  // namespace

void launch_q4f_gemv(cudaStream_t st, GemvJobs jobs, const Q4Act& act, int n,
                     const GemvWorkspace& ws) {
  TM_CUDA_REQUIRE(ws.wgmma && act.operands == Q4Operands::kF16Gmma && act.group == kGroup,
                  "q4 register-fed gemv: an sm_90 device and activations prepared in gmma order "
                  "at groups of 64");
  TM_CUDA_REQUIRE(jobs.count >= 1 && jobs.count <= kMaxGemvJobs,
                  "q4 register-fed gemv: 1..4 matrices");
  TM_CUDA_REQUIRE(n > 16 && n <= kQ4GemvMaxRows, "q4 register-fed gemv: 17..64 rows");
  jobs.shared_offset = 0;
  const int64_t block_tiles = q4_number_tiles(jobs, act, kBlockTiles) / kBlockTiles;
  if (ws.fast_gmma) {
    launch_rows<true>(st, jobs, act, n, block_tiles, ws);
  } else {
    launch_rows<false>(st, jobs, act, n, block_tiles, ws);
  }
  TM_CUDA_LAUNCHED();
}

}  // namespace tokenmill::cuda
