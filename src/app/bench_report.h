// Bench results: the printed table, the JSON file and the chart.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tokenmill::app {

struct BenchReport {
  std::string device, model;
  double read_gbps = 0, matmul_tflops = 0, load_seconds = 0;
  int64_t load_bytes = 0;  // checkpoint files read by the load (0: dummy weights, generated)
  int64_t weight_bytes_per_token = 0;
  // A prefill's arithmetic: multiply-adds per token through the layers' matrices, and the
  // attention layers' width (query heads x head_dim) and count, for the causal products.
  int64_t layer_macs_per_token = 0;
  int64_t attention_width = 0;
  int attention_layers = 0;
  int64_t peak_host_bytes = 0, cache_bytes = 0;
  // The most memory held through the backend at once (on CUDA: device memory for weights,
  // caches and workspaces); -1 when the backend does not count it.
  int64_t peak_backend_bytes = -1;
  std::string kv_dtype = "f32";     // the KV cache's element type
  std::string sampling = "greedy";  // how decoded tokens are chosen
  struct Prefill {
    int tokens;
    double tok_s, ttft_s;
  };
  struct Decode {
    int context;
    double tok_s, ttft_s;
  };
  struct Batch {
    int seqs;
    double aggregate_tok_s, per_seq_tok_s;
  };
  std::vector<Prefill> prefill;
  std::vector<Decode> decode;
  std::vector<Batch> batch;
};

// TFLOP/s of a prefill: the layers' matrices (2 FLOP per multiply-add per token) and the
// attention's two causal products (token i against i + 1 keys); not the GDN mixer's own
// products, the head or the element-wise ops.
double prefill_tflops(const BenchReport& r, const BenchReport::Prefill& p);
void print_report(const BenchReport& r);
void write_report_json(const BenchReport& r, const std::string& path);
// The chart as an SVG document (bench_chart.cpp): decode tok/s against context and aggregate
// tok/s against concurrent sequences.
std::string report_chart_svg(const BenchReport& r);
void write_report_chart(const BenchReport& r, const std::string& path);

}  // namespace tokenmill::app
