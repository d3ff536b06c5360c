// CudaBackend::linear and embed. n <= kGemvMaxRows activation rows: a warp per weight row
// streams the row once and dots it with all n rows (decode is bound by weight bandwidth).
// Larger n: an F32 tiled GEMM; each block dequantizes a 64x32 tile of W into shared memory
// once and reuses it for 64 activation rows. F32 accumulation throughout, so results match
// the CPU backend to F32 rounding (no bf16 rounding of activations).
#include <cuda_runtime.h>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv.h"
#include "tensor/affine.h"

namespace tokenmill::cuda {

DevMat make_devmat(const Weight& w, int expert) {
  TM_CUDA_REQUIRE(w.data != nullptr && w.rows > 0 && w.cols > 0, "linear on an empty weight");
  const int64_t count = w.experts > 0 ? w.experts : 1;
  TM_CUDA_REQUIRE(expert >= 0 && expert < count, "expert index outside the weight's experts");
  DevMat m;
  m.rows = w.rows;
  m.cols = w.cols;
  m.experts = count;
  m.bits = w.bits;
  m.group = w.group;
  if (!w.quantized()) {
    TM_CUDA_REQUIRE(w.dtype == DType::F32 || w.dtype == DType::BF16 || w.dtype == DType::F16,
                    "float weight must be F32, F16 or BF16");
    m.dtype = w.dtype == DType::F32 ? kF32 : w.dtype == DType::F16 ? kF16 : kBF16;
    m.row_bytes = w.cols * static_cast<int64_t>(dtype_size(w.dtype));
    m.data_stride = m.rows * m.row_bytes;
    m.chunks8 = w.cols % 8 == 0 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0;
  } else {
    affine::check_layout(w.bits, w.group, w.cols, "affine weight");
    TM_CUDA_REQUIRE(
        w.scale_dtype == DType::F32 || w.scale_dtype == DType::BF16 || w.scale_dtype == DType::F16,
        "affine scales must be F32, F16 or BF16");
    TM_CUDA_REQUIRE(w.scales != nullptr && w.biases != nullptr,
                    "affine weight without scales/biases");
    TM_CUDA_REQUIRE(reinterpret_cast<uintptr_t>(w.data) % 8 == 0,
                    "affine weight data must be 8-byte aligned (upload it with upload_weight)");
    m.sdtype = w.scale_dtype == DType::F32 ? kF32 : w.scale_dtype == DType::F16 ? kF16 : kBF16;
    m.row_bytes = affine::words_per_row(w.cols, w.bits) * 4;
    m.groups = w.cols / w.group;
    m.data_stride = m.rows * m.row_bytes;
    m.sb_stride = m.rows * m.groups * static_cast<int64_t>(dtype_size(w.scale_dtype));
    m.chunks8 = true;
  }
  m.data = static_cast<const uint8_t*>(w.data) + expert * m.data_stride;
  if (m.bits) {
    m.scales = static_cast<const uint8_t*>(w.scales) + expert * m.sb_stride;
    m.biases = static_cast<const uint8_t*>(w.biases) + expert * m.sb_stride;
  }
  return m;
}

namespace {

constexpr int kGemvWarps = 8;  // weight rows per GEMV block

// Dot of weight row r with x (one activation row), partial per lane.
__device__ __forceinline__ float row_dot_partial(const DevMat& m, int64_t r, const float* x) {
  const int lane = threadIdx.x & 31;
  const uint8_t* row = m.data + r * m.row_bytes;
  float acc = 0.0f;
  if (m.chunks8) {
    for (int64_t j = lane * 8; j < m.cols; j += 256) {
      float w[8];
      load8(m, row, r, j, w);
#pragma unroll
      for (int u = 0; u < 8; ++u) acc += w[u] * x[j + u];
    }
  } else {
    for (int64_t j = lane; j < m.cols; j += 32) acc += load1(m, row, r, j) * x[j];
  }
  return acc;
}

// out[i, r] = W[r, :] . x[i, :] for i < n <= N; one warp per weight row r.
template <int N>
__global__ void gemv_kernel(DevMat m, const float* __restrict__ x, int64_t ldx, int n,
                            float* __restrict__ out, int64_t ldo) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5);
  if (r >= m.rows) return;
  const int lane = threadIdx.x & 31;
  const uint8_t* row = m.data + r * m.row_bytes;
  float acc[N];
#pragma unroll
  for (int i = 0; i < N; ++i) acc[i] = 0.0f;
  if (m.chunks8) {
    for (int64_t j = lane * 8; j < m.cols; j += 256) {
      float w[8];
      load8(m, row, r, j, w);
#pragma unroll
      for (int i = 0; i < N; ++i) {
        if (i < n) {
          const float* xi = x + i * ldx + j;
          float s = 0.0f;
#pragma unroll
          for (int u = 0; u < 8; ++u) s += w[u] * xi[u];
          acc[i] += s;
        }
      }
    }
  } else {
    for (int64_t j = lane; j < m.cols; j += 32) {
      const float w = load1(m, row, r, j);
#pragma unroll
      for (int i = 0; i < N; ++i) {
        if (i < n) acc[i] += w * x[i * ldx + j];
      }
    }
  }
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if (i < n) {
      const float s = warp_sum(acc[i]);
      if (lane == 0) out[i * ldo + r] = s;
    }
  }
}

// Slot s: out[s, r] = W_{ids[s]}[r, :] . x[s / x_div, :]. An expert id outside the weight
// writes NaN (the router never produces one; NaN makes a corrupted id visible).
__global__ void gemv_indexed_kernel(DevMat m, const int32_t* __restrict__ ids,
                                    const float* __restrict__ x, int64_t ldx, int64_t x_div,
                                    float* __restrict__ out, int64_t ldo) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5);
  if (r >= m.rows) return;
  const int64_t s = blockIdx.y;
  const int e = ids[s];
  float v;
  if (e < 0 || e >= m.experts) {
    v = __int_as_float(0x7fc00000);
  } else {
    v = warp_sum(row_dot_partial(at_expert(m, e), r, x + (s / x_div) * ldx));
  }
  if ((threadIdx.x & 31) == 0) out[s * ldo + r] = v;
}

constexpr int kBM = 64, kBN = 64, kBK = 32;

// out[i, r] for a 64x64 tile: blockIdx.x over weight rows, blockIdx.y over activation rows.
// 256 threads; each loads 8 x values and 8 weight values per K step and computes 4x4 outputs.
__global__ void __launch_bounds__(256)
    gemm_kernel(DevMat m, const float* __restrict__ x, int64_t ldx, int64_t n,
                float* __restrict__ out, int64_t ldo) {
  __shared__ float xs[kBK][kBM + 4];
  __shared__ float ws[kBK][kBN + 4];
  const int t = threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kBN;
  const int64_t i0 = static_cast<int64_t>(blockIdx.y) * kBM;
  const int ty = t / 16, tx = t % 16;
  const int lr = t / 4, lc = (t % 4) * 8;  // loader: tile row, first of 8 columns
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < m.cols; k0 += kBK) {
    const int64_t kc = k0 + lc;
    {
      const int64_t xi = i0 + lr;
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        xs[lc + u][lr] = (xi < n && kc + u < m.cols) ? x[xi * ldx + kc + u] : 0.0f;
      }
    }
    {
      const int64_t wr = r0 + lr;
      float w[8];
      if (wr < m.rows) {
        const uint8_t* row = m.data + wr * m.row_bytes;
        if (m.chunks8 && kc + 8 <= m.cols) {
          load8(m, row, wr, kc, w);
        } else {
#pragma unroll
          for (int u = 0; u < 8; ++u) w[u] = kc + u < m.cols ? load1(m, row, wr, kc + u) : 0.0f;
        }
      } else {
#pragma unroll
        for (int u = 0; u < 8; ++u) w[u] = 0.0f;
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) ws[lc + u][lr] = w[u];
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kBK; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = xs[kk][ty * 4 + i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = ws[kk][tx * 4 + j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t xi = i0 + ty * 4 + i;
    if (xi >= n) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t r = r0 + tx * 4 + j;
      if (r < m.rows) out[xi * ldo + r] = acc[i][j];
    }
  }
}

// out[i, :] = row ids[i] of the table, dequantized; an id outside the table writes NaN.
__global__ void embed_kernel(DevMat m, const int32_t* __restrict__ ids, float* __restrict__ out) {
  const int64_t i = blockIdx.x;
  const int id = ids[i];
  float* o = out + i * m.cols;
  if (id < 0 || id >= m.rows) {
    for (int64_t j = threadIdx.x; j < m.cols; j += blockDim.x) o[j] = __int_as_float(0x7fc00000);
    return;
  }
  const uint8_t* row = m.data + static_cast<int64_t>(id) * m.row_bytes;
  for (int64_t j = threadIdx.x; j < m.cols; j += blockDim.x) o[j] = load1(m, row, id, j);
}

}  // namespace

void launch_gemv_indexed(cudaStream_t st, const DevMat& m, const int32_t* ids, int64_t slots,
                         const float* x, int64_t ldx, int64_t x_div, float* out, int64_t ldo) {
  if (slots <= 0) return;
  TM_CUDA_REQUIRE(slots <= 65535, "moe: more than 65535 token-expert slots in one call");
  const dim3 grid(blocks_for(m.rows, kGemvWarps), static_cast<unsigned>(slots));
  gemv_indexed_kernel<<<grid, kGemvWarps * 32, 0, st>>>(m, ids, x, ldx, x_div, out, ldo);
  TM_CUDA_LAUNCHED();
}

}  // namespace tokenmill::cuda

namespace tokenmill {

using cuda::DevMat;

void CudaBackend::linear(const float* x, int64_t n, const Weight& w, float* out, int expert) {
  if (n <= 0) return;
  const DevMat m = cuda::make_devmat(w, expert);
  const int64_t ldx = m.cols, ldo = m.rows;
  if (n <= kGemvMaxRows) {
    if (const cuda::GemvKind kind = cuda::fast_gemv_kind(m);
        kind != cuda::GemvKind::kNone && reinterpret_cast<uintptr_t>(x) % 16 == 0) {
      cuda::GemvJobs jobs;
      jobs.m[0] = m;
      jobs.out[0] = out;
      jobs.count = 1;
      cuda::launch_gemv_fast(stream_, kind, jobs, x, ldx, static_cast<int>(n));
      return;
    }
    const unsigned grid = cuda::blocks_for(m.rows, cuda::kGemvWarps);
    const int threads = cuda::kGemvWarps * 32;
    const int ni = static_cast<int>(n);
    if (n == 1) {
      cuda::gemv_kernel<1><<<grid, threads, 0, stream_>>>(m, x, ldx, ni, out, ldo);
    } else if (n <= 4) {
      cuda::gemv_kernel<4><<<grid, threads, 0, stream_>>>(m, x, ldx, ni, out, ldo);
    } else {
      cuda::gemv_kernel<16><<<grid, threads, 0, stream_>>>(m, x, ldx, ni, out, ldo);
    }
    TM_CUDA_LAUNCHED();
    return;
  }
  TM_CUDA_REQUIRE((n + cuda::kBM - 1) / cuda::kBM <= 65535, "linear: too many activation rows");
  const dim3 grid(cuda::blocks_for(m.rows, cuda::kBN), cuda::blocks_for(n, cuda::kBM));
  cuda::gemm_kernel<<<grid, 256, 0, stream_>>>(m, x, ldx, n, out, ldo);
  TM_CUDA_LAUNCHED();
}

void CudaBackend::linear_multi(const float* x, int64_t n, const Weight* const* ws,
                               float* const* outs, int count) {
  if (n <= 0 || count <= 0) return;
  // One launch when every matrix has the same fast kernel and the same input width.
  bool fused =
      n <= kGemvMaxRows && count <= cuda::kMaxGemvJobs && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  cuda::GemvJobs jobs;
  cuda::GemvKind kind = cuda::GemvKind::kNone;
  for (int i = 0; i < count && fused; ++i) {
    const DevMat m = cuda::make_devmat(*ws[i], 0);
    const cuda::GemvKind k = cuda::fast_gemv_kind(m);
    if (k == cuda::GemvKind::kNone || (i > 0 && (k != kind || m.cols != jobs.m[0].cols))) {
      fused = false;
      break;
    }
    kind = k;
    jobs.m[i] = m;
    jobs.out[i] = outs[i];
    jobs.count = i + 1;
  }
  if (!fused) {
    for (int i = 0; i < count; ++i) linear(x, n, *ws[i], outs[i]);
    return;
  }
  cuda::launch_gemv_fast(stream_, kind, jobs, x, jobs.m[0].cols, static_cast<int>(n));
}

// Token ids are validated by the model before the forward; on the device an id outside the
// vocabulary yields a NaN row instead of a read outside the table.
void CudaBackend::embed(const Weight& table, const int32_t* ids, int n, float* out) {
  if (n <= 0) return;
  const DevMat m = cuda::make_devmat(table, 0);
  cuda::embed_kernel<<<static_cast<unsigned>(n), 256, 0, stream_>>>(m, ids, out);
  TM_CUDA_LAUNCHED();
}

}  // namespace tokenmill
