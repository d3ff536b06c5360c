// GenerationPlan: one validated API request in an API-independent form. The request parsers
// (openai_request, anthropic_request) produce it; generation.cpp turns it into engine requests.
// Internal to server/ (holds nlohmann::ordered_json values).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace tokenmill::server {

enum class PlanApi { kChat, kCompletion, kAnthropic };

struct ResponseFormat {
  enum class Kind { kText, kJsonObject, kJsonSchema } kind = Kind::kText;
  nlohmann::ordered_json schema;  // kJsonSchema: the JSON schema
};

struct GenerationPlan {
  PlanApi api = PlanApi::kChat;
  std::string model;  // as the client named it ("" = the default model)

  // Chat (kChat, kAnthropic): OpenAI-shaped messages, as chat templates expect them: role,
  // content (string), reasoning_content, tool_calls [{id, type, function: {name, arguments
  // (object)}}], tool_call_id, name.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;         // OpenAI tool objects, null when none
  std::string tool_choice = "auto";     // auto | none | required | function
  std::string tool_choice_name;         // tool_choice == function
  bool parallel_tool_calls = true;      // more than one call per reply (enforced when required)
  std::optional<bool> enable_thinking;  // unset: the model's default
  nlohmann::ordered_json template_kwargs =
      nlohmann::ordered_json::object();  // chat_template_kwargs
  std::optional<int> reasoning_budget;   // reasoning tokens before </think> is forced

  // Completion (kCompletion): one entry per prompt, as text or token ids.
  std::vector<std::string> prompt_texts;
  std::vector<std::vector<int32_t>> prompt_ids;
  bool echo = false;

  // Sampling: unset values take the model's defaults from its settings.
  std::optional<float> temperature, top_p, min_p, presence_penalty, frequency_penalty,
      repetition_penalty;
  std::optional<int> top_k;
  std::optional<uint64_t> seed;
  std::optional<int> max_tokens;
  std::vector<std::string> stop;
  int n = 1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  int logprobs = -1;           // -1 none; k >= 0: the chosen token's logprob and the top k
  ResponseFormat response_format;
  bool ignore_eos = false;
};

}  // namespace tokenmill::server
