#include "backend/cuda/cuda_check.h"

#include "util/error.h"

namespace tokenmill::cuda {

void cuda_fail(const char* file, int line, const char* what, const char* message, int code) {
  fail(
      "CUDA error at {}:{} in `{}`: {} (code {}); check that the GPU is healthy and that the "
      "model and batch fit in its memory",
      file, line, what, message, code);
}

void cuda_invalid(const char* file, int line, const char* message) {
  fail("cuda backend: {} ({}:{})", message, file, line);
}

}  // namespace tokenmill::cuda
