// The MoE block's front for decode rows (CudaBackend::moe_block): the residual add and norm, the
// router GEMV with the shared expert's gate logit, top-k and the experts' activation digits in
// one launch, where the ops one by one took four (rmsnorm, router GEMV, topk_softmax, the
// digits' preparation: 6-8 us each of a 35B-A3B decode step's critical path, 40 times a step).
//
// One warp per router row (E experts, then the gate logit's row); the warp loads its row's first
// chunks before the dependent-launch wait (weights are constant). Every block then computes the
// normed rows itself into shared memory (a few KB read from L2: cheaper than a launch), writes
// its share of h and of the digits, and dots its rows. The last block to finish (a ticket
// counter, zero between launches) runs top-k, one warp per activation row, while its other warps
// write x += y (no block may write x while another still reads it). Where the experts' 4-bit
// gate/up launch takes the rows, it does both after its wait instead (Q4Picks), and this
// kernel's blocks end once their logits are written: no fence, ticket or last block between
// the logits and the experts' GEMV (H100, 35B-A3B batch 1: 480 -> 492 tok/s).
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv.h"
#include "backend/cuda/cuda_gemv_q4.cuh"

namespace tokenmill::cuda {
namespace {

constexpr int kRouteWarps = 4;
constexpr int kRouteMaxRows = 4;  // activation rows (decode batch) the fused front takes
constexpr int kTopkPerLane = 8;   // experts a lane holds in registers for top-k (256 a warp)
constexpr int kNormPre = 4;       // norm weights (float4) a thread loads before the wait
constexpr size_t kRouteSmemBytes = 40 * 1024;  // dynamic; under the 48 KB that needs no opt-in

struct RouteArgs {
  float* x;
  const float* y;
  const float* norm;
  float* h;
  int n, hidden;
  float eps;
  DevMat router, sgate;
  bool has_sgate;
  float* logits;
  float* shared_logit;
  int experts, k;
  bool renormalize;
  int32_t* ids;
  float* weights;
  Q4Act act;  // act.x null: no digits wanted
  int* ticket;
  // Top-k and x += y left to the experts' gate/up launch (Q4Picks): no ticket, no last block.
  bool picks_later;
};

template <class C>
__global__ void __launch_bounds__(kRouteWarps * 32) moe_route_kernel(RouteArgs a) {
  extern __shared__ float4 route_smem[];
  float* hs = reinterpret_cast<float*>(route_smem);  // [n][hidden] normed rows; then top-k
  __shared__ float red[32];
  __shared__ bool last;
  constexpr int V = C::kValues;
  // Chunks per lane loaded before the wait: a row's first 2,048 values (a 35B-A3B router row).
  constexpr int kPre = 64 / V;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row = static_cast<int>(blockIdx.x) * kRouteWarps + warp;
  const bool has_row = row < a.experts + (a.has_sgate ? 1 : 0);
  // Row `row` of the router, or past its last row the shared expert's gate (one row). Fields
  // picked one by one: a whole DevMat chosen at run time went through local memory.
  const bool gate_row = row >= a.experts;
  const uint8_t* scales = gate_row ? a.sgate.scales : a.router.scales;
  const uint8_t* biases = gate_row ? a.sgate.biases : a.router.biases;
  const int64_t first_group = gate_row ? 0 : row * a.router.groups;
  const int group = gate_row ? a.sgate.group : a.router.group;
  const int sdtype = gate_row ? a.sgate.sdtype : a.router.sdtype;
  const int64_t chunks = a.hidden / V;
  const uint4* wrow = reinterpret_cast<const uint4*>(
      gate_row ? a.sgate.data : a.router.data + row * a.router.row_bytes);
  uint4 pre[kPre];
  [[maybe_unused]] float sc[kPre], bi[kPre];
#pragma unroll
  for (int i = 0; i < kPre; ++i) {
    const int64_t c = lane + 32 * i;
    if (has_row && c < chunks) {
      pre[i] = __ldcs(wrow + c);
      if constexpr (kAffine<C>) {
        const int64_t g = first_group + c * V / group;
        sc[i] = load_sb(sdtype, scales, g);
        bi[i] = load_sb(sdtype, biases, g);
      }
    }
  }
  // The norm's first weights too (a 35B-A3B row: all of them).
  const int64_t n4 = a.hidden / 4;
  const float4* w4 = reinterpret_cast<const float4*>(a.norm);
  float4 wpre[kNormPre];
#pragma unroll
  for (int i = 0; i < kNormPre; ++i) {
    const int64_t j = threadIdx.x + int64_t{i} * blockDim.x;
    if (j < n4) wpre[i] = w4[j];
  }
  pdl_begin();

  // hs = rmsnorm(x + y) * norm per row (rmsnorm_q4d_kernel's arithmetic: (v * inv) * w).
  for (int c = 0; c < a.n; ++c) {
    const float4* x4 = reinterpret_cast<const float4*>(a.x + int64_t{c} * a.hidden);
    const float4* y4 = reinterpret_cast<const float4*>(a.y + int64_t{c} * a.hidden);
    float4* h4 = reinterpret_cast<float4*>(hs + int64_t{c} * a.hidden);
    // The first kNormPre float4s of x and y load together (one L2 round trip: in the loop
    // below, each iteration's loads waited for the store to shared memory before them), then
    // the rest; the sum adds them in the same order either way.
    float4 xv[kNormPre], yv[kNormPre];
#pragma unroll
    for (int i = 0; i < kNormPre; ++i) {
      const int64_t j = threadIdx.x + int64_t{i} * blockDim.x;
      xv[i] = yv[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (j < n4) {
        xv[i] = x4[j];
        if (a.y != nullptr) yv[i] = y4[j];
      }
    }
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < kNormPre; ++i) {
      const int64_t j = threadIdx.x + int64_t{i} * blockDim.x;
      if (j < n4) {
        float4 v = xv[i];
        if (a.y != nullptr)
          v = make_float4(v.x + yv[i].x, v.y + yv[i].y, v.z + yv[i].z, v.w + yv[i].w);
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        h4[j] = v;
      }
    }
    for (int64_t j = threadIdx.x + int64_t{kNormPre} * blockDim.x; j < n4; j += blockDim.x) {
      float4 v = x4[j];
      if (a.y != nullptr) {
        const float4 u = y4[j];
        v = make_float4(v.x + u.x, v.y + u.y, v.z + u.z, v.w + u.w);
      }
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
      h4[j] = v;
    }
    const float inv = 1.0f / sqrtf(block_sum(ss, red) / static_cast<float>(a.hidden) + a.eps);
#pragma unroll
    for (int i = 0; i < kNormPre; ++i) {
      const int64_t j = threadIdx.x + int64_t{i} * blockDim.x;
      if (j < n4) {
        const float4 v = h4[j], w = wpre[i];
        h4[j] = make_float4(v.x * inv * w.x, v.y * inv * w.y, v.z * inv * w.z, v.w * inv * w.w);
      }
    }
    for (int64_t j = threadIdx.x + int64_t{kNormPre} * blockDim.x; j < n4; j += blockDim.x) {
      const float4 v = h4[j], w = w4[j];
      h4[j] = make_float4(v.x * inv * w.x, v.y * inv * w.y, v.z * inv * w.z, v.w * inv * w.w);
    }
  }
  __syncthreads();

  // This block's share of h and of its digits: one thread per 8-value word, whole warps in
  // the loop (q4d_store_word shuffles within a group's lanes).
  const int64_t words = a.hidden / 8, total = int64_t{a.n} * words;
  for (int64_t base = int64_t{blockIdx.x} * blockDim.x; base < total;
       base += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = base + threadIdx.x;
    const bool live = i < total;
    const int64_t c = live ? i / words : 0, j = live ? i % words : 0;
    const float4* h4 = reinterpret_cast<const float4*>(hs + c * a.hidden);
    const float4 u = h4[2 * j], v = h4[2 * j + 1];
    if (live) {
      float4* g4 = reinterpret_cast<float4*>(a.h + c * a.hidden);
      g4[2 * j] = u;
      g4[2 * j + 1] = v;
    }
    if (a.act.x != nullptr) {
      const float vals[8] = {u.x, u.z, v.x, v.z, u.y, u.w, v.y, v.w};  // nibble order
      q4d_store_word(vals, live, c, j, a.hidden, a.act.group, a.act);
    }
  }

  // This warp's router row against each normed row.
  float acc[kRouteMaxRows] = {};
  const auto dot = [&](const uint4& wq, float s, float b, int64_t c) {
    float wv[V];
    C::decode(wq, wv);
#pragma unroll
    for (int i = 0; i < kRouteMaxRows; ++i) {
      if (i >= a.n) break;
      const float4* xp = reinterpret_cast<const float4*>(hs + int64_t{i} * a.hidden + c * V);
      float d = 0.0f, xsum = 0.0f;
#pragma unroll
      for (int q = 0; q < V / 4; ++q) {
        const float4 t = xp[q];
        d = fmaf(wv[4 * q], t.x, d);
        d = fmaf(wv[4 * q + 1], t.y, d);
        d = fmaf(wv[4 * q + 2], t.z, d);
        d = fmaf(wv[4 * q + 3], t.w, d);
        if constexpr (kAffine<C>) xsum += (t.x + t.y) + (t.z + t.w);
      }
      if constexpr (kAffine<C>) {
        acc[i] += s * d + b * xsum;
      } else {
        acc[i] += d;
      }
    }
  };
  if (has_row) {
#pragma unroll
    for (int p = 0; p < kPre; ++p) {
      const int64_t c = lane + 32 * p;
      if (c < chunks) dot(pre[p], sc[p], bi[p], c);
    }
    for (int64_t c = lane + 32 * kPre; c < chunks; c += 32) {
      float s = 0.0f, b = 0.0f;
      if constexpr (kAffine<C>) {
        const int64_t g = first_group + c * V / group;
        s = load_sb(sdtype, scales, g);
        b = load_sb(sdtype, biases, g);
      }
      dot(__ldcs(wrow + c), s, b, c);
    }
#pragma unroll
    for (int i = 0; i < kRouteMaxRows; ++i) {
      if (i >= a.n) break;
      const float v = warp_sum(acc[i]);
      if (lane == 0) {
        if (row < a.experts) {
          a.logits[int64_t{i} * a.experts + row] = v;
        } else {
          a.shared_logit[i] = v;
        }
      }
    }
  }

  if (a.picks_later) return;
  // The last block: every logit is written and every block has read x.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(a.ticket, 1) == static_cast<int>(gridDim.x) - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (warp < a.n) {
    const float* l = a.logits + int64_t{warp} * a.experts;
    int32_t* ids = a.ids + int64_t{warp} * a.k;
    float* weights = a.weights + int64_t{warp} * a.k;
    if (a.experts <= 32 * kTopkPerLane) {
      float v[kTopkPerLane];
#pragma unroll
      for (int u = 0; u < kTopkPerLane; ++u) {
        const int e = lane + 32 * u;
        v[u] = e < a.experts ? __ldcg(l + e) : -INFINITY;
      }
      topk_softmax_warp_regs(v, a.experts, a.k, a.renormalize, ids, weights);
    } else {
      float* p = hs + int64_t{warp} * a.experts;  // the normed rows are no longer read
      for (int e = lane; e < a.experts; e += 32) p[e] = __ldcg(l + e);
      __syncwarp();
      topk_softmax_warp(p, a.experts, a.k, a.renormalize, ids, weights);
    }
  }
  // x += y by the warps with no row to pick for (at kRouteWarps rows, all of them after).
  const int first = a.n < kRouteWarps ? a.n * 32 : 0;
  if (a.y != nullptr && static_cast<int>(threadIdx.x) >= first) {
    for (int64_t i = threadIdx.x - first; i < int64_t{a.n} * n4; i += blockDim.x - first) {
      float4* x4 = reinterpret_cast<float4*>(a.x) + i;
      const float4 v = *x4, u = reinterpret_cast<const float4*>(a.y)[i];
      *x4 = make_float4(v.x + u.x, v.y + u.y, v.z + u.z, v.w + u.w);
    }
  }
  if (threadIdx.x == 0) *a.ticket = 0;  // for the next launch
}

}  // namespace
}  // namespace tokenmill::cuda

namespace tokenmill {

void CudaBackend::moe_block(float* x, const float* y, int64_t n, int hidden,
                            const MoeBlockWeights& b, const MoeBlockScratch& s, float* out) {
  const auto al = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const cuda::DevMat mr = cuda::make_devmat(*b.router, 0);
  const cuda::GemvKind kind = cuda::fast_gemv_kind(mr);
  const bool shared = b.has_shared();
  cuda::DevMat ms;
  bool fits = n >= 1 && n <= cuda::kRouteMaxRows && hidden % 16 == 0 && mr.cols == hidden &&
              !b.router->experts &&
              (kind == cuda::GemvKind::kBf16 || kind == cuda::GemvKind::kQ8) && b.k >= 1 &&
              b.k <= mr.rows && al(x) && al(y) && al(b.norm) && al(s.h) &&
              static_cast<size_t>(n) * std::max<int64_t>(hidden, mr.rows) * sizeof(float) <=
                  cuda::kRouteSmemBytes;
  if (fits && shared) {
    ms = cuda::make_devmat(*b.shared_expert_gate, 0);
    fits = ms.rows == 1 && ms.cols == hidden && !b.shared_expert_gate->experts &&
           cuda::fast_gemv_kind(ms) == kind;
  }
  if (!fits) {
    Backend::moe_block(x, y, n, hidden, b, s, out);
    return;
  }
  // The experts' digits, when the 4-bit slot kernels will read them (moe_experts checks the
  // same layout before it takes them).
  const cuda::DevMat mg = cuda::make_devmat(*b.gate, 0);
  const bool digits = cuda::q4_mma_eligible(mg) && hidden % mg.group == 0 &&
                      cuda::q4_act_bytes(n, hidden, mg.group) <= kGemvWorkspaceBytes;
  cuda::RouteArgs a{};
  a.x = x, a.y = y, a.norm = b.norm, a.h = s.h;
  a.n = static_cast<int>(n), a.hidden = hidden, a.eps = b.eps;
  a.router = mr, a.sgate = shared ? ms : mr, a.has_sgate = shared;
  a.logits = s.logits, a.shared_logit = s.shared_logit;
  a.experts = static_cast<int>(mr.rows), a.k = b.k, a.renormalize = b.renormalize;
  a.ids = s.ids, a.weights = s.weights;
  if (digits) {
    a.act = cuda::q4_act_layout(n, hidden, mg.group, cuda::Q4Operands::kDigits, gemv_ws_);
  }
  a.ticket = gemv_ws_.ticket;
  // The picks and the residual add go to the gate/up launch (moe_experts falls back to
  // topk_softmax and add where it takes another path).
  cuda::Q4Picks picks;
  a.picks_later = digits && a.experts <= cuda::kQ4PickMaxExperts && a.k <= cuda::kQ4PickMaxK &&
                  n <= cuda::kQ4PickMaxTokens;
  if (a.picks_later) {
    picks.logits = s.logits, picks.experts = a.experts, picks.tokens = a.n;
    picks.renormalize = b.renormalize;
    picks.ids = s.ids, picks.weights = s.weights;
    picks.x = x, picks.y = y, picks.resid_floats = n * hidden;
  }
  const int rows = a.experts + (shared ? 1 : 0);
  const dim3 grid(static_cast<unsigned>((rows + cuda::kRouteWarps - 1) / cuda::kRouteWarps));
  const size_t smem = static_cast<size_t>(n) * std::max(hidden, a.experts) * sizeof(float);
  if (kind == cuda::GemvKind::kBf16) {
    cuda::launch_pdl(cuda::moe_route_kernel<cuda::Bf16Chunk>, grid, dim3(cuda::kRouteWarps * 32),
                     smem, stream_, a);
  } else {
    cuda::launch_pdl(cuda::moe_route_kernel<cuda::Q8Chunk>, grid, dim3(cuda::kRouteWarps * 32),
                     smem, stream_, a);
  }
  TM_CUDA_LAUNCHED();
  const SharedExpert se{b.shared_gate, b.shared_up, b.shared_down, s.shared_logit};
  moe_experts(s.h, n, b.k, s.ids, s.weights, *b.gate, *b.up, *b.down, shared ? &se : nullptr, out,
              s.scratch, digits ? &a.act : nullptr, s.defer, a.picks_later ? &picks : nullptr);
}

}  // namespace tokenmill
