// Split-context decode attention over BF16 caches (on sm_90 the tensor-core first pass,
// cuda_attention_split_tc.cu) against the CPU over the same cache: 1, 6 and 8 query heads per
// kv head at head_dim 128 and 256; contexts of 1 to 3,001 positions spread over many splits
// (most of them empty for the short ones); 40 query rows whose whole contexts fall in one split
// (each warp's ring of stages reused several times); several rows of one sequence at
// consecutive positions (speculative verify); a sequence whose block table misses a block (NaN
// rows, the others unaffected).
// Tolerance 1e-4 relative (the F32 kernels hold 1e-5): the tensor-core pass splits queries and
// probabilities into BF16 high and low parts, 16 significant bits each (2^-16 = 1.5e-5 relative
// an element; measured up to about 3e-5 of the output's scale), 256 times finer than the BF16
// cache's own rounding of K and V.
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
         {SplitCase{{3001, 1, 700}, {1, 1, 1}},
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

}  // namespace
}  // namespace tokenmill::cudatest
