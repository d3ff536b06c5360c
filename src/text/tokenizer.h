// Tokenizer: a Hugging Face tokenizer.json (+ optional tokenizer_config.json) run natively.
// Exact against @lenml/tokenizers (transformers.js) for the Qwen3, Llama 3, Gemma 3, DeepSeek V3,
// GPT-OSS and SentencePiece-BPE tokenizers (tests/unit/text/test_tokenizer.cpp).
//
// Bytes in, bytes out: encode() takes UTF-8; ill-formed input is first repaired the way a
// JavaScript caller would see it (WHATWG decoding: each maximal ill-formed subpart becomes
// U+FFFD), so the ids equal the reference's ids for TextDecoder().decode(bytes). decode() always
// returns well-formed UTF-8 (byte sequences that do not form UTF-8 become U+FFFD).
// All const methods are safe to call from several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tokenmill {

class Tokenizer {
 public:
  // dir holds tokenizer.json and optionally tokenizer_config.json. Throws tokenmill::Error naming
  // the file and problem.
  static Tokenizer from_dir(const std::string& dir);
  static Tokenizer from_files(const std::string& tokenizer_json,
                              const std::string& tokenizer_config_json /* "" = none */);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Added-token strings in `text` (special or not) become their ids. add_special_tokens applies
  // the post-processor's template (e.g. a BOS for Gemma 3); ByteLevel post-processors add none.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // Ids out of range are skipped. skip_special_tokens drops special added tokens and the
  // config's additional_special_tokens. No clean_up_tokenization_spaces is applied.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;
  int32_t vocab_size() const;  // largest id + 1, added tokens included
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(int32_t id) const;  // the vocabulary string ("" if out of range)
  bool is_special(int32_t id) const;          // added token with special=true
  // From tokenizer_config.json (empty / nullopt when absent): bos/eos token strings and ids, the
  // raw chat_template JSON value (string or list of {name, template}; null when absent),
  // model_max_length (nullopt when absent or not an integer below 2^63).
  const std::string& bos_token() const;
  const std::string& eos_token() const;
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  const nlohmann::json& chat_template_value() const;
  std::optional<int64_t> model_max_length() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tokenmill
