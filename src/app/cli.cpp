#include "app/cli.h"

#include <CLI/CLI.hpp>
#include <cstdio>

#include "app/commands.h"
#include "util/error.h"
#include "util/log.h"

namespace tokenmill::app {

int main(int argc, char** argv) {
  log::init();
  CLI::App app{"tokenmill: fast local inference for Qwen3.5-family hybrid models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tokenmill 0.1.0");
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "debug, info, warn, error or off")
      ->capture_default_str();
  app.parse_complete_callback([&log_level] { log::set_level(log_level); });
  register_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace tokenmill::app
