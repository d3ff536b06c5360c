#include "app/commands.h"

#include <CLI/CLI.hpp>

namespace tokenmill::app {

void register_commands(CLI::App& app) {
  register_version(app);
  register_inspect(app);
  register_bench(app);
  register_run(app);
  register_perplexity(app);
  register_generate(app);
  register_serve(app);
  register_daemon(app);
  register_settings(app);
}

}  // namespace tokenmill::app
