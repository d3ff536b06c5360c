// Tool-call bodies: the JSON and XML forms, schema typing of XML parameter values, malformed input.
#include <gtest/gtest.h>

#include <string>

#include "test_parser_util.h"
#include "text/output_parser.h"
#include "text/tool_call_parser.h"

namespace tokenmill {
namespace {

using namespace testing_parse;
using json = nlohmann::json;

std::string typed(std::string_view text, const json& schema) {
  return dump_json(type_parameter_value(text, &schema));
}

TEST(ToolCallTyping, ScalarTypes) {
  EXPECT_EQ(typed("42", json{{"type", "integer"}}), "42");
  EXPECT_EQ(typed(" -7 \n", json{{"type", "integer"}}), "-7");
  EXPECT_EQ(typed("4.5", json{{"type", "integer"}}), "\"4.5\"");  // not an integer: kept as text
  EXPECT_EQ(typed("abc", json{{"type", "integer"}}), "\"abc\"");
  EXPECT_EQ(typed("4.5", json{{"type", "number"}}), "4.5");
  EXPECT_EQ(typed("1e3", json{{"type", "number"}}), "1000.0");
  EXPECT_EQ(typed("12", json{{"type", "number"}}), "12");
  EXPECT_EQ(typed("true", json{{"type", "boolean"}}), "true");
  EXPECT_EQ(typed("False", json{{"type", "boolean"}}), "false");
  EXPECT_EQ(typed("yes", json{{"type", "boolean"}}), "\"yes\"");
  EXPECT_EQ(typed("null", json{{"type", "null"}}), "null");
  EXPECT_EQ(typed("null", json{{"type", "string"}}), "\"null\"");
}

TEST(ToolCallTyping, StringsStayRaw) {
  EXPECT_EQ(typed("  spaced  ", json{{"type", "string"}}), "\"  spaced  \"");
  EXPECT_EQ(typed("42", json{{"type", "string"}}), "\"42\"");
  EXPECT_EQ(typed("{\"a\": 1}", json{{"type", "string"}}), "\"{\\\"a\\\": 1}\"");
  EXPECT_EQ(typed("line1\nline2", json::object()), "\"line1\\nline2\"");  // no type: string
  EXPECT_EQ(dump_json(type_parameter_value("5", nullptr)), "\"5\"");      // unknown parameter
}

TEST(ToolCallTyping, ObjectsAndArrays) {
  EXPECT_EQ(typed("{\"a\": [1, {\"b\": null}]}", json{{"type", "object"}}),
            R"({"a":[1,{"b":null}]})");
  EXPECT_EQ(typed("{\"z\": 1, \"a\": 2}", json{{"type", "object"}}), R"({"z":1,"a":2})");
  EXPECT_EQ(typed("[1, \"x\"]", json{{"type", "array"}}), R"([1,"x"])");
  EXPECT_EQ(typed("[1, 2]", json{{"type", "object"}}), "\"[1, 2]\"");
  EXPECT_EQ(typed("{broken", json{{"type", "object"}}), "\"{broken\"");
  EXPECT_EQ(typed("[1]", json{{"items", json{{"type", "integer"}}}}), "[1]");
  EXPECT_EQ(typed("{}", json{{"properties", json::object()}}), "{}");
}

TEST(ToolCallTyping, UnionsEnumsAndLooseNames) {
  const json opt_int = json::parse(R"({"type": ["integer", "null"]})");
  EXPECT_EQ(typed("3", opt_int), "3");
  EXPECT_EQ(typed("null", opt_int), "null");
  const json any_of = json::parse(R"({"anyOf": [{"type": "string"}, {"type": "number"}]})");
  EXPECT_EQ(typed("2.0", any_of), "2.0");
  EXPECT_EQ(typed("two", any_of), "\"two\"");
  EXPECT_EQ(typed("1", json::parse(R"({"enum": [1, 2, 3]})")), "1");
  EXPECT_EQ(typed("1", json::parse(R"({"enum": ["1", "2"]})")), "\"1\"");
  EXPECT_EQ(typed("7", json{{"type", "int"}}), "7");
  EXPECT_EQ(typed("0.5", json{{"type", "float"}}), "0.5");
  EXPECT_EQ(typed("true", json{{"type", "bool"}}), "true");
  EXPECT_EQ(typed("{\"k\":1}", json{{"type", "dict"}}), R"({"k":1})");
}

TEST(ToolSchemas, OpenAiAndAnthropicForms) {
  const ToolSchemas s(json::parse(R"([
    {"type": "function", "function": {"name": "a", "parameters": {"type": "object",
      "properties": {"x": {"type": "integer"}}}}},
    {"name": "b", "input_schema": {"type": "object", "properties": {"y": {"type": "boolean"}}}},
    {"name": "c"}, 17, {"function": {"name": 5}}
  ])"));
  ASSERT_NE(s.parameter("a", "x"), nullptr);
  EXPECT_EQ((*s.parameter("a", "x"))["type"], "integer");
  ASSERT_NE(s.parameter("b", "y"), nullptr);
  EXPECT_EQ(s.parameter("a", "y"), nullptr);
  EXPECT_EQ(s.parameter("c", "x"), nullptr);
  EXPECT_EQ(s.parameter("zz", "x"), nullptr);
  EXPECT_EQ(ToolSchemas(json("not tools")).parameter("a", "x"), nullptr);
}

OutputParserOptions tool_opts(ToolCallFormat f, json tools = nullptr) {
  OutputParserOptions o;
  o.tool_format = f;
  o.tools = std::move(tools);
  return o;
}

const json kSchema = json::parse(R"([{"type": "function", "function": {"name": "f",
  "parameters": {"type": "object", "properties": {"n": {"type": "integer"},
  "s": {"type": "string"}, "o": {"type": "object"}, "l": {"type": "array"}}}}}])");

TEST(XmlToolCalls, ParameterNewlinesAndTyping) {
  const ParsedOutput r =
      parse_output(tool_opts(ToolCallFormat::kXml, kSchema),
                   "<tool_call>\n<function=f>\n<parameter=s>\n\n two lines \n\n</parameter>\n"
                   "<parameter=n>\n 12 \n</parameter>\n<parameter=o>\n{\"a\": {\"b\": [true]}}\n"
                   "</parameter>\n<parameter=l>\n[\"x\"]\n</parameter>\n<parameter=u>\n9\n"
                   "</parameter>\n</function>\n</tool_call>");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "f");
  // One newline is stripped on each side of a string; undeclared parameters stay strings.
  EXPECT_EQ(r.tool_calls[0].arguments,
            R"({"s":"\n two lines \n","n":12,"o":{"a":{"b":[true]}},"l":["x"],"u":"9"})");
  EXPECT_EQ(r.flags, OutputFlags{});
  EXPECT_TRUE(json::accept(r.tool_calls[0].arguments));
}

TEST(XmlToolCalls, MissingParameterCloseEndsAtNextTag) {
  const ParsedOutput r = parse_output(tool_opts(ToolCallFormat::kXml, kSchema),
                                      "<tool_call>\n<function=f>\n<parameter=n>\n1\n"
                                      "<parameter=s>\nx\n</function>\n</tool_call>");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"n":1,"s":"x"})");
}

TEST(XmlToolCalls, MissingFunctionCloseAndSeveralFunctionsPerCall) {
  ParsedOutput r = parse_output(tool_opts(ToolCallFormat::kXml),
                                "<tool_call><function=a><parameter=p>v</parameter></tool_call>");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"p":"v"})");
  r = parse_output(tool_opts(ToolCallFormat::kXml),
                   "<tool_call>\n<function=a>\n</function>\n<function=b>\n</function>\n"
                   "</tool_call>");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[1].name, "b");
  EXPECT_EQ(r.tool_calls[1].id, "call_1");
}

TEST(XmlToolCalls, MalformedBodiesBecomeContent) {
  for (const char* text :
       {"<tool_call>\n{\"name\": \"f\"}\n</tool_call>",  // JSON in XML mode
        "<tool_call>\n<function=>\n</function>\n</tool_call>",
        "<tool_call>\n<function=a\nb>\n</tool_call>", "<tool_call></tool_call>"}) {
    SCOPED_TRACE(text);
    const ParsedOutput r = parse_output(tool_opts(ToolCallFormat::kXml), text);
    EXPECT_TRUE(r.tool_calls.empty());
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.flags.malformed_tool_call);
  }
}

TEST(JsonToolCalls, ValidForms) {
  ParsedOutput r = parse_output(
      tool_opts(ToolCallFormat::kJson),
      "<tool_call>\n{\"name\": \"f\", \"parameters\": {\"b\": 1, \"a\": \"é\"}}\n</tool_call>");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"b":1,"a":"é"})");  // key order kept
  r = parse_output(
      tool_opts(ToolCallFormat::kJson),
      "<tool_call>[{\"name\": \"x\"}, {\"name\": \"y\", \"arguments\": {}}]</tool_call>");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].name, "x");
  EXPECT_EQ(r.tool_calls[1].name, "y");
}

TEST(JsonToolCalls, MalformedBodiesBecomeContent) {
  for (const char* text :
       {"<tool_call>\n{\"arguments\": {}}\n</tool_call>",  // no name
        "<tool_call>\n{\"name\": 3}\n</tool_call>",        // name not a string
        "<tool_call>\n{\"name\": \"f\", \"arguments\": [1]}\n</tool_call>",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{oops\"}\n</tool_call>",
        "<tool_call>\n[{\"name\": \"f\"}, 5]\n</tool_call>", "<tool_call>\n{\"name\": \"f\"\n",
        "<tool_call>\n{\"name\": \"f\"} trailing\n</tool_call>"}) {
    SCOPED_TRACE(text);
    const ParsedOutput r = parse_output(tool_opts(ToolCallFormat::kJson), text);
    EXPECT_TRUE(r.tool_calls.empty());
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.flags.malformed_tool_call);
  }
}

TEST(JsonToolCalls, MalformedCallDoesNotStopLaterCalls) {
  const ParsedOutput r =
      parse_output(tool_opts(ToolCallFormat::kAuto),
                   "a<tool_call>bad</tool_call>b<tool_call>{\"name\": \"ok\"}</tool_call>c");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "ok");
  EXPECT_EQ(r.tool_calls[0].id, "call_0");
  EXPECT_EQ(r.content, "a<tool_call>bad</tool_call>bc");
  EXPECT_TRUE(r.flags.malformed_tool_call);
}

TEST(ToolCalls, InvalidUtf8NeverThrows) {
  const std::string text =
      "<tool_call>\n<function=f\xff>\n<parameter=s\xc3>\n\xe2\x82\n"
      "</parameter>\n</function>\n</tool_call>";
  ParsedOutput r;
  ASSERT_NO_THROW(r = parse_output(tool_opts(ToolCallFormat::kXml, kSchema), text));
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_TRUE(json::accept(r.tool_calls[0].arguments));
  ASSERT_NO_THROW(parse_output(tool_opts(ToolCallFormat::kJson),
                               "<tool_call>{\"name\":\"\xff\"}"
                               "</tool_call>"));
}

}  // namespace
}  // namespace tokenmill
