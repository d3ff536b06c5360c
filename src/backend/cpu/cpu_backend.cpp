// CpuBackend: construction, host memory, scratch buffers, and the factory.
#include "backend/cpu/cpu_backend.h"

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

CpuBackend::~CpuBackend() = default;

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

Weight CpuBackend::upload_weight(const Weight& host) {
  return host;
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
