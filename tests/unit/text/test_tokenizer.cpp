// Exactness of tokenmill::Tokenizer against @lenml/tokenizers: every corpus string of every
// family must give the reference's ids, decode like the reference, and add special tokens like
// it. Fixtures: tests/fixtures/tokenizer (regenerate with `node tools/gen_tokenizer_fixtures.mjs`).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "text/tokenizer.h"
#include "text/unicode_utf8.h"
#include "util/error.h"

namespace tokenmill {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kFixtures = fs::path(TM_SOURCE_DIR) / "tests/fixtures/tokenizer";

std::vector<std::string> read_lines(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open fixture " + p.string());
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

struct CorpusEntry {
  std::string bytes;     // what the C++ API is given
  std::string expected;  // the string the reference saw (bytes after WHATWG UTF-8 repair)
};

std::vector<CorpusEntry> load_corpus() {
  std::vector<CorpusEntry> out;
  for (const auto& line : read_lines(kFixtures / "corpus.jsonl")) {
    const json j = json::parse(line);
    CorpusEntry e;
    if (j.is_string()) {
      e.bytes = j.get<std::string>();
    } else {
      const std::string hex = j.at("hex").get<std::string>();
      for (size_t i = 0; i + 1 < hex.size(); i += 2)
        e.bytes.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
    }
    text::append_repaired_utf8(e.bytes, e.expected);
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<int32_t> decode_b94(std::string_view s) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 2 < s.size(); i += 3) {
    ids.push_back((s[i] - 33) * 94 * 94 + (s[i + 1] - 33) * 94 + (s[i + 2] - 33));
  }
  return ids;
}

std::string show(const std::vector<int32_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < 40; ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + (v.size() > 40 ? ",..." : "");
}

struct Family {
  json header;
  std::vector<char> roundtrip;
  std::vector<std::vector<int32_t>> ids;
  std::map<size_t, std::string> decodes;  // reference decode of strings that do not round-trip
};

Family load_family(const std::string& name) {
  Family f;
  const auto lines = read_lines(kFixtures / (name + ".ids"));
  f.header = json::parse(lines.at(0));
  for (size_t i = 1; i < lines.size(); ++i) {
    f.roundtrip.push_back(lines[i].at(0) == '1');
    f.ids.push_back(decode_b94(std::string_view(lines[i]).substr(1)));
  }
  for (const auto& line : read_lines(kFixtures / (name + ".decode.jsonl"))) {
    const json j = json::parse(line);
    f.decodes[j.at("i").get<size_t>()] = j.at("d").get<std::string>();
  }
  return f;
}

Tokenizer load_reference_tokenizer(const json& header) {
  const fs::path root(TM_SOURCE_DIR);
  const fs::path tj = root / header.at("tokenizer").get<std::string>();
  if (!fs::exists(tj)) {
    throw std::runtime_error(tj.string() + " is missing: run `npm ci` in the repository root");
  }
  return Tokenizer::from_files(tj.string(),
                               (root / header.at("config").get<std::string>()).string());
}

class TokenizerExactness : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerExactness, MatchesReferenceOnCorpus) {
  const auto corpus = load_corpus();
  ASSERT_GE(corpus.size(), 2000u);
  const Family f = load_family(GetParam());
  ASSERT_EQ(f.ids.size(), corpus.size()) << "fixture and corpus disagree: regenerate both";
  const Tokenizer tok = load_reference_tokenizer(f.header);

  size_t id_bad = 0, decode_bad = 0, roundtrips = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    const auto ids = tok.encode(corpus[i].bytes);
    if (ids != f.ids[i]) {
      if (++id_bad <= 5) {
        ADD_FAILURE() << GetParam() << " string " << i << " " << json(corpus[i].expected).dump()
                      << "\n  expected " << show(f.ids[i]) << "\n  actual   " << show(ids);
      }
      continue;
    }
    const std::string back = tok.decode(ids);
    const std::string& want = f.roundtrip[i] ? corpus[i].expected : f.decodes.at(i);
    roundtrips += f.roundtrip[i];
    if (back != want && ++decode_bad <= 5) {
      ADD_FAILURE() << GetParam() << " decode of string " << i << "\n  expected "
                    << json(want).dump() << "\n  actual   " << json(back).dump();
    }
  }
  EXPECT_EQ(id_bad, 0u) << "strings whose ids differ from the reference";
  EXPECT_EQ(decode_bad, 0u) << "strings whose decode differs from the reference";
  EXPECT_GT(roundtrips, corpus.size() / 2);

  // add_special_tokens=true: the post-processor's template, as the reference applies it.
  for (const auto& item : f.header.at("special")) {
    const size_t i = item.at(0).get<size_t>();
    EXPECT_EQ(tok.encode(corpus.at(i).bytes, true), item.at(1).get<std::vector<int32_t>>())
        << "string " << i;
  }
  // skip_special_tokens=true.
  ASSERT_FALSE(f.header.at("skip").empty());
  for (const auto& item : f.header.at("skip")) {
    const size_t i = item.at(0).get<size_t>();
    EXPECT_EQ(tok.decode(f.ids.at(i), true), item.at(1).get<std::string>()) << "string " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, TokenizerExactness,
                         ::testing::Values("qwen3", "llama3", "gemma3", "deepseek_v3", "gptoss",
                                           "llama2", "spm_legacy", "spm_metaspace"));

// Every fixture family present is in the list above.
TEST(TokenizerFixtures, AllFamiliesAreTested) {
  std::set<std::string> tested{"qwen3",  "llama3", "gemma3",     "deepseek_v3",
                               "gptoss", "llama2", "spm_legacy", "spm_metaspace"};
  for (const auto& e : fs::directory_iterator(kFixtures)) {
    if (e.path().extension() == ".ids") {
      EXPECT_TRUE(tested.count(e.path().stem().string())) << e.path() << " has no test";
    }
  }
}

}  // namespace
}  // namespace tokenmill
