// Byte-pair-encoding model of a Hugging Face tokenizer.json ("model": {"type": "BPE"}).
// Merges are applied lowest rank first, leftmost first on ties (HF tokenizers and the reference
// agree on this order); words are cached in a bounded, sharded cache.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tokenmill::text {

// Transparent string hashing so maps keyed by std::string accept std::string_view lookups.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using VocabMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct BpeOptions {
  bool byte_fallback = false;  // unknown characters become <0xXX> byte tokens
  bool ignore_merges = false;  // a word that is itself in the vocabulary is taken whole
  bool fuse_unk = false;       // consecutive unknown tokens of a word fuse into one
  std::optional<int32_t> unk_id;
};

class BpeModel {
 public:
  struct Merge {
    int32_t left, right;  // token ids
  };
  // `vocab` maps every token string to its id (model vocabulary plus added tokens, as the
  // reference sees it). Merges are checked by the caller: both sides and their concatenation exist.
  BpeModel(const VocabMap& vocab, const std::vector<Merge>& merges,
           const std::vector<int32_t>& merged, BpeOptions options);
  ~BpeModel();
  BpeModel(BpeModel&&) noexcept;

  // Appends the ids of one pre-token. `byte_level`: `word` holds raw bytes, each standing for its
  // GPT-2 byte-level character (what a ByteLevel pre-tokenizer would have produced); otherwise
  // `word` is well-formed UTF-8 whose characters are the initial symbols.
  void encode_word(std::string_view word, bool byte_level, std::vector<int32_t>& out) const;

 private:
  struct Symbol {
    int32_t id;      // -1: a character that is not in the vocabulary
    uint32_t start;  // byte range in the word
    uint32_t len;
  };
  struct MergeTable;  // (left, right) -> (rank, merged id), open addressing
  struct Cache;

  void merge_small(std::vector<Symbol>& syms) const;
  void merge_large(std::vector<Symbol>& syms) const;
  void emit(std::string_view word, const std::vector<Symbol>& syms,
            std::vector<int32_t>& out) const;

  const VocabMap& vocab_;
  BpeOptions opt_;
  std::unique_ptr<MergeTable> merges_;
  std::unique_ptr<Cache> cache_;
  std::array<int32_t, 256> byte_level_ids_;  // id of the byte-level character of each byte or -1
  std::array<int32_t, 256> fallback_ids_;    // id of "<0xXX>" or -1
};

}  // namespace tokenmill::text
