#include "app/commands.h"

#include <CLI/CLI.hpp>

namespace tokenmill::app {

void register_commands(CLI::App& app) {
  register_version(app);
  register_inspect(app);
  register_bench(app);
}

}  // namespace tokenmill::app
