// Bytes a backend holds through its alloc(): now, and the most at once since it was created
// (Backend::peak_allocated_bytes, which `tokenmill bench` reports as peak device memory), and
// how many allocations it made (Backend::allocation_count).
// Allocations are rare (set-up, cache and workspace growth; never inside a step), so a mutex
// and a map per allocation cost nothing that matters.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace tokenmill {

class AllocStats {
 public:
  void added(const void* p, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    sizes_[p] = bytes;
    ++count_;
    current_ += static_cast<int64_t>(bytes);
    if (current_ > peak_) peak_ = current_;
  }
  // A pointer it never saw (or nullptr) changes nothing.
  void removed(const void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = sizes_.find(p);
    if (it == sizes_.end()) return;
    current_ -= static_cast<int64_t>(it->second);
    sizes_.erase(it);
  }
  int64_t current() const {
    std::lock_guard<std::mutex> lock(mu_);
    return current_;
  }
  int64_t peak() const {
    std::lock_guard<std::mutex> lock(mu_);
    return peak_;
  }
  // Allocations recorded by added() (Backend::allocation_count).
  int64_t count() const {
    std::lock_guard<std::mutex> lock(mu_);
    return count_;
  }

 private:
  mutable std::mutex mu_;
  std::unordered_map<const void*, size_t> sizes_;
  int64_t current_ = 0, peak_ = 0, count_ = 0;
};

}  // namespace tokenmill
