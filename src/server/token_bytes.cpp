// Token id -> bytes, for logprobs and JSON-constrained decoding.
#include <array>
#include <cstdio>

#include "server/generation.h"
#include "server/tool_call_constraint.h"
#include "text/tokenizer.h"

namespace tokenmill::server {

namespace {

// Decodes one UTF-8 code point at s[i]; advances i. Returns -1 on malformed input.
int32_t next_code_point(const std::string& s, size_t& i) {
  uint8_t c = uint8_t(s[i]);
  int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (len == 0 || i + len > s.size()) {
    ++i;
    return -1;
  }
  int32_t cp = len == 1 ? c : c & (0x7F >> len);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (uint8_t(s[i + k]) & 0x3F);
  i += len;
  return cp;
}

}  // namespace

void compute_token_bytes(ServedModel& m) {
  // GPT-2 byte-level alphabet: printable bytes map to themselves, the other 68 bytes to
  // U+0100 upwards in byte order. inverse[cp] = byte + 1 (0 = not in the alphabet).
  std::array<int16_t, 512> inverse{};
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    int cp = printable ? b : 256 + extra++;
    inverse[cp] = int16_t(b + 1);
  }
  const Tokenizer& tok = *m.tokenizer;
  const int32_t n = tok.vocab_size();
  auto bytes = std::make_shared<std::vector<std::string>>(n);
  m.token_special.assign(n, 0);
  for (int32_t id = 0; id < n; ++id) {
    std::string s = tok.id_to_token(id);
    m.token_special[id] = tok.is_special(id) ? 1 : 0;
    std::string out;
    bool byte_level = true;
    for (size_t i = 0; i < s.size();) {
      int32_t cp = next_code_point(s, i);
      if (cp < 0 || cp >= 512 || inverse[cp] == 0) {
        byte_level = false;
        break;
      }
      out.push_back(char(inverse[cp] - 1));
    }
    if (!byte_level) {
      // SentencePiece: "\u2581" is a space, <0xNN> a raw byte.
      unsigned v = 0;
      if (s.size() == 6 && std::sscanf(s.c_str(), "<0x%2X>", &v) == 1) {
        out = std::string(1, char(v));
      } else {
        out.clear();
        for (size_t i = 0; i < s.size(); ++i) {
          if (s.compare(i, 3, "\xE2\x96\x81") == 0) {
            out.push_back(' ');
            i += 2;
          } else {
            out.push_back(s[i]);
          }
        }
      }
    }
    (*bytes)[id] = std::move(out);
  }
  m.token_order = sort_tokens(*bytes);
  m.token_bytes = std::move(bytes);
}

}  // namespace tokenmill::server
