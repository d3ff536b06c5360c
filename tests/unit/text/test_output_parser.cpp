// Output parser: reasoning, content and tool calls from streamed text; the result must not depend
// on how the text was split into chunks.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "test_parser_util.h"
#include "text/output_parser.h"

namespace tokenmill {
namespace {

using namespace testing_parse;

OutputParserOptions opts(bool reasoning, bool starts_in, ToolCallFormat f = ToolCallFormat::kNone,
                         nlohmann::json tools = nullptr) {
  OutputParserOptions o;
  o.reasoning = reasoning;
  o.starts_in_reasoning = starts_in;
  o.tool_format = f;
  o.tools = std::move(tools);
  return o;
}

const nlohmann::json kTools = nlohmann::json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                   "metric": {"type": "boolean"}, "extra": {"type": "object"}}}}},
  {"type": "function", "function": {"name": "run", "parameters": {"type": "object",
    "properties": {"cmd": {"type": "string"}, "timeout": {"type": "number"},
                   "args": {"type": "array"}}}}}
])");

struct Case {
  const char* name;
  OutputParserOptions o;
  std::string text;
  ParsedOutput expected;
};

ToolCall call(int i, const char* name, const char* args) {
  return ToolCall{"call_" + std::to_string(i), name, args};
}

// Canonical replies; expectations follow the format definitions in output_parser.h (the Qwen
// chat templates write exactly these shapes).
std::vector<Case> canonical_cases() {
  std::vector<Case> cs;
  cs.push_back({"think_then_content",
                opts(true, false),
                "<think>\nLet me think.\nStep 2: 3 < 4.\n</think>\n\nThe answer is 42.",
                {"Let me think.\nStep 2: 3 < 4.", "The answer is 42.", {}, {}}});
  cs.push_back({"starts_in_reasoning",
                opts(true, true),
                "Reasoning <here>\n\n</think>\n\nAnswer: <b>yes</b>\n",
                {"Reasoning <here>", "Answer: <b>yes</b>\n", {}, {}}});
  cs.push_back({"repeated_open_in_reasoning",
                opts(true, true),
                "\n<think>\nR <think> r\n</think>\n\nC",
                {"R <think> r", "C", {}, {}}});
  cs.push_back({"thinking_off_stray_close",
                opts(false, false),
                "</think>\n\nHello <think>x</think> world",
                {"", "Hello <think>x world", {}, {}}});
  cs.push_back({"json_call",
                opts(true, false, ToolCallFormat::kJson),
                "<think>\nNeed weather.\n</think>\n\nI'll check.\n<tool_call>\n{\"name\": "
                "\"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>",
                {"Need weather.",
                 "I'll check.",
                 {call(0, "get_weather", R"({"city":"Paris","days":3})")},
                 {}}});
  cs.push_back({"two_json_calls_auto",
                opts(false, false, ToolCallFormat::kAuto),
                "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n"
                "{\"name\": \"b\", \"arguments\": \"{\\\"x\\\": [1, 2]}\"}\n</tool_call>\nDone.",
                {"", "Done.", {call(0, "a", "{}"), call(1, "b", R"({"x":[1,2]})")}, {}}});
  cs.push_back({"xml_calls",
                opts(true, false, ToolCallFormat::kXml, kTools),
                "<think>\nx\n</think>\n\nSure.\n\n<tool_call>\n<function=get_weather>\n"
                "<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n5\n</parameter>\n"
                "<parameter=metric>\nTrue\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
                "<function=run>\n<parameter=cmd>\necho '</param>' <x>\n\nline2\n</parameter>\n"
                "<parameter=timeout>\n2.5\n</parameter>\n</function>\n</tool_call>",
                {"x",
                 "Sure.",
                 {call(0, "get_weather", R"({"city":"New York","days":5,"metric":true})"),
                  call(1, "run", R"({"cmd":"echo '</param>' <x>\n\nline2","timeout":2.5})")},
                 {}}});
  cs.push_back({"xml_auto_no_params",
                opts(false, false, ToolCallFormat::kAuto, kTools),
                "<tool_call>\n<function=run>\n</function>\n</tool_call>",
                {"", "", {call(0, "run", "{}")}, {}}});
  cs.push_back({"truncated_reasoning",
                opts(true, false),
                "Intro <think>\nabc <def",
                {"", "Intro abc <def", {}, {true, false}}});
  cs.push_back({"unclosed_json_call",
                opts(false, false, ToolCallFormat::kJson),
                "Text\n<tool_call>\n{\"name\": \"f\"",
                {"", "Text\n<tool_call>\n{\"name\": \"f\"", {}, {false, true}}});
  cs.push_back({"malformed_json_call",
                opts(false, false, ToolCallFormat::kJson),
                "<tool_call>\nnot json\n</tool_call>\nafter",
                {"", "<tool_call>\nnot json\n</tool_call>\nafter", {}, {false, true}}});
  cs.push_back({"unclosed_xml_call",
                opts(false, false, ToolCallFormat::kXml, kTools),
                "<tool_call>\n<function=get_weather>\n<parameter=days>\n1\n</parameter>\n<param",
                {"",
                 "<tool_call>\n<function=get_weather>\n<parameter=days>\n1\n</parameter>\n<param",
                 {},
                 {false, true}}});
  // Found by fuzz_output_parser: a parameter "name" running into other markup or past 256 bytes
  // is stray text, decided the same way however the text is split.
  cs.push_back({"xml_bad_parameter_names",
                opts(false, false, ToolCallFormat::kAuto, kTools),
                "<tool_call>\n<function=run>\n<parameter=x<y>\n1\n</parameter>\n<parameter=" +
                    std::string(300, 'n') +
                    ">\n2\n</parameter>\n<parameter=cmd>\nok\n"
                    "</parameter>\n</function>\n</tool_call>",
                {"", "", {call(0, "run", R"({"cmd":"ok"})")}, {}}});
  cs.push_back({"tools_off_is_content",
                opts(false, false),
                "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
                {"", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>", {}, {}}});
  cs.push_back(
      {"utf8_and_tag_like_text",
       opts(true, true, ToolCallFormat::kAuto),
       "思考 <thin 🙂\n</think>\n\n答案 </think_ <tool_cal <tool_call>\n{\"name\": \"f\", "
       "\"arguments\": {\"q\": \"ü\"}}\n</tool_call>",
       {"思考 <thin 🙂", "答案 </think_ <tool_cal ", {call(0, "f", R"({"q":"ü"})")}, {}}});
  return cs;
}

TEST(OutputParser, CanonicalRepliesOneShot) {
  for (const auto& c : canonical_cases()) {
    SCOPED_TRACE(c.name);
    const ParseRun r = run_whole(c.o, c.text);
    EXPECT_EQ(r.parsed.reasoning, c.expected.reasoning);
    EXPECT_EQ(r.parsed.content, c.expected.content);
    EXPECT_EQ(r.parsed.tool_calls, c.expected.tool_calls);
    EXPECT_EQ(r.parsed.flags, c.expected.flags);
    EXPECT_EQ(parse_output(c.o, c.text), r.parsed);
  }
}

TEST(OutputParser, EveryTwoWaySplitEqualsOneShot) {
  for (const auto& c : canonical_cases()) {
    SCOPED_TRACE(c.name);
    const ParseRun whole = run_whole(c.o, c.text);
    const std::string_view t = c.text;
    for (size_t i = 0; i <= t.size(); ++i) {
      const ParseRun r = run_chunks(c.o, {t.substr(0, i), t.substr(i)});
      ASSERT_EQ(r.events, whole.events) << "split at " << i << "\n"
                                        << describe(r.events) << "vs\n"
                                        << describe(whole.events);
      ASSERT_EQ(r.flags, whole.flags) << "split at " << i;
    }
  }
}

TEST(OutputParser, CharByCharAndRandomSplitsEqualOneShot) {
  std::mt19937 rng(1234);
  for (const auto& c : canonical_cases()) {
    SCOPED_TRACE(c.name);
    const ParseRun whole = run_whole(c.o, c.text);
    const ParseRun bytes = run_chunks(c.o, split_every(c.text, 1));
    EXPECT_EQ(bytes.events, whole.events) << describe(bytes.events) << "vs\n"
                                          << describe(whole.events);
    EXPECT_EQ(bytes.flags, whole.flags);
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<std::string_view> chunks;
      const std::string_view t = c.text;
      for (size_t i = 0; i < t.size();) {
        const size_t n = std::uniform_int_distribution<size_t>(0, 7)(rng);
        chunks.push_back(t.substr(i, n));
        i += n;
      }
      const ParseRun r = run_chunks(c.o, chunks);
      ASSERT_EQ(r.events, whole.events) << "trial " << trial;
    }
  }
}

TEST(OutputParser, PartialTagIsHeldNotLeaked) {
  auto p = make_output_parser(opts(true, false, ToolCallFormat::kJson));
  auto e1 = p->feed("Hello <thi");
  ASSERT_EQ(e1.size(), 1u);
  EXPECT_EQ(e1[0].type, OutputEventType::kContent);
  EXPECT_EQ(e1[0].text, "Hello ");
  EXPECT_TRUE(p->feed("nk").empty());
  auto e2 = p->feed(">\nidea\n");
  ASSERT_EQ(e2.size(), 1u);
  EXPECT_EQ(e2[0].type, OutputEventType::kReasoning);
  EXPECT_EQ(e2[0].text, "idea");  // the trailing newline waits: "</think>" may follow
  auto e3 = p->feed("</think>\n\n<tool");
  EXPECT_TRUE(e3.empty());
  auto e4 = p->feed("s> ok");  // not a tag after all
  ASSERT_EQ(e4.size(), 1u);
  EXPECT_EQ(e4[0].text, "<tools> ok");
  EXPECT_TRUE(p->finish().empty());
  EXPECT_EQ(p->flags(), OutputFlags{});
}

TEST(OutputParser, XmlStreamsNameFirstThenEachParameter) {
  auto p = make_output_parser(opts(false, false, ToolCallFormat::kXml, kTools));
  OutputAccumulator acc;
  auto e = p->feed("Hi\n<tool_call>\n<function=get_weather>");
  acc.add(e);
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].type, OutputEventType::kContent);
  EXPECT_EQ(e[1].type, OutputEventType::kToolCallBegin);
  EXPECT_EQ(e[1].name, "get_weather");
  EXPECT_EQ(e[1].id, "call_0");
  e = p->feed("\n<parameter=city>\nParis\n</param");
  EXPECT_TRUE(e.empty());  // the value may continue
  e = p->feed("eter>\n<parameter=days>\n");
  acc.add(e);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].type, OutputEventType::kToolCallArguments);
  EXPECT_EQ(e[0].text, R"({"city":"Paris")");
  e = p->feed("7\n</parameter>\n</function>\n</tool_call>");
  acc.add(e);
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0].text, R"(,"days":7)");
  EXPECT_EQ(e[1].text, "}");
  EXPECT_EQ(e[2].type, OutputEventType::kToolCallEnd);
  EXPECT_EQ(e[2].text, R"({"city":"Paris","days":7})");
  acc.add(p->finish());
  const ParsedOutput r = acc.result(p->flags());
  EXPECT_EQ(r.content, "Hi");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"city":"Paris","days":7})");
}

TEST(OutputParser, UnclosedXmlCallKeepsStreamedEventsAndReturnsRawText) {
  const std::string text = "<tool_call>\n<function=run>\n<parameter=cmd>\nls\n</parameter>\n";
  const ParseRun r = run_whole(opts(false, false, ToolCallFormat::kXml, kTools), text);
  ASSERT_EQ(r.events.size(), 4u) << describe(r.events);
  EXPECT_EQ(r.events[0].type, OutputEventType::kToolCallBegin);
  EXPECT_EQ(r.events[1].text, R"({"cmd":"ls")");
  EXPECT_EQ(r.events[2].type, OutputEventType::kToolCallEnd);
  EXPECT_FALSE(r.events[2].complete);
  EXPECT_EQ(r.events[3].type, OutputEventType::kContent);
  EXPECT_EQ(r.events[3].text, text);
  EXPECT_TRUE(r.flags.malformed_tool_call);
  EXPECT_TRUE(r.parsed.tool_calls.empty());
  EXPECT_EQ(r.parsed.content, text);
}

TEST(OutputParser, TruncatedReasoningStreamsAsReasoningButAggregatesAsContent) {
  const ParseRun r = run_whole(opts(true, true), "\nstill thinking\n\n");
  ASSERT_EQ(r.events.size(), 1u);
  EXPECT_EQ(r.events[0].type, OutputEventType::kReasoning);
  EXPECT_EQ(r.events[0].text, "still thinking\n\n");  // nothing is dropped at the end
  EXPECT_TRUE(r.flags.truncated_reasoning);
  EXPECT_EQ(r.parsed.reasoning, "");
  EXPECT_EQ(r.parsed.content, "still thinking\n\n");
}

TEST(OutputParser, ReasoningOffTreatsThinkOpenAsContent) {
  const ParsedOutput r = parse_output(opts(false, false), "<think>\nhm\n</think>\n\nok");
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "<think>\nhm\nok");
}

TEST(OutputParser, OnlyOneReasoningBlock) {
  const ParsedOutput r = parse_output(opts(true, false), "<think>a</think>b<think>c</think>d");
  EXPECT_EQ(r.reasoning, "a");
  EXPECT_EQ(r.content, "b<think>cd");
}

TEST(OutputParser, ToolCallsInsideReasoningAreReasoning) {
  const ParsedOutput r = parse_output(opts(true, true, ToolCallFormat::kJson),
                                      "<tool_call>{\"name\":\"f\"}</tool_call></think>x");
  EXPECT_EQ(r.reasoning, "<tool_call>{\"name\":\"f\"}</tool_call>");
  EXPECT_EQ(r.content, "x");
  EXPECT_TRUE(r.tool_calls.empty());
}

TEST(OutputParser, ToolCallIdsUseThePrefix) {
  OutputParserOptions o = opts(false, false, ToolCallFormat::kJson);
  o.tool_call_id_prefix = "call_req7_";
  const ParsedOutput r = parse_output(
      o, "<tool_call>{\"name\":\"a\"}</tool_call><tool_call>{\"name\":\"b\"}</tool_call>");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].id, "call_req7_0");
  EXPECT_EQ(r.tool_calls[1].id, "call_req7_1");
  EXPECT_EQ(r.tool_calls[1].arguments, "{}");
}

TEST(OutputParser, FeedAfterFinishIsIgnored) {
  auto p = make_output_parser(opts(false, false));
  EXPECT_EQ(p->feed("a").size(), 1u);
  EXPECT_TRUE(p->finish().empty());
  EXPECT_TRUE(p->feed("b").empty());
  EXPECT_TRUE(p->finish().empty());
}

TEST(OutputParser, LongContentIsStreamedAndBufferStaysSmall) {
  auto p = make_output_parser(opts(true, false, ToolCallFormat::kAuto));
  std::string all;
  for (int i = 0; i < 20000; ++i) {
    for (const auto& e : p->feed("word <t ")) all += e.text;
  }
  for (const auto& e : p->finish()) all += e.text;
  std::string expect;
  for (int i = 0; i < 20000; ++i) expect += "word <t ";
  EXPECT_EQ(all, expect);
}

TEST(ChooseOutputParserOptions, FromTemplateAndPrompt) {
  const std::string qwen3 = "{{- '<tool_call>\\n{\"name\": ' }}...<think>\\n";
  auto o = choose_output_parser_options(qwen3, "qwen3", "<|im_start|>assistant\n");
  EXPECT_TRUE(o.reasoning);
  EXPECT_FALSE(o.starts_in_reasoning);
  EXPECT_EQ(o.tool_format, ToolCallFormat::kJson);
  o = choose_output_parser_options(qwen3, "qwen3",
                                   "<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_FALSE(o.reasoning);
  const std::string coder = "<tool_call>\\n<function=' + name + '>\\n<parameter=' <think>";
  o = choose_output_parser_options(coder, "qwen3_5", "<|im_start|>assistant\n<think>\n");
  EXPECT_TRUE(o.reasoning);
  EXPECT_TRUE(o.starts_in_reasoning);
  EXPECT_EQ(o.tool_format, ToolCallFormat::kXml);
  o = choose_output_parser_options("{{ messages }}", "llama", "");
  EXPECT_FALSE(o.reasoning);
  EXPECT_EQ(o.tool_format, ToolCallFormat::kNone);
  o = choose_output_parser_options("{{ messages }}", "qwen3_5_moe", "", kTools);
  EXPECT_EQ(o.tool_format, ToolCallFormat::kAuto);
  EXPECT_EQ(o.tools, kTools);
}

}  // namespace
}  // namespace tokenmill
