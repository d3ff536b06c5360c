// Sampler semantics against distributions computed directly in the test: each filter keeps
// exactly the tokens it should, penalties follow vLLM's formulas, draws are seeded.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <random>

#include "engine/sampler.h"
#include "util/token_pick.h"

namespace tokenmill {
namespace {

// Empirical token frequencies over many seeded draws.
std::map<int32_t, double> frequencies(const SamplingParams& p, const std::vector<float>& logits,
                                      int draws, const std::vector<int32_t>& prompt = {}) {
  std::map<int32_t, double> f;
  for (int i = 0; i < draws; ++i) {
    Sampler s(p, 1000 + i, prompt);
    std::vector<float> l = logits;
    f[s.sample(l.data(), static_cast<int>(l.size()), nullptr)] += 1.0 / draws;
  }
  return f;
}

std::vector<double> softmax(const std::vector<float>& l, double t) {
  double m = *std::max_element(l.begin(), l.end()), z = 0;
  std::vector<double> p(l.size());
  for (size_t i = 0; i < l.size(); ++i) z += p[i] = std::exp((l[i] - m) / t);
  for (double& x : p) x /= z;
  return p;
}

const std::vector<float> kLogits = {2.0f, 1.5f, 1.0f, 0.0f, -1.0f, -3.0f};

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p, 1, {});
  std::vector<float> l = {0.5f, 3.0f, 3.0f, 1.0f};
  EXPECT_EQ(s.sample(l.data(), 4, nullptr), 1);
}

// argmax (greedy's pick, also used by the engine without copying the logits) is exactly
// std::max_element: lowest index among equal maxima, -0 == +0, NaN skipped except at index 0.
TEST(Sampler, ArgmaxIsMaxElement) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> small(-3, 3);
  for (int vocab : {1, 2, 7, 8, 9, 17, 100, 32768}) {
    for (int rep = 0; rep < 20; ++rep) {
      std::vector<float> l(static_cast<size_t>(vocab));
      for (float& x : l) x = static_cast<float>(small(rng));  // many ties
      if (rep % 4 == 1) l[rng() % vocab] = NAN;
      if (rep % 4 == 2) l[0] = NAN;
      if (rep % 4 == 3) {
        for (float& x : l) x = x > 0 ? -0.0f : x;  // maxima -0 and +0 mixed
        l[rng() % vocab] = 0.0f;
      }
      const auto want = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
      ASSERT_EQ(argmax(l.data(), vocab), want) << "vocab " << vocab << " rep " << rep;
    }
  }
}

TEST(Sampler, TemperatureMatchesSoftmax) {
  SamplingParams p;
  p.temperature = 0.7f;
  auto f = frequencies(p, kLogits, 20000);
  auto want = softmax(kLogits, 0.7);
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(f[i], want[i], 0.015) << i;
}

TEST(Sampler, TopKTopPMinPKeepExactlyTheRightTokens) {
  SamplingParams p;
  p.top_k = 2;
  auto f = frequencies(p, kLogits, 4000);
  for (auto& [t, x] : f) EXPECT_LT(t, 2) << "top_k=2 drew token " << t;
  // top_p: keep the smallest prefix whose mass reaches p. Probabilities at T=1:
  auto probs = softmax(kLogits, 1.0);
  SamplingParams q;
  q.top_p = static_cast<float>(probs[0] + probs[1] + 0.5 * probs[2]);  // needs tokens 0..2
  f = frequencies(q, kLogits, 4000);
  EXPECT_GT(f[2], 0.0);
  for (auto& [t, x] : f) EXPECT_LT(t, 3) << "top_p drew token " << t;
  // min_p: keep tokens with p >= min_p * p_max.
  SamplingParams r;
  r.min_p = static_cast<float>(probs[3] / probs[0]) + 1e-4f;  // token 3 just below the cut
  f = frequencies(r, kLogits, 4000);
  EXPECT_GT(f[2], 0.0);
  for (auto& [t, x] : f) EXPECT_LT(t, 3) << "min_p drew token " << t;
}

// pick_candidates (which skips the exp of tokens that cannot reach the top k) keeps exactly
// the tokens, with the same probabilities, as the plain computation: exp of every logit,
// min-p, the k largest logits (ties: lower id), the top-p prefix in that order. Over a 50,000-token
// vocabulary with runs of equal logits at the top-k boundary, -inf entries, and distributions
// peaky enough that the k-th token's probability underflows.
TEST(Sampler, CandidatesEqualTheFullComputation) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int vocab = 50000;
  using Cand = std::vector<std::pair<float, int32_t>>;
  int cases = 0;
  for (float spread : {1.0f, 8.0f, 60.0f}) {
    std::vector<float> l(vocab);
    for (float& x : l) x = spread * normal(rng);
    for (int i = 0; i < vocab; i += 97) l[i] = -INFINITY;
    // A run of equal logits among the most probable (the boundary of small k).
    std::vector<float> sorted = l;
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    for (int i = 0; i < vocab; i += 1000) l[i] = sorted[12];
    for (float t : {0.3f, 0.7f, 1.5f}) {
      for (int k : {0, 1, 5, 20, 1000}) {
        for (float top_p : {1.0f, 0.9f}) {
          for (float min_p : {0.0f, 0.05f}) {
            TokenPick p;
            p.temperature = t;
            p.top_k = k;
            p.top_p = top_p;
            p.min_p = min_p;
            const auto by_logit = [&](const auto& a, const auto& b) {
              const float la = l[a.second], lb = l[b.second];
              return la > lb || (la == lb && a.second < b.second);
            };
            Cand want;
            float mx = -INFINITY;
            for (float x : l) mx = std::max(mx, x);
            for (int i = 0; i < vocab; ++i) {
              if (l[i] == -INFINITY) continue;
              const float e = std::exp((l[i] - mx) * (1.0f / t));
              if (e > 0.0f && !(min_p > 0.0f && e < min_p)) want.emplace_back(e, i);
            }
            std::sort(want.begin(), want.end(), by_logit);
            if (k > 0 && static_cast<size_t>(k) < want.size()) want.resize(static_cast<size_t>(k));
            if (top_p < 1.0f) {
              double sum = 0, acc = 0;
              for (const auto& c : want) sum += c.first;
              size_t n = 0;
              while (n < want.size()) {
                acc += want[n++].first;
                if (acc >= top_p * sum) break;
              }
              want.resize(n);
            }
            Cand got;
            std::vector<float> heap;
            ASSERT_TRUE(pick_candidates(l.data(), vocab, p, &got, &heap));
            std::sort(got.begin(), got.end(), by_logit);
            ASSERT_EQ(got, want) << "spread " << spread << " T " << t << " k " << k << " top_p "
                                 << top_p << " min_p " << min_p;
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 180);
}

// sample_row (const logits; penalties and a mask go to a copy) draws what sample() draws for the
// same seed, with and without penalties and a mask.
TEST(Sampler, SampleRowEqualsSampleOnACopy) {
  std::vector<uint8_t> allowed = {1, 1, 0, 1, 1, 1};
  for (int variant = 0; variant < 4; ++variant) {
    SamplingParams p;
    p.temperature = variant == 3 ? 0.0f : 0.9f;
    p.top_k = 4;
    if (variant == 1) p.repetition_penalty = 1.3f;
    const uint8_t* mask = variant == 2 ? allowed.data() : nullptr;
    Sampler a(p, 11, {0, 1}), b(p, 11, {0, 1});
    std::vector<float> work;
    for (int i = 0; i < 40; ++i) {
      const std::vector<float> row = kLogits;
      std::vector<float> copy = kLogits;
      const int32_t want = a.sample(copy.data(), 6, mask);
      EXPECT_EQ(b.sample_row(row.data(), 6, mask, &work), want) << "variant " << variant;
      a.accept(want);
      b.accept(want);
    }
  }
}

TEST(Sampler, PenaltiesFollowVllm) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 2.0f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  Sampler s(p, 1, /*prompt=*/{1});
  s.accept(0);
  s.accept(0);
  // token 0: repetition (2.0 -> 1.0), then frequency 2*0.25 and presence 0.5 -> 0.0
  // token 1 (prompt only): 1.5 -> 0.75; token 2 untouched: 1.0 -> wins.
  std::vector<float> l = kLogits;
  EXPECT_EQ(s.sample(l.data(), 6, nullptr), 2);
  EXPECT_FLOAT_EQ(l[0], 0.0f);
  EXPECT_FLOAT_EQ(l[1], 0.75f);
  // Negative logits are multiplied by the repetition penalty.
  Sampler n(p, 1, {4});
  std::vector<float> m = kLogits;
  n.sample(m.data(), 6, nullptr);
  EXPECT_FLOAT_EQ(m[4], -2.0f);
}

// The penalties' entries (what Backend::penalize_rows receives): each token once, the prompt's
// only with a repetition penalty (output count 0 until the output holds them), the output's with
// their counts; none without penalties.
TEST(Sampler, PenaltyEntriesCountEachTokenOnce) {
  const auto entries = [](const Sampler& s) {
    std::vector<PenaltyEntry> e;
    s.penalty_entries(&e);
    std::map<int32_t, int32_t> m;
    for (const PenaltyEntry& x : e) EXPECT_TRUE(m.emplace(x.token, x.output_count).second);
    EXPECT_EQ(e.size(), s.penalty_entry_count());
    return m;
  };
  SamplingParams rep;
  rep.repetition_penalty = 1.2f;
  Sampler a(rep, 1, {5, 7, 5, 9});
  a.accept(7);
  a.accept(3);
  a.accept(3);
  EXPECT_EQ(entries(a), (std::map<int32_t, int32_t>{{3, 2}, {5, 0}, {7, 1}, {9, 0}}));
  SamplingParams pres;
  pres.presence_penalty = 0.5f;
  Sampler b(pres, 1, {5, 7});
  b.accept(7);
  b.accept(7);
  b.accept(4);
  EXPECT_EQ(entries(b), (std::map<int32_t, int32_t>{{4, 1}, {7, 2}}));
  Sampler c(SamplingParams{}, 1, {5, 7});
  c.accept(7);
  EXPECT_TRUE(entries(c).empty());
}

TEST(Sampler, MaskAndSeeds) {
  SamplingParams p;
  std::vector<uint8_t> allowed = {0, 0, 0, 1, 0, 1};
  for (int i = 0; i < 200; ++i) {
    Sampler s(p, i, {});
    std::vector<float> l = kLogits;
    int32_t t = s.sample(l.data(), 6, allowed.data());
    EXPECT_TRUE(t == 3 || t == 5);
  }
  Sampler a(p, 42, {}), b(p, 42, {});
  for (int i = 0; i < 50; ++i) {
    std::vector<float> la = kLogits, lb = kLogits;
    EXPECT_EQ(a.sample(la.data(), 6, nullptr), b.sample(lb.data(), 6, nullptr));
  }
}

TEST(Sampler, LogprobsAreRawLogSoftmax) {
  std::vector<TopLogprob> top;
  float lp = token_logprob(kLogits.data(), 6, 2, 3, &top);
  auto probs = softmax(kLogits, 1.0);
  EXPECT_NEAR(lp, std::log(probs[2]), 1e-6);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].token, 0);
  EXPECT_EQ(top[2].token, 2);
  EXPECT_NEAR(top[1].logprob, std::log(probs[1]), 1e-6);
}

}  // namespace
}  // namespace tokenmill
