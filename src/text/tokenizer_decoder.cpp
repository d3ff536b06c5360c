#include "text/tokenizer_decoder.h"

#include "text/normalizer.h"
#include "text/tokenizer_json.h"
#include "text/unicode_utf8.h"
#include "util/error.h"

namespace tokenmill::text {

namespace {

// Replaces tokens [b, e) by one token `s` (not an added token).
void replace_range(DecodeTokens& d, size_t b, size_t e, std::string s) {
  d.tokens[b] = std::move(s);
  d.added[b] = 0;
  d.tokens.erase(d.tokens.begin() + static_cast<std::ptrdiff_t>(b + 1),
                 d.tokens.begin() + static_cast<std::ptrdiff_t>(e));
  d.added.erase(d.added.begin() + static_cast<std::ptrdiff_t>(b + 1),
                d.added.begin() + static_cast<std::ptrdiff_t>(e));
}

// Runs of non-added tokens are mapped back to bytes and decoded as UTF-8 (ill-formed sequences
// become U+FFFD, as TextDecoder does); added tokens stay as they are. A token holding a character
// outside the byte-level alphabet contributes its own UTF-8 bytes (HF tokenizers' rule).
class ByteLevel final : public Decoder {
 public:
  void apply(DecodeTokens& d) const override {
    size_t i = 0;
    while (i < d.tokens.size()) {
      if (d.added[i]) {
        ++i;
        continue;
      }
      size_t j = i;
      std::string bytes;
      for (; j < d.tokens.size() && !d.added[j]; ++j) {
        const std::string& t = d.tokens[j];
        const size_t mark = bytes.size();
        bool ok = true;
        for (size_t k = 0; k < t.size();) {
          size_t len = 0;
          const int b = unicode_to_byte(decode_utf8(t, k, len));
          if (b < 0) {
            ok = false;
            break;
          }
          bytes.push_back(static_cast<char>(b));
          k += len;
        }
        if (!ok) {
          bytes.resize(mark);
          bytes += t;
        }
      }
      std::string text;
      append_repaired_utf8(bytes, text);
      replace_range(d, i, j, std::move(text));
      ++i;
    }
  }
};

class Replace final : public Decoder {
 public:
  Replace(Regex re, std::string content) : re_(std::move(re)), content_(std::move(content)) {}
  void apply(DecodeTokens& d) const override {
    for (auto& t : d.tokens) regex_replace_all(re_, t, content_, d.regex);
  }

 private:
  Regex re_;
  std::string content_;
};

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// Consecutive "<0xXX>" tokens become the UTF-8 decoding of their bytes.
class ByteFallback final : public Decoder {
 public:
  void apply(DecodeTokens& d) const override {
    size_t i = 0;
    while (i < d.tokens.size()) {
      std::string bytes;
      size_t j = i;
      for (; j < d.tokens.size(); ++j) {
        const std::string& t = d.tokens[j];
        if (t.size() != 6 || !t.starts_with("<0x") || t[5] != '>') break;
        const int hi = hex_digit(t[3]), lo = hex_digit(t[4]);
        if (hi < 0 || lo < 0) break;
        bytes.push_back(static_cast<char>(hi * 16 + lo));
      }
      if (j == i) {
        ++i;
        continue;
      }
      std::string text;
      append_repaired_utf8(bytes, text);
      replace_range(d, i, j, std::move(text));
      ++i;
    }
  }
};

class Fuse final : public Decoder {
 public:
  void apply(DecodeTokens& d) const override {
    if (d.tokens.empty()) return;
    std::string all;
    for (const auto& t : d.tokens) all += t;
    replace_range(d, 0, d.tokens.size(), std::move(all));
  }
};

// Removes up to `start` leading and `stop` trailing copies of `content` from every token.
class Strip final : public Decoder {
 public:
  Strip(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void apply(DecodeTokens& d) const override {
    if (content_.empty()) return;
    for (auto& t : d.tokens) {
      std::string_view v = t;
      for (size_t k = 0; k < start_ && v.starts_with(content_); ++k)
        v.remove_prefix(content_.size());
      for (size_t k = 0; k < stop_ && v.ends_with(content_); ++k) v.remove_suffix(content_.size());
      t = std::string(v);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

// Replacement character -> ' '; the first token loses one leading space unless the scheme is
// "never" (HF tokenizers' rule).
class Metaspace final : public Decoder {
 public:
  Metaspace(std::string rep, bool strip_first) : rep_(std::move(rep)), strip_first_(strip_first) {}
  void apply(DecodeTokens& d) const override {
    for (size_t i = 0; i < d.tokens.size(); ++i) {
      std::string& t = d.tokens[i];
      std::string out;
      for (size_t pos = 0;;) {
        const size_t f = t.find(rep_, pos);
        out.append(t, pos, f == std::string::npos ? std::string::npos : f - pos);
        if (f == std::string::npos) break;
        out += ' ';
        pos = f + rep_.size();
      }
      if (i == 0 && strip_first_ && out.starts_with(' ')) out.erase(0, 1);
      t.swap(out);
    }
  }

 private:
  std::string rep_;
  bool strip_first_;
};

class Sequence final : public Decoder {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void apply(DecodeTokens& d) const override {
    for (const auto& p : parts_) p->apply(d);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

size_t json_count(const nlohmann::json& j, const char* key, const std::string& where) {
  const auto& v = json_field(j, key, where);
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
    fail("{}.{}: expected a non-negative integer", where, key);
  }
  return v.get<size_t>();
}

}  // namespace

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = json_string(j, "type", where);
  if (type == "ByteLevel") return std::make_unique<ByteLevel>();
  if (type == "ByteFallback") return std::make_unique<ByteFallback>();
  if (type == "Fuse") return std::make_unique<Fuse>();
  if (type == "Replace")
    return std::make_unique<Replace>(json_pattern(j, where), json_string(j, "content", where));
  if (type == "Strip") {
    return std::make_unique<Strip>(json_string(j, "content", where), json_count(j, "start", where),
                                   json_count(j, "stop", where));
  }
  if (type == "Metaspace") {
    const std::string rep = json_string(j, "replacement", where);
    if (rep.empty()) fail("{}.replacement: must not be empty", where);
    bool strip = json_bool(j, "add_prefix_space", true, where);
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string() &&
        j["prepend_scheme"] == "never") {
      strip = false;
    }
    return std::make_unique<Metaspace>(rep, strip);
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> parts;
    const auto& list = json_array(j, "decoders", where);
    for (size_t i = 0; i < list.size(); ++i) {
      auto p = make_decoder(list[i], where + ".decoders[" + std::to_string(i) + "]");
      if (p) parts.push_back(std::move(p));
    }
    return std::make_unique<Sequence>(std::move(parts));
  }
  fail(
      "{}: unsupported decoder type \"{}\" (supported: ByteLevel, ByteFallback, Fuse, Replace, "
      "Strip, Metaspace, Sequence)",
      where, type);
}

}  // namespace tokenmill::text
