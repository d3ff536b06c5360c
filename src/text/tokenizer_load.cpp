// Loading tokenizer.json / tokenizer_config.json into Tokenizer::Impl, with every malformed
// input reported as tokenmill::Error naming the file and key.
#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>

#include "text/tokenizer_impl.h"
#include "text/tokenizer_json.h"
#include "text/unicode_utf8.h"
#include "util/error.h"

namespace tokenmill {

namespace {

using nlohmann::json;
using text::json_array;
using text::json_bool;
using text::json_field;
using text::json_string;

// Ids beyond this are rejected: the id -> token table is dense.
constexpr int64_t kMaxId = (int64_t{1} << 24) - 1;

json read_json(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open {} '{}': check that the file exists and is readable", what, path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("cannot read {} '{}'", what, path);
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    fail("{} '{}' is not valid JSON: {}", what, path, e.what());
  }
}

int32_t parse_id(const json& v, const std::string& where) {
  if (!v.is_number_integer()) fail("{}: expected an integer token id", where);
  const int64_t id = v.get<int64_t>();
  if (id < 0 || id > kMaxId) fail("{}: token id {} is out of range (0..{})", where, id, kMaxId);
  return static_cast<int32_t>(id);
}

// A token string from tokenizer_config.json: "text", {"content": "text", ...} or null.
std::string config_token(const json& cfg, const char* key, const std::string& where) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) return json_string(*it, "content", where + "." + key);
  fail("{}.{}: expected a string or an object with \"content\"", where, key);
}

}  // namespace

namespace text {

void AddedTokenTrie::build(const std::vector<AddedToken>& tokens) {
  nodes_.assign(1, Node{});
  first_.fill(false);
  for (size_t t = 0; t < tokens.size(); ++t) {
    const std::string& s = tokens[t].content;
    if (s.empty()) continue;
    first_[static_cast<unsigned char>(s[0])] = true;
    int32_t node = 0;
    for (char ch : s) {
      const auto b = static_cast<unsigned char>(ch);
      auto& kids = nodes_[node].children;
      auto it = std::lower_bound(kids.begin(), kids.end(), b,
                                 [](const auto& p, unsigned char x) { return p.first < x; });
      if (it != kids.end() && it->first == b) {
        node = it->second;
      } else {
        const auto child = static_cast<int32_t>(nodes_.size());
        kids.insert(it, {b, child});
        nodes_.emplace_back();
        node = child;
      }
    }
    nodes_[node].token =
        static_cast<int32_t>(t);  // a later duplicate wins, like the reference's map
  }
}

int AddedTokenTrie::longest_at(std::string_view text, size_t pos) const {
  int32_t node = 0;
  int best = -1;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto b = static_cast<unsigned char>(text[i]);
    const auto& kids = nodes_[node].children;
    auto it = std::lower_bound(kids.begin(), kids.end(), b,
                               [](const auto& p, unsigned char x) { return p.first < x; });
    if (it == kids.end() || it->first != b) break;
    node = it->second;
    if (nodes_[node].token >= 0) best = nodes_[node].token;
  }
  return best;
}

}  // namespace text

void Tokenizer::Impl::load_tokenizer_json(const std::string& path) {
  json_path = path;
  const json root = read_json(path, "tokenizer.json");
  try {
    if (!root.is_object()) fail("{}: expected a JSON object at the top level", path);
    const json& m = json_field(root, "model", path);
    const std::string mw = path + ": model";
    std::string type = m.is_object() && m.contains("type") && m["type"].is_string()
                           ? m["type"].get<std::string>()
                           : "";
    if (type.empty() && m.is_object() && m.contains("merges") && m.contains("vocab")) type = "BPE";
    if (type != "BPE") {
      fail("{}: unsupported model type \"{}\": tokenmill supports BPE tokenizers only", mw, type);
    }
    const json& jv = json_field(m, "vocab", mw);
    if (!jv.is_object()) fail("{}.vocab: expected an object mapping tokens to ids", mw);
    int64_t max_id = -1;
    vocab.reserve(jv.size() + 1024);
    for (auto it = jv.begin(); it != jv.end(); ++it) {
      const int32_t id = parse_id(it.value(), mw + ".vocab[\"" + it.key() + "\"]");
      if (!text::is_valid_utf8(it.key())) fail("{}.vocab: a token is not valid UTF-8", mw);
      vocab[it.key()] = id;
      max_id = std::max<int64_t>(max_id, id);
    }
    // Added tokens: matched in the input before anything else, and part of the vocabulary.
    if (root.contains("added_tokens") && !root["added_tokens"].is_null()) {
      const json& at = json_array(root, "added_tokens", path);
      for (size_t i = 0; i < at.size(); ++i) {
        const std::string w = path + ": added_tokens[" + std::to_string(i) + "]";
        text::AddedToken t;
        t.content = json_string(at[i], "content", w);
        if (!text::is_valid_utf8(t.content)) fail("{}.content: not valid UTF-8", w);
        t.id = parse_id(json_field(at[i], "id", w), w + ".id");
        t.special = json_bool(at[i], "special", false, w);
        t.lstrip = json_bool(at[i], "lstrip", false, w);
        t.rstrip = json_bool(at[i], "rstrip", false, w);
        t.single_word = json_bool(at[i], "single_word", false, w);
        t.normalized = json_bool(at[i], "normalized", false, w);
        vocab[t.content] = t.id;
        max_id = std::max<int64_t>(max_id, t.id);
        added.push_back(std::move(t));
      }
    }
    const size_t n = static_cast<size_t>(max_id + 1);
    if (n > 4 * vocab.size() + 65536) {
      fail("{}: token ids are sparse (largest {} for {} tokens); tokenmill needs dense ids", path,
           max_id, vocab.size());
    }
    id_to_token.assign(n, std::string());
    id_used.assign(n, 0);
    id_added.assign(n, 0);
    id_special.assign(n, 0);
    id_skip.assign(n, 0);
    for (auto it = jv.begin(); it != jv.end(); ++it) {
      const auto id = static_cast<size_t>(it.value().get<int64_t>());
      id_to_token[id] = it.key();
      id_used[id] = 1;
    }
    for (const auto& t : added) {
      id_to_token[t.id] = t.content;
      id_used[t.id] = 1;
      id_added[t.id] = 1;
      id_special[t.id] = t.special ? 1 : 0;
      id_skip[t.id] = t.special ? 1 : 0;
    }
    trie.build(added);

    // BPE merges: "a b" strings or [a, b] pairs; both sides and their concatenation must exist.
    const json& jm = json_array(m, "merges", mw);
    std::vector<text::BpeModel::Merge> merges;
    std::vector<int32_t> merged;
    merges.reserve(jm.size());
    merged.reserve(jm.size());
    auto lookup = [&](const std::string& tok, size_t r) {
      auto it = vocab.find(tok);
      if (it == vocab.end()) {
        fail(
            "{}.merges[{}]: token \"{}\" is not in the vocabulary (tokenizer.json is inconsistent)",
            mw, r, tok);
      }
      return it->second;
    };
    for (size_t r = 0; r < jm.size(); ++r) {
      std::string a, b;
      if (jm[r].is_string()) {
        const std::string s = jm[r].get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
          fail("{}.merges[{}]: expected \"left right\" with exactly one space, got \"{}\"", mw, r,
               s);
        }
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (jm[r].is_array() && jm[r].size() == 2 && jm[r][0].is_string() &&
                 jm[r][1].is_string()) {
        a = jm[r][0].get<std::string>();
        b = jm[r][1].get<std::string>();
      } else {
        fail("{}.merges[{}]: expected a \"left right\" string or a [left, right] pair", mw, r);
      }
      merges.push_back({lookup(a, r), lookup(b, r)});
      merged.push_back(lookup(a + b, r));
    }
    text::BpeOptions opt;
    opt.byte_fallback = json_bool(m, "byte_fallback", false, mw);
    opt.ignore_merges = json_bool(m, "ignore_merges", false, mw);
    opt.fuse_unk = json_bool(m, "fuse_unk", false, mw);
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (m.contains(key) && !m[key].is_null() &&
          !(m[key].is_string() && m[key].get<std::string>().empty())) {
        fail("{}.{}: not supported (tokenmill's BPE has no subword prefix/suffix)", mw, key);
      }
    }
    if (m.contains("unk_token") && m["unk_token"].is_string()) {
      auto it = vocab.find(m["unk_token"].get<std::string>());
      if (it != vocab.end()) opt.unk_id = it->second;
    }
    model = std::make_unique<text::BpeModel>(vocab, merges, merged, opt);

    normalizer = text::make_normalizer(root.value("normalizer", json()), path + ": normalizer");
    pre_tokenizer =
        text::make_pre_tokenizer(root.value("pre_tokenizer", json()), path + ": pre_tokenizer");
    decoder = text::make_decoder(root.value("decoder", json()), path + ": decoder");

    // Post-processor: only templates add ids; ByteLevel post-processors only touch offsets.
    const json post = root.value("post_processor", json());
    const std::string pw = path + ": post_processor";
    std::vector<json> procs;
    if (!post.is_null()) {
      if (json_string(post, "type", pw) == "Sequence") {
        for (const auto& p : json_array(post, "processors", pw)) procs.push_back(p);
      } else {
        procs.push_back(post);
      }
    }
    for (const json& p : procs) {
      const std::string ptype = json_string(p, "type", pw);
      if (ptype == "ByteLevel") continue;
      std::vector<text::TemplateItem> items;
      auto special_ids = [&](const std::string& name) {
        if (ptype == "TemplateProcessing" && p.contains("special_tokens") &&
            p["special_tokens"].contains(name)) {
          const json& st = p["special_tokens"][name];
          std::vector<int32_t> ids;
          for (const auto& v : json_array(st, "ids", pw + ".special_tokens"))
            ids.push_back(parse_id(v, pw));
          return ids;
        }
        auto it = vocab.find(name);
        if (it == vocab.end()) fail("{}: special token \"{}\" is not in the vocabulary", pw, name);
        return std::vector<int32_t>{it->second};
      };
      if (ptype == "TemplateProcessing") {
        for (const json& item : json_array(p, "single", pw)) {
          if (item.contains("SpecialToken")) {
            items.push_back(
                {false, special_ids(json_string(item["SpecialToken"], "id", pw + ".single"))});
          } else if (item.contains("Sequence")) {
            items.push_back({true, {}});
          } else {
            fail("{}.single: expected SpecialToken or Sequence items", pw);
          }
        }
      } else if (ptype == "BertProcessing" || ptype == "RobertaProcessing") {
        const json& cls = json_field(p, "cls", pw);
        const json& sep = json_field(p, "sep", pw);
        if (!cls.is_array() || cls.empty() || !sep.is_array() || sep.empty() ||
            !cls[0].is_string() || !sep[0].is_string()) {
          fail("{}: cls and sep must be [token, id] pairs", pw);
        }
        items = {{false, special_ids(cls[0].get<std::string>())},
                 {true, {}},
                 {false, special_ids(sep[0].get<std::string>())}};
      } else {
        fail(
            "{}: unsupported post_processor type \"{}\" (supported: TemplateProcessing, ByteLevel, "
            "BertProcessing, RobertaProcessing, Sequence)",
            pw, ptype);
      }
      post_template = std::move(items);
    }
  } catch (const json::exception& e) {
    fail("{}: unexpected structure: {}", path, e.what());
  }
}

void Tokenizer::Impl::load_config(const std::string& path) {
  const json cfg = read_json(path, "tokenizer_config.json");
  try {
    if (!cfg.is_object()) fail("{}: expected a JSON object at the top level", path);
    bos_token = config_token(cfg, "bos_token", path);
    eos_token = config_token(cfg, "eos_token", path);
    auto id_of = [&](const std::string& t) -> std::optional<int32_t> {
      if (t.empty()) return std::nullopt;
      auto it = vocab.find(t);
      return it == vocab.end() ? std::nullopt : std::optional<int32_t>(it->second);
    };
    bos_id = id_of(bos_token);
    eos_id = id_of(eos_token);
    if (cfg.contains("chat_template")) chat_template = cfg["chat_template"];
    if (cfg.contains("model_max_length")) {
      const json& v = cfg["model_max_length"];
      const bool fits =
          v.is_number_integer() &&
          !(v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX));
      if (fits) model_max_length = v.get<int64_t>();
    }
    // skip_special_tokens also drops the config's additional special tokens (as the reference).
    if (cfg.contains("additional_special_tokens") && cfg["additional_special_tokens"].is_array()) {
      for (const json& t : cfg["additional_special_tokens"]) {
        std::string s = t.is_string() ? t.get<std::string>()
                        : t.is_object() && t.contains("content") && t["content"].is_string()
                            ? t["content"].get<std::string>()
                            : std::string();
        if (auto id = id_of(s)) id_skip[*id] = 1;
      }
    }
  } catch (const json::exception& e) {
    fail("{}: unexpected structure: {}", path, e.what());
  }
}

}  // namespace tokenmill
