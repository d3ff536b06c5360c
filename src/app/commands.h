// Registration of every subcommand. Each cmd_*.cpp defines one register_* function; the command
// runs from its CLI11 callback and throws tokenmill::Error for user errors (printed by cli.cpp).
#pragma once

namespace CLI {
class App;
}

namespace tokenmill::app {

void register_commands(CLI::App& app);

void register_version(CLI::App& app);
void register_inspect(CLI::App& app);
void register_bench(CLI::App& app);
void register_run(CLI::App& app);
void register_perplexity(CLI::App& app);
void register_generate(CLI::App& app);
void register_serve(CLI::App& app);     // cmd_serve.cpp
void register_daemon(CLI::App& app);    // cmd_daemon.cpp: start, stop, restart, status
void register_settings(CLI::App& app);  // cmd_settings.cpp

}  // namespace tokenmill::app
