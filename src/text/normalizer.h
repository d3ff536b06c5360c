// tokenizer.json "normalizer" section: NFC/NFD/NFKC/NFKD (utf8proc), Lowercase, Prepend,
// Replace (string or regex), Strip, StripAccents and Sequence.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "text/unicode_regex.h"

namespace tokenmill::text {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites `s` (well-formed UTF-8) in place; the result is well-formed UTF-8.
  virtual void apply(std::string& s, RegexScratch& scratch) const = 0;
};

// Builds the normalizer described by `j` (null gives nullptr). `where` prefixes error messages,
// e.g. "tokenizer.json: normalizer". Throws tokenmill::Error for unknown types / bad fields.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const std::string& where);

// Replaces every match of `re` in `s` by `content` (JavaScript replaceAll semantics; a pattern
// matching the empty string inserts `content` between code points). Shared with the decoders.
void regex_replace_all(const Regex& re, std::string& s, std::string_view content,
                       RegexScratch& scratch);

}  // namespace tokenmill::text
