// generation_config.json defaults: reading (a temporary model directory), validation messages,
// and the priority request > per-model settings > generation_config > built-in.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "server/generation_config.h"
#include "server/settings.h"
#include "util/error.h"

namespace tokenmill::server {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class ModelDir {
 public:
  ModelDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() /
            ("tm_genconfig_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~ModelDir() { fs::remove_all(path_); }
  void write(const std::string& text) const {
    std::ofstream(path_ / "generation_config.json") << text;
  }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

std::string error_of(const std::string& text) {
  try {
    parse_generation_config(text, "/m/generation_config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(GenerationConfig, ReadsSamplingEosAndLength) {
  ModelDir dir;
  dir.write(R"({"bos_token_id": null, "eos_token_id": [12232, 12230], "pad_token_id": 12230,
                "do_sample": true, "temperature": 0.7, "top_p": 0.9, "top_k": 20,
                "min_p": 0.05, "repetition_penalty": 1.1, "max_new_tokens": 300,
                "max_length": 20, "transformers_version": "4.57.0"})");
  GenerationConfig gc = load_generation_config(dir.path());
  EXPECT_THAT(gc.file, HasSubstr("generation_config.json"));
  EXPECT_FLOAT_EQ(gc.sampling.temperature.value(), 0.7f);
  EXPECT_FLOAT_EQ(gc.sampling.top_p.value(), 0.9f);
  EXPECT_EQ(gc.sampling.top_k.value(), 20);
  EXPECT_FLOAT_EQ(gc.sampling.min_p.value(), 0.05f);
  EXPECT_FLOAT_EQ(gc.sampling.repetition_penalty.value(), 1.1f);
  EXPECT_FALSE(gc.sampling.presence_penalty.has_value());
  EXPECT_THAT(gc.eos_token_ids, ElementsAre(12232, 12230));
  EXPECT_EQ(gc.max_new_tokens.value(), 300);
}

TEST(GenerationConfig, MissingFileAndSingleEos) {
  ModelDir dir;
  GenerationConfig none = load_generation_config(dir.path());
  EXPECT_TRUE(none.file.empty());
  EXPECT_FALSE(none.sampling.temperature.has_value());
  EXPECT_TRUE(none.eos_token_ids.empty());
  dir.write(R"({"eos_token_id": 2, "top_k": 40.0})");
  GenerationConfig gc = load_generation_config(dir.path());
  EXPECT_THAT(gc.eos_token_ids, ElementsAre(2));
  EXPECT_EQ(gc.sampling.top_k.value(), 40);
}

TEST(GenerationConfig, DoSampleFalseMeansGreedy) {
  // transformers ignores temperature when do_sample is false.
  GenerationConfig gc = parse_generation_config(R"({"do_sample": false, "temperature": 0.6})", "g");
  EXPECT_FLOAT_EQ(gc.sampling.temperature.value(), 0.0f);
}

TEST(GenerationConfig, BadValuesNameFileKeyAndValue) {
  EXPECT_THAT(error_of(R"({"temperature": -1})"), AllOf(HasSubstr("/m/generation_config.json"),
                                                        HasSubstr("temperature"), HasSubstr("-1")));
  EXPECT_THAT(error_of(R"({"top_p": 0})"), AllOf(HasSubstr("top_p"), HasSubstr("(0, 1]")));
  EXPECT_THAT(error_of(R"({"top_k": 2.5})"), AllOf(HasSubstr("top_k"), HasSubstr("integer")));
  EXPECT_THAT(error_of(R"({"temperature": "hot"})"), HasSubstr("\"hot\""));
  EXPECT_THAT(error_of(R"({"eos_token_id": ["x"]})"), HasSubstr("eos_token_id"));
  EXPECT_THAT(error_of(R"({"do_sample": 1})"), HasSubstr("do_sample"));
  EXPECT_THAT(error_of("{"), HasSubstr("invalid JSON"));
  EXPECT_EQ(error_of(R"({"temperature": null, "unknown_key": 5})"), "");
}

TEST(GenerationConfig, PriorityRequestThenSettingsThenFileThenBuiltIn) {
  SamplingDefaults file;
  file.temperature = 0.7f;
  file.top_p = 0.9f;
  file.top_k = 20;
  file.repetition_penalty = 1.1f;
  SamplingDefaults settings;
  settings.temperature = 0.3f;
  settings.min_p = 0.1f;
  GenerationPlan plan;
  plan.top_p = 0.5f;

  SamplingParams p = resolve_sampling(plan, settings, file);
  EXPECT_FLOAT_EQ(p.temperature, 0.3f);         // settings over the file
  EXPECT_FLOAT_EQ(p.top_p, 0.5f);               // the request over the file
  EXPECT_EQ(p.top_k, 20);                       // the file
  EXPECT_FLOAT_EQ(p.repetition_penalty, 1.1f);  // the file
  EXPECT_FLOAT_EQ(p.min_p, 0.1f);               // settings
  EXPECT_FLOAT_EQ(p.presence_penalty, 0.0f);    // built-in
  EXPECT_FLOAT_EQ(p.frequency_penalty, 0.0f);

  plan.temperature = 0.0f;  // a request value of 0 is a value, not "unset"
  plan.top_k = 0;
  p = resolve_sampling(plan, settings, file);
  EXPECT_FLOAT_EQ(p.temperature, 0.0f);
  EXPECT_EQ(p.top_k, 0);

  p = resolve_sampling(GenerationPlan{}, SamplingDefaults{}, SamplingDefaults{});
  EXPECT_FLOAT_EQ(p.temperature, 1.0f);  // built-in
  EXPECT_FLOAT_EQ(p.top_p, 1.0f);
  EXPECT_EQ(p.top_k, 0);
  EXPECT_FLOAT_EQ(p.repetition_penalty, 1.0f);
}

}  // namespace
}  // namespace tokenmill::server
