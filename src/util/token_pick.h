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

// The penalties applied to logits before a pick, in vLLM's form: a token of the prompt or the
// output has its logit divided (when positive) or multiplied by `repetition`; a token the
// output holds c times then loses fma(frequency, c, presence). Each token once per step.
struct TokenPenalties {
  float repetition = 1.0f;
  float presence = 0.0f;
  float frequency = 0.0f;
  bool any() const { return repetition != 1.0f || presence != 0.0f || frequency != 0.0f; }
};

// One token a row's penalties touch: in the prompt (when repetition != 1) or the output, which
// holds it output_count times (0: the prompt only). A row's entries name distinct tokens.
struct PenaltyEntry {
  int32_t token = 0;
  int32_t output_count = 0;
};

// A row's penalties for Backend::penalize_rows: entries [first, first + count) of the step's
// list, and one more output occurrence of the token at index pending_at of the step's token
// ids (a token the device picked and the caller has not seen yet; -1: none).
struct PenaltyRow {
  TokenPenalties penalties;
  int32_t first = 0;
  int32_t count = 0;
  int32_t pending_at = -1;
};

// The logit of an entry's token after the penalties (the one expression every backend uses:
// fma keeps the frequency term's rounding the same everywhere).
inline float penalized_logit(float logit, const TokenPenalties& p, int output_count) {
  if (p.repetition != 1.0f) logit = logit > 0.0f ? logit / p.repetition : logit * p.repetition;
  if (output_count > 0) {
    logit -= __builtin_fmaf(p.frequency, static_cast<float>(output_count), p.presence);
  }
  return logit;
}

// Scratch for pick_token, reused across calls.
struct PickScratch {
  std::vector<std::pair<float, int32_t>> cand;
  std::vector<float> heap;
};

// The token `p` picks from `logits` (the argmax when no token has a nonzero probability).
int32_t pick_token(const float* logits, int vocab, const TokenPick& p, PickScratch* scratch);

}  // namespace tokenmill
