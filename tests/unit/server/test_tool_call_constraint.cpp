// tool_choice required / named: the grammar against the chat template's own rendering of tool
// calls, and random walks over the demo model's vocabulary through the token constraint whose
// text is then read by the real output parser (the reference for "the client gets a call").
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "server/api_error.h"
#include "server/generation.h"
#include "server/json_schema_constraint.h"
#include "server/tool_call_constraint.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace tokenmill::server {
namespace {

using json = nlohmann::ordered_json;
using Reasoning = ToolCallGrammarSpec::Reasoning;

const json kParams = json::parse(R"({
  "type": "object",
  "properties": {
    "mode": {"type": "string", "enum": ["fast", "slow"]},
    "n": {"type": "integer"},
    "s": {"type": "string", "description": "free text"},
    "x": {"type": ["number", "null"]},
    "flag": {"type": "boolean"},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    "opt": {"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"],
            "additionalProperties": false}
  },
  "required": ["mode", "n"],
  "additionalProperties": false
})");

json tools() {
  return json::array(
      {{{"type", "function"},
        {"function", {{"name", "search"}, {"description", "d"}, {"parameters", kParams}}}},
       {{"type", "function"}, {"function", {{"name", "ping"}}}}});  // no schema: any arguments
}

ToolCallGrammarSpec spec_for(ToolCallFormat format, const json& tool_list) {
  ToolCallGrammarSpec s;
  s.format = format;
  s.tools = tool_list;
  return s;
}

// The demo model's tokenizer and template, loaded once.
struct Demo {
  Tokenizer tok = Tokenizer::from_dir(TM_SOURCE_DIR "/models/demo");
  ChatTemplate tmpl = ChatTemplate::from_dir(TM_SOURCE_DIR "/models/demo");
  ServedModel m;
  std::vector<int32_t> stop_ids;
  Demo() {
    m.tokenizer = &tok;
    compute_token_bytes(m);
    stop_ids = {*tok.token_to_id("<|im_end|>"), *tok.token_to_id("<|endoftext|>")};
  }
  static const Demo& get() {
    static Demo d;
    return d;
  }
};

TEST(ToolCallGrammar, AcceptsTheTemplatesOwnRendering) {
  const Demo& d = Demo::get();
  ChatTemplateInputs in;
  json args = {
      {"mode", "fast"},     {"n", 3},           {"s", "hi <b>there</b>\nline two"}, {"x", nullptr},
      {"tags", {"a", "b"}}, {"opt", {{"k", 1}}}};
  in.messages = json::array(
      {{{"role", "user"}, {"content", "q"}},
       {{"role", "assistant"},
        {"content", ""},
        {"tool_calls",
         {{{"type", "function"}, {"function", {{"name", "search"}, {"arguments", args}}}},
          {{"type", "function"}, {"function", {{"name", "ping"}, {"arguments", {{"a", 1}}}}}}}}}});
  in.add_generation_prompt = false;
  std::string text = d.tmpl.render(in);
  size_t b = text.find("<tool_call>"), e = text.rfind("</tool_call>");
  ASSERT_NE(b, std::string::npos) << text;
  std::string calls = text.substr(b, e + 12 - b);
  auto g = compile_tool_call_grammar(spec_for(ToolCallFormat::kXml, tools()));
  EXPECT_TRUE(tool_call_grammar_accepts(*g, calls, true)) << calls;
  // One call only (the first): complete after it when parallel calls are off.
  auto spec = spec_for(ToolCallFormat::kXml, tools());
  spec.parallel = false;
  auto single = compile_tool_call_grammar(spec);
  std::string first = calls.substr(0, calls.find("</tool_call>") + 12);
  EXPECT_TRUE(tool_call_grammar_accepts(*single, first, true));
  EXPECT_FALSE(tool_call_grammar_accepts(*single, calls, false));
}

TEST(ToolCallGrammar, RejectsCallsOutsideTheSchema) {
  auto g = compile_tool_call_grammar(spec_for(ToolCallFormat::kXml, tools()));
  auto ok = [&](const std::string& t, bool complete = true) {
    return tool_call_grammar_accepts(*g, t, complete);
  };
  const std::string head = "<tool_call>\n<function=search>\n";
  const std::string mode = "<parameter=mode>\nfast\n</parameter>\n";
  const std::string n = "<parameter=n>\n12\n</parameter>\n";
  const std::string end = "</function>\n</tool_call>";
  EXPECT_TRUE(ok(head + mode + n + end));
  EXPECT_TRUE(ok(head + n + mode + end));                                         // any order
  EXPECT_FALSE(ok(head + mode + end));                                            // n is required
  EXPECT_FALSE(ok("Sure. " + head + mode + n + end));                             // text first
  EXPECT_FALSE(ok("<tool_call>\n<function=other>\n" + mode + n + end));           // unknown tool
  EXPECT_FALSE(ok(head + "<parameter=mode>\nmedium\n</parameter>\n" + n + end));  // enum
  EXPECT_FALSE(ok(head + mode + "<parameter=n>\n1.5\n</parameter>\n" + end));     // integer
  // An integer stays one when the parser types it (at most 18 digits fit int64).
  EXPECT_TRUE(
      ok(head + mode + "<parameter=n>\n" + std::string(18, '7') + "\n</parameter>\n" + end));
  EXPECT_FALSE(ok(head + mode + "<parameter=n>\n" + std::string(19, '7'), false));
  EXPECT_FALSE(ok(head + mode + n + mode + end));                                 // given twice
  EXPECT_FALSE(ok(head + mode + n + "<parameter=zz>\n1\n</parameter>\n" + end));  // unknown key
  EXPECT_FALSE(ok(head + mode + n + "<parameter=s>\na</function>b\n</parameter>\n" + end));
  EXPECT_TRUE(ok(head + mode + n + "<parameter=s>\na <b> c\n</parameter>\n" + end));
  EXPECT_TRUE(ok(head + mode + n, false));  // a valid prefix ...
  EXPECT_FALSE(ok(head + mode + n, true));  // ... that may not end there
  EXPECT_TRUE(ok("<tool_call>\n<function=ping>\n<parameter=any_name>\nv\n</parameter>\n" + end));
}

TEST(ToolCallGrammar, JsonFormat) {
  auto g = compile_tool_call_grammar(spec_for(ToolCallFormat::kJson, tools()));
  auto ok = [&](const std::string& t) { return tool_call_grammar_accepts(*g, t, true); };
  EXPECT_TRUE(
      ok("<tool_call>\n{\"name\": \"search\", \"arguments\": {\"mode\": \"slow\", "
         "\"n\": -4}}\n</tool_call>"));
  EXPECT_TRUE(ok("<tool_call>\n{\"arguments\": {\"q\": [1]}, \"name\": \"ping\"}\n</tool_call>"));
  EXPECT_FALSE(ok("<tool_call>\n{\"name\": \"search\", \"arguments\": {\"n\": 1}}\n</tool_call>"));
  EXPECT_FALSE(ok("<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(ok("<tool_call>\n{\"name\": \"ping\"}\n</tool_call>"));  // arguments required
  EXPECT_FALSE(
      ok("<tool_call>\n{\"name\": \"ping\", \"arguments\": {\"a\": \"</tool_call>\"}}"
         "\n</tool_call>"));
}

TEST(ToolCallGrammar, LenientSchemasAndErrors) {
  // Keywords outside the subset are not enforced for tools (response_format rejects them).
  json p = json::parse(R"({"type": "object", "properties": {"n": {"type": "integer",
      "minimum": 3}, "s": {"type": "string", "pattern": "^a", "maxLength": 4}}})");
  EXPECT_THROW(validate_json_schema(p), ApiError);
  json t = json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", p}}}}});
  EXPECT_NO_THROW(compile_tool_call_grammar(spec_for(ToolCallFormat::kXml, t)));
  // A schema that cannot be read at all names the tool's parameters.
  json bad = json::array(
      {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", {{"properties", 5}}}}}}});
  auto spec = spec_for(ToolCallFormat::kXml, bad);
  spec.schema_params = {"tools[3].function.parameters"};
  try {
    compile_tool_call_grammar(spec);
    FAIL() << "accepted properties: 5";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "tools[3].function.parameters");
  }
}

// Markup a "model" in a hurry would type to close what it opened.
const std::vector<std::string> kClosers = {"</parameter>\n", "</think>\n\n", "\"", "}", "]"};

// The closer parts still to type, with how much of each the end of `text` has begun.
std::vector<std::pair<std::string_view, size_t>> begun_closers(const std::string& text) {
  std::vector<std::pair<std::string_view, size_t>> out;
  for (const auto& tag : kClosers) {
    for (size_t k = 0; k < tag.size() && k <= text.size(); ++k) {
      if (std::string_view(text).substr(text.size() - k) == std::string_view(tag).substr(0, k)) {
        out.emplace_back(std::string_view(tag).substr(k), k);
      }
    }
  }
  return out;
}

// How far `b` carries a begun closer: the begun length plus one (0: it carries none).
size_t closing_progress(const std::vector<std::pair<std::string_view, size_t>>& begun,
                        std::string_view b) {
  size_t best = 0;
  for (const auto& [rest, k] : begun) {
    if (rest.starts_with(b) || b.starts_with(rest)) best = std::max(best, k + 1);
  }
  return best;
}

// Drives a constraint with random choices among the tokens it allows, often preferring tokens
// that continue closing markup (so free text ends), as a model might. Returns the text as the
// server would see it: the ids detokenized (a character split across tokens and left unfinished
// becomes U+FFFD there).
std::string walk(TokenConstraint& c, uint32_t seed, int* reasoning_tokens, bool* ended) {
  const Demo& d = Demo::get();
  const auto& bytes = *d.m.token_bytes;
  std::mt19937 rng(seed);
  std::vector<uint8_t> allowed;
  std::string text;  // the raw bytes
  std::vector<int32_t> ids;
  auto result = [&] { return d.tok.decode(ids, false); };
  bool in_reasoning = reasoning_tokens != nullptr;
  *ended = false;
  for (int step = 0; step < 3000; ++step) {
    allowed.assign(bytes.size(), 1);
    c.mask(allowed);
    std::vector<int32_t> all, closing;
    size_t best = 0;
    const auto begun = begun_closers(text);
    for (size_t id = 0; id < allowed.size(); ++id) {
      if (!allowed[id]) continue;
      all.push_back(int32_t(id));
      bool stop = std::find(d.stop_ids.begin(), d.stop_ids.end(), int32_t(id)) != d.stop_ids.end();
      size_t p = stop ? 1 : bytes[id].empty() ? 0 : closing_progress(begun, bytes[id]);
      if (p > best) {
        best = p;
        closing.clear();
      }
      if (p > 0 && p == best) closing.push_back(int32_t(id));
    }
    EXPECT_FALSE(all.empty()) << "no token allowed after: " << text;
    if (all.empty()) return result();
    // A closer under way is mostly finished; a new one is begun now and then.
    const auto& pool = !closing.empty() && rng() % 10 < (best > 1 ? 9u : 4u) ? closing : all;
    int32_t id = pool[rng() % pool.size()];
    if (std::find(d.stop_ids.begin(), d.stop_ids.end(), id) != d.stop_ids.end()) {
      *ended = true;
      return result();
    }
    text += bytes[id];
    ids.push_back(id);
    if (in_reasoning) {
      ++*reasoning_tokens;  // up to and including the one that closes </think>
      in_reasoning = text.find("</think>") == std::string::npos;
    }
    if (!c.accept(id)) {
      *ended = true;
      return result();
    }
  }
  return result();
}

ParsedOutput parse_reply(ToolCallFormat format, const std::string& prompt_end,
                         const std::string& text) {
  const Demo& d = Demo::get();
  OutputParserOptions o = choose_output_parser_options(d.tmpl.source(), "qwen3_5", prompt_end,
                                                       nlohmann::json::parse(tools().dump()));
  o.tool_format = format;
  return parse_output(o, text);
}

void check_call(const ToolCall& call, const std::string& text) {
  json args = json::parse(call.arguments, nullptr, false);
  ASSERT_TRUE(args.is_object()) << call.arguments << "\nfrom: " << text;
  if (call.name == "search") {
    EXPECT_TRUE(json_schema_accepts(kParams, false, call.arguments, true))
        << call.arguments << "\nfrom: " << text;
  } else {
    EXPECT_EQ(call.name, "ping");
  }
}

TEST(ToolCallConstraint, RandomWalksAlwaysGiveParsableCalls) {
  const Demo& d = Demo::get();
  for (ToolCallFormat format : {ToolCallFormat::kXml, ToolCallFormat::kJson}) {
    auto g = compile_tool_call_grammar(spec_for(format, tools()));
    for (uint32_t seed = 0; seed < 12; ++seed) {
      auto c = make_tool_call_constraint(g, d.m.token_bytes, d.m.token_order, d.m.token_special,
                                         d.stop_ids);
      bool ended = false;
      std::string text = walk(*c, seed, nullptr, &ended);
      ASSERT_TRUE(ended) << "format " << int(format) << " seed " << seed << ": " << text;
      ParsedOutput out = parse_reply(format, "", text);
      EXPECT_FALSE(out.flags.malformed_tool_call) << text;
      EXPECT_EQ(out.content, "") << text;
      ASSERT_GE(out.tool_calls.size(), 1u) << text;
      for (const auto& call : out.tool_calls) check_call(call, text);
    }
  }
}

TEST(ToolCallConstraint, NamedToolGivesExactlyThatCallThenEnds) {
  const Demo& d = Demo::get();
  auto spec = spec_for(ToolCallFormat::kXml, json::array({tools()[0]}));
  spec.parallel = false;
  auto g = compile_tool_call_grammar(spec);
  for (uint32_t seed = 100; seed < 110; ++seed) {
    auto c = make_tool_call_constraint(g, d.m.token_bytes, d.m.token_order, d.m.token_special,
                                       d.stop_ids);
    bool ended = false;
    std::string text = walk(*c, seed, nullptr, &ended);
    ASSERT_TRUE(ended) << text;
    EXPECT_TRUE(text.ends_with("</tool_call>")) << text;  // accept() ended it, no stop needed
    ParsedOutput out = parse_reply(ToolCallFormat::kXml, "", text);
    ASSERT_EQ(out.tool_calls.size(), 1u) << text;
    EXPECT_EQ(out.tool_calls[0].name, "search");
    check_call(out.tool_calls[0], text);
  }
}

TEST(ToolCallConstraint, ReasoningFirstWithinItsBudget) {
  const Demo& d = Demo::get();
  auto spec = spec_for(ToolCallFormat::kXml, tools());
  spec.reasoning = Reasoning::kOpen;
  spec.reasoning_budget = 6;
  spec.think_end_token = *d.tok.token_to_id("</think>");
  auto g = compile_tool_call_grammar(spec);
  for (uint32_t seed = 200; seed < 206; ++seed) {
    auto c = make_tool_call_constraint(g, d.m.token_bytes, d.m.token_order, d.m.token_special,
                                       d.stop_ids);
    // No end of generation while reasoning.
    std::vector<uint8_t> allowed(d.m.token_bytes->size(), 1);
    c->mask(allowed);
    for (int32_t s : d.stop_ids) EXPECT_FALSE(allowed[s]);
    bool ended = false;
    int reasoning = 0;
    std::string text = walk(*c, seed, &reasoning, &ended);
    ASSERT_TRUE(ended) << text;
    EXPECT_LE(reasoning, 6 + 1) << text;  // the budget, then the forced </think>
    ParsedOutput out = parse_reply(ToolCallFormat::kXml, "<|im_start|>assistant\n<think>\n", text);
    ASSERT_GE(out.tool_calls.size(), 1u) << text;
    for (const auto& call : out.tool_calls) check_call(call, text);
  }
}

}  // namespace
}  // namespace tokenmill::server
