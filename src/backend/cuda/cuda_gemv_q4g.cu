// 4-bit GEMV for 17..64 activation rows (batched decode, speculative verify, grouped MoE prefill
// chunks) on Hopper's warpgroup tensor-core instructions (wgmma, sm_90a), groups of 64 or 128.
// The arithmetic is cuda_gemv_q4.cu's (the weights' nibbles exact in F16, activations hi + lo,
// scale and bias per group); the instructions that do it are fewer and asynchronous.
// BatchPrecision::kFast (not for MoE chunks) trades that for F16 weights times the activations'
// hi parts, accumulated across groups (Q4GmmaBlock); at groups of 64 that pass runs in
// cuda_gemv_q4f.cu instead (the weights straight into registers, no shared-memory staging).
//
// Why: the mma.sync kernel (cuda_gemv_q4w.cu) spent about 7 instructions per m16n8k16 mma (the
// per-group FP32 epilogue, staging, unpacking) at two warps per scheduler, so it read the
// weights at 6.5% of the bandwidth at 64 rows. One wgmma m64nNk16 does the work of 4 x N/8 such
// mmas for one issue, its B operand (the activations) comes straight from shared memory, and
// the hi and lo parts accumulate into one accumulator (half the epilogue).
//
// Work division: a block is three warpgroups (12 warps) over a block tile of 192 weight rows;
// warpgroup i owns rows [64i, 64i+64) and warp w of it the 16-row tile 4i+w, whose words it holds
// as the A operand in registers (the tile layout's lane order is the wgmma A fragment's). Stream-K
// divides block tiles x groups (cuda_streamk.cuh); split tiles are combined per warp. Each group
// is one pipeline stage in shared memory, filled kAhead groups ahead: the block tile's
// weights and scales and the rows' group sums by cp.async from all threads, the activations of
// all N rows (hi and lo parts, 128-byte swizzled K-major rows, the layout the wgmma descriptor
// names).
//
// At 64 rows there is no block barrier in the loop: each thread's cp.asyncs arrive on the stage's
// full mbarrier (with the copy engine's bytes), and each warp releases a stage on its empty
// mbarrier when done with it. Warps then wait only for their own data; a barrier per group held
// every warp to the slowest (ncu: the barrier was the largest stall). At 32 rows a barrier per
// group is cheaper (Q4GmmaBlock::kLockstep, also kept for groups of 128). Each warpgroup overlaps a
// group's wgmmas with the next group's stage wait and unpacking: two sets of A fragments, one
// accumulator set (three warpgroups, at most 168 registers a thread). The loop is
// instruction-bound, so its address arithmetic is kept out: power-of-two stage counts, descriptors
// as the stage's plus a constant, no branches while wgmmas run.
//
// The activations come prepared in "gmma order" (Q4Operands::kF16Gmma, cuda_gemv_q4.cu's
// prepare kernel): per group, k-step s (16 values) holds for each lane column t the values that
// lane t's A registers multiply, so a token's k-step is 32 contiguous bytes.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv_q4.cuh"
#include "backend/cuda/cuda_wgmma.cuh"

// 1: fast passes at groups of 64 take cuda_gemv_q4f.cu's register-fed kernel (0: this file's, for
// A/Bs against it).
#ifndef TM_Q4F
#define TM_Q4F 1
#endif
// 1: exact passes at groups of 64 take it too (not yet measured, so 0).
#ifndef TM_Q4F_EXACT
#define TM_Q4F_EXACT 0
#endif

namespace tokenmill::cuda {
namespace {

// Three warpgroups: each holds one accumulator set and two groups' A fragments (the loop
// overlaps one group's wgmmas with unpacking the next), at most 168 registers a thread.
constexpr int kWarpGroups = 3;
constexpr int kWarps = 4 * kWarpGroups;
constexpr int kThreads = 32 * kWarps;
constexpr int kBlockTiles = kWarps;  // 16-row tiles per block tile, one per warp
// Fewest groups per block (as the other 4-bit kernels): fixups read every block's partials.
constexpr int kMinSteps = 8;

// Shared memory of one stage (one group of the block tile), byte offsets; stages are 1024-byte
// aligned (the 128-byte swizzle repeats every 8 rows of 128 bytes).
template <int G, int N, int ST>
struct Q4GmmaStage {
  static constexpr int W = G / 32;       // words per lane and row in a group
  static constexpr int kAtoms = G / 64;  // 64-value swizzle atoms (128-byte rows) per group
  static constexpr int kSB = ST == kF32 ? 4 : 2;
  static constexpr int kTileBytes = 256 * W;  // one 16-row tile's group of weights
  static constexpr int kScaleBytes = 32 * kSB;
  static constexpr int kPartBytes = N * 128;  // one atom of one part (hi or lo) for N rows
  static constexpr int kWOff = 2 * kAtoms * kPartBytes;
  static constexpr int kSOff = kWOff + kBlockTiles * kTileBytes;
  static constexpr int kSumOff = kSOff + kBlockTiles * kScaleBytes;
  static constexpr int kBytes = (kSumOff + N * 4 + 1023) / 1024 * 1024;
  // A power of two (slot and phase arithmetic are masks and shifts); 184 KB of shared memory.
  static constexpr int kStages = G == 128 ? 4 : 8;
  static_assert((kStages & (kStages - 1)) == 0, "a power of two");
  // + alignment, + two mbarriers per stage (full, empty)
  static constexpr size_t kSmem = static_cast<size_t>(kStages) * kBytes + 1024 + 16 * kStages;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// One block tile's groups [k0, k1): staging (all threads) and the warpgroups' products.
// tot[4j + 2h + e]: weight row g + 8h of the warp's tile, activation row 8j + 2t + e (the wgmma
// accumulator fragment), summed over the groups, before the rows' power-of-two scales.
// kFast (BatchPrecision::kFast): the A fragments are the weights themselves (digit * scale +
// bias, rounded to F16 once) times the activations' hi parts alone, accumulated across the
// groups by the wgmmas: no lo pass, no group sums, no per-group epilogue or wait.
template <int G, int N, int ST, bool kFast>
struct Q4GmmaBlock {
  using S = Q4GmmaStage<G, N, ST>;
  static constexpr int kStages = S::kStages;
  // How the warps meet the stages. Free-running (64 rows): each thread's cp.asyncs arrive on the
  // stage's full mbarrier and each warp releases the stage on its empty mbarrier, so warps run
  // apart by up to kAhead groups and wait only for their own data (+3% at 64 sequences, H100).
  // Lockstep (32 rows, groups of 128): a block barrier per group, after which every warp is
  // done with the stage two groups back. At 32 rows a group's wgmmas are half as long, and there
  // the free-running form's 384 arrivals per stage cost more than the barrier saved (-2%); at
  // groups of 128 (4 stages) it is not measured.
  static constexpr bool kLockstep = N <= 32 || G != 64;
  // Groups staged ahead of the one being waited for: a stage is restaged kStages - kAhead
  // groups after its use (lockstep: its epilogue is done on every warp past the barrier).
  static constexpr int kAhead = kLockstep ? kStages - 2 : kStages / 2;
  static constexpr int kKSteps = G / 16;
  // Activation parts staged per group (hi, lo) and their bytes (the copy engine's per stage).
  static constexpr int kParts = kFast ? 1 : 2;
  static constexpr uint32_t kActBytes = kParts * S::kAtoms * S::kPartBytes;
  uint32_t smem;  // shared address of stage 0
  int k1, ncols, groups;
  // This thread's staging sources at group 0: activations, weight chunks (kWChunks a thread),
  // a scale chunk (threads below kSChunks), its row's group sums (threads below N).
  static constexpr int kWChunks = kBlockTiles * S::kTileBytes / 16 / kThreads;
  static constexpr int kSChunks = kBlockTiles * S::kScaleBytes / 16;
  int64_t K;
  const uint8_t* wsrc[kWChunks];
  const uint8_t* ssrc;
  const float* sumsrc;
  // The activations come by the tensor copy engine: its map, the block's first row, the stage
  // mbarriers and the block's stage uses before this tile (each use is one phase of its stage's
  // mbarriers). full(slot) completes when the stage has landed: thread 0 arrives with the copy
  // engine's bytes, and (free-running) every thread's cp.asyncs arrive. empty(slot), only
  // free-running, completes when every warp is done reading the stage (kWarps arrivals).
  const CUtensorMap* tmap;
  int row0;
  uint32_t bars, uses0;
  __device__ __forceinline__ uint32_t full(int slot) const { return bars + 8 * slot; }
  __device__ __forceinline__ uint32_t empty(int slot) const { return bars + 8 * (kStages + slot); }

  __device__ Q4GmmaBlock(const DevMat& m, int64_t r0, int valid, const Q4Act& act, int64_t cbase,
                         int ncols_, int end, uint32_t smem_, const CUtensorMap* tmap_,
                         uint32_t uses)
      : smem(smem_),
        k1(end),
        ncols(ncols_),
        tmap(tmap_),
        row0(static_cast<int>(cbase)),
        bars(smem_ + kStages * S::kBytes),
        uses0(uses) {
    groups = static_cast<int>(m.cols / G);
    K = act.ld / 2;
    // Chunk i of a stage's weights is 16 bytes i % (16W) of tile i / (16W)'s group block; tiles
    // past the job's end reread its last tile (they write no output).
    const int last = max(valid - 1, 0);
#pragma unroll
    for (int r = 0; r < kWChunks; ++r) {
      const int i = threadIdx.x + kThreads * r;
      const int tile = min(i / (S::kTileBytes / 16), last);
      wsrc[r] = m.data + ((r0 >> 4) + tile) * groups * static_cast<int64_t>(S::kTileBytes) +
                (i % (S::kTileBytes / 16)) * 16;
    }
    const int stile = min(static_cast<int>(threadIdx.x) / (S::kScaleBytes / 16), last);
    ssrc = m.scales + ((r0 >> 4) + stile) * groups * static_cast<int64_t>(S::kScaleBytes) +
           (threadIdx.x % (S::kScaleBytes / 16)) * 16;
    const int r = static_cast<int>(threadIdx.x);
    sumsrc = act.sums + (cbase + (r < ncols ? r : 0)) * groups;
  }

  // The weights and scales of group grp into stage use `use`'s slot (free-running: after the
  // slot's previous use, use - kStages, was released by every warp).
  __device__ __forceinline__ void stage_weights(uint32_t use, int grp) const {
    const int slot = static_cast<int>(use % kStages);
    if constexpr (!kLockstep) mbar_wait(empty(slot), ((use / kStages) & 1) ^ 1);
    const uint32_t base = smem + slot * S::kBytes;
    static_assert(kWChunks * kThreads == kBlockTiles * S::kTileBytes / 16, "whole chunks");
#pragma unroll
    for (int r = 0; r < kWChunks; ++r) {
      cp_async16(base + S::kWOff + (threadIdx.x + kThreads * r) * 16,
                 wsrc[r] + static_cast<int64_t>(grp) * S::kTileBytes, 16);
    }
    if (threadIdx.x < kSChunks) {
      cp_async16(base + S::kSOff + threadIdx.x * 16,
                 ssrc + static_cast<int64_t>(grp) * S::kScaleBytes, 16);
    }
  }

  // The activations (hi and lo parts, N rows; rows past the prepared ones read as zeros) of
  // group grp into stage `slot` by the tensor copy engine, and their group sums by cp.async;
  // then this thread's arrival on the stage's full mbarrier (lockstep: the caller commits the
  // stage's cp.async group, one group per stage use whether staged or not).
  __device__ __forceinline__ void stage_acts(int slot, int grp) const {
    const uint32_t base = smem + slot * S::kBytes;
    if (threadIdx.x == 0) {
      const uint32_t bar = full(slot);
      mbar_expect(bar, kActBytes);  // lockstep: the only arrival
#pragma unroll
      for (int pa = 0; pa < kParts * S::kAtoms; ++pa) {
        const int part = pa / S::kAtoms, atom = pa % S::kAtoms;
        tma_load_2d(base + pa * S::kPartBytes, tmap,
                    static_cast<int>(part * K) + grp * G + atom * 64, row0, bar);
      }
    }
    if (!kFast && threadIdx.x < N) {
      cp_async4(base + S::kSumOff + threadIdx.x * 4, sumsrc + grp,
                static_cast<int>(threadIdx.x) < ncols ? 4 : 0);
    }
    if constexpr (!kLockstep) cp_async_arrive(full(slot));
  }

  // The A fragments of this warp's tile for the group in stage `slot`.
  __device__ __forceinline__ void unpack(int slot, uint32_t (&a)[kKSteps][4]) const {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    uint32_t words[2 * S::W];  // row g's W words, then row g+8's
    const uint32_t wa =
        smem + slot * S::kBytes + S::kWOff + warp * S::kTileBytes + lane * (8 * S::W);
#pragma unroll
    for (int q = 0; q < S::W / 2; ++q) {
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(words[4 * q]), "=r"(words[4 * q + 1]), "=r"(words[4 * q + 2]),
                     "=r"(words[4 * q + 3])
                   : "r"(wa + 16 * q));
    }
    q4_fragments<S::W>(words, a);
    if constexpr (kFast) {
      float sc[2], bi[2];
      load_scales(slot, sc, bi);
      q4_fast_weights(a, sc, bi);
    }
  }

  // The scale vector at shared address sa (one 8-byte load, F32: 16 bytes).
  static __device__ __forceinline__ Q4ScaleVec<ST> scale_vec(uint32_t sa) {
    Q4ScaleVec<ST> sv;
    if constexpr (ST == kF32) {
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(sv.x), "=r"(sv.y), "=r"(sv.z), "=r"(sv.w)
                   : "r"(sa));
    } else {
      asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(sv.x), "=r"(sv.y) : "r"(sa));
    }
    return sv;
  }

  // This lane's rows' scales and biases (rows g and g+8 of the warp's tile) in stage `slot`.
  __device__ __forceinline__ void load_scales(int slot, float (&sc)[2], float (&bi)[2]) const {
    const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2;
    const uint32_t sa = smem + slot * S::kBytes + S::kSOff + warp * S::kScaleBytes + g * 4 * S::kSB;
    q4_scales<ST>(scale_vec(sa), sc, bi);
  }

  // The group's wgmmas (A from a, B from stage `slot`) into acc as one wgmma group, committed and
  // not waited for. a and acc stay untouched until it is waited for. Exact: acc starts from zero
  // every group; kFast: it starts from zero only at the tile's first group (`first`).
  __device__ __forceinline__ void mma(int slot, const uint32_t (&a)[kKSteps][4],
                                      float (&acc)[N / 2], bool first) const {
    // The descriptors' address field is the shared address / 16 (below 2^14, no carries), so a
    // k-step's descriptor is the stage's plus a constant.
    const uint64_t d0 = gmma_desc(smem + slot * S::kBytes);
#pragma unroll
    for (int i = 0; i < N / 2; ++i) fence_operand(acc[i]);
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < kKSteps; ++s) {
      const uint32_t at = (s / 4) * S::kPartBytes + (s % 4) * 32;
      if constexpr (kFast) {
        wgmma<N>(acc, a[s], d0 + (at >> 4), s > 0 || !first ? 1 : 0);
      } else {
        wgmma<N>(acc, a[s], d0 + (at >> 4), s > 0 ? 1 : 0);
        wgmma<N>(acc, a[s], d0 + ((at + S::kAtoms * S::kPartBytes) >> 4), 1);
      }
    }
    wgmma_commit();
  }

  // After its wgmmas were waited for: the group's finished products in acc (stage `slot`'s scales
  // and row sums) added into tot.
  __device__ __forceinline__ void epilogue(int slot, float (&acc)[N / 2],
                                           float (&tot)[N / 2]) const {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) fence_operand(acc[i]);
    const uint32_t base = smem + slot * S::kBytes;
    const uint32_t sa = base + S::kSOff + warp * S::kScaleBytes + g * 4 * S::kSB;
    float sc[2], bi[2];
    q4_scales<ST>(scale_vec(sa), sc, bi);
    // (A branch over the row blocks here, while the next group's wgmmas run, made ptxas
    // serialize the wgmmas.)
    q4_group_epilogue<N>(tot, acc, sc, bi, base + S::kSumOff + t * 8);
  }

  // Returns group grp's stage once it has landed, with group grp + kAhead staged. Lockstep: past
  // the block barrier, which also frees the stage of grp - 2 for grp + kAhead. Free-running:
  // grp + kAhead's stage after its empty mbarrier, then only grp's full mbarrier.
  __device__ __forceinline__ int advance(int k0, int grp) const {
    const uint32_t use = uses0 + static_cast<uint32_t>(grp - k0);
    if constexpr (kLockstep) {
      cp_async_wait<kAhead - 1>();
      __syncthreads();
      mbar_wait(full(static_cast<int>(use % kStages)), (use / kStages) & 1);
      if (grp + kAhead < k1) {
        stage_weights(use + kAhead, grp + kAhead);
        stage_acts(static_cast<int>((use + kAhead) % kStages), grp + kAhead);
      }
      cp_async_commit();
      return static_cast<int>(use % kStages);
    }
    if (grp + kAhead < k1) {
      stage_weights(use + kAhead, grp + kAhead);
      stage_acts(static_cast<int>((use + kAhead) % kStages), grp + kAhead);
    }
    mbar_wait(full(static_cast<int>(use % kStages)), (use / kStages) & 1);
    return static_cast<int>(use % kStages);
  }

  // This warp is done reading stage `slot` (its wgmmas waited for, its epilogue done).
  __device__ __forceinline__ void release(int slot) const {
    if constexpr (kLockstep) return;
    __syncwarp();
    if constexpr (kFast) {
      // Lane 0 arrives, predicated rather than branched: kFast releases with wgmmas in flight.
      asm volatile(
          "{\n.reg .pred p;\nsetp.eq.u32 p, %1, 0;\n@p mbarrier.arrive.shared::cta.b64 _, "
          "[%0];\n}" ::"r"(empty(slot)),
          "r"(threadIdx.x & 31)
          : "memory");
    } else if ((threadIdx.x & 31) == 0) {
      mbar_arrive(empty(slot));
    }
  }

  // Group grp (its A fragments in a, its stage waited for): its wgmmas run while the next
  // group's stage is waited for and its A fragments unpacked into a_next; then grp's epilogue.
  // The two A sets alternate between the groups: a warpgroup's tensor work overlaps its own
  // barrier, stage wait and unpacking, where one A set had to drain its wgmmas first.
  __device__ __forceinline__ void step(int k0, int grp, uint32_t (&a)[kKSteps][4],
                                       uint32_t (&a_next)[kKSteps][4], float (&acc)[N / 2],
                                       float (&tot)[N / 2]) const {
    const uint32_t use = uses0 + static_cast<uint32_t>(grp - k0);
    const int slot = static_cast<int>(use % kStages);
    if constexpr (kFast) {
      // acc is tot. grp's wgmmas stay in flight across the next group's staging and unpacking;
      // those of grp - 1 (which read a_next and grp - 1's stage) are done past the wait.
      mma(slot, a, acc, grp == k0);
      wgmma_wait<1>();
#pragma unroll
      for (int s = 0; s < kKSteps; ++s) {
#pragma unroll
        for (int i = 0; i < 4; ++i) fence_word(a_next[s][i]);
      }
      if (grp > k0) release(static_cast<int>((use - 1) % kStages));
      if (grp + 1 < k1) unpack(advance(k0, grp + 1), a_next);
      return;
    }
    mma(slot, a, acc, false);
    if (grp + 1 < k1) unpack(advance(k0, grp + 1), a_next);
    wgmma_wait<0>();
#pragma unroll
    for (int s = 0; s < kKSteps; ++s) {
#pragma unroll
      for (int i = 0; i < 4; ++i) fence_word(a[s][i]);  // read by the wgmmas until here
    }
    epilogue(slot, acc, tot);
    release(slot);
  }

  __device__ __forceinline__ void run(int k0, float (&tot)[N / 2]) const {
    // The accumulators need no initial values (each group's first wgmma ignores them, kFast's
    // the tile's first); zeroing them made the compiler copy them at the loop's back edge while
    // a wgmma was writing them. kFast accumulates in tot itself.
    float acc_own[N / 2];
    float(&acc)[N / 2] = kFast ? tot : acc_own;
    uint32_t a0[kKSteps][4], a1[kKSteps][4];
    if constexpr (!kFast) {
#pragma unroll
      for (int i = 0; i < N / 2; ++i) tot[i] = 0.0f;
    }
    // The first stages' weights load before the wait for the kernel that prepares the
    // activations; each stage's commit group then closes with its activations.
#pragma unroll
    for (int s = 0; s < kAhead; ++s) {
      if (k0 + s < k1) stage_weights(uses0 + s, k0 + s);
    }
    pdl_begin();
#pragma unroll
    for (int s = 0; s < kAhead; ++s) {
      if (k0 + s < k1) stage_acts(static_cast<int>((uses0 + s) % kStages), k0 + s);
      if constexpr (kLockstep) cp_async_commit();
    }
    unpack(advance(k0, k0), a0);
    int grp = k0;
    for (; grp + 1 < k1; grp += 2) {
      step(k0, grp, a0, a1, acc, tot);
      step(k0, grp + 1, a1, a0, acc, tot);
    }
    if (grp < k1) step(k0, grp, a0, a1, acc, tot);  // an odd number of groups
    if constexpr (kFast) {
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < N / 2; ++i) fence_operand(tot[i]);
      release(static_cast<int>((uses0 + static_cast<uint32_t>(k1 - 1 - k0)) % kStages));
    }
    // Every stage this tile staged was waited for; the block's next tile restages them
    // (free-running: after their empty mbarriers).
    if constexpr (kLockstep) cp_async_wait<0>();
    __syncthreads();
  }
};
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// Stream-K over block tiles (each job's tiles padded to whole block tiles); warp w of a block
// takes tile w of the block tile over the block's k range. kChunks: grouped MoE rows
// (launch_q4g_gemv_chunks), tiles_per_chunk padded tiles per chunk. Dynamic shared memory:
// Q4GmmaStage<G, N, ST>::kSmem. tmap: the prepared activations as [rows, 2K] halves in boxes of
// 64 x N, 128-byte swizzled.
template <int G, int N, int ST, bool kChunks, bool kFast>
__global__ void __launch_bounds__(kThreads, 1)
    q4g_gemv_kernel(GemvJobs jobs, Q4Act act, int n, StreamK sk, const int32_t* chunks,
                    int64_t tiles_per_chunk, const __grid_constant__ CUtensorMap tmap) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t q4g_smem[];
  using S = Q4GmmaStage<G, N, ST>;
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(q4g_smem));
  const uint32_t smem = (raw + 1023) & ~1023u;
  const int64_t unit = blockIdx.x;
  if (unit >= sk.warps) return;  // the whole block
  const int warp = threadIdx.x >> 5;
  if (threadIdx.x == 0) {
    const uint32_t bars = smem + S::kStages * S::kBytes;
    constexpr bool kLockstep = Q4GmmaBlock<G, N, ST, kFast>::kLockstep;
    for (int s = 0; s < S::kStages; ++s) {
      // Free-running: every thread's cp.asyncs and the copy engine's bytes; lockstep: the latter.
      mbar_init(bars + 8 * s, kLockstep ? 1 : kThreads + 1);
      if (!kLockstep) mbar_init(bars + 8 * (S::kStages + s), kWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  uint32_t uses = 0;
  streamk_for_each(sk, unit, [&](int64_t btile, int64_t k0, int64_t k1) {
    const Q4Tile q = q4_jobs_tile<kChunks>(
        jobs, btile * kBlockTiles, kChunks ? tiles_per_chunk : sk.tiles * kBlockTiles, n, chunks);
    const int64_t valid64 = (q.m.rows + 15) / 16 - q.r0 / 16;
    const int valid = static_cast<int>(valid64 < kBlockTiles ? valid64 : kBlockTiles);
    float tot[N / 2];
    Q4GmmaBlock<G, N, ST, kFast>(q.m, q.r0, valid, act, q.cbase, q.ncols, static_cast<int>(k1),
                                 smem, &tmap, uses)
        .run(static_cast<int>(k0), tot);
    uses += static_cast<uint32_t>(k1 - k0);
    if (warp >= valid) return;  // a padding tile
    if (k0 > 0 || k1 < sk.steps) {
      if (!streamk_fixup(sk, unit, btile, k0 > 0 ? 0 : 1, tot, warp, kWarps)) return;
    }
    q4_store_tile<N>(q, tot, act.colscale + (kChunks ? q.cbase : 0), warp);
  });
#else
  __trap();  // launched only on sm_90 devices (GemvWorkspace::wgmma)
#endif
}

template <int G, int N, int ST, bool kChunks, bool kFast>
void launch_typed(cudaStream_t st, const GemvJobs& jobs, const Q4Act& act, int n,
                  int64_t block_tiles, const GemvWorkspace& ws, const int32_t* chunks,
                  int64_t tiles_per_chunk) {
  const auto kernel = q4g_gemv_kernel<G, N, ST, kChunks, kFast>;
  constexpr size_t smem = Q4GmmaStage<G, N, ST>::kSmem;
  TM_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem)));
  StreamK sk = plan_streamk(reinterpret_cast<const void*>(kernel), kThreads, block_tiles,
                            jobs.m[0].cols / G, 32 * (N / 2), ws, kMinSteps, kWarps, smem);
  const CUtensorMap map = q4_act_tensor_map(act, N, ws);
  launch_pdl(kernel, dim3(static_cast<unsigned>(sk.warps)), dim3(kThreads), smem, st, jobs, act, n,
             sk, chunks, tiles_per_chunk, map);
}

template <int G, int N, bool kChunks, bool kFast>
void launch_scale(cudaStream_t st, const GemvJobs& jobs, const Q4Act& act, int n,
                  int64_t block_tiles, const GemvWorkspace& ws, const int32_t* chunks,
                  int64_t tiles_per_chunk) {
  with_scale_type(jobs.m[0].sdtype, [&](auto sd) {
    launch_typed<G, N, decltype(sd)::value, kChunks, kFast>(st, jobs, act, n, block_tiles, ws,
                                                            chunks, tiles_per_chunk);
  });
}

template <int N, bool kChunks, bool kFast>
void launch_group(cudaStream_t st, const GemvJobs& jobs, const Q4Act& act, int n,
                  int64_t block_tiles, const GemvWorkspace& ws, const int32_t* chunks,
                  int64_t tiles_per_chunk) {
  if (act.group == 64) {
    launch_scale<64, N, kChunks, kFast>(st, jobs, act, n, block_tiles, ws, chunks, tiles_per_chunk);
  } else {
    launch_scale<128, N, kChunks, kFast>(st, jobs, act, n, block_tiles, ws, chunks,
                                         tiles_per_chunk);
  }
}

void require_gmma(const GemvJobs& jobs, const Q4Act& act, const GemvWorkspace& ws) {
  TM_CUDA_REQUIRE(
      ws.wgmma && act.operands == Q4Operands::kF16Gmma && (act.group == 64 || act.group == 128),
      "q4 wgmma gemv: an sm_90 device and activations prepared in gmma order (groups "
      "64 and 128)");
  TM_CUDA_REQUIRE(jobs.count >= 1 && jobs.count <= kMaxGemvJobs, "q4 wgmma gemv: 1..4 matrices");
}

}  // namespace

// The prepared activations as a 2-D tensor of [rows, 2K] halves for the copy engine: boxes of
// 64 halves (128 bytes) x N rows, 128-byte swizzled, rows past the end read as zeros.
CUtensorMap q4_act_tensor_map(const Q4Act& act, int n_box, const GemvWorkspace& ws) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(act.ld), static_cast<cuuint64_t>(act.rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(act.ld) * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(n_box)};
  const cuuint32_t elem[2] = {1, 1};
  const auto encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ws.encode_tiled);
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, act.x, dims, strides, box,
                            elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TM_CUDA_REQUIRE(r == CUDA_SUCCESS, "q4 wgmma gemv: cuTensorMapEncodeTiled failed");
  return map;
}

bool q4_gmma_eligible(int group, const GemvWorkspace& ws) {
  return ws.wgmma && (group == 64 || group == 128);
}

void launch_q4g_gemv(cudaStream_t st, GemvJobs jobs, const Q4Act& act, int n,
                     const GemvWorkspace& ws) {
  require_gmma(jobs, act, ws);
  TM_CUDA_REQUIRE(n > 16 && n <= kQ4GemvMaxRows, "q4 wgmma gemv: 17..64 rows");
#if TM_Q4F
  if (act.group == 64 && (ws.fast_gmma || TM_Q4F_EXACT)) {
    launch_q4f_gemv(st, jobs, act, n, ws);  // the register-fed form (cuda_gemv_q4f.cu)
    return;
  }
#endif
  jobs.shared_offset = 0;
  const int64_t block_tiles = q4_number_tiles(jobs, act, kBlockTiles) / kBlockTiles;
  if (n <= 32) {
    if (ws.fast_gmma) {
      launch_group<32, false, true>(st, jobs, act, n, block_tiles, ws, nullptr, 0);
    } else {
      launch_group<32, false, false>(st, jobs, act, n, block_tiles, ws, nullptr, 0);
    }
  } else if (ws.fast_gmma) {
    launch_group<64, false, true>(st, jobs, act, n, block_tiles, ws, nullptr, 0);
  } else {
    launch_group<64, false, false>(st, jobs, act, n, block_tiles, ws, nullptr, 0);
  }
  TM_CUDA_LAUNCHED();
}

void launch_q4g_gemv_chunks(cudaStream_t st, GemvJobs jobs, const Q4Act& act, const int32_t* chunks,
                            int64_t n_chunks, const GemvWorkspace& ws) {
  require_gmma(jobs, act, ws);
  TM_CUDA_REQUIRE(n_chunks >= 1 && reinterpret_cast<uintptr_t>(chunks) % 16 == 0,
                  "q4 wgmma gemv chunks: at least one chunk, a 16-byte aligned list");
  jobs.shared_offset = 0;
  const int64_t tiles_per_chunk = q4_number_tiles(jobs, act, kBlockTiles);
  launch_group<64, true, false>(st, jobs, act, kQ4GemvMaxRows,
                                tiles_per_chunk / kBlockTiles * n_chunks, ws, chunks,
                                tiles_per_chunk);
  TM_CUDA_LAUNCHED();
}

}  // namespace tokenmill::cuda
