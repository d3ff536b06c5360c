// Tokenizer: encode/decode pipeline (added tokens -> normalizer -> pre-tokenizer -> BPE ->
// post-processor; decoder chain), following @lenml/tokenizers' PreTrainedTokenizer.
#include "text/tokenizer.h"

#include <utf8proc.h>

#include <filesystem>

#include "text/tokenizer_impl.h"
#include "text/unicode_utf8.h"
#include "util/error.h"

namespace tokenmill {

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_files(const std::string& tokenizer_json,
                                const std::string& tokenizer_config_json) {
  auto impl = std::make_unique<Impl>();
  impl->load_tokenizer_json(tokenizer_json);
  if (!tokenizer_config_json.empty()) impl->load_config(tokenizer_config_json);
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path json = fs::path(dir) / "tokenizer.json";
  const fs::path config = fs::path(dir) / "tokenizer_config.json";
  std::error_code ec;
  if (!fs::exists(json, ec)) {
    fail("no tokenizer.json in '{}': the model directory must hold a Hugging Face tokenizer.json",
         dir);
  }
  return from_files(json.string(), fs::exists(config, ec) ? config.string() : std::string());
}

namespace {

struct Section {
  size_t b, e;
  int added;  // index into Impl::added, or -1 for text
};

// A word character for single_word added tokens: a letter, a number or '_' (HF's \w).
bool is_word_char(std::string_view s, size_t pos, bool before) {
  size_t start = pos;
  if (before) {
    if (pos == 0) return false;
    start = pos - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  } else if (pos >= s.size()) {
    return false;
  }
  size_t len = 0;
  const char32_t cp = text::decode_utf8(s, start, len);
  if (cp == '_') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

// Splits `text` at added tokens, leftmost-longest. single_word tokens only match between
// non-word characters.
std::vector<Section> split_added(const text::AddedTokenTrie& trie,
                                 const std::vector<text::AddedToken>& added,
                                 std::string_view text) {
  std::vector<Section> secs;
  size_t start = 0;
  if (!trie.empty()) {
    for (size_t i = 0; i < text.size();) {
      if (!trie.may_start(static_cast<unsigned char>(text[i]))) {
        ++i;
        continue;
      }
      const int t = trie.longest_at(text, i);
      if (t < 0 ||
          (added[t].single_word && (is_word_char(text, i, true) ||
                                    is_word_char(text, i + added[t].content.size(), false)))) {
        ++i;
        continue;
      }
      if (i > start) secs.push_back({start, i, -1});
      const size_t e = i + added[t].content.size();
      secs.push_back({i, e, t});
      i = start = e;
    }
  }
  if (start < text.size()) secs.push_back({start, text.size(), -1});
  return secs;
}

}  // namespace

std::vector<int32_t> Tokenizer::encode(std::string_view input, bool add_special_tokens) const {
  const Impl& im = *impl_;
  std::string repaired;
  std::string_view text = input;
  if (!text::is_valid_utf8(input)) {
    text::append_repaired_utf8(input, repaired);
    text = repaired;
  }
  std::vector<Section> secs = split_added(im.trie, im.added, text);
  // lstrip / rstrip trim the neighbouring sections' whitespace (what the reference does; HF
  // tokenizers folds the same whitespace into the token's match).
  for (size_t i = 0; i < secs.size(); ++i) {
    if (secs[i].added < 0) continue;
    const auto& tok = im.added[secs[i].added];
    auto trim = [&](Section& s, bool right) {
      const std::string_view v = text.substr(s.b, s.e - s.b);
      const std::string_view t = right ? text::trim_js_space_right(v) : text::trim_js_space_left(v);
      if (right) {
        s.e = s.b + t.size();
      } else {
        s.b = s.e - t.size();
      }
      // A trimmed added token is no longer that token (e.g. Gemma's "\n\n" next to an lstrip one).
      if (s.added >= 0 && t.size() != v.size()) s.added = -1;
    };
    if (tok.lstrip && i > 0) trim(secs[i - 1], true);
    if (tok.rstrip && i + 1 < secs.size()) trim(secs[i + 1], false);
  }

  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  text::PreTokenized pt;
  std::string norm;
  for (size_t si = 0; si < secs.size(); ++si) {
    const Section& s = secs[si];
    if (s.e <= s.b) continue;
    if (s.added >= 0) {
      ids.push_back(im.added[s.added].id);
      continue;
    }
    std::string_view piece = text.substr(s.b, s.e - s.b);
    if (im.normalizer) {
      norm.assign(piece);
      im.normalizer->apply(norm, pt.regex);
      if (norm.empty()) continue;
      piece = norm;
    }
    pt.pieces.assign(1, piece);
    pt.arena.clear();
    pt.byte_level = false;
    pt.first_section = si == 0;
    if (im.pre_tokenizer) im.pre_tokenizer->apply(pt);
    for (std::string_view p : pt.pieces) im.model->encode_word(p, pt.byte_level, ids);
  }
  if (!im.post_template || !add_special_tokens) return ids;
  std::vector<int32_t> out;
  out.reserve(ids.size() + 4);
  for (const auto& item : *im.post_template) {
    if (item.sequence) {
      out.insert(out.end(), ids.begin(), ids.end());
    } else {
      out.insert(out.end(), item.ids.begin(), item.ids.end());
    }
  }
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& im = *impl_;
  text::DecodeTokens d;
  d.tokens.reserve(ids.size());
  d.added.reserve(ids.size());
  const auto n = static_cast<int64_t>(im.id_to_token.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= n || !im.id_used[id]) continue;
    if (skip_special_tokens && im.id_skip[id]) continue;
    d.tokens.push_back(im.id_to_token[id]);
    d.added.push_back(im.id_added[id]);
  }
  std::string out;
  if (im.decoder) {
    im.decoder->apply(d);
    for (const auto& t : d.tokens) out += t;
  } else {
    for (size_t i = 0; i < d.tokens.size(); ++i) {
      if (i > 0) out += ' ';
      out += d.tokens[i];
    }
  }
  if (!text::is_valid_utf8(out)) {
    std::string fixed;
    text::append_repaired_utf8(out, fixed);
    out.swap(fixed);
  }
  return out;
}

int32_t Tokenizer::vocab_size() const {
  return static_cast<int32_t>(impl_->id_to_token.size());
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->vocab.find(token);
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return "";
  return impl_->id_to_token[id];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->id_special[id] != 0;
}

const std::string& Tokenizer::bos_token() const {
  return impl_->bos_token;
}
const std::string& Tokenizer::eos_token() const {
  return impl_->eos_token;
}
std::optional<int32_t> Tokenizer::bos_id() const {
  return impl_->bos_id;
}
std::optional<int32_t> Tokenizer::eos_id() const {
  return impl_->eos_id;
}
const nlohmann::json& Tokenizer::chat_template_value() const {
  return impl_->chat_template;
}
std::optional<int64_t> Tokenizer::model_max_length() const {
  return impl_->model_max_length;
}

}  // namespace tokenmill
