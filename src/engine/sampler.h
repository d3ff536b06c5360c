// Token sampling for one sequence, in vLLM's order: penalties (repetition over prompt and
// output; presence and frequency over output), then temperature, min-p, top-k, top-p and a seeded
// draw (util/token_pick.h, the rule the backends' pick_tokens also follow). Logprobs reported to
// clients are the model's raw log-softmax (before any of this), as OpenAI and vLLM report them.
#pragma once

#include <cstdint>
#include <random>
#include <unordered_map>
#include <vector>

#include "engine/request.h"
#include "util/argmax.h"
#include "util/token_pick.h"

namespace tokenmill {

class Sampler {
 public:
  Sampler(const SamplingParams& params, uint64_t seed, const std::vector<int32_t>& prompt);

  // Picks the next token from `logits` (vocab entries; modified in place). `allowed`, when not
  // null, marks the tokens that may be chosen (nonzero). Returns the token.
  int32_t sample(float* logits, int vocab, const uint8_t* allowed);
  // The same choice for logits that must stay unchanged: they are copied into *work first only
  // when penalties or a mask change them (a 248k-logit row is 1 MB).
  int32_t sample_row(const float* logits, int vocab, const uint8_t* allowed,
                     std::vector<float>* work);
  // Records a token appended to the output (for the penalties). sample() does not.
  void accept(int32_t token);
  // The pick a backend makes without the host (Backend::pick_tokens), after the penalties
  // (Backend::penalize_rows) when penalties() has any. Its draw `u` is left 0; next_uniform()
  // gives it.
  TokenPick device_pick() const;
  TokenPenalties penalties() const;
  // Appends the tokens the penalties touch (the prompt's when repetition != 1, the output's,
  // each once with its output count); none without penalties. penalty_entry_count() says how
  // many.
  void penalty_entries(std::vector<PenaltyEntry>* out) const;
  size_t penalty_entry_count() const { return entries_.size(); }
  // The next draw of this sequence's generator, uniform in [0, 1) (53 bits). Every sampled
  // token takes one, on the host or on a device.
  double next_uniform();

  const SamplingParams& params() const { return p_; }
  bool greedy() const { return p_.temperature <= 0.0f; }

 private:
  void apply_penalties(float* logits, int vocab) const;
  bool has_penalties() const {
    return p_.repetition_penalty != 1.0f || p_.presence_penalty != 0.0f ||
           p_.frequency_penalty != 0.0f;
  }
  // The seeded draw over final (penalized, masked) logits.
  int32_t draw(const float* logits, int vocab);
  SamplingParams p_;
  std::mt19937_64 rng_;
  // The tokens the penalties touch, each once (none without penalties): the prompt's first
  // (when repetition != 1), then each new output token as accept() sees it; entry_of_ finds a
  // token's entry. Kept as tokens come, so a step copies them instead of rebuilding them.
  std::vector<PenaltyEntry> entries_;
  std::unordered_map<int32_t, int32_t> entry_of_;
  PickScratch scratch_;
};

// Raw log-softmax of `logits` at `token`, and the top `k` entries (k may be 0).
float token_logprob(const float* logits, int vocab, int32_t token, int k,
                    std::vector<TopLogprob>* top);

// log(sum(exp(logits))) computed stably.
double log_sum_exp(const float* logits, int vocab);

}  // namespace tokenmill
