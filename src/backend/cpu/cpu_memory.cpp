#include "backend/cpu/cpu_memory.h"

#include <sys/mman.h>

#include <algorithm>

#include "util/error.h"

namespace tokenmill::cpu {

void* HostMemory::map_aligned(size_t bytes) {
  // Over-map by one huge page and trim to a 2 MB-aligned range.
  const size_t span = bytes + kHugePage;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (base + kHugePage - 1) & ~(kHugePage - 1);
  if (aligned > base) munmap(raw, aligned - base);
  const uintptr_t end = base + span, used_end = aligned + bytes;
  if (end > used_end) munmap(reinterpret_cast<void*>(used_end), end - used_end);
  // Advice only: without THP (or with it off) the range stays in ordinary pages.
  madvise(reinterpret_cast<void*>(aligned), bytes, MADV_HUGEPAGE);
  return reinterpret_cast<void*>(aligned);
}

HostMemory::~HostMemory() {
  for (const auto& [base, bytes] : large_) munmap(reinterpret_cast<void*>(base), bytes);
  for (const auto& [base, c] : chunks_) munmap(reinterpret_cast<void*>(base), kHugePage);
}

void* HostMemory::alloc(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  std::lock_guard<std::mutex> lock(mu_);
  if (rounded >= kLargeBytes) {
    const size_t mapped = (rounded + kHugePage - 1) / kHugePage * kHugePage;
    void* p = map_aligned(mapped);
    if (p != nullptr) large_[reinterpret_cast<uintptr_t>(p)] = mapped;
    return p;
  }
  if (current_ == 0 || chunks_[current_].used + rounded > kHugePage) {
    // The old chunk stays mapped until its last allocation is freed.
    if (current_ != 0 && chunks_[current_].live == 0) {
      munmap(reinterpret_cast<void*>(current_), kHugePage);
      chunks_.erase(current_);
    }
    void* c = map_aligned(kHugePage);
    if (c == nullptr) return nullptr;
    current_ = reinterpret_cast<uintptr_t>(c);
    chunks_[current_] = Chunk{};
  }
  Chunk& c = chunks_[current_];
  void* p = reinterpret_cast<void*>(current_ + c.used);
  c.used += rounded;
  c.live++;
  return p;
}

void HostMemory::free(void* p) {
  if (p == nullptr) return;
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = large_.find(a); it != large_.end()) {
    munmap(p, it->second);
    large_.erase(it);
    return;
  }
  const uintptr_t base = a & ~(kHugePage - 1);
  auto it = chunks_.find(base);
  TM_CHECK(it != chunks_.end() && it->second.live > 0, "cpu backend: free of unknown pointer {}",
           p);
  if (--it->second.live > 0) return;
  if (base == current_) {
    it->second.used = 0;  // empty: small allocations start over in it
  } else {
    munmap(reinterpret_cast<void*>(base), kHugePage);
    chunks_.erase(it);
  }
}

}  // namespace tokenmill::cpu
