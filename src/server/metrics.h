// Prometheus metrics: request counters, token counters, TTFT / time-per-output-token /
// request-duration histograms, and engine gauges (running and queued sequences, batch size,
// cache use, cache-hit tokens, process memory). Thread-safe; one object per server.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "server/generation.h"

namespace tokenmill::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds)
      : bounds_(std::move(bounds)), counts_(bounds_.size() + 1) {}
  void observe(double v);
  // Appends the _bucket, _sum and _count lines of `name` with `labels` ("" or `a="b"`).
  void render(std::string& out, const std::string& name, const std::string& labels) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  // One finished generation request on `route` (e.g. "chat"), with its HTTP status.
  void request_done(const std::string& model, const std::string& route, int status,
                    const Usage& usage, double ttft_s, double duration_s);
  // A request refused before generation (bad input, auth): counted by status only.
  void request_refused(const std::string& route, int status);
  std::string render(const std::vector<ServedModel>& models, int active_requests) const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, uint64_t> requests_;  // key: labels text
  std::map<std::string, uint64_t> prompt_tokens_, generation_tokens_, cached_tokens_;
  std::map<std::string, Histogram> ttft_, tpot_, duration_;
};

// Resident set size of this process in bytes (0 if unknown).
int64_t process_rss_bytes();

}  // namespace tokenmill::server
