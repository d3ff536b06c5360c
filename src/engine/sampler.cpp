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

void Sampler::apply_penalties(float* logits, int vocab) const {
  auto in_vocab = [&](int32_t t) { return t >= 0 && t < vocab; };
  if (p_.repetition_penalty != 1.0f) {
    // Each token of the prompt or the output once (no merged set: a long prompt was copied
    // into one per token).
    auto penalize = [&](int32_t t) {
      float& l = logits[t];
      l = l > 0 ? l / p_.repetition_penalty : l * p_.repetition_penalty;
    };
    for (int32_t t : prompt_tokens_) {
      if (in_vocab(t)) penalize(t);
    }
    for (const auto& [t, c] : output_counts_) {
      if (in_vocab(t) && !prompt_tokens_.contains(t)) penalize(t);
    }
  }
  if (p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) {
    for (const auto& [t, c] : output_counts_) {
      if (!in_vocab(t)) continue;
      logits[t] -= p_.frequency_penalty * static_cast<float>(c) + p_.presence_penalty;
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

bool Sampler::device_pick(TokenPick* pick) const {
  if (has_penalties()) return false;
  *pick = this->pick();
  return true;
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
