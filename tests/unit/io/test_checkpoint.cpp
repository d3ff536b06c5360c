#include "io/checkpoint.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tiny_checkpoint.h"

namespace tokenmill {
namespace {

namespace fs = std::filesystem;
using Layout = Checkpoint::Layout;
using testing::expect_error;
using testing::TempDir;
using testing::TinySpec;
using S = testing::TinySizes;

// Every tensor the tiny model has is reachable by canonical name with its dtype and shape, and
// the data points at the right bytes of the right file.
void check_all_tensors(const Checkpoint& ck, const TinySpec& spec) {
  const auto expected = testing::tiny_tensors(spec);
  EXPECT_EQ(ck.tensors().size(), expected.size());
  for (const auto& t : expected) {
    const TensorInfo* info = ck.find(t.canonical);
    ASSERT_NE(info, nullptr) << t.canonical;
    EXPECT_EQ(info->name, testing::tiny_file_name(spec.layout, t.canonical));
    EXPECT_EQ(info->canonical, t.canonical);
    EXPECT_EQ(info->dtype, t.dtype) << t.canonical;
    EXPECT_EQ(info->shape, t.shape) << t.canonical;
    EXPECT_EQ(static_cast<int64_t>(info->nbytes),
              info->numel() * static_cast<int64_t>(dtype_size(t.dtype)));
    SafetensorsFile f = SafetensorsFile::open(info->file);
    const SafetensorsTensor* raw = f.find(info->name);
    ASSERT_NE(raw, nullptr);
    EXPECT_EQ(std::memcmp(raw->data, info->data, info->nbytes), 0) << t.canonical;
  }
}

class CheckpointLayouts : public ::testing::TestWithParam<Layout> {};

TEST_P(CheckpointLayouts, DetectsLayoutAndFindsCanonicalNames) {
  TempDir tmp;
  TinySpec spec;
  spec.layout = GetParam();
  spec.vision = spec.layout != Layout::kCausalLM;
  testing::write_tiny_checkpoint(tmp.path(), spec);
  Checkpoint ck = Checkpoint::open(tmp.path());
  EXPECT_EQ(ck.layout(), spec.layout);
  EXPECT_EQ(ck.norms_stored_plus_one(), spec.layout == Layout::kMlx);
  EXPECT_EQ(ck.dir(), tmp.path());
  EXPECT_EQ(ck.config().model_type, "qwen3_5");
  check_all_tensors(ck, spec);
  EXPECT_NE(ck.find("embed_tokens.weight"), nullptr);
  EXPECT_NE(ck.find("lm_head.weight"), nullptr);
  EXPECT_NE(ck.find("mtp.fc.weight"), nullptr);
  EXPECT_NE(ck.find("mtp.layers.0.self_attn.q_proj.weight"), nullptr);
  EXPECT_EQ(ck.find("layers.4.input_layernorm.weight"), nullptr);
  EXPECT_EQ(ck.get("layers.3.self_attn.q_norm.weight").shape, std::vector<int64_t>{S::kHeadDim});
  EXPECT_EQ(ck.vision_tensor_count(), spec.layout == Layout::kHfVL  ? 3u
                                      : spec.layout == Layout::kMlx ? 2u
                                                                    : 0u);
  EXPECT_EQ(ck.mtp_tensor_count(), 15u);  // fc, 2 pre-norms, layer (2 norms + 6 attn + 3 mlp), norm
  int64_t text = 0, mtp = 0;
  for (const auto& t : ck.tensors()) (t.mtp ? mtp : text) += static_cast<int64_t>(t.nbytes);
  EXPECT_EQ(ck.total_bytes(), text);
  EXPECT_EQ(ck.mtp_bytes(), mtp);
  EXPECT_EQ(ck.module_path_in_file("layers.0.mlp.up_proj"),
            testing::tiny_file_name(spec.layout, "layers.0.mlp.up_proj"));
  const std::string head = testing::tiny_file_name(spec.layout, "lm_head.weight");
  EXPECT_EQ(ck.module_path_in_file("lm_head"), head.substr(0, head.size() - 7));
}

INSTANTIATE_TEST_SUITE_P(All, CheckpointLayouts,
                         ::testing::Values(Layout::kHfVL, Layout::kCausalLM, Layout::kMlx),
                         [](const auto& p) {
                           std::string n = layout_name(p.param);  // "hf-vl" -> "hf_vl"
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(Checkpoint, ShardedWithIndex) {
  TempDir tmp;
  TinySpec spec;
  spec.shards = 3;
  testing::write_tiny_checkpoint(tmp.path(), spec);
  // A stray safetensors file the index does not name is not opened.
  testing::write_bytes(tmp.file("extra.safetensors"), "garbage");
  Checkpoint ck = Checkpoint::open(tmp.path());
  EXPECT_EQ(ck.shard_paths().size(), 3u);
  check_all_tensors(ck, spec);
  std::set<std::string> files;
  for (const auto& t : ck.tensors()) files.insert(t.file);
  EXPECT_EQ(files.size(), 3u);
}

TEST(Checkpoint, NormConventionFromMetadata) {
  // An mlx-lm text-model conversion: model.* names, but __metadata__ format "mlx".
  TempDir tmp;
  TinySpec spec;
  spec.layout = Layout::kCausalLM;
  spec.vision = false;
  testing::write_tiny_checkpoint(tmp.path(), spec);
  EXPECT_FALSE(Checkpoint::open(tmp.path()).norms_stored_plus_one());
  SafetensorsFile f = SafetensorsFile::open(tmp.file("model.safetensors"));
  std::vector<TensorToWrite> ts;
  for (const auto& t : f.tensors()) ts.push_back({t.name, t.dtype, t.shape, t.data, t.nbytes()});
  write_safetensors(tmp.file("model2.safetensors"), ts, {{"format", "mlx"}});
  fs::remove(tmp.file("model.safetensors"));
  Checkpoint ck = Checkpoint::open(tmp.path());
  EXPECT_EQ(ck.layout(), Layout::kCausalLM);
  EXPECT_TRUE(ck.norms_stored_plus_one());
}

TEST(Checkpoint, MoeExpertNamesReachable) {
  for (auto experts :
       {testing::Experts::kFusedHf, testing::Experts::kPerExpert, testing::Experts::kSwitchMlp}) {
    TempDir tmp;
    TinySpec spec;
    spec.moe = true;
    spec.experts = experts;
    spec.layout = experts == testing::Experts::kSwitchMlp ? Layout::kMlx : Layout::kHfVL;
    testing::write_tiny_checkpoint(tmp.path(), spec);
    Checkpoint ck = Checkpoint::open(tmp.path());
    EXPECT_TRUE(ck.config().is_moe);
    check_all_tensors(ck, spec);
    EXPECT_NE(ck.find("layers.0.mlp.gate.weight"), nullptr);
    EXPECT_NE(ck.find("layers.0.mlp.shared_expert_gate.weight"), nullptr);
    if (experts == testing::Experts::kFusedHf) {
      EXPECT_EQ(ck.get("layers.0.mlp.experts.gate_up_proj").shape,
                (std::vector<int64_t>{S::kExperts, 2 * S::kMoeInter, S::kHidden}));
    } else if (experts == testing::Experts::kPerExpert) {
      EXPECT_EQ(ck.get("layers.0.mlp.experts.3.gate_proj.weight").shape,
                (std::vector<int64_t>{S::kMoeInter, S::kHidden}));
    } else {
      EXPECT_EQ(ck.get("layers.0.mlp.switch_mlp.gate_proj.weight").shape,
                (std::vector<int64_t>{S::kExperts, S::kMoeInter, S::kHidden}));
    }
  }
}

TEST(Checkpoint, MlxQuantizedWithOverrides) {
  TempDir tmp;
  TinySpec spec;
  spec.layout = Layout::kMlx;
  spec.moe = true;
  spec.experts = testing::Experts::kSwitchMlp;
  spec.quantized = true;
  spec.tied = true;
  testing::write_tiny_checkpoint(tmp.path(), spec);
  Checkpoint ck = Checkpoint::open(tmp.path());
  const ModelConfig& c = ck.config();
  check_all_tensors(ck, spec);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(ck.find("lm_head.weight"), nullptr);
  EXPECT_EQ(c.quant, (QuantParams{4, 32}));
  EXPECT_EQ(c.quant_overrides.size(), 2u * S::kLayers + 1);
  auto q = [&](const std::string& m) { return c.quant_for(ck.module_path_in_file(m)); };
  EXPECT_EQ(q("layers.0.mlp.gate"), (QuantParams{8, 64}));
  EXPECT_EQ(q("layers.2.mlp.shared_expert_gate"), (QuantParams{8, 64}));
  EXPECT_EQ(q("layers.0.mlp.switch_mlp.up_proj"), (QuantParams{4, 32}));
  EXPECT_EQ(q("layers.1.linear_attn.in_proj_b"), QuantParams{});
  EXPECT_EQ(ck.get("layers.1.linear_attn.in_proj_b.weight").dtype, DType::BF16);
  EXPECT_EQ(ck.find("layers.1.linear_attn.in_proj_b.scales"), nullptr);
  // The router at 8 bits: [E, H*8/32] words and [E, H/64] scales.
  EXPECT_EQ(ck.get("layers.0.mlp.gate.weight").shape, (std::vector<int64_t>{S::kExperts, 16}));
  EXPECT_EQ(ck.get("layers.0.mlp.gate.scales").shape, (std::vector<int64_t>{S::kExperts, 1}));
  EXPECT_EQ(ck.get("embed_tokens.biases").dtype, DType::BF16);
}

TEST(Checkpoint, UnusedTensorsListsWhatWasNeverBound) {
  TempDir tmp;
  TinySpec spec;
  testing::write_tiny_checkpoint(tmp.path(), spec);
  Checkpoint ck = Checkpoint::open(tmp.path());
  for (const auto& t : ck.tensors()) {
    if (t.canonical != "norm.weight" && t.canonical != "layers.2.linear_attn.A_log") {
      ck.mark_used(t.canonical);
    }
  }
  ck.mark_used("not.a.tensor");  // no effect
  EXPECT_EQ(ck.unused_tensors(),
            (std::vector<std::string>{"model.language_model.layers.2.linear_attn.A_log",
                                      "model.language_model.norm.weight"}));
}

TEST(CheckpointErrors, GetNamesTheFileNameAndLayout) {
  TempDir tmp;
  TinySpec spec;
  spec.layout = Layout::kMlx;
  testing::write_tiny_checkpoint(tmp.path(), spec);
  Checkpoint ck = Checkpoint::open(tmp.path());
  expect_error([&] { ck.get("layers.9.mlp.up_proj.weight"); },
               {tmp.path(), "tensor 'language_model.model.layers.9.mlp.up_proj.weight' not found",
                "layout mlx", "'layers.9.mlp.up_proj.weight'"});
}

TEST(CheckpointErrors, MissingConfigOrSafetensors) {
  TempDir tmp;
  TinySpec spec;
  expect_error([&] { Checkpoint::open(tmp.file("nope")); }, {"nope", "not a directory"});
  expect_error([&] { Checkpoint::open(tmp.path()); }, {tmp.path(), "no config.json"});
  std::ofstream(tmp.file("config.json")) << testing::tiny_config(spec).dump();
  expect_error([&] { Checkpoint::open(tmp.path()); }, {tmp.path(), "no *.safetensors files"});
}

TEST(CheckpointErrors, BadConfigIsReportedWithItsPath) {
  TempDir tmp;
  TinySpec spec;
  testing::write_tiny_checkpoint(tmp.path(), spec);
  auto cfg = testing::tiny_config(spec);
  cfg["model_type"] = "gpt2";
  std::ofstream(tmp.file("config.json")) << cfg.dump();
  expect_error([&] { Checkpoint::open(tmp.path()); },
               {tmp.file("config.json"), "model_type 'gpt2' is not supported"});
}

TEST(CheckpointErrors, TruncatedShard) {
  TempDir tmp;
  TinySpec spec;
  spec.shards = 2;
  testing::write_tiny_checkpoint(tmp.path(), spec);
  const std::string shard = tmp.file("model-00002-of-00002.safetensors");
  std::string bytes = testing::read_bytes(shard);
  testing::write_bytes(shard, bytes.substr(0, bytes.size() / 2));
  expect_error([&] { Checkpoint::open(tmp.path()); }, {shard, "truncated"});
}

TEST(CheckpointErrors, IndexNamesAMissingShardOrTensor) {
  TempDir tmp;
  TinySpec spec;
  spec.shards = 2;
  testing::write_tiny_checkpoint(tmp.path(), spec);
  fs::rename(tmp.file("model-00001-of-00002.safetensors"), tmp.file("moved.safetensors"));
  expect_error([&] { Checkpoint::open(tmp.path()); },
               {"model-00001-of-00002.safetensors", "missing", "incomplete"});
  fs::rename(tmp.file("moved.safetensors"), tmp.file("model-00001-of-00002.safetensors"));

  auto index = nlohmann::json::parse(testing::read_bytes(tmp.file("model.safetensors.index.json")));
  index["weight_map"]["model.language_model.layers.7.mlp.up_proj.weight"] =
      "model-00001-of-00002.safetensors";
  std::ofstream(tmp.file("model.safetensors.index.json")) << index.dump();
  expect_error([&] { Checkpoint::open(tmp.path()); },
               {"model.safetensors.index.json",
                "'model.language_model.layers.7.mlp.up_proj.weight'", "does not hold it"});
  std::ofstream(tmp.file("model.safetensors.index.json")) << "{\"weight_map\": 3}";
  expect_error([&] { Checkpoint::open(tmp.path()); },
               {"model.safetensors.index.json", "weight_map"});
}

TEST(CheckpointErrors, MixedLayoutsAndDuplicateTensors) {
  TempDir tmp;
  TinySpec spec;
  testing::write_tiny_checkpoint(tmp.path(), spec);
  uint16_t x = 0;
  write_safetensors(tmp.file("extra.safetensors"),
                    {{"language_model.model.layers.0.extra.weight", DType::BF16, {1}, &x, 2}});
  expect_error([&] { Checkpoint::open(tmp.path()); }, {tmp.path(), "mix layouts"});
  write_safetensors(tmp.file("extra.safetensors"),
                    {{"model.language_model.norm.weight", DType::BF16, {1}, &x, 2}});
  expect_error(
      [&] { Checkpoint::open(tmp.path()); },
      {tmp.path(), "'model.language_model.norm.weight'", "appears in both", "extra.safetensors"});
  write_safetensors(tmp.file("extra.safetensors"),
                    {{"language_model.lm_head.weight", DType::BF16, {1}, &x, 2}});
  expect_error([&] { Checkpoint::open(tmp.path()); },
               {"'lm_head.weight'", "'language_model.lm_head.weight'", "under two names"});
}

TEST(CheckpointErrors, NoTextTensors) {
  TempDir tmp;
  TinySpec spec;
  std::ofstream(tmp.file("config.json")) << testing::tiny_config(spec).dump();
  uint16_t x = 0;
  write_safetensors(tmp.file("model.safetensors"),
                    {{"model.visual.blocks.0.weight", DType::BF16, {1}, &x, 2}});
  expect_error([&] { Checkpoint::open(tmp.path()); }, {tmp.path(), "no text-model tensors"});
}

}  // namespace
}  // namespace tokenmill
