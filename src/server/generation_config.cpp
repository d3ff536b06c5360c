#include "server/generation_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "server/settings_schema.h"
#include "util/error.h"

namespace tokenmill::server {

namespace {

using json = nlohmann::json;

// Getters that treat null as absent and fail with file, key and value.
struct Reader {
  const json& j;
  const std::string& file;

  const json* get(const char* key) const {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  [[noreturn]] void bad(const char* key, const json& v, const std::string& want) const {
    fail("{}: {}: {} is not valid ({}); fix or remove the key", file, key, v.dump(), want);
  }
  std::optional<float> number(const char* key, double min, double max, bool min_open) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) bad(key, *v, "expected a number");
    double x = v->get<double>();
    if (!(min_open ? x > min : x >= min) || !(x <= max)) {
      bad(key, *v, fmt::format("expected a number in {}{}, {}]", min_open ? "(" : "[", min, max));
    }
    return float(x);
  }
  // An integer, also written as a whole float (20.0).
  static bool whole(const json& v) {
    if (v.is_number_integer()) return true;
    if (!v.is_number_float()) return false;
    const double d = v.get<double>();
    return std::isfinite(d) && std::floor(d) == d && std::fabs(d) < 9e15;
  }
  std::optional<int64_t> integer(const char* key, int64_t min, int64_t max) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!whole(*v)) bad(key, *v, "expected an integer");
    int64_t x = v->is_number_integer() ? v->get<int64_t>() : int64_t(v->get<double>());
    if (x < min || x > max) bad(key, *v, fmt::format("expected an integer in [{}, {}]", min, max));
    return x;
  }
};

}  // namespace

GenerationConfig parse_generation_config(const std::string& text, const std::string& file) {
  json j = parse_json_strict(text, file);
  if (!j.is_object()) fail("{}: must hold a JSON object", file);
  GenerationConfig gc;
  gc.file = file;
  Reader r{j, file};
  SamplingDefaults& s = gc.sampling;
  s.temperature = r.number("temperature", 0, 100, false);
  s.top_p = r.number("top_p", 0, 1, true);
  s.min_p = r.number("min_p", 0, 1, false);
  s.repetition_penalty = r.number("repetition_penalty", 0, 100, true);
  s.presence_penalty = r.number("presence_penalty", -2, 2, false);
  s.frequency_penalty = r.number("frequency_penalty", -2, 2, false);
  if (auto k = r.integer("top_k", 0, 1 << 30)) s.top_k = int(*k);
  if (const json* d = r.get("do_sample")) {
    if (!d->is_boolean()) r.bad("do_sample", *d, "expected true or false");
    if (!d->get<bool>()) s.temperature = 0.0f;  // transformers decodes greedily then
  }
  if (const json* e = r.get("eos_token_id")) {
    auto add = [&](const json& v) {
      if (!Reader::whole(v) || v.get<double>() < 0 || v.get<double>() > double(INT32_MAX)) {
        r.bad("eos_token_id", *e, "expected a token id or a list of token ids");
      }
      gc.eos_token_ids.push_back(int32_t(v.get<double>()));
    };
    if (e->is_array()) {
      for (const auto& x : *e) add(x);
    } else {
      add(*e);
    }
  }
  if (auto m = r.integer("max_new_tokens", 1, INT32_MAX)) gc.max_new_tokens = int(*m);
  return gc;
}

GenerationConfig load_generation_config(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "generation_config.json").string();
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_generation_config(ss.str(), path);
}

SamplingDefaults merge_sampling_defaults(const SamplingDefaults& a, const SamplingDefaults& b) {
  SamplingDefaults m;
  m.temperature = a.temperature ? a.temperature : b.temperature;
  m.top_p = a.top_p ? a.top_p : b.top_p;
  m.min_p = a.min_p ? a.min_p : b.min_p;
  m.repetition_penalty = a.repetition_penalty ? a.repetition_penalty : b.repetition_penalty;
  m.presence_penalty = a.presence_penalty ? a.presence_penalty : b.presence_penalty;
  m.frequency_penalty = a.frequency_penalty ? a.frequency_penalty : b.frequency_penalty;
  m.top_k = a.top_k ? a.top_k : b.top_k;
  return m;
}

SamplingParams resolve_sampling(const GenerationPlan& plan, const SamplingDefaults& settings,
                                const SamplingDefaults& generation_config) {
  const SamplingDefaults d = merge_sampling_defaults(settings, generation_config);
  SamplingParams p;  // built-in defaults
  p.temperature = plan.temperature.value_or(d.temperature.value_or(p.temperature));
  p.top_p = plan.top_p.value_or(d.top_p.value_or(p.top_p));
  p.min_p = plan.min_p.value_or(d.min_p.value_or(p.min_p));
  p.presence_penalty =
      plan.presence_penalty.value_or(d.presence_penalty.value_or(p.presence_penalty));
  p.frequency_penalty =
      plan.frequency_penalty.value_or(d.frequency_penalty.value_or(p.frequency_penalty));
  p.repetition_penalty =
      plan.repetition_penalty.value_or(d.repetition_penalty.value_or(p.repetition_penalty));
  p.top_k = plan.top_k.value_or(d.top_k.value_or(p.top_k));
  p.logprobs = plan.logprobs;
  return p;
}

}  // namespace tokenmill::server
