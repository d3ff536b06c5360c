// Options shared by `serve` and the daemon commands (`start`, `restart`), and the serve loop.
#pragma once

#include <string>
#include <vector>

#include "app/backend_select.h"

namespace CLI {
class App;
}

namespace tokenmill::app {

struct ServeOptions {
  std::vector<std::string> models;  // --model DIR (repeatable); empty: the settings file's
  std::string host;                 // "" = settings (default 127.0.0.1)
  int port = -1;                    // -1 = settings (default 8000)
  std::string settings;             // "" = ~/.tokenmill/settings.json if it exists
  std::string api_key;              // "" = settings or $TOKENMILL_API_KEY
  int shutdown_timeout_ms = 10000;  // drain time on SIGTERM without a value from `stop`
  DeviceOptions device;
};

void add_serve_options(CLI::App& cmd, ServeOptions& o);
// The arguments that reproduce `o` on a `tokenmill serve` command line (API key excluded: it
// travels in the environment).
std::vector<std::string> serve_args(const ServeOptions& o);
// Loads the models and serves until SIGINT/SIGTERM (drain, then exit). SIGHUP reloads the
// settings file. `on_listening(host, port)` runs once the port is bound, before serving.
void run_server(const ServeOptions& o);

}  // namespace tokenmill::app
