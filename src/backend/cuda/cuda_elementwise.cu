// Elementwise and normalisation ops, rope and the MoE router (topk_softmax). Row reductions
// run one block per row with F32 tree sums (the CPU sums in F32 too, in another order: the
// results agree to a few F32 ulps).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_common.cuh"

namespace tokenmill::cuda {
namespace {

constexpr int kThreads = 256;

int row_threads(int dim) {
  return dim >= 256 ? 256 : dim > 64 ? 128 : 32;
}

__global__ void rmsnorm_kernel(const float* x, const float* __restrict__ w, float* out, int dim,
                               float eps) {
  pdl_begin();
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * dim;
  float ss = 0.0f;
  for (int j = threadIdx.x; j < dim; j += blockDim.x) ss += xr[j] * xr[j];
  const float inv = 1.0f / sqrtf(block_sum(ss, red) / static_cast<float>(dim) + eps);
  float* o = out + r * dim;  // may alias x: each element is read before its own write
  for (int j = threadIdx.x; j < dim; j += blockDim.x) o[j] = xr[j] * inv * w[j];
}

// x += y, then out = rmsnorm(x) * w; each thread re-reads only the x elements it wrote.
__global__ void add_rmsnorm_kernel(float* __restrict__ x, const float* __restrict__ y,
                                   const float* __restrict__ w, float* __restrict__ out, int dim,
                                   float eps) {
  pdl_begin();
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  float* xr = x + r * dim;
  const float* yr = y + r * dim;
  float ss = 0.0f;
  for (int j = threadIdx.x; j < dim; j += blockDim.x) {
    const float v = xr[j] + yr[j];
    xr[j] = v;
    ss += v * v;
  }
  const float inv = 1.0f / sqrtf(block_sum(ss, red) / static_cast<float>(dim) + eps);
  float* o = out + r * dim;
  for (int j = threadIdx.x; j < dim; j += blockDim.x) o[j] = xr[j] * inv * w[j];
}

// Rows of dim % 4 == 0 (every model width): one block per row, each thread keeping its float4s
// in registers between the reduction and the write, all loads issued before the first use. The
// scalar loops above wait for one L2 round trip per element and took ~10 us for a 5120-wide
// decode row (64 layers x 2 per token).
constexpr int kVecSlots = 4;  // float4 per thread: rows up to 4 x 1024 x 4 = 16384 values

bool vec_row_ok(int dim, const void* a, const void* b, const void* c, const void* d) {
  const auto al = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return dim % 4 == 0 && dim / 4 <= kVecSlots * 1024 && al(a) && al(b) && al(c) && al(d);
}
// About two float4 per thread: short reductions, enough loads in flight.
int vec_row_threads(int dim) {
  const int t = (dim / 4 + 1) / 2;
  return std::clamp((t + 31) / 32 * 32, 32, 1024);
}

// Four values as BF16 (round to nearest even) at o16[4j] (8-byte aligned).
__device__ __forceinline__ void store_bf16x4(__nv_bfloat16* o16, int64_t j, float4 v) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y);
  const __nv_bfloat162 hi = __floats2bfloat162_rn(v.z, v.w);
  reinterpret_cast<uint2*>(o16)[j] =
      make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
}

// o4[j] = v * f * w for this thread's float4s j = threadIdx.x + i * blockDim.x < n4 (w: the
// norm's weights, loaded before the dependent-launch wait), and the same values as BF16 at
// o16 when it is given.
__device__ __forceinline__ void write_scaled(float4* o4, __nv_bfloat16* o16,
                                             const float4 (&v)[kVecSlots], int n4, float f,
                                             const float4 (&w)[kVecSlots]) {
#pragma unroll
  for (int i = 0; i < kVecSlots; ++i) {
    const int j = threadIdx.x + i * blockDim.x;
    if (j < n4) {
      const float4 o = make_float4(v[i].x * f * w[i].x, v[i].y * f * w[i].y, v[i].z * f * w[i].z,
                                   v[i].w * f * w[i].w);
      if (o4 != nullptr) o4[j] = o;
      if (o16 != nullptr) store_bf16x4(o16, j, o);
    }
  }
}

// A prefill GEMM's BF16 activations written by the op before it (gemm_to_bf16's contract): the
// GEMM's alpha is 1.
__device__ __forceinline__ void set_gemm_alpha(float* alpha) {
  if (alpha != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *alpha = 1.0f;
}

// kAdd: x += y first (add_rmsnorm: the residual stream, written back after all loads so that
// x and y need not be distinct for the loads to overlap). Without kAdd x is only read and out
// may alias it. out16 (optional): the output again as a prefill GEMM's BF16 activations, and
// *alpha = 1 (set_gemm_alpha).
template <bool kAdd>
__global__ void rmsnorm_vec_kernel(float* x, const float* y, const float* __restrict__ w,
                                   float* out, int dim, float eps, __nv_bfloat16* out16,
                                   float* alpha) {
  __shared__ float red[32];
  const int n4 = dim / 4;
  const int64_t r = blockIdx.x;
  // The norm's weights are constant: they load while the kernel before still runs.
  float4 wv[kVecSlots];
#pragma unroll
  for (int i = 0; i < kVecSlots; ++i) {
    const int j = threadIdx.x + i * blockDim.x;
    if (j < n4) wv[i] = reinterpret_cast<const float4*>(w)[j];
  }
  pdl_begin();
  set_gemm_alpha(alpha);
  float4* x4 = reinterpret_cast<float4*>(x + r * dim);
  const float4* y4 = reinterpret_cast<const float4*>(kAdd ? y + r * dim : nullptr);
  float4 v[kVecSlots];
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < kVecSlots; ++i) {
    const int j = threadIdx.x + i * blockDim.x;
    if (j < n4) {
      v[i] = x4[j];
      if constexpr (kAdd) {
        const float4 b = y4[j];
        v[i] = make_float4(v[i].x + b.x, v[i].y + b.y, v[i].z + b.z, v[i].w + b.w);
      }
      ss += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
    }
  }
  if constexpr (kAdd) {
#pragma unroll
    for (int i = 0; i < kVecSlots; ++i) {
      const int j = threadIdx.x + i * blockDim.x;
      if (j < n4) x4[j] = v[i];
    }
  }
  const float inv = 1.0f / sqrtf(block_sum(ss, red) / static_cast<float>(dim) + eps);
  write_scaled(out != nullptr ? reinterpret_cast<float4*>(out + r * dim) : nullptr,
               out16 != nullptr ? out16 + r * dim : nullptr, v, n4, inv, wv);
}

__global__ void rmsnorm_gated_kernel(const float* __restrict__ o, const float* __restrict__ z,
                                     const float* __restrict__ w, float* out, int dim, float eps) {
  pdl_begin();
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const float* orow = o + r * dim;
  const float* zr = z + r * dim;
  float ss = 0.0f;
  for (int j = threadIdx.x; j < dim; j += blockDim.x) ss += orow[j] * orow[j];
  const float inv = 1.0f / sqrtf(block_sum(ss, red) / static_cast<float>(dim) + eps);
  float* y = out + r * dim;
  for (int j = threadIdx.x; j < dim; j += blockDim.x) y[j] = w[j] * (orow[j] * inv) * silu_f(zr[j]);
}

// Rows of dim % 4 == 0 up to 32 * 4 * kSlots wide (16-byte aligned): a warp per row, eight rows
// a block, the norm's weights loaded before the dependent-launch wait. The block per row above
// gave a prefill's 393,216 head rows of 128 a block of 128 threads each, one value a thread: 473
// us for the 27B's 8k-token GDN output (600 MB moved, 1.3 TB/s; S29).
// out16, alpha: as rmsnorm_vec_kernel's.
template <int kSlots>
__global__ void rmsnorm_gated_warp_kernel(const float* __restrict__ o, const float* __restrict__ z,
                                          const float* __restrict__ w, float* __restrict__ out,
                                          int64_t rows, int dim, float eps,
                                          __nv_bfloat16* __restrict__ out16, float* alpha) {
  const int lane = static_cast<int>(threadIdx.x) & 31, n4 = dim / 4;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  float4 wv[kSlots];
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    const int j = lane + 32 * i;
    if (j < n4) wv[i] = reinterpret_cast<const float4*>(w)[j];
  }
  pdl_begin();
  set_gemm_alpha(alpha);
  if (r >= rows) return;
  const float4* o4 = reinterpret_cast<const float4*>(o + r * dim);
  const float4* z4 = reinterpret_cast<const float4*>(z + r * dim);
  float4 ov[kSlots], zv[kSlots];
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    const int j = lane + 32 * i;
    if (j < n4) {
      ov[i] = o4[j];
      zv[i] = z4[j];
      ss += ov[i].x * ov[i].x + ov[i].y * ov[i].y + ov[i].z * ov[i].z + ov[i].w * ov[i].w;
    }
  }
  const float inv = 1.0f / sqrtf(warp_sum(ss) / static_cast<float>(dim) + eps);
  float4* y4 = reinterpret_cast<float4*>(out + r * dim);
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    const int j = lane + 32 * i;
    if (j < n4) {
      const float4 g = make_float4(
          wv[i].x * (ov[i].x * inv) * silu_f(zv[i].x), wv[i].y * (ov[i].y * inv) * silu_f(zv[i].y),
          wv[i].z * (ov[i].z * inv) * silu_f(zv[i].z), wv[i].w * (ov[i].w * inv) * silu_f(zv[i].w));
      y4[j] = g;
      if (out16 != nullptr) store_bf16x4(out16 + r * dim, j, g);
    }
  }
}

__global__ void l2norm_kernel(float* x, int dim, float eps, float scale) {
  pdl_begin();
  __shared__ float red[32];
  float* xr = x + static_cast<int64_t>(blockIdx.x) * dim;
  float ss = 0.0f;
  for (int j = threadIdx.x; j < dim; j += blockDim.x) ss += xr[j] * xr[j];
  const float f = scale / sqrtf(block_sum(ss, red) + eps);
  for (int j = threadIdx.x; j < dim; j += blockDim.x) xr[j] *= f;
}

__global__ void copy_rows_kernel(const float* __restrict__ src, int64_t src_stride,
                                 float* __restrict__ dst, int64_t dst_stride, int64_t rows,
                                 int64_t cols) {
  pdl_begin();
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    dst[r * dst_stride + c] = src[r * src_stride + c];
  }
}

__global__ void gather_rows_kernel(const float* __restrict__ x, int dim,
                                   const int32_t* __restrict__ rows, float* __restrict__ out) {
  pdl_begin();
  const int64_t i = blockIdx.x;
  const float* src = x + static_cast<int64_t>(rows[i]) * dim;
  for (int j = threadIdx.x; j < dim; j += blockDim.x) out[i * dim + j] = src[j];
}

// op 0: x += y; 1: out = silu(x) * y; 2: x *= sigmoid(y).
template <int OP>
__global__ void binary_kernel(float* x, const float* y, float* out, int64_t n) {
  pdl_begin();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (OP == 0) x[i] += y[i];
    if (OP == 1) out[i] = silu_f(x[i]) * y[i];
    if (OP == 2) x[i] *= sigmoid_f(y[i]);
  }
}

__global__ void scale_rows_sigmoid_kernel(float* x, const float* __restrict__ gate, int dim) {
  pdl_begin();
  const int64_t r = blockIdx.x;
  const float s = sigmoid_f(gate[r]);
  for (int j = threadIdx.x; j < dim; j += blockDim.x) x[r * dim + j] *= s;
}

// Rows split into gridDim.y chunks, one block per (row, chunk). Each thread keeps the first index
// of its largest non-NaN value over a strided walk of its chunk (four 16-byte loads in flight when
// the row is 16-byte aligned); candidates merge by value, then lower index, so the result is
// util/argmax.h's whatever the thread and chunk counts. With several chunks, each block leaves
// its candidate in `ws` and the row's last block (a ticket in `counters`, reset by that block)
// merges them: a 248,320-wide row is read by 16 multiprocessors instead of one.
constexpr int kArgmaxThreads = 1024;
constexpr int kArgmaxMaxChunks = 32;
constexpr int kArgmaxChunkCols = 16384;  // the columns a chunk gets at least
__device__ __forceinline__ void argmax_take(float v, int i, float& bv, int& bi) {
  if (v > bv || (v == bv && i < bi)) bv = v, bi = i;  // NaN compares false: skipped
}
__device__ __forceinline__ void argmax_warp(float& bv, int& bi) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    argmax_take(ov, oi, bv, bi);
  }
}
struct ArgmaxWs {
  float* value;   // [rows, kArgmaxMaxChunks] each chunk's candidate
  int* index;     // [rows, kArgmaxMaxChunks]
  int* counters;  // [rows] blocks of the row done; zero at rest
};
__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_rows_kernel(const float* __restrict__ x, int cols, int32_t* __restrict__ out,
                       ArgmaxWs ws) {
  pdl_begin();
  __shared__ float sv[32];
  __shared__ int si[32];
  __shared__ bool last;
  const int r = static_cast<int>(blockIdx.x), chunk = static_cast<int>(blockIdx.y);
  const int chunks = static_cast<int>(gridDim.y);
  const float* row = x + static_cast<int64_t>(r) * cols;
  // Chunk bounds on multiples of 4 columns, so an aligned row's chunks start aligned.
  const int per = ((cols + chunks - 1) / chunks + 3) & ~3;
  const int begin = min(cols, chunk * per), end = min(cols, begin + per);
  float bv = -INFINITY;
  int bi = INT_MAX;
  int tail = begin;
  if (reinterpret_cast<uintptr_t>(row) % 16 == 0) {
    const int b4 = begin / 4, e4 = end / 4;
    const float4* r4 = reinterpret_cast<const float4*>(row);
    for (int k = b4 + static_cast<int>(threadIdx.x); k < e4; k += 4 * blockDim.x) {
      float4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int kk = k + u * static_cast<int>(blockDim.x);
        v[u] = kk < e4 ? r4[kk] : make_float4(NAN, NAN, NAN, NAN);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int i = 4 * (k + u * static_cast<int>(blockDim.x));
        argmax_take(v[u].x, i, bv, bi);
        argmax_take(v[u].y, i + 1, bv, bi);
        argmax_take(v[u].z, i + 2, bv, bi);
        argmax_take(v[u].w, i + 3, bv, bi);
      }
    }
    tail = 4 * e4;
  }
  for (int i = tail + static_cast<int>(threadIdx.x); i < end; i += blockDim.x)
    argmax_take(row[i], i, bv, bi);
  argmax_warp(bv, bi);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sv[warp] = bv, si[warp] = bi;
  __syncthreads();
  if (warp != 0) return;
  const int warps = static_cast<int>(blockDim.x) / 32;
  bv = lane < warps ? sv[lane] : -INFINITY;
  bi = lane < warps ? si[lane] : INT_MAX;
  argmax_warp(bv, bi);
  if (chunks > 1) {
    if (lane == 0) {
      ws.value[r * kArgmaxMaxChunks + chunk] = bv;
      ws.index[r * kArgmaxMaxChunks + chunk] = bi;
      __threadfence();  // the candidate is visible before the ticket counts it
      last = atomicAdd(&ws.counters[r], 1) == chunks - 1;
    }
    __syncwarp();
    if (!last) return;
    __threadfence();
    bv = -INFINITY;
    bi = INT_MAX;
    if (lane < chunks) {
      bv = __ldcg(&ws.value[r * kArgmaxMaxChunks + lane]);
      bi = __ldcg(&ws.index[r * kArgmaxMaxChunks + lane]);
    }
    argmax_warp(bv, bi);
    if (lane == 0) ws.counters[r] = 0;
  }
  // Index 0 when row[0] is NaN, or when every value is NaN (std::max_element's choice).
  if (lane == 0) out[r] = row[0] != row[0] || bi == INT_MAX ? 0 : bi;
}

__global__ void gdn_gates_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                 const float* __restrict__ a_log, const float* __restrict__ dt_bias,
                                 float* __restrict__ g, float* __restrict__ beta, int64_t total,
                                 int heads) {
  pdl_begin();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int h = static_cast<int>(i % heads);
    const float u = a[i] + dt_bias[h];
    // softplus with torch's threshold: linear above 20.
    const float sp = u > 20.0f ? u : log1pf(expf(u));
    g[i] = -expf(a_log[h]) * sp;
    beta[i] = sigmoid_f(b[i]);
  }
}

__global__ void rope_kernel(float* x, const int32_t* __restrict__ positions, int heads,
                            int head_dim, int64_t token_stride, int half, RopeFreqs f) {
  pdl_begin();
  const int64_t t = blockIdx.x;
  const float pos = static_cast<float>(positions[t]);
  for (int idx = threadIdx.x; idx < heads * half; idx += blockDim.x) {
    const int h = idx / half, i = idx % half;
    const float ang = pos * f.inv[i];
    float s, c;
    sincosf(ang, &s, &c);
    float* xh = x + t * token_stride + static_cast<int64_t>(h) * head_dim;
    const float x0 = xh[i], x1 = xh[i + half];
    xh[i] = x0 * c - x1 * s;
    xh[i + half] = x1 * c + x0 * s;
  }
}

// One warp per row: in registers up to 256 experts (topk_softmax_warp_regs), else through
// shared memory (topk_softmax_warp).
constexpr int kTopkPerLane = 8;
__global__ void topk_softmax_kernel(const float* __restrict__ logits, int experts, int k,
                                    bool renormalize, int32_t* __restrict__ ids,
                                    float* __restrict__ weights) {
  pdl_begin();
  extern __shared__ float p[];
  const int64_t r = blockIdx.x;
  const float* l = logits + r * experts;
  if (experts <= 32 * kTopkPerLane) {
    float v[kTopkPerLane];
#pragma unroll
    for (int u = 0; u < kTopkPerLane; ++u) {
      const int e = threadIdx.x + 32 * u;
      v[u] = e < experts ? l[e] : -INFINITY;
    }
    topk_softmax_warp_regs(v, experts, k, renormalize, ids + r * k, weights + r * k);
    return;
  }
  for (int x = threadIdx.x; x < experts; x += 32) p[x] = l[x];
  __syncwarp();
  topk_softmax_warp(p, experts, k, renormalize, ids + r * k, weights + r * k);
}

unsigned grid_1d(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65536 ? b : 65536);
}

}  // namespace
}  // namespace tokenmill::cuda

namespace tokenmill {

using cuda::blocks_for;

void CudaBackend::rmsnorm(const float* x, const float* w, float* out, int64_t rows, int dim,
                          float eps) {
  // x is only read without the residual add.
  launch_rmsnorm(const_cast<float*>(x), nullptr, w, out, rows, dim, eps, false);
}

void CudaBackend::add_rmsnorm(float* x, const float* y, const float* w, float* out, int64_t rows,
                              int dim, float eps) {
  launch_rmsnorm(x, y, w, out, rows, dim, eps, false);
}

bool CudaBackend::launch_rmsnorm(float* x, const float* y, const float* w, float* out, int64_t rows,
                                 int dim, float eps, bool to_gemm) {
  if (rows <= 0) return true;
  const bool vec = cuda::vec_row_ok(dim, x, y != nullptr ? y : x, w, out);
  if (to_gemm && !vec) return false;
  TM_CUDA_REQUIRE(out != nullptr || to_gemm, "rmsnorm: no output");
  auto* out16 = static_cast<__nv_bfloat16*>(to_gemm ? gemm_bf16_input(rows, dim) : nullptr);
  float* alpha = to_gemm ? gemm_consts_ : nullptr;
  if (vec) {
    const auto kernel =
        y != nullptr ? cuda::rmsnorm_vec_kernel<true> : cuda::rmsnorm_vec_kernel<false>;
    cuda::launch_pdl(kernel, static_cast<unsigned>(rows), cuda::vec_row_threads(dim), 0, stream_, x,
                     y, w, out, dim, eps, out16, alpha);
  } else if (y != nullptr) {
    cuda::launch_pdl(cuda::add_rmsnorm_kernel, static_cast<unsigned>(rows), cuda::row_threads(dim),
                     0, stream_, x, y, w, out, dim, eps);
  } else {
    cuda::launch_pdl(cuda::rmsnorm_kernel, static_cast<unsigned>(rows), cuda::row_threads(dim), 0,
                     stream_, static_cast<const float*>(x), w, out, dim, eps);
  }
  TM_CUDA_LAUNCHED();
  return true;
}

void CudaBackend::rmsnorm_gated(const float* o, const float* z, const float* w, float* out,
                                int64_t rows, int dim, float eps) {
  launch_rmsnorm_gated(o, z, w, out, rows, dim, eps, false);
}

bool CudaBackend::launch_rmsnorm_gated(const float* o, const float* z, const float* w, float* out,
                                       int64_t rows, int dim, float eps, bool to_gemm) {
  if (rows <= 0) return true;
  const auto al = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool warp_rows = dim % 4 == 0 && dim <= 1024 && al(o) && al(z) && al(w) && al(out);
  if (to_gemm && !warp_rows) return false;
  if (warp_rows) {
    // The GEMM's activations are the rows of heads: [rows / heads][heads * dim] is [rows][dim].
    auto* out16 = static_cast<__nv_bfloat16*>(to_gemm ? gemm_bf16_input(rows, dim) : nullptr);
    float* alpha = to_gemm ? gemm_consts_ : nullptr;
    const auto blocks = static_cast<unsigned>((rows + 7) / 8);
    const int slots = (dim / 4 + 31) / 32;
    const auto launch = [&](auto kernel) {
      cuda::launch_pdl(kernel, blocks, 256, 0, stream_, o, z, w, out, rows, dim, eps, out16, alpha);
    };
    if (slots == 1) {
      launch(cuda::rmsnorm_gated_warp_kernel<1>);
    } else if (slots == 2) {
      launch(cuda::rmsnorm_gated_warp_kernel<2>);
    } else if (slots <= 4) {
      launch(cuda::rmsnorm_gated_warp_kernel<4>);
    } else {
      launch(cuda::rmsnorm_gated_warp_kernel<8>);
    }
  } else {
    cuda::launch_pdl(cuda::rmsnorm_gated_kernel, static_cast<unsigned>(rows),
                     cuda::row_threads(dim), 0, stream_, o, z, w, out, dim, eps);
  }
  TM_CUDA_LAUNCHED();
  return true;
}

void CudaBackend::l2norm(float* x, int64_t rows, int dim, float eps, float scale) {
  if (rows <= 0) return;
  cuda::launch_pdl(cuda::l2norm_kernel, static_cast<unsigned>(rows), cuda::row_threads(dim), 0,
                   stream_, x, dim, eps, scale);
  TM_CUDA_LAUNCHED();
}

void CudaBackend::copy_rows(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                            int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  cuda::launch_pdl(cuda::copy_rows_kernel, cuda::grid_1d(rows * cols), cuda::kThreads, 0, stream_,
                   src, src_stride, dst, dst_stride, rows, cols);
  TM_CUDA_LAUNCHED();
}

void CudaBackend::gather_rows(const float* x, int dim, const int32_t* rows, int n, float* out) {
  if (n <= 0) return;
  cuda::launch_pdl(cuda::gather_rows_kernel, static_cast<unsigned>(n), cuda::row_threads(dim), 0,
                   stream_, x, dim, rows, out);
  TM_CUDA_LAUNCHED();
}

void CudaBackend::add(float* x, const float* y, int64_t n) {
  if (n <= 0) return;
  cuda::launch_pdl(cuda::binary_kernel<0>, cuda::grid_1d(n), cuda::kThreads, 0, stream_, x, y,
                   nullptr, n);
  TM_CUDA_LAUNCHED();
}

void CudaBackend::silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  if (n <= 0) return;
  cuda::launch_pdl(cuda::binary_kernel<1>, cuda::grid_1d(n), cuda::kThreads, 0, stream_,
                   const_cast<float*>(gate), up, out, n);
  TM_CUDA_LAUNCHED();
}

void CudaBackend::sigmoid_mul(float* x, const float* gate, int64_t n) {
  if (n <= 0) return;
  cuda::launch_pdl(cuda::binary_kernel<2>, cuda::grid_1d(n), cuda::kThreads, 0, stream_, x, gate,
                   nullptr, n);
  TM_CUDA_LAUNCHED();
}

void CudaBackend::scale_rows_sigmoid(float* x, const float* gate, int64_t rows, int dim) {
  if (rows <= 0) return;
  cuda::launch_pdl(cuda::scale_rows_sigmoid_kernel, static_cast<unsigned>(rows),
                   cuda::row_threads(dim), 0, stream_, x, gate, dim);
  TM_CUDA_LAUNCHED();
}

void CudaBackend::argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* out) {
  TM_CUDA_REQUIRE(cols >= 1 && cols <= INT32_MAX / 2 && rows <= INT32_MAX,
                  "argmax_rows: rows of 1..2^30 values");
  if (rows <= 0) return;
  // Rows beyond the workspace's take one block each.
  const int64_t chunks = rows > kArgmaxMaxRows ? 1
                                               : std::clamp<int64_t>(cols / cuda::kArgmaxChunkCols,
                                                                     1, cuda::kArgmaxMaxChunks);
  const cuda::ArgmaxWs ws{argmax_ws_, reinterpret_cast<int*>(argmax_ws_) + kArgmaxWsSlots,
                          reinterpret_cast<int*>(argmax_ws_) + 2 * kArgmaxWsSlots};
  cuda::launch_pdl(cuda::argmax_rows_kernel,
                   dim3(static_cast<unsigned>(rows), static_cast<unsigned>(chunks)),
                   cuda::kArgmaxThreads, 0, stream_, x, static_cast<int>(cols), out, ws);
  TM_CUDA_LAUNCHED();
}

void CudaBackend::gdn_gates(const float* a, const float* b, const float* a_log,
                            const float* dt_bias, float* g, float* beta, int64_t n, int heads) {
  if (n <= 0) return;
  const int64_t total = n * heads;
  cuda::launch_pdl(cuda::gdn_gates_kernel, cuda::grid_1d(total), cuda::kThreads, 0, stream_, a, b,
                   a_log, dt_bias, g, beta, total, heads);
  TM_CUDA_LAUNCHED();
}

void CudaBackend::rope(float* x, const int32_t* positions, int n_tokens, int heads, int head_dim,
                       int64_t token_stride, int rot_dim, float theta) {
  TM_CUDA_REQUIRE(rot_dim % 2 == 0 && rot_dim <= head_dim && rot_dim <= 1024,
                  "rope: rot_dim must be even, <= head_dim and <= 1024");
  if (n_tokens <= 0 || rot_dim == 0) return;
  const int half = rot_dim / 2;
  const cuda::RopeFreqs f = cuda::rope_freqs(theta, rot_dim);
  const int threads = heads * half >= 256 ? 256 : 64;
  cuda::launch_pdl(cuda::rope_kernel, static_cast<unsigned>(n_tokens), threads, 0, stream_, x,
                   positions, heads, head_dim, token_stride, half, f);
  TM_CUDA_LAUNCHED();
}

void CudaBackend::topk_softmax(const float* logits, int64_t n, int experts, int k, bool renormalize,
                               int32_t* ids, float* weights) {
  TM_CUDA_REQUIRE(k >= 1 && k <= experts && experts <= 8192,
                  "topk_softmax: need 1 <= k <= experts <= 8192");
  if (n <= 0) return;
  cuda::launch_pdl(cuda::topk_softmax_kernel, static_cast<unsigned>(n), 32,
                   static_cast<size_t>(experts) * sizeof(float), stream_, logits, experts, k,
                   renormalize, ids, weights);
  TM_CUDA_LAUNCHED();
}

}  // namespace tokenmill
