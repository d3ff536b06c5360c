// Server settings: one JSON file (default ~/.tokenmill/settings.json) with sections server,
// auth, limits, cache and models, plus optional per-model settings files. Reading is strict:
// unknown keys, wrong types, out-of-range values and conflicting switches are errors that name
// the file, the key path and the reason. Paths inside a file are relative to that file's folder.
//
// settings.json:
//   {"server": {"host", "port", "threads", "keepalive_interval_ms", "max_body_bytes",
//               "request_timeout_s"},
//    "auth":   {"api_key" | "api_key_env"},
//    "limits": {"max_seqs", "max_queue", "max_step_tokens", "prefill_chunk", "prefer_decode",
//               "overlap_steps", "max_n"},  (step sizes left out: sized for the device,
//               step_limits_for)
//    "cache":  {"memory_budget_mb", "kv_block_size", "prefix_cache"},  (budget left out: sized
//               for the device, cache_budget_for)
//    "models": [ "DIR" | {"path": "DIR", "settings_file": "FILE", <model keys>} ],
//    "default_model": "NAME"}
// model keys (inline or in settings_file; a key in both places is a conflict):
//   {"name", "context_window", "max_output_tokens",
//    "sampling": {"temperature", "top_p", "top_k", "min_p", "repetition_penalty",
//                 "presence_penalty", "frequency_penalty"},
//    "thinking": {"enabled", "budget_tokens"}, "speculative": {"enabled", "draft_depth"},
//    "kv_cache_dtype": "auto"|"bf16"|"f16"|"f32"|"fp8", "pinned", "default"}
// Values this build cannot honour are errors, not ignored: speculative.enabled true,
// kv_cache_dtype "f16" / "fp8" (the KV cache is f32 or bf16; a backend that cannot keep bf16
// refuses it when the model starts), cache.prefix_cache true (no prefix cache yet).
// /api/status reports the effective values.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace tokenmill::server {

struct SamplingDefaults {
  std::optional<float> temperature, top_p, min_p, repetition_penalty, presence_penalty,
      frequency_penalty;
  std::optional<int> top_k;
};

struct ModelSettings {
  std::string path;           // model directory, resolved against the settings file's folder
  std::string name;           // the id clients use; default: the directory's base name
  int context_window = 0;     // tokens; 0 = the model's own limit
  int max_output_tokens = 0;  // per request; 0 = whatever fits in the context window
  SamplingDefaults sampling;  // used when a request gives no value
  bool thinking = true;       // reasoning on when a request does not say
  int thinking_budget = -1;   // reasoning tokens before </think> is forced; -1 = none
  bool speculative = false;   // MTP drafting (true is rejected: not implemented yet)
  int draft_depth = 0;        // drafted tokens per step when speculative (0 = engine default)
  std::string kv_cache_dtype = "auto";  // "auto" (bf16 on CUDA, f32 on the CPU), "f32", "bf16"
  bool pinned = false;                  // never unloaded
  bool is_default = false;              // serves requests that name no model
  std::string source;                   // the file(s) these settings came from, for messages
};

struct ServerSection {
  std::string host = "127.0.0.1";
  int port = 8000;
  int threads = 64;                     // HTTP worker threads
  int keepalive_interval_ms = 5000;     // SSE comment while nothing visible is produced
  int64_t max_body_bytes = 32LL << 20;  // larger request bodies get 413
  int request_timeout_s = 0;            // 0 = none
};

struct AuthSection {
  std::string api_key;  // empty = no auth
};

struct LimitsSection {
  int max_seqs = 16;  // sequences decoding at once (per model)
  int max_queue = 1024;
  // Tokens per forward step, and the largest prefill piece of one sequence per step. 0 (the
  // key left out) = sized for the device at serve time: step_limits_for.
  int max_step_tokens = 0;
  int prefill_chunk = 0;
  bool prefer_decode = true;
  // Greedy decode steps launched while the step before runs (EngineOptions::overlap_steps).
  bool overlap_steps = true;
  int max_n = 16;  // largest n (choices) per request
};

// The step limits a server runs with: the settings' values, and for those left out 512 / 256
// tokens on the CPU and 2048 / 1024 on a GPU (whose forward of a thousand tokens costs about
// what 256 do on a CPU, so a prefill chunk per step still keeps decodes flowing). A prefill
// chunk given alone raises an automatic step budget to fit it; a step budget given alone caps
// an automatic chunk.
struct StepLimits {
  int max_step_tokens = 0, prefill_chunk = 0;
  bool auto_step = false, auto_chunk = false;  // which came from the device default
};
StepLimits step_limits_for(const LimitsSection& limits, bool gpu);

struct CacheSection {
  int64_t memory_budget_mb = 0;  // KV blocks + state slots, per model; 0 (left out): auto
  int kv_block_size = 16;
  bool prefix_cache = false;  // true is rejected: the engine has no prefix cache yet
};

// The cache memory each model's engine gets (KV blocks + state slots), in bytes. Set: that.
// Left out: on the CPU (device_free_bytes < 0: host memory, shared with everything else) 2048
// MiB of KV blocks, to which engine_cache_bytes adds each model's state slots; on a GPU, 90% of the
// device memory free once every model's weights are loaded (and its largest step's scratch
// reserved), less kGpuScratchReserve for what is not reserved up front (recorded decode steps,
// library and driver allocations), split evenly between the models that left it out, and at least
// 512 MiB. Why: a fixed 2 GiB cannot hold the recurrent state of 16 sequences of a 27B model (about
// 150 MB each), so a default GPU server would not start.
inline constexpr int64_t kGpuScratchReserve = int64_t{3} << 30;
struct CacheBudget {
  int64_t bytes = 0;
  bool automatic = false;
};
CacheBudget cache_budget_for(const CacheSection& cache, int64_t device_free_bytes, int auto_models);
// One model's engine budget: `budget`, plus, for an automatic budget on the CPU, the recurrent
// state of max_seqs sequences (state_bytes_per_seq each): a 27B model's 16 slots take 2.4 GB,
// more than the whole 2 GiB default, so a default CPU server would not start.
int64_t engine_cache_bytes(const CacheBudget& budget, bool cpu, int max_seqs,
                           int64_t state_bytes_per_seq);

struct Settings {
  ServerSection server;
  AuthSection auth;
  LimitsSection limits;
  CacheSection cache;
  std::vector<ModelSettings> models;
  std::string default_model;  // name of the default model ("" = the first)
  std::string file;           // where these came from ("" = built-in defaults)

  // The model a request names ("" = the default); nullptr if none matches.
  const ModelSettings* find_model(const std::string& name) const;
};

// ~/.tokenmill/settings.json ($HOME; "" when HOME is unset).
std::string default_settings_path();

// Parses settings text; `file` names it in messages and anchors relative paths. Throws
// tokenmill::Error naming file, key path and reason.
Settings parse_settings(const std::string& text, const std::string& file);
// Reads and parses a file. `required` = false: a missing file gives the defaults.
Settings load_settings(const std::string& path, bool required = true);

// Model entries given on the command line (--model DIR): each takes its settings from the entry
// in `base` with the same resolved path (or directory name), else the defaults. Replaces
// base.models. Fails on two --model options naming the same model.
void apply_model_dirs(Settings& base, const std::vector<std::string>& dirs);

// Final consistency checks that need the whole picture (default model exists and is unique,
// names unique, at least one model). `where` names the source in messages.
void validate_models(const Settings& s, const std::string& where);

// The live settings of a running server. reload() re-reads the file; a bad file leaves the
// previous settings in place and returns the error message.
class SettingsStore {
 public:
  // `overrides` is applied to every reloaded file (command-line options win over the file).
  explicit SettingsStore(Settings initial, std::function<void(Settings&)> overrides = {});
  std::shared_ptr<const Settings> get() const;
  // Returns "" on success, else the reason the new file was rejected. The set of served model
  // directories cannot change without a restart: a file that adds or drops one is rejected.
  std::string reload();
  // Replaces the settings (already validated).
  void set(Settings s);

 private:
  std::function<void(Settings&)> overrides_;
  mutable std::mutex mu_;
  std::shared_ptr<const Settings> current_;
};

}  // namespace tokenmill::server
