// PCRE2 (UTF + UCP, JIT when available) for the regexes in tokenizer.json, with matching
// semantics of JavaScript's String#matchAll (what the reference tokenizer runs).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;
struct pcre2_real_match_context_8;

namespace tokenmill::text {

// Rewrites a tokenizer.json regex (Oniguruma / Python flavour) so that PCRE2 gives the same
// matches as the reference's JavaScript RegExp with the "u" flag:
//  - "(?i:'s|'t|'re|'ve|'m|'ll|'d)" becomes the explicit-case form the reference substitutes;
//  - \s \S \d \D \w \W get JavaScript's meaning (\s = WhiteSpace + LineTerminator, which has
//    U+FEFF but not U+0085; \d and \w are ASCII-only);
//  - \uXXXX and \u{X...} become \x{...}.
std::string js_regex_to_pcre2(std::string_view pattern);

// Per-call matching scratch (PCRE2 match data); one per thread of use, cheap to create.
class RegexScratch {
 public:
  RegexScratch();
  ~RegexScratch();
  RegexScratch(const RegexScratch&) = delete;
  RegexScratch& operator=(const RegexScratch&) = delete;
  pcre2_real_match_data_8* data() const { return data_; }

 private:
  pcre2_real_match_data_8* data_;
};

class Regex {
 public:
  // `pattern` is translated with js_regex_to_pcre2 unless `literal`, in which case it is matched
  // as plain text. Throws tokenmill::Error naming `where` if PCRE2 rejects it.
  Regex(std::string_view pattern, bool literal, std::string_view where);
  ~Regex();
  Regex(Regex&& o) noexcept : code_(o.code_), context_(o.context_), jit_(o.jit_) {
    o.code_ = nullptr;
    o.context_ = nullptr;
  }
  Regex& operator=(Regex&&) = delete;
  Regex(const Regex&) = delete;

  // Appends [begin, end) byte ranges of every match in `text`, scanning like JavaScript's
  // matchAll: after an empty match the search resumes one code point later. Empty matches are
  // reported too. `text` must be well-formed UTF-8.
  void find_all(std::string_view text, RegexScratch& scratch,
                std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  pcre2_real_code_8* code_;
  pcre2_real_match_context_8*
      context_;  // match/depth limits: a pathological pattern fails, not hangs
  bool jit_;
};

}  // namespace tokenmill::text
