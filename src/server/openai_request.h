// OpenAI request parsing: POST /v1/chat/completions and /v1/completions bodies -> a validated
// GenerationPlan. Every problem is a 400 ApiError naming the field. Limits that need the model
// (context window, max output tokens) are checked later, in generation.cpp.
//
// reasoning_effort maps to a reasoning token budget: none -> thinking off, minimal 256, low 1024,
// medium 4096, high 16384. thinking_budget (an extension) sets the budget directly.
#pragma once

#include <nlohmann/json.hpp>

#include "server/plan.h"

namespace tokenmill::server {

struct RequestLimits {
  int max_n = 16;        // largest n
  size_t max_stop = 16;  // stop sequences
  int max_prompts = 64;  // /v1/completions prompts x n
};

GenerationPlan parse_openai_chat(const nlohmann::ordered_json& body, const RequestLimits& limits);
GenerationPlan parse_openai_completion(const nlohmann::ordered_json& body,
                                       const RequestLimits& limits);

// Shared by both parsers and the Anthropic one: validates OpenAI-shaped tool definitions
// (array of {"type": "function", "function": {name, description, parameters}}).
void validate_tools(const nlohmann::ordered_json& tools, const std::string& param);
// Parses a tool call's arguments text into an object (400 naming `param` when it is not one).
nlohmann::ordered_json parse_arguments(const std::string& text, const std::string& param);

}  // namespace tokenmill::server
