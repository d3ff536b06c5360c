// Anthropic request parsing: POST /v1/messages and /v1/messages/count_tokens bodies -> a
// validated GenerationPlan with OpenAI-shaped messages (what chat templates expect): system
// blocks become a system message, tool_use blocks assistant tool_calls, tool_result blocks tool
// messages, thinking blocks reasoning_content. Problems are 400 ApiErrors naming the field.
#pragma once

#include <nlohmann/json.hpp>

#include "server/openai_request.h"
#include "server/plan.h"

namespace tokenmill::server {

// count_tokens = true: the /count_tokens body (max_tokens not required, sampling ignored).
GenerationPlan parse_anthropic_messages(const nlohmann::ordered_json& body,
                                        const RequestLimits& limits, bool count_tokens = false);

}  // namespace tokenmill::server
