// Weight binding: every tensor the Qwen3.5 forward reads, found by canonical name in a
// Checkpoint, checked for shape and dtype, and made usable by the backend. A missing or
// mis-shaped tensor is one error line naming the file, tensor, expected and found.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/model_config.h"
#include "model/dummy_fill.h"

namespace tokenmill {

class Checkpoint;

// A small F32 vector in backend memory (norm weights, A_log, dt_bias, conv kernels).
struct Vec {
  float* data = nullptr;
  int64_t size = 0;
};

struct AttentionWeights {
  Weight q_proj, k_proj, v_proj, o_proj;
  Vec q_norm, k_norm;
};

struct GDNWeights {
  Weight in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj;
  Vec conv;  // [channels, kernel]
  Vec a_log, dt_bias, norm;
};

struct FFNWeights {
  // Dense MLP, or the shared expert of an MoE layer.
  Weight gate_proj, up_proj, down_proj;
  // MoE only.
  bool moe = false;
  Weight router;                                  // [experts, hidden]
  Weight experts_gate, experts_up, experts_down;  // stacked over experts
  bool has_shared = false;
  Weight shared_gate;  // [1, hidden]
};

struct LayerWeights {
  LayerKind kind = LayerKind::kLinearAttention;
  Vec input_norm, post_norm;
  AttentionWeights attn;  // full-attention layers
  GDNWeights gdn;         // linear-attention layers
  FFNWeights ffn;
};

struct MtpWeights {
  bool present = false;
  Weight fc;  // [hidden, 2*hidden]
  Vec pre_fc_norm_embedding, pre_fc_norm_hidden, norm;
  LayerWeights layer;  // one full-attention decoder layer
};

struct ModelWeights {
  Weight embed;    // [vocab, hidden]
  Weight lm_head;  // [vocab, hidden] (the embedding when tied)
  Vec final_norm;
  std::vector<LayerWeights> layers;
  MtpWeights mtp;
  // Bytes one decoded token reads at batch 1 (without MTP), as stored: one embedding row, and
  // num_experts_per_tok of num_experts expert matrices per MoE layer.
  int64_t weight_bytes = 0;
  int64_t stored_bytes = 0;  // every bound matrix (without MTP), as stored
  // Multiply-adds per token through the layers' matrices (num_experts_per_tok of num_experts
  // routed experts; no embedding and no head, which a prefill runs for its last token only).
  int64_t layer_macs_per_token = 0;
};

// Owns backend memory for converted vectors and for weights the backend copied, plus host
// buffers for experts that had to be stacked.
class WeightStore {
 public:
  explicit WeightStore(Backend& backend) : backend_(backend) {}
  ~WeightStore();
  WeightStore(const WeightStore&) = delete;
  WeightStore& operator=(const WeightStore&) = delete;

  Vec upload_vec(const std::vector<float>& host);
  Weight upload(const Weight& host) { return backend_.upload_weight(host); }
  // A weight of `shape`'s format and sizes (its data pointers ignored) in backend memory, each
  // part filled by Backend::fill_random as `fills` says (dummy_fill.h).
  Weight random_weight(const Weight& shape, const DummyLinear& fills);
  // Host memory that lives as long as the store (for stacked per-expert weights).
  uint8_t* host_buffer(size_t bytes);

 private:
  Backend& backend_;
  std::vector<void*> owned_;
  std::vector<std::unique_ptr<uint8_t[]>> host_;
};

// Binds all weights. `with_mtp`: also bind mtp.* (when present in the checkpoint).
ModelWeights bind_weights(Checkpoint& ckpt, const ModelConfig& cfg, WeightStore& store,
                          bool with_mtp);

}  // namespace tokenmill
