#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "server/settings.h"
#include "util/error.h"

namespace tokenmill::server {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

// The error message parse_settings gives for `text`, or "" when it parses.
std::string error_of(const std::string& text, const std::string& file = "s.json") {
  try {
    parse_settings(text, file);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("tm_settings_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name) << text;
    return (path_ / name).string();
  }
  const fs::path& path() const { return path_; }

 private:
  static int& counter() {
    static int c = 0;
    return c;
  }
  fs::path path_;
};

TEST(Settings, DefaultsWhenEmpty) {
  Settings s = parse_settings("{}", "s.json");
  EXPECT_EQ(s.server.host, "127.0.0.1");
  EXPECT_EQ(s.server.port, 8000);
  EXPECT_TRUE(s.auth.api_key.empty());
  EXPECT_TRUE(s.models.empty());
}

TEST(Settings, FullFileParses) {
  Settings s = parse_settings(R"({
    "server": {"host": "0.0.0.0", "port": 9000, "threads": 8, "keepalive_interval_ms": 250,
               "max_body_bytes": 4096, "request_timeout_s": 30},
    "auth": {"api_key": "sk-1"},
    "limits": {"max_seqs": 4, "max_queue": 10, "max_step_tokens": 128, "prefill_chunk": 64,
               "prefer_decode": false, "overlap_steps": false, "max_n": 2},
    "cache": {"memory_budget_mb": 512, "kv_block_size": 32, "prefix_cache": false},
    "models": ["/m/a", {"path": "/m/b", "name": "bee", "context_window": 4096,
               "max_output_tokens": 1024, "sampling": {"temperature": 0.6, "top_k": 20},
               "thinking": {"enabled": false, "budget_tokens": 100},
               "speculative": {"enabled": false}, "kv_cache_dtype": "bf16",
               "pinned": true, "default": true}]
  })",
                              "/etc/s.json");
  EXPECT_EQ(s.server.port, 9000);
  EXPECT_EQ(s.server.keepalive_interval_ms, 250);
  EXPECT_EQ(s.auth.api_key, "sk-1");
  EXPECT_EQ(s.limits.prefill_chunk, 64);
  EXPECT_FALSE(s.limits.prefer_decode);
  EXPECT_FALSE(s.limits.overlap_steps);
  EXPECT_TRUE(Settings{}.limits.overlap_steps);
  EXPECT_FALSE(s.cache.prefix_cache);
  ASSERT_EQ(s.models.size(), 2u);
  EXPECT_EQ(s.models[0].name, "a");
  EXPECT_EQ(s.models[1].name, "bee");
  EXPECT_EQ(s.models[1].context_window, 4096);
  EXPECT_FLOAT_EQ(*s.models[1].sampling.temperature, 0.6f);
  EXPECT_EQ(*s.models[1].sampling.top_k, 20);
  EXPECT_FALSE(s.models[1].thinking);
  EXPECT_EQ(s.models[1].thinking_budget, 100);
  EXPECT_FALSE(s.models[1].speculative);
  EXPECT_EQ(s.models[1].kv_cache_dtype, "bf16");
  EXPECT_EQ(s.models[0].kv_cache_dtype, "auto");
  EXPECT_TRUE(s.models[1].pinned);
  EXPECT_EQ(s.default_model, "bee");
  EXPECT_EQ(s.find_model("")->name, "bee");
  EXPECT_EQ(s.find_model("a")->path, "/m/a");
  EXPECT_EQ(s.find_model("zzz"), nullptr);
}

// A cache budget left out is sized for the device: on the CPU 2048 MiB of KV blocks plus the
// state slots, on a GPU 90% of the
// free memory less the scratch reserve, split between the models, never below 512 MiB; a given
// budget is used as is.
TEST(Settings, CacheBudgetFollowsTheDeviceWhenLeftOut) {
  const Settings none = parse_settings(R"({})", "");
  constexpr int64_t GiB = int64_t{1} << 30, MiB = int64_t{1} << 20;
  const CacheBudget cpu = cache_budget_for(none.cache, -1, 2);
  EXPECT_TRUE(cpu.automatic);
  EXPECT_EQ(cpu.bytes, 2048 * MiB);
  const int64_t free_b = 100 * GiB;
  const CacheBudget one = cache_budget_for(none.cache, free_b, 1);
  EXPECT_TRUE(one.automatic);
  EXPECT_EQ(one.bytes, free_b / 10 * 9 - kGpuScratchReserve);
  EXPECT_EQ(cache_budget_for(none.cache, free_b, 3).bytes,
            (free_b / 10 * 9 - kGpuScratchReserve) / 3);
  EXPECT_EQ(cache_budget_for(none.cache, 2 * GiB, 1).bytes, 512 * MiB) << "the floor";
  const Settings given = parse_settings(R"({"cache": {"memory_budget_mb": 4096}})", "");
  for (int64_t dev : {int64_t{-1}, free_b}) {
    const CacheBudget g = cache_budget_for(given.cache, dev, 2);
    EXPECT_FALSE(g.automatic);
    EXPECT_EQ(g.bytes, 4096 * MiB);
  }
  // An engine's budget: on the CPU the automatic 2 GiB are KV blocks, and the state slots of
  // max_seqs sequences come on top (16 of a 27B model's 150 MB: more than the 2 GiB alone);
  // a GPU's or a given budget covers both.
  constexpr int64_t kState27B = 156893184;
  EXPECT_EQ(engine_cache_bytes(cpu, true, 16, kState27B), 2048 * MiB + 16 * kState27B);
  EXPECT_EQ(engine_cache_bytes(one, false, 16, kState27B), one.bytes);
  EXPECT_EQ(engine_cache_bytes(cache_budget_for(given.cache, -1, 1), true, 16, kState27B),
            4096 * MiB);
}

// Step sizes left out are sized for the device; given ones are kept, and a value given alone
// adjusts the automatic other so that a prefill chunk fits in a step.
TEST(Settings, StepLimitsFollowTheDeviceWhenLeftOut) {
  const Settings none = parse_settings(R"({})", "");
  const StepLimits cpu = step_limits_for(none.limits, false);
  const StepLimits gpu = step_limits_for(none.limits, true);
  EXPECT_EQ(cpu.max_step_tokens, 512);
  EXPECT_EQ(cpu.prefill_chunk, 256);
  EXPECT_EQ(gpu.max_step_tokens, 2048);
  EXPECT_EQ(gpu.prefill_chunk, 1024);
  EXPECT_TRUE(gpu.auto_step && gpu.auto_chunk);

  const Settings both =
      parse_settings(R"({"limits": {"max_step_tokens": 128, "prefill_chunk": 64}})", "");
  const StepLimits b = step_limits_for(both.limits, true);
  EXPECT_EQ(b.max_step_tokens, 128);
  EXPECT_EQ(b.prefill_chunk, 64);
  EXPECT_FALSE(b.auto_step || b.auto_chunk);

  const Settings chunk = parse_settings(R"({"limits": {"prefill_chunk": 4096}})", "");
  const StepLimits c = step_limits_for(chunk.limits, false);
  EXPECT_EQ(c.prefill_chunk, 4096);
  EXPECT_EQ(c.max_step_tokens, 4096) << "the automatic step budget grows to hold the chunk";

  const Settings step = parse_settings(R"({"limits": {"max_step_tokens": 300}})", "");
  const StepLimits st = step_limits_for(step.limits, true);
  EXPECT_EQ(st.max_step_tokens, 300);
  EXPECT_EQ(st.prefill_chunk, 300) << "the automatic chunk is capped by the step budget";
}

TEST(Settings, RelativeModelPathsFollowTheFile) {
  Settings s = parse_settings(R"({"models": ["../models/demo"]})", "/home/u/.tokenmill/s.json");
  EXPECT_EQ(s.models[0].path, "/home/u/models/demo");
  EXPECT_EQ(s.models[0].name, "demo");
}

struct BadCase {
  const char* text;
  std::vector<const char*> expect;  // substrings of the message
};

class SettingsErrors : public ::testing::TestWithParam<BadCase> {};

TEST_P(SettingsErrors, NamesFileKeyAndReason) {
  const BadCase& c = GetParam();
  std::string msg = error_of(c.text);
  ASSERT_FALSE(msg.empty()) << "accepted: " << c.text;
  EXPECT_THAT(msg, HasSubstr("s.json")) << msg;
  for (const char* e : c.expect) EXPECT_THAT(msg, HasSubstr(e)) << c.text;
}

INSTANTIATE_TEST_SUITE_P(
    Catalogue, SettingsErrors,
    ::testing::Values(
        BadCase{R"({"server": {"port": 80)", {"invalid JSON", "line 1"}},
        BadCase{R"({"server": {"port": 1e400}})", {"invalid JSON", "number overflow"}},
        BadCase{R"({"models": ["/"]})", {"models[0].name", "no name to derive"}},
        BadCase{"[1]", {"must be an object"}},
        BadCase{R"({"server": {"port": 1, "port": 2}})", {"duplicate key 'port'", "server"}},
        BadCase{R"({"models": [{"path": "/a", "sampling": {"top_k": 1, "top_k": 2}}]})",
                {"duplicate key 'top_k'", "models[0].sampling"}},
        BadCase{R"({"sever": {}})", {"sever: unknown key", "did you mean 'server'"}},
        BadCase{R"({"server": {"prot": 1}})", {"server.prot: unknown key", "'port'"}},
        BadCase{R"({"server": {"port": "80"}})", {"server.port", "must be an integer", "a string"}},
        BadCase{R"({"server": {"port": 70000}})", {"server.port", "between 0 and 65535", "70000"}},
        BadCase{R"({"server": {"port": 80.5}})", {"server.port", "must be an integer"}},
        BadCase{R"({"server": {"host": ""}})", {"server.host", "must not be empty"}},
        BadCase{R"({"server": {"host": 1}})", {"server.host", "must be a string"}},
        BadCase{R"({"server": {"keepalive_interval_ms": 10}})", {"server.keepalive_interval_ms"}},
        BadCase{R"({"server": {"max_body_bytes": -1}})", {"server.max_body_bytes"}},
        BadCase{R"({"server": []})", {"server", "must be an object", "an array"}},
        BadCase{R"({"auth": {"api_key": "a", "api_key_env": "B"}})",
                {"auth.api_key_env", "conflicts with auth.api_key"}},
        BadCase{R"({"auth": {"api_key_env": "TM_SURELY_UNSET_VARIABLE_42"}})",
                {"auth.api_key_env", "TM_SURELY_UNSET_VARIABLE_42", "not set"}},
        BadCase{R"({"auth": {"key": "a"}})", {"auth.key: unknown key"}},
        BadCase{R"({"limits": {"max_seqs": 0}})", {"limits.max_seqs", "between 1"}},
        BadCase{R"({"limits": {"prefer_decode": 1}})", {"limits.prefer_decode", "true or false"}},
        BadCase{R"({"limits": {"overlap_steps": "yes"}})",
                {"limits.overlap_steps", "true or false"}},
        BadCase{R"({"limits": {"max_step_tokens": 64, "prefill_chunk": 128}})",
                {"limits.prefill_chunk", "conflicts with limits.max_step_tokens"}},
        BadCase{R"({"cache": {"kv_block_size": 0}})", {"cache.kv_block_size"}},
        BadCase{R"({"cache": {"prefix": true}})", {"cache.prefix: unknown key", "prefix_cache"}},
        BadCase{R"({"models": "/a"})", {"models", "must be an array"}},
        BadCase{R"({"models": [3]})", {"models[0]", "model directory"}},
        BadCase{R"({"models": [""]})", {"models[0]", "must not be empty"}},
        BadCase{R"({"models": [{"name": "x"}]})", {"models[0].path", "missing"}},
        BadCase{R"({"models": [{"path": "/a", "context": 5}]})",
                {"models[0].context: unknown key", "context_window"}},
        BadCase{R"({"models": [{"path": "/a", "context_window": 0}]})",
                {"models[0].context_window", "between 1"}},
        BadCase{R"({"models": [{"path": "/a", "context_window": 100, "max_output_tokens": 200}]})",
                {"models[0].max_output_tokens", "conflicts with context_window"}},
        BadCase{R"({"models": [{"path": "/a", "sampling": {"temperature": 3}}]})",
                {"models[0].sampling.temperature", "between 0 and 2"}},
        BadCase{R"({"models": [{"path": "/a", "sampling": {"top_p": 0}}]})",
                {"models[0].sampling.top_p", "above 0"}},
        BadCase{R"({"models": [{"path": "/a", "sampling": {"temp": 1}}]})",
                {"models[0].sampling.temp: unknown key", "temperature"}},
        BadCase{R"({"models": [{"path": "/a", "thinking": {"enabled": "yes"}}]})",
                {"models[0].thinking.enabled", "true or false"}},
        BadCase{R"({"models": [{"path": "/a", "thinking": {"budget_tokens": -5}}]})",
                {"models[0].thinking.budget_tokens"}},
        BadCase{
            R"({"models": [{"path": "/a", "speculative": {"enabled": false, "draft_depth": 2}}]})",
            {"models[0].speculative.draft_depth", "conflicts with speculative.enabled"}},
        BadCase{R"({"models": [{"path": "/a", "speculative": {"draft_depth": 2}}]})",
                {"models[0].speculative.draft_depth", "speculative.enabled is not"}},
        BadCase{
            R"({"models": [{"path": "/a", "speculative": {"enabled": false, "draft_depth": 99}}]})",
            {"models[0].speculative.draft_depth", "between 1 and 16"}},
        BadCase{R"({"models": [{"path": "/a", "kv_cache_dtype": "int3"}]})",
                {"models[0].kv_cache_dtype", "must be one of", "int3"}},
        // Values the engine cannot honour yet are errors, never silently ignored.
        BadCase{R"({"models": [{"path": "/a", "speculative": {"enabled": true}}]})",
                {"models[0].speculative.enabled", "true", "not supported by this build yet"}},
        BadCase{
            R"({"models": [{"path": "/a", "speculative": {"enabled": true, "draft_depth": 3}}]})",
            {"models[0].speculative.enabled", "not supported by this build yet"}},
        BadCase{R"({"models": [{"path": "/a", "kv_cache_dtype": "fp8"}]})",
                {"models[0].kv_cache_dtype", "'fp8'", "not supported by this build yet"}},
        BadCase{R"({"models": [{"path": "/a", "kv_cache_dtype": "f16"}]})",
                {"models[0].kv_cache_dtype", "'f16'", "not supported by this build yet", "bf16"}},
        BadCase{R"({"cache": {"prefix_cache": true}})",
                {"cache.prefix_cache", "true", "not supported by this build yet"}},
        BadCase{R"({"models": [{"path": "/a", "default": true}, {"path": "/b", "default": true}]})",
                {"models[1].default", "conflicts with model 'a'"}},
        BadCase{R"({"models": ["/x/a", "/y/a"]})", {"models[1].name", "'a'", "models[0]"}},
        BadCase{R"({"models": ["/x/a", {"path": "/x/a", "name": "b"}]})",
                {"models[1].path", "listed twice"}},
        BadCase{R"({"models": ["/a"], "default_model": "b"})",
                {"default_model", "'b' is not a configured model", "a"}},
        BadCase{R"({"models": ["/a", {"path": "/b", "default": true}], "default_model": "a"})",
                {"default_model", "conflicts with model 'b'"}},
        BadCase{R"({"models": [{"path": "/a", "settings_file": "nope.json"}]})",
                {"models[0].settings_file", "does not exist"}}));

TEST(Settings, PerModelFileIsReadAndConflictsAreErrors) {
  TempDir dir;
  dir.write("demo.json", R"({"context_window": 2048, "sampling": {"temperature": 0.2}})");
  std::string main = dir.write("s.json", R"({"models": [{"path": "m", "settings_file": "demo.json",
                                              "pinned": true}]})");
  Settings s = load_settings(main);
  ASSERT_EQ(s.models.size(), 1u);
  EXPECT_EQ(s.models[0].context_window, 2048);
  EXPECT_TRUE(s.models[0].pinned);
  EXPECT_EQ(s.models[0].path, (dir.path() / "m").string());
  EXPECT_THAT(s.models[0].source, HasSubstr("demo.json"));

  // The same key inline and in the model file.
  dir.write("s2.json", R"({"models": [{"path": "m", "settings_file": "demo.json",
                            "context_window": 4096}]})");
  try {
    load_settings((dir.path() / "s2.json").string());
    FAIL() << "accepted a key set twice";
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()),
                AllOf(HasSubstr("s2.json"), HasSubstr("models[0].context_window"),
                      HasSubstr("also set in"), HasSubstr("demo.json")));
  }

  // An error inside the model file names that file and the key.
  dir.write("bad.json", R"({"sampling": {"top_k": "x"}})");
  dir.write("s3.json", R"({"models": [{"path": "m", "settings_file": "bad.json"}]})");
  try {
    load_settings((dir.path() / "s3.json").string());
    FAIL() << "accepted a bad model file";
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), AllOf(HasSubstr("bad.json"), HasSubstr("sampling.top_k"),
                                             HasSubstr("must be an integer")));
  }
}

TEST(Settings, UnsupportedValueInAModelFileNamesThatFile) {
  TempDir dir;
  dir.write("m.json", R"({"kv_cache_dtype": "fp8"})");
  std::string main =
      dir.write("s.json", R"({"models": [{"path": "m", "settings_file": "m.json"}]})");
  try {
    load_settings(main);
    FAIL() << "accepted kv_cache_dtype fp8";
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()),
                AllOf(HasSubstr("m.json"), HasSubstr("kv_cache_dtype"), HasSubstr("'fp8'"),
                      HasSubstr("not supported by this build yet")));
  }
  // A reload that brings in such a value is rejected and the running settings stay.
  std::string ok = dir.write("s.json", R"({"models": ["m"]})");
  SettingsStore store(load_settings(ok));
  dir.write("s.json", R"({"models": [{"path": "m", "speculative": {"enabled": true}}]})");
  EXPECT_THAT(store.reload(), HasSubstr("not supported by this build yet"));
  EXPECT_FALSE(store.get()->models[0].speculative);
}

TEST(Settings, MissingFile) {
  EXPECT_THROW(load_settings("/nonexistent/tm/settings.json"), Error);
  Settings s = load_settings("/nonexistent/tm/settings.json", /*required=*/false);
  EXPECT_TRUE(s.file.empty());
  EXPECT_EQ(s.server.port, 8000);
}

TEST(Settings, ApiKeyFromEnvironment) {
  ::setenv("TM_TEST_API_KEY_VAR", "secret-7", 1);
  Settings s = parse_settings(R"({"auth": {"api_key_env": "TM_TEST_API_KEY_VAR"}})", "s.json");
  EXPECT_EQ(s.auth.api_key, "secret-7");
  ::unsetenv("TM_TEST_API_KEY_VAR");
}

TEST(Settings, CommandLineModelsTakeTheirSettingsFromTheFile) {
  Settings s = parse_settings(
      R"({"models": [{"path": "/m/a", "context_window": 100}, "/m/b"], "default_model": "b"})",
      "/s.json");
  apply_model_dirs(s, {"/m/a/", "/m/c"});
  ASSERT_EQ(s.models.size(), 2u);
  EXPECT_EQ(s.models[0].name, "a");
  EXPECT_EQ(s.models[0].context_window, 100);
  EXPECT_EQ(s.models[1].name, "c");
  EXPECT_EQ(s.models[1].context_window, 0);
  EXPECT_EQ(s.find_model("")->name, "a");  // "b" is gone; the first serves by default
  EXPECT_THROW(apply_model_dirs(s, {"/x/a", "/y/a"}), Error);
}

TEST(SettingsStore, BadReloadKeepsThePreviousSettings) {
  TempDir dir;
  std::string file = dir.write("s.json", R"({"auth": {"api_key": "one"}, "models": ["/m/a"]})");
  SettingsStore store(load_settings(file));
  EXPECT_EQ(store.get()->auth.api_key, "one");

  dir.write("s.json", R"({"auth": {"api_key": "two"}, "models": ["/m/a"]})");
  EXPECT_EQ(store.reload(), "");
  EXPECT_EQ(store.get()->auth.api_key, "two");

  dir.write("s.json", R"({"auth": {"api_key": "three", "oops": 1}, "models": ["/m/a"]})");
  std::string err = store.reload();
  EXPECT_THAT(err, AllOf(HasSubstr("s.json"), HasSubstr("auth.oops"), HasSubstr("unknown key")));
  EXPECT_EQ(store.get()->auth.api_key, "two");

  dir.write("s.json", R"({"models": ["/m/a", "/m/b"]})");
  err = store.reload();
  EXPECT_THAT(err, HasSubstr("restart"));
  EXPECT_EQ(store.get()->models.size(), 1u);

  dir.write("s.json", R"({"models": ["/m/a"], "auth": {"api_key": 5}})");
  EXPECT_THAT(store.reload(), HasSubstr("auth.api_key"));
  EXPECT_EQ(store.get()->auth.api_key, "two");
}

TEST(SettingsStore, ReloadAppliesCommandLineOverrides) {
  TempDir dir;
  std::string file = dir.write("s.json", R"({"auth": {"api_key": "file"}})");
  auto overrides = [](Settings& s) { s.auth.api_key = "cli"; };
  Settings first = load_settings(file);
  overrides(first);
  SettingsStore store(first, overrides);
  dir.write("s.json",
            R"({"auth": {"api_key": "file2"}, "server": {"keepalive_interval_ms": 300}})");
  EXPECT_EQ(store.reload(), "");
  EXPECT_EQ(store.get()->auth.api_key, "cli");
  EXPECT_EQ(store.get()->server.keepalive_interval_ms, 300);
}

}  // namespace
}  // namespace tokenmill::server
