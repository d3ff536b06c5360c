// Helpers for the output parser tests: run a parser over chunks and compare event streams with
// adjacent deltas merged (how the text was split may change delta boundaries, nothing else).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "text/output_parser.h"

namespace tokenmill::testing_parse {

struct ParseRun {
  std::vector<OutputEvent> events;  // merged
  OutputFlags flags;
  ParsedOutput parsed;
};

inline bool mergeable(OutputEventType t) {
  return t == OutputEventType::kReasoning || t == OutputEventType::kContent ||
         t == OutputEventType::kToolCallArguments;
}

inline void append_merged(std::vector<OutputEvent>& all, const std::vector<OutputEvent>& evs) {
  for (const auto& e : evs) {
    if (!all.empty() && mergeable(e.type) && all.back().type == e.type &&
        all.back().tool_index == e.tool_index) {
      all.back().text += e.text;
    } else {
      all.push_back(e);
    }
  }
}

// Feeds `chunks` one by one, then finishes.
inline ParseRun run_chunks(const OutputParserOptions& opts,
                           const std::vector<std::string_view>& chunks) {
  auto p = make_output_parser(opts);
  ParseRun r;
  OutputAccumulator acc;
  for (auto c : chunks) {
    auto evs = p->feed(c);
    acc.add(evs);
    append_merged(r.events, evs);
  }
  auto evs = p->finish();
  acc.add(evs);
  append_merged(r.events, evs);
  r.flags = p->flags();
  r.parsed = acc.result(r.flags);
  return r;
}

inline ParseRun run_whole(const OutputParserOptions& opts, std::string_view text) {
  return run_chunks(opts, {text});
}

inline std::vector<std::string_view> split_every(std::string_view text, size_t n) {
  std::vector<std::string_view> out;
  for (size_t i = 0; i < text.size(); i += n) out.push_back(text.substr(i, n));
  return out;
}

inline std::string describe(const std::vector<OutputEvent>& evs) {
  static const char* names[] = {"reasoning", "content", "begin", "args", "end"};
  std::string s;
  for (const auto& e : evs) {
    s += std::string(names[static_cast<int>(e.type)]) + "[" + std::to_string(e.tool_index) + "," +
         e.id + "," + e.name + "," + (e.complete ? "" : "incomplete,") + "](" + e.text + ")\n";
  }
  return s;
}

}  // namespace tokenmill::testing_parse
