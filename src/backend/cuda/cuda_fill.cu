// CudaBackend::fill_random (dummy weights generated on the device: a 27B model's 54 GB would take
// minutes to produce on the host) and read_probe (the benchmark's read-bandwidth kernel).
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_common.cuh"
#include "tensor/random_fill.h"

namespace tokenmill::cuda {
namespace {

template <int kDType>  // 0 = U32 bits, else kF32 / kF16 / kBF16 + 1
__global__ void fill_random_kernel(void* dst, int64_t n, float stddev, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const auto u = static_cast<uint64_t>(i);
    if constexpr (kDType == 0) {
      static_cast<uint32_t*>(dst)[i] = static_cast<uint32_t>(random_fill::bits(seed, u));
    } else {
      const float v = random_fill::uniform(seed, u, stddev);
      if constexpr (kDType == kF32 + 1) {
        static_cast<float*>(dst)[i] = v;
      } else if constexpr (kDType == kF16 + 1) {
        static_cast<__half*>(dst)[i] = __float2half_rn(v);
      } else {
        // Round to nearest even, as the host's f32_to_bf16 (values here are finite).
        const uint32_t b = __float_as_uint(v);
        static_cast<uint16_t*>(dst)[i] =
            static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
      }
    }
  }
}

// Each thread sums 16-byte words with a grid stride; one atomic per block keeps the result live.
__global__ void read_probe_kernel(const uint4* __restrict__ src, int64_t n,
                                  unsigned long long* sink) {
  uint32_t acc = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = __ldcs(src + i), b = __ldcs(src + i + stride), c = __ldcs(src + i + 2 * stride),
                d = __ldcs(src + i + 3 * stride);
    acc += a.x ^ b.y ^ c.z ^ d.w;
    acc += a.y ^ b.z ^ c.w ^ d.x;
    acc += a.z ^ b.w ^ c.x ^ d.y;
    acc += a.w ^ b.x ^ c.y ^ d.z;
  }
  for (; i < n; i += stride) {
    const uint4 a = __ldcs(src + i);
    acc += a.x ^ a.y ^ a.z ^ a.w;
  }
  acc = __reduce_add_sync(0xffffffffu, acc);
  if ((threadIdx.x & 31) == 0) atomicAdd(sink, static_cast<unsigned long long>(acc));
}

}  // namespace
}  // namespace tokenmill::cuda

namespace tokenmill {

void CudaBackend::fill_random(void* dst, DType dtype, int64_t n, float stddev, uint64_t seed) {
  if (n <= 0) return;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65536));
  switch (dtype) {
    case DType::U32:
      cuda::fill_random_kernel<0><<<grid, 256, 0, stream_>>>(dst, n, stddev, seed);
      break;
    case DType::F32:
      cuda::fill_random_kernel<cuda::kF32 + 1><<<grid, 256, 0, stream_>>>(dst, n, stddev, seed);
      break;
    case DType::F16:
      cuda::fill_random_kernel<cuda::kF16 + 1><<<grid, 256, 0, stream_>>>(dst, n, stddev, seed);
      break;
    case DType::BF16:
      cuda::fill_random_kernel<cuda::kBF16 + 1><<<grid, 256, 0, stream_>>>(dst, n, stddev, seed);
      break;
    default:
      TM_CUDA_REQUIRE(false, "fill_random: dtype must be U32, F32, F16 or BF16");
  }
  TM_CUDA_LAUNCHED();
}

void CudaBackend::read_probe(const void* src, size_t bytes, void* sink) {
  TM_CUDA_REQUIRE(reinterpret_cast<uintptr_t>(src) % 16 == 0, "read_probe: unaligned buffer");
  TM_CUDA(cudaMemsetAsync(sink, 0, 8, stream_));
  int sms = 0;
  TM_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_));
  cuda::read_probe_kernel<<<static_cast<unsigned>(sms * 8), 512, 0, stream_>>>(
      static_cast<const uint4*>(src), static_cast<int64_t>(bytes / 16),
      static_cast<unsigned long long*>(sink));
  TM_CUDA_LAUNCHED();
}

}  // namespace tokenmill
