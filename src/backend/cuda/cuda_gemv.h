// Internal to backend/cuda (.cu files): the fast decode GEMVs of cuda_gemv.cu (bf16 and 8-bit on
// CUDA cores) and cuda_gemv_q4.cu / cuda_gemv_q4d.cu (4-bit on tensor cores), all divided stream-K
// style (cuda_streamk.cuh).
#pragma once

#include <type_traits>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_l2_prefetch.h"
#include "backend/cuda/cuda_streamk.cuh"

namespace tokenmill::cuda {

enum class GemvKind { kNone, kBf16, kQ4, kQ8 };

constexpr int kMaxGemvJobs = 4;

// Up to four matrices sharing one input; out[j] is [n, m[j].rows]. first_tile is filled by the
// launchers. MoE slots (Q4Slots) may hold a shared expert: m[j + shared_offset] is then job j's
// shared-expert matrix (same shape and format), run by each token's last slot.
struct GemvJobs {
  DevMat m[kMaxGemvJobs];
  float* out[kMaxGemvJobs] = {};
  int64_t first_tile[kMaxGemvJobs + 1] = {};
  int count = 0;
  int shared_offset = 0;
  const L2Prefetch* next = nullptr;  // the next launch's weights (cuda_l2_prefetch.h), or none
};

// Lane r < count holds its part of region r of the next launch's weights: the first `share` of
// the part (1/parts of the region); issue() asks L2 for it, fire and forget.
struct L2PrefetchPart {
  const char* p = nullptr;
  uint32_t len = 0;
  __device__ __forceinline__ void issue() const {
    if (len >= 16) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(len));
  }
};
__device__ __forceinline__ L2PrefetchPart l2_prefetch_part(const L2Prefetch* pf, int64_t part,
                                                           int64_t parts) {
  L2PrefetchPart r;
  const int lane = threadIdx.x & 31;
  if (pf == nullptr || lane >= kL2PrefetchRegions) return r;
  const char* base = static_cast<const char*>(pf->ptr[lane]);
  const uint64_t bytes = pf->bytes[lane];
  const float share = pf->share;
  if (lane >= pf->count) return r;
  const uint64_t chunk = bytes / static_cast<uint64_t>(parts);
  const uint64_t start = (static_cast<uint64_t>(part) * chunk) & ~uint64_t{15};
  uint64_t len = static_cast<uint64_t>(static_cast<float>(chunk) * share) & ~uint64_t{15};
  len = min(len, bytes - start) & ~uint64_t{15};
  r.p = base + start;
  r.len = static_cast<uint32_t>(min(len, uint64_t{1} << 30));
  return r;
}

// The router's top-k made by the slot launch itself (moe_block's front leaves it there: one
// dependent step fewer than picking in the front's last block). After its dependent-launch wait
// warp t of every block picks token t's k experts from `logits` (topk_softmax_warp_regs: up to
// 256 experts, k <= 32, a warp per token) into shared memory, the slots read their ids there,
// block 0 writes them and their weights (for the launches after) and the blocks share
// x += y (the residual the front's last block added before).
struct Q4Picks {
  const float* logits = nullptr;  // [tokens, experts]; nullptr: the ids come made
  int experts = 0;
  int tokens = 0;  // <= kQ4PickMaxTokens
  bool renormalize = false;
  int32_t* ids = nullptr;    // [tokens, k]
  float* weights = nullptr;  // [tokens, k]
  float* x = nullptr;        // x += y over tokens * hidden floats (y null: nothing to add)
  const float* y = nullptr;
  int64_t resid_floats = 0;
};
constexpr int kQ4PickMaxTokens = 4;  // a warp each in the slot kernel's blocks of four
constexpr int kQ4PickMaxK = 32;
constexpr int kQ4PickMaxExperts = 256;

// MoE slots of the 4-bit GEMVs: slot s of token t = s / per_token runs expert
// ids[t * k + s % per_token], or the shared expert when s % per_token == k, on prepared
// activation row s / x_div; its output is row s of out[j].
struct Q4Slots {
  const int32_t* ids = nullptr;  // [tokens, k]; nullptr: plain rows, no slots
  int k = 1;
  int per_token = 1;  // k, or k + 1 with a shared expert
  int64_t x_div = 1;
  // The ids were written two or more kernels back (not by the kernel just before this launch),
  // so the launch may read them, and load its weights, before its dependent-launch wait.
  bool ids_ready = false;
  // picks.logits set: the launch makes the ids (ids is then picks.ids, written, not read).
  Q4Picks picks;
};

// 16 bytes of bf16 or 8-bit weights -> F32 values (the CUDA-core GEMVs and the MoE router).
struct Bf16Chunk {
  static constexpr int kValues = 8;
  __device__ static void decode(const uint4& u, float* v) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[2 * k] = __uint_as_float(w[k] << 16);
      v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    }
  }
};

// Small unsigned integer q as a float without a conversion instruction: the bytes
// [q, 0, 0, 0x4B] are the float 2^23 + q.
__device__ __forceinline__ float byte_to_float(uint32_t word, uint32_t selector) {
  return __uint_as_float(__byte_perm(word, 0x4B000000u, selector)) - 8388608.0f;
}

struct Q8Chunk {
  static constexpr int kValues = 16;
  __device__ static void decode(const uint4& u, float* v) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
#pragma unroll
      for (int b = 0; b < 4; ++b) v[4 * k + b] = byte_to_float(w[k], 0x7540u + b);
    }
  }
};

template <class C>
constexpr bool kAffine = !std::is_same_v<C, Bf16Chunk>;  // scales and biases per group

// Warps to launch for `kernel` (one wave: what fits on the device at once, and no more than gives
// each warp min_steps k-steps) and the stream-K division of tiles x steps over them. subs > 1:
// the unit of work is a block of `subs` warps (threads / 32), each with its own partial slots
// and counters; StreamK::warps then counts blocks. smem: the kernel's dynamic shared memory.
// align: launch fewer warps, down to kAlignMinPercent of the wave, when that keeps every warp's
// range inside one tile (a whole number of warps a tile) or, with kWholeTiles, also when tiles
// outnumber warps, each warp's range a whole number of tiles (see plan_streamk).
enum class TileAlign { kNone, kWarpsPerTile, kWholeTiles };
StreamK plan_streamk(const void* kernel, int threads, int64_t tiles, int64_t steps, int slot_floats,
                     const GemvWorkspace& ws, int min_steps = 1, int subs = 1, size_t smem = 0,
                     TileAlign align = TileAlign::kNone);

// Turns a tile-aligned plan's fixups local (StreamK::local) where each tile's warps fit one block
// of `threads` (at most two tiles a block) or clusters of up to 4 blocks hold whole tiles (at most
// 16 warps a tile), of which the device can hold a wave; leaves it as it is otherwise. The kernel
// must call streamk_local_fixup when sk.local > 0 and be launched by launch_streamk (the cluster
// size).
void plan_local_fixup(StreamK& sk, const void* kernel, int threads, size_t smem);

// launch_pdl with the plan's cluster size (StreamK::cluster).
template <typename... Params, typename... Args>
void launch_streamk(const StreamK& sk, void (*kernel)(Params...), dim3 grid, dim3 block,
                    size_t smem, cudaStream_t st, Args... args) {
  launch_pdl_clusters(kernel, grid, block, smem, st, sk.cluster, args...);
}

// The fast kernel that handles `m`, or kNone (other formats, odd sizes, unaligned data).
GemvKind fast_gemv_kind(const DevMat& m);

// out[j][i, r] = W_j[r, :] . x[i, :] for i < n (1..16; kQ4: 1..kQ4GemvMaxRows), all jobs of the
// same kind (and, for kQ4, the same group size). kQ4 prepares the activations in ws.act first
// (q4_act_bytes).
void launch_gemv_fast(cudaStream_t st, GemvKind kind, GemvJobs jobs, const float* x, int64_t ldx,
                      int n, const GemvWorkspace& ws);

// --- 4-bit tensor-core GEMVs (cuda_gemv_q4.cu: F16 operands; cuda_gemv_q4d.cu: 8-bit digits) ---

// How the activations are given to the tensor cores: hi and lo F16 parts (5..64 rows: one mma
// serves four rows; kF16Gmma: the same values in the wgmma kernel's order, 17..64 rows on sm_90
// at groups 64 and 128) or four signed 8-bit digits (1..kQ4DigitMaxRows rows and MoE slots: fewer
// instructions per weight byte, the batch-1 bound).
enum class Q4Operands { kF16, kF16Gmma, kDigits };
constexpr int kQ4DigitMaxRows = 4;
// Whether the wgmma kernel (cuda_gemv_q4g.cu) runs matrices of this group size here.
bool q4_gmma_eligible(int group, const GemvWorkspace& ws);
inline Q4Operands q4_operands_for(int64_t n, bool experts, int group, const GemvWorkspace& ws) {
  if (experts || n <= kQ4DigitMaxRows) return Q4Operands::kDigits;
  return n > 16 && q4_gmma_eligible(group, ws) ? Q4Operands::kF16Gmma : Q4Operands::kF16;
}

// Activations prepared for the 4-bit kernels, 4K bytes per row either way: F16, hi and lo parts
// in the kernel's k order ([rows, 2K] halves: hi then lo), per-group sums of the scaled values
// and the row's power-of-two scale back (colscale); digits, [rows][4][K/8] of 8 bytes and per
// group {power-of-two scale back, sum of the values} (sums as float2; colscale unused).
struct Q4Act {
  __half* x = nullptr;
  int64_t ld = 0;    // halves per prepared row (2K)
  int64_t rows = 0;  // prepared rows
  float* sums = nullptr;
  float* colscale = nullptr;
  int group = 0;
  Q4Operands operands = Q4Operands::kF16;
};

// The tile layout (kQ4TilePacking, described in cuda_q4_pack.cu) the kernels read: whether `w`
// can be packed, the bytes its data and its scales+biases take, and the packing itself (device
// to device, on `st`).
bool q4_tile_packable(const Weight& w);
size_t q4_tile_data_bytes(const Weight& w);
size_t q4_tile_scale_bytes(const Weight& w);
void launch_q4_pack(cudaStream_t st, const Weight& w, void* data, void* scales);

// The 4-bit kernels take up to 64 activation rows (F16: 16 column blocks of 4) in one pass over the
// weights; the other fast GEMVs up to 16.
constexpr int kQ4GemvMaxRows = 64;
constexpr int kQ4WideCB = kQ4GemvMaxRows / 4;

// Checks that every job's matrix matches the prepared activations and numbers their 16-row
// tiles one after another (jobs.first_tile), each job's from a multiple of `align`; returns the
// (padded) tiles of all jobs.
int64_t q4_number_tiles(GemvJobs& jobs, const Q4Act& act, int align);

// Workspace bytes for `rows` prepared rows of width K.
size_t q4_act_bytes(int64_t rows, int64_t K, int group);
bool q4_mma_eligible(const DevMat& m);
// Where the activations of `rows` rows of width K are prepared in ws.act (no kernel).
Q4Act q4_act_layout(int64_t rows, int64_t K, int group, Q4Operands operands,
                    const GemvWorkspace& ws);
// A MoE block's uncombined output (tokenmill::MoeRows): row t is sum_j weights[t * k + j] *
// rows[t * per_token + j] (+ sigmoid(gate_logit[t]) * rows[t * per_token + k] when per_token >
// k), added in that order (moe_combine_kernel's).
struct CombineRows {
  const float* rows = nullptr;
  const float* weights = nullptr;
  const float* gate_logit = nullptr;
  int k = 0, per_token = 0;
};
// The widest rows (in 8-value words) whose norm can take a deferred combine: its kernel runs at
// most 512 threads, so a thread holds a batch of terms' loads in registers.
constexpr int kCombineMaxWords = 512;

// x += y (y may be null; or, with cr.rows, x += the combine of cr, K / 8 <= kCombineMaxWords);
// h = rmsnorm(x) * w per row of width K (at most 8192); and h's digits into `act` (q4_act_layout
// with kDigits): a block's norm and the preparation of its 4-bit projections in one kernel.
void launch_rmsnorm_q4d(cudaStream_t st, float* x, const float* y, const float* w, float* h,
                        int64_t rows, int64_t K, float eps, const Q4Act& act,
                        const CombineRows& cr = CombineRows{});
// g = rmsnorm_gated(o, z, w) per head of `dim` (dim / 8 a power of two <= 32) of `rows` rows of
// heads * dim (at most 8192), written to `normed`, and g's digits into `act` (kDigits).
void launch_rmsnorm_gated_q4d(cudaStream_t st, const float* o, const float* z, const float* w,
                              float* normed, int64_t rows, int heads, int dim, float eps,
                              const Q4Act& act);
// With `up` (digits only): prepares silu(x) * up (both [rows, K] at stride ldx), an MLP down
// projection's input, with no kernel of its own; with sigmoid_gate too, x * sigmoid(up) (the
// gated attention output).
Q4Act launch_q4_prepare(cudaStream_t st, const float* x, int64_t ldx, int64_t rows, int64_t K,
                        int group, Q4Operands operands, const GemvWorkspace& ws,
                        const float* up = nullptr, bool sigmoid_gate = false);
// No slots (sl.ids == nullptr): out[j][i, r] for the n prepared rows. Otherwise `slots` slots of
// one activation row each (Q4Slots).
void launch_q4_gemv(cudaStream_t st, GemvJobs jobs, const Q4Act& act, int n, const Q4Slots& sl,
                    int64_t slots, const GemvWorkspace& ws);

// A MoE layer's expert MLPs for decode tokens in one launch (cuda_moe_mlp.cu): slot s of token
// s / slots.per_token runs expert ids[...] (or, at slot k, the shared expert) from gate and up
// to down on the token's prepared digits `x` (kDigits, hidden), writing its down row to out[s]
// ([slots, hidden], as launch_q4_gemv's down projection writes them). slots.picks: the launch
// makes the ids itself (Q4Picks). expert_mlp_takes: whether it takes these shapes and formats
// (every matrix 4-bit, one group size of 64 or 128 and one scale type).
constexpr int kExpertMlpMaxInter = 512;
constexpr int kExpertMlpBlocks = 8;  // blocks a slot (a cluster)
struct ExpertMlpArgs {
  DevMat gate, up, down;                       // routed experts (stacked)
  DevMat shared_gate, shared_up, shared_down;  // slot k of each token when per_token > k
  Q4Act x;
  Q4Slots slots;
  float* out = nullptr;
};
bool expert_mlp_takes(const DevMat& gate, const DevMat& up, const DevMat& down, int per_token,
                      int64_t tokens);
void launch_expert_mlp(cudaStream_t st, const ExpertMlpArgs& a, int slots);

// Grouped MoE rows (prefill) on the wide F16-operand kernel: chunk c is chunks[4c .. 4c+3] =
// {expert, first prepared row, rows (1..kQ4GemvMaxRows), unused} (16-byte aligned); each job's
// matrix (stacked experts) runs that expert on those rows and writes rows first .. first+rows-1
// of out[j]. Each expert's weights are read once per chunk instead of once per row.
void launch_q4_gemv_chunks(cudaStream_t st, GemvJobs jobs, const Q4Act& act, const int32_t* chunks,
                           int64_t n_chunks, const GemvWorkspace& ws);

// The weight-stationary F16-operand kernel for more rows (cuda_gemv_q4w.cu): out[j][i, r] for
// the n prepared rows (17..kQ4GemvMaxRows).
void launch_q4w_gemv(cudaStream_t st, GemvJobs jobs, const Q4Act& act, int n,
                     const GemvWorkspace& ws);

// The wgmma kernel (cuda_gemv_q4g.cu, sm_90, groups 64 and 128, kF16Gmma activations) for the
// two above: 17..kQ4GemvMaxRows prepared rows, and grouped MoE chunks.
void launch_q4g_gemv(cudaStream_t st, GemvJobs jobs, const Q4Act& act, int n,
                     const GemvWorkspace& ws);
void launch_q4g_gemv_chunks(cudaStream_t st, GemvJobs jobs, const Q4Act& act, const int32_t* chunks,
                            int64_t n_chunks, const GemvWorkspace& ws);
// Its fast pass (ws.fast_gmma) at groups of 64 in registers (cuda_gemv_q4f.cu): 17..64 rows.
void launch_q4f_gemv(cudaStream_t st, GemvJobs jobs, const Q4Act& act, int n,
                     const GemvWorkspace& ws);

// The digit kernels (cuda_gemv_q4d.cu), called by the two above with checked arguments.
void launch_q4d_prepare_kernel(cudaStream_t st, const float* x, const float* up, bool sigmoid_gate,
                               int64_t ldx, int64_t rows, int64_t K, const Q4Act& act);
void launch_q4d_gemv_kernel(cudaStream_t st, const GemvJobs& jobs, const Q4Act& act, int n,
                            const Q4Slots& sl, int64_t tiles, int64_t tiles_per_slot,
                            const GemvWorkspace& ws);

}  // namespace tokenmill::cuda
