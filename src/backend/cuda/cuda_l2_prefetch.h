// Internal to backend/cuda: the next decode GEMV's weights pulled into L2 by the one before it
// (bf16 and 8-bit matrices; the 4-bit GEMV lost more to the entry's load than it gained).
//
// Why: a decode step is a chain of GEMVs, each reading its matrix once. Each launch ends with a
// tail in which fewer and fewer warps are still loading (its last warps, the stream-K fixups) and
// the next one starts with its first loads in flight only; in both the device's DRAM is far
// from busy. The weights of the next GEMV do not depend on anything computed, so the warps of
// a GEMV, once their own loads are done, ask L2 for the start of each part of the next
// matrix (cp.async.bulk.prefetch.L2): those bytes then come from L2 when the next launch reads
// them, and the DRAM works through the tail.
//
// Which GEMV comes next is learned, not declared: the backend sees its decode GEMV launches in
// order (keyed by their first matrix) and records each launch's successor in a device table the
// kernels read (a recorded step keeps a pointer to its entry, so entries learned after a
// recording still reach its replays). A wrong or missing entry costs bandwidth, never results.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

struct CUstream_st;

namespace tokenmill::cuda {

constexpr int kL2PrefetchRegions = 8;  // a launch's matrices (up to 4) and their scales

// One entry of the device table: the regions of the launch that follows, and the share of each
// part to prefetch (parts: the reading launch's warps, each taking one).
// (16-byte aligned, a whole number of 16-byte chunks: kernels copy it with cp.async.)
struct alignas(16) L2Prefetch {
  const void* ptr[kL2PrefetchRegions];  // 16-byte aligned
  uint64_t bytes[kL2PrefetchRegions];
  float share;  // 0..1 (no initializers: kernels hold it in shared memory; L2Prefetch{} zeroes)
  int count;
};
static_assert(sizeof(L2Prefetch) % 16 == 0);

// A matrix a later launch reads (data, scales, biases), started towards L2 by a latency-bound
// kernel before it, whose DRAM would otherwise sit idle (the attention's split pass before its
// output projection): each block of the issuing launch takes its share of every span
// (l2_prefetch_spans, cuda_common.cuh).
struct L2Spans {
  const void* ptr[3] = {nullptr, nullptr, nullptr};  // 16-byte aligned
  uint64_t bytes[3] = {0, 0, 0};
  int count = 0;
};

struct L2Region {
  const void* ptr = nullptr;
  uint64_t bytes = 0;
};

class L2PrefetchChain {
 public:
  // budget_bytes: the most bytes of the next launch a launch prefetches (0: off); launches that
  // read fewer than min_source_bytes prefetch nothing (their tail is short, and the entry's
  // read at the end of every warp's range costs more than it brings).
  void init(L2Prefetch* device_table, int capacity, uint64_t budget_bytes,
            uint64_t min_source_bytes);
  // Before a decode GEMV launch that reads `regions` (keyed by the first): records it as the
  // successor of the launch before it and returns the device entry this launch prefetches from
  // (nullptr when off, the launch is small or the table is full). Uploads what changed unless
  // `recording`.
  const L2Prefetch* attach(const L2Region* regions, int count, CUstream_st* st, bool recording);
  // Uploads entries learned while a step was recorded (before a replay reads them).
  void sync(CUstream_st* st);
  // Forgets every entry (device memory was freed: an entry may point at it).
  void reset(CUstream_st* st);
  uint64_t budget() const { return budget_; }

 private:
  L2Prefetch* device_ = nullptr;
  int capacity_ = 0;
  uint64_t budget_ = 0;
  uint64_t min_source_ = 0;
  std::vector<L2Prefetch> host_;
  std::unordered_map<const void*, int> index_;
  int last_ = -1;
  bool dirty_ = false;
};

}  // namespace tokenmill::cuda
