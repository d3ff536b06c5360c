// UTF-8 helpers for the tokenizer: validation, WHATWG-style repair, code point iteration, the
// GPT-2 byte-level alphabet and a few character classes with JavaScript's definitions (the
// reference tokenizer, @lenml/tokenizers, runs on JavaScript strings).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tokenmill::text {

// True when `s` is well-formed UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF).
bool is_valid_utf8(std::string_view s);

// Appends `s` to `out` with every maximal ill-formed subpart replaced by U+FFFD, exactly as the
// WHATWG "utf-8 decode without BOM" algorithm (TextDecoder, Node's Buffer#toString) does.
void append_repaired_utf8(std::string_view s, std::string& out);

// Decodes the code point starting at s[i] of well-formed UTF-8; sets `len` to its byte length.
inline char32_t decode_utf8(std::string_view s, size_t i, size_t& len) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    len = 1;
    return b0;
  }
  auto cont = [&](size_t k) {
    return static_cast<char32_t>(static_cast<unsigned char>(s[i + k]) & 0x3F);
  };
  if (b0 < 0xE0) {
    len = 2;
    return (static_cast<char32_t>(b0 & 0x1F) << 6) | cont(1);
  }
  if (b0 < 0xF0) {
    len = 3;
    return (static_cast<char32_t>(b0 & 0x0F) << 12) | (cont(1) << 6) | cont(2);
  }
  len = 4;
  return (static_cast<char32_t>(b0 & 0x07) << 18) | (cont(1) << 12) | (cont(2) << 6) | cont(3);
}

// Byte length of the UTF-8 sequence whose lead byte is `b` (1 for stray bytes).
inline size_t utf8_len(unsigned char b) {
  return b < 0xC0 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

void append_utf8(char32_t cp, std::string& out);

// GPT-2 byte-level alphabet: byte b <-> a printable code point (b itself for printable Latin-1,
// 256 + n for the n-th unprintable byte).
char32_t byte_to_unicode(uint8_t b);
int unicode_to_byte(char32_t cp);  // -1 when cp is not in the alphabet

// JavaScript's \s (WhiteSpace + LineTerminator): used for trimming around added tokens.
bool is_js_space(char32_t cp);

// Trims JavaScript whitespace from the left / right of well-formed UTF-8.
std::string_view trim_js_space_left(std::string_view s);
std::string_view trim_js_space_right(std::string_view s);

}  // namespace tokenmill::text
