// A GDN layer's mixer for decode steps (one token per sequence) in one kernel: the front (the
// kernel-4 conv from the conv state, SiLU, the l2norms of q and k, the gates), the delta rule and
// the gated RMSnorm, with the normed rows' digits for a 4-bit output projection. The op-by-op
// form is three dependent launches a layer (gdn_front_kernel, delta_rule_decode_kernel and the
// gated norm), each paying a launch's dependency latency (2-3 us on the H200) for a few
// microseconds of work.
//
// Block (sequence s, value head h), 512 threads: in the front, thread j < 128 owns q channel j of
// the head's key head kh, j < 256 k channel j - 128, j < 256 + Dv value channel j - 256 of head h;
// in the rule, thread j owns rows [i0, i0 + 32) of state column j / 4 (cuda_gdn.cuh), so a block
// holds the head's whole state and output: the gated norm over the head needs no other block.
//
// The r = v_heads / k_heads blocks of one key head all compute its q and k (the conv is 4 FMAs a
// channel); the conv state of those channels is written by the last of them to have read it
// (a ticket per (sequence, key head), reset by that block), so no block reads a state another
// has already advanced. Each block writes its own value channels' conv state.
//
// The arithmetic of each part is its op's (gdn_front_kernel, delta_token_full, the gated norm's
// kernels); sums over a head are taken in another order (F32 rounding apart, the same results).
#include <cuda_runtime.h>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gdn.cuh"
#include "backend/cuda/cuda_gemv.h"
#include "backend/cuda/cuda_gemv_q4.cuh"

namespace tokenmill::cuda {
namespace {

constexpr int kMaxDv = 128;
constexpr int kMixerThreads = kParts * kMaxDv;
// Sequences up to which decode steps take the fused kernel. A block holds a whole head (512
// threads, 128 registers each: one block a multiprocessor), which suits one sequence's 32-48
// heads; with more the op-by-op kernels spread the heads' columns wider. H200, 27B q4g64: batch
// 4 455.4 tok/s op by op, 448.4 fused; batch 64 2,095 against 1,914.
constexpr int kMixerMaxSeqs = 1;

struct MixerArgs {
  GDNStateView st;
  SeqLayout seqs;
  const int32_t* slots;
  const float *qkv, *z, *a, *b;
  const float *conv_w, *a_log, *dt_bias, *norm_w;
  float eps;
  float* normed;  // [n_tokens, v_heads * v_dim]
  Q4Act act;      // with digits: normed's digits for the 4-bit output projection
  bool digits;
  int* tickets;  // [n_seqs, k_heads], zero at rest
};

__global__ void __launch_bounds__(kMixerThreads, 1) gdn_mixer_decode_kernel(MixerArgs A) {
  __shared__ __align__(16) float qk[2 * kRegDk];  // q_t, k_t of the key head, normalized
  __shared__ float vs[kMaxDv];                    // v_t of the head
  __shared__ float gs[kMaxDv];                    // the gated norm's output (for the digits)
  __shared__ float red[32];
  __shared__ float gate[2];  // the decay factor exp(g) and beta
  __shared__ int last;
  const GDNStateView& st = A.st;
  const int s = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int Hv = st.v_heads, Hk = st.k_heads, Dv = st.v_dim, kh = h / (Hv / Hk);
  const int d = tid / kParts, i0 = (tid % kParts) * kRowsPerPart;
  const bool active = d < Dv;
  const int64_t C = st.channels, qkd = int64_t{Hk} * kRegDk, vd = int64_t{Hv} * Dv;
  const int64_t slot = A.slots[s];
  // Before the wait: weights, and this layer's states, last written by its previous step (every
  // kernel before the one this launch depends on has completed; delta_rule_decode_kernel).
  float* S = st.ssm + (slot * Hv + h) * kRegDk * Dv;
  float col[kRowsPerPart];
#pragma unroll
  for (int j = 0; j < kRowsPerPart; ++j) {
    col[j] = active ? S[static_cast<int64_t>(i0 + j) * Dv + d] : 0.0f;
  }
  const bool conv_live = tid < 2 * kRegDk + Dv;
  const int64_t ch = tid < kRegDk       ? kh * kRegDk + tid
                     : tid < 2 * kRegDk ? qkd + kh * kRegDk + (tid - kRegDk)
                                        : 2 * qkd + int64_t{h} * Dv + (tid - 2 * kRegDk);
  float* sc = st.conv + (slot * C + (conv_live ? ch : 0)) * 3;
  float h0 = 0.0f, h1 = 0.0f, h2 = 0.0f, w[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (conv_live) {
    h0 = sc[0], h1 = sc[1], h2 = sc[2];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = A.conv_w[ch * 4 + i];
  }
  const float wn = active ? A.norm_w[d] : 0.0f;
  const float a_log = A.a_log[h], dt_bias = A.dt_bias[h];
  pdl_begin();
  const int64_t t = A.seqs.cu_seqlens[s];
  if (A.seqs.cu_seqlens[s + 1] <= t) return;  // no token: the states stay as they are
  const float xt = conv_live ? A.qkv[t * C + ch] : 0.0f;
  const float zv = active ? A.z[t * vd + int64_t{h} * Dv + d] : 0.0f;
  if (tid == 0) {
    const float u = A.a[t * Hv + h] + dt_bias;
    const float sp = u > 20.0f ? u : log1pf(expf(u));  // torch's softplus threshold
    gate[0] = expf(-expf(a_log) * sp);
    gate[1] = sigmoid_f(A.b[t * Hv + h]);
  }
  // The conv's order of gdn_front_kernel: history oldest first, then the new input.
  float acc = 0.0f;
  acc += w[0] * h0;
  acc += w[1] * h1;
  acc += w[2] * h2;
  acc += w[3] * xt;
  const float y = silu_f(acc);
  // q's squares in warps 0-3, k's in warps 4-7.
  const float sq = warp_sum(tid < 2 * kRegDk ? y * y : 0.0f);
  if (lane == 0) red[warp] = sq;
  if (tid >= 2 * kRegDk && conv_live) vs[tid - 2 * kRegDk] = y;
  __syncthreads();
  if (tid < 2 * kRegDk) {
    const int q0 = tid < kRegDk ? 0 : 4;
    const float ss = (red[q0] + red[q0 + 1]) + (red[q0 + 2] + red[q0 + 3]);
    const float f = tid < kRegDk ? 1.0f / sqrtf(static_cast<float>(kRegDk)) : 1.0f;
    qk[tid] = y * (f / sqrtf(ss + 1e-6f));
  }
  // Every thread of this block has read its conv state (its values are in y): the ticket is
  // taken now and its answer read at the end, its round trip under the rule and the norm.
  int* ticket = A.tickets + int64_t{s} * Hk + kh;
  int taken = 0;
  if (tid == 0) {
    __threadfence();
    taken = atomicAdd(ticket, 1);
  }
  __syncthreads();
  if (conv_live && tid >= 2 * kRegDk) sc[0] = h1, sc[1] = h2, sc[2] = xt;
  const float o =
      delta_token_full(col, qk, qk + kRegDk, i0, gate[0], gate[1], active ? vs[d] : 0.0f);
  if (active) {
#pragma unroll
    for (int j = 0; j < kRowsPerPart; ++j) S[static_cast<int64_t>(i0 + j) * Dv + d] = col[j];
  }
  // The gated norm over the head (its four threads a column hold o; the first counts).
  const bool first = active && tid % kParts == 0;
  const float inv =
      1.0f / sqrtf(block_sum(first ? o * o : 0.0f, red) / static_cast<float>(Dv) + A.eps);
  const float gv = wn * (o * inv) * silu_f(zv);
  if (first) {
    A.normed[t * vd + int64_t{h} * Dv + d] = gv;
    gs[d] = gv;
  }
  if (tid == 0) {
    last = taken == Hv / Hk - 1;
    if (last) *ticket = 0;
  }
  __syncthreads();
  if (tid < 2 * kRegDk && last) sc[0] = h1, sc[1] = h2, sc[2] = xt;
  if (A.digits && warp == 0) {
    const bool live = lane < Dv / 8;
    float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    if (live) {
      const float* p = gs + lane * 8;
      const float nib[8] = {p[0], p[2], p[4], p[6], p[1], p[3], p[5], p[7]};  // nibble order
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = nib[i];
    }
    q4d_store_word(v, live, t, int64_t{h} * Dv / 8 + lane, vd, A.act.group, A.act);
  }
}

}  // namespace
}  // namespace tokenmill::cuda

namespace tokenmill {

void CudaBackend::gdn_mixer(const GDNStateView& st, const SeqLayout& seqs, const int32_t* slots,
                            const GdnMixerWeights& w, const GdnMixerIo& io, float* out) {
  const int r = st.k_heads > 0 ? st.v_heads / st.k_heads : 0;
  const bool fused = seqs.n_seqs <= cuda::kMixerMaxSeqs && st.kernel == 4 &&
                     st.k_dim == cuda::kRegDk && st.v_dim >= 8 && st.v_dim <= cuda::kMaxDv &&
                     st.v_dim % 8 == 0 && r > 0 && st.v_heads % st.k_heads == 0 &&
                     seqs.max_seq_tokens == 1 && seqs.n_seqs >= 1 && seqs.n_seqs <= 65535 &&
                     st.v_heads <= 65535 && int64_t{seqs.n_seqs} * st.k_heads <= kMixerTickets;
  if (!fused) {
    Backend::gdn_mixer(st, seqs, slots, w, io, out);
    return;
  }
  const int64_t n = seqs.n_tokens, K = int64_t{st.v_heads} * st.v_dim;
  cuda::MixerArgs a{st,        seqs,          slots,   io.qkv,        io.z,   io.a,
                    io.b,      w.conv,        w.a_log, w.dt_bias,     w.norm, w.eps,
                    io.normed, cuda::Q4Act{}, false,   mixer_tickets_};
  cuda::GemvJobs jobs;
  if (n >= 1 && n <= cuda::kQ4DigitMaxRows && !w.out_proj->experts) {
    const cuda::DevMat m = cuda::make_devmat(*w.out_proj, 0);
    if (m.cols == K && cuda::fast_gemv_kind(m) == cuda::GemvKind::kQ4 &&
        cuda::q4_act_bytes(n, K, m.group) <= kGemvWorkspaceBytes && st.v_dim % m.group == 0) {
      a.act = cuda::q4_act_layout(n, K, m.group, cuda::Q4Operands::kDigits, gemv_ws_);
      a.digits = true;
      jobs.m[0] = m;
      jobs.out[0] = out;
      jobs.count = 1;
    }
  }
  cuda::launch_pdl(cuda::gdn_mixer_decode_kernel,
                   dim3(static_cast<unsigned>(seqs.n_seqs), static_cast<unsigned>(st.v_heads)),
                   dim3(cuda::kMixerThreads), 0, stream_, a);
  TM_CUDA_LAUNCHED();
  if (a.digits) {
    cuda::launch_q4_gemv(stream_, jobs, a.act, static_cast<int>(n), cuda::Q4Slots{}, 0, gemv_ws_);
  } else {
    linear(io.normed, n, *w.out_proj, out);
  }
}

}  // namespace tokenmill
