// Seeded random inputs for tests (std::mt19937: the same values on every machine and backend).
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace tokenmill::test {

struct Rng {
  std::mt19937 gen;
  explicit Rng(uint32_t seed) : gen(seed) {}
  float normal(float sd = 1.0f) { return std::normal_distribution<float>(0.0f, sd)(gen); }
  float uniform(float a, float b) { return std::uniform_real_distribution<float>(a, b)(gen); }
  int integer(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); }
  std::vector<float> normals(size_t n, float sd = 1.0f) {
    std::vector<float> v(n);
    for (auto& x : v) x = normal(sd);
    return v;
  }
};

}  // namespace tokenmill::test
