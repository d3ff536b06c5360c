// tm_stream_order_probe: the batch-1 4-bit GEMV's memory access pattern without its arithmetic,
// in several orders, to see whether the order in which concurrent warps walk their weights
// changes DRAM throughput (PERFORMANCE.md, S45 notes). Each warp step reads a 512-byte block
// of weights (16 bytes a lane) and 256 bytes of scales (8 a lane), U steps in flight, as the
// GEMV does; 16 warps a multiprocessor (the GEMV's large launches). Each variant runs 30 times
// over fresh buffers (no L2 reuse), timed by events (the launch included); the median is printed.
//
// Usage: tm_stream_order_probe (no arguments; about 7 GB of device memory).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../cuda_probe.h"

namespace {

enum class Order {
  kPerWarp,        // warp w's steps contiguous; scales in a second stretch
  kInterleaved,    // step i of warp w at block i * warps + w (concurrent warps adjacent)
  kPerWarpMerged,  // as kPerWarp, each step's scales next to its weights (768-byte blocks)
  kInterleavedMerged,
  kWeightsOnly,  // as kPerWarp without the scales (two thirds of the bytes)
  kBlockShared,  // a block's four warps share one stretch (2 KB a step)
  kBlockSharedMerged,
};

template <Order O, int U>
__global__ void __launch_bounds__(128, 5)
    walk_kernel(const uint8_t* w, const uint8_t* s, int steps, int warps, unsigned* sink) {
  const int warp = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (warp >= warps) return;
  const int64_t wb = warp >> 2, wl = warp & 3;
  unsigned acc = 0;
  for (int i0 = 0; i0 < steps; i0 += U) {
    uint4 a[U];
    uint2 b[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = min(i0 + u, steps - 1);
      const uint8_t *pa, *pb = nullptr;
      if constexpr (O == Order::kPerWarp || O == Order::kWeightsOnly) {
        pa = w + (warp * int64_t{steps} + i) * 512;
        pb = O == Order::kPerWarp ? s + (warp * int64_t{steps} + i) * 256 : nullptr;
      } else if constexpr (O == Order::kInterleaved) {
        pa = w + (i * warps + warp) * 512;
        pb = s + (i * warps + warp) * 256;
      } else if constexpr (O == Order::kPerWarpMerged) {
        pa = w + (warp * int64_t{steps} + i) * 768;
        pb = pa + 512;
      } else if constexpr (O == Order::kInterleavedMerged) {
        pa = w + (i * warps + warp) * 768;
        pb = pa + 512;
      } else if constexpr (O == Order::kBlockShared) {
        pa = w + ((wb * steps + i) * 4 + wl) * 512;
        pb = s + ((wb * steps + i) * 4 + wl) * 256;
      } else {
        pa = w + (wb * steps + i) * 3072 + wl * 768;
        pb = pa + 512;
      }
      a[u] = __ldcs(reinterpret_cast<const uint4*>(pa + lane * 16));
      b[u] = pb != nullptr ? __ldcs(reinterpret_cast<const uint2*>(pb + lane * 8)) : uint2{0, 0};
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= a[u].x ^ a[u].y ^ a[u].z ^ a[u].w ^ b[u].x ^ b[u].y;
  }
  if (acc == 0x12345678u) *sink = acc;  // keeps the loads
}

// A ring over one large allocation: each run reads bytes no recent run touched.
struct Pool {
  uint8_t* base = nullptr;
  size_t bytes = 0, cursor = 0;
  uint8_t* next(size_t n) {
    n = (n + 4095) & ~size_t{4095};
    if (cursor + n > bytes) cursor = 0;
    uint8_t* p = base + cursor;
    cursor += n;
    return p;
  }
};

struct Probe {
  Pool pool;
  unsigned* sink = nullptr;
  cudaEvent_t e0{}, e1{};
  int warps = 0;

  template <Order O, int U>
  void run(const char* name, int steps) {
    constexpr bool merged = O == Order::kPerWarpMerged || O == Order::kInterleavedMerged ||
                            O == Order::kBlockSharedMerged;
    const size_t wb = size_t(warps) * steps * 512, sb = wb / 2;
    std::vector<float> ms;
    for (int r = 0; r < 30; ++r) {
      const uint8_t* w = pool.next(merged ? wb + sb : wb);
      const uint8_t* s = pool.next(sb);
      check(cudaEventRecord(e0), "cudaEventRecord");
      walk_kernel<O, U><<<(warps + 3) / 4, 128>>>(w, s, steps, warps, sink);
      check(cudaGetLastError(), "launch");
      check(cudaEventRecord(e1), "cudaEventRecord");
      check(cudaEventSynchronize(e1), "cudaEventSynchronize");
      float t = 0;
      check(cudaEventElapsedTime(&t, e0, e1), "cudaEventElapsedTime");
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const double bytes = double(O == Order::kWeightsOnly ? wb : wb + sb), med = ms[ms.size() / 2];
    std::printf("  %-36s median %7.2f us  %.3f TB/s\n", name, med * 1e3,
                bytes / (med * 1e-3) / 1e12);
  }
};

}  // namespace

int main() {
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "device query");
  Probe p;
  p.pool.bytes = size_t{6} << 30;
  check(cudaMalloc(&p.pool.base, p.pool.bytes), "cudaMalloc (6 GiB)");
  check(cudaMemset(p.pool.base, 1, p.pool.bytes), "cudaMemset");
  check(cudaMalloc(&p.sink, sizeof(unsigned)), "cudaMalloc");
  check(cudaEventCreate(&p.e0), "cudaEventCreate");
  check(cudaEventCreate(&p.e1), "cudaEventCreate");
  p.warps = sms * 16;
  for (const double mb : {18.0, 47.0, 100.0}) {
    const int steps = static_cast<int>(mb * 1e6 / 768 / p.warps);
    std::printf("%.0f MB: %d warps x %d steps\n", mb, p.warps, steps);
    p.run<Order::kPerWarp, 4>("per warp, scales apart", steps);
    p.run<Order::kPerWarp, 8>("per warp, scales apart, 8 deep", steps);
    p.run<Order::kInterleaved, 4>("interleaved, scales apart", steps);
    p.run<Order::kPerWarpMerged, 4>("per warp, scales merged", steps);
    p.run<Order::kInterleavedMerged, 4>("interleaved, scales merged", steps);
    p.run<Order::kWeightsOnly, 4>("per warp, weights only", steps);
    p.run<Order::kBlockShared, 4>("block-shared stretch", steps);
    p.run<Order::kBlockSharedMerged, 4>("block-shared stretch, merged", steps);
  }
  return 0;
}
