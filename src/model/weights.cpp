#include "model/weights.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "io/checkpoint.h"
#include "util/error.h"
#include "util/log.h"

namespace tokenmill {

WeightStore::~WeightStore() {
  for (void* p : owned_) backend_.free(p);
}

Vec WeightStore::upload_vec(const std::vector<float>& host) {
  Vec v;
  v.size = static_cast<int64_t>(host.size());
  if (host.empty()) return v;
  void* p = backend_.alloc(host.size() * sizeof(float));
  owned_.push_back(p);
  backend_.upload(p, host.data(), host.size() * sizeof(float));
  v.data = static_cast<float*>(p);
  return v;
}

Weight WeightStore::random_weight(const Weight& shape, const DummyLinear& fills) {
  Weight w = shape;
  const int64_t mats = w.experts > 0 ? w.experts : 1;
  auto make = [&](DType dt, int64_t n, const DummyFill& f) {
    void* p = backend_.alloc(static_cast<size_t>(n) * dtype_size(dt));
    owned_.push_back(p);
    backend_.fill_random(p, dt, n, f.stddev, f.seed);
    return p;
  };
  if (w.quantized()) {
    w.data = make(DType::U32, mats * w.rows * (w.cols * w.bits / 32), fills.codes);
    const int64_t groups = mats * w.rows * (w.cols / w.group);
    w.scales = make(w.scale_dtype, groups, fills.scales);
    w.biases = make(w.scale_dtype, groups, fills.biases);
  } else {
    w.data = make(w.dtype, mats * w.rows * w.cols, fills.dense);
  }
  // The backend's own arrangement, as for an uploaded weight (the speed measured with dummy
  // weights is the speed of real ones); the generated buffers go when it made new ones.
  const Weight packed = backend_.pack_weight(w);
  release_replaced(backend_, w, packed, owned_);
  return packed;
}

uint8_t* WeightStore::host_buffer(size_t bytes) {
  host_.push_back(std::make_unique<uint8_t[]>(bytes));
  return host_.back().get();
}

namespace {

bool is_float(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}

std::string shape_str(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

[[noreturn]] void shape_error(const TensorInfo& t, const std::vector<int64_t>& expected,
                              const std::string& what) {
  fail("{}: tensor '{}': expected shape {} {}, found {} {}", t.file, t.name, shape_str(expected),
       what, shape_str(t.shape), dtype_name(t.dtype));
}

// The binder: remembers the checkpoint, config and store, and binds by canonical name.
class Binder {
 public:
  Binder(Checkpoint& ckpt, const ModelConfig& cfg, WeightStore& store)
      : ckpt_(ckpt), cfg_(cfg), store_(store) {}

  const TensorInfo& get(const std::string& name) {
    const TensorInfo& t = ckpt_.get(name);
    ckpt_.mark_used(name);
    return t;
  }

  // A linear layer [rows, cols] (or stacked [experts, rows, cols] when experts > 0), float or
  // MLX affine. `module` is canonical without ".weight".
  Weight linear(const std::string& module, int64_t rows, int64_t cols, int64_t experts = 0) {
    const std::string wname = module + ".weight";
    const TensorInfo& t = get(wname);
    Weight w;
    w.rows = rows;
    w.cols = cols;
    w.experts = experts;
    std::vector<int64_t> lead;
    if (experts > 0) lead.push_back(experts);
    if (ckpt_.find(module + ".scales") != nullptr) {
      QuantParams q = cfg_.quant_for(ckpt_.module_path_in_file(module));
      if (q.bits == 0) {
        fail(
            "{}: tensor '{}' has scales but config.json gives no quantization for it (add a "
            "\"quantization\" entry with bits and group_size)",
            t.file, t.name);
      }
      const TensorInfo& s = get(module + ".scales");
      const TensorInfo& b = get(module + ".biases");
      auto expect = lead;
      expect.push_back(rows);
      expect.push_back(cols * q.bits / 32);
      if (t.dtype != DType::U32 || t.shape != expect || (cols * q.bits) % 32 != 0) {
        shape_error(t, expect, fmt::format("U32 ({}-bit affine)", q.bits));
      }
      auto sexpect = lead;
      sexpect.push_back(rows);
      sexpect.push_back(cols / q.group);
      if (!is_float(s.dtype) || s.shape != sexpect || cols % q.group != 0) {
        shape_error(s, sexpect, fmt::format("float (scales for group {})", q.group));
      }
      if (b.dtype != s.dtype || b.shape != sexpect) {
        shape_error(b, sexpect, fmt::format("{} (biases, like the scales)", dtype_name(s.dtype)));
      }
      w.dtype = DType::U32;
      w.bits = q.bits;
      w.group = q.group;
      w.scale_dtype = s.dtype;
      w.data = t.data;
      w.scales = s.data;
      w.biases = b.data;
    } else {
      auto expect = lead;
      expect.push_back(rows);
      expect.push_back(cols);
      if (!is_float(t.dtype) || t.shape != expect) shape_error(t, expect, "BF16, F16 or F32");
      w.dtype = t.dtype;
      w.data = t.data;
    }
    // In-memory dummy checkpoints leave the data out: fill on the device, at real size.
    Weight up = t.data != nullptr ? store_.upload(w)
                                  : store_.random_weight(w, dummy_linear(module, cols, w.bits));
    // The backend has its copy: the mapping's pages of it can go.
    ckpt_.release(t);
    if (w.quantized()) {
      ckpt_.release(ckpt_.get(module + ".scales"));
      ckpt_.release(ckpt_.get(module + ".biases"));
    }
    count(w);
    return up;
  }

  // A 1-D float vector of `n` values (any float dtype), converted to F32; `plus_one` adds 1 to
  // every element (zero-centered norms in HF checkpoints).
  std::vector<float> host_vec(const std::string& name, int64_t n, bool plus_one = false) {
    const TensorInfo& t = get(name);
    int64_t count = 1;
    for (int64_t d : t.shape) count *= d;
    if (!is_float(t.dtype) || count != n) shape_error(t, {n}, "float (any shape with that count)");
    TM_CHECK(t.data != nullptr, "{}: tensor '{}' has no data", t.file, t.name);
    std::vector<float> v(static_cast<size_t>(n));
    convert_to_f32(t.dtype, t.data, v.data(), v.size());
    if (plus_one) {
      for (float& x : v) x += 1.0f;
    }
    return v;
  }

  Vec vec(const std::string& name, int64_t n) { return store_.upload_vec(host_vec(name, n)); }
  // A zero-centered RMSNorm weight: HF stores w (multiply by 1+w), MLX stores 1+w.
  Vec norm(const std::string& name, int64_t n) {
    return store_.upload_vec(host_vec(name, n, !ckpt_.norms_stored_plus_one()));
  }

  FFNWeights dense_mlp(const std::string& p, int64_t hidden, int64_t inter) {
    FFNWeights f;
    f.gate_proj = linear(p + ".gate_proj", inter, hidden);
    f.up_proj = linear(p + ".up_proj", inter, hidden);
    f.down_proj = linear(p + ".down_proj", hidden, inter);
    return f;
  }

  void experts(const std::string& p, FFNWeights& f) {
    const int64_t E = cfg_.num_experts, I = cfg_.moe_intermediate_size, H = cfg_.hidden_size;
    if (ckpt_.find(p + ".switch_mlp.gate_proj.weight") != nullptr) {
      f.experts_gate = linear(p + ".switch_mlp.gate_proj", I, H, E);
      f.experts_up = linear(p + ".switch_mlp.up_proj", I, H, E);
      f.experts_down = linear(p + ".switch_mlp.down_proj", H, I, E);
    } else if (ckpt_.find(p + ".experts.gate_up_proj") != nullptr) {
      // HF fused layout: gate_up_proj [E, 2I, H] with the gate rows first; down_proj [E, H, I].
      const TensorInfo& gu = get(p + ".experts.gate_up_proj");
      if (!is_float(gu.dtype) || gu.shape != std::vector<int64_t>{E, 2 * I, H}) {
        shape_error(gu, {E, 2 * I, H}, "float (fused gate and up, gate first)");
      }
      size_t es = dtype_size(gu.dtype), mat = static_cast<size_t>(I * H) * es;
      uint8_t* gate = store_.host_buffer(mat * E);
      uint8_t* up = store_.host_buffer(mat * E);
      for (int64_t e = 0; e < E; ++e) {
        std::memcpy(gate + e * mat, gu.data + e * 2 * mat, mat);
        std::memcpy(up + e * mat, gu.data + e * 2 * mat + mat, mat);
      }
      f.experts_gate = stacked(gate, gu.dtype, I, H, E);
      f.experts_up = stacked(up, gu.dtype, I, H, E);
      const TensorInfo& dn = get(p + ".experts.down_proj");
      if (dn.dtype != gu.dtype || dn.shape != std::vector<int64_t>{E, H, I}) {
        shape_error(dn, {E, H, I}, dtype_name(gu.dtype));
      }
      f.experts_down = stacked(dn.data, dn.dtype, H, I, E);
    } else {
      // Per-expert tensors (transformers 5 saves these): stacked into one host buffer.
      f.experts_gate = per_expert(p, "gate_proj", I, H, E);
      f.experts_up = per_expert(p, "up_proj", I, H, E);
      f.experts_down = per_expert(p, "down_proj", H, I, E);
    }
  }

  int64_t bytes() const { return bytes_; }
  int64_t expert_bytes() const { return expert_bytes_; }
  int64_t elements() const { return elements_; }
  int64_t expert_elements() const { return expert_elements_; }

 private:
  Weight stacked(const void* data, DType dt, int64_t rows, int64_t cols, int64_t E) {
    Weight w;
    w.dtype = dt;
    w.rows = rows;
    w.cols = cols;
    w.experts = E;
    w.data = data;
    count(w);
    return store_.upload(w);
  }

  Weight per_expert(const std::string& p, const char* proj, int64_t rows, int64_t cols, int64_t E) {
    const TensorInfo& first = get(fmt::format("{}.experts.0.{}.weight", p, proj));
    if (!is_float(first.dtype)) shape_error(first, {rows, cols}, "BF16, F16 or F32");
    size_t mat = static_cast<size_t>(rows * cols) * dtype_size(first.dtype);
    uint8_t* buf = store_.host_buffer(mat * E);
    for (int64_t e = 0; e < E; ++e) {
      const TensorInfo& t = get(fmt::format("{}.experts.{}.{}.weight", p, e, proj));
      if (t.dtype != first.dtype || t.shape != std::vector<int64_t>{rows, cols}) {
        shape_error(t, {rows, cols}, dtype_name(first.dtype));
      }
      std::memcpy(buf + e * mat, t.data, mat);
    }
    return stacked(buf, first.dtype, rows, cols, E);
  }

  void count(const Weight& w) {
    const auto b = static_cast<int64_t>(w.total_bytes());
    const int64_t e = w.rows * w.cols * std::max<int64_t>(w.experts, 1);
    bytes_ += b;
    elements_ += e;
    if (w.experts > 0) {
      expert_bytes_ += b;
      expert_elements_ += e;
    }
  }

  Checkpoint& ckpt_;
  const ModelConfig& cfg_;
  WeightStore& store_;
  int64_t bytes_ = 0;
  int64_t expert_bytes_ = 0;                    // stacked expert matrices (a token reads k of E)
  int64_t elements_ = 0, expert_elements_ = 0;  // the same in matrix elements
};

LayerWeights bind_layer(Binder& b, const ModelConfig& cfg, const std::string& p, LayerKind kind) {
  const int64_t H = cfg.hidden_size;
  LayerWeights L;
  L.kind = kind;
  L.input_norm = b.norm(p + ".input_layernorm.weight", H);
  L.post_norm = b.norm(p + ".post_attention_layernorm.weight", H);
  if (kind == LayerKind::kFullAttention) {
    const int64_t D = cfg.head_dim, Hq = cfg.num_heads, Hkv = cfg.num_kv_heads;
    const int64_t q_rows = Hq * D * (cfg.attn_output_gate ? 2 : 1);
    L.attn.q_proj = b.linear(p + ".self_attn.q_proj", q_rows, H);
    L.attn.k_proj = b.linear(p + ".self_attn.k_proj", Hkv * D, H);
    L.attn.v_proj = b.linear(p + ".self_attn.v_proj", Hkv * D, H);
    L.attn.o_proj = b.linear(p + ".self_attn.o_proj", H, Hq * D);
    L.attn.q_norm = b.norm(p + ".self_attn.q_norm.weight", D);
    L.attn.k_norm = b.norm(p + ".self_attn.k_norm.weight", D);
  } else {
    const int64_t Hk = cfg.linear_num_key_heads, Hv = cfg.linear_num_value_heads;
    const int64_t Dk = cfg.linear_key_head_dim, Dv = cfg.linear_value_head_dim;
    const int64_t C = 2 * Hk * Dk + Hv * Dv, K = cfg.linear_conv_kernel_dim;
    const std::string a = p + ".linear_attn";
    L.gdn.in_proj_qkv = b.linear(a + ".in_proj_qkv", C, H);
    L.gdn.in_proj_z = b.linear(a + ".in_proj_z", Hv * Dv, H);
    L.gdn.in_proj_b = b.linear(a + ".in_proj_b", Hv, H);
    L.gdn.in_proj_a = b.linear(a + ".in_proj_a", Hv, H);
    L.gdn.out_proj = b.linear(a + ".out_proj", H, Hv * Dv);
    // conv1d weight: HF [C, 1, K], MLX [C, K, 1]: both are c*K + k in memory.
    L.gdn.conv = b.vec(a + ".conv1d.weight", C * K);
    L.gdn.a_log = b.vec(a + ".A_log", Hv);
    L.gdn.dt_bias = b.vec(a + ".dt_bias", Hv);
    L.gdn.norm = b.vec(a + ".norm.weight", Dv);  // gated norm: plain weight, never shifted
  }
  if (cfg.is_moe) {
    FFNWeights& f = L.ffn;
    f.moe = true;
    const std::string m = p + ".mlp";
    f.router = b.linear(m + ".gate", cfg.num_experts, H);
    b.experts(m, f);
    if (cfg.shared_expert_intermediate_size > 0) {
      FFNWeights s = b.dense_mlp(m + ".shared_expert", H, cfg.shared_expert_intermediate_size);
      f.gate_proj = s.gate_proj;
      f.up_proj = s.up_proj;
      f.down_proj = s.down_proj;
      f.has_shared = true;
      f.shared_gate = b.linear(m + ".shared_expert_gate", 1, H);
    }
  } else {
    L.ffn = b.dense_mlp(p + ".mlp", H, cfg.intermediate_size);
  }
  return L;
}

}  // namespace

ModelWeights bind_weights(Checkpoint& ckpt, const ModelConfig& cfg, WeightStore& store,
                          bool with_mtp) {
  Binder b(ckpt, cfg, store);
  ModelWeights w;
  const int64_t V = cfg.vocab_size, H = cfg.hidden_size;
  w.embed = b.linear("embed_tokens", V, H);
  const int64_t embed_bytes = b.bytes();
  w.final_norm = b.norm("norm.weight", H);
  w.layers.reserve(static_cast<size_t>(cfg.num_layers));
  const int64_t elements0 = b.elements(), expert_elements0 = b.expert_elements();
  for (int i = 0; i < cfg.num_layers; ++i) {
    w.layers.push_back(bind_layer(b, cfg, fmt::format("layers.{}", i), cfg.layer_types[i]));
  }
  const int64_t layer_experts = b.expert_elements() - expert_elements0;
  w.layer_macs_per_token =
      b.elements() - elements0 - layer_experts +
      (cfg.num_experts > 0 ? layer_experts * cfg.num_experts_per_tok / cfg.num_experts : 0);
  const bool tied = cfg.tie_word_embeddings && ckpt.find("lm_head.weight") == nullptr;
  w.lm_head = tied ? w.embed : b.linear("lm_head", V, H);
  w.stored_bytes = b.bytes();
  // Bytes one decoded token reads: every layer and the head, one embedding row, and of the
  // stacked experts only the k a token is routed to.
  const int64_t experts = b.expert_bytes();
  const int64_t routed =
      cfg.num_experts > 0 ? experts * cfg.num_experts_per_tok / cfg.num_experts : experts;
  w.weight_bytes =
      b.bytes() - experts + routed - embed_bytes + (tied ? embed_bytes : 0) + embed_bytes / V;
  if (with_mtp && cfg.mtp_num_hidden_layers > 0 && ckpt.find("mtp.fc.weight") != nullptr) {
    MtpWeights& m = w.mtp;
    m.present = true;
    m.fc = b.linear("mtp.fc", H, 2 * H);
    m.pre_fc_norm_embedding = b.norm("mtp.pre_fc_norm_embedding.weight", H);
    m.pre_fc_norm_hidden = b.norm("mtp.pre_fc_norm_hidden.weight", H);
    m.norm = b.norm("mtp.norm.weight", H);
    m.layer = bind_layer(b, cfg, "mtp.layers.0", LayerKind::kFullAttention);
  }
  for (const std::string& name : ckpt.unused_tensors()) {
    log::warn("{}: tensor '{}' is not used by the model", ckpt.dir(), name);
  }
  return w;
}

}  // namespace tokenmill
