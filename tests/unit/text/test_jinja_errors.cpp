// Error messages ("<source>:<line>: <message>"), resource limits, and the ChatTemplate API
// (loading from config values and directories, inputs, normalize_messages).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "text/chat_template.h"
#include "text/jinja.h"
#include "util/error.h"

namespace tokenmill {
namespace {

using nlohmann::ordered_json;

std::string render(const std::string& src, const ordered_json& ctx = ordered_json::object(),
                   const jinja::RenderOptions& opts = {}) {
  return jinja::Template::parse(src, "t.jinja").render(ctx, opts);
}

// The message of the tokenmill::Error that rendering `src` throws ("" if none).
std::string error_of(const std::string& src, const ordered_json& ctx = ordered_json::object(),
                     const jinja::RenderOptions& opts = {}) {
  try {
    render(src, ctx, opts);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(JinjaErrors, SyntaxErrorsNameSourceAndLine) {
  EXPECT_EQ(error_of("a\nb\n{{ 1 + }}"),
            "t.jinja:3: Expected an expression, got 'end of print statement'");
  EXPECT_EQ(error_of("{% if x %}\n\n{% endfor %}"), "t.jinja:3: Encountered unknown tag 'endfor'.");
  EXPECT_EQ(error_of("x\n{{ y | nosuch }}"), "t.jinja:2: No filter named 'nosuch'.");
  EXPECT_EQ(error_of("{{ y is nosuch }}"), "t.jinja:1: No test named 'nosuch'.");
  EXPECT_EQ(error_of("\n\n{# open"), "t.jinja:3: Missing end of comment tag");
  EXPECT_EQ(error_of("{% for x in y %}\n{% break %}{% endfor %}{% continue %}"),
            "t.jinja:2: 'continue' outside loop");
  std::string unclosed = error_of("{% for x in y %}\nbody");
  EXPECT_EQ(unclosed.rfind("t.jinja:2: Unexpected end of template.", 0), 0u) << unclosed;
  EXPECT_NE(unclosed.find("'endfor'"), std::string::npos) << unclosed;
}

TEST(JinjaErrors, RuntimeErrorsNameTheLineThatFailed) {
  EXPECT_EQ(error_of("line1\n{% for m in ms %}\n  {{ m.content + 1 }}\n{% endfor %}",
                     {{"ms", {{{"content", "x"}}}}}),
            "t.jinja:3: can only concatenate str (not \"int\") to str");
  EXPECT_EQ(error_of("{{ 'a' }}\n\n{{ raise_exception('Roles must alternate') }}"),
            "t.jinja:3: Roles must alternate");
  EXPECT_EQ(error_of("{% macro f() %}\n{{ missing.x }}\n{% endmacro %}\n\n{{ f() }}"),
            "t.jinja:2: 'missing' is undefined");
  EXPECT_EQ(error_of("{{ messages[0].content.startswith('x') }}",
                     {{"messages", {{{"content", ordered_json::array()}}}}}),
            "t.jinja:1: 'list object' has no attribute 'startswith'");
  EXPECT_EQ(error_of("{% set xs = [] %}\n{{ xs.append(1) }}"),
            "t.jinja:2: access to attribute 'append' of 'list' object is unsafe.");
}

TEST(JinjaLimits, StepBudgetStopsRunawayLoops) {
  jinja::RenderOptions opts;
  opts.limits.max_steps = 10000;
  std::string e = error_of(
      "{% for a in range(1000) %}{% for b in range(1000) %}{% endfor %}{% endfor %}", {}, opts);
  EXPECT_NE(e.find("steps"), std::string::npos) << e;
}

TEST(JinjaLimits, OutputAndStringSizeAreCapped) {
  jinja::RenderOptions opts;
  opts.limits.max_output = 1000;
  EXPECT_NE(error_of("{{ 'x' * 5000 }}", {}, opts).find("exceed 1000 bytes"), std::string::npos);
  EXPECT_NE(error_of("{% for i in range(100) %}0123456789abc{% endfor %}", {}, opts)
                .find("exceed 1000 bytes"),
            std::string::npos);
  EXPECT_EQ(render("{% for i in range(10) %}0123456789{% endfor %}", {}, opts).size(), 100u);
}

TEST(JinjaLimits, RecursionAndNestingAreBounded) {
  std::string e = error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_NE(e.find("recursion depth"), std::string::npos) << e;
  std::string deep = std::string(500, '(') + "1" + std::string(500, ')');
  EXPECT_NE(error_of("{{ " + deep + " }}").find("nesting too deep"), std::string::npos);
  std::string blocks;
  for (int i = 0; i < 300; ++i) blocks += "{% if true %}";
  EXPECT_NE(error_of(blocks).find("nesting too deep"), std::string::npos);
  e = error_of(
      "{% set ns = namespace(x=[]) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}{% endfor "
      "%}");
  EXPECT_NE(e.find("nested more than"), std::string::npos) << e;
  EXPECT_NE(error_of("{% set ns = namespace() %}{% set ns.me = [ns] %}").find("namespace"),
            std::string::npos);
}

TEST(JinjaLimits, IntegerOverflowRaisesInsteadOfWrapping) {
  EXPECT_NE(error_of("{{ 9223372036854775807 + 1 }}").find("integer overflow"), std::string::npos);
  EXPECT_NE(error_of("{{ 2 ** 64 }}").find("integer overflow"), std::string::npos);
  EXPECT_EQ(render("{{ 2 ** 62 }}"), "4611686018427387904");
}

TEST(JinjaApi, ContextMustBeAnObject) {
  auto t = jinja::Template::parse("x", "t.jinja");
  EXPECT_THROW(t.render(ordered_json::array()), Error);
  EXPECT_EQ(t.render(ordered_json()), "x");
}

// ---- ChatTemplate ----------------------------------------------------------------------------

TEST(ChatTemplate, PassesVariablesAsTransformersDoes) {
  auto t = ChatTemplate::from_string(
      "{{ messages | length }}|{{ tools is none }}|{{ documents is none }}|"
      "{{ add_generation_prompt }}|{{ bos_token is defined }}|{{ eos_token }}|{{ enable_thinking "
      "}}|"
      "{{ strftime_now('%Y-%m-%d') }}",
      "inline");
  ChatTemplateInputs in;
  in.messages = ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
  in.add_generation_prompt = false;
  in.eos_token = "</s>";
  in.extra = {{"enable_thinking", false}};
  in.now_unix = 0;
  EXPECT_EQ(t.render(in), "1|True|True|False|False|</s>|False|1970-01-01");
  in.extra = {{"messages", 1}};
  EXPECT_THROW(t.render(in), Error);
}

TEST(ChatTemplate, FromConfigValuePicksNamedTemplates) {
  nlohmann::json list = nlohmann::json::parse(
      R"([{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}])");
  ChatTemplateInputs in;
  EXPECT_EQ(ChatTemplate::from_config_value(list, "cfg").render(in), "D");
  EXPECT_EQ(ChatTemplate::from_config_value(list, "cfg", "tool_use").render(in), "T");
  try {
    ChatTemplate::from_config_value(list, "cfg", "rag");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("available: default, tool_use"), std::string::npos);
  }
  EXPECT_THROW(ChatTemplate::from_config_value(nlohmann::json(), "cfg"), Error);
  EXPECT_THROW(ChatTemplate::from_config_value(nlohmann::json(5), "cfg"), Error);
  EXPECT_EQ(ChatTemplate::from_config_value(nlohmann::json("S"), "cfg").render(in), "S");
}

TEST(ChatTemplate, FromDirPrefersJinjaFileAndNamesMissingFiles) {
  namespace fs = std::filesystem;
  fs::path dir =
      fs::temp_directory_path() / ("tm_chat_template_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  try {
    ChatTemplate::from_dir(dir.string());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("chat_template.jinja"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json"), std::string::npos) << e.what();
  }
  std::ofstream(dir / "tokenizer_config.json") << R"({"chat_template": "from-config {{ 1 }}"})";
  ChatTemplateInputs in;
  EXPECT_EQ(ChatTemplate::from_dir(dir.string()).render(in), "from-config 1");
  std::ofstream(dir / "chat_template.jinja") << "from-file\n{{ 2 }}\n";
  auto t = ChatTemplate::from_dir(dir.string());
  EXPECT_EQ(t.render(in), "from-file\n2");
  EXPECT_NE(t.source_name().find("chat_template.jinja"), std::string::npos);
  std::ofstream(dir / "chat_template.jinja") << "{{ oops(";
  try {
    ChatTemplate::from_dir(dir.string());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("chat_template.jinja:1: "), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(ChatTemplate, NormalizeMessagesFlattensTextPartsAndParsesArguments) {
  ordered_json msgs = ordered_json::parse(R"([
    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}]},
    {"role": "user", "content": []},
    {"role": "assistant", "content": null, "tool_calls": [
      {"type": "function", "function": {"name": "f", "arguments": "{\"x\": 1, \"y\": [2]}"}},
      {"type": "function", "function": {"name": "g", "arguments": "not json"}},
      {"type": "function", "function": {"name": "h", "arguments": {"z": true}}}]}
  ])");
  ordered_json out = normalize_messages(msgs);
  EXPECT_EQ(out[0]["content"], "ab");
  EXPECT_TRUE(out[1]["content"].is_array());
  EXPECT_EQ(out[2]["content"], "");
  EXPECT_TRUE(out[3]["content"].is_null());
  EXPECT_EQ(out[3]["tool_calls"][0]["function"]["arguments"],
            ordered_json::parse(R"({"x": 1, "y": [2]})"));
  EXPECT_EQ(out[3]["tool_calls"][1]["function"]["arguments"], "not json");
  EXPECT_EQ(out[3]["tool_calls"][2]["function"]["arguments"]["z"], true);
  EXPECT_THROW(normalize_messages(ordered_json::object()), Error);
  EXPECT_THROW(normalize_messages(ordered_json::parse("[1]")), Error);
}

// normalize_messages() output renders exactly like messages written in the normalized form.
TEST(ChatTemplate, NormalizedMessagesRenderLikeTheirPlainForm) {
  std::ifstream f(std::string(TM_SOURCE_DIR) + "/tests/fixtures/templates/qwen35.jinja");
  ASSERT_TRUE(f.good());
  std::string src((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto t = ChatTemplate::from_string(src, "qwen35.jinja");
  ChatTemplateInputs raw, plain;
  raw.messages = normalize_messages(ordered_json::parse(R"([
    {"role": "user", "content": [{"type": "text", "text": "Wea"}, {"type": "text", "text": "ther?"}]},
    {"role": "assistant", "content": "", "tool_calls": [
      {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"days\": 2}"}}]},
    {"role": "tool", "content": "cold"}])"));
  plain.messages = ordered_json::parse(R"([
    {"role": "user", "content": "Weather?"},
    {"role": "assistant", "content": "", "tool_calls": [
      {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}}]},
    {"role": "tool", "content": "cold"}])");
  raw.extra = plain.extra = {{"enable_thinking", false}};
  std::string out = t.render(raw);
  EXPECT_EQ(out, t.render(plain));
  EXPECT_NE(out.find("<parameter=city>\nOslo\n</parameter>"), std::string::npos) << out;
}

}  // namespace
}  // namespace tokenmill
