// `tokenmill settings check [FILE]`: validate a settings file (and its per-model files) without
// starting anything; prints a summary, or the first error with file, key path and reason.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "app/commands.h"
#include "app/model_loading.h"
#include "server/settings.h"
#include "util/error.h"

namespace tokenmill::app {

void register_settings(CLI::App& app) {
  auto* cmd = app.add_subcommand("settings", "Work with settings files");
  cmd->require_subcommand(1);
  auto file = std::make_shared<std::string>();
  auto* check =
      cmd->add_subcommand("check", "Validate a settings file (default ~/.tokenmill/settings.json)");
  check->add_option("file", *file, "Settings file");
  check->callback([file] {
    std::string path = file->empty() ? server::default_settings_path() : *file;
    if (path.empty()) fail("HOME is not set: name the settings file");
    server::Settings s = server::load_settings(path, /*required=*/true);
    for (size_t i = 0; i < s.models.size(); ++i) {
      const auto& m = s.models[i];
      if (!std::filesystem::is_directory(m.path)) {
        fail("{}: models[{}].path: '{}' is not a directory (fix the path or remove the entry)",
             path, i, m.path);
      }
      if (!has_model_weights(m.path)) {
        fail("{}: models[{}].path: '{}' has no config.json (is it a model directory?)", path, i,
             m.path);
      }
    }
    std::printf("%s: ok\n", path.c_str());
    const server::CacheBudget cpu_cache = server::cache_budget_for(s.cache, -1, 1);
    std::printf("  listen %s:%d, auth %s, max %d sequences, cache %s\n", s.server.host.c_str(),
                s.server.port, s.auth.api_key.empty() ? "off" : "on", s.limits.max_seqs,
                cpu_cache.automatic
                    ? fmt::format("{} MiB of KV blocks per model and the state of {} "
                                  "sequences (CPU); on a GPU 90% of the free device "
                                  "memory after the weights, less 3 GiB, split between the models "
                                  "(left out: sized for the device)",
                                  cpu_cache.bytes >> 20, s.limits.max_seqs)
                          .c_str()
                    : fmt::format("{} MiB per model", cpu_cache.bytes >> 20).c_str());
    const server::StepLimits cpu = server::step_limits_for(s.limits, false);
    const server::StepLimits gpu = server::step_limits_for(s.limits, true);
    std::printf("  steps of up to %d tokens, prefill chunks of %d (CPU); %d and %d (GPU)%s\n",
                cpu.max_step_tokens, cpu.prefill_chunk, gpu.max_step_tokens, gpu.prefill_chunk,
                cpu.auto_step || cpu.auto_chunk ? " (left out: sized for the device)" : "");
    for (const auto& m : s.models) {
      std::printf("  model %s%s: %s (settings from %s)\n", m.name.c_str(),
                  s.find_model("") == &m ? " (default)" : "", m.path.c_str(), m.source.c_str());
    }
  });
}

}  // namespace tokenmill::app
