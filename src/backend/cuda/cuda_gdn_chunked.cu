// The gated delta rule in its chunked form (MODEL-SPEC B) for prefill, in chunks of kChunk
// tokens with the CPU backend's chunk boundaries (cpu_gdn.cpp). With G_r the in-chunk
// cumulative log decay of token r, B = diag(beta), E = diag(e^G), and
//   A_rs = beta_r (k_r.k_s) e^(G_r - G_s) (s < r),  P_rs = (q_r.k_s) e^(G_r - G_s) (s <= r),
// the CPU's forward substitution V'_r = beta_r (v_r - e^G_r S^T k_r) - sum_{s<r} A_rs V'_s is
// (I + A) V' = B V - B E K S, so V' = U - W S with
//   U = (I + A)^-1 B V   and   W = (I + A)^-1 B E K,
// which do not depend on the state. Two kernels:
//   prepare (every chunk of every head at once): A and P, then U and W by forward substitution
//     on their columns (a column per thread, in registers); writes U, W, P and G.
//   walk (per sequence, value head and kCols state columns, chunk after chunk):
//     V' = U - W S;  o_r = e^G_r S^T q_r + sum_{s<=r} P_rs V'_s;
//     S <- e^G_L S + sum_r e^(G_L - G_r) k_r V'_r^T   (L: the chunk's last token).
// So the part that must run in order is three dense products per chunk; the per-token chains
// (the substitution) run in parallel over chunks. All arithmetic F32.
//
// Why: the recurrent kernel walks the tokens one at a time (a dot product, two shuffles, an
// update and another dot product per token): 12 ms per 27B layer at an 8k-token prompt.
#include <cuda_runtime.h>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_common.cuh"

namespace tokenmill::cuda {
namespace {

constexpr int kChunk = 64;        // tokens per chunk (the CPU's kChunk)
constexpr int kCols = 32;         // state columns per walking block
constexpr int kThreads = 256;     // 8 warps, both kernels
constexpr int kMaxDim = 128;      // k_dim and v_dim at most this
constexpr int kLdT = kChunk + 4;  // rows of A^T and P: float4-aligned, rows in distinct banks

// Workspace per token row and value head (floats): W [k_dim], U [v_dim], P's row [kChunk], G.
size_t ws_floats_per_row(const GDNStateView& st) {
  return static_cast<size_t>(st.k_dim) + st.v_dim + kChunk + 1;
}

struct ChunkArgs {
  GDNStateView st;
  SeqLayout seqs;
  const int32_t* slots;
  const float *q, *k, *v, *g, *beta;
  float* out;
  // Workspace, each indexed by (token row, value head): W, U, P, G.
  float *W, *U, *P, *G;
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

// Shared memory of prepare (floats): k and q rows [kChunk][ld] each (ld = max(k_dim, v_dim) +
// 4), A^T and P [kChunk][kLdT] each, G and beta [kChunk] each.
size_t prepare_smem_floats(int ld) {
  return 2 * static_cast<size_t>(kChunk) * ld + 2 * static_cast<size_t>(kChunk) * kLdT + 2 * kChunk;
}

__global__ void __launch_bounds__(kThreads, 2) delta_rule_prepare_kernel(ChunkArgs a) {
  pdl_begin();
  extern __shared__ __align__(16) float sh[];
  int64_t tc = 0;
  int L = 0;
  if (!find_chunk(a.seqs, static_cast<int>(blockIdx.x), &tc, &L)) return;
  const int h = blockIdx.y;
  const int Hv = a.st.v_heads, Hk = a.st.k_heads, Dk = a.st.k_dim, Dv = a.st.v_dim;
  const int kh = h / (Hv / Hk);
  const int ld = (Dk > Dv ? Dk : Dv) + 4;
  float* const K_s = sh;                    // [kChunk][ld]
  float* const Q_s = K_s + kChunk * ld;     // [kChunk][ld]
  float* const At_s = Q_s + kChunk * ld;    // [kChunk][kLdT]: At[s][r] = A_rs
  float* const P_s = At_s + kChunk * kLdT;  // [kChunk][kLdT]: P[r][s]
  float* const G_s = P_s + kChunk * kLdT;
  float* const b_s = G_s + kChunk;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int64_t qk_stride = static_cast<int64_t>(Hk) * Dk, v_stride = static_cast<int64_t>(Hv) * Dv;
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
  }
  if (tid < kChunk) b_s[tid] = tid < L ? a.beta[(tc + tid) * Hv + h] : 0.0f;
  __syncthreads();
  if (tid < L) a.G[(tc + tid) * Hv + h] = G_s[tid];
  // A and P: thread (ti, tj) takes rows ti + 16i and columns tj + 16j (i, j < 4), so the rows
  // a quarter-warp reads for its columns fall in distinct banks.
  {
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
  float x[kChunk];
#pragma unroll
  for (int r = 0; r < kChunk; ++r) {
    float rhs = 0.0f;
    if (r < L) {
      rhs = is_w ? expf(G_s[r]) * K_s[r * ld + col]
                 : a.v[(tc + r) * v_stride + static_cast<int64_t>(h) * Dv + col];
    }
    x[r] = b_s[r] * rhs;
  }
#pragma unroll
  for (int s = 0; s < kChunk - 1; ++s) {
    const float xs = x[s];
#pragma unroll
    for (int r4 = s / 4; r4 < kChunk / 4; ++r4) {
      const float4 at = reinterpret_cast<const float4*>(At_s + s * kLdT)[r4];
      x[4 * r4] -= at.x * xs;  // A^T[s][r] = 0 for r <= s: those rows are unchanged
      x[4 * r4 + 1] -= at.y * xs;
      x[4 * r4 + 2] -= at.z * xs;
      x[4 * r4 + 3] -= at.w * xs;
    }
  }
  float* const dst = is_w ? a.W : a.U;
  const int width = is_w ? Dk : Dv;
#pragma unroll
  for (int r = 0; r < kChunk; ++r) {
    if (r < L) dst[((tc + r) * Hv + h) * width + col] = x[r];
  }
}

// Shared memory of walk (floats): S slice [Dk][kCols], X (W, then e^(G_L-G) k) and Y (e^G q)
// [kChunk][Dk + 4] each, P [kChunk][kLdT], V' [kChunk][kCols], G [kChunk].
size_t walk_smem_floats(int Dk) {
  return static_cast<size_t>(Dk) * kCols + 2 * static_cast<size_t>(kChunk) * (Dk + 4) +
         static_cast<size_t>(kChunk) * kLdT + static_cast<size_t>(kChunk) * kCols + kChunk;
}

__global__ void __launch_bounds__(kThreads, 2) delta_rule_walk_kernel(ChunkArgs a) {
  pdl_begin();
  extern __shared__ __align__(16) float sh[];
  const int s = blockIdx.x, h = blockIdx.y, c0 = blockIdx.z * kCols;
  const int Hv = a.st.v_heads, Hk = a.st.k_heads, Dk = a.st.k_dim, Dv = a.st.v_dim;
  const int kh = h / (Hv / Hk);
  const int ld = Dk + 4;
  float* const S_s = sh;                    // [Dk][kCols]
  float* const X_s = S_s + Dk * kCols;      // [kChunk][ld]
  float* const Y_s = X_s + kChunk * ld;     // [kChunk][ld]
  float* const P_s = Y_s + kChunk * ld;     // [kChunk][kLdT]
  float* const V_s = P_s + kChunk * kLdT;   // [kChunk][kCols]
  float* const G_s = V_s + kChunk * kCols;  // [kChunk]
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  float* const S = a.st.ssm + (static_cast<int64_t>(a.slots[s]) * Hv + h) * Dk * Dv;
  for (int i = tid; i < Dk * kCols; i += kThreads) {
    const int r = i / kCols, c = i % kCols;
    S_s[i] = c0 + c < Dv ? S[static_cast<int64_t>(r) * Dv + c0 + c] : 0.0f;
  }
  const int64_t t0 = a.seqs.cu_seqlens[s], t1 = a.seqs.cu_seqlens[s + 1];
  const int64_t qk_stride = static_cast<int64_t>(Hk) * Dk, v_stride = static_cast<int64_t>(Hv) * Dv;
  const int words = Dk / 4;
  // Thread roles: (row, column) products take column lane and rows warp + 8m; the state update
  // takes column lane and state rows 16 warp + j (k_dim <= 128 = 8 warps x 16).
  const int c = lane;
  const bool col_live = c0 + c < Dv;

  for (int64_t tc = t0; tc < t1; tc += kChunk) {
    const int L = static_cast<int>(t1 - tc < kChunk ? t1 - tc : kChunk);
    __syncthreads();  // the previous chunk's readers of X/Y/P/V' and writers of S are done
    if (tid < kChunk) G_s[tid] = tid < L ? a.G[(tc + tid) * Hv + h] : 0.0f;
    __syncthreads();
    for (int i = tid; i < kChunk * words; i += kThreads) {
      const int r = i / words, j = (i % words) * 4;
      float4 w4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), q4 = w4;
      if (r < L) {
        w4 = *reinterpret_cast<const float4*>(a.W + ((tc + r) * Hv + h) * Dk + j);
        q4 = *reinterpret_cast<const float4*>(a.q + (tc + r) * qk_stride +
                                              static_cast<int64_t>(kh) * Dk + j);
        const float e = expf(G_s[r]);
        q4 = make_float4(e * q4.x, e * q4.y, e * q4.z, e * q4.w);
      }
      *reinterpret_cast<float4*>(X_s + r * ld + j) = w4;
      *reinterpret_cast<float4*>(Y_s + r * ld + j) = q4;
    }
    for (int i = tid; i < kChunk * (kChunk / 4); i += kThreads) {
      const int r = i / (kChunk / 4), j = (i % (kChunk / 4)) * 4;
      float4 p4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (r < L) p4 = *reinterpret_cast<const float4*>(a.P + ((tc + r) * Hv + h) * kChunk + j);
      *reinterpret_cast<float4*>(P_s + r * kLdT + j) = p4;
    }
    float u[kChunk / 8];
#pragma unroll
    for (int m = 0; m < kChunk / 8; ++m) {
      const int r = warp + 8 * m;
      u[m] = r < L && col_live ? a.U[((tc + r) * Hv + h) * Dv + c0 + c] : 0.0f;
    }
    __syncthreads();
    // V' = U - W S and the state's part of the output, e^G q S, for rows warp + 8m.
    float ob[kChunk / 8];
    {
      float ws[kChunk / 8];
#pragma unroll
      for (int m = 0; m < kChunk / 8; ++m) ws[m] = ob[m] = 0.0f;
      for (int w = 0; w < words; ++w) {
        const float* Sc = S_s + (4 * w) * kCols + c;
        const float s0 = Sc[0], s1 = Sc[kCols], s2 = Sc[2 * kCols], s3 = Sc[3 * kCols];
#pragma unroll
        for (int m = 0; m < kChunk / 8; ++m) {
          const int r = warp + 8 * m;
          const float4 w4 = reinterpret_cast<const float4*>(X_s + r * ld)[w];
          const float4 q4 = reinterpret_cast<const float4*>(Y_s + r * ld)[w];
          ws[m] += w4.x * s0 + w4.y * s1 + w4.z * s2 + w4.w * s3;
          ob[m] += q4.x * s0 + q4.y * s1 + q4.z * s2 + q4.w * s3;
        }
      }
#pragma unroll
      for (int m = 0; m < kChunk / 8; ++m) V_s[(warp + 8 * m) * kCols + c] = u[m] - ws[m];
    }
    __syncthreads();
    // X <- e^(G_L - G_r) k_r for the state update (W is no longer read).
    const float GL = G_s[L - 1];
    for (int i = tid; i < kChunk * words; i += kThreads) {
      const int r = i / words, j = (i % words) * 4;
      float4 k4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (r < L) {
        k4 = *reinterpret_cast<const float4*>(a.k + (tc + r) * qk_stride +
                                              static_cast<int64_t>(kh) * Dk + j);
        const float f = expf(GL - G_s[r]);
        k4 = make_float4(f * k4.x, f * k4.y, f * k4.z, f * k4.w);
      }
      *reinterpret_cast<float4*>(X_s + r * ld + j) = k4;
    }
    // Output: o_r = e^G_r S^T q_r + sum_{s<=r} P_rs V'_s (P is zero above the diagonal).
#pragma unroll
    for (int w = 0; w < kChunk / 4; ++w) {
      const float v0 = V_s[(4 * w) * kCols + c], v1 = V_s[(4 * w + 1) * kCols + c],
                  v2 = V_s[(4 * w + 2) * kCols + c], v3 = V_s[(4 * w + 3) * kCols + c];
#pragma unroll
      for (int m = 0; m < kChunk / 8; ++m) {
        const float4 p4 = reinterpret_cast<const float4*>(P_s + (warp + 8 * m) * kLdT)[w];
        ob[m] += p4.x * v0 + p4.y * v1 + p4.z * v2 + p4.w * v3;
      }
    }
#pragma unroll
    for (int m = 0; m < kChunk / 8; ++m) {
      const int r = warp + 8 * m;
      if (r < L && col_live)
        a.out[(tc + r) * v_stride + static_cast<int64_t>(h) * Dv + c0 + c] = ob[m];
    }
    __syncthreads();
    // State: S <- e^G_L S + sum_r e^(G_L - G_r) k_r V'_r^T, rows 16 warp + j in registers.
    const int i0 = 16 * warp;
    if (i0 < Dk) {
      const float eL = expf(GL);
      float acc[16];
#pragma unroll
      for (int j = 0; j < 16; ++j) acc[j] = i0 + j < Dk ? eL * S_s[(i0 + j) * kCols + c] : 0.0f;
      for (int r = 0; r < L; ++r) {
        const float vr = V_s[r * kCols + c];
        const float4* kr = reinterpret_cast<const float4*>(X_s + r * ld + i0);
#pragma unroll
        for (int j4 = 0; j4 < 4; ++j4) {
          if (i0 + 4 * j4 < Dk) {  // Dk is a multiple of 4
            const float4 k4 = kr[j4];
            acc[4 * j4] += k4.x * vr;
            acc[4 * j4 + 1] += k4.y * vr;
            acc[4 * j4 + 2] += k4.z * vr;
            acc[4 * j4 + 3] += k4.w * vr;
          }
        }
      }
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        if (i0 + j < Dk) S_s[(i0 + j) * kCols + c] = acc[j];
      }
    }
  }
  __syncthreads();
  for (int i = tid; i < Dk * kCols; i += kThreads) {
    const int r = i / kCols, cc = i % kCols;
    if (c0 + cc < Dv) S[static_cast<int64_t>(r) * Dv + c0 + cc] = S_s[i];
  }
}

}  // namespace

size_t delta_rule_chunked_ws_floats(const GDNStateView& st, const SeqLayout& seqs) {
  if (st.k_dim < 4 || st.k_dim > kMaxDim || st.k_dim % 4 != 0 || st.v_dim < 1 ||
      st.v_dim > kMaxDim || st.k_dim + st.v_dim > kThreads || seqs.n_seqs <= 0 ||
      seqs.n_seqs > 65535 || st.v_heads > 65535) {
    return 0;
  }
  return static_cast<size_t>(seqs.n_tokens) * st.v_heads * ws_floats_per_row(st);
}

bool launch_delta_rule_chunked(CUstream_st* st, const GDNStateView& state, const SeqLayout& seqs,
                               const int32_t* slots, const float* q, const float* k, const float* v,
                               const float* g, const float* beta, float* out, float* ws,
                               size_t ws_floats) {
  const size_t need = delta_rule_chunked_ws_floats(state, seqs);
  if (need == 0 || ws_floats < need || reinterpret_cast<uintptr_t>(q) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(k) % 16 != 0 || reinterpret_cast<uintptr_t>(ws) % 16 != 0) {
    return false;
  }
  const int Dk = state.k_dim, Dv = state.v_dim;
  const size_t rows = static_cast<size_t>(seqs.n_tokens) * state.v_heads;
  // W and U first (both multiples of 4 floats per row when k_dim is), P's 64-float rows, G.
  float* W = ws;
  float* P = W + rows * Dk;
  float* U = P + rows * kChunk;
  float* G = U + rows * Dv;
  const ChunkArgs a{state, seqs, slots, q, k, v, g, beta, out, W, U, P, G};
  const int ld = (Dk > Dv ? Dk : Dv) + 4;
  const size_t prep_smem = prepare_smem_floats(ld) * sizeof(float);
  const size_t walk_smem = walk_smem_floats(Dk) * sizeof(float);
  TM_CUDA(cudaFuncSetAttribute(delta_rule_prepare_kernel,
                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(prepare_smem_floats(kMaxDim + 4) * sizeof(float))));
  TM_CUDA(cudaFuncSetAttribute(delta_rule_walk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(walk_smem_floats(kMaxDim) * sizeof(float))));
  // At most n_tokens / kChunk + n_seqs chunks; blocks past the last chunk return at once.
  const unsigned chunks = static_cast<unsigned>(seqs.n_tokens / kChunk + seqs.n_seqs);
  launch_pdl(delta_rule_prepare_kernel, dim3(chunks, static_cast<unsigned>(state.v_heads)),
             dim3(kThreads), prep_smem, st, a);
  TM_CUDA_LAUNCHED();
  const dim3 grid(static_cast<unsigned>(seqs.n_seqs), static_cast<unsigned>(state.v_heads),
                  static_cast<unsigned>((Dv + kCols - 1) / kCols));
  launch_pdl(delta_rule_walk_kernel, grid, dim3(kThreads), walk_smem, st, a);
  TM_CUDA_LAUNCHED();
  return true;
}

}  // namespace tokenmill::cuda
