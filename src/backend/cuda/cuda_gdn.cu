// Gated DeltaNet: causal depthwise conv + SiLU with per-slot state, and the gated delta rule in
// its recurrent form (one token at a time, state in F32).
//
// The delta rule decomposes over value columns: with S [Dk, Dv], column d evolves as
//   S[:,d] = a S[:,d];  kS = k . S[:,d];  delta = beta (v_d - kS);  S[:,d] += k delta;
//   o_d = q . S[:,d]
// so a column is owned by kParts threads (in registers when Dk <= 128 and Dv <= 128; else one
// thread per column in the state memory) and the block of a (sequence, value head) shares only q_t
// and k_t through shared memory. The operation order per column is the CPU reference's recurrent
// form.
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gdn.cuh"

namespace tokenmill::cuda {
namespace {

// One thread per (sequence, channel): walks the sequence's rows in order. KM1 = kernel - 1 when
// known at compile time (Qwen3.5: 4), so the history stays in registers and the loads of
// successive rows overlap; 0 = any kernel size (history in local memory).
template <int KM1>
__global__ void conv1d_silu_kernel(GDNStateView st, SeqLayout seqs, const int32_t* slots,
                                   const float* __restrict__ x, const float* __restrict__ weight,
                                   float* __restrict__ out) {
  pdl_begin();
  const int64_t C = st.channels;
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int s = blockIdx.y;
  if (c >= C) return;
  const int64_t t0 = seqs.cu_seqlens[s], L = seqs.cu_seqlens[s + 1] - t0;
  if (L <= 0) return;
  constexpr int kMax = KM1 > 0 ? KM1 : 15;
  const int Km1 = KM1 > 0 ? KM1 : st.kernel - 1;
  float* sc = st.conv + (static_cast<int64_t>(slots[s]) * C + c) * Km1;
  const float* w = weight + c * (Km1 + 1);
  float hist[kMax];  // the K-1 previous inputs, oldest first
  float wk[kMax + 1];
#pragma unroll
  for (int i = 0; i < kMax; ++i) {
    if (i < Km1) hist[i] = sc[i];
  }
#pragma unroll
  for (int i = 0; i <= kMax; ++i) {
    if (i <= Km1) wk[i] = w[i];
  }
#pragma unroll 4
  for (int64_t t = 0; t < L; ++t) {
    const float xt = x[(t0 + t) * C + c];
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < kMax; ++i) {
      if (i < Km1) acc += wk[i] * hist[i];
    }
    acc += wk[Km1] * xt;
    out[(t0 + t) * C + c] = silu_f(acc);
#pragma unroll
    for (int i = 0; i + 1 < kMax; ++i) {
      if (i + 1 < Km1) hist[i] = hist[i + 1];
    }
    hist[Km1 - 1] = xt;
  }
#pragma unroll
  for (int i = 0; i < kMax; ++i) {
    if (i < Km1) sc[i] = hist[i];
  }
}

// The kernel-4 conv for prefill: thread (channel, tile of kConvRows rows of the call) instead of
// one thread walking a whole sequence (80 blocks walking 8,192 rows one load at a time took 4 ms
// per 27B layer). A row's three previous inputs come from the rows above it in its sequence or,
// before the sequence's first row, from its conv state, which conv_state_update_kernel (run
// after, in stream order) then advances. Same operation order as conv1d_silu_kernel.
constexpr int kConvRows = 32;

__global__ void conv4_silu_rows_kernel(GDNStateView st, SeqLayout seqs, const int32_t* slots,
                                       const float* __restrict__ x,
                                       const float* __restrict__ weight, float* __restrict__ out) {
  pdl_begin();
  const int64_t C = st.channels;
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kConvRows;
  const int64_t T = seqs.n_tokens;
  if (c >= C || r0 >= T) return;
  // The sequence holding row r0: the last s with cu_seqlens[s] <= r0.
  int lo = 0, hi = seqs.n_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (seqs.cu_seqlens[mid] <= r0) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  int s = lo;
  const float w0 = weight[c * 4], w1 = weight[c * 4 + 1], w2 = weight[c * 4 + 2],
              w3 = weight[c * 4 + 3];
  // The inputs at rows p - 3, p - 2, p - 1 before row p of sequence s.
  const auto input = [&](int seq, int64_t p) {
    const int64_t t0 = seqs.cu_seqlens[seq];
    return p >= t0 ? x[p * C + c]
                   : st.conv[(static_cast<int64_t>(slots[seq]) * C + c) * 3 + 3 - (t0 - p)];
  };
  float h0 = input(s, r0 - 3), h1 = input(s, r0 - 2), h2 = input(s, r0 - 1);
  int64_t next = seqs.cu_seqlens[s + 1];
  const int64_t r1 = r0 + kConvRows < T ? r0 + kConvRows : T;
  for (int64_t t = r0; t < r1; ++t) {
    if (t == next) {  // a new sequence starts at row t
      while (seqs.cu_seqlens[s + 1] <= t) ++s;
      next = seqs.cu_seqlens[s + 1];
      h0 = input(s, t - 3), h1 = input(s, t - 2), h2 = input(s, t - 1);
    }
    const float xt = x[t * C + c];
    float acc = 0.0f;
    acc += w0 * h0;
    acc += w1 * h1;
    acc += w2 * h2;
    acc += w3 * xt;
    out[t * C + c] = silu_f(acc);
    h0 = h1, h1 = h2, h2 = xt;
  }
}

// After conv4_silu_rows_kernel: each (sequence, channel) state becomes the last three inputs of
// [state, its rows].
__global__ void conv_state_update_kernel(GDNStateView st, SeqLayout seqs, const int32_t* slots,
                                         const float* __restrict__ x) {
  pdl_begin();
  const int64_t C = st.channels;
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int s = blockIdx.y;
  if (c >= C) return;
  const int64_t t0 = seqs.cu_seqlens[s], L = seqs.cu_seqlens[s + 1] - t0;
  if (L <= 0) return;
  float* sc = st.conv + (static_cast<int64_t>(slots[s]) * C + c) * 3;
  float h[3];
#pragma unroll
  for (int j = 0; j < 3; ++j) h[j] = L + j < 3 ? sc[L + j] : x[(t0 + L + j - 3) * C + c];
#pragma unroll
  for (int j = 0; j < 3; ++j) sc[j] = h[j];
}

// The GDN front for decode and verify steps (few tokens per sequence), fused: block (s, kh)
// takes the channels of key head kh (its q and k) and of the value heads kh*r .. kh*r+r-1
// (r = v_heads / k_heads), which no other block touches, so the conv state needs no ordering
// between blocks. Thread j owns one channel: the kernel-4 conv from its state history, SiLU,
// then (q, k) the head's l2norm from per-channel squares in shared memory; the first r threads
// compute the gates. Nine launches per GDN layer become one.
struct FrontArgs {
  GDNStateView st;
  SeqLayout seqs;
  const int32_t* slots;
  const float *qkv, *conv_weight, *a, *b, *a_log, *dt_bias;
  float *q, *k, *v, *g, *beta;
};

__global__ void gdn_front_kernel(FrontArgs A) {
  extern __shared__ float sq[];  // [2 * Dk] squares of the q and k channels
  __shared__ float sums[2];
  const GDNStateView& st = A.st;
  const int s = blockIdx.x, kh = blockIdx.y;
  const int Dk = st.k_dim, Dv = st.v_dim, Hk = st.k_heads, Hv = st.v_heads, r = Hv / Hk;
  const int nch = 2 * Dk + r * Dv;
  const int j = threadIdx.x, lane = j & 31, warp = j >> 5;
  const int64_t C = st.channels, qk = static_cast<int64_t>(Hk) * Dk;
  const int64_t vd = static_cast<int64_t>(Hv) * Dv;
  const bool live = j < nch;
  const int64_t ch = j < Dk       ? kh * Dk + j
                     : j < 2 * Dk ? qk + kh * Dk + (j - Dk)
                                  : 2 * qk + static_cast<int64_t>(kh) * r * Dv + (j - 2 * Dk);
  const int64_t t0 = A.seqs.cu_seqlens[s], L = A.seqs.cu_seqlens[s + 1] - t0;
  float* sc = st.conv + (static_cast<int64_t>(A.slots[s]) * C + (live ? ch : 0)) * 3;
  // Before the wait: the weights (constant) and the conv state, which this layer's front last
  // wrote in an earlier step (every kernel before the one this launch depends on has completed,
  // as for delta_rule_decode_kernel's state).
  float h0 = 0.0f, h1 = 0.0f, h2 = 0.0f, w[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (live) {
    h0 = sc[0], h1 = sc[1], h2 = sc[2];
    for (int i = 0; i < 4; ++i) w[i] = A.conv_weight[ch * 4 + i];
  }
  const int gh = kh * r + (j < r ? j : 0);  // the value head whose gates thread j < r computes
  const float a_log = j < r ? A.a_log[gh] : 0.0f, dt_bias = j < r ? A.dt_bias[gh] : 0.0f;
  pdl_begin();
  const float q_scale = 1.0f / sqrtf(static_cast<float>(Dk));
  for (int64_t t = 0; t < L; ++t) {
    const int64_t row = t0 + t;
    const float xt = live ? A.qkv[row * C + ch] : 0.0f;
    // The order of conv1d_silu_kernel: history oldest first, then the new input.
    float acc = 0.0f;
    acc += w[0] * h0;
    acc += w[1] * h1;
    acc += w[2] * h2;
    acc += w[3] * xt;
    const float y = silu_f(acc);
    h0 = h1, h1 = h2, h2 = xt;
    if (j < 2 * Dk) sq[j] = y * y;
    __syncthreads();
    if (warp < 2) {
      float ss = 0.0f;
      for (int i = lane; i < Dk; i += 32) ss += sq[warp * Dk + i];
      ss = warp_sum(ss);
      if (lane == 0) sums[warp] = ss;
    }
    __syncthreads();
    if (j < Dk) {
      A.q[row * qk + kh * Dk + j] = y * (q_scale / sqrtf(sums[0] + 1e-6f));
    } else if (j < 2 * Dk) {
      A.k[row * qk + kh * Dk + (j - Dk)] = y * (1.0f / sqrtf(sums[1] + 1e-6f));
    } else if (live) {
      A.v[row * vd + static_cast<int64_t>(kh) * r * Dv + (j - 2 * Dk)] = y;
    }
    if (j < r) {
      const int64_t i = row * Hv + gh;
      const float u = A.a[i] + dt_bias;
      const float sp = u > 20.0f ? u : log1pf(expf(u));  // torch's softplus threshold
      A.g[i] = -expf(a_log) * sp;
      A.beta[i] = sigmoid_f(A.b[i]);
    }
  }
  if (live && L > 0) sc[0] = h0, sc[1] = h1, sc[2] = h2;
}

// The GDN front for prefill (kernel 4, many rows a sequence): a warp per kFrontWarpRows
// consecutive rows of one head segment, the segments being key head kh's q channels (segment
// kh), its k channels (Hk + kh) and value head hv's channels (2 Hk + hv); a block is kFrontRows
// warps over consecutive rows of one segment. Lane l takes the segment's channels 4l + 128i.
// The warp loads its rows' inputs and the three rows above them at once (the conv of a row reads
// the three inputs before it: from the rows above in its sequence or, before the sequence's first
// row, from its conv state; conv_state_update_kernel advances the states after), then per row:
// the conv, SiLU, and for q and k the head's l2norm by a warp sum; a value segment's lane 0 also
// computes its head's gates for the row. One pass over qkv where the op-by-op form made six
// (conv, three copies, two norms). Same operation order per value as gdn_front_kernel.
// A warp per row loaded each input four times and the conv weights once a row, and ran at half
// the memory's bandwidth (27B, 8k tokens: 511 us a layer on an H100; S38).
constexpr int kFrontRows = 8;      // warps a block
constexpr int kFrontWarpRows = 4;  // consecutive rows a warp
constexpr int kFrontMaxDim = 256;  // 2 float4 a lane

// kSlots: float4s a lane per segment row (head dims up to 128 kSlots).
template <int kSlots>
__global__ void __launch_bounds__(32 * kFrontRows) gdn_front_rows_kernel(FrontArgs A) {
  constexpr int kIn = kFrontWarpRows + 3;
  const GDNStateView& st = A.st;
  const int Dk = st.k_dim, Dv = st.v_dim, Hk = st.k_heads, Hv = st.v_heads;
  const int64_t C = st.channels, qk = static_cast<int64_t>(Hk) * Dk;
  const int64_t vd = static_cast<int64_t>(Hv) * Dv;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int seg = static_cast<int>(blockIdx.y);
  const int kind = seg < Hk ? 0 : seg < 2 * Hk ? 1 : 2;  // q, k, v
  const int head = kind == 2 ? seg - 2 * Hk : kind == 1 ? seg - Hk : seg;
  const int D = kind == 2 ? Dv : Dk;
  const int64_t ch0 = kind == 0 ? head * Dk : kind == 1 ? qk + head * Dk : 2 * qk + head * Dv;
  // The conv weights are constant: they load while the kernel before still runs.
  float4 w[kSlots][4];
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    const int c4 = 4 * lane + 128 * i;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w[i][j] = c4 < D ? reinterpret_cast<const float4*>(A.conv_weight + (ch0 + c4) * 4)[j]
                       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
  pdl_begin();
  const int64_t n = A.seqs.n_tokens;
  const int64_t first =
      (static_cast<int64_t>(blockIdx.x) * kFrontRows + (threadIdx.x >> 5)) * kFrontWarpRows;
  if (first >= n) return;
  // in[i][m]: the input of row first - 3 + m (rows outside [0, n) left zero; never used).
  float4 in[kSlots][kIn];
#pragma unroll
  for (int m = 0; m < kIn; ++m) {
    const int64_t p = first - 3 + m;
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const int c4 = 4 * lane + 128 * i;
      in[i][m] = p >= 0 && p < n && c4 < D
                     ? *reinterpret_cast<const float4*>(A.qkv + p * C + ch0 + c4)
                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
  // The first row's sequence: the last s with cu_seqlens[s] <= first.
  int lo = 0, hi = A.seqs.n_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (A.seqs.cu_seqlens[mid] <= first) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  int64_t t0 = A.seqs.cu_seqlens[lo], next = A.seqs.cu_seqlens[lo + 1];
  const float q_scale = kind == 0 ? 1.0f / sqrtf(static_cast<float>(Dk)) : 1.0f;
#pragma unroll
  for (int r = 0; r < kFrontWarpRows; ++r) {
    const int64_t t = first + r;
    if (t >= n) break;
    while (t >= next) t0 = next, next = A.seqs.cu_seqlens[++lo + 1];
    const float* const state = st.conv + static_cast<int64_t>(A.slots[lo]) * C * 3;
    float4 y[kSlots];
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const int c4 = 4 * lane + 128 * i;
      y[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (c4 >= D) continue;
      const int64_t c = ch0 + c4;
      // h[d]: the input d rows above row t (d = 0: row t itself), channels c .. c + 3.
      float4 h[4];
#pragma unroll
      for (int d = 0; d < 4; ++d) {
        const int64_t p = t - d;
        if (p >= t0) {
          h[d] = in[i][r + 3 - d];
        } else {
          const float* sc = state + c * 3 + 3 - (t0 - p);  // channel c's slot for row p
          h[d] = make_float4(sc[0], sc[3], sc[6], sc[9]);
        }
      }
      const float* wf = reinterpret_cast<const float*>(w[i]);
      float out[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float* hf0 = reinterpret_cast<const float*>(&h[3]);
        const float* hf1 = reinterpret_cast<const float*>(&h[2]);
        const float* hf2 = reinterpret_cast<const float*>(&h[1]);
        const float* hf3 = reinterpret_cast<const float*>(&h[0]);
        // The order of conv1d_silu_kernel: history oldest first, then the new input.
        float acc = 0.0f;
        acc += wf[4 * e] * hf0[e];
        acc += wf[4 * e + 1] * hf1[e];
        acc += wf[4 * e + 2] * hf2[e];
        acc += wf[4 * e + 3] * hf3[e];
        out[e] = silu_f(acc);
        ss += out[e] * out[e];
      }
      y[i] = make_float4(out[0], out[1], out[2], out[3]);
    }
    float scale = 1.0f;
    if (kind < 2) scale = q_scale / sqrtf(warp_sum(ss) + 1e-6f);
    float* const dst = kind == 0   ? A.q + t * qk + head * Dk
                       : kind == 1 ? A.k + t * qk + head * Dk
                                   : A.v + t * vd + static_cast<int64_t>(head) * Dv;
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const int c4 = 4 * lane + 128 * i;
      if (c4 >= D) continue;
      const float4 v = y[i];
      *reinterpret_cast<float4*>(dst + c4) =
          kind < 2 ? make_float4(v.x * scale, v.y * scale, v.z * scale, v.w * scale) : v;
    }
    if (kind == 2 && lane == 0) {
      const int64_t i = t * Hv + head;
      const float u = A.a[i] + A.dt_bias[head];
      const float sp = u > 20.0f ? u : log1pf(expf(u));  // torch's softplus threshold
      A.g[i] = -expf(A.a_log[head]) * sp;
      A.beta[i] = sigmoid_f(A.b[i]);
    }
  }
}

struct DeltaArgs {
  GDNStateView st;
  SeqLayout seqs;
  const int32_t* slots;
  const float *q, *k, *v, *g, *beta;
  float* out;
  float* steps;
};

// Any size: block per (sequence, value head); thread d < Dv owns state column d, read and
// written in place in the state memory.
__global__ void delta_rule_kernel(DeltaArgs A) {
  pdl_begin();
  extern __shared__ float sh[];  // q_t [Dk], k_t [Dk]
  const int s = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
  const int Hv = A.st.v_heads, Hk = A.st.k_heads, Dk = A.st.k_dim, Dv = A.st.v_dim;
  const int kh = h / (Hv / Hk);
  const int64_t state_size = static_cast<int64_t>(Dk) * Dv;
  float* S = A.st.ssm + (static_cast<int64_t>(A.slots[s]) * Hv + h) * state_size;
  float* qs = sh;
  float* ks = sh + Dk;
  const bool active = d < Dv;
  const int64_t t0 = A.seqs.cu_seqlens[s], t1 = A.seqs.cu_seqlens[s + 1];
  const int64_t qk_stride = static_cast<int64_t>(Hk) * Dk, v_stride = static_cast<int64_t>(Hv) * Dv;
  for (int64_t t = t0; t < t1; ++t) {
    __syncthreads();  // previous token's q/k fully consumed
    for (int i = threadIdx.x; i < Dk; i += blockDim.x) {
      qs[i] = A.q[t * qk_stride + static_cast<int64_t>(kh) * Dk + i];
      ks[i] = A.k[t * qk_stride + static_cast<int64_t>(kh) * Dk + i];
    }
    __syncthreads();
    if (!active) continue;
    const float a = expf(A.g[t * Hv + h]), bt = A.beta[t * Hv + h];
    const float vt = A.v[t * v_stride + static_cast<int64_t>(h) * Dv + d];
    float kS = 0.0f, o = 0.0f;
    float* step = A.steps ? A.steps + (t * Hv + h) * state_size : nullptr;
    for (int i = 0; i < Dk; ++i) {
      float* p = S + static_cast<int64_t>(i) * Dv + d;
      const float si = *p * a;
      *p = si;
      kS += ks[i] * si;
    }
    const float delta = bt * (vt - kS);
    for (int i = 0; i < Dk; ++i) {
      float* p = S + static_cast<int64_t>(i) * Dv + d;
      const float si = *p + ks[i] * delta;
      *p = si;
      o += qs[i] * si;
      if (step) step[static_cast<int64_t>(i) * Dv + d] = si;
    }
    A.out[t * v_stride + static_cast<int64_t>(h) * Dv + d] = o;
  }
}

constexpr int kPartsMaxThreads = 512;    // Dv <= 128
constexpr int kPartsBlockThreads = 128;  // per block: 32 columns
// Tokens whose inputs (q, k, the block's v columns, decay, beta) are staged in shared memory at
// once: a prefill chunk then waits for global memory once per 32 tokens instead of every token
// (per token it waited for its q/k rows, v, g and beta: ~3.4 ms per layer per 512 tokens).
constexpr int kTokChunk = 32;

// Dynamic shared memory of delta_rule_parts_kernel for `cols` columns per block.
size_t parts_smem_bytes(int Dk, int cols) {
  return static_cast<size_t>(kTokChunk) * (2 * Dk + cols + 2) * sizeof(float);
}

// kFull: k_dim == kRegDk, so every thread holds kRowsPerPart rows (no bounds per row, and q/k
// read as float4). The per-row bounds checks of the general form kept each row's shared load
// and FMA in a branch of its own: the kS and o chains then waited for every load in turn
// (19.4 ms per layer at an 8k-token prompt, 1,200 instructions per token per warp).
template <bool kFull>
__global__ void __launch_bounds__(kPartsBlockThreads) delta_rule_parts_kernel(DeltaArgs A) {
  pdl_begin();
  extern __shared__ float sh[];
  const int s = blockIdx.x, h = blockIdx.y;
  // Block z holds columns [c0, c0 + cols) of head h.
  const int cols = blockDim.x / kParts, c0 = blockIdx.z * cols;
  const int d = c0 + threadIdx.x / kParts;
  const int part = threadIdx.x % kParts;
  const int Hv = A.st.v_heads, Hk = A.st.k_heads, Dk = A.st.k_dim, Dv = A.st.v_dim;
  const int kh = h / (Hv / Hk);
  const int64_t state_size = static_cast<int64_t>(Dk) * Dv;
  float* S = A.st.ssm + (static_cast<int64_t>(A.slots[s]) * Hv + h) * state_size;
  // Staged inputs: [kTokChunk][q (Dk) | k (Dk)], [kTokChunk][cols] v, decay exp(g), beta.
  float* qk_sh = sh;
  float* v_sh = qk_sh + kTokChunk * 2 * Dk;
  float* a_sh = v_sh + kTokChunk * cols;
  float* b_sh = a_sh + kTokChunk;
  const bool active = d < Dv;
  const int rows = (Dk + kParts - 1) / kParts, i0 = part * rows;
  float col[kRowsPerPart];
#pragma unroll
  for (int j = 0; j < kRowsPerPart; ++j) {
    const int i = i0 + j;
    col[j] = active && j < rows && i < Dk ? S[static_cast<int64_t>(i) * Dv + d] : 0.0f;
  }
  const int64_t t0 = A.seqs.cu_seqlens[s], t1 = A.seqs.cu_seqlens[s + 1];
  const int64_t qk_stride = static_cast<int64_t>(Hk) * Dk, v_stride = static_cast<int64_t>(Hv) * Dv;
  for (int64_t tc = t0; tc < t1; tc += kTokChunk) {
    const int n = static_cast<int>(t1 - tc < kTokChunk ? t1 - tc : kTokChunk);
    __syncthreads();  // the previous chunk's inputs fully consumed
    if constexpr (kFull) {
      // float4s, 8 loads in flight per thread (the q and k rows are 16-byte aligned).
      constexpr int kWords = kRegDk / 4;
#pragma unroll 4
      for (int i = threadIdx.x; i < n * kWords; i += blockDim.x) {
        const int tt = i / kWords, j = (i % kWords) * 4;
        const int64_t at = (tc + tt) * qk_stride + static_cast<int64_t>(kh) * kRegDk + j;
        const float4 q4 = *reinterpret_cast<const float4*>(A.q + at);
        const float4 k4 = *reinterpret_cast<const float4*>(A.k + at);
        *reinterpret_cast<float4*>(qk_sh + tt * 2 * kRegDk + j) = q4;
        *reinterpret_cast<float4*>(qk_sh + tt * 2 * kRegDk + kRegDk + j) = k4;
      }
    } else {
      for (int i = threadIdx.x; i < n * Dk; i += blockDim.x) {
        const int tt = i / Dk, j = i - tt * Dk;
        const int64_t at = (tc + tt) * qk_stride + static_cast<int64_t>(kh) * Dk + j;
        qk_sh[tt * 2 * Dk + j] = A.q[at];
        qk_sh[tt * 2 * Dk + Dk + j] = A.k[at];
      }
    }
#pragma unroll 4
    for (int i = threadIdx.x; i < n * cols; i += blockDim.x) {
      const int tt = i / cols, c = i - tt * cols;
      v_sh[i] =
          c0 + c < Dv ? A.v[(tc + tt) * v_stride + static_cast<int64_t>(h) * Dv + c0 + c] : 0.0f;
    }
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      a_sh[i] = expf(A.g[(tc + i) * Hv + h]);
      b_sh[i] = A.beta[(tc + i) * Hv + h];
    }
    __syncthreads();
    for (int tt = 0; tt < n; ++tt) {
      const int64_t t = tc + tt;
      const float* qs = qk_sh + tt * 2 * Dk;
      const float* ks = qs + Dk;
      const float a = a_sh[tt], bt = b_sh[tt];
      const float vt = v_sh[tt * cols + threadIdx.x / kParts];
      float o;
      if constexpr (kFull) {
        o = delta_token_full(col, qs, ks, i0, a, bt, vt);
      } else {
        float kp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int j = 0; j < kRowsPerPart; ++j) {
          const int i = i0 + j;
          if (j < rows && i < Dk) {
            col[j] *= a;
            kp[j % 4] += ks[i] * col[j];
          }
        }
        const float delta = bt * (vt - column_sum(kp));
        float op[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int j = 0; j < kRowsPerPart; ++j) {
          const int i = i0 + j;
          if (j < rows && i < Dk) {
            col[j] += ks[i] * delta;
            op[j % 4] += qs[i] * col[j];
          }
        }
        o = column_sum(op);
      }
      if (A.steps != nullptr && active) {
        float* step = A.steps + (t * Hv + h) * state_size;
#pragma unroll
        for (int j = 0; j < kRowsPerPart; ++j) {
          const int i = i0 + j;
          if (kFull || (j < rows && i < Dk)) step[static_cast<int64_t>(i) * Dv + d] = col[j];
        }
      }
      if (active && part == 0) A.out[t * v_stride + static_cast<int64_t>(h) * Dv + d] = o;
    }
  }
  if (active) {
#pragma unroll
    for (int j = 0; j < kRowsPerPart; ++j) {
      const int i = i0 + j;
      if (j < rows && i < Dk) S[static_cast<int64_t>(i) * Dv + d] = col[j];
    }
  }
}

// Decode: one token per sequence, k_dim == kRegDk, Dv % 4 == 0 and 16-byte aligned rows, no
// per-token states. At 64 sequences a step streams 400 MB of state (read and written) through
// this kernel: more than the weights. A thread holds 4 columns of 8 rows (rows rg + 16j, j < 8)
// in float4 registers; the block's 16 row groups rg cover the head's 128 rows. kCols = 128 (Dv
// == 128): a block per head, warp w is row group w and its lanes one whole 512-byte row, so the
// block's 16 warps load and store 16 consecutive rows (8 KB) at a time. kCols = 32 (other Dv):
// block z owns columns [32z, 32z + 32), a warp four row groups of 128-byte segments. At 64
// sequences on the H100 (PERFORMANCE.md, S53): 144 us a launch (2.79 TB/s, a flat copy of the
// state 143 us) for kCols = 128, 156 us for kCols = 32, 184-188 us for the column-per-thread
// form (32 four-byte loads a thread, each warp's load 32 bytes of four lines), which
// delta_rule_parts_kernel keeps. The column sums k . S[:,d] and q . S[:,d] add a thread's 8 rows
// in order, then the row groups of the warp (shuffles, kCols = 32), then the warps in order
// (shared memory). The state loads before the wait: it was last written by this layer's
// previous step, and every kernel before the one this launch depends on has completed once this
// one starts (each waits before it lets its dependents launch). 64 registers, no spills: 2
// blocks of 512 or 8 of 128 threads per multiprocessor.
constexpr int kDecodeRowGroups = 16;                    // row groups of a block
constexpr int kDecodeRows = kRegDk / kDecodeRowGroups;  // rows per thread (8)
template <int kCols>  // columns per block: 32 (128 threads) or 128 (512 threads)
__global__ void __launch_bounds__(4 * kCols, 1024 / (4 * kCols))
    delta_rule_decode_kernel(DeltaArgs A) {
  constexpr int kRowLanes = kCols / 4;                    // lanes sharing a row (4 columns each)
  constexpr int kWarps = 4 * kCols / 32;                  // 4 or 16
  constexpr int kWarpGroups = kDecodeRowGroups / kWarps;  // row groups per warp: 4 or 1
  __shared__ __align__(16) float qk[2 * kRegDk];          // q_t, k_t of the block's key head
  __shared__ __align__(16) float4 red[2][kWarps][kRowLanes];  // per warp: kS, then o
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, cg = lane % kRowLanes;
  const int rg = warp * kWarpGroups + lane / kRowLanes;  // rows rg + kDecodeRowGroups * j
  const int s = blockIdx.x, h = blockIdx.y, d = blockIdx.z * kCols + 4 * cg;  // first column
  const int Hv = A.st.v_heads, Hk = A.st.k_heads;
  const int Dv = kCols == kRegDk ? kRegDk : A.st.v_dim;  // constant offsets for a whole head
  const int kh = h / (Hv / Hk);
  // All four columns (Dv % 4 == 0); a whole head a block only where Dv == kCols.
  const bool active = kCols == kRegDk || d < Dv;
  // The thread's first element: row rg, column d of the head's state.
  float* S = A.st.ssm + (static_cast<int64_t>(A.slots[s]) * Hv + h) * kRegDk * Dv + d + rg * Dv;
  const int row_step = kDecodeRowGroups * Dv;  // floats between a thread's rows
  float4 c[kDecodeRows];
#pragma unroll
  for (int j = 0; j < kDecodeRows; ++j) {
    c[j] = active ? *reinterpret_cast<const float4*>(S + j * row_step)
                  : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  pdl_begin();
  const int64_t t = A.seqs.cu_seqlens[s];
  if (A.seqs.cu_seqlens[s + 1] <= t) return;  // no token: the state stays as it is
  const int64_t qk_at = t * static_cast<int64_t>(Hk) * kRegDk + static_cast<int64_t>(kh) * kRegDk;
  if (threadIdx.x < 2 * kRegDk / 4) {  // 16-byte words of q then k
    const int w = threadIdx.x % (kRegDk / 4);
    const float* src = threadIdx.x < kRegDk / 4 ? A.q : A.k;
    reinterpret_cast<float4*>(qk)[threadIdx.x] = reinterpret_cast<const float4*>(src + qk_at)[w];
  }
  const int64_t v_at = (t * Hv + h) * Dv + d;  // v_t and o_t: [tokens, Hv, Dv]
  const float a = expf(A.g[t * Hv + h]), bt = A.beta[t * Hv + h];
  const float4 vt =
      active ? *reinterpret_cast<const float4*>(A.v + v_at) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float* const out = A.out + v_at;
  __syncthreads();
  const auto block_sum = [&](float4 p, float4(&buf)[kWarps][kRowLanes]) {
#pragma unroll
    for (int m = kRowLanes; m < 32; m *= 2) {
      p.x += __shfl_xor_sync(0xffffffffu, p.x, m), p.y += __shfl_xor_sync(0xffffffffu, p.y, m);
      p.z += __shfl_xor_sync(0xffffffffu, p.z, m), p.w += __shfl_xor_sync(0xffffffffu, p.w, m);
    }
    if (lane < kRowLanes) buf[warp][cg] = p;
    __syncthreads();
    float4 r = buf[0][cg];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) {
      const float4 x = buf[w][cg];
      r.x += x.x, r.y += x.y, r.z += x.z, r.w += x.w;
    }
    return r;
  };
  float4 p = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int j = 0; j < kDecodeRows; ++j) {
    const float kj = qk[kRegDk + kDecodeRowGroups * j + rg];
    c[j].x *= a, c[j].y *= a, c[j].z *= a, c[j].w *= a;
    p.x += kj * c[j].x, p.y += kj * c[j].y, p.z += kj * c[j].z, p.w += kj * c[j].w;
  }
  const float4 ks = block_sum(p, red[0]);
  const float4 dl =
      make_float4(bt * (vt.x - ks.x), bt * (vt.y - ks.y), bt * (vt.z - ks.z), bt * (vt.w - ks.w));
  float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int j = 0; j < kDecodeRows; ++j) {
    const float kj = qk[kRegDk + kDecodeRowGroups * j + rg], qj = qk[kDecodeRowGroups * j + rg];
    c[j].x += kj * dl.x, c[j].y += kj * dl.y, c[j].z += kj * dl.z, c[j].w += kj * dl.w;
    o.x += qj * c[j].x, o.y += qj * c[j].y, o.z += qj * c[j].z, o.w += qj * c[j].w;
  }
  if (active) {
#pragma unroll
    for (int j = 0; j < kDecodeRows; ++j) {
      *reinterpret_cast<float4*>(S + j * row_step) = c[j];
    }
  }
  o = block_sum(o, red[1]);
  if (active && threadIdx.x < kRowLanes) *reinterpret_cast<float4*>(out) = o;
}

}  // namespace
}  // namespace tokenmill::cuda

namespace tokenmill {

void CudaBackend::conv1d_silu(const GDNStateView& st, const SeqLayout& seqs, const int32_t* slots,
                              const float* x, const float* weight, float* out) {
  TM_CUDA_REQUIRE(x != out, "conv1d_silu cannot run in place");
  TM_CUDA_REQUIRE(st.kernel >= 2 && st.kernel <= 16, "conv1d_silu: kernel must be in 2..16");
  TM_CUDA_REQUIRE(seqs.n_seqs <= 65535, "conv1d_silu: too many sequences");
  if (seqs.n_seqs <= 0 || st.channels <= 0) return;
  const dim3 grid(cuda::blocks_for(st.channels, 128), static_cast<unsigned>(seqs.n_seqs));
  const int64_t tiles = (int64_t{seqs.n_tokens} + cuda::kConvRows - 1) / cuda::kConvRows;
  if (st.kernel == 4 && seqs.max_seq_tokens > cuda::kConvRows && tiles <= 65535) {
    // Prefill: rows in parallel, then the states.
    const dim3 rgrid(cuda::blocks_for(st.channels, 128), static_cast<unsigned>(tiles));
    cuda::launch_pdl(cuda::conv4_silu_rows_kernel, rgrid, 128, 0, stream_, st, seqs, slots, x,
                     weight, out);
    TM_CUDA_LAUNCHED();
    cuda::launch_pdl(cuda::conv_state_update_kernel, grid, 128, 0, stream_, st, seqs, slots, x);
  } else if (st.kernel == 4) {
    cuda::launch_pdl(cuda::conv1d_silu_kernel<3>, grid, 128, 0, stream_, st, seqs, slots, x, weight,
                     out);
  } else {
    cuda::launch_pdl(cuda::conv1d_silu_kernel<0>, grid, 128, 0, stream_, st, seqs, slots, x, weight,
                     out);
  }
  TM_CUDA_LAUNCHED();
}

size_t CudaBackend::gdn_ws_bytes(const GDNStateView& st, const SeqLayout& seqs, bool step_states) {
  if (step_states || seqs.max_seq_tokens < kChunkedDeltaMinRows) return 0;
  return cuda::delta_rule_chunked_ws_floats(st, seqs) * sizeof(float);
}

void CudaBackend::gated_delta_rule(const GDNStateView& st, const SeqLayout& seqs,
                                   const int32_t* slots, const float* q, const float* k,
                                   const float* v, const float* g, const float* beta, float* out,
                                   float* step_states) {
  TM_CUDA_REQUIRE(st.k_heads > 0 && st.v_heads % st.k_heads == 0,
                  "gated_delta_rule: value heads must be a multiple of key heads");
  TM_CUDA_REQUIRE(st.v_dim >= 1 && st.v_dim <= 1024 && st.k_dim >= 1 && st.k_dim <= 4096,
                  "gated_delta_rule: v_dim must be in 1..1024 and k_dim in 1..4096");
  TM_CUDA_REQUIRE(st.v_heads <= 65535, "gated_delta_rule: too many value heads");
  if (seqs.n_seqs <= 0) return;
  // Prefill chunks (a sequence of 64 rows or more, no per-token states wanted): the chunked
  // form (cuda_gdn_chunked.cu), as the CPU backend switches at 64 rows.
  if (const size_t bytes = gdn_ws_bytes(st, seqs, step_states != nullptr); bytes > 0) {
    auto* ws =
        static_cast<float*>(grow_workspace(&gdn_ws_, &gdn_ws_bytes_, bytes, "chunked delta rule"));
    if (cuda::launch_delta_rule_chunked(stream_, st, seqs, slots, q, k, v, g, beta, out, ws,
                                        bytes / sizeof(float),
                                        prefill_precision_ == PrefillPrecision::kFast)) {
      return;
    }
  }
  cuda::DeltaArgs a{st, seqs, slots, q, k, v, g, beta, out, step_states};
  const dim3 grid(static_cast<unsigned>(seqs.n_seqs), static_cast<unsigned>(st.v_heads));
  const int threads = (st.v_dim + 31) / 32 * 32;
  const size_t smem = static_cast<size_t>(2 * st.k_dim) * sizeof(float);
  if (st.k_dim <= cuda::kRegDk && st.v_dim * cuda::kParts <= cuda::kPartsMaxThreads) {
    // Columns are independent: a head's columns spread over blocks of 128 threads (32 columns),
    // so a decode step's 48 heads fill 192 multiprocessor slots instead of 48.
    const int pthreads =
        std::min((st.v_dim * cuda::kParts + 31) / 32 * 32, cuda::kPartsBlockThreads);
    const int col_blocks = (st.v_dim * cuda::kParts + pthreads - 1) / pthreads;
    const dim3 pgrid(grid.x, grid.y, static_cast<unsigned>(col_blocks));
    const size_t psmem = cuda::parts_smem_bytes(st.k_dim, pthreads / cuda::kParts);
    const auto al16 = [](const float* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    const bool full = st.k_dim == cuda::kRegDk && al16(q) && al16(k);
    if (full && seqs.max_seq_tokens == 1 && step_states == nullptr && st.v_dim % 4 == 0 &&
        al16(st.ssm) && al16(v) && al16(out)) {
      if (st.v_dim == cuda::kRegDk) {  // a whole head a block
        cuda::launch_pdl(cuda::delta_rule_decode_kernel<128>, grid, 512, 0, stream_, a);
      } else {
        const dim3 dgrid(grid.x, grid.y, static_cast<unsigned>((st.v_dim + 31) / 32));
        cuda::launch_pdl(cuda::delta_rule_decode_kernel<32>, dgrid, 128, 0, stream_, a);
      }
    } else if (full) {
      cuda::launch_pdl(cuda::delta_rule_parts_kernel<true>, pgrid, pthreads, psmem, stream_, a);
    } else {
      cuda::launch_pdl(cuda::delta_rule_parts_kernel<false>, pgrid, pthreads, psmem, stream_, a);
    }
  } else {
    cuda::launch_pdl(cuda::delta_rule_kernel, grid, threads, smem, stream_, a);
  }
  TM_CUDA_LAUNCHED();
}

void CudaBackend::gdn_front(const GDNStateView& st, const SeqLayout& seqs, const int32_t* slots,
                            const float* qkv, const float* conv_weight, const float* a,
                            const float* b, const float* a_log, const float* dt_bias,
                            float* conv_out, float* q, float* k, float* v, float* g, float* beta) {
  const int r = st.k_heads > 0 ? st.v_heads / st.k_heads : 0;
  const int64_t nch = 2 * int64_t{st.k_dim} + int64_t{r} * st.v_dim;
  // Fused for decode and verify steps; prefill chunks (long sequences, where one block per key
  // head would walk hundreds of rows) take gdn_front_rows_kernel, or the op-by-op form.
  const bool fused = st.kernel == 4 && r > 0 && st.v_heads % st.k_heads == 0 && nch <= 1024 &&
                     st.k_heads <= 65535 && seqs.n_seqs <= 65535 && seqs.max_seq_tokens <= 16;
  const auto al = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool rows = !fused && st.kernel == 4 && r > 0 && st.v_heads % st.k_heads == 0 &&
                    st.k_dim % 4 == 0 && st.v_dim % 4 == 0 && st.k_dim <= cuda::kFrontMaxDim &&
                    st.v_dim <= cuda::kFrontMaxDim && st.channels % 4 == 0 &&
                    2 * st.k_heads + st.v_heads <= 65535 && seqs.n_seqs <= 65535 && al(qkv) &&
                    al(conv_weight) && al(q) && al(k) && al(v);
  if (rows && seqs.n_tokens > 0) {
    // Prefill: one pass over the rows, then the conv states.
    const cuda::FrontArgs fa{st,    seqs,    slots, qkv, conv_weight, a, b,
                             a_log, dt_bias, q,     k,   v,           g, beta};
    const int64_t block_rows = int64_t{cuda::kFrontRows} * cuda::kFrontWarpRows;
    const dim3 grid(static_cast<unsigned>((seqs.n_tokens + block_rows - 1) / block_rows),
                    static_cast<unsigned>(2 * st.k_heads + st.v_heads));
    const auto kernel = std::max(st.k_dim, st.v_dim) <= 128 ? cuda::gdn_front_rows_kernel<1>
                                                            : cuda::gdn_front_rows_kernel<2>;
    cuda::launch_pdl(kernel, grid, 32 * cuda::kFrontRows, 0, stream_, fa);
    TM_CUDA_LAUNCHED();
    const dim3 sgrid(cuda::blocks_for(st.channels, 128), static_cast<unsigned>(seqs.n_seqs));
    cuda::launch_pdl(cuda::conv_state_update_kernel, sgrid, 128, 0, stream_, st, seqs, slots, qkv);
    TM_CUDA_LAUNCHED();
    return;
  }
  if (!fused) {
    Backend::gdn_front(st, seqs, slots, qkv, conv_weight, a, b, a_log, dt_bias, conv_out, q, k, v,
                       g, beta);
    return;
  }
  if (seqs.n_seqs <= 0) return;
  const cuda::FrontArgs fa{st,    seqs,    slots, qkv, conv_weight, a, b,
                           a_log, dt_bias, q,     k,   v,           g, beta};
  const int threads = std::max<int>(64, static_cast<int>((nch + 31) / 32 * 32));
  const dim3 grid(static_cast<unsigned>(seqs.n_seqs), static_cast<unsigned>(st.k_heads));
  cuda::launch_pdl(cuda::gdn_front_kernel, grid, threads,
                   static_cast<size_t>(2 * st.k_dim) * sizeof(float), stream_, fa);
  TM_CUDA_LAUNCHED();
}

}  // namespace tokenmill
