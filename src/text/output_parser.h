// Output parsers: split a model's streamed reply text into reasoning, content and tool calls.
//
// Fed the text chunks the incremental detokenizer emits, a parser returns events in stream order.
// The merged event sequence does not depend on how the text was split into chunks: markup that
// arrives in pieces is held back until it is known to be (or not be) a tag, so a partial tag never
// leaks into content. Formats (Qwen3 / Qwen3.5 / Qwen3-Coder):
//   reasoning   <think>\nREASONING\n</think>\n\nCONTENT   (newlines next to the tags are stripped)
//   JSON call   <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
//   XML call
//   <tool_call>\n<function=f>\n<parameter=p>\nVALUE\n</parameter>\n</function>\n</tool_call>
// XML parameter values are typed by the request's tool schema (string values stay raw text).
// Nothing is lost at the end of a stream: an unclosed <think> sets flags().truncated_reasoning
// (the aggregate then reports its text as content), an unclosed or malformed <tool_call> comes back
// verbatim as content and sets flags().malformed_tool_call.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tokenmill {

enum class ToolCallFormat {
  kNone,  // "<tool_call>" is plain content
  kJson,  // Qwen3 / Hermes JSON object per call
  kXml,   // Qwen3.5 / Qwen3-Coder <function=...><parameter=...>
  kAuto,  // decided per call from the text after <tool_call>
};

struct OutputParserOptions {
  bool reasoning = false;  // <think>...</think> is reasoning (else "</think>" is dropped)
  bool starts_in_reasoning =
      false;  // the prompt ended inside <think>: the reply starts as reasoning
  ToolCallFormat tool_format = ToolCallFormat::kNone;
  // The request's tools: an array of OpenAI {"type":"function","function":{name, parameters}} or
  // Anthropic {name, input_schema} objects. Types the values of XML parameters; may be null.
  nlohmann::json tools;
  // Tool call ids are this prefix + the call's index in the reply; the server passes a prefix that
  // is unique per request.
  std::string tool_call_id_prefix = "call_";
};

enum class OutputEventType {
  kReasoning,          // text: reasoning delta
  kContent,            // text: content delta
  kToolCallBegin,      // tool_index, id, name
  kToolCallArguments,  // tool_index, text: the next piece of the arguments JSON object text
  kToolCallEnd,        // tool_index, id, name, text: the complete arguments; complete
};

struct OutputEvent {
  OutputEventType type = OutputEventType::kContent;
  std::string text;
  int tool_index = -1;
  std::string id, name;
  // kToolCallEnd only: false when the stream ended inside this call; its raw text was then also
  // emitted as content and the call must be discarded by an aggregate.
  bool complete = true;

  bool operator==(const OutputEvent&) const = default;
};

struct OutputFlags {
  bool truncated_reasoning = false;  // the stream ended inside <think>
  bool malformed_tool_call = false;  // a <tool_call> was unclosed or unparseable (sent as content)

  bool operator==(const OutputFlags&) const = default;
};

class OutputParser {
 public:
  virtual ~OutputParser() = default;
  // Adds text (any split, UTF-8 or not); returns the events it completes.
  virtual std::vector<OutputEvent> feed(std::string_view text) = 0;
  // End of stream: flushes held text and unclosed markup. Call once.
  virtual std::vector<OutputEvent> finish() = 0;
  virtual OutputFlags flags() const = 0;
};

std::unique_ptr<OutputParser> make_output_parser(const OutputParserOptions& options);

// Chooses parser options for a model: `chat_template` is its Jinja source, `model_type` its
// config.json model_type, `rendered_prompt` the prompt the template produced for this request
// (may be empty). The template mentioning <think> enables reasoning; a prompt ending in "<think>\n"
// starts inside reasoning, one ending in "</think>\n\n" has thinking switched off; "<function="
// selects XML tool calls, "<tool_call>" JSON ones. `tools` is copied into the options.
OutputParserOptions choose_output_parser_options(std::string_view chat_template,
                                                 std::string_view model_type,
                                                 std::string_view rendered_prompt,
                                                 const nlohmann::json& tools = nullptr);

struct ToolCall {
  std::string id, name;
  std::string arguments;  // a JSON object, as text

  bool operator==(const ToolCall&) const = default;
};

struct ParsedOutput {
  std::string reasoning, content;
  std::vector<ToolCall> tool_calls;
  OutputFlags flags;

  bool operator==(const ParsedOutput&) const = default;
};

// Folds events into a whole reply; for a non-streamed response, or to log a streamed one.
class OutputAccumulator {
 public:
  void add(const OutputEvent& event);
  void add(const std::vector<OutputEvent>& events) {
    for (const auto& e : events) add(e);
  }
  // The reply so far. With flags.truncated_reasoning the reasoning text is reported as content.
  ParsedOutput result(const OutputFlags& flags) const;

 private:
  std::string reasoning_, content_;
  std::vector<ToolCall> calls_;
  std::vector<bool> dropped_;
};

// Parses a whole reply in one go (feed + finish + accumulate).
ParsedOutput parse_output(const OutputParserOptions& options, std::string_view text);

}  // namespace tokenmill
