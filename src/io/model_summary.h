// What a checkpoint holds and what serving it costs: parameter counts, bytes by weight format,
// cache memory per token and per sequence. Used by `tokenmill inspect` and the benchmarks.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/model_config.h"

namespace tokenmill {

// The layer kinds as letters (L = linear attention / GDN, F = full attention), folded into
// "<shortest period> x <count>": "LLLF x 8"; a sequence that does not repeat is "<all> x 1".
std::string layer_pattern(const ModelConfig& c);

// Bytes of F32 KV cache one token takes over all full-attention layers of the main model:
// full_layers * 2 (k and v) * kv_heads * head_dim * 4.
int64_t kv_bytes_per_token(const ModelConfig& c);
// The same for the MTP module's own attention layers (mtp_num_hidden_layers of them).
int64_t mtp_kv_bytes_per_token(const ModelConfig& c);
// Bytes of F32 recurrent state one sequence holds over all GDN layers:
// linear_layers * ((K-1) * conv_channels + Hv * Dk * Dv) * 4.
int64_t gdn_state_bytes_per_sequence(const ModelConfig& c);

// "1.50 GiB", "12.0 MiB", "512 B".
std::string format_bytes(int64_t bytes);

struct FormatBytes {
  std::string format;  // "bf16", "f32", "affine q4 g64", ...
  int64_t bytes = 0;
  int64_t tensors = 0;  // tensors stored in this format (a quantized module's three count as one)
};

struct ModelSummary {
  std::string dir, model_type, layout;
  bool is_moe = false, norms_stored_plus_one = false;
  int64_t hidden_size = 0, vocab_size = 0;
  int num_layers = 0, full_layers = 0, linear_layers = 0;
  std::string layer_pattern;
  int64_t params = 0;      // text model, quantized weights counted by logical elements
  int64_t mtp_params = 0;  // the MTP module, likewise
  std::vector<FormatBytes> bytes_by_format;  // text model + MTP, largest first
  QuantParams quant;                         // config default (bits 0 = none)
  size_t quant_overrides = 0;
  int64_t quantized_modules = 0;  // modules stored as weight + scales + biases
  size_t mtp_tensors = 0, vision_tensors = 0;
  bool has_tokenizer = false, has_chat_template = false;
  int64_t weight_bytes = 0, mtp_weight_bytes = 0;
  int64_t kv_bytes_per_token = 0, mtp_kv_bytes_per_token = 0;
  int64_t gdn_state_bytes_per_sequence = 0;
  int64_t context = 0;
  int64_t cache_bytes_per_sequence = 0;  // kv_bytes_per_token * context + GDN state (no MTP)
};

ModelSummary summarize(const Checkpoint& ck, int64_t context);
nlohmann::ordered_json summary_to_json(const ModelSummary& s);
// Multi-line human-readable report (ends with a newline).
std::string summary_to_text(const ModelSummary& s);

}  // namespace tokenmill
