// libFuzzer target: the API request parsers (body text -> GenerationPlan). Byte 0 picks the
// parser (OpenAI chat, OpenAI completion, Anthropic messages, Anthropic count_tokens); the rest
// is the request body. Only tokenmill::Error may escape (a 400 naming the field); an accepted
// plan must hold what generation.cpp relies on: sampling values in their documented ranges, the
// limits on n, stop sequences and prompts, OpenAI-shaped messages with a role each.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "server/anthropic_request.h"
#include "server/json_schema_constraint.h"
#include "server/openai_request.h"
#include "server/request_json.h"
#include "util/error.h"

namespace {

using tokenmill::server::GenerationPlan;
using tokenmill::server::PlanApi;

template <class T>
bool within(const std::optional<T>& v, double lo, double hi) {
  return !v || (static_cast<double>(*v) >= lo && static_cast<double>(*v) <= hi);
}

bool sane(const GenerationPlan& p, PlanApi api, const tokenmill::server::RequestLimits& limits) {
  bool ok = p.api == api && p.n >= 1 && p.n <= limits.max_n && p.stop.size() <= limits.max_stop &&
            p.logprobs >= -1 && p.logprobs <= 20 && within(p.temperature, 0, 2) &&
            within(p.top_p, 0, 1) && (!p.top_p || *p.top_p > 0) && within(p.min_p, 0, 1) &&
            within(p.presence_penalty, -2, 2) && within(p.frequency_penalty, -2, 2) &&
            within(p.repetition_penalty, 0, 10) && within(p.top_k, 0, 1 << 20) &&
            within(p.max_tokens, 0, INT32_MAX) && within(p.reasoning_budget, 0, INT32_MAX);
  ok = ok && (p.tool_choice == "auto" || p.tool_choice == "none" || p.tool_choice == "required" ||
              (p.tool_choice == "function" && !p.tool_choice_name.empty()));
  if (api == PlanApi::kCompletion) {
    const size_t prompts = p.prompt_texts.size() + p.prompt_ids.size();
    ok = ok && prompts >= 1 &&
         prompts * static_cast<size_t>(p.n) <= static_cast<size_t>(limits.max_prompts);
    for (const auto& ids : p.prompt_ids) {
      for (int32_t id : ids) ok = ok && id >= 0;
    }
  } else {
    ok = ok && p.messages.is_array();
    for (const auto& m : p.messages) {
      ok = ok && m.is_object() && m.contains("role") && m["role"].is_string();
    }
  }
  return ok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  const tokenmill::server::RequestLimits limits;
  const int which = data[0] % 4;
  const PlanApi api = which == 0   ? PlanApi::kChat
                      : which == 1 ? PlanApi::kCompletion
                                   : PlanApi::kAnthropic;
  GenerationPlan plan;
  try {
    const nlohmann::ordered_json j = tokenmill::server::parse_body(body);
    if (which == 0) {
      plan = tokenmill::server::parse_openai_chat(j, limits);
    } else if (which == 1) {
      plan = tokenmill::server::parse_openai_completion(j, limits);
    } else {
      plan = tokenmill::server::parse_anthropic_messages(j, limits, which == 3);
    }
  } catch (const tokenmill::Error&) {
    return 0;  // rejected with a message
  }
  if (!sane(plan, api, limits)) __builtin_trap();
  // What generation.cpp does next with a schema: validate it (a 400 or nothing).
  if (plan.response_format.kind == tokenmill::server::ResponseFormat::Kind::kJsonSchema) {
    try {
      tokenmill::server::validate_json_schema(plan.response_format.schema);
    } catch (const tokenmill::Error&) {
    }
  }
  return 0;
}
