// Split-context decode attention over BF16 caches (on sm_90 the tensor-core first pass,
// cuda_attention_split_tc.cu) against the CPU over the same cache: 1, 6 and 8 query heads per
// kv head at head_dim 128 and 256; contexts of 1 to 3,001 positions spread over many splits
// (most of them empty for the short ones; one row alone over 3,001 positions takes more splits
// than the combine holds in registers, cuda_attention_combine.cu); 40 query rows whose whole
// contexts fall in one split (each warp's ring of stages reused several times); several rows of one
// sequence at consecutive positions (speculative verify); a sequence whose block table misses a
// block (NaN rows, the others unaffected). attention_out: with a gate and a 4-bit output projection
// at 1..4 decode rows, the combine gates the rows and writes the projection's digits; its output
// must be the bits of CUDA's own attention + sigmoid_mul_linear (the composed
// Backend::attention_out), and the CPU's within the split tolerance; other shapes (5 rows, no gate,
// a bf16 projection) take the composed form. Tolerance 1e-4 relative (the F32 kernels hold 1e-5):
// the tensor-core pass splits queries and probabilities into BF16 high and low parts, 16
// significant bits each (2^-16 = 1.5e-5 relative an element; measured up to about 3e-5 of the
// output's scale), 256 times finer than the BF16 cache's own rounding of K and V.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "cuda_test_util.h"

namespace tokenmill::cudatest {
namespace {

class CudaAttentionSplit : public CudaVsCpu {};

// One decode step over a cache whose contexts are already filled: sequence s has ctx[s]
// positions, the last rows[s] of them are this step's query rows.
struct SplitCase {
  std::vector<int> ctx, rows;
};

TEST_F(CudaAttentionSplit, Bf16CacheMatchesCpu) {
  Rng rng(41);
  struct Geo {
    int D, heads, kv_heads;
  };
  const int block_size = 16;
  for (const Geo geo : {Geo{256, 24, 4}, Geo{256, 8, 1}, Geo{128, 4, 4}, Geo{128, 16, 2}}) {
    for (const SplitCase& c :
         {SplitCase{{3001, 1, 700}, {1, 1, 1}}, SplitCase{{3001}, {1}},
          SplitCase{{900, 640, 33, 1000, 17}, {8, 8, 8, 8, 8}}, SplitCase{{129, 2000}, {3, 1}}}) {
      const int D = geo.D, kvh = geo.kv_heads, heads = geo.heads;
      const FilledCache fc = filled_bf16_cache(rng, c.ctx, c.rows, block_size, kvh, D);
      const int T = fc.tokens;
      std::vector<float> q = rng.normals(static_cast<size_t>(T) * heads * D);
      const float scale = 1.0f / std::sqrt(static_cast<float>(D));
      const std::string what = "D=" + std::to_string(D) + " heads=" + std::to_string(heads) + "/" +
                               std::to_string(kvh) + " rows=" + std::to_string(T);
      std::vector<float> want(q.size());
      cpu->attention(fc.kv, fc.pg, fc.seqs, q.data(), heads, scale, want.data());

      const KVLayerView& dkv = fc.dkv;
      const SeqLayout& dseqs = fc.dseqs;
      KVPaging dpg = fc.dpg;
      const int capacity = fc.max_blocks * block_size;
      const size_t ws = gpu->attention_workspace_floats(T, heads, D, capacity);
      ASSERT_GT(ws, 0u) << what;
      gpu->set_attention_workspace(poisoned(ws), ws);
      const float* dq = up(q);
      float* out = poisoned(want.size());
      gpu->attention(dkv, dpg, dseqs, dq, heads, scale, out);
      expect_close(down(out, want.size()), want, 1e-4, "bf16 split " + what);

      // Sequence 0 (longer than a block in every case) loses a block in the middle of its
      // table: its rows are NaN, the others still match.
      std::vector<int32_t> holed = fc.tables;
      holed[static_cast<size_t>(c.ctx[0] / block_size / 2)] = -1;
      dpg.block_tables = up(holed);
      float* out2 = poisoned(want.size());
      gpu->attention(dkv, dpg, dseqs, dq, heads, scale, out2);
      const std::vector<float> got2 = down(out2, want.size());
      gpu->set_attention_workspace(nullptr, 0);
      const size_t per_row = static_cast<size_t>(heads) * D;
      const size_t skip = static_cast<size_t>(c.rows[0]) * per_row;  // sequence 0's rows
      for (size_t i = 0; i < skip; ++i) {
        ASSERT_TRUE(std::isnan(got2[i])) << what << ": row of the holed table at " << i;
      }
      expect_close(std::vector<float>(got2.begin() + static_cast<ptrdiff_t>(skip), got2.end()),
                   std::vector<float>(want.begin() + static_cast<ptrdiff_t>(skip), want.end()),
                   1e-4, "bf16 split, holed table " + what);
    }
  }
}

TEST_F(CudaAttentionSplit, GatedOutputProjectionMatchesComposed) {
  Rng rng(43);
  struct Geo {
    int D, heads, kv_heads, group;
  };
  const int block_size = 16, hidden = 96;
  for (const Geo geo : {Geo{256, 16, 2, 64}, Geo{128, 4, 4, 128}, Geo{128, 8, 2, 32}}) {
    for (const SplitCase& c : {SplitCase{{1000}, {1}}, SplitCase{{70, 300, 9}, {1, 1, 1}},
                               SplitCase{{500}, {4}}, SplitCase{{200, 40}, {4, 1}}}) {
      const int D = geo.D, heads = geo.heads, K = heads * D;
      const FilledCache fc = filled_bf16_cache(rng, c.ctx, c.rows, block_size, geo.kv_heads, D);
      const int T = fc.tokens;
      const std::vector<float> q = rng.normals(static_cast<size_t>(T) * K);
      const std::vector<float> gate = rng.normals(q.size(), 2.0f);
      const float scale = 1.0f / std::sqrt(static_cast<float>(D));
      std::vector<HostWeight> ws;
      ws.push_back(affine_weight(rng, 4, geo.group, DType::BF16, hidden, K, 0));
      ws.push_back(float_weight(rng, DType::BF16, hidden, K, 0));
      rebind(ws);
      const size_t ws_floats =
          gpu->attention_workspace_floats(T, heads, D, fc.max_blocks * block_size);
      ASSERT_GT(ws_floats, 0u);
      gpu->set_attention_workspace(poisoned(ws_floats), ws_floats);
      const float *dq = up(q), *dgate = up(gate);
      for (size_t wi = 0; wi < ws.size(); ++wi) {
        const Weight dw = gpu->upload_weight(ws[wi].w);
        for (const bool gated : {true, false}) {
          const std::string what = "D=" + std::to_string(D) + " heads=" + std::to_string(heads) +
                                   " rows=" + std::to_string(T) + (wi == 0 ? " q4" : " bf16") +
                                   (gated ? " gated" : " plain");
          std::vector<float> o(q.size()), want(static_cast<size_t>(T) * hidden);
          cpu->attention_out(fc.kv, fc.pg, fc.seqs, q.data(), heads, scale,
                             gated ? gate.data() : nullptr, ws[wi].w, o.data(), want.data());
          float* out = poisoned(want.size());
          gpu->attention_out(fc.dkv, fc.dpg, fc.dseqs, dq, heads, scale, gated ? dgate : nullptr,
                             dw, poisoned(q.size()), out);
          const std::vector<float> got = down(out, want.size());
          expect_close(got, want, 1e-4, "attention_out " + what);
          float* out2 = poisoned(want.size());
          gpu->Backend::attention_out(fc.dkv, fc.dpg, fc.dseqs, dq, heads, scale,
                                      gated ? dgate : nullptr, dw, poisoned(q.size()), out2);
          expect_close(got, down(out2, want.size()), 0.0, "attention_out composed " + what);
        }
      }
      gpu->set_attention_workspace(nullptr, 0);
    }
  }
}

}  // namespace
}  // namespace tokenmill::cudatest
