// RoPE, paged KV append and causal GQA attention over a paged KV cache.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_simd.h"
#include "util/error.h"

namespace tokenmill {
namespace {

// Keys scored per softmax tile: the running max and sum are rescaled once per tile.
constexpr int kTile = 64;

// Sequence index of each token row from cu_seqlens, written to seq_of[0..n_tokens).
void map_tokens(const SeqLayout& seqs, std::vector<int32_t>& seq_of) {
  seq_of.assign(static_cast<size_t>(seqs.n_tokens), -1);
  for (int s = 0; s < seqs.n_seqs; ++s) {
    TM_CHECK(
        seqs.cu_seqlens[s] <= seqs.cu_seqlens[s + 1] && seqs.cu_seqlens[s + 1] <= seqs.n_tokens,
        "cu_seqlens[{}..{}] = {}..{} with {} tokens", s, s + 1, seqs.cu_seqlens[s],
        seqs.cu_seqlens[s + 1], seqs.n_tokens);
    for (int t = seqs.cu_seqlens[s]; t < seqs.cu_seqlens[s + 1]; ++t)
      seq_of[static_cast<size_t>(t)] = s;
  }
}

// Cache row of position p of sequence s: [kv_heads, head_dim] floats.
inline int64_t cache_row(const KVLayerView& kv, const KVPaging& pg, int s, int64_t p) {
  const int64_t b = p / kv.block_size;
  TM_CHECK(b < pg.max_blocks_per_seq, "position {} needs block {} of {} per sequence", p, b,
           pg.max_blocks_per_seq);
  const int32_t block = pg.block_tables[static_cast<int64_t>(s) * pg.max_blocks_per_seq + b];
  TM_CHECK(block >= 0, "sequence {} has no block for position {}", s, p);
  return (static_cast<int64_t>(block) * kv.block_size + p % kv.block_size) * kv.kv_heads;
}

// acc[0, NV*W) += sum_j p[j] * V_j[0, NV*W) for the n rows V_j = v + rows[j]: the accumulators
// stay in registers across the positions (one FMA per vector and position).
template <class S, int NV, class T>
void accumulate_pv(float* acc, const float* p, const T* v, const int64_t* rows, int n) {
  typename S::V a[NV];
  TM_UNROLL
  for (int u = 0; u < NV; ++u) a[u] = S::load(acc + u * S::W);
  for (int j = 0; j < n; ++j) {
    const typename S::V pj = S::set1(p[j]);
    const T* vj = v + rows[j];
    TM_UNROLL
    for (int u = 0; u < NV; ++u) a[u] = S::fma(pj, cpu::load_elems<S>(vj + u * S::W), a[u]);
  }
  TM_UNROLL
  for (int u = 0; u < NV; ++u) S::store(acc + u * S::W, a[u]);
}

// acc[0, D) += sum_j p[j] * (v + rows[j])[0, D), in register-sized column chunks.
template <class S, class T>
void accumulate_pv_row(float* acc, const float* p, const T* v, const int64_t* rows, int n, int D) {
  constexpr int W = S::W;
  int d = 0;
  for (; d + 8 * W <= D; d += 8 * W) accumulate_pv<S, 8>(acc + d, p, v + d, rows, n);
  for (; d + W <= D; d += W) accumulate_pv<S, 1>(acc + d, p, v + d, rows, n);
  for (; d < D; ++d) {
    float s = acc[d];
    for (int j = 0; j < n; ++j) s += p[j] * cpu::elem_f32(v[rows[j] + d]);
    acc[d] = s;
  }
}

}  // namespace

void CpuBackend::rope(float* x, const int32_t* positions, int n_tokens, int heads, int head_dim,
                      int64_t token_stride, int rot_dim, float theta) {
  TM_CHECK(rot_dim % 2 == 0 && rot_dim <= head_dim && rot_dim <= 1024, "rot_dim {} head_dim {}",
           rot_dim, head_dim);
  const int half = rot_dim / 2;
  // Frequencies and angles in F32 exactly as HF/vLLM compute them (inv_freq = 1/theta^(2i/rd),
  // angle = pos * inv_freq), so large positions round the same way they do.
  float inv_freq[512];
  for (int i = 0; i < half; ++i) {
    inv_freq[i] = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(rot_dim));
  }
  pool_.run(
      n_tokens,
      [&](int64_t b, int64_t e, int) {
        for (int64_t t = b; t < e; ++t) {
          const float pos = static_cast<float>(positions[t]);
          for (int i = 0; i < half; ++i) {
            const float ang = pos * inv_freq[i];
            const float c = std::cos(ang), s = std::sin(ang);
            for (int h = 0; h < heads; ++h) {
              float* xh = x + t * token_stride + static_cast<int64_t>(h) * head_dim;
              const float x0 = xh[i], x1 = xh[i + half];
              xh[i] = x0 * c - x1 * s;
              xh[i + half] = x1 * c + x0 * s;
            }
          }
        }
      },
      std::max(1, 4096 / std::max(1, heads * rot_dim)));
}

bool CpuBackend::supports_kv_dtype(DType dtype) const {
  return dtype == DType::F32 || dtype == DType::BF16;
}

void CpuBackend::kv_append(const KVLayerView& kv, const KVPaging& paging, const SeqLayout& seqs,
                           const float* k, const float* v) {
  TM_CHECK(supports_kv_dtype(kv.dtype), "kv cache of {}", dtype_name(kv.dtype));
  map_tokens(seqs, index_scratch_);
  const int64_t row = static_cast<int64_t>(kv.kv_heads) * kv.head_dim;
  pool_.run(
      seqs.n_tokens,
      [&](int64_t b, int64_t e, int) {
        for (int64_t t = b; t < e; ++t) {
          const int s = index_scratch_[static_cast<size_t>(t)];
          TM_CHECK(s >= 0, "token {} belongs to no sequence", t);
          const int64_t dst = cache_row(kv, paging, s, seqs.positions[t]) * kv.head_dim;
          if (kv.dtype == DType::F32) {
            std::memcpy(static_cast<float*>(kv.k) + dst, k + t * row, static_cast<size_t>(row) * 4);
            std::memcpy(static_cast<float*>(kv.v) + dst, v + t * row, static_cast<size_t>(row) * 4);
          } else {
            uint16_t* kd = static_cast<uint16_t*>(kv.k) + dst;
            uint16_t* vd = static_cast<uint16_t*>(kv.v) + dst;
            for (int64_t i = 0; i < row; ++i) {
              kd[i] = f32_to_bf16(k[t * row + i]);
              vd[i] = f32_to_bf16(v[t * row + i]);
            }
          }
        }
      },
      16);
}

void CpuBackend::attention(const KVLayerView& kv, const KVPaging& paging, const SeqLayout& seqs,
                           const float* q, int heads, float scale, float* out) {
  TM_CHECK(kv.kv_heads > 0 && heads % kv.kv_heads == 0, "{} query heads over {} kv heads", heads,
           kv.kv_heads);
  TM_CHECK(kv.block_size > 0, "kv block size {}", kv.block_size);
  TM_CHECK(supports_kv_dtype(kv.dtype), "kv cache of {}", dtype_name(kv.dtype));
  map_tokens(seqs, index_scratch_);
  const int T = seqs.n_tokens, D = kv.head_dim, r = heads / kv.kv_heads;
  const int64_t row_stride = static_cast<int64_t>(kv.kv_heads) * D;  // between positions
  // Work items are (token, chunk of its positions), every head at once, so a thread reads whole
  // cache rows of consecutive positions. With few tokens (decode) the context is cut into
  // chunks so that every thread gets several; each chunk leaves a partial softmax (max, sum,
  // unnormalised output) per head and a second pass merges them. With many tokens a token is
  // one item and writes its output directly.
  const int threads = pool_.size();
  int64_t chunk = std::numeric_limits<int32_t>::max();
  if (static_cast<int64_t>(T) < 4 * threads) {
    const int64_t want = (4 * threads + T - 1) / T;  // chunks per token
    chunk = std::max<int64_t>(kTile, (paging.max_context_len + want - 1) / want);
    chunk = (chunk + kTile - 1) / kTile * kTile;
  }
  // Items of token t: [first[t], first[t + 1]), chunk c covering [c * chunk, ...) up to pos.
  attn_first_.resize(static_cast<size_t>(T) + 1);
  attn_first_[0] = 0;
  for (int t = 0; t < T; ++t) {
    const int64_t pos = seqs.positions[t];
    TM_CHECK(pos >= 0, "query at position {}", pos);
    attn_first_[t + 1] = attn_first_[t] + (pos / chunk + 1);
  }
  const int64_t items = attn_first_[T];
  const int64_t part = static_cast<int64_t>(heads) * (D + 2);  // acc [heads, D], max, sum
  float* partials = items > T ? shared_scratch(static_cast<size_t>(items * part)) : nullptr;
  // Per thread: scores [heads, kTile], max and sum [heads], the item's accumulators [heads, D]
  // when it writes out directly, and the tile's cache row offsets [kTile] (int64, at an even
  // float offset).
  const size_t rows_at = (static_cast<size_t>(heads) * (kTile + 2 + D) + 1) / 2 * 2;
  reserve_thread_scratch(rows_at + 2 * kTile);
  // The cache's elements as F32 or BF16 (uint16_t) pointers: one copy of the loop per type.
  auto with_cache = [&](auto&& f) {
    if (kv.dtype == DType::F32) {
      f(static_cast<const float*>(kv.k), static_cast<const float*>(kv.v));
    } else {
      f(static_cast<const uint16_t*>(kv.k), static_cast<const uint16_t*>(kv.v));
    }
  };
  with_cache([&](auto* kcache, auto* vcache) {
    cpu::with_isa(options_.scalar_kernels, [&](auto isa) {
      using S = decltype(isa);
      constexpr int W = S::W;
      pool_.run(
          items,
          [&](int64_t b, int64_t e, int worker) {
            float* sc = thread_scratch(worker);
            float* mx = sc + static_cast<int64_t>(heads) * kTile;
            float* sum = mx + heads;
            float* own_acc = sum + heads;
            auto* rows = reinterpret_cast<int64_t*>(sc + rows_at);
            int t = 0;
            for (int64_t item = b; item < e; ++item) {
              while (attn_first_[t + 1] <= item) ++t;
              const int s = index_scratch_[static_cast<size_t>(t)];
              TM_CHECK(s >= 0, "token {} belongs to no sequence", t);
              const int64_t pos = seqs.positions[t];
              TM_CHECK(pos < paging.context_lens[s],
                       "query at position {} but sequence {} holds {} cached tokens", pos, s,
                       paging.context_lens[s]);
              const bool direct = attn_first_[t + 1] - attn_first_[t] == 1;
              float* acc = direct ? own_acc : partials + item * part;
              const int64_t c0 = (item - attn_first_[t]) * chunk;
              const int64_t c1 = std::min(pos + 1, c0 + chunk);
              const float* qt = q + static_cast<int64_t>(t) * heads * D;
              std::fill(acc, acc + static_cast<int64_t>(heads) * D, 0.0f);
              for (int h = 0; h < heads; ++h) {
                mx[h] = -std::numeric_limits<float>::infinity();
                sum[h] = 0.0f;
              }
              for (int64_t p0 = c0; p0 < c1; p0 += kTile) {
                const int n = static_cast<int>(std::min<int64_t>(kTile, c1 - p0));
                // Cache offsets of the tile's positions: one block-table lookup per block.
                for (int j = 0; j < n;) {
                  const int64_t row0 = cache_row(kv, paging, s, p0 + j);
                  const int in_block = static_cast<int>((p0 + j) % kv.block_size);
                  const int m = std::min(n - j, kv.block_size - in_block);
                  for (int i = 0; i < m; ++i, ++j) rows[j] = row0 * D + i * row_stride;
                }
                for (int j = 0; j < n; ++j) {
                  for (int g = 0; g < kv.kv_heads; ++g) {
                    const auto* kp = kcache + rows[j] + static_cast<int64_t>(g) * D;
                    for (int h = g * r; h < (g + 1) * r; ++h)
                      sc[h * kTile + j] = scale * cpu::dot<S>(qt + h * D, kp, D);
                  }
                }
                for (int h = 0; h < heads; ++h) {
                  float* sh = sc + h * kTile;
                  float m = mx[h];
                  for (int j = 0; j < n; ++j) m = std::max(m, sh[j]);
                  const float c = std::exp(mx[h] - m);  // 0 on the first tile (mx = -inf)
                  if (c != 1.0f) {
                    sum[h] *= c;
                    for (int d = 0; d < D; ++d) acc[h * D + d] *= c;
                  }
                  mx[h] = m;
                  const typename S::V vm = S::set1(m);
                  typename S::V vs = S::zero();
                  int j = 0;
                  for (; j + W <= n; j += W) {
                    const typename S::V p = S::exp(S::sub(S::load(sh + j), vm));
                    S::store(sh + j, p);
                    vs = S::add(vs, p);
                  }
                  float tail = 0.0f;
                  for (; j < n; ++j) tail += (sh[j] = std::exp(sh[j] - m));
                  sum[h] += S::reduce(vs) + tail;
                }
                for (int h = 0; h < heads; ++h) {
                  const auto* vg = vcache + static_cast<int64_t>(h / r) * D;
                  accumulate_pv_row<S>(acc + h * D, sc + h * kTile, vg, rows, n, D);
                }
              }
              if (direct) {
                for (int h = 0; h < heads; ++h) {
                  float* o = out + (static_cast<int64_t>(t) * heads + h) * D;
                  const float inv = 1.0f / sum[h];
                  for (int d = 0; d < D; ++d) o[d] = acc[h * D + d] * inv;
                }
              } else {
                float* ms = acc + static_cast<int64_t>(heads) * D;
                for (int h = 0; h < heads; ++h) {
                  ms[2 * h] = mx[h];
                  ms[2 * h + 1] = sum[h];
                }
              }
            }
          },
          1);
    });
  });
  if (partials == nullptr) return;
  // Merge the chunks of each split token: out = sum_c e^(m_c - M) acc_c / sum_c e^(m_c - M) l_c.
  pool_.run(
      static_cast<int64_t>(T) * heads,
      [&](int64_t b, int64_t e, int) {
        for (int64_t item = b; item < e; ++item) {
          const int t = static_cast<int>(item / heads), h = static_cast<int>(item % heads);
          const int64_t f0 = attn_first_[t], f1 = attn_first_[t + 1];
          if (f1 - f0 == 1) continue;  // written directly
          float M = -std::numeric_limits<float>::infinity();
          for (int64_t c = f0; c < f1; ++c) M = std::max(M, partials[c * part + heads * D + 2 * h]);
          float* o = out + (static_cast<int64_t>(t) * heads + h) * D;
          std::fill(o, o + D, 0.0f);
          float L = 0.0f;
          for (int64_t c = f0; c < f1; ++c) {
            const float* pc = partials + c * part;
            const float w = std::exp(pc[heads * D + 2 * h] - M);
            L += w * pc[heads * D + 2 * h + 1];
            for (int d = 0; d < D; ++d) o[d] += w * pc[h * D + d];
          }
          const float inv = 1.0f / L;
          for (int d = 0; d < D; ++d) o[d] *= inv;
        }
      },
      1);
}

}  // namespace tokenmill
