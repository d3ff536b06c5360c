#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tokenmill {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
}

Sampler::Sampler(const SamplingParams& params, uint64_t seed, const std::vector<int32_t>& prompt)
    : p_(params), rng_(seed) {
  if (p_.repetition_penalty != 1.0f) prompt_tokens_.insert(prompt.begin(), prompt.end());
}

void Sampler::accept(int32_t token) {
  output_counts_[token]++;
}

TokenPenalties Sampler::penalties() const {
  TokenPenalties t;
  t.repetition = p_.repetition_penalty;
  t.presence = p_.presence_penalty;
  t.frequency = p_.frequency_penalty;
  return t;
}

void Sampler::penalty_entries(std::vector<PenaltyEntry>* out) const {
  if (!has_penalties()) return;
  // The prompt's tokens count only for the repetition penalty (the set is empty otherwise).
  for (int32_t t : prompt_tokens_) {
    const auto it = output_counts_.find(t);
    out->push_back({t, it == output_counts_.end() ? 0 : it->second});
  }
  for (const auto& [t, c] : output_counts_) {
    if (!prompt_tokens_.contains(t)) out->push_back({t, c});
  }
}

size_t Sampler::penalty_entry_count() const {
  if (!has_penalties()) return 0;
  size_t n = prompt_tokens_.size();
  for (const auto& [t, c] : output_counts_) n += prompt_tokens_.contains(t) ? 0 : 1;
  return n;
}

void Sampler::apply_penalties(float* logits, int vocab) const {
  entries_.clear();
  penalty_entries(&entries_);
  const TokenPenalties pen = penalties();
  for (const PenaltyEntry& e : entries_) {
    if (e.token >= 0 && e.token < vocab) {
      logits[e.token] = penalized_logit(logits[e.token], pen, e.output_count);
    }
  }
}

int32_t Sampler::sample(float* logits, int vocab, const uint8_t* allowed) {
  apply_penalties(logits, vocab);
  if (allowed != nullptr) {
    for (int i = 0; i < vocab; ++i) {
      if (!allowed[i]) logits[i] = kNegInf;
    }
  }
  return draw(logits, vocab);
}

int32_t Sampler::sample_row(const float* logits, int vocab, const uint8_t* allowed,
                            std::vector<float>* work) {
  if (allowed != nullptr || has_penalties()) {
    work->assign(logits, logits + vocab);
    return sample(work->data(), vocab, allowed);
  }
  return draw(logits, vocab);
}

TokenPick Sampler::pick() const {
  TokenPick p;
  p.temperature = p_.temperature;
  p.top_k = p_.top_k;
  p.top_p = p_.top_p;
  p.min_p = p_.min_p;
  return p;
}

double Sampler::next_uniform() {
  return static_cast<double>(rng_() >> 11) * 0x1p-53;
}

int32_t Sampler::draw(const float* logits, int vocab) {
  TokenPick p = pick();
  if (!p.greedy()) p.u = next_uniform();
  return pick_token(logits, vocab, p, &scratch_);
}

double log_sum_exp(const float* logits, int vocab) {
  float mx = kNegInf;
  for (int i = 0; i < vocab; ++i) mx = std::max(mx, logits[i]);
  double s = 0;
  for (int i = 0; i < vocab; ++i) s += std::exp(static_cast<double>(logits[i]) - mx);
  return mx + std::log(s);
}

float token_logprob(const float* logits, int vocab, int32_t token, int k,
                    std::vector<TopLogprob>* top) {
  double lse = log_sum_exp(logits, vocab);
  if (k > 0 && top != nullptr) {
    std::vector<std::pair<float, int32_t>> c(static_cast<size_t>(vocab));
    for (int i = 0; i < vocab; ++i) c[i] = {logits[i], i};
    size_t kk = std::min<size_t>(static_cast<size_t>(k), c.size());
    std::partial_sort(c.begin(), c.begin() + static_cast<ptrdiff_t>(kk), c.end(),
                      [](auto& a, auto& b) {
                        return a.first > b.first || (a.first == b.first && a.second < b.second);
                      });
    top->clear();
    for (size_t i = 0; i < kk; ++i) {
      top->push_back({c[i].second, static_cast<float>(c[i].first - lse)});
    }
  }
  return static_cast<float>(logits[token] - lse);
}

}  // namespace tokenmill
