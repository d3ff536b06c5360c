// Internal to backend/cpu: host memory for CpuBackend::alloc in 2 MB transparent huge pages.
//
// Why: a decode step streams every weight once; with 4 KB pages the cpu-120m 4-bit decode step
// was 5-8% slower than with the same weights (and KV cache) in huge pages (a TLB miss on every
// new 4 KB page of each of the ~100 matrices' data, scales and biases; measured on the 2-core
// EPYC VM). The kernel backs a range with huge pages only where it is 2 MB aligned and advised
// (MADV_HUGEPAGE; THP "madvise" mode), so:
// - allocations of at least kLargeBytes get their own 2 MB-aligned mapping;
// - smaller ones are carved from shared 2 MB chunks (a bump pointer; a chunk is unmapped when
//   its last allocation is freed), so hundreds of small scale/bias arrays share a few pages
//   instead of each holding a 2 MB page of its own.
// Pages are committed on first touch, as before (a large KV cache costs nothing until used),
// now in 2 MB steps where the kernel grants huge pages. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <vector>

namespace tokenmill::cpu {

class HostMemory {
 public:
  static constexpr size_t kHugePage = size_t{2} << 20;
  static constexpr size_t kLargeBytes = size_t{1} << 20;

  HostMemory() = default;
  ~HostMemory();
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;

  // 64-byte aligned, at least `bytes` (>= 1) long; nullptr when the system is out of memory.
  void* alloc(size_t bytes);
  // p from alloc() of this object, or nullptr.
  void free(void* p);

 private:
  struct Chunk {
    size_t used = 0;   // bytes handed out from the start
    int64_t live = 0;  // allocations not yet freed
  };
  // A 2 MB-aligned, huge-page-advised anonymous mapping of `bytes` (a multiple of kHugePage).
  static void* map_aligned(size_t bytes);

  std::mutex mu_;
  std::map<uintptr_t, size_t> large_;  // base -> mapped bytes
  std::map<uintptr_t, Chunk> chunks_;  // chunk base -> state
  uintptr_t current_ = 0;              // the chunk small allocations come from (0: none)
};

// A std::allocator for vectors of scratch that kernels read with full-vector loads: 64-byte
// (cache-line) aligned. With malloc's 16-byte alignment every AVX-512 load of the prepared x
// straddles two lines; on the 2-core VM that alone made a decode step's GEMVs 50% slower
// whenever the heap happened to place the buffer off a line boundary.
template <class T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}  // NOLINT: allocator rebinding
  T* allocate(size_t n) {
    const size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, bytes == 0 ? 64 : bytes);
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  bool operator==(const CacheLineAllocator&) const { return true; }
  bool operator!=(const CacheLineAllocator&) const { return false; }
};
template <class T>
using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

}  // namespace tokenmill::cpu
