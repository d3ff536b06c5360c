// Decode GEMV for MLX 4-bit weights with few activation rows (1..kQ4DigitMaxRows, and one row
// per slot for MoE experts), on the integer tensor cores: mma.sync m16n8k32 with u8 weights,
// s8 activation digits and exact s32 accumulation.
//
// Why: batch-1 decode reads each weight byte once and does almost nothing with it, so the
// kernel is bound by instructions per byte, not by the tensor cores. A word of 8 nibbles becomes
// two u8x4 operands in 3 integer instructions (w & 0x0F0F0F0F holds nibbles 0, 2, 4, 6 and
// (w >> 4) & 0x0F0F0F0F nibbles 1, 3, 5, 7) where the F16 kernel (cuda_gemv_q4.cu) needs 9 and
// twice the mmas; its scaling and combining are per group either way. A lab measurement on the
// H200 (17408x5120, group 64): 36% -> 66% of the read bandwidth.
//
// The activations, in 4 signed 8-bit digits per group: each group of G values is scaled by 2^e
// so its largest magnitude lies in [2^29, 2^30) and rounded to integers q (exact for every value
// within 2^-24 of the group's largest, i.e. F32 resolution), then q = d0*2^24 + d1*2^16 +
// d2*2^8 + d3 with balanced digits in [-128, 127] (|d0| <= 64). The mma's 8 columns carry two
// activation rows' 4 digits; the C fragment gives lane t the digits 2(t&1), 2(t&1)+1 of row t/2
// of its column block: it accumulates s*2^-e*(256*c0 + c1) per group (plus the affine bias term
// b*sum(x) on odd lanes), and the lane pair combines at the end with weights 2^16 and 1. Integer
// sums per group are exact (64 x 15 x 128 < 2^17), so the result is as accurate as an F32 dot
// product. A scale per group (not per row) makes the preparation one pass with no row-wide
// reduction: one thread per 8 values, a group's threads in one warp.
#include <cuda_runtime.h>

#include <cfloat>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv_q4.cuh"
#include "backend/cuda/cuda_gemv_q4d.cuh"

namespace tokenmill::cuda {
namespace {

constexpr int kPrepThreads = 256;
// Fewest groups per stream-K warp: a small matrix (a MoE expert's 512x2048) split one group per
// warp spent its time in the fixup, not in reading. Measured on the H200 (35B-A3B 4-bit decode):
// 1 -> 170 tok/s, 4 -> 194, 8 -> 222 (16 was worse in an earlier sweep: long ranges keep too
// few loads in flight). With local fixups (cuda_streamk.cuh), on an H100: 8 -> 452, 6 -> 448,
// 4 -> 446; the 27B 137.3 at 8 and 4 alike.
constexpr int kQ4MinSteps = 8;
// Groups of its range past its first two buffers that each warp asks of L2 before its wait
// (Q4TileStream::run), every launch: the kernel before (a norm, the GDN mixer, the attention's
// combine) leaves the DRAM idle for 4-7 us. Measured: H100 (S49), 8 groups in launches of at
// least 14 MiB, 27B q4g64 decode +0.9% (its 15 MiB output projections, 12 groups a warp, take
// the rest of their ranges from L2), while 8 groups in the 35B-A3B's small launches (4-12 MiB,
// 8-11 groups a warp) lost 0.2%. H200 (S50, alternating runs against that rule): 4 groups in
// every launch, 35B-A3B 600.0 -> 604.4 tok/s (+0.7%, four rounds), 27B 176.8 -> 177.6 (+0.4%);
// 8 or 2 groups in every launch +0.2%.
constexpr int kQ4L2Groups = 4;

// One thread per 8-value word of the [rows, K] activations (q4d_store_word).
__global__ void __launch_bounds__(kPrepThreads)
    q4d_prepare_kernel(const float* __restrict__ x, const float* __restrict__ up, bool sigmoid_gate,
                       int64_t ldx, int64_t rows, int64_t K, int group, Q4Act act) {
  // The GEMV that follows starts loading its weights now; it waits for this kernel's
  // completion before it reads the activations.
  pdl_begin();
  const int64_t words = K / 8;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  // Whole warps stay in the loop body (shuffles); a group's G/8 threads are aligned lanes.
  const bool live = i < rows * words;
  const int64_t c = live ? i / words : 0, j = live ? i % words : 0;
  float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b = a;
  if (live) {
    const float4* x4 = reinterpret_cast<const float4*>(x + c * ldx);
    a = x4[2 * j];
    b = x4[2 * j + 1];
    if (up != nullptr && sigmoid_gate) {  // the gated attention output: x * sigmoid(gate)
      const float4* u4 = reinterpret_cast<const float4*>(up + c * ldx);
      const float4 ua = u4[2 * j], ub = u4[2 * j + 1];
      a = make_float4(a.x * sigmoid_f(ua.x), a.y * sigmoid_f(ua.y), a.z * sigmoid_f(ua.z),
                      a.w * sigmoid_f(ua.w));
      b = make_float4(b.x * sigmoid_f(ub.x), b.y * sigmoid_f(ub.y), b.z * sigmoid_f(ub.z),
                      b.w * sigmoid_f(ub.w));
    } else if (up != nullptr) {  // an MLP down projection's input: silu(gate) * up
      const float4* u4 = reinterpret_cast<const float4*>(up + c * ldx);
      const float4 ua = u4[2 * j], ub = u4[2 * j + 1];
      a = make_float4(silu_f(a.x) * ua.x, silu_f(a.y) * ua.y, silu_f(a.z) * ua.z,
                      silu_f(a.w) * ua.w);
      b = make_float4(silu_f(b.x) * ub.x, silu_f(b.y) * ub.y, silu_f(b.z) * ub.z,
                      silu_f(b.w) * ub.w);
    }
  }
  const float v[8] = {a.x, a.z, b.x, b.z, a.y, a.w, b.y, b.w};  // nibbles 0,2,4,6,1,3,5,7
  q4d_store_word(v, live, c, j, K, group, act);
}

// (x += y when y is given;) h = rmsnorm(x) * w, and h's digits for the 4-bit GEMVs that read
// it next: the norm that starts a block and the preparation of its projections in one kernel.
// Block per row, thread j owns word j (8 values); the arithmetic is rmsnorm_vec_kernel's.
// kCombine: the residual is a deferred MoE output (cr) instead of y; a separate instance, so
// the dense models' norm carries none of the combine's code. Its terms load in batches of
// kCombineBatch, every load of a batch issued before its sums (at Qwen3.5's eight experts and
// the shared one, one L2 round trip instead of one per unrolled group of the loop); the batch's
// registers are why it runs at most kCombineMaxWords threads.
constexpr int kCombineBatch = 9;

template <bool kCombine>
__global__ void __launch_bounds__(kCombine ? kCombineMaxWords : 1024)
    rmsnorm_q4d_kernel(float* x, const float* y, CombineRows cr, const float* __restrict__ w,
                       float* h, int64_t K, float eps, int group, Q4Act act) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x, words = K / 8, j = threadIdx.x;
  const bool live = j < words;
  float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b = a, wa = a, wb = a;
  // The norm's weights are constant: they load while the kernel before still runs (read after
  // the wait, they were a DRAM round trip on the step's critical path).
  if (live) {
    const float4* w4 = reinterpret_cast<const float4*>(w);
    wa = w4[2 * j], wb = w4[2 * j + 1];
  }
  pdl_begin();
  float4* x4 = reinterpret_cast<float4*>(x + r * K);
  if (live) {
    a = x4[2 * j];
    b = x4[2 * j + 1];
    if (y != nullptr) {
      const float4* y4 = reinterpret_cast<const float4*>(y + r * K);
      const float4 ya = y4[2 * j], yb = y4[2 * j + 1];
      a = make_float4(a.x + ya.x, a.y + ya.y, a.z + ya.z, a.w + ya.w);
      b = make_float4(b.x + yb.x, b.y + yb.y, b.z + yb.z, b.w + yb.w);
    } else if (kCombine) {
      // The MoE combine (moe_combine_kernel's order), then the residual add as with y.
      float ya[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
      const float* d = cr.rows + r * cr.per_token * K + 8 * j;
      const bool gated = cr.per_token > cr.k;
      const int terms = gated ? cr.k + 1 : cr.k;
      const float shared_w = gated ? sigmoid_f(cr.gate_logit[r]) : 0.0f;
      for (int s0 = 0; s0 < terms; s0 += kCombineBatch) {
        float wt[kCombineBatch] = {};
        float4 u[kCombineBatch] = {}, v[kCombineBatch] = {};
#pragma unroll
        for (int q = 0; q < kCombineBatch; ++q) {
          const int s = s0 + q;
          if (s < terms) {
            wt[q] = s < cr.k ? cr.weights[r * cr.k + s] : shared_w;
            u[q] = reinterpret_cast<const float4*>(d + s * K)[0];
            v[q] = reinterpret_cast<const float4*>(d + s * K)[1];
          }
        }
#pragma unroll
        for (int q = 0; q < kCombineBatch; ++q) {
          if (s0 + q < terms) {
            ya[0] += wt[q] * u[q].x, ya[1] += wt[q] * u[q].y, ya[2] += wt[q] * u[q].z;
            ya[3] += wt[q] * u[q].w, ya[4] += wt[q] * v[q].x, ya[5] += wt[q] * v[q].y;
            ya[6] += wt[q] * v[q].z, ya[7] += wt[q] * v[q].w;
          }
        }
      }
      a = make_float4(a.x + ya[0], a.y + ya[1], a.z + ya[2], a.w + ya[3]);
      b = make_float4(b.x + ya[4], b.y + ya[5], b.z + ya[6], b.w + ya[7]);
    }
  }
  float ss = a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
  ss += b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
  if ((kCombine || y != nullptr) && live) {
    x4[2 * j] = a;
    x4[2 * j + 1] = b;
  }
  const float inv = 1.0f / sqrtf(block_sum(ss, red) / static_cast<float>(K) + eps);
  if (live) {
    a = make_float4(a.x * inv * wa.x, a.y * inv * wa.y, a.z * inv * wa.z, a.w * inv * wa.w);
    b = make_float4(b.x * inv * wb.x, b.y * inv * wb.y, b.z * inv * wb.z, b.w * inv * wb.w);
    float4* h4 = reinterpret_cast<float4*>(h + r * K);
    h4[2 * j] = a;
    h4[2 * j + 1] = b;
  }
  const float v[8] = {a.x, a.z, b.x, b.z, a.y, a.w, b.y, b.w};
  q4d_store_word(v, live, r, j, K, group, act);
}

// g = w * (o * inv) * silu(z) per head (rmsnorm_gated_kernel's arithmetic, the head's sum of
// squares in lane shuffles), and g's digits. Block per row of heads * dim values, thread j owns
// word j; a head's dim / 8 words are aligned lanes of one warp.
__global__ void __launch_bounds__(1024)
    rmsnorm_gated_q4d_kernel(const float* __restrict__ o, const float* __restrict__ z,
                             const float* __restrict__ w, float* normed, int dim, int64_t K,
                             float eps, int group, Q4Act act) {
  const int64_t r = blockIdx.x, words = K / 8, j = threadIdx.x;
  const int lanes = dim / 8;
  const bool live = j < words;
  float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b = a, za = a, zb = a, wa = a, wb = a;
  if (live) {  // constant weights before the wait (rmsnorm_q4d_kernel)
    const float4* w4 = reinterpret_cast<const float4*>(w) + 2 * (j % lanes);
    wa = w4[0], wb = w4[1];
  }
  pdl_begin();
  if (live) {
    const float4* o4 = reinterpret_cast<const float4*>(o + r * K);
    const float4* z4 = reinterpret_cast<const float4*>(z + r * K);
    a = o4[2 * j], b = o4[2 * j + 1], za = z4[2 * j], zb = z4[2 * j + 1];
  }
  float ss = a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
  ss += b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
  for (int s = 1; s < lanes; s <<= 1) ss += __shfl_xor_sync(0xffffffffu, ss, s);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
  if (live) {
    a = make_float4(wa.x * (a.x * inv) * silu_f(za.x), wa.y * (a.y * inv) * silu_f(za.y),
                    wa.z * (a.z * inv) * silu_f(za.z), wa.w * (a.w * inv) * silu_f(za.w));
    b = make_float4(wb.x * (b.x * inv) * silu_f(zb.x), wb.y * (b.y * inv) * silu_f(zb.y),
                    wb.z * (b.z * inv) * silu_f(zb.z), wb.w * (b.w * inv) * silu_f(zb.w));
    float4* g4 = reinterpret_cast<float4*>(normed + r * K);
    g4[2 * j] = a;
    g4[2 * j + 1] = b;
  }
  const float v[8] = {a.x, a.z, b.x, b.z, a.y, a.w, b.y, b.w};
  q4d_store_word(v, live, r, j, K, group, act);
}

// kSlots: MoE slots (Q4Slots); a separate instantiation so the plain decode GEMV carries none
// of the slot arithmetic in its registers (with it, the CB = 1 kernel spilled 84 bytes).
template <int G, int CB, int U, int ST, bool kSlots>
__global__ void __launch_bounds__(128, CB == 1 ? 5 : 4)
    q4d_gemv_kernel(GemvJobs jobs, Q4Act act, int n, Q4Slots slots_arg, StreamK sk,
                    int64_t tiles_per_slot, int l2_groups) {
  __shared__ LocalFixup<CB * 2> fixup;
  streamk_local_fixup_begin(sk, fixup);
  Q4Slots slots = kSlots ? slots_arg : Q4Slots{};
  if constexpr (kSlots) {
    if (slots.picks.logits != nullptr) {
      slots.ids = q4_make_picks(slots, blockIdx.x, gridDim.x);
      slots.ids_ready = true;  // waited for already
    }
  }
  const int64_t w = static_cast<int64_t>(blockIdx.x) * 4 + (threadIdx.x >> 5);
  if (w >= sk.warps) return;
  // Expert ids from the kernel just before: wait for it before choosing the matrices. Ids from
  // further back (Q4Slots::ids_ready) let the first weights load before the wait (H100, 35B-A3B
  // batch 1: 450 -> 461 tok/s for the down projection's launch alone).
  if (slots.ids != nullptr && !slots.ids_ready) wait_for_previous_grid();
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  streamk_for_each(sk, w, [&](int64_t tile, int64_t k0, int64_t k1) {
    const Q4Tile q = q4_tile(jobs, tile, tiles_per_slot, n, slots);
    float tot[CB][2];
    if (q.bad_expert) {  // the router never produces one; make it visible
#pragma unroll
      for (int cb = 0; cb < CB; ++cb) tot[cb][0] = tot[cb][1] = __int_as_float(0x7fc00000);
    } else {
      Q4DigitDot<G, CB, U, ST>(q, act, static_cast<int>(k1), l2_groups)
          .run(static_cast<int>(k0), tot);
    }
    if (k0 > 0 || k1 < sk.steps) {
      auto& flat = reinterpret_cast<float(&)[CB * 2]>(tot);
      if (sk.local > 0 ? !streamk_local_fixup(sk, flat, fixup)
                       : !streamk_fixup(sk, w, tile, k0 > 0 ? 0 : 1, flat)) {
        return;
      }
    }
    // Lane pair (2i, 2i+1) holds digits (0, 1) and (2, 3) of one activation row.
    const float weight = (t & 1) ? 1.0f : 65536.0f;
#pragma unroll
    for (int cb = 0; cb < CB; ++cb) {
      float v[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        v[h] = tot[cb][h] * weight;
        v[h] += __shfl_xor_sync(0xffffffffu, v[h], 1);
      }
      const int c = 2 * cb + (t >> 1);  // activation row
      if ((t & 1) || c >= q.ncols) continue;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t r = q.r0 + g + 8 * h;
        if (r < q.m.rows) q.out[(slots.ids != nullptr ? 0 : c * q.m.rows) + r] = v[h];
      }
    }
  });
}

template <int G, int CB, int ST, bool kSlots>
void launch_typed(cudaStream_t st, const GemvJobs& jobs, const Q4Act& act, int n, const Q4Slots& sl,
                  int64_t tiles, int64_t tiles_per_slot, const GemvWorkspace& ws) {
  // Groups per buffer: up to 16 bytes of weights per lane (fewer registers, more warps: at
  // group 64 two groups per buffer beat four, 66% against 58% of the bandwidth).
  constexpr int U = G == 128 ? 1 : 2;
  const auto kernel = q4d_gemv_kernel<G, CB, U, ST, kSlots>;
  StreamK sk = plan_streamk(reinterpret_cast<const void*>(kernel), 128, tiles, jobs.m[0].cols / G,
                            32 * CB * 2, ws, kQ4MinSteps, 1, 0,
                            CB == 1 ? TileAlign::kWarpsPerTile : TileAlign::kNone);
  plan_local_fixup(sk, reinterpret_cast<const void*>(kernel), 128, 0);
  launch_streamk(sk, kernel, dim3(static_cast<unsigned>((sk.warps + 3) / 4)), dim3(128), 0, st,
                 jobs, act, n, sl, sk, tiles_per_slot, kQ4L2Groups);
}

template <int G, int CB, bool kSlots>
void launch_scales(cudaStream_t st, const GemvJobs& jobs, const Q4Act& act, int n,
                   const Q4Slots& sl, int64_t tiles, int64_t tiles_per_slot,
                   const GemvWorkspace& ws) {
  with_scale_type(jobs.m[0].sdtype, [&](auto sd) {
    launch_typed<G, CB, decltype(sd)::value, kSlots>(st, jobs, act, n, sl, tiles, tiles_per_slot,
                                                     ws);
  });
}

template <int G>
void launch_cb(cudaStream_t st, const GemvJobs& jobs, const Q4Act& act, int n, const Q4Slots& sl,
               int64_t tiles, int64_t tiles_per_slot, const GemvWorkspace& ws) {
  if (sl.ids != nullptr) {
    launch_scales<G, 1, true>(st, jobs, act, n, sl, tiles, tiles_per_slot, ws);
  } else if (n <= 2) {
    launch_scales<G, 1, false>(st, jobs, act, n, sl, tiles, tiles_per_slot, ws);
  } else {
    launch_scales<G, 2, false>(st, jobs, act, n, sl, tiles, tiles_per_slot, ws);
  }
}

}  // namespace

void launch_q4d_prepare_kernel(cudaStream_t st, const float* x, const float* up, bool sigmoid_gate,
                               int64_t ldx, int64_t rows, int64_t K, const Q4Act& act) {
  launch_pdl(q4d_prepare_kernel, dim3(blocks_for(rows * (K / 8), kPrepThreads)), dim3(kPrepThreads),
             0, st, x, up, sigmoid_gate, ldx, rows, K, act.group, act);
  TM_CUDA_LAUNCHED();
}

void launch_rmsnorm_q4d(cudaStream_t st, float* x, const float* y, const float* w, float* h,
                        int64_t rows, int64_t K, float eps, const Q4Act& act,
                        const CombineRows& cr) {
  TM_CUDA_REQUIRE(K % act.group == 0 && K / 8 <= 1024 && rows >= 1 && rows <= 65535,
                  "rmsnorm_q4d: rows of whole groups, at most 8192 wide");
  TM_CUDA_REQUIRE(cr.rows == nullptr || K / 8 <= kCombineMaxWords,
                  "rmsnorm_q4d: a deferred MoE combine takes rows of at most 4096");
  const int threads = static_cast<int>((K / 8 + 31) / 32 * 32);
  const auto kernel = cr.rows != nullptr ? rmsnorm_q4d_kernel<true> : rmsnorm_q4d_kernel<false>;
  launch_pdl(kernel, dim3(static_cast<unsigned>(rows)), dim3(threads), 0, st, x, y, cr, w, h, K,
             eps, act.group, act);
  TM_CUDA_LAUNCHED();
}

void launch_rmsnorm_gated_q4d(cudaStream_t st, const float* o, const float* z, const float* w,
                              float* normed, int64_t rows, int heads, int dim, float eps,
                              const Q4Act& act) {
  const int64_t K = int64_t{heads} * dim;
  TM_CUDA_REQUIRE(dim % 8 == 0 && dim / 8 <= 32 && (dim / 8 & (dim / 8 - 1)) == 0 &&
                      K % act.group == 0 && K / 8 <= 1024 && rows >= 1 && rows <= 65535,
                  "rmsnorm_gated_q4d: heads of 8..256 (a power of two), rows of whole groups "
                  "at most 8192 wide");
  const int threads = static_cast<int>((K / 8 + 31) / 32 * 32);
  launch_pdl(rmsnorm_gated_q4d_kernel, dim3(static_cast<unsigned>(rows)), dim3(threads), 0, st, o,
             z, w, normed, dim, K, eps, act.group, act);
  TM_CUDA_LAUNCHED();
}

void launch_q4d_gemv_kernel(cudaStream_t st, const GemvJobs& jobs, const Q4Act& act, int n,
                            const Q4Slots& sl, int64_t tiles, int64_t tiles_per_slot,
                            const GemvWorkspace& ws) {
  TM_CUDA_REQUIRE(sl.ids != nullptr || n <= kQ4DigitMaxRows, "q4 gemv: 1..4 rows in digits");
  switch (act.group) {
    case 32:
      launch_cb<32>(st, jobs, act, n, sl, tiles, tiles_per_slot, ws);
      break;
    case 64:
      launch_cb<64>(st, jobs, act, n, sl, tiles, tiles_per_slot, ws);
      break;
    default:
      launch_cb<128>(st, jobs, act, n, sl, tiles, tiles_per_slot, ws);
  }
}

}  // namespace tokenmill::cuda
