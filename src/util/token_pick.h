// How a row of logits becomes a token: the rule shared by the engine's sampler (on the host) and
// the backends' pick_tokens (on the device, next to the logits), so that a step whose every
// row is picked this way downloads one id per row instead of a vocabulary of logits.
//
// The rule, in vLLM's order over logits already penalized and masked: temperature <= 0 takes
// the argmax (util/argmax.h); otherwise, with x = (logit - max) / T and probability exp(x)
// (unnormalised), min-p drops tokens below min_p, top-k keeps the k largest logits (ties: the
// lower id), top-p keeps the shortest prefix of the rest in descending logit order whose mass
// reaches top_p, and the draw walks that list with r = u * (its mass). Ranking by the logit, not
// by its rounded exponential, makes the kept set exact and the same on every backend; only the
// exponentials' last bits may differ between them.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace tokenmill {

struct TokenPick {
  float temperature = 0.0f;  // <= 0: argmax
  int32_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  double u = 0.0;            // the draw, uniform in [0, 1)
  bool greedy() const { return temperature <= 0.0f; }
};

// The tokens a draw with `p` (not greedy) chooses from: {unnormalised probability exp(x),
// token}, in descending logit order (ties: lower id) whenever top-k or top-p cut the list, in id
// order otherwise. Returns false when no token has a nonzero probability. `heap` is scratch.
bool pick_candidates(const float* logits, int vocab, const TokenPick& p,
                     std::vector<std::pair<float, int32_t>>* out, std::vector<float>* heap);

// Scratch for pick_token, reused across calls.
struct PickScratch {
  std::vector<std::pair<float, int32_t>> cand;
  std::vector<float> heap;
};

// The token `p` picks from `logits` (the argmax when no token has a nonzero probability).
int32_t pick_token(const float* logits, int vocab, const TokenPick& p, PickScratch* scratch);

}  // namespace tokenmill
