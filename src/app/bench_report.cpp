#include "app/bench_report.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "util/error.h"

namespace tokenmill::app {

namespace {
// Achieved weight bandwidth of a decode rate, and its share of the measured read bandwidth.
double gbps(const BenchReport& r, double tok_s) {
  return tok_s * r.weight_bytes_per_token / 1e9;
}
double pct(const BenchReport& r, double tok_s) {
  return r.read_gbps > 0 ? 100.0 * gbps(r, tok_s) / r.read_gbps : 0.0;
}
}  // namespace

double prefill_tflops(const BenchReport& r, const BenchReport::Prefill& p) {
  const double n = p.tokens;
  const double flops =
      2.0 * n * static_cast<double>(r.layer_macs_per_token) +
      2.0 * static_cast<double>(r.attention_width) * n * (n + 1) * r.attention_layers;
  return p.tok_s > 0 ? flops / (n / p.tok_s) / 1e12 : 0.0;
}

void print_report(const BenchReport& r) {
  std::printf("\ntokenmill bench\n  device: %s\n  model:  %s\n  sampling: %s\n", r.device.c_str(),
              r.model.c_str(), r.sampling.c_str());
  std::printf("  measured read bandwidth %.1f GB/s, bf16 matmul %.3f TFLOP/s, load %.2f s",
              r.read_gbps, r.matmul_tflops, r.load_seconds);
  if (r.load_bytes > 0) {
    std::printf(" (%.2f GB of checkpoint files, %.2f GB/s)", r.load_bytes / 1e9,
                r.load_seconds > 0 ? r.load_bytes / 1e9 / r.load_seconds : 0.0);
  }
  std::printf("\n");
  std::printf("  weights read per decoded token: %.3f GB\n\n", r.weight_bytes_per_token / 1e9);
  std::printf("  %-28s %12s %10s %8s\n", "test", "tok/s", "GB/s", "% bw");
  for (const auto& p : r.prefill) {
    const double tf = prefill_tflops(r, p);
    std::printf("  prefill %-20d %12.1f %10s %8s   TTFT %.3f s, %.1f TFLOP/s", p.tokens, p.tok_s,
                "-", "-", p.ttft_s, tf);
    if (r.matmul_tflops > 0)
      std::printf(" (%.1f%% of the matmul rate)", 100.0 * tf / r.matmul_tflops);
    std::printf("\n");
  }
  for (const auto& d : r.decode) {
    std::printf("  decode @ context %-11d %12.2f %10.1f %7.1f%%\n", d.context, d.tok_s,
                gbps(r, d.tok_s), pct(r, d.tok_s));
  }
  for (const auto& b : r.batch) {
    std::printf("  batch %-4d aggregate %-7s %12.2f %10.1f %7.1f%%   per sequence %.2f\n", b.seqs,
                "", b.aggregate_tok_s, gbps(r, b.aggregate_tok_s / b.seqs),
                pct(r, b.aggregate_tok_s / b.seqs), b.per_seq_tok_s);
  }
  std::printf("\n  peak host memory %.2f GB, KV/state cache %.2f GB (KV in %s)\n",
              r.peak_host_bytes / 1e9, r.cache_bytes / 1e9, r.kv_dtype.c_str());
  if (r.peak_backend_bytes >= 0) {
    const bool device = r.device.rfind("cuda", 0) == 0;
    std::printf("  peak %s memory %.2f GB (weights, caches and workspaces allocated by the %s)\n",
                device ? "device" : "backend", r.peak_backend_bytes / 1e9,
                device ? "CUDA backend" : "backend");
  }
}

void write_report_json(const BenchReport& r, const std::string& path) {
  nlohmann::json j = {{"device", r.device},
                      {"model", r.model},
                      {"read_gbps", r.read_gbps},
                      {"bf16_matmul_tflops", r.matmul_tflops},
                      {"load_seconds", r.load_seconds},
                      {"load_bytes", r.load_bytes},
                      {"weight_bytes_per_token", r.weight_bytes_per_token},
                      {"peak_host_bytes", r.peak_host_bytes},
                      {"peak_backend_bytes", r.peak_backend_bytes},
                      {"cache_bytes", r.cache_bytes},
                      {"kv_dtype", r.kv_dtype},
                      {"sampling", r.sampling}};
  for (const auto& p : r.prefill) {
    const double tf = prefill_tflops(r, p);
    j["prefill"].push_back(
        {{"tokens", p.tokens},
         {"tok_s", p.tok_s},
         {"ttft_s", p.ttft_s},
         {"tflops", tf},
         {"pct_of_matmul", r.matmul_tflops > 0 ? 100.0 * tf / r.matmul_tflops : 0.0}});
  }
  for (const auto& d : r.decode) {
    j["decode"].push_back({{"context", d.context},
                           {"tok_s", d.tok_s},
                           {"gbps", gbps(r, d.tok_s)},
                           {"pct_of_read_bandwidth", pct(r, d.tok_s)}});
  }
  for (const auto& b : r.batch) {
    j["batch"].push_back({{"seqs", b.seqs},
                          {"aggregate_tok_s", b.aggregate_tok_s},
                          {"per_seq_tok_s", b.per_seq_tok_s}});
  }
  std::ofstream f(path);
  if (!f) fail("{}: cannot write the JSON report", path);
  f << j.dump(2) << "\n";
  std::fprintf(stderr, "wrote %s\n", path.c_str());
}

}  // namespace tokenmill::app
