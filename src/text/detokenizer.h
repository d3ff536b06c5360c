// Incremental detokenizer: turns a stream of generated token ids into text chunks that are
// final (never revised), valid UTF-8, and free of stop strings.
//
// Technique (works with any decoder, byte-level BPE or SentencePiece with byte fallback): keep a
// small window of recent ids and two offsets into it, prefix (p) and read (r). The text of
// ids[p, r) was already emitted; decoding ids[p, n) and removing that prefix gives the new text.
// It is emitted only when it is longer than the prefix and does not end in an unfinished
// character (U+FFFD or a truncated UTF-8 sequence), then p = r and r = n. Keeping the tokens
// [p, r) as context makes decoders that look at neighbours (the SentencePiece leading-space strip)
// agree with a one-shot decode. Each push decodes O(window) tokens, never the whole sequence.
//
// Stop strings are matched on the finalized text: the longest suffix that could still begin a
// stop string is held back, so stops spanning token boundaries are found, the stop text itself is
// never emitted and no text before it is lost.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tokenmill {

// Decodes ids to text, like Tokenizer::decode(ids, skip_special_tokens).
using DecodeFn = std::function<std::string(std::span<const int32_t> ids, bool skip_special_tokens)>;

namespace detok {
// True when s is well-formed UTF-8 (no overlongs, surrogates or code points above U+10FFFF).
bool is_valid_utf8(std::string_view s);
// Length in bytes (0..3) of a truncated but so far well-formed sequence at the end of s: the bytes
// a later continuation could still complete.
size_t incomplete_utf8_tail(std::string_view s);
// s with every maximal ill-formed subpart replaced by U+FFFD (what Rust's from_utf8_lossy and
// Hugging Face decode do).
std::string utf8_lossy(std::string_view s);
}  // namespace detok

class IncrementalDetokenizer {
 public:
  // `tokenizer` (a Tokenizer, or anything with the same decode(ids, skip_special_tokens)) must
  // outlive this object. `prompt_tail`: the prompt's last few ids (about 4-6), decoded as context
  // only, so the first generated token is decoded as it would be mid-text (SentencePiece decoders
  // strip the leading space of a decode's first token).
  template <typename Tok>
  requires requires(const Tok& t, std::span<const int32_t> ids) {
    { t.decode(ids, true) } -> std::convertible_to<std::string>;
  }
  IncrementalDetokenizer(const Tok& tokenizer, bool skip_special_tokens,
                         std::vector<std::string> stop_strings = {},
                         std::span<const int32_t> prompt_tail = {})
      : IncrementalDetokenizer(
            DecodeFn([&tokenizer](std::span<const int32_t> ids, bool skip) -> std::string {
              return tokenizer.decode(ids, skip);
            }),
            skip_special_tokens, std::move(stop_strings), prompt_tail) {}
  // The same with any decode function (tests, other tokenizers).
  IncrementalDetokenizer(DecodeFn decode, bool skip_special_tokens,
                         std::vector<std::string> stop_strings = {},
                         std::span<const int32_t> prompt_tail = {});

  // Adds one generated id; returns the text that became final (often empty). After a stop string
  // matched, further ids are ignored and "" is returned.
  std::string push(int32_t id);
  // Adds several ids (e.g. accepted speculative tokens); returns the concatenated new text.
  std::string push(std::span<const int32_t> ids);
  // End of stream: returns all held text. An unfinished UTF-8 sequence at the very end becomes
  // U+FFFD, as a one-shot decode does. Later calls to push/finish return "".
  std::string finish();

  // True once a stop string matched.
  bool stopped() const { return stop_index_ >= 0; }
  // Index into the stop strings given at construction of the one that matched, or -1.
  int stop_index() const { return stop_index_; }
  // The stop string that matched, or "".
  std::string_view stop_string() const;
  // Number of generated ids pushed so far (ids pushed after a stop are not counted).
  size_t num_tokens() const { return num_tokens_; }

 private:
  std::string decode_range(size_t begin, size_t end) const;
  // Advances the token window with the id just appended; returns newly stable text.
  std::string step();
  // Splits the held tokens when they have been held too long (text ending in U+FFFD that never
  // resolves); returns the text released, if any.
  std::string force_split(const std::string& full);
  // Moves p and r, dropping ids before p from the window.
  void advance(size_t new_p, size_t new_r, std::string prefix_text);
  // Runs stop matching over new final text; returns what may be emitted.
  std::string apply_stops(std::string text, bool at_end);

  DecodeFn decode_;
  bool skip_special_;
  std::vector<std::string> stops_;  // non-empty stop strings, in the caller's order
  std::vector<int> stop_orig_index_;
  std::vector<int32_t> ids_;  // window: ids_[p_, r_) decoded as prefix_text_, [r_, end) held
  size_t p_ = 0, r_ = 0;
  std::string prefix_text_;
  std::string pending_;  // final text held back because it may begin a stop string
  int stop_index_ = -1;
  bool finished_ = false;
  size_t num_tokens_ = 0;
};

}  // namespace tokenmill
