// CpuBackend: construction, host memory, scratch buffers, and the factory.
#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "backend/cpu/cpu_linear.h"
#include "backend/cpu/cpu_memory.h"
#include "backend/cpu/cpu_simd.h"
#include "util/error.h"

namespace tokenmill {

std::unique_ptr<Backend> make_cpu_backend(ThreadPool& pool) {
  return std::make_unique<CpuBackend>(pool);
}

CpuBackend::CpuBackend(ThreadPool& pool, CpuBackendOptions options)
    : pool_(pool),
      options_(options),
      memory_(std::make_unique<cpu::HostMemory>()),
      thread_scratch_(static_cast<size_t>(pool.size())) {}

CpuBackend::~CpuBackend() {
  for (void* p : weights_) free(p);
}

std::string CpuBackend::name() const {
  return std::string("cpu (") + isa() + ")";
}

const char* CpuBackend::isa() const {
  return options_.scalar_kernels ? cpu::ScalarIsa::kName : cpu::BestIsa::kName;
}

// 64-byte aligned (a cache line, and a full AVX-512 vector), in huge pages where the system
// grants them (cpu_memory.h).
void* CpuBackend::alloc(size_t bytes) {
  void* p = memory_->alloc(bytes);
  if (p == nullptr) {
    fail(
        "cpu backend: could not allocate {} bytes of host memory; reduce the cache size or "
        "the batch limits",
        bytes);
  }
  alloc_stats_.added(p, bytes);
  return p;
}

void CpuBackend::free(void* p) {
  alloc_stats_.removed(p);
  memory_->free(p);
}

void CpuBackend::upload(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

void CpuBackend::download(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

void CpuBackend::fill_zero(void* dst, size_t bytes) {
  if (bytes) std::memset(dst, 0, bytes);
}

void CpuBackend::copy(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memmove(dst, src, bytes);
}

// Weights are copied out of the loader's mapping into backend memory, in 2 MB pages where the
// system grants them (cpu_memory.h). Streamed from a file mapping's 4 KB pages, a decode step
// takes a TLB miss and a restarted prefetch stream every 4 KB: the 27B 4-bit decode ran at 1.05
// tok/s from the mapping against 1.69-1.81 from huge pages (the same weights, the 2-core VM).
// The copies live as long as the backend.
Weight CpuBackend::upload_weight(const Weight& host) {
  Weight w = host;
  const auto put = [&](const void* src, size_t bytes) -> const void* {
    if (src == nullptr || bytes == 0) return src;
    auto* dst = static_cast<uint8_t*>(alloc(bytes));
    weights_.push_back(dst);
    const auto* from = static_cast<const uint8_t*>(src);
    constexpr size_t kPiece = size_t{4} << 20;  // the pool's threads copy (and fault) in parallel
    pool_.run(static_cast<int64_t>((bytes + kPiece - 1) / kPiece), [&](int64_t b, int64_t e, int) {
      const size_t lo = static_cast<size_t>(b) * kPiece;
      const size_t hi = std::min(bytes, static_cast<size_t>(e) * kPiece);
      std::memcpy(dst + lo, from + lo, hi - lo);
    });
    return dst;
  };
  w.data = put(host.data, host.data_bytes());
  if (host.quantized()) {
    w.scales = put(host.scales, host.scale_bytes());
    w.biases = put(host.biases, host.scale_bytes());
  }
  return w;
}

void CpuBackend::reserve_thread_scratch(size_t floats) {
  for (auto& s : thread_scratch_) {
    if (s.size() < floats) s.resize(floats);
  }
}

float* CpuBackend::shared_scratch(size_t floats) {
  if (shared_.size() < floats) shared_.resize(floats);
  return shared_.data();
}

}  // namespace tokenmill
