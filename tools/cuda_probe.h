// Shared by the CUDA development probes (tools/*_probe): their one error path.
#pragma once

#include <cuda_runtime.h>
#include <errno.h>  // program_invocation_short_name (glibc)

#include <cstdio>
#include <cstdlib>

// Exits with the probe's name, the call that failed and CUDA's message.
inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s failed: %s\n", program_invocation_short_name, what,
                 cudaGetErrorString(e));
    std::exit(1);
  }
}
