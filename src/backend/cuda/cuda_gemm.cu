// Prefill GEMM (more than kGemvMaxRows activation rows) on tensor cores through cuBLAS: F16
// operands, F32 accumulation and output.
//
// The weight is dequantized (any format) to F16 in row slabs of a fixed workspace, so no
// full-precision copy of the model exists; the activations are scaled by one power of two that
// puts their largest magnitude in [2^14, 2^15) (F16 range; the GEMM's alpha, read from device
// memory, undoes it). Both operands are split into hi + lo F16 parts where F16 alone would round
// them: activations always, weights when they are F32 or affine (s*q + b; BF16 and F16 weights
// are exact in F16). The product is hi*hi + hi*lo (+ lo*hi): two or three GEMMs accumulating in
// F32, about 22 significant bits per operand, so prefill agrees with decode and with the CPU to
// F32 rounding. (One F16 GEMM was measured 5-15x the golden tolerance off on quantized models
// whose logits are large: 2^-12 relative error per weight is not small there.)
// PrefillPrecision::kFast
// (--prefill-precision fast) is that one pass, for those who trade the agreement for speed.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_common.cuh"

namespace tokenmill::cuda {
namespace {

#define TM_CUBLAS(expr)                                                            \
  do {                                                                             \
    const cublasStatus_t tm_st = (expr);                                           \
    TM_CUDA_REQUIRE(tm_st == CUBLAS_STATUS_SUCCESS, "cuBLAS call failed: " #expr); \
  } while (0)

__device__ __forceinline__ uint32_t pack_half2(__half a, __half b) {
  return static_cast<uint32_t>(__half_as_ushort(a)) |
         (static_cast<uint32_t>(__half_as_ushort(b)) << 16);
}

// Rows [r0, r0 + rows) of m as F16 hi [rows, m.cols] and, when lo != nullptr, the remainders
// lo = f16(w - hi); thread i converts 8 values (or fewer at the end of an odd-width row).
__global__ void dequant_f16_kernel(DevMat m, int64_t r0, int64_t rows, __half* __restrict__ out,
                                   __half* __restrict__ lo) {
  const int64_t per_row = (m.cols + 7) / 8;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * per_row) return;
  const int64_t r = r0 + i / per_row, j = (i % per_row) * 8;
  const uint8_t* row = m.data + r * m.row_bytes;
  const int64_t at = (r - r0) * m.cols + j;
  if (m.chunks8 && j + 8 <= m.cols && m.cols % 8 == 0) {
    float w[8];
    load8(m, row, r, j, w);
    uint32_t ph[4], pl[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const __half h0 = __float2half_rn(w[2 * k]), h1 = __float2half_rn(w[2 * k + 1]);
      ph[k] = pack_half2(h0, h1);
      pl[k] = pack_half2(__float2half_rn(w[2 * k] - __half2float(h0)),
                         __float2half_rn(w[2 * k + 1] - __half2float(h1)));
    }
    *reinterpret_cast<uint4*>(out + at) = make_uint4(ph[0], ph[1], ph[2], ph[3]);
    if (lo) *reinterpret_cast<uint4*>(lo + at) = make_uint4(pl[0], pl[1], pl[2], pl[3]);
  } else {
    for (int64_t k = j; k < j + 8 && k < m.cols; ++k) {
      const float v = load1(m, row, r, k);
      const __half h = __float2half_rn(v);
      out[at + k - j] = h;
      if (lo) lo[at + k - j] = __float2half_rn(v - __half2float(h));
    }
  }
}

__global__ void abs_max_kernel(const float* __restrict__ x, int64_t n,
                               unsigned* __restrict__ max_bits) {
  __shared__ float red[32];
  float m = 0.0f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    m = fmaxf(m, fabsf(x[i]));
  }
  m = block_max(m, red);
  // Non-negative floats order like their bit patterns.
  if (threadIdx.x == 0) atomicMax(max_bits, __float_as_uint(m));
}

__device__ __forceinline__ int act_exponent(unsigned max_bits) {
  const float m = __uint_as_float(max_bits);
  return m > 0.0f && m <= FLT_MAX ? min(max(14 - ilogbf(m), -126), 126) : 0;
}

// hi/lo F16 parts of x * 2^e; consts[0] = 2^-e (the GEMM's alpha).
__global__ void split_f16_kernel(const float* __restrict__ x, int64_t n,
                                 const unsigned* __restrict__ max_bits, __half* __restrict__ hi,
                                 __half* __restrict__ lo, float* __restrict__ consts) {
  const int e = act_exponent(*max_bits);
  const float f = ldexpf(1.0f, e);
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i == 0) consts[0] = ldexpf(1.0f, -e);
  if (i >= n) return;
  const float s = x[i] * f;
  const __half h = __float2half_rn(s);
  hi[i] = h;
  if (lo) lo[i] = __float2half_rn(s - __half2float(h));
}

}  // namespace
}  // namespace tokenmill::cuda

namespace tokenmill {

void CudaBackend::init_gemm() {
  cublasHandle_t h = nullptr;
  TM_CUBLAS(cublasCreate(&h));
  cublas_ = h;
  TM_CUBLAS(cublasSetStream(h, stream_));
  TM_CUBLAS(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_DEVICE));
  gemm_consts_ = static_cast<float*>(alloc(256));
  owned_.push_back(gemm_consts_);
  const float init[4] = {1.0f, 0.0f, 1.0f, 0.0f};  // alpha, beta 0, beta 1, max bits
  TM_CUDA(cudaMemcpy(gemm_consts_, init, sizeof init, cudaMemcpyHostToDevice));
  gemm_w_ = alloc(kGemmSlabBytes);
  owned_.push_back(gemm_w_);
  // A workspace of our own: cuBLAS must not allocate while a decode step is being recorded.
  void* ws = alloc(kCublasWorkspaceBytes);
  owned_.push_back(ws);
  TM_CUBLAS(cublasSetWorkspace(h, ws, kCublasWorkspaceBytes));
  gemm_x_ = alloc(kGemmInitialXBytes);
  gemm_x_bytes_ = kGemmInitialXBytes;
}

void CudaBackend::destroy_gemm() {
  if (cublas_) cublasDestroy(static_cast<cublasHandle_t>(cublas_));
  cublas_ = nullptr;
  if (gemm_x_) cudaFree(gemm_x_);
  gemm_x_ = nullptr;
  if (gdn_ws_) cudaFree(gdn_ws_);
  gdn_ws_ = nullptr;
}

size_t CudaBackend::gemm_x_bytes(int64_t n, int64_t cols) {
  return static_cast<size_t>(n * cols) * 2 * sizeof(__half);
}

void CudaBackend::gemm(const float* x, int64_t n, const cuda::DevMat& m, float* out) {
  const int64_t K = m.cols, elems = n * K;
  grow_workspace(&gemm_x_, &gemm_x_bytes_, gemm_x_bytes(n, K), "prefill GEMM");
  // kFast: the hi parts only (one pass, F16 rounding of both operands).
  const bool fast = prefill_precision_ == PrefillPrecision::kFast;
  auto* hi = static_cast<__half*>(gemm_x_);
  __half* lo = fast ? nullptr : hi + elems;
  auto* max_bits = reinterpret_cast<unsigned*>(gemm_consts_ + 3);
  TM_CUDA(cudaMemsetAsync(max_bits, 0, sizeof(unsigned), stream_));
  const int threads = 256;
  const auto grid_max =
      static_cast<unsigned>(std::min<int64_t>((elems + threads - 1) / threads, 1024));
  cuda::abs_max_kernel<<<grid_max, threads, 0, stream_>>>(x, elems, max_bits);
  TM_CUDA_LAUNCHED();
  cuda::split_f16_kernel<<<cuda::blocks_for(elems, threads), threads, 0, stream_>>>(
      x, elems, max_bits, hi, lo, gemm_consts_);
  TM_CUDA_LAUNCHED();

  auto* h = static_cast<cublasHandle_t>(cublas_);
  const bool exact_in_f16 = m.bits == 0 && m.dtype != cuda::kF32;
  // Half of the slab workspace each for the weights' hi and lo parts.
  const int64_t slab = static_cast<int64_t>(kGemmSlabBytes / 2 / sizeof(__half)) / K / 16 * 16;
  TM_CUDA_REQUIRE(slab >= 16, "linear: rows too wide for the GEMM workspace");
  auto* w_hi = static_cast<__half*>(gemm_w_);
  __half* w_lo = exact_in_f16 || fast ? nullptr : w_hi + kGemmSlabBytes / 2 / sizeof(__half);
  const int ik = static_cast<int>(K), in = static_cast<int>(n), ld_out = static_cast<int>(m.rows);
  for (int64_t r0 = 0; r0 < m.rows; r0 += slab) {
    const int64_t rows = std::min(slab, m.rows - r0);
    const int64_t items = rows * ((K + 7) / 8);
    cuda::dequant_f16_kernel<<<cuda::blocks_for(items, threads), threads, 0, stream_>>>(m, r0, rows,
                                                                                        w_hi, w_lo);
    TM_CUDA_LAUNCHED();
    // Column-major view: out^T [rows, n] (ld m.rows) = W [K, rows]^T * x [K, n], as
    // W_hi x_hi (beta 0) + W_hi x_lo + W_lo x_hi (beta 1).
    const __half* ws[3] = {w_hi, w_hi, w_lo};
    const __half* xs[3] = {hi, lo, hi};
    const int parts = fast ? 1 : w_lo ? 3 : 2;
    for (int part = 0; part < parts; ++part) {
      TM_CUBLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), in, ik,
                             gemm_consts_, ws[part], CUDA_R_16F, ik, xs[part], CUDA_R_16F, ik,
                             gemm_consts_ + (part == 0 ? 1 : 2), out + r0, CUDA_R_32F, ld_out,
                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
  }
}

}  // namespace tokenmill
