// `tokenmill serve`: load the models and answer the OpenAI and Anthropic APIs in the foreground.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "app/backend_select.h"
#include "app/commands.h"
#include "app/model_loading.h"
#include "app/serve_options.h"
#include "cache/cache_manager.h"
#include "engine/engine.h"
#include "model/model.h"
#include "server/http_server.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "util/error.h"
#include "util/log.h"

namespace tokenmill::app {

namespace {

namespace fs = std::filesystem;

// Everything one served model owns, in construction order.
struct ServingModel {
  std::unique_ptr<Model> model;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ChatTemplate> chat_template;
};

// Fails with the owner's name when host:port cannot be bound (before loading models).
void check_port_free(const std::string& host, int port) {
  if (port == 0) return;
  int fd = socket(host.find(':') != std::string::npos ? AF_INET6 : AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return;
  int yes = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  int rc = -1;
  if (host.find(':') != std::string::npos) {
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_port = htons(uint16_t(port));
    if (inet_pton(AF_INET6, host.c_str(), &a.sin6_addr) == 1) {
      rc = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    }
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    std::string h = host == "localhost" ? "127.0.0.1" : host;
    if (inet_pton(AF_INET, h.c_str(), &a.sin_addr) == 1) {
      rc = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    } else {
      rc = 0;  // a host name: let the server report it
    }
  }
  int err = errno;
  close(fd);
  if (rc == 0) return;
  if (err == EADDRINUSE) {
    std::string owner = server::describe_port_owner(port);
    fail("port {} is already in use{}: stop that process or pass --port", port,
         owner.empty() ? "" : " by " + owner);
  }
  fail("cannot bind {}:{}: {}", host, port, std::strerror(err));
}

std::vector<int32_t> stop_ids_for(const server::GenerationConfig& gc, const Model& model,
                                  const Tokenizer& tok) {
  std::vector<int32_t> ids = model.config().eos_token_ids;
  auto add = [&](int32_t id) {
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  };
  if (auto e = tok.eos_id()) add(*e);
  for (int32_t id : gc.eos_token_ids) add(id);
  // Chat models end their turn with <|im_end|> even when the config names another eos.
  if (auto im = tok.token_to_id("<|im_end|>")) add(*im);
  return ids;
}

}  // namespace

void add_serve_options(CLI::App& cmd, ServeOptions& o) {
  cmd.add_option("--model", o.models,
                 "Model directory to serve (repeatable); default: the settings file's models");
  cmd.add_option("--host", o.host, "Address to listen on (default 127.0.0.1)");
  cmd.add_option("--port", o.port, "TCP port (default 8000; 0 = any free port)");
  cmd.add_option("--settings", o.settings,
                 "Settings file (default ~/.tokenmill/settings.json if present)");
  cmd.add_option("--api-key", o.api_key, "Require this API key (also $TOKENMILL_API_KEY)");
  cmd.add_option("--shutdown-timeout", o.shutdown_timeout_ms,
                 "Milliseconds to let requests finish on SIGTERM before cancelling them")
      ->capture_default_str();
  add_device_options(cmd, o.device);
}

std::vector<std::string> serve_args(const ServeOptions& o) {
  std::vector<std::string> a;
  for (const auto& m : o.models) {
    a.push_back("--model");
    a.push_back(fs::absolute(m).lexically_normal().string());
  }
  if (!o.host.empty()) a.insert(a.end(), {"--host", o.host});
  if (o.port >= 0) a.insert(a.end(), {"--port", std::to_string(o.port)});
  if (!o.settings.empty()) a.insert(a.end(), {"--settings", fs::absolute(o.settings).string()});
  a.insert(a.end(), {"--shutdown-timeout", std::to_string(o.shutdown_timeout_ms)});
  a.insert(a.end(), {"--device", o.device.device, "--threads", std::to_string(o.device.threads),
                     "--prefill-precision", o.device.prefill_precision, "--batch-precision",
                     o.device.batch_precision});
  return a;
}

void run_server(const ServeOptions& o) {
  // Settings: the file, then command-line overrides (re-applied on every reload).
  std::string path = o.settings.empty() ? server::default_settings_path() : o.settings;
  server::Settings settings = server::load_settings(path, !o.settings.empty());
  std::string env_key = std::getenv("TOKENMILL_API_KEY") ? std::getenv("TOKENMILL_API_KEY") : "";
  std::vector<std::string> dirs = o.models;
  auto overrides = [o, env_key, dirs](server::Settings& s) {
    server::apply_model_dirs(s, dirs);
    if (!o.host.empty()) s.server.host = o.host;
    if (o.port >= 0) s.server.port = o.port;
    if (!o.api_key.empty()) {
      s.auth.api_key = o.api_key;
    } else if (!env_key.empty()) {
      s.auth.api_key = env_key;
    }
  };
  overrides(settings);
  server::validate_models(settings, settings.file.empty() ? "--model" : settings.file);
  if (settings.models.empty()) {
    fail("no model to serve: pass --model DIR or list models in {}",
         path.empty() ? "a settings file" : path);
  }
  const std::string host = settings.server.host;
  const int port = settings.server.port;
  check_port_free(host, port);

  // Signals go to one thread (sigwait), so no handler touches shared state.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  BackendHandle be = make_backend(o.device);
  std::vector<ServingModel> loaded;
  std::vector<server::ServedModel> served;
  const server::StepLimits steps =
      server::step_limits_for(settings.limits, !is_cpu_backend(*be.backend));
  log::info("steps of up to {} tokens{}, prefill chunks of up to {}{} ({})", steps.max_step_tokens,
            steps.auto_step ? " (auto)" : "", steps.prefill_chunk,
            steps.auto_chunk ? " (auto)" : "", be.backend->name());
  // Every model's weights first, then the engines: an automatic cache budget divides the device
  // memory left after all the weights.
  for (const auto& ms : settings.models) {
    log::info("loading {} from {}", ms.name, ms.path);
    ServingModel lm;
    lm.model = load_model_weights(ms.path, *be.backend);
    lm.tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_dir(ms.path));
    check_tokenizer_fits(*lm.tokenizer, *lm.model, ms.path);
    try {
      lm.chat_template = std::make_unique<ChatTemplate>(ChatTemplate::from_dir(ms.path));
    } catch (const Error& e) {
      log::warn("{}: no usable chat template, chat routes will answer 400: {}", ms.name, e.what());
    }
    loaded.push_back(std::move(lm));
  }
  // Each engine's options but its cache budget, which comes from the memory left below.
  std::vector<EngineOptions> engine_options;
  for (const server::ModelSettings& ms : settings.models) {
    EngineOptions eo;
    eo.max_seqs = settings.limits.max_seqs;
    eo.max_step_tokens = steps.max_step_tokens;
    eo.prefill_chunk = steps.prefill_chunk;
    eo.prefer_decode = settings.limits.prefer_decode;
    eo.overlap_steps = settings.limits.overlap_steps;
    eo.kv_block_size = settings.cache.kv_block_size;
    eo.max_context = ms.context_window;
    eo.kv_dtype = kv_dtype_of(ms.kv_cache_dtype, *be.backend);
    engine_options.push_back(eo);
  }
  // Step memory (scratch and workspaces of the largest step) before the budget measures what
  // is free. The context is the most the engine can allow: its setting, else the model's limit
  // (the cache may lower it, never raise it). A model with neither leaves its block tables to
  // the engine's own reservation (index arrays and the attention workspace: a few MiB).
  for (size_t i = 0; i < loaded.size(); ++i) {
    const EngineOptions& eo = engine_options[i];
    const int64_t ctx =
        eo.max_context > 0 ? eo.max_context : loaded[i].model->config().max_position_embeddings;
    reserve_engine_steps(*loaded[i].model, eo, static_cast<int>(std::min<int64_t>(ctx, 1 << 30)));
  }
  const server::CacheBudget budget = server::cache_budget_for(
      settings.cache, be.backend->free_memory_bytes(), static_cast<int>(settings.models.size()));
  const bool cpu = is_cpu_backend(*be.backend);
  log::info("cache memory per model: {} MiB{}", budget.bytes >> 20,
            budget.automatic ? (cpu ? " of KV blocks (auto: the CPU default) and the state slots"
                                    : " (auto: 90% of the free device memory, less 3 GiB, "
                                      "split between the models)")
                             : "");
  for (size_t i = 0; i < settings.models.size(); ++i) {
    const server::ModelSettings& ms = settings.models[i];
    ServingModel& lm = loaded[i];
    EngineOptions eo = engine_options[i];
    eo.memory_budget_bytes = server::engine_cache_bytes(budget, cpu, eo.max_seqs,
                                                        lm.model->geometry().state_bytes_per_seq());
    if (eo.memory_budget_bytes != budget.bytes) {
      log::info("{}: cache memory {} MiB ({} state slots of {} MiB on top of the KV blocks)",
                ms.name, eo.memory_budget_bytes >> 20, eo.max_seqs,
                lm.model->geometry().state_bytes_per_seq() >> 20);
    }
    // The pool runs one job at a time: with one model, its engine thread samples the rows of a
    // step on it between forwards; several engines would call it at once.
    if (settings.models.size() == 1) eo.host_pool = be.pool.get();
    lm.engine = std::make_unique<Engine>(*lm.model, eo);
    server::ServedModel sm;
    sm.name = ms.name;
    sm.path = ms.path;
    sm.engine = lm.engine.get();
    sm.tokenizer = lm.tokenizer.get();
    sm.chat_template = lm.chat_template.get();
    sm.chat_template_source = lm.chat_template ? lm.chat_template->source() : "";
    sm.model_type = lm.model->config().model_type;
    sm.generation_config = server::load_generation_config(ms.path);
    sm.device = be.backend->name();
    sm.precision = be.backend->precision_modes();
    sm.stop_ids = stop_ids_for(sm.generation_config, *lm.model, *lm.tokenizer);
    server::compute_token_bytes(sm);
    served.push_back(std::move(sm));
  }

  server::SettingsStore store(settings, overrides);
  server::HttpServer http(store, std::move(served));
  int bound = http.bind(host, port);
  std::printf("tokenmill: serving %zu model(s) on http://%s:%d\n", loaded.size(), host.c_str(),
              bound);
  std::fflush(stdout);

  std::atomic<bool> signalled{false};
  std::thread signals([&] {
    for (;;) {
      siginfo_t info{};
      int sig = sigwaitinfo(&sigs, &info);
      if (sig == SIGHUP) {
        std::string err = store.reload();
        if (err.empty()) {
          log::warn("settings reloaded from {}", store.get()->file);
        } else {
          log::error("settings reload rejected, keeping the running settings: {}", err);
        }
        continue;
      }
      if (sig != SIGINT && sig != SIGTERM) continue;
      signalled = true;
      // `tokenmill stop --timeout` sends its drain time with the signal (sigqueue).
      int timeout = info.si_code == SI_QUEUE ? info.si_value.sival_int : o.shutdown_timeout_ms;
      log::warn("signal {}: draining for up to {} ms", sig, timeout);
      http.drain(timeout);
      http.stop();
      return;
    }
  });
  http.run();
  // run() returns after a signal, or on a listen failure: then wake the signal thread.
  if (!signalled) pthread_kill(signals.native_handle(), SIGTERM);
  signals.join();
  for (auto& lm : loaded) lm.engine->shutdown(0);
}

void register_serve(CLI::App& app) {
  auto opts = std::make_shared<ServeOptions>();
  auto* cmd = app.add_subcommand(
      "serve", "Serve models over the OpenAI and Anthropic HTTP APIs (foreground)");
  add_serve_options(*cmd, *opts);
  cmd->callback([opts] { run_server(*opts); });
}

}  // namespace tokenmill::app
