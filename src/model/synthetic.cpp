#include "model/synthetic.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "io/checkpoint.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "model/dummy_fill.h"
#include "tensor/affine.h"
#include "tensor/dtype.h"
#include "tensor/random_fill.h"
#include "util/error.h"

namespace tokenmill {

namespace {

// Collects tensors (owning their bytes) and writes them in one file.
class TensorSink {
 public:
  // `lazy`: linear weights are recorded without data (Checkpoint::in_memory fills them).
  TensorSink(const SyntheticSpec& s, bool mlx, bool lazy = false)
      : spec_(s), mlx_(mlx), lazy_(lazy), rng_(s.seed) {}

  std::string name(const std::string& canonical) const {
    if (canonical.rfind("mtp.", 0) == 0) return canonical;
    if (canonical.rfind("lm_head", 0) == 0) return mlx_ ? "language_model." + canonical : canonical;
    return (mlx_ ? "language_model.model." : "model.language_model.") + canonical;
  }

  std::vector<float> random(int64_t n, float stddev) {
    std::normal_distribution<float> d(0.0f, stddev);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = d(rng_);
    return v;
  }

  void add_f32(const std::string& canonical, std::vector<int64_t> shape, std::vector<float> v) {
    Owned o{name(canonical), DType::F32, std::move(shape), {}};
    o.bytes.resize(v.size() * 4);
    std::memcpy(o.bytes.data(), v.data(), o.bytes.size());
    owned_.push_back(std::move(o));
  }

  void add_bf16(const std::string& canonical, std::vector<int64_t> shape,
                const std::vector<float>& v) {
    Owned o{name(canonical), DType::BF16, std::move(shape), {}};
    o.bytes.resize(v.size() * 2);
    auto* p = reinterpret_cast<uint16_t*>(o.bytes.data());
    for (size_t i = 0; i < v.size(); ++i) p[i] = f32_to_bf16(v[i]);
    owned_.push_back(std::move(o));
  }

  // A linear weight [lead..., rows, cols]: bf16, or MLX affine with bf16 scales and biases.
  void add_linear(const std::string& module, std::vector<int64_t> lead, int64_t rows, int64_t cols,
                  float stddev = 0.0f, int bits_override = -1) {
    if (stddev == 0.0f)
      stddev = spec_.init_scale > 0 ? spec_.init_scale : 1.0f / std::sqrt(static_cast<float>(cols));
    int64_t mats = 1;
    for (int64_t d : lead) mats *= d;
    int bits = bits_override >= 0 ? bits_override : spec_.bits;
    auto shape = lead;
    shape.push_back(rows);
    if (lazy_) {
      add_lazy(module, shape, cols, bits, bits_override > 0 ? 64 : spec_.group);
      return;
    }
    std::vector<float> w = random(mats * rows * cols, stddev);
    if (bits == 0) {
      shape.push_back(cols);
      add_bf16(module + ".weight", shape, w);
      return;
    }
    const int group = bits_override > 0 ? 64 : spec_.group;  // MLX forces group 64 for 8-bit gates
    int64_t wpr = affine::words_per_row(cols, bits), groups = cols / group;
    std::vector<uint32_t> packed(static_cast<size_t>(mats * rows * wpr));
    std::vector<float> sc(static_cast<size_t>(mats * rows * groups)), bi(sc.size());
    affine::quantize(w.data(), mats * rows, cols, bits, group, packed.data(), sc.data(), bi.data());
    auto pshape = shape;
    pshape.push_back(wpr);
    Owned o{name(module + ".weight"), DType::U32, pshape, {}};
    o.bytes.resize(packed.size() * 4);
    std::memcpy(o.bytes.data(), packed.data(), o.bytes.size());
    owned_.push_back(std::move(o));
    auto sshape = shape;
    sshape.push_back(groups);
    add_bf16(module + ".scales", sshape, sc);
    add_bf16(module + ".biases", sshape, bi);
  }

  // A zero-centered norm: HF stores w around 0, MLX stores 1+w.
  void add_norm(const std::string& canonical, int64_t n) {
    std::vector<float> v = random(n, 0.1f);
    if (mlx_) {
      for (float& x : v) x += 1.0f;
    }
    add_bf16(canonical, {n}, v);
  }

  // Shapes and dtypes only (bf16, or U32 codes with bf16 scales and biases), and how
  // --dummy-weights fills each part (written out by write() as the same values).
  void add_lazy(const std::string& module, std::vector<int64_t> shape, int64_t cols, int bits,
                int group) {
    const DummyLinear f = dummy_linear(module, cols, bits);
    auto w = shape;
    if (bits == 0) {
      w.push_back(cols);
      owned_.push_back({name(module + ".weight"), DType::BF16, w, {}, true, f.dense});
      return;
    }
    w.push_back(affine::words_per_row(cols, bits));
    owned_.push_back({name(module + ".weight"), DType::U32, w, {}, true, f.codes});
    auto sb = shape;
    sb.push_back(cols / group);
    owned_.push_back({name(module + ".scales"), DType::BF16, sb, {}, true, f.scales});
    owned_.push_back({name(module + ".biases"), DType::BF16, sb, {}, true, f.biases});
  }

  // Moves the tensors into an in-memory checkpoint (lazy ones without data).
  Checkpoint to_checkpoint(const std::string& label, ModelConfig config) {
    std::vector<TensorInfo> infos;
    std::vector<std::vector<uint8_t>> bytes;
    for (Owned& o : owned_) {
      TensorInfo t;
      t.name = o.name;
      t.dtype = o.dtype;
      t.shape = o.shape;
      t.nbytes = static_cast<size_t>(t.numel()) * dtype_size(o.dtype);
      if (!o.lazy) {
        bytes.push_back(std::move(o.bytes));
        t.data = bytes.back().data();  // stable: moving the outer vector keeps inner buffers
      }
      infos.push_back(std::move(t));
    }
    owned_.clear();
    return Checkpoint::in_memory(label, std::move(config),
                                 mlx_ ? Checkpoint::Layout::kMlx : Checkpoint::Layout::kHfVL, mlx_,
                                 std::move(infos), std::move(bytes));
  }

  // Lazy tensors are generated as the file is written: Backend::fill_random's values
  // (random_fill.h) for their DummyFill, element i of the tensor from index i.
  void write(const std::string& path) {
    std::vector<TensorToWrite> t;
    for (const Owned& o : owned_) {
      if (!o.lazy) {
        t.push_back({o.name, o.dtype, o.shape, o.bytes.data(), o.bytes.size(), {}});
        continue;
      }
      int64_t n = 1;
      for (int64_t d : o.shape) n *= d;
      const DummyFill f = o.fill;
      TensorToWrite g{
          o.name, o.dtype, o.shape, nullptr, static_cast<size_t>(n) * dtype_size(o.dtype), {}};
      if (o.dtype == DType::U32) {
        g.generate = [f](uint8_t* dst, size_t off, size_t bytes) {
          auto* p = reinterpret_cast<uint32_t*>(dst);
          for (size_t i = 0, i0 = off / 4; i < bytes / 4; ++i)
            p[i] = static_cast<uint32_t>(random_fill::bits(f.seed, i0 + i));
        };
      } else {
        g.generate = [f](uint8_t* dst, size_t off, size_t bytes) {
          auto* p = reinterpret_cast<uint16_t*>(dst);
          for (size_t i = 0, i0 = off / 2; i < bytes / 2; ++i)
            p[i] = f32_to_bf16(random_fill::uniform(f.seed, i0 + i, f.stddev));
        };
      }
      t.push_back(std::move(g));
    }
    std::map<std::string, std::string> meta{{"format", mlx_ ? "mlx" : "pt"}};
    write_safetensors(path, t, meta);
  }

  int64_t bytes() const {
    int64_t b = 0;
    for (const Owned& o : owned_) b += static_cast<int64_t>(o.bytes.size());
    return b;
  }

 private:
  struct Owned {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
    bool lazy = false;
    DummyFill fill;  // lazy tensors: their values
  };
  const SyntheticSpec& spec_;
  bool mlx_;
  bool lazy_;
  std::mt19937_64 rng_;
  std::vector<Owned> owned_;
};

void add_layer(TensorSink& sink, const SyntheticSpec& s, const std::string& p, bool full) {
  const int64_t H = s.hidden;
  sink.add_norm(p + ".input_layernorm.weight", H);
  sink.add_norm(p + ".post_attention_layernorm.weight", H);
  if (full) {
    sink.add_linear(p + ".self_attn.q_proj", {}, 2LL * s.heads * s.head_dim, H);
    sink.add_linear(p + ".self_attn.k_proj", {}, int64_t{s.kv_heads} * s.head_dim, H);
    sink.add_linear(p + ".self_attn.v_proj", {}, int64_t{s.kv_heads} * s.head_dim, H);
    sink.add_linear(p + ".self_attn.o_proj", {}, H, int64_t{s.heads} * s.head_dim);
    sink.add_norm(p + ".self_attn.q_norm.weight", s.head_dim);
    sink.add_norm(p + ".self_attn.k_norm.weight", s.head_dim);
  } else {
    const int64_t C = 2LL * s.k_heads * s.k_dim + int64_t{s.v_heads} * s.v_dim;
    const int64_t HvDv = int64_t{s.v_heads} * s.v_dim;
    const std::string a = p + ".linear_attn";
    sink.add_linear(a + ".in_proj_qkv", {}, C, H);
    sink.add_linear(a + ".in_proj_z", {}, HvDv, H);
    sink.add_linear(a + ".in_proj_b", {}, s.v_heads, H);
    sink.add_linear(a + ".in_proj_a", {}, s.v_heads, H);
    sink.add_linear(a + ".out_proj", {}, H, HvDv);
    std::vector<float> conv = sink.random(C * s.conv_kernel, 0.3f);
    sink.add_bf16(a + ".conv1d.weight", {C, 1, s.conv_kernel}, conv);
    std::vector<float> alog(static_cast<size_t>(s.v_heads)), dtb = sink.random(s.v_heads, 0.5f);
    for (size_t i = 0; i < alog.size(); ++i)
      alog[i] = std::log(1.0f + 15.0f * (static_cast<float>(i) + 0.5f) / alog.size());
    sink.add_f32(a + ".A_log", {s.v_heads}, alog);
    sink.add_bf16(a + ".dt_bias", {s.v_heads}, dtb);
    std::vector<float> gn = sink.random(s.v_dim, 0.1f);
    for (float& x : gn) x += 1.0f;
    sink.add_bf16(a + ".norm.weight", {s.v_dim}, gn);
  }
  if (s.moe) {
    const std::string m = p + ".mlp";
    sink.add_linear(m + ".gate", {}, s.experts, H, 0.0f, s.bits ? 8 : 0);
    sink.add_linear(m + ".switch_mlp.gate_proj", {s.experts}, s.moe_intermediate, H);
    sink.add_linear(m + ".switch_mlp.up_proj", {s.experts}, s.moe_intermediate, H);
    sink.add_linear(m + ".switch_mlp.down_proj", {s.experts}, H, s.moe_intermediate);
    sink.add_linear(m + ".shared_expert.gate_proj", {}, s.shared_intermediate, H);
    sink.add_linear(m + ".shared_expert.up_proj", {}, s.shared_intermediate, H);
    sink.add_linear(m + ".shared_expert.down_proj", {}, H, s.shared_intermediate);
    sink.add_linear(m + ".shared_expert_gate", {}, 1, H, 0.0f, s.bits ? 8 : 0);
  } else {
    sink.add_linear(p + ".mlp.gate_proj", {}, s.intermediate, H);
    sink.add_linear(p + ".mlp.up_proj", {}, s.intermediate, H);
    sink.add_linear(p + ".mlp.down_proj", {}, H, s.intermediate);
  }
}

nlohmann::json config_json(const SyntheticSpec& s, const std::vector<std::string>& overrides8) {
  nlohmann::json layer_types = nlohmann::json::array();
  for (int i = 0; i < s.layers; ++i) {
    layer_types.push_back((i + 1) % s.full_attention_interval == 0 ? "full_attention"
                                                                   : "linear_attention");
  }
  nlohmann::json t = {
      {"model_type", s.moe ? "qwen3_5_moe_text" : "qwen3_5_text"},
      {"vocab_size", s.vocab},
      {"hidden_size", s.hidden},
      {"intermediate_size", s.intermediate},
      {"num_hidden_layers", s.layers},
      {"layer_types", layer_types},
      {"num_attention_heads", s.heads},
      {"num_key_value_heads", s.kv_heads},
      {"head_dim", s.head_dim},
      {"linear_num_key_heads", s.k_heads},
      {"linear_num_value_heads", s.v_heads},
      {"linear_key_head_dim", s.k_dim},
      {"linear_value_head_dim", s.v_dim},
      {"linear_conv_kernel_dim", s.conv_kernel},
      {"rms_norm_eps", 1e-6},
      {"max_position_embeddings", s.max_position},
      {"tie_word_embeddings", s.tied},
      {"rope_parameters",
       {{"rope_type", "default"},
        {"rope_theta", 1e7},
        {"partial_rotary_factor", s.partial_rotary_factor}}},
      {"mtp_num_hidden_layers", s.mtp_layers},
      {"eos_token_id", 1},
  };
  if (s.moe) {
    t["num_experts"] = s.experts;
    t["num_experts_per_tok"] = s.experts_per_tok;
    t["moe_intermediate_size"] = s.moe_intermediate;
    t["shared_expert_intermediate_size"] = s.shared_intermediate;
  }
  nlohmann::json j = {
      {"model_type", s.moe ? "qwen3_5_moe" : "qwen3_5"},
      {"architectures",
       {s.moe ? "Qwen3_5MoeForConditionalGeneration" : "Qwen3_5ForConditionalGeneration"}},
      {"tie_word_embeddings", s.tied},
      {"text_config", t}};
  if (s.bits > 0) {
    nlohmann::json q = {{"group_size", s.group}, {"bits", s.bits}, {"mode", "affine"}};
    for (const std::string& m : overrides8) q[m] = {{"group_size", 64}, {"bits", 8}};
    j["quantization"] = q;
    j["quantization_config"] = q;
  }
  return j;
}

void fill(TensorSink& sink, const SyntheticSpec& s, std::vector<std::string>* overrides8) {
  sink.add_linear("embed_tokens", {}, s.vocab, s.hidden, 1.0f);
  for (int i = 0; i < s.layers; ++i) {
    std::string p = fmt::format("layers.{}", i);
    add_layer(sink, s, p, (i + 1) % s.full_attention_interval == 0);
    if (s.moe && s.bits > 0) {
      overrides8->push_back(sink.name(p + ".mlp.gate"));
      overrides8->push_back(sink.name(p + ".mlp.shared_expert_gate"));
    }
  }
  sink.add_norm("norm.weight", s.hidden);
  if (!s.tied) sink.add_linear("lm_head", {}, s.vocab, s.hidden);
}

}  // namespace

void write_synthetic_checkpoint(const std::string& dir, const SyntheticSpec& spec) {
  if (spec.bits > 0) {
    affine::check_layout(spec.bits, spec.group, spec.hidden, "synthetic checkpoint");
  }
  std::filesystem::create_directories(dir);
  const bool mlx = spec.bits > 0;
  TensorSink sink(spec, mlx);
  std::vector<std::string> overrides8;
  fill(sink, spec, &overrides8);
  if (spec.mtp_layers > 0 && !mlx) {
    sink.add_linear("mtp.fc", {}, spec.hidden, 2 * spec.hidden);
    sink.add_norm("mtp.pre_fc_norm_embedding.weight", spec.hidden);
    sink.add_norm("mtp.pre_fc_norm_hidden.weight", spec.hidden);
    sink.add_norm("mtp.norm.weight", spec.hidden);
    add_layer(sink, spec, "mtp.layers.0", true);
  }
  sink.write(dir + "/model.safetensors");
  std::ofstream(dir + "/config.json") << config_json(spec, overrides8).dump(2) << "\n";
}

void write_random_checkpoint(const std::string& dir, const SyntheticSpec& spec) {
  if (spec.bits > 0) {
    affine::check_layout(spec.bits, spec.group, spec.hidden, "random checkpoint");
  }
  std::filesystem::create_directories(dir);
  const bool mlx = spec.bits > 0;
  TensorSink sink(spec, mlx, /*lazy=*/true);
  std::vector<std::string> overrides8;
  fill(sink, spec, &overrides8);
  sink.write(dir + "/model.safetensors");
  const std::string config = dir + "/config.json";
  std::ofstream out(config);
  out << config_json(spec, overrides8).dump(2) << "\n";
  out.close();
  if (!out) fail("{}: cannot write the model's config (is the disk full?)", config);
}

Checkpoint synthetic_checkpoint_in_memory(const SyntheticSpec& spec, const std::string& label) {
  if (spec.bits > 0) {
    affine::check_layout(spec.bits, spec.group, spec.hidden, "synthetic checkpoint");
  }
  const bool mlx = spec.bits > 0;
  TensorSink sink(spec, mlx, /*lazy=*/true);
  std::vector<std::string> overrides8;
  fill(sink, spec, &overrides8);
  ModelConfig cfg = parse_model_config(config_json(spec, overrides8), label);
  return sink.to_checkpoint(label, std::move(cfg));
}

int64_t synthetic_weight_bytes(const SyntheticSpec& spec) {
  // Exact, by building the tensor list without writing it would cost the same memory; a
  // closed form keeps bench planning cheap.
  auto lin = [&](int64_t rows, int64_t cols, int bits = -1, int group = 0) {
    if (bits < 0) bits = spec.bits;
    if (group == 0) group = spec.group;
    if (bits == 0) return rows * cols * 2;
    return rows * cols * bits / 8 + 2 * 2 * rows * (cols / group);
  };
  // MoE router and shared-expert gate: 8-bit group 64 in quantized specs (as MLX does).
  const int gate_bits = spec.bits ? 8 : 0;
  const int64_t H = spec.hidden;
  int64_t total = lin(spec.vocab, H) + (spec.tied ? 0 : lin(spec.vocab, H));
  for (int i = 0; i < spec.layers; ++i) {
    if ((i + 1) % spec.full_attention_interval == 0) {
      total += lin(2LL * spec.heads * spec.head_dim, H) +
               2 * lin(int64_t{spec.kv_heads} * spec.head_dim, H) +
               lin(H, int64_t{spec.heads} * spec.head_dim);
    } else {
      const int64_t C = 2LL * spec.k_heads * spec.k_dim + int64_t{spec.v_heads} * spec.v_dim;
      const int64_t HvDv = int64_t{spec.v_heads} * spec.v_dim;
      total += lin(C, H) + lin(HvDv, H) + 2 * lin(spec.v_heads, H) + lin(H, HvDv);
    }
    if (spec.moe) {
      total += spec.experts * 3 * lin(spec.moe_intermediate, H) +
               3 * lin(spec.shared_intermediate, H) + lin(spec.experts, H, gate_bits, 64) +
               lin(1, H, gate_bits, 64);
    } else {
      total += 3 * lin(spec.intermediate, H);
    }
  }
  return total;
}

}  // namespace tokenmill
