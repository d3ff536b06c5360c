// GET /api/status: models, memory budget and use, queue, throughput (JSON). A sampler thread
// records engine counters once a second so throughput is measured over the last minute.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "server/generation.h"
#include "server/settings.h"

namespace tokenmill::server {

class StatusSampler {
 public:
  ~StatusSampler() { stop(); }
  void start(std::function<std::vector<EngineStats>()> read);
  void stop();
  // Generated and prompt tokens per second of model i over the sampled window (up to 60 s).
  std::pair<double, double> throughput(size_t model) const;

 private:
  struct Sample {
    double t;
    std::vector<EngineStats> stats;
  };
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::deque<Sample> samples_;
  std::thread thread_;
};

struct StatusInputs {
  std::shared_ptr<const Settings> settings;
  const std::vector<ServedModel>* models = nullptr;
  int active_requests = 0;
  bool draining = false;
  double uptime_s = 0;
};

std::string status_json(const StatusInputs& in, const StatusSampler& sampler);

}  // namespace tokenmill::server
