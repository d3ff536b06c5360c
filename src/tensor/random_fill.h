// The pseudo-random values Backend::fill_random writes, as pure functions of (seed, index) so
// every backend fills a buffer with the same values in any order or thread split.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TM_HOST_DEVICE __host__ __device__
#else
#define TM_HOST_DEVICE
#endif

namespace tokenmill::random_fill {

// SplitMix64 of seed and index: 64 well-mixed bits.
TM_HOST_DEVICE inline uint64_t bits(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform on [-sqrt(3), sqrt(3)) * stddev: mean 0, standard deviation `stddev`.
TM_HOST_DEVICE inline float uniform(uint64_t seed, uint64_t i, float stddev) {
  const float u = static_cast<float>(bits(seed, i) >> 40) * (1.0f / 16777216.0f);  // [0, 1)
  return (2.0f * u - 1.0f) * 1.7320508f * stddev;
}

}  // namespace tokenmill::random_fill
