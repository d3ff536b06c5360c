// The gated delta rule in its chunked form (MODEL-SPEC B) for prefill, in chunks of kChunk
// tokens with the CPU backend's chunk boundaries (cpu_gdn.cpp). With G_r the in-chunk
// cumulative log decay of token r, B = diag(beta), E = diag(e^G), and
//   A_rs = beta_r (k_r.k_s) e^(G_r - G_s) (s < r),  P_rs = (q_r.k_s) e^(G_r - G_s) (s <= r),
// the CPU's forward substitution V'_r = beta_r (v_r - e^G_r S^T k_r) - sum_{s<r} A_rs V'_s is
// (I + A) V' = B V - B E K S, so V' = U - W S with
//   U = (I + A)^-1 B V   and   W = (I + A)^-1 B E K,
// which do not depend on the state. Three kernels:
//   dots (every chunk of every key head at once): k_r.k_s and q_r.k_s, which A and P of the key
//     head's value heads share;
//   prepare (every chunk of every value head): A and P from them, then U and W by forward
//     substitution on their columns (a column per thread, in registers); writes U, W, P and G.
//   walk (per sequence, value head and kCols state columns, chunk after chunk):
//     V' = U - W S;  o_r = e^G_r S^T q_r + sum_{s<=r} P_rs V'_s;
//     S <- e^G_L S + sum_r e^(G_L - G_r) k_r V'_r^T   (L: the chunk's last token).
// So the part that must run in order is three dense products per chunk; the per-token chains
// (the substitution) run in parallel over chunks. prepare's arithmetic is F32 on the CUDA
// cores; walk's products run on the tensor cores with split TF32 operands (F32-accurate, below;
// PrefillPrecision::kFast: one TF32 pass).
//
// Why: the recurrent kernel walks the tokens one at a time (a dot product, two shuffles, an
// update and another dot product per token): 12 ms per 27B layer at an 8k-token prompt.
#include <cuda_runtime.h>

#include <type_traits>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_common.cuh"

namespace tokenmill::cuda {
namespace {

constexpr int kChunk = 64;        // tokens per chunk (the CPU's kChunk)
constexpr int kCols = 32;         // state columns per walking block
constexpr int kThreads = 256;     // 8 warps, both kernels
constexpr int kMaxDim = 128;      // k_dim and v_dim at most this
constexpr int kLdT = kChunk + 4;  // rows of A^T and P: float4-aligned, rows in distinct banks

// Workspace per token row and value head (floats): W [k_dim], U [v_dim], P's row [kChunk], G;
// and per chunk (at most n_tokens / kChunk + n_seqs of them) and key head the dot products
// k_r.k_s and q_r.k_s, [kChunk][kChunk] each.
size_t ws_floats_per_row(const GDNStateView& st) {
  return static_cast<size_t>(st.k_dim) + st.v_dim + kChunk + 1;
}
size_t ws_chunk_bound(const SeqLayout& seqs) {
  return static_cast<size_t>(seqs.n_tokens) / kChunk + static_cast<size_t>(seqs.n_seqs);
}
constexpr size_t kDotFloats = 2 * static_cast<size_t>(kChunk) * kChunk;  // a chunk's, a key head

struct ChunkArgs {
  GDNStateView st;
  SeqLayout seqs;
  const int32_t* slots;
  const float *q, *k, *v, *g, *beta;
  float* out;
  // Workspace, each indexed by (token row, value head): W, U, P, G; KQ by (chunk, key head).
  float *W, *U, *P, *G, *KQ;
};

// The chunk a prepare block owns: its sequence's first row (t0), its first row (tc) and its
// length, walking the sequences in order (chunk b of the call); false past the last chunk.
__device__ bool find_chunk(const SeqLayout& seqs, int b, int64_t* tc, int* len) {
  for (int s = 0; s < seqs.n_seqs; ++s) {
    const int64_t t0 = seqs.cu_seqlens[s], t1 = seqs.cu_seqlens[s + 1];
    const int chunks = static_cast<int>((t1 - t0 + kChunk - 1) / kChunk);
    if (b < chunks) {
      *tc = t0 + static_cast<int64_t>(b) * kChunk;
      *len = static_cast<int>(t1 - *tc < kChunk ? t1 - *tc : kChunk);
      return true;
    }
    b -= chunks;
  }
  return false;
}

// Shared memory of dots (floats): k and q rows [kChunk][Dk + 4] each.
size_t dots_smem_floats(int k_dim) {
  return 2 * static_cast<size_t>(kChunk) * (k_dim + 4);
}

// Block (chunk, key head): k_r.k_s and q_r.k_s over the chunk's rows (zeros past its length),
// written as KQ[(chunk * Hk + kh) * kDotFloats + {0, kChunk^2} + r * kChunk + s]. Thread (ti, tj)
// takes rows ti + 16i and columns tj + 16j (i, j < 4), so the rows a quarter-warp reads for its
// columns fall in distinct banks; prepare reads its products back with the same mapping.
template <int kD>
__global__ void __launch_bounds__(kThreads, 2) delta_rule_dots_kernel(ChunkArgs a) {
  pdl_begin();
  extern __shared__ __align__(16) float sh[];
  int64_t tc = 0;
  int L = 0;
  if (!find_chunk(a.seqs, static_cast<int>(blockIdx.x), &tc, &L)) return;
  const int kh = blockIdx.y;
  const int Hk = a.st.k_heads, Dk = kD > 0 ? kD : a.st.k_dim;
  const int ld = Dk + 4;
  float* const K_s = sh;                 // [kChunk][ld]
  float* const Q_s = K_s + kChunk * ld;  // [kChunk][ld]
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t qk_stride = static_cast<int64_t>(Hk) * Dk;
  const int words = Dk / 4;
  for (int i = tid; i < kChunk * words; i += kThreads) {
    const int r = i / words, j = (i % words) * 4;
    float4 q4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), k4 = q4;
    if (r < L) {
      const int64_t at = (tc + r) * qk_stride + static_cast<int64_t>(kh) * Dk + j;
      q4 = *reinterpret_cast<const float4*>(a.q + at);
      k4 = *reinterpret_cast<const float4*>(a.k + at);
    }
    *reinterpret_cast<float4*>(Q_s + r * ld + j) = q4;
    *reinterpret_cast<float4*>(K_s + r * ld + j) = k4;
  }
  __syncthreads();
  const int ti = tid / 16, tj = tid % 16;
  float kk[4][4], qk[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) kk[i][j] = qk[i][j] = 0.0f;
  }
  for (int w = 0; w < words; ++w) {
    float4 kr[4], qr[4], ks[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      kr[i] = reinterpret_cast<const float4*>(K_s + (ti + 16 * i) * ld)[w];
      qr[i] = reinterpret_cast<const float4*>(Q_s + (ti + 16 * i) * ld)[w];
      ks[i] = reinterpret_cast<const float4*>(K_s + (tj + 16 * i) * ld)[w];
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        kk[i][j] += kr[i].x * ks[j].x + kr[i].y * ks[j].y + kr[i].z * ks[j].z + kr[i].w * ks[j].w;
        qk[i][j] += qr[i].x * ks[j].x + qr[i].y * ks[j].y + qr[i].z * ks[j].z + qr[i].w * ks[j].w;
      }
    }
  }
  float* const out = a.KQ + (static_cast<int64_t>(blockIdx.x) * Hk + kh) * kDotFloats;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int at = (ti + 16 * i) * kChunk + tj + 16 * j;
      out[at] = kk[i][j];
      out[kChunk * kChunk + at] = qk[i][j];
    }
  }
}

// Shared memory of prepare (floats): k rows [kChunk][ld] (ld = max(k_dim, v_dim) + 4), A^T and P
// [kChunk][kLdT] each, G, beta and e^G [kChunk] each.
size_t prepare_smem_floats(int ld) {
  return static_cast<size_t>(kChunk) * ld + 2 * static_cast<size_t>(kChunk) * kLdT + 3 * kChunk;
}

// The substitution runs in two halves of kChunk / 2 rows, so a thread holds half of its column
// at a time: 3 blocks a multiprocessor instead of the 2 that a whole column in registers (128
// registers a thread) allowed, where ncu found no eligible warp in 69% of the cycles (8% less
// time for the delta rule of a 27B layer at 8k on an H100).
template <int kD>
__global__ void __launch_bounds__(kThreads, 3) delta_rule_prepare_kernel(ChunkArgs a) {
  pdl_begin();
  extern __shared__ __align__(16) float sh[];
  int64_t tc = 0;
  int L = 0;
  if (!find_chunk(a.seqs, static_cast<int>(blockIdx.x), &tc, &L)) return;
  const int h = blockIdx.y;
  const int Hv = a.st.v_heads, Hk = a.st.k_heads;
  const int Dk = kD > 0 ? kD : a.st.k_dim, Dv = kD > 0 ? kD : a.st.v_dim;
  const int kh = h / (Hv / Hk);
  const int ld = (Dk > Dv ? Dk : Dv) + 4;
  float* const K_s = sh;                    // [kChunk][ld]
  float* const At_s = K_s + kChunk * ld;    // [kChunk][kLdT]: At[s][r] = A_rs
  float* const P_s = At_s + kChunk * kLdT;  // [kChunk][kLdT]: P[r][s]
  float* const G_s = P_s + kChunk * kLdT;
  float* const b_s = G_s + kChunk;
  float* const eG_s = b_s + kChunk;  // e^G_r, once per row (W's right-hand sides)
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int64_t qk_stride = static_cast<int64_t>(Hk) * Dk, v_stride = static_cast<int64_t>(Hv) * Dv;
  // This thread's share of the key head's products (delta_rule_dots_kernel, the same thread
  // mapping), in flight while k is staged and G summed.
  const int ti = tid / 16, tj = tid % 16;
  float kk[4][4], qk[4][4];
  {
    const float* const dots = a.KQ + (static_cast<int64_t>(blockIdx.x) * Hk + kh) * kDotFloats;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int at = (ti + 16 * i) * kChunk + tj + 16 * j;
        kk[i][j] = dots[at];
        qk[i][j] = dots[kChunk * kChunk + at];
      }
    }
  }
  const int words = Dk / 4;
  for (int i = tid; i < kChunk * words; i += kThreads) {
    const int r = i / words, j = (i % words) * 4;
    float4 k4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r < L) {
      k4 = *reinterpret_cast<const float4*>(a.k + (tc + r) * qk_stride +
                                            static_cast<int64_t>(kh) * Dk + j);
    }
    *reinterpret_cast<float4*>(K_s + r * ld + j) = k4;
  }
  if (warp == 0) {
    // G: inclusive prefix sum of g over the chunk in double (as the CPU), two tokens a lane.
    const int r0 = 2 * lane;
    const double g0 = r0 < L ? static_cast<double>(a.g[(tc + r0) * Hv + h]) : 0.0;
    const double g1 = r0 + 1 < L ? static_cast<double>(a.g[(tc + r0 + 1) * Hv + h]) : 0.0;
    double run = g0 + g1;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const double o = __shfl_up_sync(0xffffffffu, run, off);
      if (lane >= off) run += o;
    }
    const double before = run - (g0 + g1);
    G_s[r0] = static_cast<float>(before + g0);
    G_s[r0 + 1] = static_cast<float>(run);
    eG_s[r0] = expf(G_s[r0]);
    eG_s[r0 + 1] = expf(G_s[r0 + 1]);
  }
  if (tid < kChunk) b_s[tid] = tid < L ? a.beta[(tc + tid) * Hv + h] : 0.0f;
  __syncthreads();
  if (tid < L) a.G[(tc + tid) * Hv + h] = G_s[tid];
  // A and P from the key head's products (loaded above).
  {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = ti + 16 * i;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int s = tj + 16 * j;
        // e^(G_r - G_s) only for s <= r (the decay is at most 1 there; above it may overflow).
        const float d = s <= r && r < L ? expf(G_s[r] - G_s[s]) : 0.0f;
        At_s[s * kLdT + r] = s < r ? b_s[r] * kk[i][j] * d : 0.0f;
        P_s[r * kLdT + s] = qk[i][j] * d;
      }
    }
  }
  __syncthreads();
  // P's rows to the workspace (the walking blocks of all column ranges read them).
  for (int i = tid; i < L * (kChunk / 4); i += kThreads) {
    const int r = i / (kChunk / 4), j = (i % (kChunk / 4)) * 4;
    *reinterpret_cast<float4*>(a.P + ((tc + r) * Hv + h) * kChunk + j) =
        *reinterpret_cast<const float4*>(P_s + r * kLdT + j);
  }
  // U and W by forward substitution, one column per thread held in registers: thread t < Dk
  // solves W's column t (right-hand side beta_r e^G_r k_rt), thread Dk + c < Dk + Dv U's column
  // c (beta_r v_rc). Row s, once final, is subtracted from the rows below it through A^T's row
  // s, read as float4 broadcasts.
  const bool is_w = tid < Dk, is_u = !is_w && tid - Dk < Dv;
  if (!is_w && !is_u) return;
  const int col = is_w ? tid : tid - Dk;
  float* const dst = is_w ? a.W : a.U;
  const int width = is_w ? Dk : Dv;
  const auto rhs = [&](int r) {
    float v = 0.0f;
    if (r < L) {
      v = is_w ? eG_s[r] * K_s[r * ld + col]
               : a.v[(tc + r) * v_stride + static_cast<int64_t>(h) * Dv + col];
    }
    return b_s[r] * v;
  };
  // Rows [r0, r0 + kRows): x holds them; row s of them, once final, is subtracted from the
  // rows below it through A^T's row s, read as float4 broadcasts; then they are written.
  const auto solve = [&](auto rows_tag, int r0, float(&x)[decltype(rows_tag)::value]) {
    constexpr int kRows = decltype(rows_tag)::value;
#pragma unroll
    for (int s = 0; s < kRows - 1; ++s) {
      const float xs = x[s];
#pragma unroll
      for (int r4 = s / 4; r4 < kRows / 4; ++r4) {
        const float4 at = reinterpret_cast<const float4*>(At_s + (r0 + s) * kLdT + r0)[r4];
        x[4 * r4] -= at.x * xs;  // A^T[s][r] = 0 for r <= s: those rows are unchanged
        x[4 * r4 + 1] -= at.y * xs;
        x[4 * r4 + 2] -= at.z * xs;
        x[4 * r4 + 3] -= at.w * xs;
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r0 + r < L) dst[((tc + r0 + r) * Hv + h) * width + col] = x[r];
    }
  };
  // The first half is solved and written; then the second half's right-hand sides less the
  // first half's terms, in the order one pass over the column subtracts them (row s = 0, 1,
  // ...), the first half read back from where it was written (all its rows are below L then,
  // and this thread wrote them: program order); then the second half.
  constexpr int kHalf = kChunk / 2;
  using Half = std::integral_constant<int, kHalf>;
  float x[kHalf];
#pragma unroll
  for (int r = 0; r < kHalf; ++r) x[r] = rhs(r);
  solve(Half{}, 0, x);
  if (L <= kHalf) return;  // the second half's rows are all past the chunk's end
#pragma unroll
  for (int r = 0; r < kHalf; ++r) x[r] = rhs(kHalf + r);
#pragma unroll 4
  for (int s = 0; s < kHalf; ++s) {
    const float xs = __ldcg(dst + ((tc + s) * Hv + h) * width + col);
#pragma unroll
    for (int r4 = 0; r4 < kHalf / 4; ++r4) {
      const float4 at = reinterpret_cast<const float4*>(At_s + s * kLdT + kHalf)[r4];
      x[4 * r4] -= at.x * xs;
      x[4 * r4 + 1] -= at.y * xs;
      x[4 * r4 + 2] -= at.z * xs;
      x[4 * r4 + 3] -= at.w * xs;
    }
  }
  solve(Half{}, kHalf, x);
}

// The walk's products on the tensor cores: m16n8k8 TF32 tiles with each F32 operand split
// into a TF32 big part and the remainder (split_tf32), d += a_s b_b + a_b b_s + a_b b_b (about
// 2^-21 relative per product, F32 accumulation), so the walk agrees with the CPU's F32 like
// the SIMT form it replaces.
constexpr int kLdA = kMaxDim + 4;  // rows of W, e^G q and k' (A operands; rows g in distinct banks)
constexpr int kLdB = kCols + 8;    // rows of S and V' (B operands; rows t, t + 4 in distinct banks)

// big: x rounded to TF32's 10 mantissa bits (ties away from zero), two integer operations;
// small: the exact remainder, whose low 13 bits the tensor cores ignore (truncation: 2^-21 of
// x at most).
__device__ __forceinline__ void split_tf32(float x, uint32_t& big, uint32_t& small) {
  big = (__float_as_uint(x) + 0x1000u) & 0xFFFFE000u;
  small = __float_as_uint(x - __uint_as_float(big));
}

__device__ __forceinline__ float round_tf32(float x) {
  return __uint_as_float((__float_as_uint(x) + 0x1000u) & 0xFFFFE000u);
}
__device__ __forceinline__ float4 round_tf32(float4 v) {
  return make_float4(round_tf32(v.x), round_tf32(v.y), round_tf32(v.z), round_tf32(v.w));
}

// How a fragment's values become operands: split into big and small parts (F32-accurate), the
// big part alone (one pass), or as they are (values already rounded to TF32 when staged).
enum class Tf32 { kSplit, kRound, kRaw };

// An A fragment (4 values) or a B fragment (2); small only with Tf32::kSplit.
template <int N, Tf32 M>
struct Tf32Frag {
  uint32_t big[N], small[N];
  __device__ __forceinline__ explicit Tf32Frag(const float (&v)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if constexpr (M == Tf32::kSplit) {
        split_tf32(v[i], big[i], small[i]);
      } else if constexpr (M == Tf32::kRound) {
        big[i] = __float_as_uint(round_tf32(v[i]));
      } else {
        big[i] = __float_as_uint(v[i]);
      }
    }
  }
};

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d += a b: with split operands three passes (the small products first); otherwise
// (PrefillPrecision::kFast) one TF32 pass over the big parts, 11 significant bits per operand
// as in the fast F16 GEMM.
template <Tf32 MA, Tf32 MB>
__device__ __forceinline__ void mma_3xtf32(float (&d)[4], const Tf32Frag<4, MA>& a,
                                           const Tf32Frag<2, MB>& b) {
  static_assert((MA == Tf32::kSplit) == (MB == Tf32::kSplit), "both operands split, or neither");
  if constexpr (MA == Tf32::kSplit) {
    mma_tf32(d, a.small, b.big[0], b.big[1]);
    mma_tf32(d, a.big, b.small[0], b.small[1]);
  }
  mma_tf32(d, a.big, b.big[0], b.big[1]);
}

// The A fragment at rows m0 + g (+8), columns k0 + t (+4) of a row-major matrix with row
// stride ld (lane: g = lane / 4, t = lane % 4).
template <Tf32 M>
__device__ __forceinline__ Tf32Frag<4, M> load_a(const float* p, int ld, int m0, int k0, int g,
                                                 int t) {
  const float* r = p + (m0 + g) * ld + k0 + t;
  const float v[4] = {r[0], r[8 * ld], r[4], r[8 * ld + 4]};
  return Tf32Frag<4, M>(v);
}

// The A fragment of the transpose of a row-major matrix: A[i][r] = p[r * ld + i].
template <Tf32 M>
__device__ __forceinline__ Tf32Frag<4, M> load_at(const float* p, int ld, int m0, int k0, int g,
                                                  int t) {
  const float* r = p + (k0 + t) * ld + m0 + g;
  const float v[4] = {r[0], r[8], r[4 * ld], r[4 * ld + 8]};
  return Tf32Frag<4, M>(v);
}

// The B fragment at rows k0 + t (+4), column n0 + g of a row-major matrix.
template <Tf32 M>
__device__ __forceinline__ Tf32Frag<2, M> load_b(const float* p, int ld, int k0, int n0, int g,
                                                 int t) {
  const float* r = p + (k0 + t) * ld + n0 + g;
  const float v[2] = {r[0], r[4 * ld]};
  return Tf32Frag<2, M>(v);
}

// Shared memory of walk (floats): S slice [kMaxDim][kLdB]; X (W, then e^(G_L-G) k) and Y (e^G
// q, then V' [kChunk][kLdB]) [kChunk][kLdA] each; P [kChunk][kLdT].
size_t walk_smem_floats() {
  return static_cast<size_t>(kMaxDim) * kLdB + 2 * static_cast<size_t>(kChunk) * kLdA +
         static_cast<size_t>(kChunk) * kLdT;
}

// Per chunk, with k_dim padded with zeros to Dp (a multiple of 16) and rows past the chunk's
// end zero (so V' is zero there):
//   A: warp (mt, nh) = (warp % 4, warp / 4) takes rows 16 mt.. and columns 16 nh.. of
//      V' = U - W S and of e^G q S (K = Dp);
//   B: the same tiles of O += P V' (K: the rows up to the tile's last, P being causal);
//   C: warp w takes state rows 16 w.. of S <- e^G_L S + k'^T V' (K: the chunk's rows).
// kFast: one TF32 pass, W, e^G q, k', P and V' rounded to TF32 once as they are staged (each is
// read by several warps), S (kept in F32: the decay multiplies it every chunk) as it is read.
template <bool kFast, int kD>
__global__ void __launch_bounds__(kThreads, 2) delta_rule_walk_kernel(ChunkArgs a) {
  constexpr Tf32 kStaged = kFast ? Tf32::kRaw : Tf32::kSplit;
  constexpr Tf32 kState = kFast ? Tf32::kRound : Tf32::kSplit;
  const auto staged = [](auto v) {
    if constexpr (kFast) {
      return round_tf32(v);
    } else {
      return v;
    }
  };
  pdl_begin();
  extern __shared__ __align__(16) float sh[];
  const int s = blockIdx.x, h = blockIdx.y, c0 = blockIdx.z * kCols;
  const int Hv = a.st.v_heads, Hk = a.st.k_heads;
  const int Dk = kD > 0 ? kD : a.st.k_dim, Dv = kD > 0 ? kD : a.st.v_dim;
  const int kh = h / (Hv / Hk);
  const int Dp = (Dk + 15) / 16 * 16;
  float* const S_s = sh;                    // [Dp][kLdB]
  float* const X_s = S_s + kMaxDim * kLdB;  // [kChunk][kLdA]
  float* const Y_s = X_s + kChunk * kLdA;   // [kChunk][kLdA]; V' [kChunk][kLdB] after A
  float* const P_s = Y_s + kChunk * kLdA;   // [kChunk][kLdT]
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  float* const S = a.st.ssm + (static_cast<int64_t>(a.slots[s]) * Hv + h) * Dk * Dv;
  for (int i = tid; i < Dp * kCols; i += kThreads) {
    const int r = i / kCols, c = i % kCols;
    S_s[r * kLdB + c] = r < Dk && c0 + c < Dv ? S[static_cast<int64_t>(r) * Dv + c0 + c] : 0.0f;
  }
  const int64_t t0 = a.seqs.cu_seqlens[s], t1 = a.seqs.cu_seqlens[s + 1];
  const int64_t qk_stride = static_cast<int64_t>(Hk) * Dk, v_stride = static_cast<int64_t>(Hv) * Dv;
  const int words = Dp / 4;                                // float4s of a padded row
  constexpr int kItems = kChunk * kMaxDim / 4 / kThreads;  // row float4s a thread loads, at most
  const int mt = warp & 3, nh = warp >> 2, m0 = 16 * mt;

  for (int64_t tc = t0; tc < t1; tc += kChunk) {
    const int L = static_cast<int>(t1 - tc < kChunk ? t1 - tc : kChunk);
    const float GL = a.G[(tc + L - 1) * Hv + h];
    // This chunk's k' = e^(G_L - G_r) k_r, held until X is free; W and e^G q into X and Y.
    float4 kr[kItems];
    __syncthreads();  // the previous chunk's readers of X, Y, P and writers of S are done
#pragma unroll
    for (int n = 0; n < kItems; ++n) {
      const int i = tid + n * kThreads;
      const int r = i / words, j = (i % words) * 4;
      float4 w4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), q4 = w4, k4 = w4;
      if (r < L && j < Dk) {
        const float G = a.G[(tc + r) * Hv + h];
        const int64_t at = (tc + r) * qk_stride + static_cast<int64_t>(kh) * Dk + j;
        w4 = *reinterpret_cast<const float4*>(a.W + ((tc + r) * Hv + h) * Dk + j);
        q4 = *reinterpret_cast<const float4*>(a.q + at);
        k4 = *reinterpret_cast<const float4*>(a.k + at);
        const float e = expf(G), f = expf(GL - G);
        q4 = make_float4(e * q4.x, e * q4.y, e * q4.z, e * q4.w);
        k4 = make_float4(f * k4.x, f * k4.y, f * k4.z, f * k4.w);
      }
      kr[n] = staged(k4);
      if (r < kChunk) {
        *reinterpret_cast<float4*>(X_s + r * kLdA + j) = staged(w4);
        *reinterpret_cast<float4*>(Y_s + r * kLdA + j) = staged(q4);
      }
    }
    for (int i = tid; i < kChunk * (kChunk / 4); i += kThreads) {
      const int r = i / (kChunk / 4), j = (i % (kChunk / 4)) * 4;
      float4 p4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (r < L) p4 = *reinterpret_cast<const float4*>(a.P + ((tc + r) * Hv + h) * kChunk + j);
      *reinterpret_cast<float4*>(P_s + r * kLdT + j) = staged(p4);
    }
    // U at this warp's V' fragments: rows m0 + g (+8), columns 16 nh + 8 n + 2t (+1).
    float u[2][4];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = m0 + g + 8 * (e >> 1), c = c0 + 16 * nh + 8 * n + 2 * t + (e & 1);
        u[n][e] = r < L && c < Dv ? a.U[((tc + r) * Hv + h) * Dv + c] : 0.0f;
      }
    }
    __syncthreads();
    // A: W S and e^G q S.
    float ws[2][4] = {}, ob[2][4] = {};
    const auto step_a = [&](int k0) {
      const auto wa = load_a<kStaged>(X_s, kLdA, m0, k0, g, t);
      const auto qa = load_a<kStaged>(Y_s, kLdA, m0, k0, g, t);
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const auto sb = load_b<kState>(S_s, kLdB, k0, 16 * nh + 8 * n, g, t);
        mma_3xtf32(ws[n], wa, sb);
        mma_3xtf32(ob[n], qa, sb);
      }
    };
    if constexpr (kFast) {
      // Left to itself the compiler hoists more of the cheaper loads than 128 registers hold.
#pragma unroll 2
      for (int k0 = 0; k0 < Dp; k0 += 8) step_a(k0);
    } else {
      for (int k0 = 0; k0 < Dp; k0 += 8) step_a(k0);
    }
    __syncthreads();  // X and Y are read: V' goes into Y, k' into X
    float* const V_s = Y_s;
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const int c = 16 * nh + 8 * n + 2 * t;
      *reinterpret_cast<float2*>(V_s + (m0 + g) * kLdB + c) =
          make_float2(staged(u[n][0] - ws[n][0]), staged(u[n][1] - ws[n][1]));
      *reinterpret_cast<float2*>(V_s + (m0 + g + 8) * kLdB + c) =
          make_float2(staged(u[n][2] - ws[n][2]), staged(u[n][3] - ws[n][3]));
    }
#pragma unroll
    for (int n = 0; n < kItems; ++n) {
      const int i = tid + n * kThreads;
      const int r = i / words, j = (i % words) * 4;
      if (r < kChunk) *reinterpret_cast<float4*>(X_s + r * kLdA + j) = kr[n];
    }
    __syncthreads();
    // B: o_r = e^G_r S^T q_r + sum_{s<=r} P_rs V'_s (P is zero above the diagonal).
    for (int k0 = 0; k0 < m0 + 16 && k0 < L; k0 += 8) {
      const auto pa = load_a<kStaged>(P_s, kLdT, m0, k0, g, t);
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        mma_3xtf32(ob[n], pa, load_b<kStaged>(V_s, kLdB, k0, 16 * nh + 8 * n, g, t));
      }
    }
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = m0 + g + 8 * (e >> 1), c = c0 + 16 * nh + 8 * n + 2 * t + (e & 1);
        if (r < L && c < Dv)
          a.out[(tc + r) * v_stride + static_cast<int64_t>(h) * Dv + c] = ob[n][e];
      }
    }
    // C: S <- e^G_L S + sum_r k'_r V'_r^T for rows i0.. (this warp's own rows of S).
    const int i0 = 16 * warp;
    if (i0 < Dp) {
      const float eL = expf(GL);
      float acc[4][4];
#pragma unroll
      for (int n = 0; n < 4; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          acc[n][e] = eL * S_s[(i0 + g + 8 * (e >> 1)) * kLdB + 8 * n + 2 * t + (e & 1)];
        }
      }
      for (int k0 = 0; k0 < L; k0 += 8) {
        const auto ka = load_at<kStaged>(X_s, kLdA, i0, k0, g, t);
#pragma unroll
        for (int n = 0; n < 4; ++n)
          mma_3xtf32(acc[n], ka, load_b<kStaged>(V_s, kLdB, k0, 8 * n, g, t));
      }
#pragma unroll
      for (int n = 0; n < 4; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          S_s[(i0 + g + 8 * (e >> 1)) * kLdB + 8 * n + 2 * t + (e & 1)] = acc[n][e];
        }
      }
    }
  }
  __syncthreads();
  for (int i = tid; i < Dk * kCols; i += kThreads) {
    const int r = i / kCols, cc = i % kCols;
    if (c0 + cc < Dv) S[static_cast<int64_t>(r) * Dv + c0 + cc] = S_s[r * kLdB + cc];
  }
}

// The three kernels of one call, compiled for head dims kD (0: the state view's, at run time).
template <int kD>
void launch_chunked_kernels(CUstream_st* st, const ChunkArgs& a, const SeqLayout& seqs, bool fast) {
  const int Dk = a.st.k_dim, Dv = a.st.v_dim;
  const int ld = (Dk > Dv ? Dk : Dv) + 4;
  const size_t prep_smem = prepare_smem_floats(ld) * sizeof(float);
  const size_t walk_smem = walk_smem_floats() * sizeof(float);
  const size_t dots_smem = dots_smem_floats(Dk) * sizeof(float);
  TM_CUDA(cudaFuncSetAttribute(delta_rule_dots_kernel<kD>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(dots_smem_floats(kMaxDim) * sizeof(float))));
  TM_CUDA(cudaFuncSetAttribute(delta_rule_prepare_kernel<kD>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(prepare_smem_floats(kMaxDim + 4) * sizeof(float))));
  const auto walk = fast ? delta_rule_walk_kernel<true, kD> : delta_rule_walk_kernel<false, kD>;
  TM_CUDA(cudaFuncSetAttribute(walk, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(walk_smem)));
  // At most n_tokens / kChunk + n_seqs chunks; blocks past the last chunk return at once.
  const unsigned chunks = static_cast<unsigned>(ws_chunk_bound(seqs));
  launch_pdl(delta_rule_dots_kernel<kD>, dim3(chunks, static_cast<unsigned>(a.st.k_heads)),
             dim3(kThreads), dots_smem, st, a);
  TM_CUDA_LAUNCHED();
  launch_pdl(delta_rule_prepare_kernel<kD>, dim3(chunks, static_cast<unsigned>(a.st.v_heads)),
             dim3(kThreads), prep_smem, st, a);
  TM_CUDA_LAUNCHED();
  const dim3 grid(static_cast<unsigned>(seqs.n_seqs), static_cast<unsigned>(a.st.v_heads),
                  static_cast<unsigned>((Dv + kCols - 1) / kCols));
  launch_pdl(walk, grid, dim3(kThreads), walk_smem, st, a);
  TM_CUDA_LAUNCHED();
}

}  // namespace

size_t delta_rule_chunked_ws_floats(const GDNStateView& st, const SeqLayout& seqs) {
  if (st.k_dim < 4 || st.k_dim > kMaxDim || st.k_dim % 4 != 0 || st.v_dim < 1 ||
      st.v_dim > kMaxDim || st.k_dim + st.v_dim > kThreads || seqs.n_seqs <= 0 ||
      seqs.n_seqs > 65535 || st.v_heads > 65535) {
    return 0;
  }
  return static_cast<size_t>(seqs.n_tokens) * st.v_heads * ws_floats_per_row(st) +
         ws_chunk_bound(seqs) * st.k_heads * kDotFloats;
}

bool launch_delta_rule_chunked(CUstream_st* st, const GDNStateView& state, const SeqLayout& seqs,
                               const int32_t* slots, const float* q, const float* k, const float* v,
                               const float* g, const float* beta, float* out, float* ws,
                               size_t ws_floats, bool fast) {
  const size_t need = delta_rule_chunked_ws_floats(state, seqs);
  if (need == 0 || ws_floats < need || reinterpret_cast<uintptr_t>(q) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(k) % 16 != 0 || reinterpret_cast<uintptr_t>(ws) % 16 != 0) {
    return false;
  }
  const int Dk = state.k_dim, Dv = state.v_dim;
  const size_t rows = static_cast<size_t>(seqs.n_tokens) * state.v_heads;
  // W, P's 64-float rows and the dot products first (multiples of 4 floats when k_dim is), then
  // U and G.
  float* W = ws;
  float* P = W + rows * Dk;
  float* KQ = P + rows * kChunk;
  float* U = KQ + ws_chunk_bound(seqs) * state.k_heads * kDotFloats;
  float* G = U + rows * Dv;
  const ChunkArgs a{state, seqs, slots, q, k, v, g, beta, out, W, U, P, G, KQ};
  // Qwen3.5's head dims (128) get kernels compiled for them: the staging loops' index
  // arithmetic by a constant row width (shifts, not divisions by a runtime value).
  if (Dk == kMaxDim && Dv == kMaxDim) {
    launch_chunked_kernels<kMaxDim>(st, a, seqs, fast);
  } else {
    launch_chunked_kernels<0>(st, a, seqs, fast);
  }
  return true;
}

}  // namespace tokenmill::cuda
