// Private: the state behind tokenmill::Tokenizer (built by tokenizer_load.cpp, used by
// tokenizer.cpp). Immutable after loading except the BPE word cache, which locks internally.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/bpe.h"
#include "text/normalizer.h"
#include "text/pretokenizer.h"
#include "text/tokenizer.h"
#include "text/tokenizer_decoder.h"

namespace tokenmill {

namespace text {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool lstrip = false, rstrip = false, single_word = false, normalized = false;
};

// Leftmost-longest matcher over the added tokens' bytes (the reference's DictionarySplitter).
class AddedTokenTrie {
 public:
  void build(const std::vector<AddedToken>& tokens);
  // Longest token starting at text[pos] (index into the token list), or -1.
  int longest_at(std::string_view text, size_t pos) const;
  bool may_start(unsigned char b) const { return first_[b]; }
  bool empty() const { return nodes_.size() <= 1; }

 private:
  struct Node {
    int32_t token = -1;
    std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
  };
  std::vector<Node> nodes_;
  std::array<bool, 256> first_{};
};

// One post-processor template item: either the ids of a special token or the input sequence.
struct TemplateItem {
  bool sequence = false;
  std::vector<int32_t> ids;
};

}  // namespace text

struct Tokenizer::Impl {
  std::string json_path;
  text::VocabMap vocab;                  // model vocabulary + added tokens
  std::vector<std::string> id_to_token;  // "" for unused ids
  std::vector<char> id_used, id_added, id_special, id_skip;
  std::vector<text::AddedToken> added;
  text::AddedTokenTrie trie;
  std::unique_ptr<text::Normalizer> normalizer;
  std::unique_ptr<text::PreTokenizer> pre_tokenizer;
  std::unique_ptr<text::BpeModel> model;
  std::optional<std::vector<text::TemplateItem>> post_template;  // nullopt: no special tokens added
  std::unique_ptr<text::Decoder> decoder;

  std::string bos_token, eos_token;
  std::optional<int32_t> bos_id, eos_id;
  nlohmann::json chat_template;
  std::optional<int64_t> model_max_length;

  void load_tokenizer_json(const std::string& path);
  void load_config(const std::string& path);
};

}  // namespace tokenmill
