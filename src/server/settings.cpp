#include "server/settings.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "server/settings_schema.h"
#include "util/error.h"

namespace tokenmill::server {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr int64_t kMaxTokens = 1 << 24;

std::string read_text(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot read {} (check the path and its permissions)", path, what);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Normal form without a trailing separator, so "m/a/" and "m/a" compare equal.
std::string normal_dir(const fs::path& p) {
  fs::path n = p.lexically_normal();
  if (!n.has_filename() && n.has_parent_path() && n != n.root_path()) n = n.parent_path();
  return n.string();
}

std::string resolve(const std::string& path, const std::string& relative_to_file) {
  fs::path p(path);
  if (p.is_absolute() || relative_to_file.empty()) return normal_dir(p);
  return normal_dir(fs::path(relative_to_file).parent_path() / p);
}

std::string dir_name(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();  // "a/b/" -> "a/b"
  return p.filename().string();
}

// The keys a model entry may hold (inline or in its settings file).
void read_model_keys(JsonReader& r, ModelSettings& m) {
  if (auto v = r.string("name")) m.name = *v;
  if (auto v = r.integer("context_window", 1, kMaxTokens)) m.context_window = int(*v);
  if (auto v = r.integer("max_output_tokens", 1, kMaxTokens)) m.max_output_tokens = int(*v);
  if (auto s = r.object("sampling")) {
    auto f = [](std::optional<double> d) {
      return d ? std::optional<float>(float(*d)) : std::nullopt;
    };
    m.sampling.temperature = f(s->number("temperature", 0, 2));
    m.sampling.top_p = f(s->number("top_p", 0, 1));
    if (m.sampling.top_p && *m.sampling.top_p <= 0) s->error("top_p", "must be above 0");
    if (auto k = s->integer("top_k", 0, 1 << 20)) m.sampling.top_k = int(*k);
    m.sampling.min_p = f(s->number("min_p", 0, 1));
    m.sampling.repetition_penalty = f(s->number("repetition_penalty", 0.01, 10));
    m.sampling.presence_penalty = f(s->number("presence_penalty", -2, 2));
    m.sampling.frequency_penalty = f(s->number("frequency_penalty", -2, 2));
    s->finish();
  }
  if (auto t = r.object("thinking")) {
    if (auto v = t->boolean("enabled")) m.thinking = *v;
    if (auto v = t->integer("budget_tokens", 0, kMaxTokens)) m.thinking_budget = int(*v);
    t->finish();
  }
  if (auto sp = r.object("speculative")) {
    auto enabled = sp->boolean("enabled");
    if (enabled.value_or(false)) {
      sp->error("enabled",
                "true is not supported by this build yet (the engine has no "
                "speculative decoding); set it to false or remove the key");
    }
    m.speculative = enabled.value_or(false);
    if (auto d = sp->integer("draft_depth", 1, 16)) {
      if (!m.speculative) {
        sp->error("draft_depth",
                  enabled ? "conflicts with speculative.enabled = false (remove draft_depth or "
                            "enable speculative decoding)"
                          : "is set but speculative.enabled is not (add \"enabled\": true or "
                            "remove draft_depth)");
      }
      m.draft_depth = int(*d);
    }
    sp->finish();
  }
  if (auto v = r.one_of("kv_cache_dtype", {"auto", "bf16", "f16", "f32", "fp8"})) {
    if (*v == "f16" || *v == "fp8") {
      r.error("kv_cache_dtype", fmt::format("'{}' is not supported by this build yet (the KV cache "
                                            "is stored as f32 or bf16); use \"auto\" (bf16 on "
                                            "CUDA, f32 on the CPU), \"f32\" or \"bf16\"",
                                            *v));
    }
    m.kv_cache_dtype = *v;
  }
  if (auto v = r.boolean("pinned")) m.pinned = *v;
  if (auto v = r.boolean("default")) m.is_default = *v;
  if (m.context_window > 0 && m.max_output_tokens > m.context_window) {
    r.error("max_output_tokens", fmt::format("({}) conflicts with context_window ({}): the output "
                                             "must fit in the context window",
                                             m.max_output_tokens, m.context_window));
  }
}

ModelSettings read_model_entry(const json& entry, const std::string& file, size_t index) {
  std::string where = fmt::format("models[{}]", index);
  ModelSettings m;
  if (entry.is_string()) {
    m.path = resolve(entry.get<std::string>(), file);
    if (entry.get<std::string>().empty())
      fail("{}: {}: the model path must not be empty", file, where);
    m.name = dir_name(m.path);
    m.source = file;
    return m;
  }
  if (!entry.is_object()) {
    fail("{}: {}: must be a model directory (string) or an object with \"path\"", file, where);
  }
  JsonReader r(entry, file, where);
  auto path = r.string("path");
  if (!path) r.error("path", "is missing (the model directory)");
  m.path = resolve(*path, file);
  m.source = file;
  // Per-model file first, then the inline keys; a key in both places is a conflict.
  if (auto sf = r.string("settings_file")) {
    std::string mf = resolve(*sf, file);
    if (!fs::exists(mf)) {
      r.error("settings_file",
              fmt::format("'{}' does not exist (create it or remove the key)", mf));
    }
    json mj = parse_json_strict(read_text(mf, "the model settings file"), mf);
    JsonReader mr(mj, mf, "");
    read_model_keys(mr, m);
    mr.finish();
    for (auto it = mj.begin(); it != mj.end(); ++it) {
      if (entry.contains(it.key())) {
        r.error(it.key(), fmt::format("is also set in {}: set it in one place only", mf));
      }
    }
    m.source = file + " + " + mf;
  }
  read_model_keys(r, m);
  r.finish();
  if (m.name.empty()) m.name = dir_name(m.path);
  return m;
}

}  // namespace

const ModelSettings* Settings::find_model(const std::string& name) const {
  if (name.empty()) {
    for (const auto& m : models) {
      if (m.name == default_model) return &m;
    }
    return models.empty() ? nullptr : &models.front();
  }
  for (const auto& m : models) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

std::string default_settings_path() {
  const char* home = std::getenv("HOME");
  if (!home || !*home) return "";
  return (fs::path(home) / ".tokenmill" / "settings.json").string();
}

Settings parse_settings(const std::string& text, const std::string& file) {
  json j = parse_json_strict(text, file);
  JsonReader r(j, file, "");
  Settings s;
  s.file = file;
  if (auto sv = r.object("server")) {
    if (auto v = sv->string("host")) s.server.host = *v;
    if (auto v = sv->integer("port", 0, 65535)) s.server.port = int(*v);
    if (auto v = sv->integer("threads", 1, 4096)) s.server.threads = int(*v);
    if (auto v = sv->integer("keepalive_interval_ms", 100, 600000)) {
      s.server.keepalive_interval_ms = int(*v);
    }
    if (auto v = sv->integer("max_body_bytes", 1024, int64_t(1) << 34))
      s.server.max_body_bytes = *v;
    if (auto v = sv->integer("request_timeout_s", 0, 86400 * 7))
      s.server.request_timeout_s = int(*v);
    sv->finish();
  }
  if (auto a = r.object("auth")) {
    auto key = a->string("api_key");
    auto env = a->string("api_key_env");
    if (key && env) {
      a->error("api_key_env",
               "conflicts with auth.api_key: give the key or the variable, not both");
    }
    if (key) s.auth.api_key = *key;
    if (env) {
      const char* v = std::getenv(env->c_str());
      if (!v || !*v) {
        a->error("api_key_env", fmt::format("names the environment variable {}, which is not set "
                                            "or empty",
                                            *env));
      }
      s.auth.api_key = v;
    }
    a->finish();
  }
  if (auto l = r.object("limits")) {
    if (auto v = l->integer("max_seqs", 1, 4096)) s.limits.max_seqs = int(*v);
    if (auto v = l->integer("max_queue", 1, 1 << 20)) s.limits.max_queue = int(*v);
    if (auto v = l->integer("max_step_tokens", 1, 1 << 20)) s.limits.max_step_tokens = int(*v);
    if (auto v = l->integer("prefill_chunk", 1, 1 << 20)) s.limits.prefill_chunk = int(*v);
    if (auto v = l->boolean("prefer_decode")) s.limits.prefer_decode = *v;
    if (auto v = l->boolean("overlap_steps")) s.limits.overlap_steps = *v;
    if (auto v = l->integer("max_n", 1, 128)) s.limits.max_n = int(*v);
    if (s.limits.max_step_tokens > 0 && s.limits.prefill_chunk > s.limits.max_step_tokens) {
      l->error("prefill_chunk", fmt::format("({}) conflicts with limits.max_step_tokens ({}): a "
                                            "prefill chunk must fit in one step",
                                            s.limits.prefill_chunk, s.limits.max_step_tokens));
    }
    l->finish();
  }
  if (auto c = r.object("cache")) {
    if (auto v = c->integer("memory_budget_mb", 1, int64_t(1) << 24)) s.cache.memory_budget_mb = *v;
    if (auto v = c->integer("kv_block_size", 1, 1024)) s.cache.kv_block_size = int(*v);
    if (auto v = c->boolean("prefix_cache")) {
      if (*v) {
        c->error("prefix_cache",
                 "true is not supported by this build yet (the engine has no "
                 "prefix cache); set it to false or remove the key");
      }
      s.cache.prefix_cache = *v;
    }
    c->finish();
  }
  if (const json* models = r.raw("models")) {
    if (!models->is_array()) {
      r.error("models", "must be an array of model directories or {\"path\": ...} objects");
    }
    for (size_t i = 0; i < models->size(); ++i) {
      s.models.push_back(read_model_entry((*models)[i], file, i));
    }
  }
  if (auto v = r.string("default_model")) s.default_model = *v;
  r.finish();
  validate_models(s, file);
  if (s.default_model.empty()) {
    for (const auto& m : s.models) {
      if (m.is_default) s.default_model = m.name;
    }
  }
  return s;
}

void validate_models(const Settings& s, const std::string& where) {
  std::map<std::string, size_t> names, paths;
  const ModelSettings* flagged = nullptr;
  for (size_t i = 0; i < s.models.size(); ++i) {
    const auto& m = s.models[i];
    if (m.name.empty()) {
      // Requests name models by it; a root directory ("/") has no base name to give one.
      fail("{}: models[{}].name: '{}' gives no name to derive (set \"name\")", where, i, m.path);
    }
    if (!names.emplace(m.name, i).second) {
      fail(
          "{}: models[{}].name: '{}' is also the name of models[{}] (give each model its own "
          "\"name\")",
          where, i, m.name, names[m.name]);
    }
    if (!paths.emplace(m.path, i).second) {
      fail("{}: models[{}].path: '{}' is listed twice (also models[{}])", where, i, m.path,
           paths[m.path]);
    }
    if (m.is_default) {
      if (flagged) {
        fail("{}: models[{}].default: conflicts with model '{}', also marked default (keep one)",
             where, i, flagged->name);
      }
      flagged = &m;
    }
  }
  if (!s.default_model.empty()) {
    if (!names.count(s.default_model)) {
      fail("{}: default_model: '{}' is not a configured model (models: {})", where, s.default_model,
           fmt::join(
               [&] {
                 std::vector<std::string> v;
                 for (const auto& m : s.models) v.push_back(m.name);
                 return v;
               }(),
               ", "));
    }
    if (flagged && flagged->name != s.default_model) {
      fail(
          "{}: default_model: '{}' conflicts with model '{}', which says \"default\": true "
          "(keep one of the two)",
          where, s.default_model, flagged->name);
    }
  }
}

Settings load_settings(const std::string& path, bool required) {
  if (!fs::exists(path)) {
    if (required) fail("{}: settings file not found (check the path, or omit --settings)", path);
    return Settings{};
  }
  return parse_settings(read_text(path, "the settings file"), path);
}

void apply_model_dirs(Settings& base, const std::vector<std::string>& dirs) {
  if (dirs.empty()) return;
  std::vector<ModelSettings> out;
  for (const auto& d : dirs) {
    std::string p = normal_dir(d);
    ModelSettings m;
    bool found = false;
    for (const auto& b : base.models) {
      std::error_code ec;
      if (b.path == p || fs::equivalent(b.path, p, ec)) {
        m = b;
        found = true;
        break;
      }
    }
    if (!found) {
      m.path = p;
      m.name = dir_name(p);
      m.source = "--model";
    }
    m.path = p;
    for (const auto& o : out) {
      if (o.name == m.name) {
        fail(
            "--model {}: the model name '{}' is already used by --model {} (name them in the "
            "settings file)",
            d, m.name, o.path);
      }
    }
    out.push_back(std::move(m));
  }
  base.models = std::move(out);
  if (!base.default_model.empty() && !base.find_model(base.default_model)) {
    base.default_model.clear();
  }
  if (base.default_model.empty()) {
    for (const auto& m : base.models) {
      if (m.is_default) base.default_model = m.name;
    }
  }
}

SettingsStore::SettingsStore(Settings initial, std::function<void(Settings&)> overrides)
    : overrides_(std::move(overrides)),
      current_(std::make_shared<const Settings>(std::move(initial))) {}

std::shared_ptr<const Settings> SettingsStore::get() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_;
}

void SettingsStore::set(Settings s) {
  auto p = std::make_shared<const Settings>(std::move(s));
  std::lock_guard<std::mutex> lock(mu_);
  current_ = std::move(p);
}

std::string SettingsStore::reload() {
  auto cur = get();
  if (cur->file.empty()) return "no settings file to reload (the server runs on defaults)";
  try {
    Settings next = load_settings(cur->file);
    if (overrides_) overrides_(next);
    validate_models(next, cur->file);
    std::vector<std::string> a, b;
    for (const auto& m : cur->models) a.push_back(m.path);
    for (const auto& m : next.models) b.push_back(m.path);
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    if (a != b) {
      fail(
          "{}: models: the list of model directories changed ({} -> {}); restart the server "
          "to load or unload models",
          cur->file, fmt::join(a, ", "), fmt::join(b, ", "));
    }
    set(std::move(next));
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

StepLimits step_limits_for(const LimitsSection& limits, bool gpu) {
  StepLimits r;
  const int step_default = gpu ? 2048 : 512, chunk_default = gpu ? 1024 : 256;
  r.auto_step = limits.max_step_tokens <= 0;
  r.auto_chunk = limits.prefill_chunk <= 0;
  r.max_step_tokens = r.auto_step ? step_default : limits.max_step_tokens;
  r.prefill_chunk =
      r.auto_chunk ? std::min(chunk_default, r.max_step_tokens) : limits.prefill_chunk;
  if (r.auto_step) r.max_step_tokens = std::max(r.max_step_tokens, r.prefill_chunk);
  return r;
}

CacheBudget cache_budget_for(const CacheSection& cache, int64_t device_free_bytes,
                             int auto_models) {
  CacheBudget b;
  if (cache.memory_budget_mb > 0) {
    b.bytes = cache.memory_budget_mb << 20;
    return b;
  }
  b.automatic = true;
  if (device_free_bytes < 0) {
    b.bytes = int64_t{2048} << 20;
    return b;
  }
  const int64_t usable = device_free_bytes / 10 * 9 - kGpuScratchReserve;
  b.bytes = std::max<int64_t>(int64_t{512} << 20, usable / std::max(1, auto_models));
  return b;
}

int64_t engine_cache_bytes(const CacheBudget& budget, bool cpu, int max_seqs,
                           int64_t state_bytes_per_seq) {
  return budget.bytes + (budget.automatic && cpu ? int64_t{max_seqs} * state_bytes_per_seq : 0);
}

}  // namespace tokenmill::server
