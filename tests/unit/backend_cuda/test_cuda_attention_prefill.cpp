// Prefill attention at PrefillPrecision::kFast over BF16 caches (on sm_90 the wgmma kernel,
// cuda_attention_prefill_wg.cu; on other GPUs the mma.sync kernel's fast form) against the CPU
// over the same cache: a fresh prompt of 520 tokens (nine query tiles of 64 and up to nine key
// tiles, each of the two K/V stages refilled four times), a fresh one of 130, and one adding 150
// rows after 70 cached positions (rows not aligned to the tiles, two tiles masked); query-head
// groups of 6, 2 and 4 at head_dim 256 and 128. Then sequence 0's block table misses a block:
// its rows from the hole on are NaN, every other row still matches.
// Tolerance 2e-2 relative to the output's scale, as CudaAttention.PrefillMatchesCpu's fast check
// (queries and probabilities in F16, 11 significant bits).
#include <algorithm>
#include <cmath>

#include "cuda_test_util.h"

namespace tokenmill::cudatest {
namespace {

class CudaAttentionPrefill : public CudaVsCpu {};

TEST_F(CudaAttentionPrefill, FastLongPromptsMatchCpu) {
  Rng rng(43);
  std::unique_ptr<Backend> fast = make_cuda_backend(0, PrefillPrecision::kFast);
  struct Geo {
    int D, heads, kv_heads;
  };
  const int block_size = 16;
  const std::vector<int> ctx = {520, 130, 220}, rows = {520, 130, 150};
  for (const Geo geo : {Geo{256, 12, 2}, Geo{256, 4, 2}, Geo{128, 8, 2}}) {
    const int D = geo.D, heads = geo.heads;
    const FilledCache fc = filled_bf16_cache(rng, ctx, rows, block_size, geo.kv_heads, D);
    const std::vector<float> q = rng.normals(static_cast<size_t>(fc.tokens) * heads * D, 2.0f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    const std::string what = "fast prefill D=" + std::to_string(D) +
                             " heads=" + std::to_string(heads) + "/" + std::to_string(geo.kv_heads);
    std::vector<float> want(q.size());
    cpu->attention(fc.kv, fc.pg, fc.seqs, q.data(), heads, scale, want.data());

    const float* dq = up(q);
    float* out = poisoned(want.size());
    gpu->synchronize();  // the uploads ran on gpu's stream
    fast->attention(fc.dkv, fc.dpg, fc.dseqs, dq, heads, scale, out);
    fast->synchronize();
    const std::vector<float> got = down(out, want.size());
    expect_close(got, want, 2e-2, what);
    double ss = 0, worst = 0;
    for (float w : want) ss += double{w} * w;
    const double rms = std::sqrt(ss / static_cast<double>(want.size()));
    for (size_t i = 0; i < want.size(); ++i) {
      worst = std::max(worst, std::fabs(double{got[i]} - want[i]) / rms);
    }
    EXPECT_GT(worst, 1e-5) << what << ": F32-accurate, so the exact kernel ran";

    // Sequence 0 loses the block holding positions 256..271: its rows at 256 and after are NaN
    // (their keys reach the hole), its earlier rows and the other sequences' rows match.
    std::vector<int32_t> holed = fc.tables;
    holed[static_cast<size_t>(256 / block_size)] = -1;
    KVPaging dpg = fc.dpg;
    dpg.block_tables = up(holed);
    float* out2 = poisoned(want.size());
    gpu->synchronize();
    fast->attention(fc.dkv, dpg, fc.dseqs, dq, heads, scale, out2);
    fast->synchronize();
    const std::vector<float> got2 = down(out2, want.size());
    const size_t per_row = static_cast<size_t>(heads) * D;
    const size_t hole = 256 * per_row, seq0_end = static_cast<size_t>(rows[0]) * per_row;
    for (size_t i = hole; i < seq0_end; ++i) {
      ASSERT_TRUE(std::isnan(got2[i])) << what << ": row past the hole at " << i;
    }
    std::vector<float> kept_got(got2.begin(), got2.begin() + static_cast<ptrdiff_t>(hole));
    std::vector<float> kept_want(want.begin(), want.begin() + static_cast<ptrdiff_t>(hole));
    kept_got.insert(kept_got.end(), got2.begin() + static_cast<ptrdiff_t>(seq0_end), got2.end());
    kept_want.insert(kept_want.end(), want.begin() + static_cast<ptrdiff_t>(seq0_end), want.end());
    expect_close(kept_got, kept_want, 2e-2, what + ", holed table");
  }
}

}  // namespace
}  // namespace tokenmill::cudatest
