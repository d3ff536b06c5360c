#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <functional>
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

namespace {

// Logits are scanned in blocks: a block whose largest value cannot matter is skipped after one
// vectorizable pass (util/argmax.h's max_value; NaN is skipped).
constexpr int kBlock = 64;
float block_max(const float* v, int n) {
  return max_value(v, n, kNegInf);
}

// The k-th largest logit above -inf (NaN skipped), or -inf when there are fewer: a min-heap of
// the k largest; blocks whose maximum does not beat the heap's least are skipped.
float kth_largest(const float* logits, int vocab, int k, std::vector<float>& heap) {
  heap.clear();
  const auto greater = std::greater<float>();
  for (int b = 0; b < vocab; b += kBlock) {
    const int end = std::min(vocab, b + kBlock);
    if (static_cast<int>(heap.size()) == k && !(block_max(logits + b, end - b) > heap.front())) {
      continue;
    }
    for (int i = b; i < end; ++i) {
      const float v = logits[i];
      if (!(v > kNegInf)) continue;
      if (static_cast<int>(heap.size()) < k) {
        heap.push_back(v);
        if (static_cast<int>(heap.size()) == k) std::make_heap(heap.begin(), heap.end(), greater);
      } else if (v > heap.front()) {
        std::pop_heap(heap.begin(), heap.end(), greater);
        heap.back() = v;
        std::push_heap(heap.begin(), heap.end(), greater);
      }
    }
  }
  return static_cast<int>(heap.size()) == k ? heap.front() : kNegInf;
}

}  // namespace

bool sampling_candidates(const float* logits, int vocab, const SamplingParams& p,
                         std::vector<std::pair<float, int32_t>>* out, std::vector<float>* heap) {
  const float inv_t = 1.0f / p.temperature;
  float mx = kNegInf;  // the largest logit (NaN skipped)
  for (int b = 0; b < vocab; b += kBlock) {
    mx = std::max(mx, block_max(logits + b, std::min(kBlock, vocab - b)));
  }
  // With top-k only tokens whose probability can reach the k-th largest logit's need their
  // exp: a token whose scaled logit x lies below x_floor has a probability strictly below it
  // (the margin is thousands of ulps of the exp, above the rounding of x), so it can never
  // rank among the k. Below x = -105 every probability is 0 in F32 and never counts anyway.
  // The kept set, and so the draw, is the one of the full computation; the exp of the whole
  // vocabulary (248k tokens) took milliseconds per row.
  float x_floor = kNegInf;
  if (p.top_k > 0 && p.top_k < vocab) {
    const float lk = kth_largest(logits, vocab, p.top_k, *heap);
    if (lk > kNegInf) {
      const float xk = (lk - mx) * inv_t;
      x_floor = xk < -80.0f ? -105.0f : xk - 0x1p-12f * (1.0f + std::fabs(xk));
    }
  }
  // Candidates with unnormalised probabilities; tokens with probability exactly 0 never count.
  // x is monotone in the logit, so a block whose largest x is below x_floor holds none.
  out->clear();
  for (int b = 0; b < vocab; b += kBlock) {
    const int end = std::min(vocab, b + kBlock);
    if (x_floor > kNegInf && (block_max(logits + b, end - b) - mx) * inv_t < x_floor) continue;
    for (int i = b; i < end; ++i) {
      if (logits[i] == kNegInf) continue;
      const float x = (logits[i] - mx) * inv_t;
      if (x < x_floor) continue;
      const float e = std::exp(x);
      if (e <= 0.0f) continue;
      out->emplace_back(e, i);
    }
  }
  if (out->empty()) return false;
  auto& cand = *out;
  if (p.min_p > 0.0f) {
    // The most likely token has unnormalised probability 1.
    const float cut = p.min_p;
    auto end = std::remove_if(cand.begin(), cand.end(), [&](auto& c) { return c.first < cut; });
    cand.erase(end, cand.end());
  }
  auto by_prob = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < cand.size()) {
    const auto keep = static_cast<ptrdiff_t>(p.top_k);
    std::nth_element(cand.begin(), cand.begin() + keep, cand.end(), by_prob);
    cand.resize(static_cast<size_t>(keep));
  }
  if (p.top_k > 0) {
    // One order whatever the input order was (the fast path sees fewer tokens): the draw
    // below walks the candidates in it.
    std::sort(cand.begin(), cand.end(), by_prob);
  }
  if (p.top_p < 1.0f) {
    double sum = 0;
    for (const auto& c : cand) sum += c.first;
    // Sort only as much as needed: the head usually holds the top-p mass.
    size_t head = std::min<size_t>(cand.size(), 1024);
    for (;;) {
      std::partial_sort(cand.begin(), cand.begin() + static_cast<ptrdiff_t>(head), cand.end(),
                        by_prob);
      double acc = 0;
      size_t n = 0;
      while (n < head) {
        acc += cand[n].first;
        ++n;
        if (acc >= p.top_p * sum) break;
      }
      if (acc >= p.top_p * sum || head == cand.size()) {
        cand.resize(n);
        break;
      }
      head = std::min(cand.size(), head * 8);
    }
  }
  return true;
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

int32_t Sampler::draw(const float* logits, int vocab) {
  if (greedy()) {
    // Lowest id wins ties, so greedy output is deterministic across backends.
    return argmax(logits, vocab);
  }
  if (!sampling_candidates(logits, vocab, p_, &cand_, &heap_)) {
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
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
