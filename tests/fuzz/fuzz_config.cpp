// libFuzzer target: config.json parsing (JSON text -> ModelConfig). Only tokenmill::Error may
// escape; an accepted config must satisfy the invariants the model code relies on.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "io/model_config.h"
#include "util/error.h"

namespace {

bool valid_quant(const tokenmill::QuantParams& q) {
  if (q.bits == 0) return true;
  bool bits =
      q.bits == 2 || q.bits == 3 || q.bits == 4 || q.bits == 5 || q.bits == 6 || q.bits == 8;
  return bits && (q.group == 32 || q.group == 64 || q.group == 128);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::optional<tokenmill::ModelConfig> c;
  try {
    c = tokenmill::parse_model_config_text(
        std::string_view(reinterpret_cast<const char*>(data), size), "fuzz/config.json");
  } catch (const tokenmill::Error&) {
    return 0;  // rejected with a message
  }
  bool ok = c->num_layers > 0 && c->layer_types.size() == static_cast<size_t>(c->num_layers) &&
            c->hidden_size > 0 && c->vocab_size > 0 && c->num_heads > 0 && c->num_kv_heads > 0 &&
            c->num_heads % c->num_kv_heads == 0 && c->head_dim > 0 && c->rotary_dim >= 2 &&
            c->rotary_dim % 2 == 0 && c->rotary_dim <= c->head_dim && valid_quant(c->quant);
  if (c->num_linear_attention_layers() > 0) {
    ok = ok && c->linear_num_key_heads > 0 && c->linear_key_head_dim > 0 &&
         c->linear_value_head_dim > 0 && c->linear_conv_kernel_dim > 0 &&
         c->linear_num_value_heads % c->linear_num_key_heads == 0;
  }
  if (c->is_moe) {
    ok = ok && c->num_experts_per_tok > 0 && c->num_experts_per_tok <= c->num_experts &&
         c->moe_intermediate_size > 0;
  } else {
    ok = ok && c->intermediate_size > 0;
  }
  for (const auto& [k, q] : c->quant_overrides) ok = ok && valid_quant(q);
  if (!ok) __builtin_trap();
  return 0;
}
