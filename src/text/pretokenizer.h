// tokenizer.json "pre_tokenizer" section: Split (regex or string; Removed, Isolated,
// MergedWithPrevious, MergedWithNext, Contiguous; invert), ByteLevel, Metaspace, Digits,
// Whitespace, WhitespaceSplit and Sequence.
#pragma once

#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/unicode_regex.h"

namespace tokenmill::text {

// The pieces of one section of input between added tokens. Views point into the section text or
// into `arena` (strings made by pre-tokenizers; a deque keeps them at stable addresses).
struct PreTokenized {
  std::vector<std::string_view> pieces;
  std::deque<std::string> arena;
  // Set by ByteLevel: pieces still hold raw bytes, each standing for its byte-level character.
  // The mapping is applied lazily (by the BPE model, or by materialize() when another
  // pre-tokenizer runs after ByteLevel).
  bool byte_level = false;
  bool first_section = true;  // the section starts the input (Metaspace prepend_scheme "first")
  std::vector<std::pair<size_t, size_t>> matches;  // scratch
  RegexScratch regex;

  void materialize();
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void apply(PreTokenized& pt) const = 0;
};

// Builds the pre-tokenizer described by `j` (null gives nullptr); `where` prefixes errors.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const std::string& where);

}  // namespace tokenmill::text
