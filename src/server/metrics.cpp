#include "server/metrics.h"

#include <unistd.h>

#include <fstream>

#include "engine/engine.h"
#include "util/error.h"

namespace tokenmill::server {

namespace {

const std::vector<double> kLatencyBounds = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                            1,     2.5,  5,     10,   30,  60,   120};
const std::vector<double> kTokenBounds = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06,
                                          0.08,  0.1,    0.15,  0.2,  0.3,  0.5,  1.0};

std::string label(const std::string& k, const std::string& v) {
  std::string e;
  for (char c : v) {
    if (c == '"' || c == '\\') e += '\\';
    if (c == '\n') {
      e += "\\n";
      continue;
    }
    e += c;
  }
  return fmt::format("{}=\"{}\"", k, e);
}

void counter_family(std::string& out, const std::string& name, const std::string& help,
                    const std::map<std::string, uint64_t>& values) {
  out += fmt::format("# HELP {} {}\n# TYPE {} counter\n", name, help, name);
  for (const auto& [labels, v] : values) out += fmt::format("{}{{{}}} {}\n", name, labels, v);
}

}  // namespace

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  counts_[i]++;
  sum_ += v;
  count_++;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  uint64_t cum = 0;
  std::string sep = labels.empty() ? "" : ",";
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += fmt::format("{}_bucket{{{}{}le=\"{}\"}} {}\n", name, labels, sep, bounds_[i], cum);
  }
  out += fmt::format("{}_bucket{{{}{}le=\"+Inf\"}} {}\n", name, labels, sep, count_);
  out +=
      fmt::format("{}_sum{{{}}} {}\n{}_count{{{}}} {}\n", name, labels, sum_, name, labels, count_);
}

Metrics::Metrics() = default;

void Metrics::request_done(const std::string& model, const std::string& route, int status,
                           const Usage& usage, double ttft_s, double duration_s) {
  std::string ml = label("model", model);
  std::lock_guard<std::mutex> lock(mu_);
  requests_[ml + "," + label("route", route) + "," + label("status", std::to_string(status))]++;
  prompt_tokens_[ml] += usage.prompt_tokens;
  generation_tokens_[ml] += usage.completion_tokens;
  cached_tokens_[ml] += usage.cached_tokens;
  auto hist = [&](std::map<std::string, Histogram>& m, const std::vector<double>& b) -> Histogram& {
    return m.try_emplace(ml, b).first->second;
  };
  if (ttft_s >= 0) hist(ttft_, kLatencyBounds).observe(ttft_s);
  if (ttft_s >= 0 && usage.completion_tokens > 1) {
    hist(tpot_, kTokenBounds).observe((duration_s - ttft_s) / (usage.completion_tokens - 1));
  }
  hist(duration_, kLatencyBounds).observe(duration_s);
}

void Metrics::request_refused(const std::string& route, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  requests_[label("model", "") + "," + label("route", route) + "," +
            label("status", std::to_string(status))]++;
}

std::string Metrics::render(const std::vector<ServedModel>& models, int active_requests) const {
  std::string out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    counter_family(out, "tokenmill_requests_total",
                   "HTTP generation requests by model, route and status.", requests_);
    counter_family(out, "tokenmill_prompt_tokens_total", "Prompt tokens processed.",
                   prompt_tokens_);
    counter_family(out, "tokenmill_generation_tokens_total", "Tokens generated.",
                   generation_tokens_);
    counter_family(out, "tokenmill_cached_prompt_tokens_total",
                   "Prompt tokens served from the prefix cache.", cached_tokens_);
    auto hists = [&](const char* name, const char* help,
                     const std::map<std::string, Histogram>& m) {
      out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
      for (const auto& [l, h] : m) h.render(out, name, l);
    };
    hists("tokenmill_time_to_first_token_seconds",
          "Time from submission to the first generated token.", ttft_);
    hists("tokenmill_time_per_output_token_seconds",
          "Mean time between generated tokens of a request.", tpot_);
    hists("tokenmill_request_duration_seconds", "Time from submission to the last token.",
          duration_);
  }
  struct Gauge {
    const char* name;
    const char* help;
    double (*get)(const EngineStats&);
  };
  static const Gauge kGauges[] = {
      {"tokenmill_running_sequences", "Sequences in the running batch.",
       [](const EngineStats& s) { return double(s.running); }},
      {"tokenmill_queued_sequences", "Requests waiting for admission.",
       [](const EngineStats& s) { return double(s.queued); }},
      {"tokenmill_batch_tokens", "Tokens in the last engine step.",
       [](const EngineStats& s) { return s.last_batch_tokens; }},
      {"tokenmill_kv_blocks_used", "KV cache blocks in use.",
       [](const EngineStats& s) { return double(s.kv_blocks_used); }},
      {"tokenmill_kv_blocks_total", "KV cache blocks.",
       [](const EngineStats& s) { return double(s.kv_blocks_total); }},
      {"tokenmill_state_slots_used", "Recurrent-state slots in use.",
       [](const EngineStats& s) { return double(s.state_slots_used); }},
      {"tokenmill_cache_bytes_used", "Cache memory in use (bytes).",
       [](const EngineStats& s) { return double(s.cache_bytes_used); }},
      {"tokenmill_cache_bytes_total", "Cache memory budget (bytes).",
       [](const EngineStats& s) { return double(s.cache_bytes_total); }},
      {"tokenmill_engine_steps_total", "Engine steps run.",
       [](const EngineStats& s) { return double(s.steps); }},
      {"tokenmill_engine_steps_overlapped_total",
       "Engine steps launched while the step before was still running.",
       [](const EngineStats& s) { return double(s.steps_overlapped); }},
      {"tokenmill_engine_steps_logits_to_host_total",
       "Engine steps whose logits went to the host for sampling (logprobs, grammars, or picks "
       "the device does not make).",
       [](const EngineStats& s) { return double(s.steps_logits_to_host); }},
      {"tokenmill_engine_cached_prompt_tokens_total",
       "Prompt tokens served from the prefix cache (engine).",
       [](const EngineStats& s) { return double(s.cached_prompt_tokens); }},
  };
  std::vector<EngineStats> stats;
  for (const auto& m : models) stats.push_back(m.engine->stats());
  for (const auto& g : kGauges) {
    out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n", g.name, g.help, g.name);
    for (size_t i = 0; i < models.size(); ++i) {
      out += fmt::format("{}{{{}}} {}\n", g.name, label("model", models[i].name), g.get(stats[i]));
    }
  }
  out +=
      "# HELP tokenmill_active_http_requests Generation requests being answered.\n"
      "# TYPE tokenmill_active_http_requests gauge\n";
  out += fmt::format("tokenmill_active_http_requests {}\n", active_requests);
  out +=
      "# HELP tokenmill_process_resident_memory_bytes Resident memory of the server process.\n"
      "# TYPE tokenmill_process_resident_memory_bytes gauge\n";
  out += fmt::format("tokenmill_process_resident_memory_bytes {}\n", process_rss_bytes());
  return out;
}

int64_t process_rss_bytes() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  return resident * int64_t(sysconf(_SC_PAGESIZE));
}

}  // namespace tokenmill::server
