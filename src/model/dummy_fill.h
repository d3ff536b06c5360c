// The values of dummy weights: which seed and deviation Backend::fill_random gets for each part
// of a linear weight. `--dummy-weights` fills backend memory with them (WeightStore::
// random_weight); write_random_checkpoint (synthetic.h) writes the same values to a file, so a
// model loaded from that file computes exactly what the dummy model computes.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

namespace tokenmill {

struct DummyFill {
  uint64_t seed = 0;
  float stddev = 0.0f;  // of the values (0 for codes: random bits)
};

// A linear weight's parts: MLX affine codes, scales and biases, or float data.
struct DummyLinear {
  DummyFill codes, scales, biases, dense;
};

// FNV-1a of the module's canonical name: stable across runs and platforms.
inline uint64_t dummy_seed(const std::string& module) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : module) h = (h ^ c) * 1099511628211ull;
  return h;
}

// `module` canonical without ".weight" (e.g. "layers.3.mlp.gate_proj"), `cols` its input width,
// `bits` 0 for float data. The embedding gets unit deviation (its rows are the residual stream's
// start), every other matrix 1/sqrt(cols), as a freshly initialised model. Affine codes are
// uniform on [0, 2^bits - 1]; scale and bias deviations are chosen so s*q + b has a deviation near
// the matrix's (about 0.9x).
inline DummyLinear dummy_linear(const std::string& module, int64_t cols, int bits) {
  const float sd = module == "embed_tokens" ? 1.0f : 1.0f / std::sqrt(static_cast<float>(cols));
  const uint64_t seed = dummy_seed(module);
  const float levels = bits > 0 ? static_cast<float>((1 << bits) - 1) : 1.0f;
  DummyLinear d;
  d.codes = {seed * 4 + 0, 0.0f};
  d.scales = {seed * 4 + 1, sd / levels * 1.5f};
  d.biases = {seed * 4 + 2, sd * 0.5f};
  d.dense = {seed * 4 + 3, sd};
  return d;
}

}  // namespace tokenmill
