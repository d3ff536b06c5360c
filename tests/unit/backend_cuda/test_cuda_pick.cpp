// Backend::pick_tokens and penalize_rows on the device against the CPU backend's
// (util/token_pick.h on the host). Picks: the same kept set in the same order, so the same token
// for the same draw, unless the draw falls within a hair of a boundary between two tokens'
// shares (the device's expf and the host's exp may differ in their last bits). Penalties: the
// same bits.
#include <algorithm>
#include <cmath>
#include <string>

#include "cuda_test_util.h"
#include "util/token_pick.h"

namespace tokenmill::cudatest {
namespace {

class CudaPick : public CudaVsCpu {};

// Whether `got` and `want` are neighbours in the host's kept list with the draw within 1e-5
// (relative) of the boundary between their shares: the only way a correct device pick may differ.
bool near_boundary(const std::vector<float>& row, const TokenPick& p, int32_t got, int32_t want) {
  PickScratch s;
  if (!pick_candidates(row.data(), static_cast<int>(row.size()), p, &s.cand, &s.heap)) return false;
  double z = 0;
  for (const auto& c : s.cand) z += c.first;
  double acc = 0;
  for (size_t i = 0; i + 1 < s.cand.size(); ++i) {
    acc += s.cand[i].first;
    const bool pair = (s.cand[i].second == got && s.cand[i + 1].second == want) ||
                      (s.cand[i].second == want && s.cand[i + 1].second == got);
    if (pair && std::fabs(p.u * z - acc) <= 1e-5 * z) return true;
  }
  return false;
}

// Rows of 7 to 248,320 logits (one block to 31 per row, 70 rows: two launches) with narrow to
// peaky spreads, runs of equal logits (ties at the k-th go to the lower id), -inf and NaN
// entries, -0 beside +0, and every kind of pick: greedy rows between sampled ones, top-k 1 to
// 128, top-p, min-p, temperatures 0.3 to 1.5. Twice, so the tickets are back at zero.
TEST_F(CudaPick, SampledPicksMatchHost) {
  Rng rng(21);
  const int rows = 70;
  for (int cols : {7, 1000, 8192, 8193, 100003, 248320}) {
    std::vector<float> x(static_cast<size_t>(rows) * cols);
    std::vector<TokenPick> picks(rows);
    for (int r = 0; r < rows; ++r) {
      float* row = x.data() + static_cast<size_t>(r) * cols;
      const float spread = r % 3 == 0 ? 0.5f : r % 3 == 1 ? 3.0f : 20.0f;
      for (int j = 0; j < cols; ++j) row[j] = rng.normal(spread);
      if (r % 4 == 1) {
        for (int j = 0; j < cols; ++j) row[j] = std::round(row[j]);  // many ties
      }
      if (r % 5 == 2) {
        for (int j = 0; j < cols; j += 3) row[j] = -INFINITY;
        row[cols / 2] = NAN;
      }
      if (r % 7 == 3) {
        for (int j = 0; j < cols; ++j) row[j] = j % 2 ? -0.0f : 0.0f;
      }
      TokenPick& p = picks[static_cast<size_t>(r)];
      p.temperature = r % 6 == 0 ? 0.0f : 0.3f + 0.3f * static_cast<float>(r % 5);
      const int ks[] = {1, 2, 20, 50, 128};
      p.top_k = std::min(ks[r % 5], cols - 1);
      p.top_p = r % 3 == 0 ? 1.0f : r % 3 == 1 ? 0.95f : 0.5f;
      p.min_p = r % 4 == 2 ? 0.05f : 0.0f;
      p.u = rng.uniform(0.0f, 1.0f);
      ASSERT_TRUE(gpu->can_pick(p, cols)) << "row " << r;
    }
    std::vector<int32_t> want(rows);
    cpu->pick_tokens(x.data(), rows, cols, picks.data(), want.data());
    const float* dx = up(x);
    for (int call = 0; call < 2; ++call) {
      int32_t* d = up(std::vector<int32_t>(rows, -1));
      gpu->pick_tokens(dx, rows, cols, picks.data(), d);
      const std::vector<int32_t> got = down(d, rows);
      int hairs = 0;
      for (int r = 0; r < rows; ++r) {
        if (got[r] == want[r]) continue;
        const std::vector<float> row(x.begin() + static_cast<int64_t>(r) * cols,
                                     x.begin() + static_cast<int64_t>(r + 1) * cols);
        EXPECT_TRUE(near_boundary(row, picks[r], got[r], want[r]))
            << "cols " << cols << " row " << r << " call " << call << ": cuda " << got[r] << " cpu "
            << want[r] << " (temperature " << picks[r].temperature << " top_k " << picks[r].top_k
            << " top_p " << picks[r].top_p << " min_p " << picks[r].min_p << ")";
        ++hairs;
      }
      EXPECT_LE(hairs, 1) << "cols " << cols;
    }
  }
}

// Penalties on the device equal the CPU backend's bit for bit (the same IEEE division and one
// fma): rows with each penalty alone and together, prompt-only entries (output count 0), a
// pending token that is among the entries (one more count) or not (a new entry), rows without
// penalties beside them, tokens outside the row ignored, and more rows than one launch takes.
TEST_F(CudaPick, PenalizeRowsMatchesCpu) {
  Rng rng(31);
  const int cols = 5000, rows = 1100;
  std::vector<float> x = rng.normals(static_cast<size_t>(rows) * cols, 4.0f);
  std::vector<PenaltyRow> pr(rows);
  std::vector<PenaltyEntry> entries;
  std::vector<int32_t> tokens(rows);
  for (int r = 0; r < rows; ++r) {
    PenaltyRow& p = pr[static_cast<size_t>(r)];
    if (r % 5 == 4) continue;  // none
    p.penalties.repetition = r % 3 == 0 ? 1.0f : 1.3f;
    p.penalties.presence = r % 4 == 0 ? 0.0f : 1.5f;
    p.penalties.frequency = r % 2 ? 0.25f : -0.7f;
    p.first = static_cast<int32_t>(entries.size());
    const int n = rng.integer(0, 60);
    for (int i = 0; i < n; ++i) {
      // Distinct tokens: i * 83 + r % 83 never repeats within the row (n * 83 < cols + 83).
      const int32_t t = i == 7 ? cols + 3 : (i * 83 + r % 83) % cols;
      entries.push_back({t, rng.integer(0, 3)});
    }
    p.count = static_cast<int32_t>(entries.size()) - p.first;
    tokens[static_cast<size_t>(r)] = r % 3 == 1 && n > 0
                                         ? entries[static_cast<size_t>(p.first)].token
                                         : rng.integer(0, cols - 1);
    p.pending_at = r % 7 == 6 ? -1 : r;
  }
  std::vector<float> want = x;
  cpu->penalize_rows(want.data(), rows, cols, pr.data(), entries.data(),
                     static_cast<int64_t>(entries.size()), tokens.data());
  float* dx = up(x);
  gpu->penalize_rows(dx, rows, cols, pr.data(), entries.data(),
                     static_cast<int64_t>(entries.size()), up(tokens));
  const std::vector<float> got = down(dx, x.size());
  int changed = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(got[i], want[i]) << "row " << i / cols << " token " << i % cols;
    changed += want[i] != x[i];
  }
  EXPECT_GT(changed, 20000);  // the penalties did something
}

// What the device refuses (the engine then samples on the host): no top-k, a top-k above 128
// or not below the width; greedy picks always.
TEST_F(CudaPick, RefusesWhatItCannotPick) {
  TokenPick p;
  EXPECT_TRUE(gpu->can_pick(p, 248320));
  p.temperature = 0.7f;
  p.top_k = 0;
  EXPECT_FALSE(gpu->can_pick(p, 248320));
  p.top_k = 129;
  EXPECT_FALSE(gpu->can_pick(p, 248320));
  p.top_k = 128;
  EXPECT_TRUE(gpu->can_pick(p, 248320));
  EXPECT_FALSE(gpu->can_pick(p, 128));
}

}  // namespace
}  // namespace tokenmill::cudatest
