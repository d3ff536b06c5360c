// Tool-call bodies for the output parser (output_parser.h): the text between "<tool_call>" and
// "</tool_call>" in the Qwen3 JSON form or the Qwen3.5 / Qwen3-Coder XML form, and the typing of
// XML parameter values by the request's tool schemas.
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "text/output_parser.h"

namespace tokenmill {

// The JSON schema of each tool's parameters, by tool name.
class ToolSchemas {
 public:
  ToolSchemas() = default;
  // `tools`: array of OpenAI {"type":"function","function":{...}} or Anthropic {name,
  // input_schema} objects; anything else is ignored (values then stay strings).
  explicit ToolSchemas(const nlohmann::json& tools);
  // The schema of parameter `param` of tool `tool`, or nullptr when unknown.
  const nlohmann::json* parameter(std::string_view tool, std::string_view param) const;

 private:
  std::map<std::string, nlohmann::json, std::less<>> properties_;  // tool name -> "properties"
};

// The JSON value for the text of an XML parameter, following its schema's type(s): null, integer,
// number, boolean, object and array are parsed from the (trimmed) text when it has that form;
// otherwise, for "string" and for parameters without a schema, the text is kept as a string.
nlohmann::ordered_json type_parameter_value(std::string_view text, const nlohmann::json* schema);

// Compact JSON text; invalid UTF-8 in strings is replaced by U+FFFD instead of throwing.
std::string dump_json(const nlohmann::ordered_json& value);

// Parses one tool-call body incrementally. The caller passes the whole body received so far
// (everything after "<tool_call>") on every call; the parser keeps its place in it.
class ToolCallParser {
 public:
  enum class Status {
    kNeedMore,   // no decision yet: call again with more text
    kDone,       // "</tool_call>" consumed; the calls were emitted
    kMalformed,  // "</tool_call>" consumed, but the body is no valid call: send it as content
  };
  // `schemas` and `id_prefix` must outlive the parser; `first_index`: index of the reply's next
  // tool call.
  ToolCallParser(ToolCallFormat format, const ToolSchemas& schemas, const std::string& id_prefix,
                 int first_index);

  Status advance(std::string_view body, std::vector<OutputEvent>& out);
  // After kDone / kMalformed: bytes of the body up to and including "</tool_call>".
  size_t consumed() const { return pos_; }
  // Index the reply's next tool call gets.
  int next_index() const { return next_index_; }
  // True while a call's begin event was emitted but not its end.
  bool call_open() const { return call_open_; }
  // The end event (complete = false) of the open call, for a stream that ended inside it.
  OutputEvent abort_open_call();

 private:
  enum class State { kStart, kJson, kXmlFunction, kXmlBody, kXmlValue, kXmlAfter, kSkip };

  // Each returns true when it made progress (and may be called again), false when it needs text.
  bool step_start(std::string_view body);
  bool step_json(std::string_view body, std::vector<OutputEvent>& out);
  bool step_xml_function(std::string_view body, std::vector<OutputEvent>& out);
  bool step_xml_body(std::string_view body, std::vector<OutputEvent>& out);
  bool step_xml_value(std::string_view body, std::vector<OutputEvent>& out);
  bool step_xml_after(std::string_view body);
  bool step_skip(std::string_view body);
  void begin_call(std::string name, std::vector<OutputEvent>& out);
  void add_arguments(std::string_view piece, std::vector<OutputEvent>& out);
  void end_call(std::vector<OutputEvent>& out);
  // Emits the JSON-form call(s) in `text`; false when it is not a valid call.
  bool emit_json_calls(std::string_view text, std::vector<OutputEvent>& out);

  ToolCallFormat format_;
  const ToolSchemas& schemas_;
  const std::string& id_prefix_;
  int next_index_;
  State state_ = State::kStart;
  Status status_ = Status::kNeedMore;
  size_t pos_ = 0;   // bytes of the body consumed
  size_t scan_ = 0;  // where the search for a closing tag resumes (kJson, kXmlValue, kSkip)
  bool call_open_ = false;
  OutputEvent open_;   // the open call's id, name and index
  std::string args_;   // the open call's arguments text so far
  std::string param_;  // the XML parameter being read
};

}  // namespace tokenmill
