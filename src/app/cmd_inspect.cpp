// `tokenmill inspect DIR`: what a model directory holds and what serving it costs.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "io/checkpoint.h"
#include "io/model_summary.h"
#include "util/error.h"

namespace tokenmill::app {

namespace {

struct InspectOptions {
  std::string dir;
  int64_t context = 4096;
  bool json = false;
};

void run_inspect(const InspectOptions& o) {
  if (o.context < 1) fail("--context {}: expected a positive number of tokens", o.context);
  Checkpoint ck = Checkpoint::open(o.dir);
  ModelSummary s = summarize(ck, o.context);
  if (o.json) {
    std::printf("%s\n", summary_to_json(s).dump(2).c_str());
  } else {
    std::fputs(summary_to_text(s).c_str(), stdout);
  }
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto opts = std::make_shared<InspectOptions>();
  auto* cmd = app.add_subcommand(
      "inspect", "Describe a model directory: architecture, weights, quantization, cache memory");
  cmd->add_option("dir", opts->dir, "Model directory (config.json + *.safetensors)")->required();
  cmd->add_option("--context", opts->context, "Context length for the per-sequence cache estimate")
      ->capture_default_str();
  cmd->add_flag("--json", opts->json, "Print the summary as JSON");
  cmd->callback([opts] { run_inspect(*opts); });
}

}  // namespace tokenmill::app
