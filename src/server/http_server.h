// The HTTP server: OpenAI and Anthropic routes over the served models, auth, body limits, SSE
// streaming with keepalives and disconnect detection, /health, /v1/models, /metrics,
// /api/status. Light header (no httplib, no json): src/app includes it.
//
// Routes: GET /health (open), /v1/models, /metrics, /api/status; POST /v1/chat/completions,
// /v1/completions, /v1/messages, /v1/messages/count_tokens, /api/reload (re-reads the settings
// file; a bad file keeps the running settings and answers 400 with the reason).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "server/generation.h"
#include "server/settings.h"

namespace tokenmill::server {

class HttpServer {
 public:
  // The models must outlive the server; their names match settings entries by path.
  HttpServer(SettingsStore& settings, std::vector<ServedModel> models);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port (0 = any free port) and returns the port. Throws tokenmill::Error when
  // the address cannot be bound (the caller names the process holding it).
  int bind(const std::string& host, int port);
  // Serves until stop(); call after bind().
  void run();
  // New generation requests get 503 from now on; waits up to timeout_ms for in-flight ones,
  // then cancels the rest (their streams end with what was generated).
  void drain(int timeout_ms);
  void stop();
  // Requests currently being answered (generation routes).
  int active_requests() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The process listening on TCP port `port` ("pid 123 (name)"), found through /proc/net/tcp{,6}
// and /proc/*/fd; "" when unknown (another user's process, or no listener).
std::string describe_port_owner(int port);

}  // namespace tokenmill::server
