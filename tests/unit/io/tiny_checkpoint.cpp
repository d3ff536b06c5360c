#include "tiny_checkpoint.h"

#include <unistd.h>

#include <fstream>
#include <random>
#include <sstream>

#include "io/safetensors.h"

namespace tokenmill::testing {

namespace fs = std::filesystem;
using S = TinySizes;
using Layout = Checkpoint::Layout;

TempDir::TempDir() {
  path_ = (fs::temp_directory_path() / ("tm_io_test_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(std::random_device{}())))
              .string();
  fs::remove_all(path_);
  fs::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

nlohmann::json tiny_config(const TinySpec& spec) {
  nlohmann::json text = {
      {"vocab_size", S::kVocab},
      {"hidden_size", S::kHidden},
      {"num_hidden_layers", S::kLayers},
      {"num_attention_heads", S::kHeads},
      {"num_key_value_heads", S::kKvHeads},
      {"head_dim", S::kHeadDim},
      {"rms_norm_eps", 1e-6},
      {"max_position_embeddings", 4096},
      {"layer_types",
       {"linear_attention", "linear_attention", "linear_attention", "full_attention"}},
      {"rope_parameters", {{"rope_theta", 1e7}, {"partial_rotary_factor", 0.25}}},
      {"attn_output_gate", true},
      {"linear_num_key_heads", S::kHk},
      {"linear_num_value_heads", S::kHv},
      {"linear_key_head_dim", S::kDk},
      {"linear_value_head_dim", S::kDv},
      {"linear_conv_kernel_dim", S::kConv},
      {"mtp_num_hidden_layers", spec.mtp ? 1 : 0},
      {"eos_token_id", 95},
  };
  if (spec.moe) {
    text["num_experts"] = S::kExperts;
    text["num_experts_per_tok"] = S::kTopK;
    text["moe_intermediate_size"] = S::kMoeInter;
    text["shared_expert_intermediate_size"] = S::kSharedInter;
  } else {
    text["intermediate_size"] = S::kInter;
  }
  nlohmann::json j;
  const std::string base = spec.moe ? "qwen3_5_moe" : "qwen3_5";
  if (spec.nested_config) {
    text["model_type"] = base + "_text";
    j = {{"model_type", base}, {"text_config", text}, {"tie_word_embeddings", spec.tied}};
  } else {
    j = text;
    j["model_type"] = base + "_text";
    j["tie_word_embeddings"] = spec.tied;
  }
  if (spec.quantized) {
    nlohmann::json q = {{"group_size", 32}, {"bits", 4}, {"mode", "affine"}};
    const std::string p = tiny_file_name(spec.layout, "layers.0.");
    if (spec.moe) {
      for (int i = 0; i < S::kLayers; ++i) {
        std::string l = tiny_file_name(spec.layout, "layers." + std::to_string(i) + ".mlp.");
        q[l + "gate"] = {{"group_size", 64}, {"bits", 8}};
        q[l + "shared_expert_gate"] = {{"group_size", 64}, {"bits", 8}};
      }
    } else {
      q[p + "mlp.down_proj"] = {{"group_size", 64}, {"bits", 8}};
    }
    q[tiny_file_name(spec.layout, "layers.1.linear_attn.in_proj_b")] = false;
    j["quantization"] = q;
    j["quantization_config"] = q;
  }
  return j;
}

namespace {

// Float tensors of the tiny model (canonical name, shape), before quantization.
std::vector<std::pair<std::string, std::vector<int64_t>>> float_tensors(const TinySpec& spec) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> t;
  const int64_t H = S::kHidden, D = S::kHeadDim;
  auto attention = [&](const std::string& p) {
    t.push_back({p + "self_attn.q_proj.weight", {S::kHeads * 2 * D, H}});
    t.push_back({p + "self_attn.k_proj.weight", {S::kKvHeads * D, H}});
    t.push_back({p + "self_attn.v_proj.weight", {S::kKvHeads * D, H}});
    t.push_back({p + "self_attn.o_proj.weight", {H, S::kHeads * D}});
    t.push_back({p + "self_attn.q_norm.weight", {D}});
    t.push_back({p + "self_attn.k_norm.weight", {D}});
  };
  auto mlp = [&](const std::string& p) {
    if (!spec.moe) {
      t.push_back({p + "mlp.gate_proj.weight", {S::kInter, H}});
      t.push_back({p + "mlp.up_proj.weight", {S::kInter, H}});
      t.push_back({p + "mlp.down_proj.weight", {H, S::kInter}});
      return;
    }
    const int64_t E = S::kExperts, I = S::kMoeInter;
    t.push_back({p + "mlp.gate.weight", {E, H}});
    if (spec.experts == Experts::kFusedHf) {
      t.push_back({p + "mlp.experts.gate_up_proj", {E, 2 * I, H}});
      t.push_back({p + "mlp.experts.down_proj", {E, H, I}});
    } else if (spec.experts == Experts::kPerExpert) {
      for (int e = 0; e < E; ++e) {
        std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        t.push_back({x + "gate_proj.weight", {I, H}});
        t.push_back({x + "up_proj.weight", {I, H}});
        t.push_back({x + "down_proj.weight", {H, I}});
      }
    } else {
      t.push_back({p + "mlp.switch_mlp.gate_proj.weight", {E, I, H}});
      t.push_back({p + "mlp.switch_mlp.up_proj.weight", {E, I, H}});
      t.push_back({p + "mlp.switch_mlp.down_proj.weight", {E, H, I}});
    }
    t.push_back({p + "mlp.shared_expert.gate_proj.weight", {S::kSharedInter, H}});
    t.push_back({p + "mlp.shared_expert.up_proj.weight", {S::kSharedInter, H}});
    t.push_back({p + "mlp.shared_expert.down_proj.weight", {H, S::kSharedInter}});
    t.push_back({p + "mlp.shared_expert_gate.weight", {1, H}});
  };
  t.push_back({"embed_tokens.weight", {S::kVocab, H}});
  t.push_back({"norm.weight", {H}});
  if (!spec.tied) t.push_back({"lm_head.weight", {S::kVocab, H}});
  const int64_t C = 2 * S::kHk * S::kDk + S::kHv * S::kDv;
  for (int i = 0; i < S::kLayers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    t.push_back({p + "input_layernorm.weight", {H}});
    t.push_back({p + "post_attention_layernorm.weight", {H}});
    if ((i + 1) % 4 == 0) {
      attention(p);
    } else {
      const std::string a = p + "linear_attn.";
      t.push_back({a + "in_proj_qkv.weight", {C, H}});
      t.push_back({a + "in_proj_z.weight", {S::kHv * S::kDv, H}});
      t.push_back({a + "in_proj_b.weight", {S::kHv, H}});
      t.push_back({a + "in_proj_a.weight", {S::kHv, H}});
      t.push_back({a + "conv1d.weight", spec.layout == Layout::kMlx
                                            ? std::vector<int64_t>{C, S::kConv, 1}
                                            : std::vector<int64_t>{C, 1, S::kConv}});
      t.push_back({a + "A_log", {S::kHv}});
      t.push_back({a + "dt_bias", {S::kHv}});
      t.push_back({a + "norm.weight", {S::kDv}});
      t.push_back({a + "out_proj.weight", {H, S::kHv * S::kDv}});
    }
    mlp(p);
  }
  if (spec.mtp) {
    t.push_back({"mtp.fc.weight", {H, 2 * H}});
    t.push_back({"mtp.pre_fc_norm_embedding.weight", {H}});
    t.push_back({"mtp.pre_fc_norm_hidden.weight", {H}});
    t.push_back({"mtp.layers.0.input_layernorm.weight", {H}});
    t.push_back({"mtp.layers.0.post_attention_layernorm.weight", {H}});
    attention("mtp.layers.0.");
    mlp("mtp.layers.0.");
    t.push_back({"mtp.norm.weight", {H}});
  }
  return t;
}

bool quantizable(const std::string& name, const std::vector<int64_t>& shape) {
  if (shape.size() < 2 || name.find("conv1d") != std::string::npos) return false;
  return name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
}

std::vector<std::string> vision_names(Layout layout) {
  if (layout == Layout::kHfVL) {
    return {"model.visual.patch_embed.proj.weight", "model.visual.blocks.0.attn.qkv.weight",
            "model.visual.merger.mlp.0.weight"};
  }
  if (layout == Layout::kMlx) {
    return {"vision_tower.patch_embed.proj.weight", "vision_tower.blocks.0.attn.qkv.weight"};
  }
  return {};
}

}  // namespace

std::string tiny_file_name(Layout layout, const std::string& canonical) {
  if (canonical.rfind("mtp.", 0) == 0) return canonical;
  if (canonical.rfind("lm_head.", 0) == 0) {
    return layout == Layout::kMlx ? "language_model." + canonical : canonical;
  }
  switch (layout) {
    case Layout::kHfVL:
      return "model.language_model." + canonical;
    case Layout::kCausalLM:
      return "model." + canonical;
    case Layout::kMlx:
      return "language_model.model." + canonical;
  }
  return canonical;
}

std::vector<TinyTensor> tiny_tensors(const TinySpec& spec) {
  std::vector<TinyTensor> out;
  const nlohmann::json cfg = tiny_config(spec);
  for (const auto& [name, shape] : float_tensors(spec)) {
    const std::string module = name.substr(0, name.size() - 7);
    const std::string key = tiny_file_name(spec.layout, module);
    const nlohmann::json& q = cfg.contains("quantization") ? cfg["quantization"] : nlohmann::json();
    const bool off = q.contains(key) && q[key].is_boolean() && !q[key].get<bool>();
    if (!spec.quantized || !quantizable(name, shape) || off) {
      out.push_back({name, DType::BF16, shape});
      continue;
    }
    int bits = 4, group = 32;
    if (q.contains(key) && q[key].is_object()) {
      bits = q[key]["bits"];
      group = q[key]["group_size"];
    }
    std::vector<int64_t> packed = shape, groups = shape;
    packed.back() = shape.back() * bits / 32;
    groups.back() = shape.back() / group;
    out.push_back({name, DType::U32, packed});
    out.push_back({module + ".scales", DType::BF16, groups});
    out.push_back({module + ".biases", DType::BF16, groups});
  }
  return out;
}

void write_tiny_checkpoint(const std::string& dir, const TinySpec& spec) {
  std::ofstream(dir + "/config.json") << tiny_config(spec).dump(2);
  std::vector<std::pair<std::string, std::vector<int64_t>>> all;  // file name, shape
  std::vector<DType> dtypes;
  for (const auto& t : tiny_tensors(spec)) {
    all.push_back({tiny_file_name(spec.layout, t.canonical), t.shape});
    dtypes.push_back(t.dtype);
  }
  if (spec.vision) {
    for (const auto& n : vision_names(spec.layout)) {
      all.push_back({n, {8, 4}});
      dtypes.push_back(DType::BF16);
    }
  }
  std::mt19937 rng(1234);
  std::vector<std::vector<uint8_t>> bytes(all.size());
  std::vector<std::vector<TensorToWrite>> shards(spec.shards);
  nlohmann::json weight_map = nlohmann::json::object();
  auto shard_name = [&](int k) {
    if (spec.shards == 1) return std::string("model.safetensors");
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", k + 1, spec.shards);
    return std::string(buf);
  };
  for (size_t i = 0; i < all.size(); ++i) {
    int64_t n = static_cast<int64_t>(dtype_size(dtypes[i]));
    for (int64_t d : all[i].second) n *= d;
    bytes[i].resize(static_cast<size_t>(n));
    for (auto& b : bytes[i]) b = static_cast<uint8_t>(rng());
    const int k = static_cast<int>(i % static_cast<size_t>(spec.shards));
    shards[k].push_back({all[i].first, dtypes[i], all[i].second, bytes[i].data(), bytes[i].size()});
    weight_map[all[i].first] = shard_name(k);
  }
  const std::map<std::string, std::string> meta = {
      {"format", spec.layout == Layout::kMlx ? "mlx" : "pt"}};
  for (int k = 0; k < spec.shards; ++k) {
    write_safetensors(dir + "/" + shard_name(k), shards[k], meta);
  }
  if (spec.shards > 1) {
    std::ofstream(dir + "/model.safetensors.index.json")
        << nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump(2);
  }
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) {
      EXPECT_NE(msg.find(p), std::string::npos) << "message lacks '" << p << "': " << msg;
    }
    return;
  }
  ADD_FAILURE() << "expected tokenmill::Error";
}

}  // namespace tokenmill::testing
