#include "backend/cuda/cuda_l2_prefetch.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"

namespace tokenmill::cuda {

void L2PrefetchChain::init(L2Prefetch* device_table, int capacity, uint64_t budget_bytes,
                           uint64_t min_source_bytes) {
  device_ = device_table;
  capacity_ = capacity;
  budget_ = budget_bytes;
  min_source_ = min_source_bytes;
  host_.assign(static_cast<size_t>(capacity), L2Prefetch{});
}

const L2Prefetch* L2PrefetchChain::attach(const L2Region* regions, int count, CUstream_st* st,
                                          bool recording) {
  if (budget_ == 0 || device_ == nullptr || count <= 0) return nullptr;
  int idx = -1;
  bool seen = false;
  if (auto it = index_.find(regions[0].ptr); it != index_.end()) {
    idx = it->second;
    seen = true;
  } else if (static_cast<int>(index_.size()) < capacity_) {
    idx = static_cast<int>(index_.size());
    index_.emplace(regions[0].ptr, idx);
  }
  // The first successor seen stays: decode steps repeat one order, and an entry that flipped
  // between two orders would upload (and wait for the stream) at every change.
  if (last_ >= 0 && host_[static_cast<size_t>(last_)].count == 0) {
    L2Prefetch& e = host_[static_cast<size_t>(last_)];
    uint64_t total = 0;
    const int n = std::min(count, kL2PrefetchRegions);
    for (int i = 0; i < n; ++i) {
      e.ptr[i] = regions[i].ptr;
      e.bytes[i] = regions[i].bytes;
      total += regions[i].bytes;
    }
    e.count = n;
    e.share = total > 0 ? static_cast<float>(std::min(
                              1.0, static_cast<double>(budget_) / static_cast<double>(total)))
                        : 0.0f;
    dirty_ = true;
  }
  last_ = idx;
  // A launch seen before: the next step has begun, so what the last one learned goes up now
  // (not at every new entry: the first step would wait for the stream at each launch).
  if (seen && !recording) sync(st);
  uint64_t mine = 0;
  for (int i = 0; i < count; ++i) mine += regions[i].bytes;
  return idx >= 0 && mine >= min_source_ ? device_ + idx : nullptr;
}

void L2PrefetchChain::sync(CUstream_st* st) {
  if (!dirty_ || device_ == nullptr) return;
  // Rare (the steps after new launches were learned), so the simple form: the copy is done
  // before host_ can change again.
  TM_CUDA(cudaMemcpyAsync(device_, host_.data(), host_.size() * sizeof(L2Prefetch),
                          cudaMemcpyHostToDevice, st));
  TM_CUDA(cudaStreamSynchronize(st));
  dirty_ = false;
}

void L2PrefetchChain::reset(CUstream_st* st) {
  if (device_ == nullptr || index_.empty()) return;
  std::fill(host_.begin(), host_.end(), L2Prefetch{});
  index_.clear();
  last_ = -1;
  TM_CUDA(cudaMemsetAsync(device_, 0, host_.size() * sizeof(L2Prefetch), st));
  dirty_ = false;
}

}  // namespace tokenmill::cuda
