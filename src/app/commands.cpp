#include "app/commands.h"

#include <CLI/CLI.hpp>

namespace tokenmill::app {

void register_commands(CLI::App& app) { register_version(app); }

}  // namespace tokenmill::app
