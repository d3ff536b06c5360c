// libFuzzer target: constrained tool calls (tool_call_constraint). Byte 0 picks the markup (bit 0:
// XML or JSON), whether several calls may come (bit 1) and the reasoning mode (bits 2-3: none,
// optional, open); then the tools (an OpenAI tools array), a zero byte and a reply. For tools the
// request parser accepts and a grammar that compiles (else a 400, tokenmill::Error), a reply the
// grammar accepts as complete must be what it promises: the output parser finds at least one
// well-formed call (exactly one when parallel calls are off), each of a listed tool with
// arguments that parse as a JSON object; and every prefix of it is accepted as a prefix.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>

#include "server/openai_request.h"
#include "server/tool_call_constraint.h"
#include "text/output_parser.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tokenmill::server::ToolCallGrammarSpec;
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t cut = rest.find('\0');
  if (cut == std::string::npos) return 0;
  const auto tools = nlohmann::ordered_json::parse(rest.substr(0, cut), nullptr, false);
  const std::string reply = rest.substr(cut + 1);
  if (tools.is_discarded() || !tools.is_array() || tools.empty()) return 0;
  ToolCallGrammarSpec spec;
  spec.format = (data[0] & 1) ? tokenmill::ToolCallFormat::kJson : tokenmill::ToolCallFormat::kXml;
  spec.parallel = (data[0] & 2) != 0;
  const int mode = (data[0] >> 2) % 3;
  spec.reasoning = mode == 0   ? ToolCallGrammarSpec::Reasoning::kNone
                   : mode == 1 ? ToolCallGrammarSpec::Reasoning::kOptional
                               : ToolCallGrammarSpec::Reasoning::kOpen;
  spec.tools = tools;
  for (size_t i = 0; i < tools.size(); ++i) {
    spec.schema_params.push_back("tools[" + std::to_string(i) + "].function.parameters");
  }
  std::shared_ptr<const tokenmill::server::ToolCallGrammar> grammar;
  try {
    tokenmill::server::validate_tools(tools, "tools");
    grammar = tokenmill::server::compile_tool_call_grammar(spec);
  } catch (const tokenmill::Error&) {
    return 0;  // a 400
  }
  if (!tokenmill::server::tool_call_grammar_accepts(*grammar, reply, true)) return 0;
  tokenmill::OutputParserOptions o;
  o.reasoning = mode != 0;
  o.starts_in_reasoning = mode == 2;
  o.tool_format = spec.format;
  o.tools = nlohmann::json::parse(tools.dump());
  const tokenmill::ParsedOutput out = tokenmill::parse_output(o, reply);
  std::set<std::string> names;
  for (const auto& t : tools) names.insert(t["function"]["name"].get<std::string>());
  bool ok = !out.flags.malformed_tool_call && !out.tool_calls.empty() &&
            (spec.parallel || out.tool_calls.size() == 1);
  for (const auto& call : out.tool_calls) {
    const auto args = nlohmann::json::parse(call.arguments, nullptr, false);
    ok = ok && names.count(call.name) == 1 && args.is_object();
  }
  if (!ok) __builtin_trap();
  if (reply.size() <= 512) {
    for (size_t n = 0; n <= reply.size(); ++n) {
      if (!tokenmill::server::tool_call_grammar_accepts(*grammar, reply.substr(0, n), false)) {
        __builtin_trap();
      }
    }
  }
  return 0;
}
