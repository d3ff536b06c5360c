#include "text/unicode_utf8.h"

namespace tokenmill::text {

namespace {

// Bounds for the second byte of a sequence (WHATWG: E0 needs A0.., ED ..9F, F0 90.., F4 ..8F).
struct Lead {
  int need;  // continuation bytes still needed; -1 = not a lead byte
  unsigned char lo, hi;
};

Lead classify(unsigned char b) {
  if (b >= 0xC2 && b <= 0xDF) return {1, 0x80, 0xBF};
  if (b == 0xE0) return {2, 0xA0, 0xBF};
  if (b == 0xED) return {2, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {2, 0x80, 0xBF};
  if (b == 0xF0) return {3, 0x90, 0xBF};
  if (b == 0xF4) return {3, 0x80, 0x8F};
  if (b >= 0xF1 && b <= 0xF3) return {3, 0x80, 0xBF};
  return {-1, 0, 0};
}

// Length of the well-formed sequence at s[i], or 0 if it is ill-formed / truncated.
size_t valid_seq_len(std::string_view s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) return 1;
  const Lead l = classify(b);
  if (l.need < 0 || i + static_cast<size_t>(l.need) >= s.size()) return 0;
  auto c1 = static_cast<unsigned char>(s[i + 1]);
  if (c1 < l.lo || c1 > l.hi) return 0;
  for (int k = 2; k <= l.need; ++k) {
    auto c = static_cast<unsigned char>(s[i + k]);
    if (c < 0x80 || c > 0xBF) return 0;
  }
  return static_cast<size_t>(l.need) + 1;
}

constexpr char kReplacement[] = "\xEF\xBF\xBD";

}  // namespace

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w = 0;
      for (int k = 0; k < 8; ++k)
        w |= static_cast<uint64_t>(static_cast<unsigned char>(s[i + k])) << (8 * k);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    const size_t len = valid_seq_len(s, i);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

void append_repaired_utf8(std::string_view s, std::string& out) {
  size_t i = 0;
  const size_t n = s.size();
  out.reserve(out.size() + n);
  while (i < n) {
    const size_t len = valid_seq_len(s, i);
    if (len > 0) {
      out.append(s.substr(i, len));
      i += len;
      continue;
    }
    // Ill-formed: consume the maximal subpart (the lead byte plus the continuation bytes that
    // were in range before the failure), emit one U+FFFD.
    const auto b = static_cast<unsigned char>(s[i]);
    const Lead l = classify(b);
    size_t consumed = 1;
    if (l.need > 0) {
      unsigned char lo = l.lo, hi = l.hi;
      for (int k = 1; k <= l.need && i + k < n; ++k) {
        const auto c = static_cast<unsigned char>(s[i + k]);
        if (c < lo || c > hi) break;
        ++consumed;
        lo = 0x80;
        hi = 0xBF;
      }
    }
    out.append(kReplacement);
    i += consumed;
  }
}

void append_utf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {
bool printable_byte(unsigned b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}
}  // namespace

char32_t byte_to_unicode(uint8_t b) {
  if (printable_byte(b)) return b;
  // Unprintable bytes are numbered in increasing order from 256.
  unsigned n = 0;
  for (unsigned k = 0; k < b; ++k) n += printable_byte(k) ? 0 : 1;
  return 256 + n;
}

int unicode_to_byte(char32_t cp) {
  if (cp < 256) return printable_byte(cp) ? static_cast<int>(cp) : -1;
  if (cp >= 256 + 68) return -1;
  unsigned n = 0;
  for (unsigned k = 0; k < 256; ++k) {
    if (printable_byte(k)) continue;
    if (256 + n == cp) return static_cast<int>(k);
    ++n;
  }
  return -1;
}

bool is_js_space(char32_t c) {
  switch (c) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
    case 0xFEFF:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

std::string_view trim_js_space_left(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t len = 0;
    if (!is_js_space(decode_utf8(s, i, len))) break;
    i += len;
  }
  return s.substr(i);
}

std::string_view trim_js_space_right(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t len = 0;
    if (!is_js_space(decode_utf8(s, start, len))) break;
    end = start;
  }
  return s.substr(0, end);
}

}  // namespace tokenmill::text
