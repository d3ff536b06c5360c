#include "server/openai_request.h"

#include <set>

#include "server/api_error.h"
#include "server/request_json.h"

namespace tokenmill::server {

using json = nlohmann::ordered_json;

namespace {

// Text of a message's content: a string, or an array of {"type": "text", "text"} parts joined
// by newlines (what chat templates that take plain strings expect).
std::string content_text(const json& content, const std::string& param, bool allow_null) {
  if (content.is_null()) {
    if (!allow_null) bad_request(param, "is missing");
    return "";
  }
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    bad_request(param, "must be a string or an array of content parts, got {}",
                json_type_name(content));
  }
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    std::string p = fmt::format("{}[{}]", param, i);
    if (!part.is_object()) bad_request(p, "must be an object, got {}", json_type_name(part));
    Fields f(part, p);
    auto type = f.string("type");
    if (!type) bad_request(f.name("type"), "is missing");
    if (*type == "text" || *type == "input_text") {
      auto text = f.string("text");
      if (!text) bad_request(f.name("text"), "is missing");
      out += *text;  // joined with "", as normalize_messages() and transformers do
    } else if (*type == "image_url" || *type == "input_audio" || *type == "file" ||
               *type == "image") {
      bad_request(f.name("type"),
                  "'{}' content is not supported: this server runs text-only "
                  "models; send text parts",
                  *type);
    } else {
      bad_request(f.name("type"), "unknown content part type '{}' (expected 'text')", *type);
    }
  }
  return out;
}

json convert_tool_calls(const json& calls, const std::string& param) {
  if (!calls.is_array()) bad_request(param, "must be an array, got {}", json_type_name(calls));
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    std::string p = fmt::format("{}[{}]", param, i);
    if (!calls[i].is_object()) bad_request(p, "must be an object");
    Fields f(calls[i], p);
    auto type = f.string("type").value_or("function");
    if (type != "function") bad_request(f.name("type"), "must be 'function', got '{}'", type);
    const json* fn = f.object("function");
    if (!fn) bad_request(f.name("function"), "is missing");
    Fields ff(*fn, f.name("function"));
    auto name = ff.string("name");
    if (!name || name->empty()) bad_request(ff.name("name"), "is missing");
    json args = json::object();
    if (const json* a = ff.get("arguments")) {
      if (a->is_string()) {
        args = parse_arguments(a->get<std::string>(), ff.name("arguments"));
      } else if (a->is_object()) {
        args = *a;
      } else {
        bad_request(ff.name("arguments"), "must be a JSON object encoded as a string, got {}",
                    json_type_name(*a));
      }
    }
    json call = {{"type", "function"}, {"function", {{"name", *name}, {"arguments", args}}}};
    call["id"] = f.string("id").value_or(fmt::format("call_{}", i));
    out.push_back(std::move(call));
  }
  return out;
}

json convert_messages(const json& body) {
  Fields top(body, "");
  const json* msgs = top.array("messages");
  if (!msgs) bad_request("messages", "is missing: send at least one message");
  if (msgs->empty()) bad_request("messages", "is empty: send at least one message");
  json out = json::array();
  for (size_t i = 0; i < msgs->size(); ++i) {
    std::string p = fmt::format("messages[{}]", i);
    const json& m = (*msgs)[i];
    if (!m.is_object()) bad_request(p, "must be an object, got {}", json_type_name(m));
    Fields f(m, p);
    auto role = f.string("role");
    if (!role) bad_request(f.name("role"), "is missing");
    json msg;
    if (*role == "system" || *role == "developer" || *role == "user") {
      msg["role"] = *role == "user" ? "user" : "system";
      msg["content"] =
          content_text(m.contains("content") ? m["content"] : json(), f.name("content"), false);
    } else if (*role == "assistant") {
      msg["role"] = "assistant";
      const json* calls = f.get("tool_calls");
      msg["content"] =
          content_text(m.contains("content") ? m["content"] : json(), f.name("content"), true);
      if (calls && !calls->empty())
        msg["tool_calls"] = convert_tool_calls(*calls, f.name("tool_calls"));
      auto reasoning = f.string("reasoning_content");
      if (!reasoning) reasoning = f.string("reasoning");
      if (reasoning) msg["reasoning_content"] = *reasoning;
    } else if (*role == "tool") {
      msg["role"] = "tool";
      msg["content"] =
          content_text(m.contains("content") ? m["content"] : json(), f.name("content"), false);
      if (auto id = f.string("tool_call_id")) msg["tool_call_id"] = *id;
    } else {
      bad_request(f.name("role"),
                  "unknown role '{}' (expected system, developer, user, assistant "
                  "or tool)",
                  *role);
    }
    if (auto name = f.string("name")) msg["name"] = *name;
    out.push_back(std::move(msg));
  }
  return out;
}

void parse_sampling(const json& body, GenerationPlan& plan, const RequestLimits& limits) {
  Fields f(body, "");
  auto fl = [](std::optional<double> d) {
    return d ? std::optional<float>(float(*d)) : std::nullopt;
  };
  plan.temperature = fl(f.number("temperature", 0, 2));
  plan.top_p = fl(f.number("top_p", 0, 1, /*min_exclusive=*/true));
  plan.min_p = fl(f.number("min_p", 0, 1));
  plan.presence_penalty = fl(f.number("presence_penalty", -2, 2));
  plan.frequency_penalty = fl(f.number("frequency_penalty", -2, 2));
  plan.repetition_penalty = fl(f.number("repetition_penalty", 0, 10, true));
  if (auto k = f.integer("top_k", -1, 1 << 20)) plan.top_k = int(*k <= 0 ? 0 : *k);
  if (auto s = f.integer("seed", INT64_MIN, INT64_MAX)) plan.seed = uint64_t(*s);
  plan.stop = f.strings("stop", limits.max_stop);
  if (auto n = f.integer("n", 1, limits.max_n)) plan.n = int(*n);
  plan.stream = f.boolean("stream").value_or(false);
  if (const json* so = f.object("stream_options")) {
    if (!plan.stream) bad_request("stream_options", "is only allowed when stream is true");
    plan.include_usage = Fields(*so, "stream_options").boolean("include_usage").value_or(false);
  }
  plan.ignore_eos = f.boolean("ignore_eos").value_or(false);
  if (const json* lb = f.object("logit_bias"); lb && !lb->empty()) {
    bad_request("logit_bias", "is not supported by this server; remove it");
  }
  if (auto b = f.integer("best_of", 1, 128); b && *b != plan.n) {
    bad_request("best_of", "is not supported (only best_of = n)");
  }
}

}  // namespace

json parse_arguments(const std::string& text, const std::string& param) {
  if (text.empty()) return json::object();
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception&) {
    bad_request(param, "must be a JSON object encoded as a string; could not parse '{}'",
                text.substr(0, 200));
  }
  if (!j.is_object()) bad_request(param, "must encode a JSON object, got {}", json_type_name(j));
  return j;
}

void validate_tools(const json& tools, const std::string& param) {
  std::set<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    std::string p = fmt::format("{}[{}]", param, i);
    const json& t = tools[i];
    if (!t.is_object()) bad_request(p, "must be an object, got {}", json_type_name(t));
    Fields f(t, p);
    auto type = f.string("type");
    if (type != "function") {
      bad_request(f.name("type"), "must be 'function', got {}",
                  type ? "'" + *type + "'" : "nothing");
    }
    const json* fn = f.object("function");
    if (!fn) bad_request(f.name("function"), "is missing");
    Fields ff(*fn, f.name("function"));
    auto name = ff.string("name");
    if (!name || name->empty()) bad_request(ff.name("name"), "is missing");
    for (char c : *name) {
      if (!(isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) {
        bad_request(ff.name("name"), "'{}' may contain only letters, digits, '_', '-' and '.'",
                    *name);
      }
    }
    if (!names.insert(*name).second) bad_request(ff.name("name"), "'{}' is defined twice", *name);
    ff.string("description");
    ff.object("parameters");
  }
}

GenerationPlan parse_openai_chat(const json& body, const RequestLimits& limits) {
  GenerationPlan plan;
  plan.api = PlanApi::kChat;
  Fields f(body, "");
  plan.model = f.string("model").value_or("");
  plan.messages = convert_messages(body);
  parse_sampling(body, plan, limits);

  auto max_tokens = f.integer("max_tokens", 1, INT32_MAX);
  auto max_completion = f.integer("max_completion_tokens", 1, INT32_MAX);
  if (max_completion) {
    plan.max_tokens = int(*max_completion);
  } else if (max_tokens) {
    plan.max_tokens = int(*max_tokens);
  }

  bool logprobs = f.boolean("logprobs").value_or(false);
  auto top = f.integer("top_logprobs", 0, 20);
  if (top && !logprobs) bad_request("top_logprobs", "requires logprobs to be true");
  if (logprobs) plan.logprobs = int(top.value_or(0));

  if (const json* tools = f.array("tools"); tools && !tools->empty()) {
    validate_tools(*tools, "tools");
    plan.tools = *tools;
  }
  plan.parallel_tool_calls = f.boolean("parallel_tool_calls").value_or(true);
  if (const json* tc = f.get("tool_choice")) {
    if (tc->is_string()) {
      std::string s = tc->get<std::string>();
      if (s != "none" && s != "auto" && s != "required") {
        bad_request("tool_choice",
                    "must be 'none', 'auto', 'required' or a named function, got '{}'", s);
      }
      plan.tool_choice = s;
    } else if (tc->is_object()) {
      Fields tf(*tc, "tool_choice");
      const json* fn = tf.object("function");
      auto name = fn ? Fields(*fn, "tool_choice.function").string("name") : std::nullopt;
      if (!name) bad_request("tool_choice.function.name", "is missing");
      plan.tool_choice = "function";
      plan.tool_choice_name = *name;
    } else {
      bad_request("tool_choice", "must be a string or an object, got {}", json_type_name(*tc));
    }
    if (plan.tool_choice == "required" || plan.tool_choice == "function") {
      if (plan.tools.is_null())
        bad_request("tool_choice", "'{}' needs tools, but none were given", plan.tool_choice);
    }
    if (plan.tool_choice == "function") {
      bool found = false;
      for (const auto& t : plan.tools) found |= t["function"]["name"] == plan.tool_choice_name;
      if (!found) {
        bad_request("tool_choice.function.name", "'{}' is not one of the tools given",
                    plan.tool_choice_name);
      }
    }
  }

  if (const json* rf = f.object("response_format")) {
    Fields rff(*rf, "response_format");
    auto type = rff.string("type");
    if (!type) bad_request("response_format.type", "is missing");
    if (*type == "json_object") {
      plan.response_format.kind = ResponseFormat::Kind::kJsonObject;
    } else if (*type == "json_schema") {
      const json* js = rff.object("json_schema");
      if (!js) bad_request("response_format.json_schema", "is missing");
      Fields jf(*js, "response_format.json_schema");
      const json* schema = jf.object("schema");
      plan.response_format.kind = ResponseFormat::Kind::kJsonSchema;
      plan.response_format.schema = schema ? *schema : json::object();
    } else if (*type != "text") {
      bad_request("response_format.type",
                  "must be 'text', 'json_object' or 'json_schema', got '{}'", *type);
    }
  }

  if (const json* kw = f.object("chat_template_kwargs")) {
    plan.template_kwargs = *kw;
    if (kw->contains("enable_thinking")) {
      const json& e = (*kw)["enable_thinking"];
      if (!e.is_boolean()) {
        bad_request("chat_template_kwargs.enable_thinking", "must be true or false, got {}",
                    json_type_name(e));
      }
      plan.enable_thinking = e.get<bool>();
    }
  }
  if (auto effort = f.string("reasoning_effort")) {
    if (*effort == "none") {
      plan.enable_thinking = false;
    } else if (*effort == "minimal") {
      plan.reasoning_budget = 256;
    } else if (*effort == "low") {
      plan.reasoning_budget = 1024;
    } else if (*effort == "medium") {
      plan.reasoning_budget = 4096;
    } else if (*effort == "high") {
      plan.reasoning_budget = 16384;
    } else {
      bad_request("reasoning_effort", "must be none, minimal, low, medium or high, got '{}'",
                  *effort);
    }
  }
  if (auto b = f.integer("thinking_budget", 0, INT32_MAX)) plan.reasoning_budget = int(*b);
  return plan;
}

GenerationPlan parse_openai_completion(const json& body, const RequestLimits& limits) {
  GenerationPlan plan;
  plan.api = PlanApi::kCompletion;
  Fields f(body, "");
  plan.model = f.string("model").value_or("");
  const json* prompt = f.get("prompt");
  if (!prompt) bad_request("prompt", "is missing");
  auto ids_of = [](const json& arr, const std::string& p) {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < arr.size(); ++i) {
      if (!arr[i].is_number_integer() || arr[i].get<int64_t>() < 0 ||
          arr[i].get<int64_t>() > INT32_MAX) {
        bad_request(fmt::format("{}[{}]", p, i), "must be a token id (an integer >= 0)");
      }
      ids.push_back(int32_t(arr[i].get<int64_t>()));
    }
    return ids;
  };
  if (prompt->is_string()) {
    plan.prompt_texts.push_back(prompt->get<std::string>());
  } else if (prompt->is_array()) {
    if (prompt->empty()) bad_request("prompt", "is empty");
    if ((*prompt)[0].is_number()) {
      plan.prompt_ids.push_back(ids_of(*prompt, "prompt"));
    } else {
      for (size_t i = 0; i < prompt->size(); ++i) {
        const json& p = (*prompt)[i];
        std::string name = fmt::format("prompt[{}]", i);
        if (p.is_string()) {
          if (!plan.prompt_ids.empty()) bad_request(name, "mixes text and token-id prompts");
          plan.prompt_texts.push_back(p.get<std::string>());
        } else if (p.is_array()) {
          if (!plan.prompt_texts.empty()) bad_request(name, "mixes text and token-id prompts");
          plan.prompt_ids.push_back(ids_of(p, name));
        } else {
          bad_request(name, "must be a string or an array of token ids, got {}", json_type_name(p));
        }
      }
    }
  } else {
    bad_request("prompt", "must be a string, an array of strings or an array of token ids, got {}",
                json_type_name(*prompt));
  }
  parse_sampling(body, plan, limits);
  size_t prompts = plan.prompt_texts.size() + plan.prompt_ids.size();
  if (prompts * size_t(plan.n) > size_t(limits.max_prompts)) {
    bad_request("prompt", "{} prompts x n = {} choices; at most {} per request", prompts,
                prompts * plan.n, limits.max_prompts);
  }
  plan.max_tokens = int(f.integer("max_tokens", 0, INT32_MAX).value_or(16));
  plan.echo = f.boolean("echo").value_or(false);
  if (auto lp = f.integer("logprobs", 0, 20)) plan.logprobs = int(*lp);
  if (f.get("suffix")) bad_request("suffix", "is not supported (no fill-in-the-middle); remove it");
  return plan;
}

}  // namespace tokenmill::server
