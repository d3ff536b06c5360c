#include <cuda_runtime.h>

#include <string>

#include "backend/cuda/device_info.h"

namespace tokenmill::cuda {

std::string describe_devices() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(err);
  std::string out;
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    char line[256];
    snprintf(line, sizeof line, "%d: %s, %.1f GiB, sm_%d%d, %d SMs\n", i, p.name,
             static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0), p.major, p.minor,
             p.multiProcessorCount);
    out += line;
  }
  return out;
}

}  // namespace tokenmill::cuda
