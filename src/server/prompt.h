// Chat prompt rendering: OpenAI-shaped messages and tools through the model's chat template.
#pragma once

#include <string>

#include "server/generation.h"
#include "server/plan.h"

namespace tokenmill::server {

// The prompt text for a chat plan (add_generation_prompt on, enable_thinking and the request's
// chat_template_kwargs passed to the template). Throws ApiError 400 when the model has no chat
// template or the template rejects the conversation (its message is passed on).
std::string render_chat_prompt(const ServedModel& model, const GenerationPlan& plan,
                               bool enable_thinking);

}  // namespace tokenmill::server
