#include "util/token_pick.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <limits>

#include "util/argmax.h"

namespace tokenmill {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Logits are scanned in blocks: a block whose largest value cannot matter is skipped after one
// vectorizable pass (max_value skips NaN).
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

bool pick_candidates(const float* logits, int vocab, const TokenPick& p,
                     std::vector<std::pair<float, int32_t>>* out, std::vector<float>* heap) {
  const float inv_t = 1.0f / p.temperature;
  float mx = kNegInf;  // the largest logit (NaN skipped)
  for (int b = 0; b < vocab; b += kBlock) {
    mx = std::max(mx, block_max(logits + b, std::min(kBlock, vocab - b)));
  }
  // With top-k only logits at or above the k-th largest can be kept: the exp of the whole
  // vocabulary (248k tokens) took milliseconds per row.
  const bool top_k = p.top_k > 0 && p.top_k < vocab;
  const float lk = top_k ? kth_largest(logits, vocab, p.top_k, *heap) : kNegInf;
  // Candidates with unnormalised probabilities; tokens with probability exactly 0 (and NaN or
  // -inf logits) never count.
  auto& cand = *out;
  cand.clear();
  for (int b = 0; b < vocab; b += kBlock) {
    const int end = std::min(vocab, b + kBlock);
    if (lk > kNegInf && !(block_max(logits + b, end - b) >= lk)) continue;
    for (int i = b; i < end; ++i) {
      const float l = logits[i];
      if (!(l > kNegInf) || l < lk) continue;
      const float e = std::exp((l - mx) * inv_t);
      if (!(e > 0.0f) || (p.min_p > 0.0f && e < p.min_p)) continue;  // the top token has e = 1
      cand.emplace_back(e, i);
    }
  }
  if (cand.empty()) return false;
  const auto by_logit = [logits](const auto& a, const auto& b) {
    const float la = logits[a.second], lb = logits[b.second];
    return la > lb || (la == lb && a.second < b.second);
  };
  if (top_k && static_cast<size_t>(p.top_k) < cand.size()) {
    const auto keep = static_cast<std::ptrdiff_t>(p.top_k);
    std::nth_element(cand.begin(), cand.begin() + keep, cand.end(), by_logit);
    cand.resize(static_cast<size_t>(keep));
  }
  // The draw walks the candidates in this order.
  if (top_k) std::sort(cand.begin(), cand.end(), by_logit);
  if (p.top_p < 1.0f) {
    double sum = 0;
    for (const auto& c : cand) sum += c.first;
    // Sort only as much as needed: the head usually holds the top-p mass.
    size_t head = std::min<size_t>(cand.size(), 1024);
    for (;;) {
      if (!top_k) {
        std::partial_sort(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(head),
                          cand.end(), by_logit);
      }
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

int32_t pick_token(const float* logits, int vocab, const TokenPick& p, PickScratch* scratch) {
  if (p.greedy() || !pick_candidates(logits, vocab, p, &scratch->cand, &scratch->heap)) {
    // Lowest id wins ties, so greedy output is deterministic across backends.
    return argmax(logits, vocab);
  }
  const auto& cand = scratch->cand;
  double z = 0;
  for (const auto& c : cand) z += c.first;
  const double r = p.u * z;
  double acc = 0;
  for (const auto& c : cand) {
    acc += c.first;
    if (r < acc) return c.second;
  }
  return cand.back().second;
}

}  // namespace tokenmill
