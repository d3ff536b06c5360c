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
  // The prompt's tokens count only for the repetition penalty.
  if (p_.repetition_penalty == 1.0f) return;
  for (int32_t t : prompt) {
    if (entry_of_.emplace(t, static_cast<int32_t>(entries_.size())).second) {
      entries_.push_back({t, 0});
    }
  }
}

void Sampler::accept(int32_t token) {
  if (!has_penalties()) return;
  const auto [it, added] = entry_of_.emplace(token, static_cast<int32_t>(entries_.size()));
  if (added) {
    entries_.push_back({token, 1});
  } else {
    entries_[static_cast<size_t>(it->second)].output_count++;
  }
}

TokenPenalties Sampler::penalties() const {
  TokenPenalties t;
  t.repetition = p_.repetition_penalty;
  t.presence = p_.presence_penalty;
  t.frequency = p_.frequency_penalty;
  return t;
}

void Sampler::penalty_entries(std::vector<PenaltyEntry>* out) const {
  out->insert(out->end(), entries_.begin(), entries_.end());
}

void Sampler::apply_penalties(float* logits, int vocab) const {
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

TokenPick Sampler::device_pick() const {
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
  TokenPick p = device_pick();  // the same rule on the host
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
