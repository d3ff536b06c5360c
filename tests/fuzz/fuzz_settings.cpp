// libFuzzer target: the server's configuration files. Byte 0 picks the parser (even:
// settings.json text -> Settings; odd: a model's generation_config.json -> GenerationConfig),
// the rest is the file. Only tokenmill::Error may escape (a message naming the file, key and
// reason); what is accepted must hold the values the server relies on and this build can
// honour (settings.h, generation_config.h).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "server/generation_config.h"
#include "server/settings.h"
#include "util/error.h"

namespace {

template <class T>
bool within(const std::optional<T>& v, double lo, double hi) {
  return !v || (static_cast<double>(*v) >= lo && static_cast<double>(*v) <= hi);
}

bool sane(const tokenmill::server::SamplingDefaults& d, double max_temperature) {
  return within(d.temperature, 0, max_temperature) && within(d.top_p, 0, 1) &&
         (!d.top_p || *d.top_p > 0) && within(d.min_p, 0, 1) && within(d.top_k, 0, 1 << 30) &&
         within(d.presence_penalty, -2, 2) && within(d.frequency_penalty, -2, 2) &&
         within(d.repetition_penalty, 0, 100) &&
         (!d.repetition_penalty || *d.repetition_penalty > 0);
}

bool sane(const tokenmill::server::Settings& s) {
  bool ok = s.server.port >= 0 && s.server.port <= 65535 && s.server.threads >= 1 &&
            s.server.max_body_bytes > 0 && s.server.request_timeout_s >= 0 &&
            s.limits.max_seqs >= 1 && s.limits.max_queue >= 0 && s.limits.max_step_tokens >= 0 &&
            s.limits.prefill_chunk >= 0 && s.limits.max_n >= 1 && s.cache.memory_budget_mb >= 0 &&
            s.cache.kv_block_size >= 1 && !s.cache.prefix_cache;
  std::set<std::string> names;
  int defaults = 0;
  for (const auto& m : s.models) {
    ok = ok && !m.name.empty() && names.insert(m.name).second && m.context_window >= 0 &&
         m.max_output_tokens >= 0 && m.thinking_budget >= -1 && !m.speculative &&
         (m.kv_cache_dtype == "auto" || m.kv_cache_dtype == "f32" || m.kv_cache_dtype == "bf16") &&
         sane(m.sampling, 2);
    defaults += m.is_default ? 1 : 0;
  }
  return ok && defaults <= 1 && (s.default_model.empty() || names.count(s.default_model) == 1);
}

bool sane(const tokenmill::server::GenerationConfig& g) {
  bool ok = sane(g.sampling, 100) && (!g.max_new_tokens || *g.max_new_tokens >= 1);
  for (int32_t id : g.eos_token_ids) ok = ok && id >= 0;
  return ok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  bool ok = true;
  try {
    if (data[0] % 2 == 0) {
      // A folder that does not exist: a settings_file or model path inside resolves there and
      // is refused as missing, never read.
      ok = sane(tokenmill::server::parse_settings(text, "/nonexistent-tokenmill-fuzz/s.json"));
    } else {
      ok = sane(tokenmill::server::parse_generation_config(text, "generation_config.json"));
    }
  } catch (const tokenmill::Error&) {
    return 0;  // rejected with a message
  }
  if (!ok) __builtin_trap();
  return 0;
}
