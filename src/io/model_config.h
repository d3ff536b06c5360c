// ModelConfig: the text-model hyperparameters and quantization recipe read from config.json.
//
// Accepted model types: qwen3_5 and qwen3_5_moe (vision-language wrappers: the text fields sit
// under "text_config", or at the top level when a converter flattened them), qwen3_5_text and
// qwen3_5_moe_text (flat), and qwen3_next (flat). MLX quantization comes from the top-level
// "quantization" (or its copy "quantization_config"): {group_size, bits, mode} plus per-module
// overrides keyed by the module path as it appears in the safetensors files.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tokenmill {

enum class LayerKind { kLinearAttention, kFullAttention };

struct QuantParams {
  int bits = 0;   // 0 = not quantized; otherwise 2, 3, 4, 5, 6 or 8 (MLX affine)
  int group = 0;  // 32, 64 or 128 when bits > 0
  bool operator==(const QuantParams&) const = default;
};

struct ModelConfig {
  std::string model_type;  // as in the file (outer)
  bool is_moe = false;
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0;
  int num_layers = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 0;
  // From layer_types, else full iff (i+1) % full_attention_interval == 0 (default 4).
  std::vector<LayerKind> layer_types;
  // Full (gated) attention.
  int num_heads = 0, num_kv_heads = 0, head_dim = 0;
  double rope_theta = 1e7;
  double partial_rotary_factor = 0.25;
  int rotary_dim = 0;  // = head_dim * partial_rotary_factor (even)
  bool attn_output_gate = true;
  // Gated DeltaNet (linear attention).
  int linear_num_key_heads = 0, linear_num_value_heads = 0, linear_key_head_dim = 0,
      linear_value_head_dim = 0, linear_conv_kernel_dim = 4;
  // Mixture of experts (is_moe).
  int num_experts = 0, num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0, shared_expert_intermediate_size = 0;
  bool norm_topk_prob = true;
  int mtp_num_hidden_layers = 0;
  std::vector<int32_t> eos_token_ids;
  std::optional<int32_t> bos_token_id, pad_token_id;
  // MLX quantization: the default for modules that have .scales, and per-module overrides
  // (keys as in the file: module path without ".weight"; bits 0 = explicitly left in float).
  QuantParams quant;
  std::map<std::string, QuantParams> quant_overrides;

  // The override for this module path (as in the file), else the default.
  QuantParams quant_for(const std::string& module_path_as_in_file) const;

  int num_full_attention_layers() const;
  int num_linear_attention_layers() const;
  // Channels of the GDN causal conv: q, k (Hk*Dk each) and v (Hv*Dv).
  int64_t linear_conv_channels() const {
    return 2LL * linear_num_key_heads * linear_key_head_dim +
           static_cast<int64_t>(linear_num_value_heads) * linear_value_head_dim;
  }
};

// Parses a config.json document. `source_name` (normally the path) starts every error message,
// which also names the key, the value found and what is supported. Throws tokenmill::Error only.
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& source_name);
// Parses JSON text, then the config (JSON syntax errors also become tokenmill::Error).
ModelConfig parse_model_config_text(std::string_view text, const std::string& source_name);
ModelConfig load_model_config(const std::string& path);

const char* layer_kind_name(LayerKind k);  // "linear_attention" / "full_attention"

}  // namespace tokenmill
