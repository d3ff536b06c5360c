// A model directory's generation_config.json (Hugging Face): the defaults its authors ship.
// Sampling values there are defaults for requests that set none, below the per-model settings:
//   request > per-model settings (settings.json) > generation_config.json > built-in
// Keys read: temperature, top_p, top_k, min_p, repetition_penalty, presence_penalty,
// frequency_penalty, do_sample (false = greedy: the temperature default becomes 0, as in
// transformers), eos_token_id (an id or a list: more end-of-generation ids), max_new_tokens (the
// default output length when neither the request nor the settings give one). Other keys
// (bos/pad ids, max_length, transformers_version, ...) carry nothing for serving; null values
// count as absent.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/request.h"
#include "server/plan.h"
#include "server/settings.h"

namespace tokenmill::server {

struct GenerationConfig {
  std::string file;  // the file read ("" when the model has none)
  SamplingDefaults sampling;
  std::vector<int32_t> eos_token_ids;
  std::optional<int> max_new_tokens;
};

// Parses the text of a generation_config.json; `file` names it in errors. Throws
// tokenmill::Error naming file, key, value and reason for a value of the wrong type or range.
GenerationConfig parse_generation_config(const std::string& text, const std::string& file);
// Reads DIR/generation_config.json; a missing file gives an empty config.
GenerationConfig load_generation_config(const std::string& model_dir);

// The defaults a request without sampling values gets: the settings' values, else the
// generation config's (unset: the built-in defaults of SamplingParams).
SamplingDefaults merge_sampling_defaults(const SamplingDefaults& settings,
                                         const SamplingDefaults& generation_config);

// The sampling parameters of a request, in priority order request > settings >
// generation_config > built-in (logprobs and seed are the request's; seed is left to the caller).
SamplingParams resolve_sampling(const GenerationPlan& plan, const SamplingDefaults& settings,
                                const SamplingDefaults& generation_config);

}  // namespace tokenmill::server
