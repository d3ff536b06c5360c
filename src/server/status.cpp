#include "server/status.h"

#include <chrono>
#include <nlohmann/json.hpp>

#include "cache/cache_manager.h"
#include "server/metrics.h"

namespace tokenmill::server {

using json = nlohmann::json;

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

void StatusSampler::start(std::function<std::vector<EngineStats>()> read) {
  stop();
  stop_ = false;
  thread_ = std::thread([this, read = std::move(read)] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      lock.unlock();
      Sample s{now_s(), read()};
      lock.lock();
      samples_.push_back(std::move(s));
      while (samples_.size() > 61) samples_.pop_front();
      cv_.wait_for(lock, std::chrono::seconds(1), [this] { return stop_; });
    }
  });
}

void StatusSampler::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::pair<double, double> StatusSampler::throughput(size_t model) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (samples_.size() < 2) return {0, 0};
  const Sample& a = samples_.front();
  const Sample& b = samples_.back();
  double dt = b.t - a.t;
  if (dt <= 0 || model >= a.stats.size() || model >= b.stats.size()) return {0, 0};
  return {double(b.stats[model].generated_tokens - a.stats[model].generated_tokens) / dt,
          double(b.stats[model].prompt_tokens - a.stats[model].prompt_tokens) / dt};
}

std::string status_json(const StatusInputs& in, const StatusSampler& sampler) {
  json models = json::array();
  for (size_t i = 0; i < in.models->size(); ++i) {
    const ServedModel& m = (*in.models)[i];
    EngineStats s = m.engine->stats();
    auto [gen_tps, prompt_tps] = sampler.throughput(i);
    const ModelSettings* ms = nullptr;
    for (const auto& x : in.settings->models) {
      if (x.path == m.path) ms = &x;
    }
    json j = {{"name", m.name},
              {"path", m.path},
              {"default", in.settings->find_model("") == ms},
              {"device", m.device},
              {"max_context", s.max_context},
              {"sequences", {{"running", s.running}, {"queued", s.queued}}},
              {"memory",
               {{"budget_bytes", s.cache_bytes_total},
                {"used_bytes", s.cache_bytes_used},
                {"kv_blocks_total", s.kv_blocks_total},
                {"kv_blocks_used", s.kv_blocks_used},
                {"state_slots_total", s.state_slots_total},
                {"state_slots_used", s.state_slots_used}}},
              {"totals",
               {{"requests", s.requests_total},
                {"finished", s.requests_finished},
                {"prompt_tokens", s.prompt_tokens},
                {"generated_tokens", s.generated_tokens},
                {"cached_prompt_tokens", s.cached_prompt_tokens},
                {"steps", s.steps},
                {"steps_overlapped", s.steps_overlapped},
                {"steps_logits_to_host", s.steps_logits_to_host}}},
              {"throughput",
               {{"generated_tokens_per_s", gen_tps},
                {"prompt_tokens_per_s", prompt_tps},
                {"last_batch_tokens", s.last_batch_tokens}}}};
    if (ms) {
      // Effective values: what the engine does, not merely what a file said ("auto" resolved).
      const SamplingDefaults d =
          merge_sampling_defaults(ms->sampling, m.generation_config.sampling);
      auto opt = [](const auto& v) { return v ? json(*v) : json(nullptr); };
      j["settings"] = {{"context_window", ms->context_window},
                       {"max_output_tokens", ms->max_output_tokens},
                       {"thinking", ms->thinking},
                       {"speculative", ms->speculative},
                       {"draft_depth", ms->speculative ? ms->draft_depth : 0},
                       {"kv_cache_dtype", kv_dtype_setting_name(s.kv_dtype)},
                       {"prefill_precision", m.precision.prefill_fast ? "fast" : "exact"},
                       {"batch_precision", m.precision.batch_fast ? "fast" : "exact"},
                       {"prefix_cache", in.settings->cache.prefix_cache},
                       {"pinned", ms->pinned},
                       // Defaults for requests that set none (settings over generation_config.json;
                       // null: the built-in default).
                       {"sampling_defaults",
                        {{"temperature", opt(d.temperature)},
                         {"top_p", opt(d.top_p)},
                         {"top_k", opt(d.top_k)},
                         {"min_p", opt(d.min_p)},
                         {"repetition_penalty", opt(d.repetition_penalty)},
                         {"presence_penalty", opt(d.presence_penalty)},
                         {"frequency_penalty", opt(d.frequency_penalty)}}},
                       {"generation_config", m.generation_config.file}};
    }
    models.push_back(std::move(j));
  }
  json out = {{"status", in.draining ? "draining" : "ok"},     {"uptime_s", in.uptime_s},
              {"active_requests", in.active_requests},         {"settings_file", in.settings->file},
              {"process_resident_bytes", process_rss_bytes()}, {"models", models}};
  return out.dump();
}

}  // namespace tokenmill::server
