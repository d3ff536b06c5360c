#include "server/http_server.h"

#include <httplib.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "engine/engine.h"
#include "server/anthropic_request.h"
#include "server/anthropic_response.h"
#include "server/api_error.h"
#include "server/metrics.h"
#include "server/net_util.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/request_json.h"
#include "server/status.h"
#include "util/log.h"

namespace tokenmill::server {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

enum class Route { kChat, kCompletion, kMessages, kCountTokens };

const char* route_name(Route r) {
  switch (r) {
    case Route::kChat:
      return "chat";
    case Route::kCompletion:
      return "completions";
    case Route::kMessages:
      return "messages";
    case Route::kCountTokens:
      return "count_tokens";
  }
  return "";
}

ApiKind api_of_path(const std::string& path) {
  return path.rfind("/v1/messages", 0) == 0 ? ApiKind::kAnthropic : ApiKind::kOpenAI;
}

// Compares in time that depends only on the lengths, not on where the strings differ.
bool constant_time_equal(const std::string& a, const std::string& b) {
  size_t n = std::max(a.size(), b.size());
  unsigned diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? a[i] : 0, y = i < b.size() ? b[i] : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

void send_error(httplib::Response& res, ApiKind api, int status, const std::string& msg,
                const std::string& param = {}, const std::string& code = {}) {
  res.status = status;
  res.set_content(error_body(api, status, msg, param, code), "application/json");
}

}  // namespace

struct HttpServer::Impl {
  SettingsStore& settings;
  std::vector<ServedModel> models;
  httplib::Server svr;
  Metrics metrics;
  std::atomic<int> active{0};
  std::atomic<bool> draining{false};
  Clock::time_point started = Clock::now();
  long started_epoch = long(std::time(nullptr));
  std::mutex mu;
  std::set<Generation*> live;  // generations in flight (for drain)
  StatusSampler sampler;

  Impl(SettingsStore& s, std::vector<ServedModel> m) : settings(s), models(std::move(m)) {}

  void setup();
  bool authorize(const httplib::Request& req, httplib::Response& res);
  const ServedModel& resolve_model(const Settings& s, const std::string& name,
                                   const ModelSettings** ms);
  void generate(const httplib::Request& req, httplib::Response& res, Route route,
                const std::string& body_text);
  // Reads the body through `reader`; a body over server.max_body_bytes is drained (so the
  // client can read the answer) and gets 413 in the route's error shape.
  void post(const httplib::Request& req, httplib::Response& res,
            const httplib::ContentReader& reader, Route route);
  void stream(const httplib::Request& req, httplib::Response& res, Route route,
              std::shared_ptr<Generation> gen, Clock::time_point t0);
};

bool HttpServer::Impl::authorize(const httplib::Request& req, httplib::Response& res) {
  auto s = settings.get();
  if (s->auth.api_key.empty()) return true;
  std::string key;
  std::string auth = req.get_header_value("Authorization");
  if (auth.rfind("Bearer ", 0) == 0) key = auth.substr(7);
  if (key.empty()) key = req.get_header_value("x-api-key");
  if (!key.empty() && constant_time_equal(key, s->auth.api_key)) return true;
  ApiKind api = api_of_path(req.path);
  send_error(res, api, 401,
             key.empty() ? "missing API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'"
                         : "invalid API key",
             "", "invalid_api_key");
  metrics.request_refused("auth", 401);
  return false;
}

const ServedModel& HttpServer::Impl::resolve_model(const Settings& s, const std::string& name,
                                                   const ModelSettings** ms) {
  const ModelSettings* m = s.find_model(name);
  if (m) {
    for (const auto& sm : models) {
      if (sm.path == m->path) {
        *ms = m;
        return sm;
      }
    }
  }
  std::vector<std::string> names;
  for (const auto& sm : models) names.push_back(sm.name);
  if (name.empty()) throw ApiError(400, "no model is configured", "model", "model_not_found");
  throw ApiError(
      400,
      fmt::format("model '{}' is not served here (available: {})", name, fmt::join(names, ", ")),
      "model", "model_not_found");
}

void HttpServer::Impl::post(const httplib::Request& req, httplib::Response& res,
                            const httplib::ContentReader& reader, Route route) {
  const int64_t limit = settings.get()->server.max_body_bytes;
  std::string body;
  int64_t total = 0;
  reader([&](const char* data, size_t n) {
    total += int64_t(n);
    if (total <= limit) body.append(data, n);
    return true;
  });
  if (total > limit) {
    ApiKind api = route == Route::kMessages || route == Route::kCountTokens ? ApiKind::kAnthropic
                                                                            : ApiKind::kOpenAI;
    send_error(res, api, 413,
               fmt::format("the request body has {} bytes; the limit is {} (server.max_body_bytes)",
                           total, limit));
    metrics.request_refused(route_name(route), 413);
    return;
  }
  generate(req, res, route, body);
}

void HttpServer::Impl::generate(const httplib::Request& req, httplib::Response& res, Route route,
                                const std::string& body_text) {
  ApiKind api = route == Route::kMessages || route == Route::kCountTokens ? ApiKind::kAnthropic
                                                                          : ApiKind::kOpenAI;
  auto t0 = Clock::now();
  auto s = settings.get();
  try {
    if (draining && route != Route::kCountTokens) {
      throw ApiError(503, "the server is shutting down; retry on another instance");
    }
    auto body = parse_body(body_text);
    RequestLimits limits;
    limits.max_n = s->limits.max_n;
    GenerationPlan plan;
    switch (route) {
      case Route::kChat:
        plan = parse_openai_chat(body, limits);
        break;
      case Route::kCompletion:
        plan = parse_openai_completion(body, limits);
        break;
      case Route::kMessages:
        plan = parse_anthropic_messages(body, limits, false);
        break;
      case Route::kCountTokens:
        plan = parse_anthropic_messages(body, limits, true);
        break;
    }
    const ModelSettings* ms = nullptr;
    const ServedModel& model = resolve_model(*s, plan.model, &ms);
    if (route == Route::kCountTokens) {
      res.set_content(anthropic_count_tokens_body(count_prompt_tokens(model, *ms, plan)),
                      "application/json");
      return;
    }
    auto gen = std::make_shared<Generation>(model, *ms, std::move(plan));
    gen->start();
    if (gen->plan().stream) {
      stream(req, res, route, std::move(gen), t0);
      return;
    }
    active++;
    {
      std::lock_guard<std::mutex> lock(mu);
      live.insert(gen.get());
    }
    int fd = -2;
    auto last_check = Clock::now();
    while (!gen->done()) {
      gen->poll(std::chrono::milliseconds(100));
      if (Clock::now() - last_check > std::chrono::milliseconds(250)) {
        last_check = Clock::now();
        if (fd == -2) fd = find_connection_fd(req.remote_addr, req.remote_port, req.local_port);
        if (peer_gone(fd)) {
          log::info("{} {}: client disconnected; cancelling {}", req.method, req.path,
                    gen->request_id());
          gen->cancel();
          break;
        }
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      live.erase(gen.get());
    }
    active--;
    const auto& results = gen->results();
    for (const auto& r : results) {
      if (r.finish_reason == "error") throw ApiError(500, r.error);
    }
    std::string out = route == Route::kChat       ? openai_chat_body(*gen)
                      : route == Route::kMessages ? anthropic_message_body(*gen)
                                                  : openai_completion_body(*gen);
    res.set_content(out, "application/json");
    metrics.request_done(model.name, route_name(route), 200, gen->usage(), gen->ttft_seconds(),
                         std::chrono::duration<double>(Clock::now() - t0).count());
  } catch (const ApiError& e) {
    send_error(res, api, e.status(), e.what(), e.param(), e.code());
    metrics.request_refused(route_name(route), e.status());
  } catch (const Error& e) {
    // Errors from the text layer (template, tokenizer) on a validated request: the request's
    // content is at fault, so 400 with the message.
    send_error(res, api, 400, e.what());
    metrics.request_refused(route_name(route), 400);
  }
}

void HttpServer::Impl::stream(const httplib::Request& req, httplib::Response& res, Route route,
                              std::shared_ptr<Generation> gen, Clock::time_point t0) {
  struct State {
    std::shared_ptr<Generation> gen;
    std::unique_ptr<OpenAIStreamWriter> openai;
    std::unique_ptr<AnthropicStreamWriter> anthropic;
    int fd = -2;
    Clock::time_point last_write = Clock::now();
    bool begun = false, ended = false;
  };
  auto st = std::make_shared<State>();
  st->gen = std::move(gen);
  if (route == Route::kMessages) {
    st->anthropic = std::make_unique<AnthropicStreamWriter>(*st->gen);
  } else {
    st->openai = std::make_unique<OpenAIStreamWriter>(*st->gen);
  }
  active++;
  {
    std::lock_guard<std::mutex> lock(mu);
    live.insert(st->gen.get());
  }
  std::string remote = req.remote_addr;
  int remote_port = req.remote_port, local_port = req.local_port;
  std::string name = route_name(route);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, st, remote, remote_port, local_port, name, t0](size_t, httplib::DataSink& sink) {
        auto write = [&](const std::string& s) {
          if (s.empty()) return true;
          st->last_write = Clock::now();
          return sink.write(s.data(), s.size());
        };
        if (st->fd == -2) st->fd = find_connection_fd(remote, remote_port, local_port);
        if (!st->begun) {
          st->begun = true;
          return write(st->anthropic ? st->anthropic->start() : "");
        }
        Generation& g = *st->gen;
        if (g.done()) {
          st->ended = true;
          std::string out = st->anthropic ? st->anthropic->end() : st->openai->end();
          bool ok = write(out);
          sink.done();
          metrics.request_done(g.model().name, name, 200, g.usage(), g.ttft_seconds(),
                               std::chrono::duration<double>(Clock::now() - t0).count());
          return ok;
        }
        auto ds = g.poll(std::chrono::milliseconds(100));
        std::string out;
        for (const auto& d : ds) {
          if (d.finish_reason == "error") {
            out += st->anthropic
                       ? "event: error\ndata: " + error_body(ApiKind::kAnthropic, 500, d.error) +
                             "\n\n"
                       : "data: " + error_body(ApiKind::kOpenAI, 500, d.error) + "\n\n";
          }
        }
        out += st->anthropic ? st->anthropic->deltas(ds) : st->openai->deltas(ds);
        if (!out.empty()) {
          if (!write(out)) return false;
        } else {
          int ms = settings.get()->server.keepalive_interval_ms;
          if (Clock::now() - st->last_write >= std::chrono::milliseconds(ms)) {
            if (!write(st->anthropic ? AnthropicStreamWriter::ping()
                                     : OpenAIStreamWriter::keepalive())) {
              return false;
            }
          }
        }
        if (peer_gone(st->fd)) {
          log::info("stream {}: client disconnected; cancelling", g.request_id());
          return false;
        }
        return true;
      },
      [this, st](bool) {
        if (!st->gen->done()) st->gen->cancel();
        {
          std::lock_guard<std::mutex> lock(mu);
          live.erase(st->gen.get());
        }
        active--;
      });
}

void HttpServer::Impl::setup() {
  auto s = settings.get();
  int threads = s->server.threads;
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  // Hard cap on what is read at all; server.max_body_bytes (reloadable) is enforced in post(),
  // which drains a too-large body so the client can read the 413.
  svr.set_payload_max_length(size_t(1) << 30);
  svr.set_keep_alive_timeout(30);
  svr.set_read_timeout(60);
  svr.set_write_timeout(60);

  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    bool protected_path = req.path.rfind("/v1/", 0) == 0 || req.path.rfind("/api/", 0) == 0;
    if (protected_path && !authorize(req, res)) return httplib::Server::HandlerResponse::Handled;
    return httplib::Server::HandlerResponse::Unhandled;
  });
  svr.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    ApiKind api = api_of_path(req.path);
    std::string msg =
        res.status == 404   ? fmt::format("no route for {} {}", req.method, req.path)
        : res.status == 413 ? fmt::format("the request body is larger than the limit of {} bytes",
                                          settings.get()->server.max_body_bytes)
        : res.status == 405 ? fmt::format("method {} is not allowed on {}", req.method, req.path)
                            : fmt::format("HTTP {}", res.status);
    res.set_content(error_body(api, res.status, msg), "application/json");
  });
  svr.set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string msg = "internal error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          msg = e.what();
        } catch (...) {
        }
        log::error("{} {}: {}", req.method, req.path, msg);
        send_error(res, api_of_path(req.path), 500, msg);
      });
  svr.set_logger([](const httplib::Request& req, const httplib::Response& res) {
    log::info("{} {} {}", req.method, req.path, res.status);
  });

  svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (draining) {
      res.status = 503;
      res.set_content(R"({"status":"draining"})", "application/json");
      return;
    }
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json data = json::array();
    for (const auto& m : models) {
      data.push_back({{"id", m.name},
                      {"object", "model"},
                      {"created", started_epoch},
                      {"owned_by", "tokenmill"},
                      {"max_model_len", m.engine->max_context()}});
    }
    res.set_content(json{{"object", "list"}, {"data", data}}.dump(), "application/json");
  });
  svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.render(models, active.load()), "text/plain; version=0.0.4");
  });
  svr.Get("/api/status", [this](const httplib::Request&, httplib::Response& res) {
    StatusInputs in;
    in.settings = settings.get();
    in.models = &models;
    in.active_requests = active.load();
    in.draining = draining.load();
    in.uptime_s = std::chrono::duration<double>(Clock::now() - started).count();
    res.set_content(status_json(in, sampler), "application/json");
  });
  svr.Post("/api/reload", [this](const httplib::Request&, httplib::Response& res) {
    std::string err = settings.reload();
    if (!err.empty()) {
      log::warn("settings reload rejected, keeping the running settings: {}", err);
      send_error(res, ApiKind::kOpenAI, 400,
                 "settings reload rejected (the running settings stay): " + err);
      return;
    }
    res.set_content(R"({"reloaded":true})", "application/json");
  });
  const std::pair<const char*, Route> routes[] = {
      {"/v1/chat/completions", Route::kChat},
      {"/v1/completions", Route::kCompletion},
      {"/v1/messages", Route::kMessages},
      {"/v1/messages/count_tokens", Route::kCountTokens}};
  for (const auto& [path, route] : routes) {
    Route r = route;
    svr.Post(path, [this, r](const httplib::Request& q, httplib::Response& res,
                             const httplib::ContentReader& reader) { post(q, res, reader, r); });
  }
}

HttpServer::HttpServer(SettingsStore& settings, std::vector<ServedModel> models)
    : impl_(std::make_unique<Impl>(settings, std::move(models))) {
  impl_->setup();
}

HttpServer::~HttpServer() {
  stop();
}

int HttpServer::bind(const std::string& host, int port) {
  if (port == 0) {
    int p = impl_->svr.bind_to_any_port(host);
    if (p <= 0) fail("cannot bind {}: no free port", host);
    return p;
  }
  if (!impl_->svr.bind_to_port(host, port)) {
    fail("cannot listen on {}:{} (address in use or not available)", host, port);
  }
  return port;
}

void HttpServer::run() {
  impl_->sampler.start([this] {
    std::vector<EngineStats> v;
    for (const auto& m : impl_->models) v.push_back(m.engine->stats());
    return v;
  });
  impl_->svr.listen_after_bind();
  impl_->sampler.stop();
}

void HttpServer::drain(int timeout_ms) {
  Impl& I = *impl_;
  I.draining = true;
  auto until = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (I.active.load() > 0 && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  {
    std::lock_guard<std::mutex> lock(I.mu);
    for (Generation* g : I.live) g->cancel();
  }
  // Handlers notice the cancellation within one poll and finish their responses.
  auto grace = Clock::now() + std::chrono::seconds(2);
  while (I.active.load() > 0 && Clock::now() < grace) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void HttpServer::stop() {
  if (impl_->svr.is_running()) impl_->svr.stop();
}

int HttpServer::active_requests() const {
  return impl_->active.load();
}

}  // namespace tokenmill::server
