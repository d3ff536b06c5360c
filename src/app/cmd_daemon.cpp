// `tokenmill start | stop | restart | status`: the server as a background process. State lives
// in --state-dir (default ~/.tokenmill): tokenmill.pid (JSON: pid, host, port, serve arguments)
// and tokenmill.log (the server's stdout and stderr, appended).
#include <fcntl.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "app/commands.h"
#include "app/serve_options.h"
#include "util/error.h"

namespace tokenmill::app {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct DaemonOptions {
  ServeOptions serve;
  std::string state_dir;
  int wait_s = 300;    // start: seconds to wait for /health
  int timeout_s = 30;  // stop: seconds to drain before the process is killed
};

struct PidFile {
  int pid = 0;
  std::string host;
  int port = 0;
  std::vector<std::string> args;
};

std::string state_dir(const DaemonOptions& o) {
  if (!o.state_dir.empty()) return o.state_dir;
  const char* home = std::getenv("HOME");
  if (!home || !*home) fail("HOME is not set: pass --state-dir");
  return (fs::path(home) / ".tokenmill").string();
}
std::string pid_path(const DaemonOptions& o) {
  return state_dir(o) + "/tokenmill.pid";
}
std::string log_path(const DaemonOptions& o) {
  return state_dir(o) + "/tokenmill.log";
}

std::optional<PidFile> read_pid(const DaemonOptions& o) {
  std::ifstream in(pid_path(o));
  if (!in) return std::nullopt;
  try {
    auto j = nlohmann::json::parse(in);
    PidFile p;
    p.pid = j.at("pid").get<int>();
    p.host = j.at("host").get<std::string>();
    p.port = j.at("port").get<int>();
    p.args = j.value("args", std::vector<std::string>{});
    return p;
  } catch (const nlohmann::json::exception& e) {
    fail("{}: unreadable pid file ({}); delete it if no server is running", pid_path(o), e.what());
  }
}

bool alive(int pid) {
  return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
}

bool healthy(const std::string& host, int port) {
  httplib::Client c(host == "0.0.0.0" ? "127.0.0.1" : host, port);
  c.set_connection_timeout(1);
  c.set_read_timeout(2);
  auto r = c.Get("/health");
  return r && r->status == 200;
}

std::string log_tail(const std::string& path, size_t lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  std::string l;
  while (std::getline(in, l)) all.push_back(l);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i)
    out += "  " + all[i] + "\n";
  return out;
}

void start(DaemonOptions o) {
  fs::create_directories(state_dir(o));
  if (auto p = read_pid(o); p && alive(p->pid)) {
    fail(
        "a server is already running (pid {}, http://{}:{}); use `tokenmill restart` or `tokenmill "
        "stop`",
        p->pid, p->host, p->port);
  }
  ServeOptions& s = o.serve;
  if (s.host.empty()) s.host = "127.0.0.1";
  if (s.port < 0) s.port = 8000;
  std::vector<std::string> args = serve_args(s);
  std::string log = log_path(o);
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) fail("cannot find the tokenmill executable (/proc/self/exe)");
  exe[n] = 0;

  pid_t pid = fork();
  if (pid < 0) fail("fork failed: {}", std::strerror(errno));
  if (pid == 0) {
    setsid();
    int in = open("/dev/null", O_RDONLY);
    int out = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (in >= 0) dup2(in, 0);
    if (out >= 0) {
      dup2(out, 1);
      dup2(out, 2);
    }
    if (!s.api_key.empty()) setenv("TOKENMILL_API_KEY", s.api_key.c_str(), 1);
    std::vector<std::string> full = {"tokenmill", "--log-level", "info", "serve"};
    full.insert(full.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : full) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(exe, argv.data());
    std::fprintf(stderr, "exec %s failed: %s\n", exe, std::strerror(errno));
    _exit(127);
  }
  {
    nlohmann::json j = {{"pid", pid}, {"host", s.host}, {"port", s.port}, {"args", args}};
    std::ofstream(pid_path(o)) << j.dump() << "\n";
  }
  auto until = Clock::now() + std::chrono::seconds(o.wait_s);
  while (Clock::now() < until) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      fs::remove(pid_path(o));
      fail("the server exited during startup ({}); the end of {}:\n{}",
           WIFEXITED(status) ? fmt::format("exit code {}", WEXITSTATUS(status))
                             : fmt::format("signal {}", WTERMSIG(status)),
           log, log_tail(log, 15));
    }
    if (healthy(s.host, s.port)) {
      std::printf("tokenmill: started (pid %d) on http://%s:%d\nlog: %s\n", pid, s.host.c_str(),
                  s.port, log.c_str());
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  kill(pid, SIGKILL);
  fs::remove(pid_path(o));
  fail("the server did not answer /health within {} s (raise --wait); the end of {}:\n{}", o.wait_s,
       log, log_tail(log, 15));
}

// Returns false when no server was running.
bool stop(const DaemonOptions& o, bool quiet) {
  auto p = read_pid(o);
  if (!p || !alive(p->pid)) {
    if (p) fs::remove(pid_path(o));
    if (!quiet) std::printf("tokenmill: not running\n");
    return false;
  }
  // The drain time travels with the signal; the server cancels what is left after it.
  int drain_ms = std::max(0, o.timeout_s * 1000 - 1000);
  sigval v{};
  v.sival_int = drain_ms;
  if (sigqueue(p->pid, SIGTERM, v) != 0)
    fail("cannot signal pid {}: {}", p->pid, std::strerror(errno));
  auto until = Clock::now() + std::chrono::seconds(o.timeout_s);
  while (alive(p->pid) && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  bool killed = false;
  if (alive(p->pid)) {
    kill(p->pid, SIGKILL);
    killed = true;
    while (alive(p->pid)) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  fs::remove(pid_path(o));
  if (!quiet) {
    std::printf("tokenmill: stopped (pid %d)%s\n", p->pid,
                killed ? " -- killed after --timeout expired" : "");
  }
  return true;
}

void status(const DaemonOptions& o) {
  auto p = read_pid(o);
  if (!p || !alive(p->pid)) {
    if (p) fs::remove(pid_path(o));
    std::printf("tokenmill: not running\n");
    throw CLI::RuntimeError(3);
  }
  std::printf("tokenmill: running (pid %d) on http://%s:%d\n", p->pid, p->host.c_str(), p->port);
  httplib::Client c(p->host == "0.0.0.0" ? "127.0.0.1" : p->host, p->port);
  c.set_read_timeout(5);
  const char* key = std::getenv("TOKENMILL_API_KEY");
  httplib::Headers h;
  if (key && *key) h.emplace("Authorization", std::string("Bearer ") + key);
  if (!o.serve.api_key.empty()) h = {{"Authorization", "Bearer " + o.serve.api_key}};
  auto r = c.Get("/api/status", h);
  if (!r) {
    std::printf("  /api/status: no answer (still loading?)\n");
    return;
  }
  if (r->status != 200) {
    std::printf("  /api/status: HTTP %d (pass --api-key or set TOKENMILL_API_KEY)\n", r->status);
    return;
  }
  auto j = nlohmann::json::parse(r->body);
  std::printf("  uptime %.0f s, %d active request(s)\n", j.value("uptime_s", 0.0),
              j.value("active_requests", 0));
  for (const auto& m : j["models"]) {
    std::printf("  model %s: %d running, %d queued, cache %.1f / %.1f MiB, %.1f tok/s\n",
                m["name"].get<std::string>().c_str(), m["sequences"]["running"].get<int>(),
                m["sequences"]["queued"].get<int>(),
                m["memory"]["used_bytes"].get<double>() / (1 << 20),
                m["memory"]["budget_bytes"].get<double>() / (1 << 20),
                m["throughput"]["generated_tokens_per_s"].get<double>());
  }
}

void add_state_options(CLI::App& cmd, DaemonOptions& o) {
  cmd.add_option("--state-dir", o.state_dir,
                 "Folder for the pid and log files (default ~/.tokenmill)");
}

}  // namespace

void register_daemon(CLI::App& app) {
  auto o = std::make_shared<DaemonOptions>();
  auto* start_cmd = app.add_subcommand(
      "start", "Start the server in the background; returns once /health answers");
  add_serve_options(*start_cmd, o->serve);
  add_state_options(*start_cmd, *o);
  start_cmd->add_option("--wait", o->wait_s, "Seconds to wait for the server to answer")
      ->capture_default_str();
  start_cmd->callback([o] { start(*o); });

  auto* stop_cmd =
      app.add_subcommand("stop", "Stop the background server: drain, then cancel what is left");
  add_state_options(*stop_cmd, *o);
  stop_cmd
      ->add_option("--timeout", o->timeout_s,
                   "Seconds for in-flight requests before they are cancelled")
      ->capture_default_str();
  stop_cmd->callback([o] { stop(*o, false); });

  auto* restart_cmd = app.add_subcommand(
      "restart", "Stop and start again (with the previous options unless new ones are given)");
  add_serve_options(*restart_cmd, o->serve);
  add_state_options(*restart_cmd, *o);
  restart_cmd->add_option("--timeout", o->timeout_s, "Seconds to drain the old server")
      ->capture_default_str();
  restart_cmd->add_option("--wait", o->wait_s, "Seconds to wait for the new server")
      ->capture_default_str();
  restart_cmd->callback([o, restart_cmd] {
    DaemonOptions d = *o;
    auto prev = read_pid(d);
    bool given = restart_cmd->count("--model") || restart_cmd->count("--port") ||
                 restart_cmd->count("--host") || restart_cmd->count("--settings");
    stop(d, true);
    if (prev && !given) {
      // Re-run with the previous arguments.
      CLI::App tmp;
      ServeOptions s;
      add_serve_options(tmp, s);
      std::vector<std::string> args(prev->args.rbegin(), prev->args.rend());
      tmp.parse(args);
      s.api_key = d.serve.api_key;
      d.serve = s;
    }
    start(d);
  });

  auto* status_cmd =
      app.add_subcommand("status", "Is the background server running? Models, queue, memory");
  add_state_options(*status_cmd, *o);
  status_cmd->add_option("--api-key", o->serve.api_key,
                         "API key for /api/status (also $TOKENMILL_API_KEY)");
  status_cmd->callback([o] { status(*o); });
}

}  // namespace tokenmill::app
