// `tokenmill bench DIR | --preset NAME [--dummy-weights] [--quant q4g64|bf16]`: measures the
// device (read bandwidth, matmul rate), then prefill, decode at several contexts and a batch sweep
// through the real engine, and reports tok/s with the bytes each decoded token reads and the
// fraction of the measured bandwidth that achieves. Prints a table, writes JSON and a chart.
#include <sys/resource.h>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "app/backend_select.h"
#include "app/bench_presets.h"
#include "app/bench_probe.h"
#include "app/bench_report.h"
#include "app/commands.h"
#include "app/model_loading.h"
#include "backend/profiling_backend.h"
#include "cache/cache_manager.h"
#include "engine/engine.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "model/synthetic.h"
#include "util/error.h"

namespace tokenmill::app {

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

struct BenchOptions {
  std::string dir, preset, quant = "q4g64", json_path = "bench.json", chart_path = "bench.svg";
  std::string write_checkpoint;  // --write-checkpoint DIR: write the preset there and stop
  bool dummy = false;
  bool no_graphs = false;
  bool no_overlap = false;
  bool no_l2_prefetch = false;
  bool profile_ops = false;
  std::vector<int> prompts, contexts, batches;
  int decode_tokens = 32;
  int64_t cache_mb = 0;
  std::string kv_dtype = "auto";
  // Decoding: greedy by default; a temperature above 0 samples (with top-k / top-p as given),
  // which is what chat clients usually ask for.
  float temperature = 0.0f, top_p = 1.0f;
  int top_k = 0;
  float presence_penalty = 0.0f;  // what Qwen's cards suggest against endless repetition
  DeviceOptions device;
};

struct Timeline {
  std::vector<std::vector<double>> token_times;  // per request, seconds since start
};

// Submits `prompts` at once and records when each token arrives.
Timeline run_requests(Engine& e, const std::vector<std::vector<int32_t>>& prompts, int max_tokens,
                      Clock::time_point start, const SamplingParams& sampling) {
  std::vector<GenerationRequest> requests;
  for (const auto& p : prompts) {
    GenerationRequest r;
    r.prompt = p;
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.sampling = sampling;
    r.sampling.seed = 7 + static_cast<uint64_t>(requests.size());
    requests.push_back(std::move(r));
  }
  const std::vector<std::shared_ptr<RequestStream>> streams = e.submit_all(std::move(requests));
  Timeline t;
  t.token_times.resize(prompts.size());
  std::vector<bool> done(prompts.size(), false);
  size_t left = prompts.size();
  while (left > 0) {
    for (size_t i = 0; i < streams.size(); ++i) {
      if (done[i]) continue;
      for (TokenEvent& ev : streams[i]->wait(std::chrono::milliseconds(1))) {
        // The engine's time for the token, not this loop's: it drains a stream in bursts (a 1 ms
        // wait per stream), which would give a burst's tokens one time.
        double at = std::chrono::duration<double>(ev.queued_at - start).count();
        if (ev.token >= 0) t.token_times[i].push_back(at);
        if (ev.finished) {
          if (ev.finish_reason == FinishReason::kError)
            fail("benchmark request failed: {}", ev.error);
          done[i] = true;
          --left;
        }
      }
    }
  }
  return t;
}

std::vector<int32_t> random_prompt(int n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 r(seed);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<int32_t>(r() % static_cast<uint64_t>(vocab));
  return v;
}

// --write-checkpoint: the preset's dummy weights as a model directory on disk.
void write_checkpoint_command(const BenchOptions& o) {
  if (o.preset.empty() || !o.dir.empty()) {
    fail(
        "--write-checkpoint DIR needs --preset NAME (and no model directory): it writes the "
        "preset's model into DIR");
  }
  if (fs::exists(fs::path(o.write_checkpoint) / "config.json")) {
    fail("{}: already holds a model (config.json); give an empty or new directory",
         o.write_checkpoint);
  }
  SyntheticSpec spec = find_preset(o.preset).spec;
  apply_quant(spec, o.quant);
  std::fprintf(stderr, "writing %s %s (%.2f GB of weights) to %s ...\n", o.preset.c_str(),
               o.quant.c_str(), synthetic_weight_bytes(spec) / 1e9, o.write_checkpoint.c_str());
  const auto t0 = Clock::now();
  write_random_checkpoint(o.write_checkpoint, spec);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  const double gb = static_cast<double>(checkpoint_file_bytes(o.write_checkpoint)) / 1e9;
  std::printf("wrote %s: %.2f GB in %.1f s (%.2f GB/s); `tokenmill bench %s` loads it\n",
              o.write_checkpoint.c_str(), gb, s, s > 0 ? gb / s : 0.0, o.write_checkpoint.c_str());
}

void bench_command(BenchOptions o) {
  if (!o.write_checkpoint.empty()) return write_checkpoint_command(o);
  if (o.dir.empty() == o.preset.empty()) fail("give either a model directory or --preset NAME");
  if (!o.preset.empty() && !o.dummy) {
    fail("--preset needs --dummy-weights (random weights at the preset's real shapes)");
  }
  o.device.l2_prefetch = !o.no_l2_prefetch;
  BackendHandle be = make_backend(o.device);
  const bool cpu = is_cpu_backend(*be.backend);
  if (o.prompts.empty())
    o.prompts = cpu ? std::vector<int>{128, 512} : std::vector<int>{512, 8192, 32768};
  if (o.contexts.empty())
    o.contexts = cpu ? std::vector<int>{128, 1024} : std::vector<int>{1024, 8192, 32768};
  if (o.batches.empty()) o.batches = cpu ? std::vector<int>{1, 4} : std::vector<int>{1, 4, 16, 64};

  // --profile-ops: every op synchronized and timed (see ProfilingBackend); the figures of such a
  // run measure the profile, not the engine.
  std::unique_ptr<ProfilingBackend> prof;
  if (o.profile_ops) prof = std::make_unique<ProfilingBackend>(*be.backend);
  Backend& backend = prof ? static_cast<Backend&>(*prof) : *be.backend;
  BenchReport rep;
  rep.device = describe_device(*be.backend, be.pool->size());
  // The modes in effect, not the ones asked for (make_backend notes those the device lacks).
  const PrecisionModes modes = be.backend->precision_modes();
  if (modes.prefill_fast) rep.device += ", prefill precision fast (one F16 pass per matmul)";
  if (modes.batch_fast)
    rep.device += ", batch precision fast (17-64-row 4-bit matmuls in one F16 pass)";
  if (!o.device.l2_prefetch) {
    if (cpu) {
      std::fprintf(stderr, "note: --no-l2-prefetch has no effect on the CPU backend\n");
    } else {
      rep.device += ", no L2 prefetch";
    }
  }
  std::fprintf(stderr, "probing %s ...\n", rep.device.c_str());
  rep.read_gbps = measure_read_bandwidth(*be.backend, *be.pool);
  rep.matmul_tflops = measure_bf16_matmul(*be.backend);

  auto t_load = Clock::now();
  std::unique_ptr<Model> model;
  ModelOptions mo;
  mo.record_decode = !o.no_graphs;
  if (!o.preset.empty()) {
    // Dummy weights are generated where they live (on the device for CUDA): no files.
    SyntheticSpec spec = find_preset(o.preset).spec;
    apply_quant(spec, o.quant);
    rep.model = o.preset + " " + o.quant + " (dummy weights)";
    std::fprintf(stderr, "generating %s (%.2f GB of weights) on %s ...\n", rep.model.c_str(),
                 synthetic_weight_bytes(spec) / 1e9, be.backend->name().c_str());
    model = Model::from_checkpoint(
        std::make_unique<Checkpoint>(synthetic_checkpoint_in_memory(spec, o.preset)), backend, mo);
    be.backend->synchronize();
  } else {
    rep.model = o.dir;
    model = load_model_weights(o.dir, backend, mo);
    be.backend->synchronize();
    rep.load_bytes = checkpoint_file_bytes(o.dir);
  }
  rep.load_seconds = std::chrono::duration<double>(Clock::now() - t_load).count();
  rep.weight_bytes_per_token = model->weights().weight_bytes;
  rep.layer_macs_per_token = model->weights().layer_macs_per_token;
  rep.attention_width = static_cast<int64_t>(model->config().num_heads) * model->config().head_dim;
  rep.attention_layers = model->config().num_full_attention_layers();
  const int64_t V = model->config().vocab_size;

  constexpr int kBatchPrompt = 64;  // tokens of each prompt of the batch sweep
  int max_len = 0;
  for (int p : o.prompts) max_len = std::max(max_len, p);
  for (int c : o.contexts) max_len = std::max(max_len, c + o.decode_tokens);
  if (!o.batches.empty()) max_len = std::max(max_len, kBatchPrompt + o.decode_tokens);
  int max_batch = 1;
  for (int b : o.batches) max_batch = std::max(max_batch, b);
  EngineOptions eo;
  eo.kv_dtype = kv_dtype_of(o.kv_dtype, *be.backend);
  rep.kv_dtype = kv_dtype_setting_name(eo.kv_dtype);
  SamplingParams sp;
  sp.temperature = o.temperature;
  sp.top_k = o.top_k;
  sp.top_p = o.top_p;
  sp.presence_penalty = o.presence_penalty;
  rep.sampling = o.temperature > 0 ? fmt::format("temperature {}, top-k {}, top-p {}",
                                                 o.temperature, o.top_k, o.top_p)
                                   : "greedy";
  if (o.presence_penalty != 0.0f) {
    rep.sampling += fmt::format(", presence penalty {}", o.presence_penalty);
  }
  eo.max_seqs = max_batch;
  eo.overlap_steps = !o.no_overlap;
  eo.host_pool = be.pool.get();  // sampled rows of a step in parallel
  eo.max_step_tokens = cpu ? 512 : 8192;
  eo.prefill_chunk = eo.max_step_tokens;
  eo.max_context = max_len + 8;
  const CacheGeometry& g = model->geometry();
  const int64_t kv_token = g.kv_bytes_per_token(eo.kv_dtype);
  int64_t need = int64_t{max_batch} *
                 (g.state_bytes_per_seq() + kv_token * (std::max(512, max_len / max_batch) + 64));
  need = std::max(need, kv_token * (max_len + 64) + g.state_bytes_per_seq() * max_batch);
  eo.memory_budget_bytes = o.cache_mb > 0 ? o.cache_mb << 20 : need + (64LL << 20);
  Engine engine(*model, eo);

  // One untimed request per step size first: the first use of a kernel (lazy module loading,
  // cuBLAS's kernel choice per shape) costs up to a second on CUDA, which is not prefill speed.
  // Prompts longer than a step run as steps of max_step_tokens, so that size covers them.
  std::vector<int> warm;
  for (int p : o.prompts) {
    const int w = std::min(p, eo.max_step_tokens);
    if (std::find(warm.begin(), warm.end(), w) == warm.end()) warm.push_back(w);
  }
  for (int w : warm) run_requests(engine, {random_prompt(w, V, 500 + w)}, 1, Clock::now(), sp);
  if (prof) prof->reset();  // the profile covers the timed runs only
  for (int p : o.prompts) {
    auto start = Clock::now();
    Timeline t = run_requests(engine, {random_prompt(p, V, 1000 + p)}, 1, start, sp);
    double ttft = t.token_times[0].at(0);
    rep.prefill.push_back({p, p / ttft, ttft});
    std::fprintf(stderr, "prefill %6d tokens: %9.1f tok/s (TTFT %.3f s)\n", p, p / ttft, ttft);
  }
  // The profile in two parts: the timed prompts, then the decode runs and the batch sweep.
  std::string prefill_profile;
  if (prof) {
    prefill_profile = prof->report();
    prof->reset();
  }
  for (int c : o.contexts) {
    auto start = Clock::now();
    Timeline t = run_requests(engine, {random_prompt(c, V, 2000 + c)}, o.decode_tokens, start, sp);
    const auto& tt = t.token_times[0];
    double rate = (tt.size() - 1) / (tt.back() - tt.front());
    rep.decode.push_back({c, rate, tt.front()});
    std::fprintf(stderr, "decode at context %6d: %9.2f tok/s\n", c, rate);
  }
  for (int b : o.batches) {
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < b; ++i) prompts.push_back(random_prompt(kBatchPrompt, V, 3000 + i));
    auto start = Clock::now();
    Timeline t = run_requests(engine, prompts, o.decode_tokens, start, sp);
    // Steady state: from when the last request got its first token until the first finished.
    double from = 0, to = 1e300;
    for (const auto& tt : t.token_times) {
      from = std::max(from, tt.front());
      to = std::min(to, tt.back());
    }
    int64_t tokens = 0;
    for (const auto& tt : t.token_times) {
      for (double x : tt) tokens += (x > from && x <= to) ? 1 : 0;
    }
    double agg = to > from ? tokens / (to - from) : 0.0;
    rep.batch.push_back({b, agg, agg / b});
    std::fprintf(stderr, "batch %3d: %9.2f tok/s aggregate, %8.2f per sequence\n", b, agg, agg / b);
  }
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  rep.peak_host_bytes = static_cast<int64_t>(ru.ru_maxrss) * 1024;
  rep.cache_bytes = engine.stats().cache_bytes_total;
  rep.peak_backend_bytes = be.backend->peak_allocated_bytes();
  print_report(rep);
  const EngineStats es = engine.stats();
  std::printf("  steps: %llu, %llu of them launched while the step before ran (%s)\n",
              static_cast<unsigned long long>(es.steps),
              static_cast<unsigned long long>(es.steps_overlapped),
              o.no_overlap ? "--no-overlap" : "overlapped steps");
  if (backend.can_record()) {  // backends that replay recorded steps (CUDA graphs)
    const Model::RecordStats& rs = model->record_stats();
    std::printf("  decode steps recorded (CUDA graphs): %lld recordings in %.3f s, %lld replays\n",
                static_cast<long long>(rs.recordings), rs.seconds,
                static_cast<long long>(rs.replays));
  }
  if (prof) {
    std::printf("\nper-op device time (--profile-ops), the timed prompts\n%s",
                prefill_profile.c_str());
    std::printf(
        "\nper-op device time (--profile-ops), the decode runs and the batch sweep (their "
        "prompts' prefill included)\n%s",
        prof->report().c_str());
  }
  write_report_json(rep, o.json_path);
  write_report_chart(rep, o.chart_path);
}

}  // namespace

void register_bench(CLI::App& app) {
  auto opt = std::make_shared<BenchOptions>();
  auto* cmd = app.add_subcommand("bench", "Benchmark prefill, decode and batching on this device");
  cmd->add_option("dir", opt->dir, "Model directory (or use --preset)");
  cmd->add_option("--preset", opt->preset, "qwen3.5-27b, qwen3.5-35b-a3b or cpu-120m");
  cmd->add_flag("--dummy-weights", opt->dummy, "Random weights at the preset's real shapes");
  cmd->add_option("--write-checkpoint", opt->write_checkpoint,
                  "Write the preset's dummy weights (the same values) as a model directory "
                  "(config.json, model.safetensors) and stop; `bench DIR` then measures loading "
                  "it from disk");
  cmd->add_flag("--profile-ops", opt->profile_ops,
                "Time every op (synchronizing after each) and print where the time goes, for the "
                "timed prompts and for the decode runs apart (the linear ops with their TFLOP/s)");
  cmd->add_flag("--no-graphs", opt->no_graphs,
                "Launch every op of a decode step (no recorded CUDA graphs), for comparison");
  cmd->add_flag("--no-overlap", opt->no_overlap,
                "Wait for each decode step's results before launching the next, for comparison");
  cmd->add_flag("--no-l2-prefetch", opt->no_l2_prefetch,
                "CUDA: bf16/8-bit decode GEMVs do not prefetch the next one's weights into L2, "
                "for comparison");
  cmd->add_option("--quant", opt->quant, "bf16 or q<bits>g<group> for --preset")
      ->capture_default_str();
  cmd->add_option("--prompt-lengths", opt->prompts, "Prefill lengths (default by device)")
      ->delimiter(',')
      ->check(CLI::Range(1, std::numeric_limits<int>::max()));
  cmd->add_option("--contexts", opt->contexts, "Decode contexts (default by device)")
      ->delimiter(',')
      ->check(CLI::Range(1, std::numeric_limits<int>::max()));
  cmd->add_option("--batches", opt->batches, "Concurrent sequences (default by device)")
      ->delimiter(',')
      ->check(CLI::Range(1, std::numeric_limits<int>::max()));
  cmd->add_option("--decode-tokens", opt->decode_tokens, "Tokens per decode run")
      ->capture_default_str()
      ->check(CLI::Range(1, std::numeric_limits<int>::max()));
  cmd->add_option("--cache-mb", opt->cache_mb, "KV/state memory (default: what the runs need)");
  cmd->add_option("--temperature", opt->temperature, "Sample at this temperature (0: greedy)")
      ->capture_default_str()
      ->check(CLI::Range(0.0f, 100.0f));
  cmd->add_option("--top-k", opt->top_k, "Sampling: keep the k most probable tokens (0: all)")
      ->capture_default_str()
      ->check(CLI::Range(0, std::numeric_limits<int>::max()));
  cmd->add_option("--top-p", opt->top_p, "Sampling: keep the smallest set holding this mass")
      ->capture_default_str()
      ->check(CLI::Range(0.0f, 1.0f));
  cmd->add_option("--presence-penalty", opt->presence_penalty,
                  "Sampling: subtract this from the logit of every token already generated")
      ->capture_default_str()
      ->check(CLI::Range(-2.0f, 2.0f));
  cmd->add_option("--json", opt->json_path, "JSON output file")->capture_default_str();
  cmd->add_option("--chart", opt->chart_path, "Chart output (SVG)")->capture_default_str();
  add_device_options(*cmd, opt->device);
  add_kv_dtype_option(*cmd, opt->kv_dtype);
  cmd->callback([opt] { bench_command(*opt); });
}

}  // namespace tokenmill::app
