// The scheduler: decides each step which sequences advance by how many tokens, admitting
// waiting requests only when their KV blocks and state slot fit, and preempting (recompute
// later) the newest running sequence when decode runs out of blocks.
#pragma once

#include <deque>
#include <memory>
#include <vector>

#include "engine/request.h"
#include "engine/sampler.h"

namespace tokenmill {

class CacheManager;

struct Sequence {
  uint64_t id = 0;
  GenerationRequest req;
  std::shared_ptr<RequestStream> stream;
  std::unique_ptr<Sampler> sampler;
  std::vector<int32_t> tokens;  // prompt + output
  int prompt_len = 0;
  int cached = 0;               // tokens[0, cached) are in the caches
  int slot = -1;                // GDN state slot, -1 when not resident
  std::vector<int32_t> blocks;  // KV block table
  bool done = false;
  bool sent_first = false;
  bool prompt_scored = false;
  std::vector<float> prompt_lps;
  std::vector<std::vector<TopLogprob>> prompt_tops;
  bool in_reasoning = false;
  int reasoning_tokens = 0;

  int output_len() const { return static_cast<int>(tokens.size()) - prompt_len; }
  int uncached() const { return static_cast<int>(tokens.size()) - cached; }
};

struct SchedulerConfig {
  int max_seqs = 16;
  int max_step_tokens = 512;
  int prefill_chunk = 256;
  bool prefer_decode = true;
};

struct StepEntry {
  Sequence* seq;
  int n_tokens;
};

struct StepPlan {
  std::vector<StepEntry> entries;
};

// Moves admitted sequences from `waiting` to `running` (acquiring a slot and blocks), preempts
// when needed (back to the front of `waiting`, caches released), and returns what to run.
StepPlan schedule_step(const SchedulerConfig& cfg, CacheManager& cache,
                       std::deque<std::unique_ptr<Sequence>>& waiting,
                       std::vector<std::unique_ptr<Sequence>>& running);

}  // namespace tokenmill
