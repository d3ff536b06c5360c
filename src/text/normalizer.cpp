#include "text/normalizer.h"

#include <utf8proc.h>

#include <vector>

#include "text/tokenizer_json.h"
#include "text/unicode_utf8.h"
#include "util/error.h"

namespace tokenmill::text {

void regex_replace_all(const Regex& re, std::string& s, std::string_view content,
                       RegexScratch& scratch) {
  std::vector<std::pair<size_t, size_t>> m;
  re.find_all(s, scratch, m);
  if (m.empty()) return;
  std::string out;
  out.reserve(s.size());
  size_t prev = 0;
  for (auto [b, e] : m) {
    out.append(s, prev, b - prev);
    out.append(content);
    prev = e;
  }
  out.append(s, prev, std::string::npos);
  s.swap(out);
}

namespace {

// True when NFC/NFD cannot change `s`: every code point is below U+0300, a CJK unified ideograph
// or a precomposed Hangul syllable. None of those has a decomposition, and none composes with
// the character before it, so a string made only of them is in every normalization form... except
// that Hangul syllables decompose under NFD/NFKD, so the fast path is for the composed forms only.
bool trivially_composed(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0xCC) {  // lead bytes below 0xCC encode U+0000..U+02FF; continuation bytes pass too
      ++i;
      continue;
    }
    size_t len = 0;
    const char32_t cp = decode_utf8(s, i, len);
    if (!((cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0xAC00 && cp <= 0xD7A3))) return false;
    i += len;
  }
  return true;
}

class UnicodeNormalizer final : public Normalizer {
 public:
  UnicodeNormalizer(utf8proc_option_t options, bool composed)
      : options_(options), composed_(composed) {}
  void apply(std::string& s, RegexScratch&) const override {
    if (composed_ && trivially_composed(s)) return;
    utf8proc_uint8_t* dst = nullptr;
    const utf8proc_ssize_t n =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                     static_cast<utf8proc_ssize_t>(s.size()), &dst, options_);
    if (n < 0) {
      std::free(dst);
      fail("unicode normalization failed: {}", utf8proc_errmsg(n));
    }
    s.assign(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
    std::free(dst);
  }

 private:
  utf8proc_option_t options_;
  bool composed_;
};

// Per code point simple lowercase mapping (JavaScript's toLowerCase also applies the few
// context-dependent and one-to-many mappings: final sigma, U+0130).
class Lowercase final : public Normalizer {
 public:
  void apply(std::string& s, RegexScratch&) const override {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      size_t len = 0;
      const char32_t cp = decode_utf8(s, i, len);
      append_utf8(static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))), out);
      i += len;
    }
    s.swap(out);
  }
};

// Prepends a string to non-empty input (HF tokenizers' rule; the reference only calls
// normalizers on non-empty sections, so both agree).
class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string p) : prepend_(std::move(p)) {}
  void apply(std::string& s, RegexScratch&) const override {
    if (!s.empty()) s.insert(0, prepend_);
  }

 private:
  std::string prepend_;
};

class Replace final : public Normalizer {
 public:
  Replace(Regex re, std::string content) : re_(std::move(re)), content_(std::move(content)) {}
  void apply(std::string& s, RegexScratch& scratch) const override {
    regex_replace_all(re_, s, content_, scratch);
  }

 private:
  Regex re_;
  std::string content_;
};

class Strip final : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void apply(std::string& s, RegexScratch&) const override {
    std::string_view v = s;
    if (left_) v = trim_js_space_left(v);
    if (right_) v = trim_js_space_right(v);
    s = std::string(v);
  }

 private:
  bool left_, right_;
};

// Removes U+0300..U+036F (the reference's definition of accents).
class StripAccents final : public Normalizer {
 public:
  void apply(std::string& s, RegexScratch&) const override {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      size_t len = 0;
      const char32_t cp = decode_utf8(s, i, len);
      if (cp < 0x300 || cp > 0x36F) out.append(s, i, len);
      i += len;
    }
    s.swap(out);
  }
};

class Sequence final : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  void apply(std::string& s, RegexScratch& scratch) const override {
    for (const auto& p : parts_) p->apply(s, scratch);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = json_string(j, "type", where);
  const auto stable = static_cast<utf8proc_option_t>(UTF8PROC_STABLE);
  if (type == "NFC")
    return std::make_unique<UnicodeNormalizer>(
        static_cast<utf8proc_option_t>(stable | UTF8PROC_COMPOSE), true);
  if (type == "NFD")
    return std::make_unique<UnicodeNormalizer>(
        static_cast<utf8proc_option_t>(stable | UTF8PROC_DECOMPOSE), false);
  if (type == "NFKC")
    return std::make_unique<UnicodeNormalizer>(
        static_cast<utf8proc_option_t>(stable | UTF8PROC_COMPOSE | UTF8PROC_COMPAT), false);
  if (type == "NFKD")
    return std::make_unique<UnicodeNormalizer>(
        static_cast<utf8proc_option_t>(stable | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT), false);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "StripAccents") return std::make_unique<StripAccents>();
  if (type == "Prepend") return std::make_unique<Prepend>(json_string(j, "prepend", where));
  if (type == "Strip") {
    return std::make_unique<Strip>(json_bool(j, "strip_left", false, where),
                                   json_bool(j, "strip_right", false, where));
  }
  if (type == "Replace") {
    return std::make_unique<Replace>(json_pattern(j, where), json_string(j, "content", where));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> parts;
    const auto& list = json_array(j, "normalizers", where);
    for (size_t i = 0; i < list.size(); ++i) {
      auto p = make_normalizer(list[i], where + ".normalizers[" + std::to_string(i) + "]");
      if (p) parts.push_back(std::move(p));
    }
    return std::make_unique<Sequence>(std::move(parts));
  }
  fail(
      "{}: unsupported normalizer type \"{}\" (supported: NFC, NFD, NFKC, NFKD, Lowercase, "
      "StripAccents, Prepend, Strip, Replace, Sequence)",
      where, type);
}

}  // namespace tokenmill::text
