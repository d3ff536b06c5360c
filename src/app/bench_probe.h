// Device probes for bench: the ceilings the benchmark figures are compared against.
#pragma once

#include <string>

#include "backend/backend.h"
#include "util/thread_pool.h"

namespace tokenmill::app {

// "cpu: <model name>, N threads" or the GPU's name.
std::string describe_device(Backend& backend, int threads);
// Read bandwidth in GB/s: the backend's read_probe over a buffer far larger than the caches
// (1 GiB on the CPU, 4 GiB on a GPU), best of five runs after a warm-up.
double measure_read_bandwidth(Backend& backend, ThreadPool& pool);
// bf16-weight matmul rate in TFLOP/s through the backend's own linear op (the path prefill
// takes; on CUDA 8192x8192 weights times 2048 rows, on the CPU 2048x2048 times 128).
double measure_bf16_matmul(Backend& backend);

}  // namespace tokenmill::app
