// The committed checkpoints written by transformers (tests/fixtures/golden/*, models/demo) and
// their MLX conversions (tools/mlx_quant.py): every one opens, with the layout, counts and
// conventions the generators recorded.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/model_summary.h"

namespace tokenmill {
namespace {

using Layout = Checkpoint::Layout;

std::string golden(const std::string& name) {
  return std::string(TM_SOURCE_DIR) + "/tests/fixtures/golden/" + name;
}

TEST(RealCheckpoints, GoldenLayoutsAndConventions) {
  struct Case {
    const char* dir;
    Layout layout;
    bool moe, plus_one, tied;
    size_t mtp, vision;
  };
  // What tests/fixtures/golden/manifest.json and docs/TESTING.md say each directory is.
  const Case cases[] = {
      {"dense", Layout::kHfVL, false, false, false, 15, 21},
      {"moe", Layout::kHfVL, true, false, false, 0, 21},
      {"causal_tied", Layout::kCausalLM, false, false, true, 0, 0},
      {"dense_mlx_q4g64", Layout::kMlx, false, true, false, 0, 0},
      {"moe_mlx_q4g32", Layout::kMlx, true, true, false, 0, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.dir);
    Checkpoint ck = Checkpoint::open(golden(c.dir));
    EXPECT_EQ(ck.layout(), c.layout);
    EXPECT_EQ(ck.config().is_moe, c.moe);
    EXPECT_EQ(ck.norms_stored_plus_one(), c.plus_one);
    EXPECT_EQ(ck.config().tie_word_embeddings, c.tied);
    EXPECT_EQ(ck.find("lm_head.weight") == nullptr, c.tied);
    EXPECT_EQ(ck.mtp_tensor_count(), c.mtp);
    EXPECT_EQ(ck.vision_tensor_count(), c.vision);
    EXPECT_NE(ck.find("embed_tokens.weight"), nullptr);
    EXPECT_NE(ck.find("norm.weight"), nullptr);
    for (int i = 0; i < ck.config().num_layers; ++i) {
      const std::string p = "layers." + std::to_string(i) + ".";
      const bool full = ck.config().layer_types[i] == LayerKind::kFullAttention;
      EXPECT_NE(ck.find(p + (full ? "self_attn.q_proj.weight" : "linear_attn.in_proj_qkv.weight")),
                nullptr)
          << p;
    }
  }
}

// An MLX copy has the same logical parameters as the model it was converted from.
TEST(RealCheckpoints, QuantizedCopiesCountTheSameParameters) {
  const int64_t dense = summarize(Checkpoint::open(golden("dense")), 1).params;
  for (const char* q : {"dense_mlx_q2g64", "dense_mlx_q3g64", "dense_mlx_q4g32", "dense_mlx_q4g64",
                        "dense_mlx_q8g64"}) {
    EXPECT_EQ(summarize(Checkpoint::open(golden(q)), 1).params, dense) << q;
  }
  EXPECT_EQ(summarize(Checkpoint::open(golden("moe_mlx_q4g32")), 1).params,
            summarize(Checkpoint::open(golden("moe")), 1).params);
  // The MoE copy's router and shared-expert gate are 8-bit overrides, read through the file path.
  Checkpoint ck = Checkpoint::open(golden("moe_mlx_q4g32"));
  EXPECT_EQ(ck.config().quant, (QuantParams{4, 32}));
  EXPECT_EQ(ck.config().quant_for(ck.module_path_in_file("layers.0.mlp.gate")),
            (QuantParams{8, 64}));
  EXPECT_NE(ck.find("layers.0.mlp.switch_mlp.gate_proj.scales"), nullptr);
}

TEST(RealCheckpoints, DemoModelMatchesItsTrainingSummary) {
  const std::string dir = std::string(TM_SOURCE_DIR) + "/models/demo";
  nlohmann::json summary = nlohmann::json::parse(std::ifstream(dir + "/summary.json"));
  Checkpoint ck = Checkpoint::open(dir);
  EXPECT_EQ(ck.shard_paths().size(), 3u);
  EXPECT_EQ(ck.mtp_tensor_count(), summary["mtp_tensors"].get<size_t>());
  EXPECT_EQ(ck.vision_tensor_count(), summary["visual_tensors"].get<size_t>());
  EXPECT_EQ(ck.config().tie_word_embeddings, summary["transformers"]["lm_head_tied"].get<bool>());
  ModelSummary s = summarize(ck, 4096);
  EXPECT_TRUE(s.has_tokenizer);
  EXPECT_TRUE(s.has_chat_template);
}

}  // namespace
}  // namespace tokenmill
