// CpuBackend's host memory (huge-page chunks for small allocations, own mappings for large
// ones): alignment, no overlap, reuse, and release; the backend's count of what it holds.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backend/alloc_stats.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_memory.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace tokenmill {
namespace {

using cpu::HostMemory;

TEST(CpuHostMemory, AlignedDisjointAndWritable) {
  HostMemory mem;
  std::mt19937 rng(3);
  struct Block {
    uint8_t* p;
    size_t n;
    uint8_t fill;
  };
  std::vector<Block> live;
  for (int i = 0; i < 600; ++i) {
    // Mostly small (shared chunks), some spanning a chunk's remainder, some large.
    const size_t n = i % 50 == 0 ? (size_t{3} << 20) + rng() % 1000 : 1 + rng() % 300000;
    auto* p = static_cast<uint8_t*>(mem.alloc(n));
    ASSERT_NE(p, nullptr);
    ASSERT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << "64-byte alignment";
    const auto fill = static_cast<uint8_t>(i);
    std::memset(p, fill, n);
    live.push_back({p, n, fill});
    if (rng() % 3 == 0) {  // free a random live block
      const size_t k = rng() % live.size();
      mem.free(live[k].p);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    }
  }
  // Every live block still holds its own pattern: nothing overlapped or was unmapped early.
  for (const Block& b : live) {
    for (size_t j = 0; j < b.n; j += 4093) ASSERT_EQ(b.p[j], b.fill);
    ASSERT_EQ(b.p[b.n - 1], b.fill);
  }
  for (const Block& b : live) mem.free(b.p);
  mem.free(nullptr);
}

TEST(CpuHostMemory, EmptiedCurrentChunkIsReused) {
  HostMemory mem;
  void* a = mem.alloc(1000);
  mem.free(a);
  void* b = mem.alloc(1000);
  EXPECT_EQ(a, b);
  mem.free(b);
}

TEST(CpuHostMemory, LargeAllocationsAreHugePageAligned) {
  HostMemory mem;
  void* p = mem.alloc(HostMemory::kLargeBytes);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % HostMemory::kHugePage, 0u);
  mem.free(p);
}

TEST(CpuHostMemory, RejectsUnknownPointers) {
  HostMemory mem;
  void* p = mem.alloc(100);
  int on_stack = 0;
  EXPECT_THROW(mem.free(&on_stack), Error);
  mem.free(p);
}

TEST(AllocStats, CountsCurrentAndPeak) {
  AllocStats st;
  int a = 0, b = 0, c = 0;
  st.added(&a, 100);
  st.added(&b, 300);
  EXPECT_EQ(st.current(), 400);
  st.removed(&a);
  st.removed(&c);  // never added: no change
  st.removed(nullptr);
  EXPECT_EQ(st.current(), 300);
  st.added(&c, 50);
  EXPECT_EQ(st.current(), 350);
  EXPECT_EQ(st.peak(), 400);
  st.added(&a, 200);
  EXPECT_EQ(st.peak(), 550);
}

// The peak `tokenmill bench` reports: the most held at once through alloc(), not the total.
TEST(CpuHostMemory, BackendReportsPeakAllocated) {
  ThreadPool pool(1);
  CpuBackend be(pool);
  const int64_t base = be.peak_allocated_bytes();  // whatever set-up holds
  ASSERT_GE(base, 0);
  void* a = be.alloc(2 << 20);
  void* b = be.alloc(3 << 20);
  EXPECT_EQ(be.peak_allocated_bytes(), base + (5 << 20));
  be.free(a);
  be.free(b);
  void* c = be.alloc(4 << 20);  // 9 MiB allocated in all, never more than 5 at once
  EXPECT_EQ(be.peak_allocated_bytes(), base + (5 << 20));
  void* d = be.alloc(2 << 20);
  EXPECT_EQ(be.peak_allocated_bytes(), base + (6 << 20));
  be.free(c);
  be.free(d);
  EXPECT_EQ(be.peak_allocated_bytes(), base + (6 << 20));
}

// upload_weight copies a checkpoint's weight (data, scales, biases) into the backend's own
// memory, in huge pages for large arrays (decode then streams them without a TLB miss every
// 4 KB): new pointers, the same bytes, independent of the source, counted as allocated, and
// computing what the source computes.
TEST(CpuHostMemory, UploadWeightCopiesIntoBackendMemory) {
  ThreadPool pool(2);
  CpuBackend be(pool);
  constexpr int64_t kRows = 1024, kCols = 2048, kGroup = 64;  // 4-bit: 1 MiB of codes
  std::mt19937 rng(3);
  std::vector<uint32_t> codes(static_cast<size_t>(kRows * kCols / 8));
  for (auto& c : codes) c = rng();
  std::vector<uint16_t> scales(static_cast<size_t>(kRows * kCols / kGroup), 0x3c00);  // bf16 ~1
  std::vector<uint16_t> biases(scales.size(), 0xbc00);
  for (auto& x : scales) x = static_cast<uint16_t>(0x3b00 + rng() % 512);
  Weight host;
  host.dtype = DType::U32;
  host.bits = 4;
  host.group = static_cast<int>(kGroup);
  host.rows = kRows;
  host.cols = kCols;
  host.data = codes.data();
  host.scales = scales.data();
  host.biases = biases.data();
  ASSERT_EQ(host.data_bytes(), codes.size() * 4);
  ASSERT_EQ(host.scale_bytes(), scales.size() * 2);
  const int64_t count = be.allocation_count();
  const Weight w = be.upload_weight(host);
  EXPECT_EQ(be.allocation_count(), count + 3);
  for (const auto& [got, src] : {std::pair{w.data, host.data}, std::pair{w.scales, host.scales},
                                 std::pair{w.biases, host.biases}}) {
    EXPECT_NE(got, src);
  }
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w.data) % HostMemory::kHugePage, 0u);
  EXPECT_EQ(std::memcmp(w.data, codes.data(), host.data_bytes()), 0);
  EXPECT_EQ(std::memcmp(w.scales, scales.data(), host.scale_bytes()), 0);
  EXPECT_EQ(std::memcmp(w.biases, biases.data(), host.scale_bytes()), 0);
  std::vector<float> x(static_cast<size_t>(kCols)), want(static_cast<size_t>(kRows)),
      got(want.size());
  for (auto& v : x) v = static_cast<float>(rng() % 200) / 100.0f - 1.0f;
  be.linear(x.data(), 1, host, want.data());
  codes.assign(codes.size(), 0);  // the source goes away: the copy is what the backend reads
  be.linear(x.data(), 1, w, got.data());
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace tokenmill
