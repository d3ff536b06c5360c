// tokenizer.json "decoder" section: ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip and
// Sequence, applied as a chain over token strings like HF's decode_chain.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "text/unicode_regex.h"

namespace tokenmill::text {

struct DecodeTokens {
  std::vector<std::string> tokens;
  std::vector<char>
      added;  // parallel to tokens: an added token's content (ByteLevel keeps it as is)
  RegexScratch regex;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void apply(DecodeTokens& d) const = 0;
};

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, const std::string& where);

}  // namespace tokenmill::text
