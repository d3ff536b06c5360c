// Choosing and creating the backend for a command (--device cpu|cuda|auto).
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "util/thread_pool.h"

namespace CLI {
class App;
}

namespace tokenmill::app {

struct DeviceOptions {
  std::string device = "auto";  // cpu, cuda or auto (cuda when built and a GPU is present)
  int threads = 0;              // CPU threads; 0 = all hardware threads
  // Prefill matmuls on CUDA: exact (F32-accurate, F16 hi + lo passes) or fast (one F16 pass).
  std::string prefill_precision = "exact";
  // 4-bit GEMVs of 17-64 rows on Hopper: exact (F32-accurate) or fast (F16 weights x F16
  // activations, one pass).
  std::string batch_precision = "exact";
  // CUDA: bf16/8-bit decode GEMVs prefetch the next one's weights into L2 (bench's
  // --no-l2-prefetch turns it off to measure it).
  bool l2_prefetch = true;
};

void add_device_options(CLI::App& cmd, DeviceOptions& opt);

// --kv-dtype auto|f32|bf16 (the KV cache's element type) for the commands that run an engine.
void add_kv_dtype_option(CLI::App& cmd, std::string& kv_dtype);
// The DType a --kv-dtype value (or a model's "kv_cache_dtype" setting) names on this backend:
// "auto" is BF16 on a GPU backend that keeps it (what GPU engines store: half the memory and
// the decode reads of F32) and F32 on the CPU backend (exact, the reference).
DType kv_dtype_of(const std::string& kv_dtype, const Backend& backend);

// Owns the thread pool and the backend, in that order of construction.
struct BackendHandle {
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<Backend> backend;
};

BackendHandle make_backend(const DeviceOptions& opt);

// True for the CPU backend (its name is "cpu" plus the kernel ISA, e.g. "cpu (avx512)").
bool is_cpu_backend(const Backend& backend);

}  // namespace tokenmill::app
