#include "server/anthropic_request.h"

#include "server/api_error.h"
#include "server/request_json.h"

namespace tokenmill::server {

using json = nlohmann::ordered_json;

namespace {

// Text of a string or an array of text blocks.
std::string blocks_text(const json& v, const std::string& param) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array())
    bad_request(param, "must be a string or an array of text blocks, got {}", json_type_name(v));
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    std::string p = fmt::format("{}[{}]", param, i);
    if (!v[i].is_object()) bad_request(p, "must be an object, got {}", json_type_name(v[i]));
    Fields f(v[i], p);
    auto type = f.string("type");
    if (type != "text") {
      if (type == "image" || type == "document") {
        bad_request(f.name("type"),
                    "'{}' blocks are not supported: this server runs text-only models", *type);
      }
      bad_request(f.name("type"), "must be 'text' here, got {}",
                  type ? "'" + *type + "'" : "nothing");
    }
    auto text = f.string("text");
    if (!text) bad_request(f.name("text"), "is missing");
    if (!out.empty()) out += "\n";
    out += *text;
  }
  return out;
}

void convert_message(const json& m, const std::string& p, json& out) {
  if (!m.is_object()) bad_request(p, "must be an object, got {}", json_type_name(m));
  Fields f(m, p);
  auto role = f.string("role");
  if (!role) bad_request(f.name("role"), "is missing");
  if (*role != "user" && *role != "assistant") {
    bad_request(f.name("role"),
                "must be 'user' or 'assistant', got '{}' (put system text in the "
                "top-level system field)",
                *role);
  }
  const json* content = f.get("content");
  if (!content) bad_request(f.name("content"), "is missing");
  if (content->is_string()) {
    out.push_back({{"role", *role}, {"content", content->get<std::string>()}});
    return;
  }
  if (!content->is_array()) {
    bad_request(f.name("content"), "must be a string or an array of content blocks, got {}",
                json_type_name(*content));
  }
  std::string text, reasoning;
  json calls = json::array();
  for (size_t i = 0; i < content->size(); ++i) {
    std::string bp = fmt::format("{}.content[{}]", p, i);
    const json& b = (*content)[i];
    if (!b.is_object()) bad_request(bp, "must be an object, got {}", json_type_name(b));
    Fields bf(b, bp);
    auto type = bf.string("type");
    if (!type) bad_request(bf.name("type"), "is missing");
    if (*type == "text") {
      auto t = bf.string("text");
      if (!t) bad_request(bf.name("text"), "is missing");
      if (!text.empty()) text += "\n";
      text += *t;
    } else if (*type == "thinking") {
      if (*role != "assistant")
        bad_request(bf.name("type"), "thinking blocks belong to assistant messages");
      reasoning += bf.string("thinking").value_or("");
    } else if (*type == "redacted_thinking") {
      // Opaque to us: nothing to give the template.
    } else if (*type == "tool_use") {
      if (*role != "assistant")
        bad_request(bf.name("type"), "tool_use blocks belong to assistant messages");
      auto id = bf.string("id");
      auto name = bf.string("name");
      if (!id) bad_request(bf.name("id"), "is missing");
      if (!name) bad_request(bf.name("name"), "is missing");
      const json* input = bf.object("input");
      calls.push_back(
          {{"id", *id},
           {"type", "function"},
           {"function", {{"name", *name}, {"arguments", input ? *input : json::object()}}}});
    } else if (*type == "tool_result") {
      if (*role != "user")
        bad_request(bf.name("type"), "tool_result blocks belong to user messages");
      auto id = bf.string("tool_use_id");
      if (!id) bad_request(bf.name("tool_use_id"), "is missing");
      std::string result;
      if (const json* c = bf.get("content")) result = blocks_text(*c, bf.name("content"));
      // Text before a tool result stays in order: flush it as its own user message.
      if (!text.empty()) {
        out.push_back({{"role", "user"}, {"content", text}});
        text.clear();
      }
      out.push_back({{"role", "tool"}, {"tool_call_id", *id}, {"content", result}});
    } else if (*type == "image" || *type == "document") {
      bad_request(bf.name("type"),
                  "'{}' blocks are not supported: this server runs text-only models", *type);
    } else {
      bad_request(bf.name("type"), "unknown content block type '{}'", *type);
    }
  }
  if (*role == "assistant") {
    json msg = {{"role", "assistant"}, {"content", text}};
    if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
    if (!calls.empty()) msg["tool_calls"] = calls;
    out.push_back(std::move(msg));
  } else if (!text.empty() || out.empty() || out.back()["role"] != "tool") {
    out.push_back({{"role", "user"}, {"content", text}});
  }
}

}  // namespace

GenerationPlan parse_anthropic_messages(const json& body, const RequestLimits& limits,
                                        bool count_tokens) {
  GenerationPlan plan;
  plan.api = PlanApi::kAnthropic;
  Fields f(body, "");
  plan.model = f.string("model").value_or("");
  json msgs = json::array();
  if (const json* sys = f.get("system")) {
    msgs.push_back({{"role", "system"}, {"content", blocks_text(*sys, "system")}});
  }
  const json* messages = f.array("messages");
  if (!messages) bad_request("messages", "is missing: send at least one message");
  if (messages->empty()) bad_request("messages", "is empty: send at least one message");
  for (size_t i = 0; i < messages->size(); ++i) {
    convert_message((*messages)[i], fmt::format("messages[{}]", i), msgs);
  }
  plan.messages = std::move(msgs);

  if (const json* tools = f.array("tools"); tools && !tools->empty()) {
    json oa = json::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      std::string p = fmt::format("tools[{}]", i);
      const json& t = (*tools)[i];
      if (!t.is_object()) bad_request(p, "must be an object, got {}", json_type_name(t));
      Fields tf(t, p);
      auto name = tf.string("name");
      if (!name) bad_request(tf.name("name"), "is missing");
      const json* schema = tf.object("input_schema");
      if (!schema) bad_request(tf.name("input_schema"), "is missing");
      json fn = {{"name", *name}, {"parameters", *schema}};
      if (auto d = tf.string("description")) fn["description"] = *d;
      oa.push_back({{"type", "function"}, {"function", fn}});
    }
    validate_tools(oa, "tools");
    plan.tools = std::move(oa);
  }
  if (const json* tc = f.object("tool_choice")) {
    Fields tf(*tc, "tool_choice");
    auto type = tf.string("type");
    if (type == "auto") {
      plan.tool_choice = "auto";
    } else if (type == "any") {
      plan.tool_choice = "required";
    } else if (type == "none") {
      plan.tool_choice = "none";
    } else if (type == "tool") {
      auto name = tf.string("name");
      if (!name) bad_request("tool_choice.name", "is missing");
      plan.tool_choice = "function";
      plan.tool_choice_name = *name;
    } else {
      bad_request("tool_choice.type", "must be auto, any, tool or none");
    }
    plan.parallel_tool_calls = !tf.boolean("disable_parallel_tool_use").value_or(false);
    if ((plan.tool_choice == "required" || plan.tool_choice == "function") &&
        plan.tools.is_null()) {
      bad_request("tool_choice", "needs tools, but none were given");
    }
    if (plan.tool_choice == "function") {
      bool found = false;
      for (const auto& t : plan.tools) found |= t["function"]["name"] == plan.tool_choice_name;
      if (!found)
        bad_request("tool_choice.name", "'{}' is not one of the tools given",
                    plan.tool_choice_name);
    }
  }
  if (const json* th = f.object("thinking")) {
    Fields tf(*th, "thinking");
    auto type = tf.string("type");
    if (type == "enabled") {
      plan.enable_thinking = true;
      auto budget = tf.integer("budget_tokens", 1, INT32_MAX);
      if (!budget) bad_request("thinking.budget_tokens", "is required when thinking is enabled");
      plan.reasoning_budget = int(*budget);
    } else if (type == "disabled") {
      plan.enable_thinking = false;
    } else {
      bad_request("thinking.type", "must be 'enabled' or 'disabled'");
    }
  }
  if (count_tokens) return plan;

  auto max_tokens = f.integer("max_tokens", 1, INT32_MAX);
  if (!max_tokens) bad_request("max_tokens", "is required");
  plan.max_tokens = int(*max_tokens);
  if (plan.reasoning_budget && *plan.reasoning_budget >= *plan.max_tokens) {
    bad_request("thinking.budget_tokens", "({}) must be less than max_tokens ({})",
                *plan.reasoning_budget, *plan.max_tokens);
  }
  auto fl = [](std::optional<double> d) {
    return d ? std::optional<float>(float(*d)) : std::nullopt;
  };
  plan.temperature = fl(f.number("temperature", 0, 1));
  plan.top_p = fl(f.number("top_p", 0, 1, true));
  if (auto k = f.integer("top_k", 0, 1 << 20)) plan.top_k = int(*k);
  plan.stop = f.strings("stop_sequences", limits.max_stop);
  plan.stream = f.boolean("stream").value_or(false);
  plan.include_usage = true;
  f.object("metadata");
  return plan;
}

}  // namespace tokenmill::server
