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
}

}  // namespace tokenmill::app
