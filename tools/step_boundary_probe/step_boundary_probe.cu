// tm_step_boundary_probe: the fixed cost of a dependency between two phases of a decode step.
// A decode step is a chain of a few hundred dependent kernels; each boundary costs its release,
// the next grid's start and its completion, whatever the kernels do. The alternative is one
// persistent kernel whose phases meet at grid barriers. This probe times both with no work in
// the phases:
//  - chain: a CUDA graph of N dependent launches (each block reads what the block of the same
//    index wrote in the launch before, as a decode kernel reads its predecessor's output), with
//    programmatic dependent launch (the engine's form) and without it;
//  - barrier: one kernel of as many blocks as fit at once, N grid barriers (cooperative groups'
//    grid.sync(), and a counter with release/acquire atomics), each block again reading what
//    another block wrote before the barrier.
// Each form runs 20 times; the median per boundary is printed (microseconds).
//
// Usage: tm_step_boundary_probe (no arguments).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../cuda_probe.h"

namespace {

constexpr int kThreads = 128;
constexpr int kLinks = 200;      // launches per chain
constexpr int kBarriers = 1000;  // barriers per persistent kernel

// One link of a chain: thread 0 of each block reads the cell the previous link's block wrote
// and writes its own (cells alternate between two halves so a link never reads its own writes).
template <bool kPdl>
__global__ void __launch_bounds__(kThreads) link_kernel(unsigned* cells, int blocks, int i) {
  if constexpr (kPdl) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  }
  if (threadIdx.x == 0) {
    const unsigned* src = cells + (i & 1) * blocks;
    unsigned* dst = cells + ((i + 1) & 1) * blocks;
    const int from = (blockIdx.x + 1) % blocks;
    dst[blockIdx.x] = src[from] + 1;
  }
}

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// A grid barrier: the last block to arrive bumps the generation the others spin on.
__device__ __forceinline__ void counter_barrier(unsigned* count, unsigned* gen, unsigned blocks) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned g = load_acquire(gen);
    unsigned old;
    asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], 1;"
                 : "=r"(old)
                 : "l"(count)
                 : "memory");
    if (old == blocks - 1) {
      *count = 0;
      asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(gen), "r"(g + 1) : "memory");
    } else {
      while (load_acquire(gen) == g) {
      }
    }
  }
  __syncthreads();
}

template <bool kCg>
__global__ void __launch_bounds__(kThreads)
    barrier_kernel(unsigned* cells, unsigned* count, unsigned* gen, int barriers) {
  const int blocks = static_cast<int>(gridDim.x);
  for (int i = 0; i < barriers; ++i) {
    if (threadIdx.x == 0) {
      const unsigned* src = cells + (i & 1) * blocks;
      unsigned* dst = cells + ((i + 1) & 1) * blocks;
      dst[blockIdx.x] = src[(blockIdx.x + 1) % blocks] + 1;
    }
    if constexpr (kCg) {
      cooperative_groups::this_grid().sync();
    } else {
      counter_barrier(count, gen, static_cast<unsigned>(blocks));
    }
  }
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Probe {
  unsigned *cells = nullptr, *count = nullptr, *gen = nullptr;
  cudaStream_t st = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;

  template <class F>
  float timed(const F& f) {
    std::vector<float> ms;
    for (int r = 0; r < 20; ++r) {
      check(cudaEventRecord(e0, st), "cudaEventRecord");
      f();
      check(cudaEventRecord(e1, st), "cudaEventRecord");
      check(cudaEventSynchronize(e1), "cudaEventSynchronize");
      float t = 0;
      check(cudaEventElapsedTime(&t, e0, e1), "cudaEventElapsedTime");
      ms.push_back(t);
    }
    return median(ms);
  }

  template <bool kPdl>
  void chain(int blocks) {
    cudaGraph_t graph;
    check(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), "capture");
    for (int i = 0; i < kLinks; ++i) {
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(static_cast<unsigned>(blocks));
      cfg.blockDim = dim3(kThreads);
      cfg.stream = st;
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[0].val.programmaticStreamSerializationAllowed = 1;
      cfg.attrs = attr;
      cfg.numAttrs = kPdl ? 1 : 0;
      check(cudaLaunchKernelEx(&cfg, link_kernel<kPdl>, cells, blocks, i), "launch");
    }
    check(cudaStreamEndCapture(st, &graph), "end capture");
    cudaGraphExec_t exec;
    check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    check(cudaGraphLaunch(exec, st), "warm-up");
    const float ms = timed([&] { check(cudaGraphLaunch(exec, st), "graph launch"); });
    std::printf("  chain, %s, %4d blocks: %6.2f us a boundary\n",
                kPdl ? "dependent launch" : "plain launch    ", blocks, ms * 1e3f / kLinks);
    check(cudaGraphExecDestroy(exec), "destroy");
    check(cudaGraphDestroy(graph), "destroy");
  }

  template <bool kCg>
  void barriers(int blocks) {
    check(cudaMemsetAsync(count, 0, sizeof(unsigned), st), "memset");
    int barriers_n = kBarriers;
    void* args[] = {&cells, &count, &gen, &barriers_n};
    const auto kernel = barrier_kernel<kCg>;
    const auto launch = [&] {
      check(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel),
                                        dim3(static_cast<unsigned>(blocks)), dim3(kThreads), args,
                                        0, st),
            "cooperative launch");
    };
    launch();
    const float ms = timed(launch);
    std::printf("  barrier, %s, %4d blocks: %6.2f us a barrier\n",
                kCg ? "grid.sync()    " : "atomic counter ", blocks, ms * 1e3f / kBarriers);
  }
};

}  // namespace

int main() {
  int sms = 0, per_sm = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "device query");
  Probe p;
  check(cudaMalloc(&p.cells, sizeof(unsigned) * 2 * 64 * 1024), "cudaMalloc");
  check(cudaMemset(p.cells, 0, sizeof(unsigned) * 2 * 64 * 1024), "cudaMemset");
  check(cudaMalloc(&p.count, sizeof(unsigned)), "cudaMalloc");
  check(cudaMalloc(&p.gen, sizeof(unsigned)), "cudaMalloc");
  check(cudaMemset(p.gen, 0, sizeof(unsigned)), "cudaMemset");
  check(cudaStreamCreateWithFlags(&p.st, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaEventCreate(&p.e0), "cudaEventCreate");
  check(cudaEventCreate(&p.e1), "cudaEventCreate");
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, barrier_kernel<true>, kThreads, 0),
        "occupancy");
  std::printf("%d multiprocessors, %d blocks of %d threads fit on each\n", sms, per_sm, kThreads);
  for (const int k : {1, 4, 8}) {
    p.chain<true>(sms * k);
    p.chain<false>(sms * k);
  }
  for (const int k : {1, 4, 8}) {
    if (k > per_sm) break;
    p.barriers<true>(sms * k);
    p.barriers<false>(sms * k);
  }
  return 0;
}
