#include "io/model_config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "tiny_checkpoint.h"

namespace tokenmill {
namespace {

using json = nlohmann::json;
using testing::expect_error;

// The text fields of a Qwen3.5-27B-like config (sizes from MODEL-SPEC.md section B).
json text_fields() {
  return json::parse(R"({
    "vocab_size": 248320, "hidden_size": 5120, "intermediate_size": 17408,
    "num_hidden_layers": 8, "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256,
    "rms_norm_eps": 1e-6, "max_position_embeddings": 262144, "full_attention_interval": 4,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                        "mrope_section": [11, 11, 10], "mrope_interleaved": true},
    "attn_output_gate": true, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
    "mtp_num_hidden_layers": 1, "eos_token_id": 248044, "bos_token_id": null
  })");
}

json moe_fields() {
  json t = text_fields();
  t.erase("intermediate_size");
  t["num_experts"] = 256;
  t["num_experts_per_tok"] = 8;
  t["moe_intermediate_size"] = 512;
  t["shared_expert_intermediate_size"] = 512;
  return t;
}

void check_dense_27b(const ModelConfig& c) {
  EXPECT_FALSE(c.is_moe);
  EXPECT_EQ(c.vocab_size, 248320);
  EXPECT_EQ(c.hidden_size, 5120);
  EXPECT_EQ(c.intermediate_size, 17408);
  EXPECT_EQ(c.num_layers, 8);
  EXPECT_EQ(c.num_heads, 24);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e7);
  EXPECT_DOUBLE_EQ(c.partial_rotary_factor, 0.25);
  EXPECT_EQ(c.rotary_dim, 64);
  EXPECT_EQ(c.linear_num_key_heads, 16);
  EXPECT_EQ(c.linear_num_value_heads, 48);
  EXPECT_EQ(c.linear_key_head_dim, 128);
  EXPECT_EQ(c.linear_value_head_dim, 128);
  EXPECT_EQ(c.linear_conv_kernel_dim, 4);
  EXPECT_EQ(c.linear_conv_channels(), 2 * 16 * 128 + 48 * 128);
  EXPECT_EQ(c.mtp_num_hidden_layers, 1);
  EXPECT_EQ(c.max_position_embeddings, 262144);
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{248044});
  EXPECT_FALSE(c.bos_token_id.has_value());
  ASSERT_EQ(c.layer_types.size(), 8u);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(c.layer_types[i],
              i % 4 == 3 ? LayerKind::kFullAttention : LayerKind::kLinearAttention);
  }
  EXPECT_EQ(c.num_full_attention_layers(), 2);
  EXPECT_EQ(c.quant.bits, 0);
}

TEST(ModelConfig, Qwen35NestedTextConfig) {
  json j = {
      {"model_type", "qwen3_5"}, {"tie_word_embeddings", true}, {"text_config", text_fields()}};
  j["text_config"]["model_type"] = "qwen3_5_text";
  j["text_config"].erase("eos_token_id");
  j["eos_token_id"] = 248044;  // outer fallback
  ModelConfig c = parse_model_config(j, "cfg.json");
  EXPECT_EQ(c.model_type, "qwen3_5");
  check_dense_27b(c);
  EXPECT_TRUE(c.tie_word_embeddings);
}

TEST(ModelConfig, Qwen35FlatWrapperAndTextTypes) {
  for (const char* type : {"qwen3_5", "qwen3_5_text"}) {
    json j = text_fields();
    j["model_type"] = type;
    ModelConfig c = parse_model_config(j, "cfg.json");
    EXPECT_EQ(c.model_type, type);
    check_dense_27b(c);
    EXPECT_FALSE(c.tie_word_embeddings);
  }
}

TEST(ModelConfig, Qwen35MoeNestedAndFlat) {
  json nested = {{"model_type", "qwen3_5_moe"}, {"text_config", moe_fields()}};
  json flat = moe_fields();
  flat["model_type"] = "qwen3_5_moe_text";
  for (const json& j : {nested, flat}) {
    ModelConfig c = parse_model_config(j, "cfg.json");
    EXPECT_TRUE(c.is_moe);
    EXPECT_EQ(c.num_experts, 256);
    EXPECT_EQ(c.num_experts_per_tok, 8);
    EXPECT_EQ(c.moe_intermediate_size, 512);
    EXPECT_EQ(c.shared_expert_intermediate_size, 512);
    EXPECT_TRUE(c.norm_topk_prob);
    EXPECT_EQ(c.intermediate_size, 0);
  }
}

TEST(ModelConfig, Qwen3NextFlatWithTopLevelRope) {
  json j = moe_fields();
  j.erase("rope_parameters");
  j.erase("mtp_num_hidden_layers");
  j["model_type"] = "qwen3_next";
  j["rope_theta"] = 5000000;
  j["partial_rotary_factor"] = 0.5;
  j["norm_topk_prob"] = false;
  j["num_nextn_predict_layers"] = 1;
  j["decoder_sparse_step"] = 1;
  j["mlp_only_layers"] = json::array();
  j["eos_token_id"] = {151643, 151645};
  j["layer_types"] = {"linear_attention", "full_attention",   "linear_attention", "full_attention",
                      "linear_attention", "linear_attention", "linear_attention", "full_attention"};
  ModelConfig c = parse_model_config(j, "cfg.json");
  EXPECT_TRUE(c.is_moe);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.rope_theta, 5e6);
  EXPECT_EQ(c.rotary_dim, 128);
  EXPECT_EQ(c.mtp_num_hidden_layers, 1);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{151643, 151645}));
  EXPECT_EQ(c.num_full_attention_layers(), 3);
  EXPECT_EQ(c.layer_types[1], LayerKind::kFullAttention);
  EXPECT_EQ(c.layer_types[2], LayerKind::kLinearAttention);
}

TEST(ModelConfig, MlxQuantizationWithOverrides) {
  json j = {{"model_type", "qwen3_5_moe"}, {"text_config", moe_fields()}};
  j["quantization"] = json::parse(R"({
    "group_size": 64, "bits": 4, "mode": "affine",
    "language_model.model.layers.0.mlp.gate": {"group_size": 64, "bits": 8},
    "language_model.model.layers.0.mlp.shared_expert_gate": {"bits": 8},
    "language_model.model.layers.1.self_attn.q_proj": {"group_size": 32, "bits": 6, "mode": "affine"},
    "language_model.model.layers.2.linear_attn.in_proj_b": false
  })");
  ModelConfig c = parse_model_config(j, "cfg.json");
  EXPECT_EQ(c.quant, (QuantParams{4, 64}));
  EXPECT_EQ(c.quant_overrides.size(), 4u);
  EXPECT_EQ(c.quant_for("language_model.model.layers.0.mlp.gate"), (QuantParams{8, 64}));
  EXPECT_EQ(c.quant_for("language_model.model.layers.0.mlp.shared_expert_gate"),
            (QuantParams{8, 64}));
  EXPECT_EQ(c.quant_for("language_model.model.layers.1.self_attn.q_proj"), (QuantParams{6, 32}));
  EXPECT_EQ(c.quant_for("language_model.model.layers.2.linear_attn.in_proj_b"), QuantParams{});
  EXPECT_EQ(c.quant_for("language_model.model.layers.5.mlp.switch_mlp.up_proj"),
            (QuantParams{4, 64}));
}

TEST(ModelConfig, QuantizationConfigCopyIsRead) {
  json j = text_fields();
  j["model_type"] = "qwen3_5_text";
  j["quantization_config"] = {{"group_size", 128}, {"bits", 3}};
  EXPECT_EQ(parse_model_config(j, "cfg.json").quant, (QuantParams{3, 128}));
}

TEST(ModelConfig, LoadFromFileAndSyntaxErrors) {
  testing::TempDir tmp;
  json j = text_fields();
  j["model_type"] = "qwen3_5_text";
  std::ofstream(tmp.file("config.json")) << j.dump();
  check_dense_27b(load_model_config(tmp.file("config.json")));
  std::ofstream(tmp.file("bad.json")) << "{\"model_type\": ";
  expect_error([&] { load_model_config(tmp.file("bad.json")); }, {"bad.json", "not valid JSON"});
  expect_error([&] { load_model_config(tmp.file("none.json")); }, {"none.json", "cannot open"});
}

// Each error names the file and the key, the value found and what is supported.
void expect_config_error(const json& j, const std::vector<std::string>& parts) {
  std::vector<std::string> all = parts;
  all.push_back("my/config.json");
  expect_error([&] { parse_model_config(j, "my/config.json"); }, all);
}

json dense(const std::string& type = "qwen3_5_text") {
  json j = text_fields();
  j["model_type"] = type;
  return j;
}

TEST(ModelConfigErrors, UnsupportedModelType) {
  expect_config_error(dense("llama"), {"model_type 'llama' is not supported", "qwen3_5_moe"});
  json j = dense();
  j.erase("model_type");
  expect_config_error(j, {"'model_type' is missing"});
  expect_config_error(json::array(), {"expected a JSON object"});
  json mismatch = {{"model_type", "qwen3_5"}, {"text_config", moe_fields()}};
  mismatch["text_config"]["model_type"] = "qwen3_5_moe_text";
  expect_config_error(mismatch, {"text_config.model_type", "qwen3_5_text"});
}

TEST(ModelConfigErrors, MissingRequiredKeys) {
  for (const char* key : {"hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads",
                          "intermediate_size", "linear_num_value_heads"}) {
    json j = {{"model_type", "qwen3_5"}, {"text_config", text_fields()}};
    j["text_config"].erase(key);
    expect_config_error(j, {std::string("'text_config.") + key + "' is missing", "qwen3_5"});
  }
  json m = moe_fields();
  m["model_type"] = "qwen3_5_moe_text";
  m.erase("num_experts");
  expect_config_error(m, {"'num_experts' is missing"});
}

TEST(ModelConfigErrors, WrongTypesAndRanges) {
  json j = dense();
  j["hidden_size"] = "5120";
  expect_config_error(j, {"'hidden_size' is \"5120\"", "expected an integer"});
  j = dense();
  j["num_key_value_heads"] = 5;
  expect_config_error(j, {"'num_attention_heads' = 24 is not a multiple of"});
  j = dense();
  j["layer_types"] = {"linear_attention"};
  expect_config_error(j, {"'layer_types' must be a list of 8 entries"});
  j = dense();
  j["layer_types"] = {"linear_attention", "linear_attention", "linear_attention", "sliding",
                      "linear_attention", "linear_attention", "linear_attention", "full_attention"};
  expect_config_error(j, {"'layer_types[3]' is \"sliding\"", "full_attention"});
  j = dense();
  j["rope_parameters"]["partial_rotary_factor"] = 2.0;
  expect_config_error(j, {"'rope_parameters.partial_rotary_factor' is 2.0"});
  j = dense();
  j["tie_word_embeddings"] = 1;
  expect_config_error(j, {"'tie_word_embeddings' is 1", "true or false"});
}

TEST(ModelConfigErrors, UnsupportedQuantization) {
  auto with_quant = [](const json& q) {
    json j = {{"model_type", "qwen3_5"}, {"text_config", text_fields()}, {"quantization", q}};
    return j;
  };
  expect_config_error(with_quant({{"group_size", 64}, {"bits", 7}}),
                      {"'quantization.bits' is 7", "supported bits: 2, 3, 4, 5, 6, 8"});
  expect_config_error(with_quant({{"group_size", 16}, {"bits", 4}}),
                      {"'quantization.group_size' is 16", "32, 64, 128"});
  expect_config_error(with_quant({{"group_size", 32}, {"bits", 4}, {"mode", "mxfp4"}}),
                      {"'quantization.mode' is \"mxfp4\"", "not supported yet", "affine"});
  expect_config_error(with_quant({{"group_size", 32}, {"bits", 4}, {"mode", "weird"}}),
                      {"'quantization.mode' is \"weird\"", "unknown mode"});
  expect_config_error(with_quant({{"bits", 4}}), {"'quantization.group_size' is missing"});
  json ov = {
      {"group_size", 64}, {"bits", 4}, {"language_model.model.layers.0.mlp.gate", {{"bits", 1}}}};
  expect_config_error(with_quant(ov),
                      {"'quantization.language_model.model.layers.0.mlp.gate.bits' is 1"});
  json fp8 = {
      {"model_type", "qwen3_5"},
      {"text_config", text_fields()},
      {"quantization_config", {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}}}};
  expect_config_error(fp8, {"'quantization_config.quant_method' is \"fp8\"", "not supported yet"});
}

}  // namespace
}  // namespace tokenmill
