#include "text/jinja_lexer.h"

#include <algorithm>
#include <cstring>

#include "text/jinja_value.h"
#include "util/error.h"

namespace tokenmill::jinja {
namespace {

// Length in bytes of the Python-whitespace code point ending at s[end-1], or 0.
size_t trailing_ws_len(std::string_view s, size_t end) {
  if (end == 0) return 0;
  size_t start = end - 1;
  while (start > 0 && end - start < 4 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) {
    --start;
  }
  std::u32string cp = utf8_decode(s.substr(start, end - start));
  if (cp.size() == 1 && py_isspace(cp[0])) return end - start;
  if (py_isspace(static_cast<unsigned char>(s[end - 1]))) return 1;
  return 0;
}

// Length in bytes of the Python-whitespace code point starting at s[pos], or 0.
size_t leading_ws_len(std::string_view s, size_t pos) {
  if (pos >= s.size()) return 0;
  auto b = static_cast<unsigned char>(s[pos]);
  if (b < 0x80) return py_isspace(b) ? 1 : 0;
  size_t n = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
  if (pos + n > s.size()) return 0;
  std::u32string cp = utf8_decode(s.substr(pos, n));
  return (cp.size() == 1 && py_isspace(cp[0])) ? n : 0;
}

std::string_view rstrip_ws(std::string_view s) {
  size_t end = s.size();
  while (size_t n = trailing_ws_len(s, end)) end -= n;
  return s.substr(0, end);
}

size_t skip_ws(std::string_view s, size_t pos) {
  while (size_t n = leading_ws_len(s, pos)) pos += n;
  return pos;
}

bool all_ws(std::string_view s) {
  return !s.empty() && rstrip_ws(s).empty();
}

int count_nl(std::string_view s) {
  return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
}

bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         (static_cast<unsigned char>(c) >= 0x80);
}
bool is_name_char(char c) {
  return is_name_start(c) || (c >= '0' && c <= '9');
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

class Lexer {
 public:
  Lexer(std::string_view source, const std::string& name) : name_(name) { normalize(source); }

  std::vector<Token> run() {
    size_t n = src_.size();
    while (pos_ < n) {
      size_t t = next_tag(pos_);
      if (t == std::string::npos) {
        emit_data(std::string_view(src_).substr(pos_), line_);
        break;
      }
      char kind = src_[t + 1];
      size_t after = t + 2;
      char sign = 0;
      if (after < n && (src_[after] == '-' || src_[after] == '+')) sign = src_[after++];
      std::string_view text = std::string_view(src_).substr(pos_, t - pos_);
      int text_line = line_;
      line_ += count_nl(text);
      size_t raw_end = kind == '%' ? raw_open_end(after) : 0;
      emit_data(strip_before(text, sign, kind != '{'), text_line);
      if (raw_end) {
        line_ += count_nl(std::string_view(src_).substr(t, raw_end - t));
        line_starting_ = src_[raw_end - 1] == '\n';
        lex_raw(raw_end);
      } else if (kind == '#') {
        lex_comment(after);
      } else {
        lex_tag(kind, after);
      }
    }
    tokens_.push_back(Token{Tok::Eof, line_, "", 0, 0});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void error(int line, const std::string& msg) { fail("{}:{}: {}", name_, line, msg); }

  // Newlines become "\n"; one trailing newline is dropped (keep_trailing_newline=False).
  void normalize(std::string_view s) {
    src_.reserve(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '\r') {
        if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
        src_ += '\n';
      } else {
        src_ += s[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  size_t next_tag(size_t from) const {
    size_t p = from;
    while ((p = src_.find('{', p)) != std::string::npos) {
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) {
        return p;
      }
      ++p;
    }
    return std::string::npos;
  }

  // The data before a tag, with `-` (strip all whitespace) or lstrip_blocks applied.
  std::string_view strip_before(std::string_view text, char sign, bool block_like) const {
    if (sign == '-') return rstrip_ws(text);
    if (sign != '+' && block_like) {
      size_t nl = text.rfind('\n');
      size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting_) && all_ws(text.substr(l_pos))) return text.substr(0, l_pos);
    }
    return text;
  }

  void emit_data(std::string_view text, int line) {
    if (!text.empty()) tokens_.push_back(Token{Tok::Data, line, std::string(text), 0, 0});
  }

  // If "{%[-+]" at `after` opens a raw block, returns the position after its closing "%}".
  size_t raw_open_end(size_t after) const {
    size_t p = skip_ws(src_, after);
    if (src_.compare(p, 3, "raw") != 0) return 0;
    p = skip_ws(src_, p + 3);
    if (src_.compare(p, 3, "-%}") == 0) return skip_ws(src_, p + 3);
    if (src_.compare(p, 2, "%}") == 0) return p + 2;
    return 0;
  }

  void lex_raw(size_t body) {
    int start_line = line_;
    size_t p = body;
    while ((p = src_.find("{%", p)) != std::string::npos) {
      size_t q = p + 2;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      q = skip_ws(src_, q);
      if (src_.compare(q, 6, "endraw") == 0) {
        q = skip_ws(src_, q + 6);
        size_t end = 0;
        if (src_.compare(q, 3, "+%}") == 0) {
          end = q + 3;
        } else if (src_.compare(q, 3, "-%}") == 0) {
          end = skip_ws(src_, q + 3);
        } else if (src_.compare(q, 2, "%}") == 0) {
          end = q + 2;
          if (end < src_.size() && src_[end] == '\n') ++end;
        }
        if (end) {
          std::string_view text = std::string_view(src_).substr(body, p - body);
          emit_data(strip_before(text, sign, true), line_);
          line_ += count_nl(std::string_view(src_).substr(body, end - body));
          line_starting_ = src_[end - 1] == '\n';
          pos_ = end;
          return;
        }
      }
      p += 2;
    }
    error(start_line, "Missing end of raw directive");
  }

  void lex_comment(size_t after) {
    size_t j = src_.find("#}", after);
    if (j == std::string::npos) error(line_, "Missing end of comment tag");
    size_t end = j + 2;
    if (j > after && src_[j - 1] == '-') {
      end = skip_ws(src_, end);
    } else if (!(j > after && src_[j - 1] == '+')) {
      if (end < src_.size() && src_[end] == '\n') ++end;
    }
    line_ += count_nl(std::string_view(src_).substr(after, end - after));
    line_starting_ = src_[end - 1] == '\n';
    pos_ = end;
  }

  // Tokens of a {{ }} or {% %} tag starting at p (after the opening sign).
  void lex_tag(char kind, size_t p) {
    bool block = kind == '%';
    tokens_.push_back(Token{block ? Tok::BlockBegin : Tok::VarBegin, line_, "", 0, 0});
    std::vector<char> balance;
    const size_t n = src_.size();
    while (true) {
      if (p >= n) {
        pos_ = n;
        line_starting_ = false;
        return;  // the parser reports the missing end tag
      }
      if (balance.empty()) {
        size_t end = 0;
        if (block) {
          if (src_.compare(p, 3, "+%}") == 0) {
            end = p + 3;
          } else if (src_.compare(p, 3, "-%}") == 0) {
            end = skip_ws(src_, p + 3);
          } else if (src_.compare(p, 2, "%}") == 0) {
            end = p + 2;
            if (end < n && src_[end] == '\n') ++end;
          }
        } else {
          if (src_.compare(p, 3, "-}}") == 0) {
            end = skip_ws(src_, p + 3);
          } else if (src_.compare(p, 2, "}}") == 0) {
            end = p + 2;
          }
        }
        if (end) {
          tokens_.push_back(Token{block ? Tok::BlockEnd : Tok::VarEnd, line_, "", 0, 0});
          line_ += count_nl(std::string_view(src_).substr(p, end - p));
          line_starting_ = src_[end - 1] == '\n';
          pos_ = end;
          return;
        }
      }
      if (size_t w = leading_ws_len(src_, p)) {
        if (src_[p] == '\n') ++line_;
        p += w;
        continue;
      }
      char c = src_[p];
      if (is_digit(c)) {
        p = lex_number(p);
      } else if (is_name_start(c)) {
        size_t q = p;
        while (q < n && is_name_char(src_[q])) ++q;
        tokens_.push_back(Token{Tok::Name, line_, src_.substr(p, q - p), 0, 0});
        p = q;
      } else if (c == '\'' || c == '"') {
        p = lex_string(p);
      } else {
        p = lex_operator(p, balance);
      }
    }
  }

  size_t lex_number(size_t p) {
    const size_t n = src_.size();
    auto digits = [&](size_t q, auto pred) {
      // (_?D)+ style runs: digits with single underscores between them.
      size_t start = q;
      while (q < n) {
        if (pred(src_[q])) {
          ++q;
        } else if (src_[q] == '_' && q > start && q + 1 < n && pred(src_[q + 1])) {
          ++q;
        } else {
          break;
        }
      }
      return q;
    };
    auto dec = [](char ch) { return is_digit(ch); };
    // Prefixed integers.
    if (src_[p] == '0' && p + 1 < n && std::strchr("bBoOxX", src_[p + 1]) != nullptr) {
      char k = static_cast<char>(src_[p + 1] | 32);
      int base = k == 'b' ? 2 : k == 'o' ? 8 : 16;
      auto pred = [base](char ch) {
        if (base == 2) return ch == '0' || ch == '1';
        if (base == 8) return ch >= '0' && ch <= '7';
        return is_digit(ch) || ((ch | 32) >= 'a' && (ch | 32) <= 'f');
      };
      size_t q = p + 2;
      if (q < n && src_[q] == '_') ++q;
      size_t e = digits(q, pred);
      if (e > q) return push_int(src_.substr(p + 2, e - p - 2), base, e);
    }
    size_t int_end = digits(p, dec);
    size_t q = int_end;
    bool is_float = false;
    if (q + 1 < n && src_[q] == '.' && is_digit(src_[q + 1])) {
      q = digits(q + 1, dec);
      is_float = true;
    }
    if (q < n && (src_[q] | 32) == 'e') {
      size_t r = q + 1;
      if (r < n && (src_[r] == '+' || src_[r] == '-')) ++r;
      if (r < n && is_digit(src_[r])) {
        q = digits(r, dec);
        is_float = true;
      }
    }
    if (is_float) {
      std::string t;
      for (size_t i = p; i < q; ++i) {
        if (src_[i] != '_') t += src_[i];
      }
      tokens_.push_back(Token{Tok::Float, line_, t, 0, std::strtod(t.c_str(), nullptr)});
      return q;
    }
    // Decimal: "0" runs or [1-9] digits (so "012" lexes as 0 then 12, as jinja2 does).
    if (src_[p] == '0') {
      size_t e = p + 1;
      while (e < n && (src_[e] == '0' || (src_[e] == '_' && e + 1 < n && src_[e + 1] == '0'))) ++e;
      return push_int("0", 10, e);
    }
    return push_int(src_.substr(p, int_end - p), 10, int_end);
  }

  size_t push_int(const std::string& digits, int base, size_t end) {
    int64_t v = 0;
    for (char c : digits) {
      if (c == '_') continue;
      int d = is_digit(c) ? c - '0' : (c | 32) - 'a' + 10;
      if (__builtin_mul_overflow(v, base, &v) || __builtin_add_overflow(v, d, &v)) {
        error(line_, "integer literal too large (values beyond 64 bits are not supported)");
      }
    }
    tokens_.push_back(Token{Tok::Int, line_, digits, v, 0});
    return end;
  }

  size_t lex_string(size_t p) {
    char q = src_[p];
    size_t i = p + 1;
    const size_t n = src_.size();
    while (i < n && src_[i] != q) i += (src_[i] == '\\' && i + 1 < n) ? 2 : 1;
    if (i >= n)
      error(line_, fmt::format("unexpected char {} at {}", q == '\'' ? "\"'\"" : "'\"'", p));
    std::string_view body = std::string_view(src_).substr(p + 1, i - p - 1);
    tokens_.push_back(Token{Tok::String, line_, unescape(body), 0, 0});
    line_ += count_nl(body);
    return i + 1;
  }

  // Python "unicode-escape" decoding as jinja2 applies it to string literals.
  std::string unescape(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] != '\\' || i + 1 >= s.size()) {
        out += s[i];
        continue;
      }
      char c = s[++i];
      auto hex = [&](size_t count, const char* what) {
        uint32_t v = 0;
        for (size_t k = 0; k < count; ++k) {
          char h = i + 1 + k < s.size() ? s[i + 1 + k] : '\0';
          int d = is_digit(h)                            ? h - '0'
                  : ((h | 32) >= 'a' && (h | 32) <= 'f') ? (h | 32) - 'a' + 10
                                                         : -1;
          if (d < 0) error(line_, fmt::format("truncated {} escape", what));
          v = v * 16 + static_cast<uint32_t>(d);
        }
        i += count;
        if (v > 0x10FFFF) error(line_, "illegal Unicode character");
        utf8_append(out, static_cast<char32_t>(v));
      };
      switch (c) {
        case '\n':
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'v':
          out += '\v';
          break;
        case 'x':
          hex(2, "\\xXX");
          break;
        case 'u':
          hex(4, "\\uXXXX");
          break;
        case 'U':
          hex(8, "\\UXXXXXXXX");
          break;
        default:
          if (c >= '0' && c <= '7') {
            uint32_t v = static_cast<uint32_t>(c - '0');
            for (int k = 0; k < 2 && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '7'; ++k) {
              v = v * 8 + static_cast<uint32_t>(s[++i] - '0');
            }
            utf8_append(out, static_cast<char32_t>(v));
          } else {
            out += '\\';
            out += c;
          }
      }
    }
    return out;
  }

  size_t lex_operator(size_t p, std::vector<char>& balance) {
    static constexpr const char* kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : kTwo) {
      if (src_.compare(p, 2, op) == 0) {
        tokens_.push_back(Token{Tok::Op, line_, op, 0, 0});
        return p + 2;
      }
    }
    char c = src_[p];
    if (std::strchr("+-/*%~[](){}><=.:|,;", c) == nullptr || c == '\0') {
      std::string shown = py_str_repr(std::string_view(src_).substr(p, 1));
      error(line_, fmt::format("unexpected char {} at {}", shown, p));
    }
    if (c == '(' || c == '[' || c == '{') {
      balance.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (balance.empty()) error(line_, fmt::format("unexpected '{}'", c));
      char expected = balance.back();
      balance.pop_back();
      if (expected != c) error(line_, fmt::format("unexpected '{}', expected '{}'", c, expected));
    }
    tokens_.push_back(Token{Tok::Op, line_, std::string(1, c), 0, 0});
    return p + 1;
  }

  const std::string& name_;
  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> lex(std::string_view source, const std::string& source_name) {
  return Lexer(source, source_name).run();
}

}  // namespace tokenmill::jinja
