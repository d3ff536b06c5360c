// Decode GEMV (1..16 activation rows) for the common weight formats: bf16 and MLX affine 4- and
// 8-bit. Each lane streams 16-byte chunks of a weight row (8 bf16, 32 4-bit or 16 8-bit values)
// with streaming loads; a warp works on kRowsPerWarp rows at once so one load of an x chunk
// serves several rows (without that, re-reading x from L1 would cost more than the weights).
// Several matrices of the same input (q/k/v, gate/up, the GDN input projections) run in one
// launch. Accumulation is F32; affine rows use w = s*q + b as s*(q.x) + b*sum(x) per chunk.
#include <cuda_runtime.h>

#include <type_traits>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv.h"

namespace tokenmill::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kRowsPerWarp = 4;
constexpr int kRowsPerBlock = kWarpsPerBlock * kRowsPerWarp;

// 16 bytes of weights -> values, and how a chunk's partial dot becomes the output contribution.
struct Bf16Chunk {
  static constexpr int kValues = 8;
  __device__ static void decode(const uint4& u, float* v) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[2 * k] = __uint_as_float(w[k] << 16);
      v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    }
  }
};

// Small unsigned integer q as a float without a conversion instruction: the bytes
// [q, 0, 0, 0x4B] are the float 2^23 + q.
__device__ __forceinline__ float byte_to_float(uint32_t word, uint32_t selector) {
  return __uint_as_float(__byte_perm(word, 0x4B000000u, selector)) - 8388608.0f;
}

struct Q4Chunk {
  static constexpr int kValues = 32;
  __device__ static void decode(const uint4& u, float* v) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t lo = w[k] & 0x0F0F0F0Fu, hi = (w[k] >> 4) & 0x0F0F0F0Fu;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        v[8 * k + 2 * b] = byte_to_float(lo, 0x7540u + b);
        v[8 * k + 2 * b + 1] = byte_to_float(hi, 0x7540u + b);
      }
    }
  }
};

struct Q8Chunk {
  static constexpr int kValues = 16;
  __device__ static void decode(const uint4& u, float* v) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
#pragma unroll
      for (int b = 0; b < 4; ++b) v[4 * k + b] = byte_to_float(w[k], 0x7540u + b);
    }
  }
};

template <class C>
constexpr bool kAffine = !std::is_same_v<C, Bf16Chunk>;

__device__ __forceinline__ float load_scale(const DevMat& m, const uint8_t* p, int64_t i) {
  return load_sb(m.sdtype, p, i);
}

// One block: kRowsPerBlock rows of one job. Lane l takes chunks l, l+32, ... of every row.
template <int N, class C>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    gemv_fast_kernel(GemvJobs jobs, const float* __restrict__ x, int64_t ldx, int n) {
  int j = 0;
  while (j + 1 < jobs.count && static_cast<int>(blockIdx.x) >= jobs.first_block[j + 1]) ++j;
  const DevMat& m = jobs.m[j];
  float* __restrict__ out = jobs.out[j];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r0 =
      (static_cast<int64_t>(blockIdx.x - jobs.first_block[j]) * kWarpsPerBlock + warp) *
      kRowsPerWarp;
  if (r0 >= m.rows) return;
  const int64_t chunks = m.row_bytes / 16;
  constexpr int V = C::kValues;
  float acc[N][kRowsPerWarp];
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) acc[i][r] = 0.0f;

  for (int64_t c = lane; c < chunks; c += 32) {
    uint4 wq[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int64_t row = r0 + r < m.rows ? r0 + r : r0;  // duplicate a valid row past the end
      wq[r] = __ldcs(reinterpret_cast<const uint4*>(m.data + row * m.row_bytes) + c);
    }
    float sc[kRowsPerWarp], bi[kRowsPerWarp];
    if constexpr (kAffine<C>) {
      const int64_t g = c * V / m.group;
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const int64_t row = r0 + r < m.rows ? r0 + r : r0;
        sc[r] = load_scale(m, m.scales, row * m.groups + g);
        bi[r] = load_scale(m, m.biases, row * m.groups + g);
      }
    }
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (i >= n) break;
      float xv[V];
      const float4* xp = reinterpret_cast<const float4*>(x + i * ldx + c * V);
#pragma unroll
      for (int q = 0; q < V / 4; ++q) {
        const float4 t = __ldg(xp + q);
        xv[4 * q] = t.x, xv[4 * q + 1] = t.y, xv[4 * q + 2] = t.z, xv[4 * q + 3] = t.w;
      }
      float xsum = 0.0f;
      if constexpr (kAffine<C>) {
#pragma unroll
        for (int q = 0; q < V; ++q) xsum += xv[q];
      }
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        float wv[V];
        C::decode(wq[r], wv);
        float d = 0.0f;
#pragma unroll
        for (int q = 0; q < V; ++q) d = fmaf(wv[q], xv[q], d);
        if constexpr (kAffine<C>) {
          acc[i][r] += sc[r] * d + bi[r] * xsum;
        } else {
          acc[i][r] += d;
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if (i >= n) break;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const float s = warp_sum(acc[i][r]);
      if (lane == 0 && r0 + r < m.rows) out[i * m.rows + r0 + r] = s;
    }
  }
}

template <class C>
void launch_kind(cudaStream_t st, const GemvJobs& jobs, unsigned grid, const float* x, int64_t ldx,
                 int n) {
  const int threads = kWarpsPerBlock * 32;
  if (n == 1) {
    gemv_fast_kernel<1, C><<<grid, threads, 0, st>>>(jobs, x, ldx, n);
  } else if (n <= 2) {
    gemv_fast_kernel<2, C><<<grid, threads, 0, st>>>(jobs, x, ldx, n);
  } else if (n <= 4) {
    gemv_fast_kernel<4, C><<<grid, threads, 0, st>>>(jobs, x, ldx, n);
  } else if (n <= 8) {
    gemv_fast_kernel<8, C><<<grid, threads, 0, st>>>(jobs, x, ldx, n);
  } else {
    gemv_fast_kernel<16, C><<<grid, threads, 0, st>>>(jobs, x, ldx, n);
  }
  TM_CUDA_LAUNCHED();
}

}  // namespace

GemvKind fast_gemv_kind(const DevMat& m) {
  if (m.bits == 0) {
    return m.dtype == kBF16 && m.cols % 8 == 0 && m.row_bytes % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(m.data) % 16 == 0
               ? GemvKind::kBf16
               : GemvKind::kNone;
  }
  if ((m.bits != 4 && m.bits != 8) || m.row_bytes % 16 != 0 ||
      reinterpret_cast<uintptr_t>(m.data) % 16 != 0) {
    return GemvKind::kNone;
  }
  const int values = m.bits == 4 ? 32 : 16;
  return m.group % values == 0 ? (m.bits == 4 ? GemvKind::kQ4 : GemvKind::kQ8) : GemvKind::kNone;
}

void launch_gemv_fast(cudaStream_t st, GemvKind kind, GemvJobs jobs, const float* x, int64_t ldx,
                      int n) {
  TM_CUDA_REQUIRE(jobs.count >= 1 && jobs.count <= kMaxGemvJobs, "gemv: 1..4 matrices per call");
  TM_CUDA_REQUIRE(n >= 1 && n <= 16, "gemv: 1..16 activation rows");
  TM_CUDA_REQUIRE(reinterpret_cast<uintptr_t>(x) % 16 == 0 && ldx % 4 == 0,
                  "gemv: activations must be 16-byte aligned");
  int blocks = 0;
  for (int j = 0; j < jobs.count; ++j) {
    jobs.first_block[j] = blocks;
    blocks += static_cast<int>((jobs.m[j].rows + kRowsPerBlock - 1) / kRowsPerBlock);
  }
  const auto grid = static_cast<unsigned>(blocks);
  switch (kind) {
    case GemvKind::kBf16:
      launch_kind<Bf16Chunk>(st, jobs, grid, x, ldx, n);
      break;
    case GemvKind::kQ4:
      launch_kind<Q4Chunk>(st, jobs, grid, x, ldx, n);
      break;
    case GemvKind::kQ8:
      launch_kind<Q8Chunk>(st, jobs, grid, x, ldx, n);
      break;
    default:
      TM_CUDA_REQUIRE(false, "gemv: no fast kernel for this weight format");
  }
}

}  // namespace tokenmill::cuda
