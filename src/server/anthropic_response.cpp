#include "server/anthropic_response.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace tokenmill::server {

using json = nlohmann::json;

namespace {

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string event(const char* name, const json& data) {
  return fmt::format("event: {}\ndata: {}\n\n", name, dump(data));
}

json parse_or_empty(const std::string& args) {
  try {
    json j = json::parse(args);
    if (j.is_object()) return j;
  } catch (const json::exception&) {
  }
  return json::object();
}

json usage_json(const Usage& u, bool final_delta) {
  if (final_delta) return {{"output_tokens", u.completion_tokens}};
  return {{"input_tokens", u.prompt_tokens - u.cached_tokens},
          {"output_tokens", u.completion_tokens},
          {"cache_read_input_tokens", u.cached_tokens},
          {"cache_creation_input_tokens", 0}};
}

}  // namespace

std::string anthropic_stop_reason(const std::string& finish_reason,
                                  const std::string& stop_sequence) {
  if (finish_reason == "length") return "max_tokens";
  if (finish_reason == "tool_calls") return "tool_use";
  if (!stop_sequence.empty()) return "stop_sequence";
  return "end_turn";
}

std::string anthropic_message_body(const Generation& gen) {
  const ChoiceResult& r = gen.results().at(0);
  json content = json::array();
  if (gen.show_reasoning() && !r.output.reasoning.empty()) {
    content.push_back({{"type", "thinking"}, {"thinking", r.output.reasoning}, {"signature", ""}});
  }
  if (!r.output.content.empty() || r.output.tool_calls.empty()) {
    content.push_back({{"type", "text"}, {"text", r.output.content}});
  }
  for (const auto& c : r.output.tool_calls) {
    content.push_back({{"type", "tool_use"},
                       {"id", c.id},
                       {"name", c.name},
                       {"input", parse_or_empty(c.arguments)}});
  }
  json body = {{"id", gen.request_id()},
               {"type", "message"},
               {"role", "assistant"},
               {"model", gen.model().name},
               {"content", content},
               {"stop_reason", anthropic_stop_reason(r.finish_reason, r.stop_sequence)},
               {"stop_sequence", r.stop_sequence.empty() ? json(nullptr) : json(r.stop_sequence)},
               {"usage", usage_json(gen.usage(), false)}};
  return dump(body);
}

std::string anthropic_count_tokens_body(int tokens) {
  return dump({{"input_tokens", tokens}});
}

std::string AnthropicStreamWriter::start() {
  Usage u = gen_.usage();
  u.completion_tokens = 0;
  json msg = {{"id", gen_.request_id()},  {"type", "message"},
              {"role", "assistant"},      {"model", gen_.model().name},
              {"content", json::array()}, {"stop_reason", nullptr},
              {"stop_sequence", nullptr}, {"usage", usage_json(u, false)}};
  return event("message_start", {{"type", "message_start"}, {"message", msg}}) + ping();
}

std::string AnthropicStreamWriter::close() {
  if (block_ == Block::kNone) return "";
  std::string out;
  if (block_ == Block::kThinking) {
    out +=
        event("content_block_delta", {{"type", "content_block_delta"},
                                      {"index", index_},
                                      {"delta", {{"type", "signature_delta"}, {"signature", ""}}}});
  }
  out += event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
  block_ = Block::kNone;
  return out;
}

std::string AnthropicStreamWriter::open(Block b, const OutputEvent* tool) {
  std::string out = close();
  block_ = b;
  ++index_;
  json cb;
  if (b == Block::kThinking) {
    cb = {{"type", "thinking"}, {"thinking", ""}};
  } else if (b == Block::kText) {
    cb = {{"type", "text"}, {"text", ""}};
  } else {
    cb = {{"type", "tool_use"}, {"id", tool->id}, {"name", tool->name}, {"input", json::object()}};
  }
  out += event("content_block_start",
               {{"type", "content_block_start"}, {"index", index_}, {"content_block", cb}});
  return out;
}

std::string AnthropicStreamWriter::deltas(const std::vector<ChoiceDelta>& ds) {
  std::string out;
  for (const auto& d : ds) {
    if (d.index != 0) continue;
    for (const auto& e : d.events) {
      switch (e.type) {
        case OutputEventType::kReasoning:
          if (!gen_.show_reasoning() || e.text.empty()) break;
          if (block_ != Block::kThinking) out += open(Block::kThinking, nullptr);
          out += event("content_block_delta",
                       {{"type", "content_block_delta"},
                        {"index", index_},
                        {"delta", {{"type", "thinking_delta"}, {"thinking", e.text}}}});
          break;
        case OutputEventType::kContent:
          if (e.text.empty()) break;
          if (block_ != Block::kText) out += open(Block::kText, nullptr);
          out +=
              event("content_block_delta", {{"type", "content_block_delta"},
                                            {"index", index_},
                                            {"delta", {{"type", "text_delta"}, {"text", e.text}}}});
          break;
        case OutputEventType::kToolCallBegin:
          out += open(Block::kTool, &e);
          break;
        case OutputEventType::kToolCallArguments:
          if (block_ != Block::kTool) break;
          out += event("content_block_delta",
                       {{"type", "content_block_delta"},
                        {"index", index_},
                        {"delta", {{"type", "input_json_delta"}, {"partial_json", e.text}}}});
          break;
        case OutputEventType::kToolCallEnd:
          out += close();
          break;
      }
    }
    if (!d.finish_reason.empty()) {
      finish_reason_ = d.finish_reason;
      stop_sequence_ = d.stop_sequence;
    }
  }
  return out;
}

std::string AnthropicStreamWriter::end() {
  std::string out = close();
  if (index_ < 0) {
    // Every message has at least one content block.
    out += open(Block::kText, nullptr);
    out += close();
  }
  json delta = {{"stop_reason", anthropic_stop_reason(finish_reason_, stop_sequence_)},
                {"stop_sequence", stop_sequence_.empty() ? json(nullptr) : json(stop_sequence_)}};
  out += event(
      "message_delta",
      {{"type", "message_delta"}, {"delta", delta}, {"usage", usage_json(gen_.usage(), true)}});
  out += event("message_stop", {{"type", "message_stop"}});
  return out;
}

}  // namespace tokenmill::server
