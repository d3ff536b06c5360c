// Gated DeltaNet: causal depthwise conv + SiLU with per-slot state, and the gated delta rule in
// its recurrent (per token) and chunked (chunk 64, MODEL-SPEC B) forms.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_simd.h"
#include "util/error.h"

namespace tokenmill {
namespace {

constexpr int kChunk = 64;
constexpr int64_t kConvChannelBlock = 64;

void check_seqs(const SeqLayout& seqs) {
  for (int s = 0; s < seqs.n_seqs; ++s) {
    TM_CHECK(
        seqs.cu_seqlens[s] <= seqs.cu_seqlens[s + 1] && seqs.cu_seqlens[s + 1] <= seqs.n_tokens,
        "cu_seqlens[{}..{}] = {}..{} with {} tokens", s, s + 1, seqs.cu_seqlens[s],
        seqs.cu_seqlens[s + 1], seqs.n_tokens);
  }
}

// Everything one (sequence, value head) pair of the delta rule reads and writes.
struct HeadJob {
  float* S;  // [Dk, Dv] state, updated in place
  const float *q, *k, *v, *g, *beta;
  float* out;
  float* steps;  // [rows, Hv, Dk, Dv] slice of step_states for this head, or nullptr
  int64_t t0, t1;
  int64_t qk_stride, v_stride, gb_stride, steps_stride;  // per-token strides (floats)
  int Dk, Dv;
};

// S = a S; delta = beta (v - S^T k); S += k delta^T; o = S^T q, one token at a time, in two
// passes over the state: S^T k of the old state (then scaled by a), and the update fused with
// the output (row i of the new state is a S_i + k_i delta, and o += q_i S_i while it is loaded).
// NV > 0: Dv = NV vectors exactly, with kS, delta and o held in registers; NV = 0: any Dv.
template <class S_, int NV>
void recurrent(const HeadJob& j, float* tmp) {
  using V = typename S_::V;
  constexpr int W = S_::W;
  const int Dv = j.Dv;
  float* kS = tmp;
  float* delta = tmp + Dv;
  float* o = delta + Dv;
  for (int64_t t = j.t0; t < j.t1; ++t) {
    const float* qt = j.q + t * j.qk_stride;
    const float* kt = j.k + t * j.qk_stride;
    const float* vt = j.v + t * j.v_stride;
    float* ot = j.out + t * j.v_stride;
    const float a = std::exp(j.g[t * j.gb_stride]), bt = j.beta[t * j.gb_stride];
    const V va = S_::set1(a), vb = S_::set1(bt);
    if constexpr (NV > 0) {
      V acc[NV], dl[NV];
      TM_UNROLL
      for (int u = 0; u < NV; ++u) acc[u] = S_::zero();
      for (int i = 0; i < j.Dk; ++i) {
        const float* row = j.S + static_cast<int64_t>(i) * Dv;
        const V vk = S_::set1(kt[i]);
        TM_UNROLL
        for (int u = 0; u < NV; ++u) acc[u] = S_::fma(vk, S_::load(row + u * W), acc[u]);
      }
      TM_UNROLL
      for (int u = 0; u < NV; ++u) {
        dl[u] = S_::mul(vb, S_::sub(S_::load(vt + u * W), S_::mul(va, acc[u])));
        acc[u] = S_::zero();
      }
      for (int i = 0; i < j.Dk; ++i) {
        float* row = j.S + static_cast<int64_t>(i) * Dv;
        const V vk = S_::set1(kt[i]), vq = S_::set1(qt[i]);
        TM_UNROLL
        for (int u = 0; u < NV; ++u) {
          const V r = S_::fma(vk, dl[u], S_::mul(va, S_::load(row + u * W)));
          S_::store(row + u * W, r);
          acc[u] = S_::fma(vq, r, acc[u]);
        }
      }
      TM_UNROLL
      for (int u = 0; u < NV; ++u) S_::store(ot + u * W, acc[u]);
    } else {
      std::fill(kS, kS + Dv, 0.0f);
      for (int i = 0; i < j.Dk; ++i) {
        cpu::scale_axpy<S_>(kS, 1.0f, kt[i], j.S + static_cast<int64_t>(i) * Dv, Dv);
      }
      for (int d = 0; d < Dv; ++d) delta[d] = bt * (vt[d] - a * kS[d]);
      std::fill(o, o + Dv, 0.0f);
      for (int i = 0; i < j.Dk; ++i) {
        float* row = j.S + static_cast<int64_t>(i) * Dv;
        for (int d = 0; d < Dv; ++d) {
          row[d] = kt[i] * delta[d] + a * row[d];
          o[d] += qt[i] * row[d];
        }
      }
      std::memcpy(ot, o, static_cast<size_t>(Dv) * 4);
    }
    if (j.steps) {
      std::memcpy(j.steps + (t - j.t0) * j.steps_stride, j.S, static_cast<size_t>(j.Dk) * Dv * 4);
    }
  }
}

// Runs recurrent<S_, Dv / W> when Dv is 1..8 whole vectors, else the generic form.
template <class S_>
void recurrent_any(const HeadJob& j, float* tmp) {
  constexpr int W = S_::W;
  if (W > 1 && j.Dv % W == 0) {
    switch (j.Dv / W) {
      case 1:
        return recurrent<S_, 1>(j, tmp);
      case 2:
        return recurrent<S_, 2>(j, tmp);
      case 3:
        return recurrent<S_, 3>(j, tmp);
      case 4:
        return recurrent<S_, 4>(j, tmp);
      case 5:
        return recurrent<S_, 5>(j, tmp);
      case 6:
        return recurrent<S_, 6>(j, tmp);
      case 7:
        return recurrent<S_, 7>(j, tmp);
      case 8:
        return recurrent<S_, 8>(j, tmp);
      default:
        break;
    }
  }
  recurrent<S_, 0>(j, tmp);
}

size_t chunked_scratch_floats(int Dv) {
  return static_cast<size_t>(kChunk) * kChunk + static_cast<size_t>(kChunk) * (Dv + 2) + Dv;
}

// Chunked form over chunks of kChunk tokens; with G_r the in-chunk cumulative log decay:
//   A_rs = beta_r (k_r.k_s) e^(G_r-G_s) (s < r);  U = (I+A)^-1 beta V;  W = (I+A)^-1 beta e^G K
//   V' = U - W S (solved as one triangular system);  O_r = e^G_r q_r^T S + sum_{s<=r} (q_r.k_s)
//   e^(G_r-G_s) V'_s S <- e^G_L S + sum_r e^(G_L-G_r) k_r V'_r^T
template <class S_>
void chunked(const HeadJob& j, float* tmp) {
  const int Dk = j.Dk, Dv = j.Dv;
  float* A = tmp;                                    // [C, C]
  float* U = A + kChunk * kChunk;                    // [C, Dv], becomes V'
  float* G = U + static_cast<int64_t>(kChunk) * Dv;  // [C]
  float* eG = G + kChunk;                            // [C]
  float* qs = eG + kChunk;                           // [Dv]
  for (int64_t c0 = j.t0; c0 < j.t1; c0 += kChunk) {
    const int L = static_cast<int>(std::min<int64_t>(kChunk, j.t1 - c0));
    auto kr = [&](int r) { return j.k + (c0 + r) * j.qk_stride; };
    auto qr = [&](int r) { return j.q + (c0 + r) * j.qk_stride; };
    double cum = 0.0;
    for (int r = 0; r < L; ++r) {
      cum += j.g[(c0 + r) * j.gb_stride];
      G[r] = static_cast<float>(cum);
      eG[r] = std::exp(G[r]);
    }
    for (int r = 0; r < L; ++r) {
      const float br = j.beta[(c0 + r) * j.gb_stride];
      for (int s = 0; s < r; ++s) {
        A[r * kChunk + s] = br * cpu::dot<S_>(kr(r), kr(s), Dk) * std::exp(G[r] - G[s]);
      }
      // Forward substitution on the combined right-hand side (U - W S is linear in both):
      // V'_r = beta_r (v_r - e^G_r S^T k_r) - sum_{s<r} A_rs V'_s.
      float* ur = U + static_cast<int64_t>(r) * Dv;
      const float* vr = j.v + (c0 + r) * j.v_stride;
      const float* kk = kr(r);
      std::fill(qs, qs + Dv, 0.0f);
      for (int i = 0; i < Dk; ++i) {
        cpu::scale_axpy<S_>(qs, 1.0f, kk[i], j.S + static_cast<int64_t>(i) * Dv, Dv);
      }
      for (int d = 0; d < Dv; ++d) ur[d] = br * (vr[d] - eG[r] * qs[d]);
      for (int s = 0; s < r; ++s) {
        cpu::scale_axpy<S_>(ur, 1.0f, -A[r * kChunk + s], U + static_cast<int64_t>(s) * Dv, Dv);
      }
    }
    for (int r = 0; r < L; ++r) {
      float* o = j.out + (c0 + r) * j.v_stride;
      const float* qq = qr(r);
      std::fill(qs, qs + Dv, 0.0f);
      for (int i = 0; i < Dk; ++i) {
        cpu::scale_axpy<S_>(qs, 1.0f, qq[i], j.S + static_cast<int64_t>(i) * Dv, Dv);
      }
      for (int d = 0; d < Dv; ++d) o[d] = eG[r] * qs[d];
      for (int s = 0; s <= r; ++s) {
        const float w = cpu::dot<S_>(qq, kr(s), Dk) * std::exp(G[r] - G[s]);
        cpu::scale_axpy<S_>(o, 1.0f, w, U + static_cast<int64_t>(s) * Dv, Dv);
      }
    }
    const float eL = eG[L - 1];
    for (int i = 0; i < Dk; ++i) {
      float* row = j.S + static_cast<int64_t>(i) * Dv;
      cpu::scale_axpy<S_>(row, eL, 0.0f, row, Dv);
    }
    for (int r = 0; r < L; ++r) {
      const float f = std::exp(G[L - 1] - G[r]);
      const float* kk = kr(r);
      const float* vp = U + static_cast<int64_t>(r) * Dv;
      for (int i = 0; i < Dk; ++i) {
        cpu::scale_axpy<S_>(j.S + static_cast<int64_t>(i) * Dv, 1.0f, f * kk[i], vp, Dv);
      }
    }
  }
}

}  // namespace

void CpuBackend::conv1d_silu(const GDNStateView& st, const SeqLayout& seqs, const int32_t* slots,
                             const float* x, const float* weight, float* out) {
  TM_CHECK(x != out, "conv1d_silu cannot run in place");
  TM_CHECK(st.kernel >= 2 && st.kernel <= 16, "conv kernel {}", st.kernel);
  check_seqs(seqs);
  const int64_t C = st.channels;
  const int K = st.kernel, Km1 = K - 1;
  const int64_t blocks = (C + kConvChannelBlock - 1) / kConvChannelBlock;
  cpu::with_isa(options_.scalar_kernels, [&](auto isa) {
    using S = decltype(isa);
    pool_.run(
        static_cast<int64_t>(seqs.n_seqs) * blocks,
        [&](int64_t b, int64_t e, int) {
          for (int64_t item = b; item < e; ++item) {
            const int s = static_cast<int>(item / blocks);
            const int64_t c0 = (item % blocks) * kConvChannelBlock;
            const int64_t c1 = std::min(C, c0 + kConvChannelBlock);
            const int64_t t0 = seqs.cu_seqlens[s], L = seqs.cu_seqlens[s + 1] - t0;
            if (L == 0) continue;
            float* state = st.conv + static_cast<int64_t>(slots[s]) * C * Km1;
            // Pre-activations channel by channel (the state is channel-major), then SiLU over
            // each row's slice of channels as vectors.
            if (L == 1 && K == 4) {  // decode with Qwen3.5's kernel size: no per-channel loops
              const float* xr = x + t0 * C;
              float* o = out + t0 * C;
              for (int64_t c = c0; c < c1; ++c) {
                float* sc = state + c * 3;
                const float* w = weight + c * 4;
                const float s0 = sc[0], s1 = sc[1], s2 = sc[2], xc = xr[c];
                // The same accumulation order and the same explicit FMAs as the general path
                // below (bit-identical results whatever the split of a sequence into calls; left
                // to the compiler, `acc += w * u` was contracted into an FMA on one path and not
                // the other, depending on the optimisation level).
                float acc = 0.0f;
                acc = std::fma(w[0], s0, acc);
                acc = std::fma(w[1], s1, acc);
                acc = std::fma(w[2], s2, acc);
                acc = std::fma(w[3], xc, acc);
                o[c] = acc;
                sc[0] = s1;
                sc[1] = s2;
                sc[2] = xc;
              }
            } else {
              for (int64_t c = c0; c < c1; ++c) {
                float* sc = state + c * Km1;
                const float* w = weight + c * K;
                // Input j of the sequence (j < 0: from the state, oldest first).
                auto u = [&](int64_t jj) { return jj < 0 ? sc[Km1 + jj] : x[(t0 + jj) * C + c]; };
                float next[16];
                for (int i = 0; i < Km1; ++i) next[i] = u(L - Km1 + i);
                for (int64_t t = 0; t < L; ++t) {
                  float acc = 0.0f;
                  for (int i = 0; i < K; ++i) acc = std::fma(w[i], u(t - Km1 + i), acc);
                  out[(t0 + t) * C + c] = acc;
                }
                std::memcpy(sc, next, static_cast<size_t>(Km1) * 4);
              }
            }
            for (int64_t t = 0; t < L; ++t) {
              float* o = out + (t0 + t) * C;
              int64_t c = c0;
              for (; c + S::W <= c1; c += S::W) S::store(o + c, cpu::silu_v<S>(S::load(o + c)));
              for (; c < c1; ++c) o[c] = cpu::silu(o[c]);
            }
          }
        },
        1);
  });
}

void CpuBackend::gated_delta_rule(const GDNStateView& st, const SeqLayout& seqs,
                                  const int32_t* slots, const float* q, const float* k,
                                  const float* v, const float* g, const float* beta, float* out,
                                  float* step_states) {
  TM_CHECK(st.k_heads > 0 && st.v_heads % st.k_heads == 0, "{} value heads over {} key heads",
           st.v_heads, st.k_heads);
  check_seqs(seqs);
  const int Hv = st.v_heads, Hk = st.k_heads, Dk = st.k_dim, Dv = st.v_dim, ratio = Hv / Hk;
  const int64_t state_size = static_cast<int64_t>(Dk) * Dv;
  reserve_thread_scratch(std::max(chunked_scratch_floats(Dv), static_cast<size_t>(3 * Dv)));
  cpu::with_isa(options_.scalar_kernels, [&](auto isa) {
    using S = decltype(isa);
    pool_.run(
        static_cast<int64_t>(seqs.n_seqs) * Hv,
        [&](int64_t b, int64_t e, int worker) {
          for (int64_t item = b; item < e; ++item) {
            const int s = static_cast<int>(item / Hv), h = static_cast<int>(item % Hv);
            const int kh = h / ratio;
            HeadJob j;
            j.S = st.ssm + (static_cast<int64_t>(slots[s]) * Hv + h) * state_size;
            j.t0 = seqs.cu_seqlens[s];
            j.t1 = seqs.cu_seqlens[s + 1];
            j.Dk = Dk;
            j.Dv = Dv;
            j.qk_stride = static_cast<int64_t>(Hk) * Dk;
            j.v_stride = static_cast<int64_t>(Hv) * Dv;
            j.gb_stride = Hv;
            j.q = q + static_cast<int64_t>(kh) * Dk;
            j.k = k + static_cast<int64_t>(kh) * Dk;
            j.v = v + static_cast<int64_t>(h) * Dv;
            j.g = g + h;
            j.beta = beta + h;
            j.out = out + static_cast<int64_t>(h) * Dv;
            j.steps_stride = Hv * state_size;
            j.steps = step_states ? step_states + (j.t0 * Hv + h) * state_size : nullptr;
            const bool use_chunks = !step_states && j.t1 - j.t0 >= gdn_chunk_threshold_;
            if (use_chunks) {
              chunked<S>(j, thread_scratch(worker));
            } else {
              recurrent_any<S>(j, thread_scratch(worker));
            }
          }
        },
        1);
  });
}

}  // namespace tokenmill
