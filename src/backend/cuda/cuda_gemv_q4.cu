// Decode GEMV for MLX 4-bit weights with 5..16 activation rows (batched decode, speculative
// verify), on tensor cores: mma.sync m16n8k16 with F16 operands and F32 accumulation, reading
// the weights in a tile layout made at upload ("The tile layout" in cuda_q4_pack.cu); the
// activation preparation of every F16-operand kernel. One to four rows and MoE slots take the
// 8-bit digit kernel (cuda_gemv_q4d.cu), 17..64 rows the wgmma one on sm_90 at groups 64 and 128
// (cuda_gemv_q4g.cu), else the weight-stationary one (cuda_gemv_q4w.cu).
//
// Why: a SIMT 4-bit GEMV spends about 6 instructions per weight byte unpacking nibbles and doing
// FMAs, which caps it near a quarter of HBM bandwidth on an H200. Here one 32-bit word of 8
// nibbles becomes four f16x2 operand registers in 5 integer instructions and the tensor core does
// the multiply-adds.
//
// Order of k: a dot product does not depend on the order of its terms, so each lane feeds the
// mma the nibbles of the words it loaded in the order they unpack. For a word w (value i in bits
// [4i, 4i+4)): (w & 0x000F000F) | 0x64006400 is the f16 pair (1024+v0, 1024+v4);
// (w & 0x00F000F0) | 0x64006400 is (1024+16*v1, 1024+16*v5); the same after w >> 8 gives (v2, v6)
// and (16*v3, 16*v7); one f16x2 subtraction of 1024 each leaves the exact small integers. (The
// 1024 must go before the mma: folded into a correction after it, the tensor core's F32
// accumulation, which truncates, lost about 2^-11 of the result.) The prepare kernel stores the
// activations of each 8-value word in that order, [x0, x4, x1/16, x5/16, x2, x6, x3/16, x7/16]
// (division by 16 is exact), so the mma of a group is q.x; the prepare kernel's per-group sums X
// give the affine bias term: out = sum over groups of s*acc + b*X.
//
// Precision: each activation row is scaled by a power of two that puts its largest magnitude in
// [2^14, 2^15) (f16 range), then split into two f16 parts hi + lo (about 22 significant bits);
// both parts go through the mma, whose products are exact in the F32 accumulator. The result
// matches an F32 dot product to about 1e-6 relative (the CPU backend's reference).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv_q4.cuh"

namespace tokenmill::cuda {
namespace {

constexpr int kQ4Threads = 256;  // prepare kernel

// Block (c, p): activation row c, part p of its words (parts of whole warps, so a group's words
// stay in one warp). Every part computes the row's max itself (the row is a few KB in L2) and
// converts its own words: a decode row is then spread over several SMs instead of one.
__global__ void __launch_bounds__(kQ4Threads)
    q4_prepare_kernel(const float* __restrict__ x, int64_t ldx, int64_t K, int group, Q4Act act) {
  // The GEMV that follows starts loading its weights now; it waits for this kernel's
  // completion before it reads the activations.
  pdl_begin();
  __shared__ float red[32];
  const int64_t c = blockIdx.x;
  const float* xr = x + c * ldx;
  const int64_t words = K / 8, groups = K / group;
  const int64_t per_part = (words + gridDim.y - 1) / gridDim.y;
  const int64_t part = (per_part + 31) / 32 * 32;
  const int64_t first = blockIdx.y * part, last = min(words, first + part);
  // 16-byte loads, four in flight per thread: a scalar loop here waited on one L2 round trip
  // per element and made this kernel take 11 us for a 5120-wide row.
  const float4* x4 = reinterpret_cast<const float4*>(xr);
  float m = 0.0f;
#pragma unroll 4
  for (int64_t k = threadIdx.x; k < K / 4; k += blockDim.x) {
    const float4 v = x4[k];
    m = fmaxf(fmaxf(m, fmaxf(fabsf(v.x), fabsf(v.y))), fmaxf(fabsf(v.z), fabsf(v.w)));
  }
  m = block_max(m, red);
  // x is multiplied by 2^e, e from m's exponent bits (m subnormal: e = 126).
  int e = 0;
  if (m > 0.0f && m <= FLT_MAX) {
    e = min(14 - (static_cast<int>((__float_as_uint(m) >> 23) & 0xff) - 127), 126);
  }
  const float f = __uint_as_float(static_cast<uint32_t>(e + 127) << 23);
  if (threadIdx.x == 0 && blockIdx.y == 0) {
    act.colscale[c] = __uint_as_float(static_cast<uint32_t>(127 - e) << 23);
  }
  const int wpg = group / 8;  // words per group: 4, 8 or 16, aligned runs of lanes in a warp
  __half* hi_row = act.x + c * act.ld;
  __half* lo_row = hi_row + K;
  for (int64_t base = first; base < last; base += blockDim.x) {  // uniform trip count (shuffles)
    const int64_t j = base + threadIdx.x;
    float X = 0.0f;
    if (j < last) {
      const float4 a = reinterpret_cast<const float4*>(xr)[2 * j];
      const float4 b = reinterpret_cast<const float4*>(xr)[2 * j + 1];
      const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
      constexpr int kOrder[8] = {0, 4, 1, 5, 2, 6, 3, 7};
      uint32_t hw[4] = {}, lw[4] = {};
#pragma unroll
      for (int p = 0; p < 8; ++p) {
        const bool sixteenth = (p & 2) != 0;  // positions fed with 16*q
        const float s = v[kOrder[p]] * f * (sixteenth ? 0.0625f : 1.0f);
        const __half h = __float2half_rn(s);
        const __half l = __float2half_rn(s - __half2float(h));
        hw[p / 2] |= static_cast<uint32_t>(__half_as_ushort(h)) << (16 * (p & 1));
        lw[p / 2] |= static_cast<uint32_t>(__half_as_ushort(l)) << (16 * (p & 1));
        const float stored = __half2float(h) + __half2float(l);
        X += sixteenth ? 16.0f * stored : stored;
      }
      if (act.operands == Q4Operands::kF16Gmma) {
        // Word j is word jj = tt*W + w of its group (lane column tt, W = G/32 words a lane):
        // pairs (0,1) and (2,3) of its k-step 2w + p (16 values) are at 2tt and 8 + 2tt.
        const int W = wpg / 4, jj = static_cast<int>(j % wpg), tt = jj / W, w = jj % W;
        const int64_t at = (j / wpg) * (group / 2);  // the group's first 32-bit pair
        uint32_t* hp = reinterpret_cast<uint32_t*>(hi_row) + at;
        uint32_t* lp = reinterpret_cast<uint32_t*>(lo_row) + at;
#pragma unroll
        for (int p = 0; p < 2; ++p) {
          const int step = 8 * (2 * w + p) + tt;
          hp[step] = hw[2 * p], hp[step + 4] = hw[2 * p + 1];
          lp[step] = lw[2 * p], lp[step + 4] = lw[2 * p + 1];
        }
      } else {
        reinterpret_cast<uint4*>(hi_row)[j] = make_uint4(hw[0], hw[1], hw[2], hw[3]);
        reinterpret_cast<uint4*>(lo_row)[j] = make_uint4(lw[0], lw[1], lw[2], lw[3]);
      }
    }
    for (int o = 1; o < wpg; o <<= 1) X += __shfl_xor_sync(0xffffffffu, X, o);
    if (j < last && j % wpg == 0) act.sums[c * groups + j / wpg] = X;
  }
}

// Groups [k0, k1) of one 16-row tile, in the tile layout (cuda_q4_pack.cu). Lane
// (g = lane/4, t = lane%4) holds weight rows g and g+8 and words [t*W, t*W+W) of each group:
// one load of 8W contiguous bytes, and one load of its rows' scales and biases. The mma's 8
// columns carry up to 4 activation rows per column block, hi and lo parts side by side (column
// 2i: row i's hi part, 2i+1: its lo part), so one mma serves both parts, and the lane's C
// fragment (columns 2t, 2t+1) is exactly activation row t of the block: hi + lo. Returns
// tot[cb][0] (row g) and tot[cb][1] (row g+8) for activation row 4*cb + t. Offsets inside a
// tile are 32-bit; the tile's base pointers are computed once. Every column block's accumulators
// stay live across the group's words (short mma chains).
template <int G, int CB, int U, int ST>
struct Q4TileDot {
  static_assert(CB <= 4, "17..64 rows: the weight-stationary kernel (cuda_gemv_q4w.cu)");
  static constexpr int kOffs = CB;
  using Stream = Q4TileStream<G, U, ST>;
  using Buf = typename Stream::Buf;
  static constexpr int W = Stream::W;
  Stream ws;
  // 32-bit offsets from act.x (in 16-byte units) and act.sums: cheap to recompute when the
  // compiler rematerializes them under register pressure (64-bit pointers cost ~12
  // instructions per load there, measured in the SASS).
  const uint4* xbase;
  const float* sbase;
  uint32_t xoff[kOffs];  // this lane's B column (hi or lo part of one activation row)
  uint32_t soff[kOffs];  // per-group sums of this lane's C activation row
  bool has_x[kOffs], has_s[kOffs];

  __device__ Q4TileDot(const Q4Tile& q, const Q4Act& act, int end) : ws(q.m, q.r0, end) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int groups = static_cast<int>(q.m.cols / G);
    const int64_t K = act.ld / 2;
    xbase = reinterpret_cast<const uint4*>(act.x);
    sbase = act.sums;
#pragma unroll
    for (int cb = 0; cb < kOffs; ++cb) {
      const int xr = cb * 4 + g / 2, sr = cb * 4 + t;  // activation rows of the B and C columns
      has_x[cb] = xr < q.ncols;
      has_s[cb] = sr < q.ncols;
      xoff[cb] = static_cast<uint32_t>(
          ((q.cbase + (has_x[cb] ? xr : 0)) * act.ld + (g & 1) * K) / 8 + t * W);
      soff[cb] = static_cast<uint32_t>((q.cbase + (has_s[cb] ? sr : 0)) * groups);
    }
  }

  __device__ __forceinline__ void compute(const Buf& b, int base, float (&tot)[CB][2]) const {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int grp = base + u;
      if (grp >= ws.k1) break;
      // One accumulator per word: the mma chains stay two long (a longer chain of dependent
      // mmas stalls a warp, and there are few warps per SM to hide it).
      float d[W][CB][4];
#pragma unroll
      for (int w = 0; w < W; ++w)
#pragma unroll
        for (int cb = 0; cb < CB; ++cb)
#pragma unroll
          for (int i = 0; i < 4; ++i) d[w][cb][i] = 0.0f;
#pragma unroll
      for (int w = 0; w < W; ++w) {
        uint32_t ea[4], eb[4];
        q4_unpack_word(b.w[u][w], ea);
        q4_unpack_word(b.w[u][W + w], eb);
#pragma unroll
        for (int cb = 0; cb < CB; ++cb) {
          const uint4 x =
              has_x[cb] ? __ldg(xbase + (xoff[cb] + grp * (G / 8) + w)) : make_uint4(0, 0, 0, 0);
          mma_f16(d[w][cb], ea[0], eb[0], ea[1], eb[1], x.x, x.y);
          mma_f16(d[w][cb], ea[2], eb[2], ea[3], eb[3], x.z, x.w);
        }
      }
#pragma unroll
      for (int w = 1; w < W; ++w)
#pragma unroll
        for (int cb = 0; cb < CB; ++cb)
#pragma unroll
          for (int i = 0; i < 4; ++i) d[0][cb][i] += d[w][cb][i];
      float sc[2], bi[2];
      q4_scales<ST>(b.s[u], sc, bi);
#pragma unroll
      for (int cb = 0; cb < CB; ++cb) {
        const float X = has_s[cb] ? __ldg(sbase + (soff[cb] + grp)) : 0.0f;
        tot[cb][0] += sc[0] * (d[0][cb][0] + d[0][cb][1]) + bi[0] * X;
        tot[cb][1] += sc[1] * (d[0][cb][2] + d[0][cb][3]) + bi[1] * X;
      }
    }
  }

  // Weights and scales (HBM) are loaded a buffer ahead (Q4TileStream); activations and their
  // sums (a few KB, L1/L2-resident) when used.
  __device__ __forceinline__ void run(int k0, float (&tot)[CB][2]) const {
#pragma unroll
    for (int cb = 0; cb < CB; ++cb) tot[cb][0] = tot[cb][1] = 0.0f;
    ws.run(k0, [&](const Buf& b, int base, auto) { compute(b, base, tot); });
  }
};

// Each warp takes an equal range of the flattened (tile, group) work (cuda_streamk.cuh).
template <int G, int CB, int U, int ST>
__global__ void __launch_bounds__(128, 2)
    q4_gemv_kernel(GemvJobs jobs, Q4Act act, int n, StreamK sk) {
  const int64_t w = static_cast<int64_t>(blockIdx.x) * 4 + (threadIdx.x >> 5);
  if (w >= sk.warps) return;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  streamk_for_each(sk, w, [&](int64_t tile, int64_t k0, int64_t k1) {
    const Q4Tile q = q4_tile(jobs, tile, sk.tiles, n, Q4Slots{});
    float tot[CB][2];
    Q4TileDot<G, CB, U, ST>(q, act, static_cast<int>(k1)).run(static_cast<int>(k0), tot);
    if (k0 > 0 || k1 < sk.steps) {
      auto& flat = reinterpret_cast<float(&)[CB * 2]>(tot);
      if (!streamk_fixup(sk, w, tile, k0 > 0 ? 0 : 1, flat)) return;
    }
#pragma unroll
    for (int cb = 0; cb < CB; ++cb) {
      const int c = cb * 4 + t;  // activation row
      if (c >= q.ncols) continue;
      const float scale = act.colscale[c];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t r = q.r0 + g + 8 * h;
        if (r < q.m.rows) q.out[c * q.m.rows + r] = tot[cb][h] * scale;
      }
    }
  });
}

template <int G, int CB, int ST>
void launch_typed(cudaStream_t st, const GemvJobs& jobs, const Q4Act& act, int n, int64_t tiles,
                  const GemvWorkspace& ws) {
  // Groups per buffer: 64 bytes of weights per lane (32 at group 128), so each warp keeps 2-4 KB
  // in flight.
  constexpr int U = G == 128 ? 2 : 4;
  const auto kernel = q4_gemv_kernel<G, CB, U, ST>;
  const StreamK sk = plan_streamk(reinterpret_cast<const void*>(kernel), 128, tiles,
                                  jobs.m[0].cols / G, 32 * CB * 2, ws);
  // Dependent launch: the warps start streaming weights while the preparation kernel runs.
  launch_pdl(kernel, dim3(static_cast<unsigned>((sk.warps + 3) / 4)), dim3(128), 0, st, jobs, act,
             n, sk);
}

template <int G, int CB>
void launch_group(cudaStream_t st, const GemvJobs& jobs, const Q4Act& act, int n, int64_t tiles,
                  const GemvWorkspace& ws) {
  with_scale_type(jobs.m[0].sdtype, [&](auto sd) {
    launch_typed<G, CB, decltype(sd)::value>(st, jobs, act, n, tiles, ws);
  });
}

}  // namespace

size_t q4_act_bytes(int64_t rows, int64_t K, int group) {
  const auto al = [](size_t b) { return (b + 255) / 256 * 256; };
  return al(static_cast<size_t>(rows * 2 * K) * 2) +
         al(static_cast<size_t>(rows * (K / group)) * 2 * sizeof(float)) +
         al(static_cast<size_t>(rows) * sizeof(float));
}

Q4Act q4_act_layout(int64_t rows, int64_t K, int group, Q4Operands operands,
                    const GemvWorkspace& ws) {
  TM_CUDA_REQUIRE(group == 32 || group == 64 || group == 128, "q4 gemv: group 32, 64 or 128");
  TM_CUDA_REQUIRE(K % group == 0 && rows >= 1, "q4 gemv: columns must be whole groups");
  TM_CUDA_REQUIRE(q4_act_bytes(rows, K, group) <= ws.act_bytes,
                  "q4 gemv: activation workspace too small");
  const auto al = [](size_t b) { return (b + 255) / 256 * 256; };
  auto* base = static_cast<uint8_t*>(ws.act);
  Q4Act act;
  act.x = reinterpret_cast<__half*>(base);
  act.ld = 2 * K;
  act.rows = rows;
  base += al(static_cast<size_t>(rows * 2 * K) * 2);
  act.sums = reinterpret_cast<float*>(base);
  base += al(static_cast<size_t>(rows * (K / group)) * 2 * sizeof(float));
  act.colscale = reinterpret_cast<float*>(base);
  act.group = group;
  act.operands = operands;
  return act;
}

Q4Act launch_q4_prepare(cudaStream_t st, const float* x, int64_t ldx, int64_t rows, int64_t K,
                        int group, Q4Operands operands, const GemvWorkspace& ws, const float* up,
                        bool sigmoid_gate) {
  TM_CUDA_REQUIRE(reinterpret_cast<uintptr_t>(x) % 16 == 0 && ldx % 4 == 0 &&
                      reinterpret_cast<uintptr_t>(up) % 16 == 0,
                  "q4 gemv: activations must be 16-byte aligned");
  TM_CUDA_REQUIRE(up == nullptr || operands == Q4Operands::kDigits,
                  "q4 gemv: silu(x) * up is prepared as digits only");
  const Q4Act act = q4_act_layout(rows, K, group, operands, ws);
  if (operands == Q4Operands::kDigits) {
    launch_q4d_prepare_kernel(st, x, up, sigmoid_gate, ldx, rows, K, act);
    return act;
  }
  const int64_t parts = std::clamp<int64_t>(K / 8 / kQ4Threads, 1, 16);
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(parts));
  launch_pdl(q4_prepare_kernel, grid, dim3(kQ4Threads), 0, st, x, ldx, K, group, act);
  TM_CUDA_LAUNCHED();
  return act;
}

bool q4_mma_eligible(const DevMat& m) {
  return m.tiled && (m.group == 32 || m.group == 64 || m.group == 128) && m.cols % m.group == 0 &&
         reinterpret_cast<uintptr_t>(m.data) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(m.scales) % 16 == 0;
}

int64_t q4_number_tiles(GemvJobs& jobs, const Q4Act& act, int align) {
  int64_t tiles = 0;
  for (int j = 0; j < jobs.count; ++j) {
    TM_CUDA_REQUIRE(q4_mma_eligible(jobs.m[j]) && jobs.m[j].group == act.group &&
                        jobs.m[j].cols == act.ld / 2 && jobs.m[j].sdtype == jobs.m[0].sdtype,
                    "q4 gemv: matrices must match the prepared activations");
    jobs.first_tile[j] = tiles;
    tiles += ((jobs.m[j].rows + 15) / 16 + align - 1) / align * align;
  }
  jobs.first_tile[jobs.count] = tiles;
  return tiles;
}

void launch_q4_gemv(cudaStream_t st, GemvJobs jobs, const Q4Act& act, int n, const Q4Slots& sl,
                    int64_t slots, const GemvWorkspace& ws) {
  const int32_t* ids = sl.ids;
  TM_CUDA_REQUIRE(jobs.count >= 1 && jobs.count + jobs.shared_offset <= kMaxGemvJobs,
                  "q4 gemv: 1..4 matrices");
  TM_CUDA_REQUIRE(
      ids == nullptr || (sl.k >= 1 && sl.x_div >= 1 &&
                         (sl.per_token == sl.k ||
                          (sl.per_token == sl.k + 1 && jobs.shared_offset >= jobs.count))),
      "q4 gemv: slots per token are k, or k + 1 with the shared-expert matrices after the jobs");
  for (int j = 0; ids != nullptr && sl.per_token > sl.k && j < jobs.count; ++j) {
    const DevMat &r = jobs.m[j], &s = jobs.m[j + jobs.shared_offset];
    TM_CUDA_REQUIRE(q4_mma_eligible(s) && s.experts == 1 && s.rows == r.rows && s.cols == r.cols &&
                        s.group == r.group && s.sdtype == r.sdtype,
                    "q4 gemv: a shared expert must have its routed experts' shape and format");
  }
  TM_CUDA_REQUIRE(ids != nullptr || (n >= 1 && n <= kQ4GemvMaxRows),
                  "q4 gemv: 1..64 activation rows");
  TM_CUDA_REQUIRE(ids == nullptr || slots >= 1, "q4 gemv: no slots");
  const Q4Picks& pk = sl.picks;
  TM_CUDA_REQUIRE(
      pk.logits == nullptr ||
          (ids == pk.ids && !sl.ids_ready && act.operands == Q4Operands::kDigits &&
           pk.tokens >= 1 && pk.tokens <= kQ4PickMaxTokens &&
           slots == int64_t{pk.tokens} * sl.per_token && sl.k <= kQ4PickMaxK &&
           sl.k <= pk.experts && pk.experts <= kQ4PickMaxExperts && pk.resid_floats % 4 == 0),
      "q4 gemv: picks in the launch take 1..4 tokens, k <= 32 of <= 256 experts, "
      "the launch's own ids, digits");
  const int64_t tiles_per_slot = q4_number_tiles(jobs, act, 1);
  const int64_t tiles = tiles_per_slot * (ids ? slots : 1);
  if (act.operands == Q4Operands::kDigits) {
    launch_q4d_gemv_kernel(st, jobs, act, n, sl, tiles, tiles_per_slot, ws);
    return;
  }
  TM_CUDA_REQUIRE(ids == nullptr && n > kQ4DigitMaxRows,
                  "q4 gemv: F16 operands are for 5..64 rows (fewer and MoE slots: digits)");
  if (act.operands == Q4Operands::kF16Gmma) {
    launch_q4g_gemv(st, jobs, act, n, ws);
    return;
  }
  if (n > 16) {
    launch_q4w_gemv(st, jobs, act, n, ws);
    return;
  }
  // Column blocks of 4 rows.
  const int cb = n <= 8 ? 2 : 4;
  auto by_cb = [&](auto group_tag) {
    constexpr int G = decltype(group_tag)::value;
    if (cb == 2) {
      launch_group<G, 2>(st, jobs, act, n, tiles, ws);
    } else {
      launch_group<G, 4>(st, jobs, act, n, tiles, ws);
    }
  };
  switch (act.group) {
    case 32:
      by_cb(std::integral_constant<int, 32>{});
      break;
    case 64:
      by_cb(std::integral_constant<int, 64>{});
      break;
    default:
      by_cb(std::integral_constant<int, 128>{});
  }
  TM_CUDA_LAUNCHED();
}

}  // namespace tokenmill::cuda
