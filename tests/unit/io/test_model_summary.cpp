#include "io/model_summary.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "tiny_checkpoint.h"

namespace tokenmill {
namespace {

using testing::TempDir;
using testing::TinySpec;

ModelConfig config_with(std::vector<LayerKind> kinds) {
  ModelConfig c;
  c.layer_types = std::move(kinds);
  c.num_layers = static_cast<int>(c.layer_types.size());
  return c;
}

TEST(ModelSummary, LayerPattern) {
  const auto L = LayerKind::kLinearAttention, F = LayerKind::kFullAttention;
  std::vector<LayerKind> k32;
  for (int i = 0; i < 32; ++i) k32.push_back((i + 1) % 4 == 0 ? F : L);
  EXPECT_EQ(layer_pattern(config_with(k32)), "LLLF x 8");
  EXPECT_EQ(layer_pattern(config_with({L, L, L, F})), "LLLF x 1");
  EXPECT_EQ(layer_pattern(config_with({F, F})), "F x 2");
  EXPECT_EQ(layer_pattern(config_with({L, F, L, L, F})), "LFLLF x 1");
}

TEST(ModelSummary, CacheBytesFollowTheFormulas) {
  // Qwen3.5-27B-like sizes (MODEL-SPEC.md B): 64 layers, every 4th full attention.
  ModelConfig c;
  for (int i = 0; i < 64; ++i) {
    c.layer_types.push_back((i + 1) % 4 == 0 ? LayerKind::kFullAttention
                                             : LayerKind::kLinearAttention);
  }
  c.num_kv_heads = 4;
  c.head_dim = 256;
  c.linear_num_key_heads = 16;
  c.linear_num_value_heads = 48;
  c.linear_key_head_dim = 128;
  c.linear_value_head_dim = 128;
  c.linear_conv_kernel_dim = 4;
  c.mtp_num_hidden_layers = 1;
  EXPECT_EQ(kv_bytes_per_token(c), 16LL * 2 * 4 * 256 * 4);
  EXPECT_EQ(mtp_kv_bytes_per_token(c), 1LL * 2 * 4 * 256 * 4);
  EXPECT_EQ(gdn_state_bytes_per_sequence(c),
            48LL * (3 * (2 * 16 * 128 + 48 * 128) + 48 * 128 * 128) * 4);
}

TEST(ModelSummary, FormatBytes) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(3 << 20), "3.0 MiB");
  EXPECT_EQ(format_bytes(int64_t{3} << 29), "1.50 GiB");
}

// Parameter counts of a quantized checkpoint equal those of the same model in bf16: packed
// words count as 32/bits logical elements, scales and biases do not count.
TEST(ModelSummary, QuantizedParamsCountLogicalElements) {
  TinySpec spec;
  spec.layout = Checkpoint::Layout::kMlx;
  spec.moe = true;
  spec.experts = testing::Experts::kSwitchMlp;
  TempDir a, b;
  testing::write_tiny_checkpoint(a.path(), spec);
  spec.quantized = true;
  testing::write_tiny_checkpoint(b.path(), spec);
  ModelSummary fs = summarize(Checkpoint::open(a.path()), 100);
  ModelSummary qs = summarize(Checkpoint::open(b.path()), 100);
  int64_t expected = 0, expected_mtp = 0;
  spec.quantized = false;
  for (const auto& t : testing::tiny_tensors(spec)) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    (t.canonical.rfind("mtp.", 0) == 0 ? expected_mtp : expected) += n;
  }
  EXPECT_EQ(fs.params, expected);
  EXPECT_EQ(fs.mtp_params, expected_mtp);
  EXPECT_EQ(qs.params, expected);
  EXPECT_EQ(qs.mtp_params, expected_mtp);
  EXPECT_EQ(fs.quant.bits, 0);
  EXPECT_EQ(qs.quant, (QuantParams{4, 32}));
  EXPECT_EQ(qs.quant_overrides, 9u);
  // Formats: bf16 for norms etc., q4 g32 for most modules, q8 g64 for routers and shared gates.
  std::map<std::string, FormatBytes> f;
  int64_t total = 0;
  for (const auto& x : qs.bytes_by_format) {
    f[x.format] = x;
    total += x.bytes;
  }
  ASSERT_EQ(f.count("bf16"), 1u);
  ASSERT_EQ(f.count("affine q4 g32"), 1u);
  ASSERT_EQ(f.count("affine q8 g64"), 1u);
  EXPECT_EQ(f["affine q8 g64"].tensors, 8);  // 4 layers x (router + shared expert gate)
  EXPECT_EQ(total, qs.weight_bytes + qs.mtp_weight_bytes);
  EXPECT_EQ(qs.kv_bytes_per_token, 1 * 2 * 1 * 32 * 4);
  EXPECT_EQ(qs.cache_bytes_per_sequence,
            qs.kv_bytes_per_token * 100 + qs.gdn_state_bytes_per_sequence);
  EXPECT_EQ(qs.layer_pattern, "LLLF x 1");
  EXPECT_TRUE(qs.is_moe);
}

TEST(ModelSummary, TokenizerAndChatTemplateDetection) {
  TempDir tmp;
  TinySpec spec;
  testing::write_tiny_checkpoint(tmp.path(), spec);
  ModelSummary s = summarize(Checkpoint::open(tmp.path()), 4096);
  EXPECT_FALSE(s.has_tokenizer);
  EXPECT_FALSE(s.has_chat_template);
  std::ofstream(tmp.file("tokenizer.json")) << "{}";
  std::ofstream(tmp.file("tokenizer_config.json")) << R"({"chat_template": "{{ x }}"})";
  s = summarize(Checkpoint::open(tmp.path()), 4096);
  EXPECT_TRUE(s.has_tokenizer);
  EXPECT_TRUE(s.has_chat_template);
  auto j = summary_to_json(s);
  EXPECT_EQ(j["chat_template"], true);
  EXPECT_EQ(j["context"], 4096);
  EXPECT_NE(summary_to_text(s).find("layer pattern:        LLLF x 1"), std::string::npos)
      << summary_to_text(s);
}

}  // namespace
}  // namespace tokenmill
