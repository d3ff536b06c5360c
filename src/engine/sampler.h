// Token sampling for one sequence, in vLLM's order: penalties (repetition over prompt and
// output; presence and frequency over output), then temperature, then min-p, top-k, top-p, then a
// seeded draw. Logprobs reported to clients are the model's raw log-softmax (before any of this),
// as OpenAI and vLLM report them.
#pragma once

#include <cstdint>
#include <random>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/request.h"
#include "util/argmax.h"

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

  const SamplingParams& params() const { return p_; }
  bool greedy() const { return p_.temperature <= 0.0f; }
  // Greedy without penalties: sample() is argmax(logits) and leaves them unchanged, so callers
  // may skip copying the logits.
  bool plain_greedy() const {
    return greedy() && p_.repetition_penalty == 1.0f && p_.presence_penalty == 0.0f &&
           p_.frequency_penalty == 0.0f;
  }

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
  std::unordered_set<int32_t> prompt_tokens_;
  std::unordered_map<int32_t, int> output_counts_;
  std::vector<std::pair<float, int32_t>> cand_;  // reused scratch
  std::vector<float> heap_;                      // reused scratch (top-k threshold)
};

// The tokens a non-greedy draw chooses from, in vLLM's order (temperature, min-p, top-k, top-p)
// over logits already penalized and masked: {unnormalised probability exp((l - max) / T),
// token}, in descending probability (ties: lower id) whenever top-k or top-p cut the list.
// Returns false when no token has a nonzero probability. `heap` is scratch.
bool sampling_candidates(const float* logits, int vocab, const SamplingParams& p,
                         std::vector<std::pair<float, int32_t>>* out, std::vector<float>* heap);

// Raw log-softmax of `logits` at `token`, and the top `k` entries (k may be 0).
float token_logprob(const float* logits, int vocab, int32_t token, int k,
                    std::vector<TopLogprob>* top);

// log(sum(exp(logits))) computed stably.
double log_sum_exp(const float* logits, int vocab);

}  // namespace tokenmill
