#include "app/backend_select.h"

#include <CLI/CLI.hpp>

#include "backend/cpu/cpu_backend.h"
#include "util/error.h"

namespace tokenmill::app {

void add_device_options(CLI::App& cmd, DeviceOptions& opt) {
  cmd.add_option("--device", opt.device, "cpu, cuda or auto")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  cmd.add_option("--threads", opt.threads, "CPU threads (0 = all)")->capture_default_str();
}

BackendHandle make_backend(const DeviceOptions& opt) {
  BackendHandle h;
  h.pool = std::make_unique<ThreadPool>(opt.threads);
  if (opt.device == "cuda") {
    fail("--device cuda: the CUDA backend does not implement the model ops yet; use --device cpu");
  }
  h.backend = make_cpu_backend(*h.pool);
  return h;
}

}  // namespace tokenmill::app
