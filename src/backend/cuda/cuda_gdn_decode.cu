// A GDN layer's mixer for decode steps (one token per sequence) in one kernel: the front (the
// kernel-4 conv from the conv state, SiLU, the l2norms of q and k, the gates), the delta rule and
// the gated RMSnorm, with the normed rows' digits for a 4-bit output projection. The op-by-op
// form is three dependent launches a layer (gdn_front_kernel, delta_rule_decode_kernel and the
// gated norm), each paying a launch's dependency latency (2-3 us on the H200) for a few
// microseconds of work.
//
// kColBlocks blocks per (sequence s, value head h); block z holds state columns [32z, 32z + 32)
// as delta_rule_parts_kernel does (thread j: rows [i0, i0 + 32) of column 32z + j / 4,
// cuda_gdn.cuh), so a head's 64 KB of state loads over four multiprocessors. A cluster holds the
// 4r blocks of one key head kh (its r = v_heads / k_heads value heads): every block computes the
// q and k of kh (thread j: q and k channel j; the conv is 4 FMAs a channel) and its own 32 value
// channels, and the cluster's first block writes the q and k channels' conv state once every
// block has said (an arrival on its mbarrier) that it has read it. The gated norm sums the head's
// squares over its four blocks: each pushes its sum into every block of the head, which add them
// in block order; with a 4-bit output projection, each block pushes its outputs into the head's
// first block, which writes the head's digits from its own shared memory. The pushes are
// asynchronous stores counted on the receiver's mbarrier (cuda_common.cuh): no cluster barrier
// on the step's path. The two barriers they replace cost a release each (MEMBAR.ALL.GPU, which
// waits for every earlier store) and kept every block until the slowest arrived. The global
// stores (the state, the conv state, the normed row) come last.
//
// The arithmetic of each part is its op's (gdn_front_kernel, delta_token_full, the gated norm's
// kernels); sums over a head are taken in another order (F32 rounding apart, the same results).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gdn.cuh"
#include "backend/cuda/cuda_gemv.h"
#include "backend/cuda/cuda_gemv_q4.cuh"

namespace tokenmill::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kColBlocks = 4;
constexpr int kBlockCols = 32;
constexpr int kMaxDv = kColBlocks * kBlockCols;
constexpr int kMixerThreads = kParts * kBlockCols;  // 128
static_assert(kMixerThreads == kRegDk, "thread j owns q and k channel j");
// Sequences up to which decode steps take the fused kernel. The op-by-op kernels win from four
// sequences on (H200, 27B q4g64: batch 4 455 tok/s op by op against 443 fused, batch 64 2,091
// against 1,941; 35B-A3B batch 4 1,071 against 1,031), where their launches' latency is shared.
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
};

// One conv channel's step: the state history (oldest first) and the weights, as
// gdn_front_kernel.
__device__ __forceinline__ float conv4_silu(const float (&hist)[3], const float (&w)[4], float x) {
  float acc = 0.0f;
  acc += w[0] * hist[0];
  acc += w[1] * hist[1];
  acc += w[2] * hist[2];
  acc += w[3] * x;
  return silu_f(acc);
}

__global__ void __launch_bounds__(kMixerThreads, 4) gdn_mixer_decode_kernel(MixerArgs A) {
  __shared__ __align__(16) float qk[2 * kRegDk];  // q_t, k_t of the key head, normalized
  __shared__ float vs[kBlockCols];                // v_t of the block's columns
  __shared__ __align__(16) float hs[kMaxDv];      // a head's first block: the head's outputs
  __shared__ float red[32];
  __shared__ float head_ss[kColBlocks];  // the head's blocks' sums of squares of o, by block
  __shared__ float gate[2];              // the decay factor exp(g) and beta
  // Pushed values land on: [0] head_ss (every block), [1] hs (a head's first block, with
  // digits), [2] one arrival per block of the cluster once it has read the q/k conv state (the
  // cluster's first block, which then writes it).
  __shared__ uint64_t bars[3];
  cg::cluster_group cluster = cg::this_cluster();
  const GDNStateView& st = A.st;
  const int s = blockIdx.x, h = blockIdx.y, zb = blockIdx.z, tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;
  const int Hv = st.v_heads, Hk = st.k_heads, Dv = st.v_dim, r = Hv / Hk, kh = h / r;
  // Cluster rank of head h's block z: z * r + h % r (dims (1, r, kColBlocks), x fastest).
  const int head_rank0 = h % r;
  const int c0 = zb * kBlockCols, d = c0 + tid / kParts, i0 = (tid % kParts) * kRowsPerPart;
  const bool active = d < Dv;
  const int64_t C = st.channels, qkd = int64_t{Hk} * kRegDk, vd = int64_t{Hv} * Dv;
  const int64_t slot = A.slots[s];
  const bool rank0 = cluster.block_rank() == 0;
  if (tid == 0) {
    mbar_init(smem_addr(&bars[0]), 1);
    mbar_expect(smem_addr(&bars[0]), kColBlocks * 4);
    if (zb == 0 && A.digits) {
      mbar_init(smem_addr(&bars[1]), 1);
      mbar_expect(smem_addr(&bars[1]), Dv * 4);
    }
    if (rank0) mbar_init(smem_addr(&bars[2]), static_cast<uint32_t>(r * kColBlocks));
    fence_mbarrier_init();
  }
  __syncwarp();
  cluster_arrive_relaxed();
  // Before the wait: weights, and this layer's states, last written by its previous step (every
  // kernel before the one this launch depends on has completed; delta_rule_decode_kernel).
  float* S = st.ssm + (slot * Hv + h) * kRegDk * Dv;
  float col[kRowsPerPart];
#pragma unroll
  for (int j = 0; j < kRowsPerPart; ++j) {
    col[j] = active ? S[static_cast<int64_t>(i0 + j) * Dv + d] : 0.0f;
  }
  // Channels: q (kh * Dk + tid), k (qkd + the same), and for tid < 32 value channel c0 + tid.
  const int64_t chq = int64_t{kh} * kRegDk + tid, chk = qkd + chq;
  const bool v_live = tid < kBlockCols && c0 + tid < Dv;
  const int64_t chv = 2 * qkd + int64_t{h} * Dv + (v_live ? c0 + tid : 0);
  float* sq = st.conv + (slot * C + chq) * 3;
  float* sk = st.conv + (slot * C + chk) * 3;
  float* sv = st.conv + (slot * C + chv) * 3;
  float hq[3], hk[3], hv[3] = {0.0f, 0.0f, 0.0f}, wq[4], wk[4], wv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < 3; ++i) hq[i] = sq[i], hk[i] = sk[i];
#pragma unroll
  for (int i = 0; i < 4; ++i) wq[i] = A.conv_w[chq * 4 + i], wk[i] = A.conv_w[chk * 4 + i];
  if (v_live) {
#pragma unroll
    for (int i = 0; i < 3; ++i) hv[i] = sv[i];
#pragma unroll
    for (int i = 0; i < 4; ++i) wv[i] = A.conv_w[chv * 4 + i];
  }
  const float wn = active ? A.norm_w[d] : 0.0f;
  const float a_log = A.a_log[h], dt_bias = A.dt_bias[h];
  // The step's layout too (uploaded before the step's first kernel): after the wait, the
  // token's inputs are one round trip away, not two.
  const int64_t t = A.seqs.cu_seqlens[s];
  const bool no_token = A.seqs.cu_seqlens[s + 1] <= t;
  pdl_begin();
  // No token: the states stay as they are (the whole cluster returns).
  if (no_token) return;
  const float xq = A.qkv[t * C + chq], xk = A.qkv[t * C + chk];
  const float xv = v_live ? A.qkv[t * C + chv] : 0.0f;
  const float zv = active ? A.z[t * vd + int64_t{h} * Dv + d] : 0.0f;
  if (tid == 0) {
    const float u = A.a[t * Hv + h] + dt_bias;
    const float sp = u > 20.0f ? u : log1pf(expf(u));  // torch's softplus threshold
    gate[0] = expf(-expf(a_log) * sp);
    gate[1] = sigmoid_f(A.b[t * Hv + h]);
  }
  const float yq = conv4_silu(hq, wq, xq), yk = conv4_silu(hk, wk, xk);
  if (v_live) vs[tid] = conv4_silu(hv, wv, xv);
  // The l2norms: q's squares in red[0..3], k's in red[4..7].
  const float ssq = warp_sum(yq * yq), ssk = warp_sum(yk * yk);
  if (lane == 0) red[warp] = ssq, red[4 + warp] = ssk;
  __syncthreads();
  {
    const float tq = (red[0] + red[1]) + (red[2] + red[3]);
    const float tk = (red[4] + red[5]) + (red[6] + red[7]);
    qk[tid] = yq * ((1.0f / sqrtf(static_cast<float>(kRegDk))) / sqrtf(tq + 1e-6f));
    qk[kRegDk + tid] = yk * (1.0f / sqrtf(tk + 1e-6f));
  }
  __syncthreads();
  // Every thread has used its q/k conv state: the cluster's first block may overwrite it.
  cluster_wait();
  if (tid == 0) mbar_arrive_cluster(cluster_addr(smem_addr(&bars[2]), 0));
  const float o =
      delta_token_full(col, qk, qk + kRegDk, i0, gate[0], gate[1], active ? vs[d - c0] : 0.0f);
  // The gated norm over the head: the block's squares (the first of a column's four threads),
  // then the cluster's, summed in block order.
  const bool first = active && tid % kParts == 0;
  const float bss = block_sum(first ? o * o : 0.0f, red);
  if (tid < kColBlocks) {  // to the head's blocks, each at its slot zb
    const uint32_t z = static_cast<uint32_t>(tid * r + head_rank0);
    st_async_cluster(cluster_addr(smem_addr(&head_ss[zb]), z), bss,
                     cluster_addr(smem_addr(&bars[0]), z));
  }
  mbar_wait_cluster(smem_addr(&bars[0]), 0);
  float ss = 0.0f;
#pragma unroll
  for (int z = 0; z < kColBlocks; ++z) ss += head_ss[z];
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(Dv) + A.eps);
  const float gv = wn * (o * inv) * silu_f(zv);
  if (first && A.digits) {
    const uint32_t z0 = static_cast<uint32_t>(head_rank0);
    st_async_cluster(cluster_addr(smem_addr(&hs[d]), z0), gv,
                     cluster_addr(smem_addr(&bars[1]), z0));
  }
  if (A.digits && zb == 0 && warp == 0) {
    mbar_wait_cluster(smem_addr(&bars[1]), 0);  // the head's outputs
    const bool live = lane < Dv / 8;
    float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    if (live) {
      const float* p = hs + lane * 8;
      const float nib[8] = {p[0], p[2], p[4], p[6], p[1], p[3], p[5], p[7]};  // nibble order
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = nib[i];
    }
    q4d_store_word(v, live, t, int64_t{h} * Dv / 8 + lane, vd, A.act.group, A.act);
  }
  // The global stores come last (a barrier before them would wait for their acknowledgement).
  if (first) A.normed[t * vd + int64_t{h} * Dv + d] = gv;
  if (active) {
#pragma unroll
    for (int j = 0; j < kRowsPerPart; ++j) S[static_cast<int64_t>(i0 + j) * Dv + d] = col[j];
  }
  if (v_live) sv[0] = hv[1], sv[1] = hv[2], sv[2] = xv;
  if (rank0) {
    mbar_wait_cluster(smem_addr(&bars[2]), 0);
    sq[0] = hq[1], sq[1] = hq[2], sq[2] = xq;
    sk[0] = hk[1], sk[1] = hk[2], sk[2] = xk;
  }
}

}  // namespace

int init_gdn_mixer() {
  // Clusters of 4r blocks: 12 for the 27B's r = 3 exceeds the portable 8. A device that allows
  // no more than 8 takes the sizes it can (the occupancy query below says which).
  if (cudaFuncSetAttribute(gdn_mixer_decode_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed,
                           1) != cudaSuccess) {
    (void)cudaGetLastError();
  }
  int best = 0;
  for (int size = kColBlocks; size <= 16; size += kColBlocks) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1, static_cast<unsigned>(size / kColBlocks), kColBlocks);
    cfg.blockDim = dim3(kMixerThreads);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 1;
    attr[0].val.clusterDim.y = static_cast<unsigned>(size / kColBlocks);
    attr[0].val.clusterDim.z = kColBlocks;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, gdn_mixer_decode_kernel, &cfg) != cudaSuccess) {
      (void)cudaGetLastError();  // not a sticky error: that size is simply not available
      break;
    }
    if (clusters <= 0) break;
    best = size;
  }
  return best;
}

}  // namespace tokenmill::cuda

namespace tokenmill {

void CudaBackend::gdn_mixer(const GDNStateView& st, const SeqLayout& seqs, const int32_t* slots,
                            const GdnMixerWeights& w, const GdnMixerIo& io, float* out) {
  const int r = st.k_heads > 0 ? st.v_heads / st.k_heads : 0;
  const bool fused = seqs.n_seqs <= cuda::kMixerMaxSeqs && st.kernel == 4 &&
                     st.k_dim == cuda::kRegDk && st.v_dim >= 8 && st.v_dim <= cuda::kMaxDv &&
                     st.v_dim % 8 == 0 && r > 0 && st.v_heads % st.k_heads == 0 &&
                     seqs.max_seq_tokens == 1 && seqs.n_seqs >= 1 && seqs.n_seqs <= 65535 &&
                     st.v_heads <= 65535 && r * cuda::kColBlocks <= mixer_max_cluster_;
  if (!fused) {
    Backend::gdn_mixer(st, seqs, slots, w, io, out);
    return;
  }
  const int64_t n = seqs.n_tokens, K = int64_t{st.v_heads} * st.v_dim;
  cuda::MixerArgs a{st,      seqs,      slots,  io.qkv, io.z,      io.a,          io.b, w.conv,
                    w.a_log, w.dt_bias, w.norm, w.eps,  io.normed, cuda::Q4Act{}, false};
  cuda::DevMat m;
  if (n >= 1 && n <= cuda::kQ4DigitMaxRows && !w.out_proj->experts) {
    m = cuda::make_devmat(*w.out_proj, 0);
    if (q4_digit_gemv_takes(m, n, K, st.v_dim)) {
      a.act = cuda::q4_act_layout(n, K, m.group, cuda::Q4Operands::kDigits, gemv_ws_);
      a.digits = true;
    }
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim =
      dim3(static_cast<unsigned>(seqs.n_seqs), static_cast<unsigned>(st.v_heads), cuda::kColBlocks);
  cfg.blockDim = dim3(cuda::kMixerThreads);
  cfg.stream = stream_;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  attr[1].id = cudaLaunchAttributeClusterDimension;
  attr[1].val.clusterDim.x = 1;
  attr[1].val.clusterDim.y = static_cast<unsigned>(r);
  attr[1].val.clusterDim.z = cuda::kColBlocks;
  cfg.attrs = attr;
  cfg.numAttrs = 2;
  TM_CUDA(cudaLaunchKernelEx(&cfg, cuda::gdn_mixer_decode_kernel, a));
  TM_CUDA_LAUNCHED();
  if (a.digits) {
    q4_gemv_prepared(m, a.act, n, out);
  } else {
    linear(io.normed, n, *w.out_proj, out);
  }
}

}  // namespace tokenmill
