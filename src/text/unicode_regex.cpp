#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/unicode_regex.h"

#include <pcre2.h>

#include "text/unicode_utf8.h"
#include "util/error.h"

namespace tokenmill::text {

namespace {

// JavaScript's \s as a character-class body (WhiteSpace + LineTerminator, ECMA-262 22.2.2.9).
constexpr std::string_view kJsSpace =
    "\\t\\n\\x0B\\f\\r \\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}"
    "\\x{3000}\\x{FEFF}";
constexpr std::string_view kJsDigit = "0-9";
constexpr std::string_view kJsWord = "A-Za-z0-9_";

// The reference replaces this group (JavaScript has no inline modifiers) by an explicit form;
// doing the same keeps e.g. U+017F (long s), which PCRE2's caseless matching equates with 's',
// out of the contraction alternatives.
constexpr std::string_view kCaselessGroup = "(?i:'s|'t|'re|'ve|'m|'ll|'d)";
constexpr std::string_view kCaselessGroupJs =
    "(?:'([sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))";

bool is_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

}  // namespace

std::string js_regex_to_pcre2(std::string_view pattern) {
  std::string p(pattern);
  for (size_t pos = 0; (pos = p.find(kCaselessGroup, pos)) != std::string::npos;) {
    p.replace(pos, kCaselessGroup.size(), kCaselessGroupJs);
    pos += kCaselessGroupJs.size();
  }
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      auto cls = [&](std::string_view body, bool negated) {
        if (in_class) {
          // A negated shorthand inside a class has no class-body form; keep PCRE2's own.
          if (negated) {
            out += '\\';
            out += e;
          } else {
            out += body;
          }
        } else {
          out += negated ? "[^" : "[";
          out += body;
          out += ']';
        }
      };
      switch (e) {
        case 's':
          cls(kJsSpace, false);
          break;
        case 'S':
          cls(kJsSpace, true);
          break;
        case 'd':
          cls(kJsDigit, false);
          break;
        case 'D':
          cls(kJsDigit, true);
          break;
        case 'w':
          cls(kJsWord, false);
          break;
        case 'W':
          cls(kJsWord, true);
          break;
        case 'u': {
          if (i + 2 < p.size() && p[i + 2] == '{') {
            const size_t close = p.find('}', i + 3);
            if (close != std::string::npos) {
              out += "\\x{" + p.substr(i + 3, close - i - 3) + "}";
              i = close;
              continue;
            }
          } else if (i + 5 < p.size() && is_hex(p[i + 2]) && is_hex(p[i + 3]) && is_hex(p[i + 4]) &&
                     is_hex(p[i + 5])) {
            out += "\\x{" + p.substr(i + 2, 4) + "}";
            i += 5;
            continue;
          }
          out += "\\u";
          break;
        }
        default:
          out += c;
          out += e;
      }
      ++i;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal in both flavours... except JavaScript, where
      // "[]" is the empty class; tokenizer regexes do not use it.
      if (i + 1 < p.size() && p[i + 1] == '^') {
        out += '^';
        ++i;
      }
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

RegexScratch::RegexScratch() : data_(pcre2_match_data_create(1, nullptr)) {
  TM_CHECK(data_ != nullptr, "pcre2_match_data_create failed");
}

RegexScratch::~RegexScratch() {
  pcre2_match_data_free(data_);
}

Regex::Regex(std::string_view pattern, bool literal, std::string_view where)
    : code_(nullptr), jit_(false) {
  const std::string translated = literal ? std::string(pattern) : js_regex_to_pcre2(pattern);
  // PCRE2_LITERAL admits no UCP (nor needs it).
  const uint32_t options = PCRE2_UTF | PCRE2_NO_UTF_CHECK | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  int err = 0;
  PCRE2_SIZE err_off = 0;
  if (!is_valid_utf8(translated)) fail("{}: the regex is not valid UTF-8", where);
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(), options,
                        &err, &err_off, nullptr);
  if (code_ == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail("{}: cannot compile the regex {:?} (as PCRE2: {:?}) at offset {}: {}", where,
         std::string(pattern), translated, err_off, reinterpret_cast<const char*>(msg));
  }
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  context_ = pcre2_match_context_create(nullptr);
  TM_CHECK(context_ != nullptr, "pcre2_match_context_create failed");
  pcre2_set_match_limit(context_, 10'000'000);
  pcre2_set_depth_limit(context_, 100'000);
}

Regex::~Regex() {
  if (code_ != nullptr) pcre2_code_free(code_);
  if (context_ != nullptr) pcre2_match_context_free(context_);
}

void Regex::find_all(std::string_view text, RegexScratch& scratch,
                     std::vector<std::pair<size_t, size_t>>& out) const {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t pos = 0;
  while (pos <= n) {
    const int rc =
        jit_ ? pcre2_jit_match(code_, subject, n, pos, 0, scratch.data(), context_)
             : pcre2_match(code_, subject, n, pos, PCRE2_NO_UTF_CHECK, scratch.data(), context_);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      fail(
          "tokenizer regex failed while matching {} bytes of input: {} (the tokenizer.json pattern "
          "is too complex for this input)",
          n, reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.data());
    const size_t b = ov[0], e = ov[1];
    out.emplace_back(b, e);
    if (e > b) {
      pos = e;
    } else {
      if (e >= n) return;
      pos = e + utf8_len(static_cast<unsigned char>(text[e]));
    }
  }
}

}  // namespace tokenmill::text
