// tm_sm_read_probe: the read bandwidth of part of the chip. A decode kernel that keeps a MoE
// slot's work inside one cluster uses only some of the multiprocessors (the 35B-A3B's nine slots
// in clusters of eight: 72 of 132), so its speed is bounded by what those multiprocessors can
// pull from device memory, not by the chip's bandwidth. This probe measures that bound for cold
// data (each run reads the next region of a buffer of `window` MB, 2,048 unless given: any
// window larger than L2 keeps the reads cold; a smaller one than the TLB's reach keeps its
// pages' translations warm):
//  - bulk: one thread a block keeps `depth` cp.async.bulk copies of 16 KB in flight into a ring
//    in shared memory (the copy engine; no register traffic);
//  - loads: 512 threads a block, each with `depth` independent 16-byte non-caching loads in
//    flight (the streamed GEMV's form).
// Two shapes of work per block: a burst (216 KB, the 35B-A3B fused expert MLP's share of one
// block; everything issued at once where depth allows) and a stream (8 MB, the steady rate).
// The time is from the kernel's launch to its end (CUDA events, median of 15 runs); an empty
// kernel of the same shape, timed the same way, gives the fixed part (launch and timing), and
// each row also shows its time beyond that.
//
// Usage: tm_sm_read_probe [window_mb]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../cuda_probe.h"

namespace {

constexpr int kThreads = 512;
constexpr uint32_t kChunk = 16384;  // bytes a bulk copy
constexpr int kMaxDepth = 13;       // bulk ring stages (13 x 16 KB = 208 KB of shared memory)

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Block b reads bytes [b * per_block, (b + 1) * per_block) of src through a ring of `depth`
// 16 KB stages; every copy's completion is awaited (the data itself is not used).
__global__ void __launch_bounds__(kThreads, 1)
    bulk_kernel(const uint8_t* src, uint64_t per_block, int depth, unsigned* sink) {
  extern __shared__ __align__(128) uint8_t ring[];
  __shared__ __align__(8) uint64_t bars[kMaxDepth];
  if (threadIdx.x != 0) return;
  const uint8_t* base = src + blockIdx.x * per_block;
  const uint64_t chunks = per_block / kChunk;
  for (int s = 0; s < depth; ++s) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&bars[s])));
  }
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  const auto issue = [&](uint64_t c) {
    const int s = static_cast<int>(c % depth);
    const uint32_t bar = smem_addr(&bars[s]);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(kChunk)
                 : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
        "[%3];" ::"r"(smem_addr(ring + s * kChunk)),
        "l"(base + c * kChunk), "r"(kChunk), "r"(bar)
        : "memory");
  };
  for (uint64_t c = 0; c < chunks && c < static_cast<uint64_t>(depth); ++c) issue(c);
  for (uint64_t c = 0; c < chunks; ++c) {
    const int s = static_cast<int>(c % depth);
    const uint32_t parity = static_cast<uint32_t>((c / depth) & 1);
    asm volatile(
        "{\n.reg .pred p;\nW_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra W_%=;\n}\n" ::"r"(smem_addr(&bars[s])),
        "r"(parity)
        : "memory");
    if (c + depth < chunks) issue(c + depth);
  }
  if (ring[0] == 0x5a && ring[kChunk - 1] == 0xa5) atomicAdd(sink, 1u);
}

// The same bytes by plain loads: each thread has `D` independent 16-byte loads in flight.
template <int D>
__global__ void __launch_bounds__(kThreads, 1)
    load_kernel(const uint8_t* src, uint64_t per_block, unsigned* sink) {
  const uint4* base = reinterpret_cast<const uint4*>(src + blockIdx.x * per_block);
  const uint64_t vecs = per_block / 16;
  uint32_t acc = 0;
  for (uint64_t i = threadIdx.x; i < vecs; i += uint64_t{kThreads} * D) {
    uint4 v[D];
#pragma unroll
    for (int d = 0; d < D; ++d) {
      const uint64_t j = i + static_cast<uint64_t>(d) * kThreads;
      if (j < vecs) {
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v[d].x), "=r"(v[d].y), "=r"(v[d].z), "=r"(v[d].w)
                     : "l"(base + j));
      } else {
        v[d] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int d = 0; d < D; ++d) acc ^= v[d].x ^ v[d].y ^ v[d].z ^ v[d].w;
  }
  if (acc == 0x5a5aa5a5u) atomicAdd(sink, 1u);
}

// The fixed part: the same launch doing nothing.
__global__ void __launch_bounds__(kThreads, 1) empty_kernel(unsigned* sink) {
  if (threadIdx.x == 1024) atomicAdd(sink, 1u);  // never: keeps the kernel from being elided
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Probe {
  uint8_t* buf = nullptr;
  unsigned* sink = nullptr;
  cudaStream_t st = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  size_t window = 0;  // bytes of buf
  size_t cursor = 0;  // where the next run reads (advances so every run reads cold data)
  double empty_us = 0.0;

  const uint8_t* fresh(size_t bytes) {
    if (cursor + bytes > window) cursor = 0;
    const uint8_t* p = buf + cursor;
    cursor += (bytes + 4095) / 4096 * 4096;
    return p;
  }

  template <class F>
  double time_us(uint64_t bytes, const F& launch) {
    std::vector<float> ms;
    for (int r = 0; r < 16; ++r) {
      const uint8_t* src = fresh(bytes);
      check(cudaEventRecord(e0, st), "cudaEventRecord");
      launch(src);
      check(cudaGetLastError(), "launch");
      check(cudaEventRecord(e1, st), "cudaEventRecord");
      check(cudaEventSynchronize(e1), "cudaEventSynchronize");
      float t = 0;
      check(cudaEventElapsedTime(&t, e0, e1), "cudaEventElapsedTime");
      if (r > 0) ms.push_back(t);  // the first run warms the launch path
    }
    return median(ms) * 1e3;
  }

  template <class F>
  void run(const char* form, int depth, int blocks, uint64_t per_block, const F& launch) {
    const double us = time_us(per_block * blocks, launch);
    const double total = static_cast<double>(per_block) * blocks;
    std::printf(
        "  %-5s depth %2d, %3d blocks, %7.0f KB each: %8.2f us (%7.2f beyond empty), %6.1f "
        "GB/s a block, %6.2f TB/s in all\n",
        form, depth, blocks, per_block / 1024.0, us, us - empty_us, per_block / us * 1e-3,
        total / us * 1e-6);
  }

  void empty(int blocks) {
    const int smem = 120 * 1024;
    check(cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
          "cudaFuncSetAttribute");
    empty_us =
        time_us(0, [&](const uint8_t*) { empty_kernel<<<blocks, kThreads, smem, st>>>(sink); });
    std::printf("  empty kernel, %3d blocks: %8.2f us\n", blocks, empty_us);
  }

  void bulk(int depth, int blocks, uint64_t per_block) {
    const size_t smem = size_t{kChunk} * depth;
    check(cudaFuncSetAttribute(bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem)),
          "cudaFuncSetAttribute");
    run("bulk", depth, blocks, per_block, [&](const uint8_t* src) {
      bulk_kernel<<<blocks, kThreads, smem, st>>>(src, per_block, depth, sink);
    });
  }

  template <int D>
  void loads(int blocks, uint64_t per_block) {
    // One block a multiprocessor, as the bulk form (its shared memory does the same).
    const int smem = 120 * 1024;
    check(cudaFuncSetAttribute(load_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
          "cudaFuncSetAttribute");
    run("loads", D, blocks, per_block, [&](const uint8_t* src) {
      load_kernel<D><<<blocks, kThreads, smem, st>>>(src, per_block, sink);
    });
  }
};

}  // namespace

int main(int argc, char** argv) {
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "device query");
  Probe p;
  const long long window_mb = argc > 1 ? std::atoll(argv[1]) : 2048;
  if (window_mb < 64 || window_mb > 65536) {
    std::fprintf(stderr,
                 "sm_read_probe: window_mb must be 64-65536 (MB of buffer to read), got %s\n",
                 argv[1]);
    return 2;
  }
  p.window = static_cast<size_t>(window_mb) << 20;
  check(cudaMalloc(&p.buf, p.window), "cudaMalloc");
  check(cudaMemset(p.buf, 1, p.window), "cudaMemset");
  check(cudaMalloc(&p.sink, sizeof(unsigned)), "cudaMalloc");
  check(cudaStreamCreateWithFlags(&p.st, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaEventCreate(&p.e0), "cudaEventCreate");
  check(cudaEventCreate(&p.e1), "cudaEventCreate");
  std::printf(
      "%d multiprocessors; reads over a %lld MB window, one block of %d threads a "
      "multiprocessor\n",
      sms, window_mb, kThreads);
  const uint64_t burst = 216 * 1024, stream = 8 << 20;
  for (const int blocks : {8, 72, sms}) {
    p.empty(blocks);
    for (const uint64_t per : {burst, stream}) {
      if (per * blocks > p.window) {
        std::printf("  %3d blocks of %.0f KB do not fit the window: not run\n", blocks,
                    per / 1024.0);
        continue;
      }
      for (const int depth : {2, 4, 8, 13}) p.bulk(depth, blocks, per);
      p.loads<1>(blocks, per);
      p.loads<2>(blocks, per);
      p.loads<4>(blocks, per);
      p.loads<8>(blocks, per);
    }
  }
  return 0;
}
