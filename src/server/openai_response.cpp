#include "server/openai_response.h"

#include <chrono>
#include <nlohmann/json.hpp>

#include "text/detokenizer.h"

namespace tokenmill::server {

using json = nlohmann::json;

namespace {

long now_seconds() {
  return long(std::chrono::duration_cast<std::chrono::seconds>(
                  std::chrono::system_clock::now().time_since_epoch())
                  .count());
}

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json bytes_array(const std::string& b) {
  json a = json::array();
  for (char c : b) a.push_back(int(uint8_t(c)));
  return a;
}

// Chat logprobs: {"content": [{token, logprob, bytes, top_logprobs: [...]}]}.
json chat_logprobs(const std::vector<TokenLogprob>& lps) {
  json content = json::array();
  for (const auto& t : lps) {
    json top = json::array();
    for (const auto& [b, lp] : t.top) {
      top.push_back({{"token", detok::utf8_lossy(b)}, {"logprob", lp}, {"bytes", bytes_array(b)}});
    }
    content.push_back({{"token", detok::utf8_lossy(t.bytes)},
                       {"logprob", t.logprob},
                       {"bytes", bytes_array(t.bytes)},
                       {"top_logprobs", top}});
  }
  return {{"content", content}};
}

// Completions logprobs: {tokens, token_logprobs, top_logprobs, text_offset}. `first_null`: the
// first entry is an unscored prompt token.
json completion_logprobs(const std::vector<TokenLogprob>& lps, bool first_null, size_t offset) {
  json tokens = json::array(), lp = json::array(), top = json::array(), off = json::array();
  for (size_t i = 0; i < lps.size(); ++i) {
    const auto& t = lps[i];
    std::string s = detok::utf8_lossy(t.bytes);
    tokens.push_back(s);
    off.push_back(offset);
    offset += t.bytes.size();
    if (first_null && i == 0) {
      lp.push_back(nullptr);
      top.push_back(nullptr);
      continue;
    }
    lp.push_back(t.logprob);
    json m = json::object();
    for (const auto& [b, l] : t.top) m[detok::utf8_lossy(b)] = l;
    top.push_back(m);
  }
  return {{"tokens", tokens}, {"token_logprobs", lp}, {"top_logprobs", top}, {"text_offset", off}};
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}},
          {"completion_tokens_details", {{"reasoning_tokens", u.reasoning_tokens}}}};
}

json tool_calls_json(const std::vector<ToolCall>& calls) {
  json a = json::array();
  for (const auto& c : calls) {
    a.push_back({{"id", c.id},
                 {"type", "function"},
                 {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  }
  return a;
}

}  // namespace

std::string openai_chat_body(const Generation& gen) {
  json choices = json::array();
  for (const auto& r : gen.results()) {
    json msg = {{"role", "assistant"}};
    msg["content"] = r.output.content.empty() && !r.output.tool_calls.empty()
                         ? json(nullptr)
                         : json(r.output.content);
    if (!r.output.reasoning.empty()) msg["reasoning_content"] = r.output.reasoning;
    if (!r.output.tool_calls.empty()) msg["tool_calls"] = tool_calls_json(r.output.tool_calls);
    json c = {{"index", r.index}, {"message", msg}, {"finish_reason", r.finish_reason}};
    c["logprobs"] = gen.plan().logprobs >= 0 ? chat_logprobs(r.logprobs) : json(nullptr);
    choices.push_back(std::move(c));
  }
  json body = {{"id", gen.request_id()},   {"object", "chat.completion"},
               {"created", now_seconds()}, {"model", gen.model().name},
               {"choices", choices},       {"usage", usage_json(gen.usage())}};
  return dump(body);
}

std::string openai_completion_body(const Generation& gen) {
  json choices = json::array();
  for (const auto& r : gen.results()) {
    std::string text = gen.plan().echo ? r.prompt_text + r.text : r.text;
    json c = {{"index", r.index}, {"text", text}, {"finish_reason", r.finish_reason}};
    if (gen.plan().logprobs >= 0) {
      std::vector<TokenLogprob> all;
      if (gen.plan().echo) all = r.prompt_logprobs;
      all.insert(all.end(), r.logprobs.begin(), r.logprobs.end());
      c["logprobs"] = completion_logprobs(all, gen.plan().echo && !r.prompt_logprobs.empty(), 0);
    } else {
      c["logprobs"] = nullptr;
    }
    choices.push_back(std::move(c));
  }
  json body = {{"id", gen.request_id()},   {"object", "text_completion"},
               {"created", now_seconds()}, {"model", gen.model().name},
               {"choices", choices},       {"usage", usage_json(gen.usage())}};
  return dump(body);
}

OpenAIStreamWriter::OpenAIStreamWriter(const Generation& gen)
    : gen_(gen), created_(now_seconds()) {}

std::string OpenAIStreamWriter::deltas(const std::vector<ChoiceDelta>& ds) {
  const bool chat = gen_.plan().api == PlanApi::kChat;
  std::string out;
  auto emit = [&](json choice) {
    json chunk = {{"id", gen_.request_id()},
                  {"object", chat ? "chat.completion.chunk" : "text_completion"},
                  {"created", created_},
                  {"model", gen_.model().name},
                  {"choices", json::array({std::move(choice)})}};
    out += "data: " + dump(chunk) + "\n\n";
  };
  for (const auto& d : ds) {
    if (size_t(d.index) >= started_.size()) {
      started_.resize(d.index + 1, false);
      echoed_.resize(d.index + 1, false);
    }
    if (!chat) {
      const ChoiceResult& r = gen_.results()[d.index];
      std::string text;
      std::vector<TokenLogprob> lps;
      bool first_null = false;
      if (gen_.plan().echo && !echoed_[d.index]) {
        if (!r.prompt_logprobs.empty() || gen_.plan().logprobs < 0) {
          echoed_[d.index] = true;
          text = r.prompt_text;
          lps = r.prompt_logprobs;
          first_null = !lps.empty();
        }
      }
      for (const auto& e : d.events) text += e.text;
      lps.insert(lps.end(), d.logprobs.begin(), d.logprobs.end());
      if (text.empty() && lps.empty() && d.finish_reason.empty()) continue;
      json c = {{"index", d.index}, {"text", text}};
      c["logprobs"] =
          gen_.plan().logprobs >= 0 ? completion_logprobs(lps, first_null, 0) : json(nullptr);
      c["finish_reason"] = d.finish_reason.empty() ? json(nullptr) : json(d.finish_reason);
      emit(std::move(c));
      continue;
    }
    if (!started_[d.index]) {
      started_[d.index] = true;
      emit({{"index", d.index},
            {"delta", {{"role", "assistant"}, {"content", ""}}},
            {"logprobs", nullptr},
            {"finish_reason", nullptr}});
    }
    // Consecutive events of one kind are merged into one chunk.
    json delta = json::object();
    std::string kind;
    auto flush = [&](bool with_logprobs) {
      if (delta.empty() && !with_logprobs) return;
      json c = {{"index", d.index}, {"delta", delta}, {"finish_reason", nullptr}};
      c["logprobs"] = with_logprobs ? chat_logprobs(d.logprobs) : json(nullptr);
      emit(std::move(c));
      delta = json::object();
      kind.clear();
    };
    bool logprobs_sent = gen_.plan().logprobs < 0 || d.logprobs.empty();
    for (const auto& e : d.events) {
      switch (e.type) {
        case OutputEventType::kReasoning:
        case OutputEventType::kContent: {
          const char* key = e.type == OutputEventType::kReasoning ? "reasoning_content" : "content";
          if (kind != key) flush(false);
          kind = key;
          delta[key] = delta.value(key, std::string()) + e.text;
          break;
        }
        case OutputEventType::kToolCallBegin:
          flush(false);
          delta["tool_calls"] =
              json::array({{{"index", e.tool_index},
                            {"id", e.id},
                            {"type", "function"},
                            {"function", {{"name", e.name}, {"arguments", ""}}}}});
          flush(false);
          break;
        case OutputEventType::kToolCallArguments:
          flush(false);
          delta["tool_calls"] =
              json::array({{{"index", e.tool_index}, {"function", {{"arguments", e.text}}}}});
          flush(false);
          break;
        case OutputEventType::kToolCallEnd:
          break;
      }
    }
    if (!logprobs_sent && !delta.empty()) {
      flush(true);
      logprobs_sent = true;
    }
    flush(!logprobs_sent);
    if (!d.finish_reason.empty()) {
      json c = {{"index", d.index},
                {"delta", json::object()},
                {"logprobs", nullptr},
                {"finish_reason", d.finish_reason}};
      emit(std::move(c));
    }
  }
  return out;
}

std::string OpenAIStreamWriter::end() {
  std::string out;
  if (gen_.plan().include_usage) {
    json chunk = {
        {"id", gen_.request_id()},
        {"object", gen_.plan().api == PlanApi::kChat ? "chat.completion.chunk" : "text_completion"},
        {"created", created_},
        {"model", gen_.model().name},
        {"choices", json::array()},
        {"usage", usage_json(gen_.usage())}};
    out += "data: " + dump(chunk) + "\n\n";
  }
  out += "data: [DONE]\n\n";
  return out;
}

}  // namespace tokenmill::server
