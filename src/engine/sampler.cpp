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
  if (p_.repetition_penalty != 1.0f) {
    auto penalize = [&](int32_t t) {
      if (t < 0 || t >= vocab) return;
      float& l = logits[t];
      l = l > 0 ? l / p_.repetition_penalty : l * p_.repetition_penalty;
    };
    std::unordered_set<int32_t> seen = prompt_tokens_;
    for (const auto& [t, c] : output_counts_) seen.insert(t);
    for (int32_t t : seen) penalize(t);
  }
  if (p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) {
    for (const auto& [t, c] : output_counts_) {
      if (t < 0 || t >= vocab) continue;
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
  if (greedy()) {
    // Lowest id wins ties, so greedy output is deterministic across backends.
    return argmax(logits, vocab);
  }
  const float inv_t = 1.0f / p_.temperature;
  float mx = kNegInf;
  for (int i = 0; i < vocab; ++i) mx = std::max(mx, logits[i]);
  // Candidates with unnormalised probabilities; tokens with probability exactly 0 never count.
  cand_.clear();
  double total = 0;
  for (int i = 0; i < vocab; ++i) {
    if (logits[i] == kNegInf) continue;
    float e = std::exp((logits[i] - mx) * inv_t);
    if (e <= 0.0f) continue;
    cand_.emplace_back(e, i);
    total += e;
  }
  if (cand_.empty()) return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  if (p_.min_p > 0.0f) {
    // The most likely token has unnormalised probability 1.
    float cut = p_.min_p;
    auto end = std::remove_if(cand_.begin(), cand_.end(), [&](auto& c) { return c.first < cut; });
    cand_.erase(end, cand_.end());
  }
  auto by_prob = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t keep = cand_.size();
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < keep) {
    keep = static_cast<size_t>(p_.top_k);
    std::nth_element(cand_.begin(), cand_.begin() + static_cast<ptrdiff_t>(keep), cand_.end(),
                     by_prob);
    cand_.resize(keep);
  }
  if (p_.top_p < 1.0f) {
    double sum = 0;
    for (const auto& c : cand_) sum += c.first;
    // Sort only as much as needed: the head usually holds the top-p mass.
    size_t head = std::min<size_t>(cand_.size(), 1024);
    for (;;) {
      std::partial_sort(cand_.begin(), cand_.begin() + static_cast<ptrdiff_t>(head), cand_.end(),
                        by_prob);
      double acc = 0;
      size_t n = 0;
      while (n < head) {
        acc += cand_[n].first;
        ++n;
        if (acc >= p_.top_p * sum) break;
      }
      if (acc >= p_.top_p * sum || head == cand_.size()) {
        cand_.resize(n);
        break;
      }
      head = std::min(cand_.size(), head * 8);
    }
  }
  double z = 0;
  for (const auto& c : cand_) z += c.first;
  std::uniform_real_distribution<double> u(0.0, z);
  double r = u(rng_), acc = 0;
  for (const auto& c : cand_) {
    acc += c.first;
    if (r < acc) return c.second;
  }
  return cand_.back().second;
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
