// Error reporting for the CUDA backend, usable from .cu files: plain declarations only (the
// definitions live in cuda_check.cpp, which is where tokenmill::Error and fmt are included;
// nvcc must not see those headers).
#pragma once

namespace tokenmill::cuda {

// Throws tokenmill::Error "CUDA error at file:line in `what`: message (code N)".
[[noreturn]] void cuda_fail(const char* file, int line, const char* what, const char* message,
                            int code);
// Throws tokenmill::Error "cuda backend: message (file:line)" for invalid op arguments.
[[noreturn]] void cuda_invalid(const char* file, int line, const char* message);

}  // namespace tokenmill::cuda

// Checks a CUDA runtime call (expands only in translation units that include cuda_runtime.h).
#define TM_CUDA(call)                                                                           \
  do {                                                                                          \
    const cudaError_t tm_cuda_err_ = (call);                                                    \
    if (tm_cuda_err_ != cudaSuccess)                                                            \
      ::tokenmill::cuda::cuda_fail(__FILE__, __LINE__, #call, cudaGetErrorString(tm_cuda_err_), \
                                   static_cast<int>(tm_cuda_err_));                             \
  } while (0)

// Checks the launch just made (configuration errors surface here; faults surface at the next
// synchronising call).
#define TM_CUDA_LAUNCHED() TM_CUDA(cudaGetLastError())

#define TM_CUDA_REQUIRE(cond, message)                                         \
  do {                                                                         \
    if (!(cond)) ::tokenmill::cuda::cuda_invalid(__FILE__, __LINE__, message); \
  } while (0)
