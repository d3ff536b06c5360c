#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/anthropic_request.h"
#include "server/api_error.h"
#include "server/openai_request.h"
#include "server/request_json.h"

namespace tokenmill::server {
namespace {

using json = nlohmann::ordered_json;
using ::testing::HasSubstr;

struct Bad {
  const char* api;  // "chat", "completion", "messages"
  const char* body;
  const char* param;    // expected param ("" = none)
  const char* message;  // substring of the message
};

// Runs the whole path the server runs: body text -> JSON -> plan. Returns the ApiError.
std::optional<ApiError> run(const std::string& api, const std::string& body) {
  try {
    json j = parse_body(body);
    RequestLimits limits;
    if (api == "chat") parse_openai_chat(j, limits);
    if (api == "completion") parse_openai_completion(j, limits);
    if (api == "messages") parse_anthropic_messages(j, limits);
    if (api == "count") parse_anthropic_messages(j, limits, true);
  } catch (const ApiError& e) {
    return e;
  }
  return std::nullopt;
}

class BadInput : public ::testing::TestWithParam<Bad> {};

TEST_P(BadInput, Is400WithFieldAndReason) {
  const Bad& b = GetParam();
  auto e = run(b.api, b.body);
  ASSERT_TRUE(e.has_value()) << "accepted: " << b.body;
  EXPECT_EQ(e->status(), 400);
  EXPECT_EQ(e->param(), b.param) << e->what();
  EXPECT_THAT(std::string(e->what()), HasSubstr(b.message));
  // Both error shapes carry the message.
  json oa = json::parse(error_body(ApiKind::kOpenAI, *e));
  EXPECT_EQ(oa["error"]["message"], e->what());
  EXPECT_EQ(oa["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(oa["error"].contains("param"));
  EXPECT_TRUE(oa["error"].contains("code"));
  json an = json::parse(error_body(ApiKind::kAnthropic, *e));
  EXPECT_EQ(an["type"], "error");
  EXPECT_EQ(an["error"]["type"], "invalid_request_error");
  EXPECT_EQ(an["error"]["message"], e->what());
}

INSTANTIATE_TEST_SUITE_P(
    Catalogue, BadInput,
    ::testing::Values(
        Bad{"chat", "", "", "body is empty"}, Bad{"chat", "{\"messages\": [", "", "not valid JSON"},
        // A number past a double's range (nlohmann's out_of_range, not a parse_error: it was a
        // 500 before).
        Bad{"chat", R"({"messages": [], "temperature": 1e999})", "", "number overflow"},
        Bad{"messages", R"({"max_tokens": 777777777e777, "messages": []})", "", "not valid JSON"},
        Bad{"chat", "[1, 2]", "", "must be a JSON object"},
        Bad{"chat", "{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}", "",
            "not valid UTF-8"},
        Bad{"chat", R"({"model": "m"})", "messages", "is missing"},
        Bad{"chat", R"({"messages": []})", "messages", "is empty"},
        Bad{"chat", R"({"messages": "hi"})", "messages", "must be an array"},
        Bad{"chat", R"({"messages": [5]})", "messages[0]", "must be an object"},
        Bad{"chat", R"({"messages": [{"content": "x"}]})", "messages[0].role", "is missing"},
        Bad{"chat", R"({"messages": [{"role": "robot", "content": "x"}]})", "messages[0].role",
            "unknown role 'robot'"},
        Bad{"chat", R"({"messages": [{"role": "user"}]})", "messages[0].content", "is missing"},
        Bad{"chat", R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content",
            "must be a string or an array"},
        Bad{"chat", R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
            "messages[0].content[0].type", "not supported"},
        Bad{"chat", R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})",
            "messages[0].content[0].text", "is missing"},
        Bad{"chat",
            R"({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{bad"}}]}]})",
            "messages[0].tool_calls[0].function.arguments", "JSON object"},
        Bad{"chat", R"({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"})",
            "temperature", "must be a number"},
        Bad{"chat", R"({"messages": [{"role": "user", "content": "x"}], "temperature": 3})",
            "temperature", "at most 2"},
        Bad{"chat", R"({"messages": [{"role": "user", "content": "x"}], "top_p": 0})", "top_p",
            "above 0"},
        Bad{"chat", R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})",
            "max_tokens", "between 1"},
        Bad{"chat", R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5})",
            "max_tokens", "must be an integer"},
        Bad{"chat", R"({"messages": [{"role": "user", "content": "x"}], "n": 0})", "n",
            "between 1"},
        Bad{"chat", R"({"messages": [{"role": "user", "content": "x"}], "n": 1000})", "n",
            "between 1 and 16"},
        Bad{"chat", R"({"messages": [{"role": "user", "content": "x"}], "stop": [1]})", "stop[0]",
            "must be a string"},
        Bad{"chat", R"({"messages": [{"role": "user", "content": "x"}], "stop": [""]})", "stop[0]",
            "must not be empty"},
        Bad{"chat", R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3})",
            "top_logprobs", "requires logprobs"},
        Bad{"chat",
            R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 50})",
            "top_logprobs", "between 0 and 20"},
        Bad{"chat",
            R"({"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": true}})",
            "stream_options", "only allowed when stream"},
        Bad{"chat",
            R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})",
            "tools[0].function", "is missing"},
        Bad{"chat",
            R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "a b"}}]})",
            "tools[0].function.name", "may contain only"},
        Bad{"chat",
            R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})",
            "tool_choice", "needs tools"},
        Bad{"chat",
            R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}})",
            "tool_choice.function.name", "'g' is not one of the tools"},
        Bad{"chat",
            R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"})",
            "tool_choice", "must be 'none'"},
        Bad{"chat",
            R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}})",
            "response_format.type", "must be 'text'"},
        Bad{"chat",
            R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"enable_thinking": "yes"}})",
            "chat_template_kwargs.enable_thinking", "true or false"},
        Bad{"chat",
            R"({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "max"})",
            "reasoning_effort", "must be none"},
        Bad{"chat", R"({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": 1}})",
            "logit_bias", "not supported"},
        Bad{"completion", R"({"model": "m"})", "prompt", "is missing"},
        Bad{"completion", R"({"prompt": 5})", "prompt", "must be a string"},
        Bad{"completion", R"({"prompt": []})", "prompt", "is empty"},
        Bad{"completion", R"({"prompt": [1, -2]})", "prompt[1]", "token id"},
        Bad{"completion", R"({"prompt": ["a", [1]]})", "prompt[1]", "mixes text"},
        Bad{"completion", R"({"prompt": "a", "max_tokens": -1})", "max_tokens", "between 0"},
        Bad{"completion", R"({"prompt": "a", "logprobs": 21})", "logprobs", "between 0 and 20"},
        Bad{"completion", R"({"prompt": "a", "suffix": "b"})", "suffix", "not supported"},
        Bad{"messages", R"({"messages": [{"role": "user", "content": "x"}]})", "max_tokens",
            "is required"},
        Bad{"messages", R"({"max_tokens": 5, "messages": []})", "messages", "is empty"},
        Bad{"messages", R"({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})",
            "messages[0].role", "top-level system"},
        Bad{"messages",
            R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]})",
            "messages[0].content[0].type", "not supported"},
        Bad{"messages",
            R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]})",
            "messages[0].content[0].tool_use_id", "is missing"},
        Bad{"messages",
            R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f"}]}]})",
            "messages[0].content[0].type", "belong to assistant"},
        Bad{"messages",
            R"({"max_tokens": 5, "temperature": 1.5, "messages": [{"role": "user", "content": "x"}]})",
            "temperature", "at most 1"},
        Bad{"messages",
            R"({"max_tokens": 5, "system": 5, "messages": [{"role": "user", "content": "x"}]})",
            "system", "must be a string or an array"},
        Bad{"messages",
            R"({"max_tokens": 5, "thinking": {"type": "enabled"}, "messages": [{"role": "user", "content": "x"}]})",
            "thinking.budget_tokens", "is required"},
        Bad{"messages",
            R"({"max_tokens": 5, "thinking": {"type": "enabled", "budget_tokens": 10}, "messages": [{"role": "user", "content": "x"}]})",
            "thinking.budget_tokens", "less than max_tokens"},
        Bad{"messages",
            R"({"max_tokens": 5, "tools": [{"name": "f"}], "messages": [{"role": "user", "content": "x"}]})",
            "tools[0].input_schema", "is missing"},
        Bad{"messages",
            R"({"max_tokens": 5, "tool_choice": {"type": "any"}, "messages": [{"role": "user", "content": "x"}]})",
            "tool_choice", "needs tools"},
        Bad{"messages",
            R"({"max_tokens": 5, "stop_sequences": "x", "messages": [{"role": "user", "content": "x"}], "stop_sequences": 5})",
            "stop_sequences", "must be a string or an array"},
        Bad{"count", R"({"messages": 5})", "messages", "must be an array"}));

TEST(OpenAIChat, ConvertsMessagesAndOptions) {
  json body = json::parse(R"({
    "model": "demo",
    "messages": [
      {"role": "developer", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null, "reasoning_content": "hmm",
       "tool_calls": [{"id": "c1", "type": "function",
                       "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "42"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "tool_choice": {"type": "function", "function": {"name": "f"}},
    "temperature": 0, "top_k": -1, "seed": 7, "stop": "END", "n": 2,
    "max_tokens": 10, "max_completion_tokens": 20, "logprobs": true, "top_logprobs": 3,
    "stream": true, "stream_options": {"include_usage": true},
    "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
    "chat_template_kwargs": {"enable_thinking": false}, "reasoning_effort": "low"
  })");
  GenerationPlan p = parse_openai_chat(body, RequestLimits{});
  EXPECT_EQ(p.model, "demo");
  ASSERT_EQ(p.messages.size(), 4u);
  EXPECT_EQ(p.messages[0]["role"], "system");
  EXPECT_EQ(p.messages[1]["content"], "ab");
  EXPECT_EQ(p.messages[2]["content"], "");
  EXPECT_EQ(p.messages[2]["reasoning_content"], "hmm");
  EXPECT_EQ(p.messages[2]["tool_calls"][0]["function"]["arguments"], json({{"x", 1}}));
  EXPECT_EQ(p.messages[3]["tool_call_id"], "c1");
  EXPECT_EQ(p.tool_choice, "function");
  EXPECT_EQ(p.tool_choice_name, "f");
  EXPECT_EQ(*p.temperature, 0.0f);
  EXPECT_EQ(*p.top_k, 0);
  EXPECT_EQ(*p.seed, 7u);
  EXPECT_EQ(p.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(p.n, 2);
  EXPECT_EQ(*p.max_tokens, 20);
  EXPECT_EQ(p.logprobs, 3);
  EXPECT_TRUE(p.stream);
  EXPECT_TRUE(p.include_usage);
  EXPECT_EQ(p.response_format.kind, ResponseFormat::Kind::kJsonSchema);
  EXPECT_EQ(p.enable_thinking, false);
  EXPECT_EQ(*p.reasoning_budget, 1024);
}

TEST(OpenAICompletion, PromptForms) {
  RequestLimits l;
  auto p = parse_openai_completion(json::parse(R"({"prompt": "hi"})"), l);
  EXPECT_EQ(p.prompt_texts, std::vector<std::string>{"hi"});
  EXPECT_EQ(*p.max_tokens, 16);  // the OpenAI default
  p = parse_openai_completion(
      json::parse(R"({"prompt": [1, 2, 3], "max_tokens": 0, "echo": true, "logprobs": 1})"), l);
  EXPECT_EQ(p.prompt_ids, (std::vector<std::vector<int32_t>>{{1, 2, 3}}));
  EXPECT_EQ(*p.max_tokens, 0);
  EXPECT_TRUE(p.echo);
  EXPECT_EQ(p.logprobs, 1);
  p = parse_openai_completion(json::parse(R"({"prompt": [[1], [2, 3]], "n": 2})"), l);
  EXPECT_EQ(p.prompt_ids.size(), 2u);
  p = parse_openai_completion(json::parse(R"({"prompt": ["a", "b"]})"), l);
  EXPECT_EQ(p.prompt_texts.size(), 2u);
}

TEST(AnthropicMessages, ConvertsBlocks) {
  json body = json::parse(R"({
    "model": "demo", "max_tokens": 2000, "system": [{"type": "text", "text": "sys"}],
    "messages": [
      {"role": "user", "content": "q"},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"},
                                        {"type": "text", "text": "calling"},
                                        {"type": "tool_use", "id": "tu1", "name": "f", "input": {"a": 1}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": [{"type": "text", "text": "r"}]},
                                   {"type": "text", "text": "thanks"}]}],
    "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "any"}, "thinking": {"type": "enabled", "budget_tokens": 1024},
    "stop_sequences": ["X"], "temperature": 0.5, "top_k": 5
  })");
  GenerationPlan p = parse_anthropic_messages(body, RequestLimits{});
  ASSERT_EQ(p.messages.size(), 5u) << p.messages.dump();
  EXPECT_EQ(p.messages[0], json({{"role", "system"}, {"content", "sys"}}));
  EXPECT_EQ(p.messages[2]["reasoning_content"], "t");
  EXPECT_EQ(p.messages[2]["content"], "calling");
  EXPECT_EQ(p.messages[2]["tool_calls"][0]["function"]["arguments"], json({{"a", 1}}));
  EXPECT_EQ(p.messages[3], json({{"role", "tool"}, {"tool_call_id", "tu1"}, {"content", "r"}}));
  EXPECT_EQ(p.messages[4], json({{"role", "user"}, {"content", "thanks"}}));
  EXPECT_EQ(p.tools[0]["function"]["parameters"], json({{"type", "object"}}));
  EXPECT_EQ(p.tool_choice, "required");
  EXPECT_EQ(p.enable_thinking, true);
  EXPECT_EQ(*p.reasoning_budget, 1024);
  EXPECT_EQ(p.stop, std::vector<std::string>{"X"});
  EXPECT_EQ(*p.max_tokens, 2000);
}

TEST(ErrorShapes, StatusTypes) {
  json oa =
      json::parse(error_body(ApiKind::kOpenAI, 401, "invalid API key", "", "invalid_api_key"));
  EXPECT_EQ(oa["error"]["type"], "authentication_error");
  EXPECT_EQ(oa["error"]["code"], "invalid_api_key");
  EXPECT_TRUE(oa["error"]["param"].is_null());
  json an = json::parse(error_body(ApiKind::kAnthropic, 413, "too big"));
  EXPECT_EQ(an["error"]["type"], "request_too_large");
  // Messages quoting invalid bytes still serialize.
  EXPECT_NO_THROW(json::parse(error_body(ApiKind::kOpenAI, 400, "bad \xff")));
}

}  // namespace
}  // namespace tokenmill::server
