#include <CLI/CLI.hpp>
#include <cstdio>

#include "app/commands.h"

namespace tokenmill::app {

void register_version(CLI::App& app) {
  auto* cmd = app.add_subcommand("version", "Print the version and the backends compiled in");
  cmd->callback([] {
    std::printf("tokenmill 0.1.0\nbackends: cpu%s\n",
#ifdef TM_HAVE_CUDA
                " cuda"
#else
                ""
#endif
    );
  });
}

}  // namespace tokenmill::app
