// Synthetic checkpoints: real-layout Qwen3.5 model directories (config.json + safetensors, HF
// layout) filled with seeded random weights, in bf16 or MLX affine. Used by the invariant tests
// and by `tokenmill bench` on machines without a real checkpoint. The values are random, so
// they exercise every op at real shapes but say nothing about quality.
#pragma once

#include <cstdint>
#include <string>

#include "io/checkpoint.h"

namespace tokenmill {

struct SyntheticSpec {
  bool moe = false;
  int64_t vocab = 512, hidden = 64, intermediate = 128;
  int layers = 4;
  int full_attention_interval = 4;  // layer i is full attention iff (i+1) % interval == 0
  int heads = 4, kv_heads = 2, head_dim = 32;
  double partial_rotary_factor = 0.25;
  int k_heads = 2, v_heads = 4, k_dim = 32, v_dim = 32, conv_kernel = 4;
  int experts = 8, experts_per_tok = 2;
  int64_t moe_intermediate = 64, shared_intermediate = 64;
  bool tied = false;
  int mtp_layers = 0;
  int bits = 0, group = 64;  // bits > 0: MLX affine for every linear layer and the embedding
  int64_t max_position = 65536;
  uint64_t seed = 1;
  float init_scale = 0.0f;  // weight std; 0 = 1/sqrt(fan_in)
};

// Writes config.json and model.safetensors into `dir` (created if missing). MLX-quantized specs
// use the MLX name layout (language_model.model.*) and its norm convention (1+w).
void write_synthetic_checkpoint(const std::string& dir, const SyntheticSpec& spec);

// Writes the model synthetic_checkpoint_in_memory describes (the values --dummy-weights
// generates, bit for bit) as config.json and model.safetensors in `dir`: a checkpoint of real
// size on disk, to measure loading as from a downloaded model. The linear weights are generated
// as the file is written (64 MB at a time), so its size is bounded by the disk, not by memory.
void write_random_checkpoint(const std::string& dir, const SyntheticSpec& spec);

// A model of the spec without files: linear weights (the bulk) have no host data and are filled
// with seeded random values in backend memory when the model binds them (device-side generation, so
// a 27B-shaped model is ready in seconds). Load it with Model::from_checkpoint.
Checkpoint synthetic_checkpoint_in_memory(const SyntheticSpec& spec, const std::string& label);

// Bytes of weights a synthetic checkpoint of this spec holds (for progress and planning).
int64_t synthetic_weight_bytes(const SyntheticSpec& spec);

}  // namespace tokenmill
