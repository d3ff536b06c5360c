// Constrained decoding for tool_choice "required" (Anthropic "any") and a named tool: the reply
// is forced into the model's own tool-call markup (the form its output parser reads), so it
// always holds at least one well-formed call of an allowed tool, with arguments that parse as a
// JSON object and follow the tool's parameters schema (the json_grammar subset, read leniently:
// keywords outside it are not enforced).
//
// Reply grammar (the text after the prompt):
//   [reasoning]  CALL  ("\n" CALL)*   end of generation
//   reasoning  free text up to "</think>" (when the prompt opened <think>; optional "<think>"
//              first when the template knows reasoning but the prompt did not open it), then at
//              most two newlines; the reasoning budget forces the </think> token.
//   CALL, XML (Qwen3.5 / Qwen3-Coder):
//     <tool_call>\n<function=NAME>\n (<parameter=P>\nVALUE</parameter>\n)*
//     </function>\n</tool_call> P is a property of NAME's schema not given yet (any name of
//     [A-Za-z0-9_.-] when the schema declares none and allows extra keys); </function> comes only
//     after every required one. VALUE: when P's schema admits strings, raw text (exactly one of its
//     values plus "\n" when it only allows listed values); otherwise a JSON value of P's schema. No
//     VALUE contains a tag that would end it early (<parameter=, </function>, </tool_call>).
//   CALL, JSON (Qwen3 / Hermes):  <tool_call>\n{"name": NAME, "arguments": {...}}</tool_call>
//     (JSON never containing "</tool_call>").
// A named tool or parallel = false allows one call: accept() ends generation after it.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/request.h"
#include "text/output_parser.h"

namespace tokenmill::server {

struct ToolCallGrammarSpec {
  ToolCallFormat format = ToolCallFormat::kXml;  // kXml or kJson
  // The tools a call may use (OpenAI {"type": "function", "function": {name, parameters}}),
  // at least one; schema_params[i] names tools[i]'s parameters schema in error messages.
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  std::vector<std::string> schema_params;
  bool parallel = true;  // more than one call
  enum class Reasoning { kNone, kOptional, kOpen } reasoning = Reasoning::kNone;
  int reasoning_budget = -1;  // tokens of reasoning before think_end_token is forced; -1 none
  int32_t think_end_token = -1;
};

class ToolCallGrammar;

// Compiles the grammar once per request. Throws ApiError 400 (param tools[i].function.parameters)
// for a parameters schema it cannot read.
std::shared_ptr<const ToolCallGrammar> compile_tool_call_grammar(const ToolCallGrammarSpec& spec);

// The vocabulary in byte order, with each token's common prefix length with the one before it:
// mask() walks it like a trie, so a prefix is simulated once for all tokens that share it, and a
// dead prefix rejects them all at once. Computed once per model (sort_tokens).
struct TokenOrder {
  std::vector<int32_t> ids;
  std::vector<uint32_t> lcp;  // lcp[0] = 0
};
std::shared_ptr<const TokenOrder> sort_tokens(const std::vector<std::string>& token_bytes);

// One constraint per generated choice. token_bytes / special / stop_ids: as for
// make_json_constraint; stop ids are allowed only after a complete call. `order` may be null
// (then it is computed here).
std::shared_ptr<TokenConstraint> make_tool_call_constraint(
    std::shared_ptr<const ToolCallGrammar> grammar,
    std::shared_ptr<const std::vector<std::string>> token_bytes,
    std::shared_ptr<const TokenOrder> order, const std::vector<uint8_t>& special,
    const std::vector<int32_t>& stop_ids);

// For tests: whether `text` is a valid prefix of a reply (complete = false) or a whole reply
// that may end here (complete = true).
bool tool_call_grammar_accepts(const ToolCallGrammar& grammar, const std::string& text,
                               bool complete);

}  // namespace tokenmill::server
