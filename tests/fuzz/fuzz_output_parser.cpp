// libFuzzer target: the output parser on arbitrary text split at arbitrary points must give the
// same merged events and flags as the one-shot parse, never throw, and produce tool calls whose
// arguments are JSON objects.
// Input: byte 0 = options (reasoning, starts_in_reasoning, tool format), byte 1 = split seed, the
// rest = text, where 0xFF k stands for markup token k (so the fuzzer reaches deep states fast).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "text/output_parser.h"

namespace {

using tokenmill::OutputEvent;
using tokenmill::OutputEventType;

constexpr std::string_view kTokens[] = {"<think>",
                                        "</think>",
                                        "<tool_call>",
                                        "</tool_call>",
                                        "<function=f>",
                                        "<function=g>",
                                        "</function>",
                                        "<parameter=n>",
                                        "<parameter=s>",
                                        "<parameter=o>",
                                        "<parameter=b>",
                                        "</parameter>",
                                        "\n",
                                        "{\"name\": \"f\", \"arguments\": ",
                                        "{\"a\": [1, 2]}",
                                        "\"",
                                        "<",
                                        "</",
                                        "true",
                                        "12.5",
                                        "null",
                                        "\xF0\x9F\x99\x82"};

bool mergeable(OutputEventType t) {
  return t == OutputEventType::kReasoning || t == OutputEventType::kContent ||
         t == OutputEventType::kToolCallArguments;
}

void append(std::vector<OutputEvent>& all, std::vector<OutputEvent> evs) {
  for (auto& e : evs) {
    if (!all.empty() && mergeable(e.type) && all.back().type == e.type &&
        all.back().tool_index == e.tool_index) {
      all.back().text += e.text;
    } else {
      all.push_back(std::move(e));
    }
  }
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_output_parser: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  tokenmill::OutputParserOptions o;
  o.reasoning = data[0] & 1;
  o.starts_in_reasoning = data[0] & 2;
  o.tool_format = static_cast<tokenmill::ToolCallFormat>((data[0] >> 2) & 3);
  o.tools = nlohmann::json::parse(R"([{"type": "function", "function": {"name": "f",
    "parameters": {"type": "object", "properties": {"n": {"type": ["integer", "null"]},
    "s": {"type": "string"}, "o": {"type": "object"}, "b": {"type": "boolean"}}}}}])");
  uint32_t seed = data[1] * 2654435761u + 1;
  std::string text;
  for (size_t i = 2; i < size; ++i) {
    if (data[i] == 0xFF && i + 1 < size) {
      text += kTokens[data[++i] % std::size(kTokens)];
    } else {
      text += static_cast<char>(data[i]);
    }
  }

  auto whole_parser = tokenmill::make_output_parser(o);
  std::vector<OutputEvent> whole;
  append(whole, whole_parser->feed(text));
  append(whole, whole_parser->finish());

  auto split_parser = tokenmill::make_output_parser(o);
  std::vector<OutputEvent> split;
  tokenmill::OutputAccumulator acc;
  for (size_t i = 0; i < text.size();) {
    seed = seed * 1664525u + 1013904223u;
    const size_t n = (seed >> 16) % 9;  // chunks of 0..8 bytes
    auto evs = split_parser->feed(std::string_view(text).substr(i, n));
    acc.add(evs);
    append(split, std::move(evs));
    i += n;
  }
  auto evs = split_parser->finish();
  acc.add(evs);
  append(split, std::move(evs));

  check(split == whole, "split events differ from one-shot events");
  check(split_parser->flags() == whole_parser->flags(), "split flags differ");
  const auto parsed = acc.result(split_parser->flags());
  for (const auto& c : parsed.tool_calls) {
    const auto args = nlohmann::json::parse(c.arguments, nullptr, false);
    check(args.is_object(), "tool call arguments are not a JSON object");
    check(!c.name.empty(), "tool call without a name");
  }
  if (!o.reasoning) check(parsed.reasoning.empty(), "reasoning without reasoning enabled");
  return 0;
}
