// Internal to backend/cuda (.cu files): the fast decode GEMV of cuda_gemv.cu.
#pragma once

#include "backend/cuda/cuda_common.cuh"

namespace tokenmill::cuda {

enum class GemvKind { kNone, kBf16, kQ4, kQ8 };

constexpr int kMaxGemvJobs = 4;

// Up to four matrices sharing one input; out[j] is [n, m[j].rows]. first_block is filled by
// launch_gemv_fast.
struct GemvJobs {
  DevMat m[kMaxGemvJobs];
  float* out[kMaxGemvJobs] = {};
  int first_block[kMaxGemvJobs] = {};
  int count = 0;
};

// The fast kernel that handles `m`, or kNone (other formats, odd sizes, unaligned data).
GemvKind fast_gemv_kind(const DevMat& m);

// out[j][i, r] = W_j[r, :] . x[i, :] for i < n (1..16), all jobs of the same kind.
void launch_gemv_fast(cudaStream_t st, GemvKind kind, GemvJobs jobs, const float* x, int64_t ldx,
                      int n);

}  // namespace tokenmill::cuda
