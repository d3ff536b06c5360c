#include "text/output_parser.h"

#include <optional>
#include <utility>

#include "text/tool_call_parser.h"

namespace tokenmill {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kToolOpen = "<tool_call>";
// Consumed bytes are erased from the front of the buffer once this many accumulate.
constexpr size_t kCompactAt = 4096;

void emit(OutputEventType type, std::string_view text, std::vector<OutputEvent>& out) {
  if (text.empty()) return;
  if (!out.empty() && out.back().type == type) {
    out.back().text += text;
    return;
  }
  OutputEvent e;
  e.type = type;
  e.text = std::string(text);
  out.push_back(std::move(e));
}

// One kind of text (reasoning or content) on its way out. Newlines next to tags belong to the
// markup, not the text (the Qwen templates write "<think>\nR\n</think>\n\nC" and "C\n<tool_call>"):
// leading characters in `strip` are dropped after a tag, and a trailing run of newlines is held
// until more text shows it is inside the text; a following tag drops it.
struct Sink {
  OutputEventType type;
  std::string_view strip;
  std::string held;

  void write(std::string_view text, std::vector<OutputEvent>& out) {
    if (!strip.empty()) {
      const size_t b = text.find_first_not_of(strip);
      if (b == std::string_view::npos) return;
      text.remove_prefix(b);
      strip = {};
    }
    const size_t e = text.find_last_not_of('\n');
    if (e == std::string_view::npos) {
      held += text;
      return;
    }
    emit(type, held, out);
    emit(type, text.substr(0, e + 1), out);
    held = std::string(text.substr(e + 1));
  }
  void flush(std::vector<OutputEvent>& out) {
    emit(type, held, out);
    held.clear();
  }
};

// Qwen3 / Qwen3.5 / Qwen3-Coder replies: <think> reasoning and <tool_call> in JSON or XML form.
class QwenOutputParser final : public OutputParser {
 public:
  explicit QwenOutputParser(const OutputParserOptions& options)
      : opts_(options), schemas_(options.tools) {
    if (opts_.reasoning && opts_.starts_in_reasoning) {
      state_ = State::kReasoning;
      reasoning_opened_ = true;
      reasoning_.strip = "\n";
    }
  }

  std::vector<OutputEvent> feed(std::string_view text) override {
    std::vector<OutputEvent> out;
    if (finished_) return out;
    buf_.append(text);
    run(false, out);
    return out;
  }

  std::vector<OutputEvent> finish() override {
    std::vector<OutputEvent> out;
    if (finished_) return out;
    finished_ = true;
    run(true, out);
    if (state_ == State::kToolCall) {
      // Unclosed call: its payload goes out verbatim as content.
      if (tool_->call_open()) out.push_back(tool_->abort_open_call());
      flags_.malformed_tool_call = true;
      content_.held = std::move(held_before_tool_);
      content_.write(std::string_view(buf_).substr(tool_start_), out);
      tool_.reset();
      state_ = State::kContent;
    }
    if (state_ == State::kReasoning) flags_.truncated_reasoning = true;
    reasoning_.flush(out);
    content_.flush(out);
    buf_.clear();
    pos_ = 0;
    return out;
  }

  OutputFlags flags() const override { return flags_; }

 private:
  enum class State { kContent, kReasoning, kToolCall };

  void run(bool at_end, std::vector<OutputEvent>& out) {
    for (;;) {
      const bool progressed = state_ == State::kToolCall ? step_tool(out) : step_text(at_end, out);
      if (!progressed) break;
    }
    const size_t keep_from = state_ == State::kToolCall ? tool_start_ : pos_;
    if (keep_from >= kCompactAt) {
      buf_.erase(0, keep_from);
      pos_ -= keep_from;
      tool_start_ -= keep_from;
    }
  }

  // Text state: passes text through up to the next tag this state reacts to.
  bool step_text(bool at_end, std::vector<OutputEvent>& out) {
    const bool in_reasoning = state_ == State::kReasoning;
    Sink& sink = in_reasoning ? reasoning_ : content_;
    std::string_view tags[3];
    size_t n_tags = 0;
    if (in_reasoning) {
      tags[n_tags++] = kThinkClose;
      // A model may repeat the "<think>" its prompt already opened: dropped while nothing but
      // newlines came before it.
      if (!reasoning_.strip.empty()) tags[n_tags++] = kThinkOpen;
    } else {
      tags[n_tags++] = kThinkClose;  // stray close (thinking off, or after the block): dropped
      if (opts_.reasoning && !reasoning_opened_) tags[n_tags++] = kThinkOpen;
      if (opts_.tool_format != ToolCallFormat::kNone) tags[n_tags++] = kToolOpen;
    }
    const std::string_view rest = std::string_view(buf_).substr(pos_);
    size_t at = std::string_view::npos;
    std::string_view tag;
    for (size_t t = 0; t < n_tags; ++t) {
      const size_t i = rest.find(tags[t]);
      if (i < at) {
        at = i;
        tag = tags[t];
      }
    }
    if (at == std::string_view::npos) {
      // Hold back the longest suffix that could still grow into a tag.
      size_t hold = 0;
      if (!at_end) {
        for (size_t t = 0; t < n_tags; ++t) {
          for (size_t len = std::min(rest.size(), tags[t].size() - 1); len > hold; --len) {
            if (tags[t].starts_with(rest.substr(rest.size() - len))) {
              hold = len;
              break;
            }
          }
        }
      }
      sink.write(rest.substr(0, rest.size() - hold), out);
      pos_ += rest.size() - hold;
      return false;
    }
    sink.write(rest.substr(0, at), out);
    const size_t tag_pos = pos_ + at;
    pos_ = tag_pos + tag.size();
    if (tag == kThinkOpen && in_reasoning) {
      if (reasoning_.strip.empty()) reasoning_.write(tag, out);  // text came first: it is text
    } else if (tag == kThinkOpen) {
      content_.held.clear();
      state_ = State::kReasoning;
      reasoning_opened_ = true;
      reasoning_.strip = "\n";
    } else if (tag == kThinkClose && in_reasoning) {
      reasoning_.held.clear();
      state_ = State::kContent;
      content_.strip = "\n";
    } else if (tag == kThinkClose) {
      content_.strip = "\n";  // held newlines before a stray close stay: they may be mid-text
    } else {
      held_before_tool_ = std::move(content_.held);  // restored if the call is sent as content
      content_.held.clear();
      state_ = State::kToolCall;
      tool_start_ = tag_pos;
      tool_.emplace(opts_.tool_format, schemas_, opts_.tool_call_id_prefix, next_tool_index_);
    }
    return true;
  }

  bool step_tool(std::vector<OutputEvent>& out) {
    const size_t body_start = tool_start_ + kToolOpen.size();
    const auto status = tool_->advance(std::string_view(buf_).substr(body_start), out);
    if (status == ToolCallParser::Status::kNeedMore) return false;
    next_tool_index_ = tool_->next_index();
    const size_t end = body_start + tool_->consumed();
    if (status == ToolCallParser::Status::kMalformed) {
      flags_.malformed_tool_call = true;
      content_.held = std::move(held_before_tool_);
      content_.write(std::string_view(buf_).substr(tool_start_, end - tool_start_), out);
    } else {
      content_.strip = " \t\r\n";  // whitespace between and after calls is markup
    }
    pos_ = end;
    tool_.reset();
    state_ = State::kContent;
    return true;
  }

  OutputParserOptions opts_;
  ToolSchemas schemas_;
  State state_ = State::kContent;
  std::string buf_;  // text received and not yet erased; [pos_, end) is unprocessed
  size_t pos_ = 0;
  size_t tool_start_ = 0;  // kToolCall: where "<tool_call>" begins in buf_
  std::optional<ToolCallParser> tool_;
  std::string held_before_tool_;
  int next_tool_index_ = 0;
  bool reasoning_opened_ = false;  // one reasoning block per reply
  bool finished_ = false;
  Sink reasoning_{OutputEventType::kReasoning, {}, {}};
  Sink content_{OutputEventType::kContent, {}, {}};
  OutputFlags flags_;
};

bool contains(std::string_view s, std::string_view x) {
  return s.find(x) != std::string_view::npos;
}

}  // namespace

std::unique_ptr<OutputParser> make_output_parser(const OutputParserOptions& options) {
  return std::make_unique<QwenOutputParser>(options);
}

OutputParserOptions choose_output_parser_options(std::string_view chat_template,
                                                 std::string_view model_type,
                                                 std::string_view rendered_prompt,
                                                 const nlohmann::json& tools) {
  OutputParserOptions o;
  o.tools = tools;
  o.reasoning = contains(chat_template, kThinkOpen) || contains(chat_template, kThinkClose);
  // Only spaces and newlines may follow the tag at the end of the prompt.
  const size_t last = rendered_prompt.find_last_not_of(" \n");
  const std::string_view trimmed =
      last == std::string_view::npos ? std::string_view() : rendered_prompt.substr(0, last + 1);
  if (trimmed.ends_with(kThinkOpen)) {
    o.reasoning = true;
    o.starts_in_reasoning = true;
  } else if (trimmed.ends_with(kThinkClose)) {
    o.reasoning = false;  // the template closed an empty think block: thinking is switched off
  }
  if (contains(chat_template, "<function=") || contains(chat_template, "<parameter=")) {
    o.tool_format = ToolCallFormat::kXml;
  } else if (contains(chat_template, kToolOpen)) {
    o.tool_format = ToolCallFormat::kJson;
  } else if (model_type.starts_with("qwen")) {
    o.tool_format = ToolCallFormat::kAuto;
  }
  return o;
}

void OutputAccumulator::add(const OutputEvent& e) {
  switch (e.type) {
    case OutputEventType::kReasoning:
      reasoning_ += e.text;
      return;
    case OutputEventType::kContent:
      content_ += e.text;
      return;
    default:
      break;
  }
  if (e.tool_index < 0) return;
  const auto i = static_cast<size_t>(e.tool_index);
  if (i >= calls_.size()) {
    calls_.resize(i + 1);
    dropped_.resize(i + 1, false);
  }
  switch (e.type) {
    case OutputEventType::kToolCallBegin:
      calls_[i] = ToolCall{e.id, e.name, ""};
      break;
    case OutputEventType::kToolCallArguments:
      calls_[i].arguments += e.text;
      break;
    case OutputEventType::kToolCallEnd:
      if (e.complete) {
        calls_[i].arguments = e.text;
      } else {
        dropped_[i] = true;
      }
      break;
    default:
      break;
  }
}

ParsedOutput OutputAccumulator::result(const OutputFlags& flags) const {
  ParsedOutput r;
  r.flags = flags;
  r.content = content_;
  if (flags.truncated_reasoning) {
    r.content += reasoning_;  // the reply ended inside <think>: its text is the answer we have
  } else {
    r.reasoning = reasoning_;
  }
  for (size_t i = 0; i < calls_.size(); ++i) {
    if (!dropped_[i]) r.tool_calls.push_back(calls_[i]);
  }
  return r;
}

ParsedOutput parse_output(const OutputParserOptions& options, std::string_view text) {
  auto parser = make_output_parser(options);
  OutputAccumulator acc;
  acc.add(parser->feed(text));
  acc.add(parser->finish());
  return acc.result(parser->flags());
}

}  // namespace tokenmill
