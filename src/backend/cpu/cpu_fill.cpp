// CpuBackend::fill_random and read_probe: dummy weights at real shapes, and the read-bandwidth
// probe the benchmark times.
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "tensor/dtype.h"
#include "tensor/random_fill.h"
#include "util/error.h"

namespace tokenmill {

void CpuBackend::fill_random(void* dst, DType dtype, int64_t n, float stddev, uint64_t seed) {
  if (n <= 0) return;
  TM_CHECK(
      dtype == DType::U32 || dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16,
      "fill_random: unsupported dtype {}", dtype_name(dtype));
  pool_.run(
      n,
      [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) {
          const auto u = static_cast<uint64_t>(i);
          switch (dtype) {
            case DType::U32:
              static_cast<uint32_t*>(dst)[i] = static_cast<uint32_t>(random_fill::bits(seed, u));
              break;
            case DType::F32:
              static_cast<float*>(dst)[i] = random_fill::uniform(seed, u, stddev);
              break;
            case DType::BF16:
              static_cast<uint16_t*>(dst)[i] = f32_to_bf16(random_fill::uniform(seed, u, stddev));
              break;
            default:
              static_cast<uint16_t*>(dst)[i] = f32_to_f16(random_fill::uniform(seed, u, stddev));
              break;
          }
        }
      },
      1 << 16);
}

void CpuBackend::read_probe(const void* src, size_t bytes, void* sink) {
  const size_t words = bytes / sizeof(uint64_t);
  std::vector<uint64_t> partial(static_cast<size_t>(pool_.size()) * 8, 0);
  const auto* p = static_cast<const uint64_t*>(src);
  pool_.run(
      static_cast<int64_t>(words),
      [&](int64_t b, int64_t e, int w) {
        // Four independent accumulators keep several loads in flight.
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        int64_t i = b;
        for (; i + 4 <= e; i += 4) {
          s0 += p[i];
          s1 += p[i + 1];
          s2 += p[i + 2];
          s3 += p[i + 3];
        }
        for (; i < e; ++i) s0 += p[i];
        partial[static_cast<size_t>(w) * 8] += s0 + s1 + s2 + s3;
      },
      1 << 16);
  uint64_t total = 0;
  for (uint64_t v : partial) total += v;
  std::memcpy(sink, &total, sizeof(total));
}

}  // namespace tokenmill
