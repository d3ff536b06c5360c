// The decode GEMVs' L2 prefetch of the next launch's weights (cuda_l2_prefetch.h): the chain
// learns each launch's successor into the device table the kernels read, and prefetching
// changes no result bit.
#include <cuda_runtime.h>

#include <cstring>

#include "backend/cuda/cuda_l2_prefetch.h"
#include "cuda_test_util.h"
#include "tensor/dtype.h"

namespace tokenmill::cudatest {
namespace {

using cuda::L2Prefetch;
using cuda::L2PrefetchChain;
using cuda::L2Region;

const void* fake(uintptr_t at) {
  return reinterpret_cast<const void*>(at);
}  // never read

std::vector<L2Prefetch> table_of(const L2Prefetch* dev, int n) {
  std::vector<L2Prefetch> t(static_cast<size_t>(n));
  EXPECT_EQ(cudaMemcpy(t.data(), dev, t.size() * sizeof(L2Prefetch), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return t;
}

TEST(CudaL2PrefetchChain, LearnsEachLaunchsSuccessor) {
  TM_REQUIRE_CUDA_DEVICE();
  constexpr int kCap = 4;
  L2Prefetch* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, kCap * sizeof(L2Prefetch)), cudaSuccess);
  ASSERT_EQ(cudaMemset(dev, 0, kCap * sizeof(L2Prefetch)), cudaSuccess);
  L2PrefetchChain chain;
  chain.init(dev, kCap, 1 << 20, 0);  // 1 MiB a launch, from launches of any size
  const L2Region a[] = {{fake(0x100000), 4 << 20}};
  const L2Region b[] = {{fake(0x900000), 512 << 10}, {fake(0xa00000), 64 << 10}};
  const L2Region c[] = {{fake(0xb00000), 2 << 20}};
  // One step (recorded: nothing goes up), then the next step's first launch uploads.
  EXPECT_EQ(chain.attach(a, 1, nullptr, true), dev + 0);
  EXPECT_EQ(chain.attach(b, 2, nullptr, true), dev + 1);
  EXPECT_EQ(chain.attach(c, 1, nullptr, true), dev + 2);
  EXPECT_EQ(table_of(dev, kCap)[0].count, 0) << "uploaded while recording";
  EXPECT_EQ(chain.attach(a, 1, nullptr, false), dev + 0);
  std::vector<L2Prefetch> t = table_of(dev, kCap);
  // a -> b: both regions, all of them (576 KiB < 1 MiB).
  EXPECT_EQ(t[0].count, 2);
  EXPECT_EQ(t[0].ptr[0], b[0].ptr);
  EXPECT_EQ(t[0].bytes[0], b[0].bytes);
  EXPECT_EQ(t[0].ptr[1], b[1].ptr);
  EXPECT_EQ(t[0].bytes[1], b[1].bytes);
  EXPECT_FLOAT_EQ(t[0].share, 1.0f);
  // b -> c: half of c's 2 MiB; c -> a: a quarter of a's 4 MiB.
  EXPECT_EQ(t[1].count, 1);
  EXPECT_EQ(t[1].ptr[0], c[0].ptr);
  EXPECT_FLOAT_EQ(t[1].share, 0.5f);
  EXPECT_EQ(t[2].count, 1);
  EXPECT_EQ(t[2].ptr[0], a[0].ptr);
  EXPECT_FLOAT_EQ(t[2].share, 0.25f);
  EXPECT_EQ(t[3].count, 0);
  // The first successor stays (a -> c now does not replace a -> b); a fifth launch finds the
  // table full and prefetches nothing.
  EXPECT_EQ(chain.attach(c, 1, nullptr, false), dev + 2);
  const L2Region d[] = {{fake(0xc00000), 4096}};
  const L2Region e[] = {{fake(0xd00000), 4096}};
  EXPECT_EQ(chain.attach(d, 1, nullptr, false), dev + 3);
  EXPECT_EQ(chain.attach(e, 1, nullptr, false), nullptr);
  EXPECT_EQ(chain.attach(a, 1, nullptr, false), dev + 0);
  t = table_of(dev, kCap);
  EXPECT_EQ(t[0].ptr[0], b[0].ptr);
  EXPECT_EQ(t[2].ptr[0], a[0].ptr);
  EXPECT_EQ(t[3].count, 1) << "d's successor e has no entry of its own but is still prefetched";
  EXPECT_EQ(t[3].ptr[0], e[0].ptr);
  // Freed memory: every entry goes.
  chain.reset(nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (const L2Prefetch& x : table_of(dev, kCap)) EXPECT_EQ(x.count, 0);
  EXPECT_EQ(chain.attach(c, 1, nullptr, false), dev + 0);
  // Off: no entries at all.
  L2PrefetchChain off;
  off.init(dev, kCap, 0, 0);
  EXPECT_EQ(off.attach(a, 1, nullptr, false), nullptr);
  // A floor of 1 MiB: b (576 KiB) prefetches nothing itself but is still a's successor.
  chain.reset(nullptr);
  L2PrefetchChain floor;
  floor.init(dev, kCap, 1 << 20, 1 << 20);
  EXPECT_EQ(floor.attach(a, 1, nullptr, false), dev + 0);
  EXPECT_EQ(floor.attach(b, 2, nullptr, false), nullptr);
  EXPECT_EQ(floor.attach(c, 1, nullptr, false), dev + 2);
  EXPECT_EQ(floor.attach(a, 1, nullptr, false), dev + 0);
  t = table_of(dev, kCap);
  EXPECT_EQ(t[0].ptr[0], b[0].ptr);
  EXPECT_EQ(t[1].ptr[0], c[0].ptr) << "b's successor is learned though b does not prefetch";
  cudaFree(dev);
}

// The same launches on a backend that prefetches and on one that does not: identical bits, and
// within the linear tests' tolerance of the CPU.
TEST_F(CudaVsCpu, L2PrefetchChangesNoBit) {
  std::unique_ptr<Backend> plain = make_cuda_backend(0, PrefillPrecision::kExact, false);
  Rng rng(29);
  struct Mat {
    std::vector<uint16_t> bits;
    Weight w;
  };
  std::vector<Mat> mats;
  // Two matrices above the backend's floor for prefetching (56 MiB) around a small one.
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{30720, 1024}, {1024, 1024}, {30728, 1024}}) {
    Mat m;
    m.bits.resize(static_cast<size_t>(rows * cols));
    for (auto& v : m.bits) v = f32_to_bf16(rng.normal(0.5f));
    m.w.dtype = DType::BF16;
    m.w.rows = rows;
    m.w.cols = cols;
    mats.push_back(std::move(m));
  }
  for (Mat& m : mats) m.w.data = m.bits.data();
  for (int64_t n : {1, 3}) {
    const std::vector<float> x = rng.normals(static_cast<size_t>(n * 1024));
    std::vector<std::vector<float>> got[2];
    Backend* both[2] = {gpu.get(), plain.get()};
    for (int k = 0; k < 2; ++k) {
      Backend& be = *both[k];
      std::vector<Weight> dw;
      for (const Mat& m : mats) dw.push_back(be.upload_weight(m.w));
      float* dx = static_cast<float*>(be.alloc(x.size() * sizeof(float)));
      be.upload(dx, x.data(), x.size() * sizeof(float));
      std::vector<float*> outs;
      for (const Mat& m : mats) {
        outs.push_back(static_cast<float*>(be.alloc(static_cast<size_t>(n * m.w.rows) * 4)));
      }
      // Three rounds: the first learns the order, the later ones prefetch.
      for (int round = 0; round < 3; ++round) {
        for (size_t i = 0; i < mats.size(); ++i) be.linear(dx, n, dw[i], outs[i], 0);
      }
      for (size_t i = 0; i < mats.size(); ++i) {
        std::vector<float> v(static_cast<size_t>(n * mats[i].w.rows));
        be.download(v.data(), outs[i], v.size() * sizeof(float));
        got[k].push_back(std::move(v));
      }
      be.synchronize();
      for (float* p : outs) be.free(p);
      be.free(dx);
    }
    for (size_t i = 0; i < mats.size(); ++i) {
      std::vector<float> want(got[0][i].size());
      cpu->linear(x.data(), n, mats[i].w, want.data(), 0);
      expect_close(got[0][i], want, 1e-4, "bf16 with L2 prefetch, matrix " + std::to_string(i));
      ASSERT_EQ(std::memcmp(got[0][i].data(), got[1][i].data(), got[0][i].size() * 4), 0)
          << "matrix " << i << " at n=" << n << ": prefetching changed the result";
    }
  }
}

}  // namespace
}  // namespace tokenmill::cudatest
