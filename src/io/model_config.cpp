#include "io/model_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "util/error.h"

namespace tokenmill {

namespace {

using json = nlohmann::json;

constexpr const char* kSupportedTypes =
    "qwen3_5, qwen3_5_moe, qwen3_5_text, qwen3_5_moe_text, qwen3_next";

// A JSON value for an error message: never throws (invalid UTF-8 is replaced), kept short.
std::string show(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

// Typed, range-checked access to one JSON object; `prefix` names it in messages
// ("text_config." or "").
class Reader {
 public:
  Reader(const json& obj, std::string prefix, std::string src, std::string type)
      : obj_(obj), prefix_(std::move(prefix)), src_(std::move(src)), type_(std::move(type)) {}

  const json* find(const std::string& key) const {
    if (!obj_.is_object()) return nullptr;
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  bool has(const std::string& key) const { return find(key) != nullptr; }
  std::string where(const std::string& key) const { return prefix_ + key; }

  [[noreturn]] void missing(const std::string& key) const {
    if (type_.empty()) fail("{}: required key '{}' is missing", src_, where(key));
    fail("{}: required key '{}' is missing (model_type {})", src_, where(key), type_);
  }

  int64_t integer(const std::string& key, int64_t lo, int64_t hi,
                  std::optional<int64_t> def = std::nullopt) const {
    const json* v = find(key);
    if (v == nullptr) {
      if (!def) missing(key);
      return *def;
    }
    bool ok = v->is_number_integer();
    int64_t x = 0;
    if (ok && v->is_number_unsigned()) {
      uint64_t u = v->get<uint64_t>();
      ok = u <= static_cast<uint64_t>(hi);
      x = ok ? static_cast<int64_t>(u) : 0;
    } else if (ok) {
      x = v->get<int64_t>();
    }
    if (!ok || x < lo || x > hi) {
      fail("{}: '{}' is {}; expected an integer in [{}, {}]", src_, where(key), show(*v), lo, hi);
    }
    return x;
  }

  double number(const std::string& key, double lo, double hi, double def) const {
    const json* v = find(key);
    if (v == nullptr) return def;
    double x = v->is_number() ? v->get<double>() : std::nan("");
    if (!(x >= lo && x <= hi)) {
      fail("{}: '{}' is {}; expected a number in [{}, {}]", src_, where(key), show(*v), lo, hi);
    }
    return x;
  }

  bool boolean(const std::string& key, bool def) const {
    const json* v = find(key);
    if (v == nullptr) return def;
    if (!v->is_boolean())
      fail("{}: '{}' is {}; expected true or false", src_, where(key), show(*v));
    return v->get<bool>();
  }

  const std::string& src() const { return src_; }

 private:
  const json& obj_;
  std::string prefix_;
  std::string src_;
  std::string type_;  // model_type for messages; empty outside the model fields
};

constexpr int64_t kMaxDim = int64_t{1} << 24;  // generous bound that keeps products in int64
constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();

void parse_layer_types(const Reader& r, ModelConfig* c) {
  if (const json* lt = r.find("layer_types")) {
    if (!lt->is_array() || lt->size() != static_cast<size_t>(c->num_layers)) {
      fail("{}: '{}' must be a list of {} entries (num_hidden_layers), got {}", r.src(),
           r.where("layer_types"), c->num_layers, show(*lt));
    }
    for (size_t i = 0; i < lt->size(); ++i) {
      const json& e = (*lt)[i];
      if (e == "linear_attention") {
        c->layer_types.push_back(LayerKind::kLinearAttention);
      } else if (e == "full_attention") {
        c->layer_types.push_back(LayerKind::kFullAttention);
      } else {
        fail("{}: '{}[{}]' is {}; supported: \"linear_attention\", \"full_attention\"", r.src(),
             r.where("layer_types"), i, show(e));
      }
    }
    return;
  }
  int64_t interval = r.integer("full_attention_interval", 1, kMaxInt, 4);
  for (int i = 0; i < c->num_layers; ++i) {
    c->layer_types.push_back((i + 1) % interval == 0 ? LayerKind::kFullAttention
                                                     : LayerKind::kLinearAttention);
  }
}

void parse_attention(const Reader& r, ModelConfig* c) {
  c->num_heads = static_cast<int>(r.integer("num_attention_heads", 1, 65536));
  c->num_kv_heads = static_cast<int>(r.integer("num_key_value_heads", 1, c->num_heads));
  if (c->num_heads % c->num_kv_heads != 0) {
    fail("{}: '{}' = {} is not a multiple of '{}' = {}", r.src(), r.where("num_attention_heads"),
         c->num_heads, r.where("num_key_value_heads"), c->num_kv_heads);
  }
  c->head_dim = static_cast<int>(
      r.integer("head_dim", 1, 65536, std::max<int64_t>(1, c->hidden_size / c->num_heads)));
  c->attn_output_gate = r.boolean("attn_output_gate", true);
  // RoPE: Qwen3.5 nests it in rope_parameters; Qwen3-Next keeps it at the top level.
  if (const json* rp = r.find("rope_parameters")) {
    if (!rp->is_object()) {
      fail("{}: '{}' is {}; expected an object", r.src(), r.where("rope_parameters"), show(*rp));
    }
    Reader rr(*rp, r.where("rope_parameters."), r.src(), c->model_type);
    c->rope_theta = rr.number("rope_theta", 1e-3, 1e30, r.number("rope_theta", 1e-3, 1e30, 1e7));
    c->partial_rotary_factor = rr.number("partial_rotary_factor", 1e-9, 1.0,
                                         r.number("partial_rotary_factor", 1e-9, 1.0, 0.25));
  } else {
    c->rope_theta = r.number("rope_theta", 1e-3, 1e30, 1e7);
    c->partial_rotary_factor = r.number("partial_rotary_factor", 1e-9, 1.0, 0.25);
  }
  c->rotary_dim = static_cast<int>(std::lround(c->head_dim * c->partial_rotary_factor));
  if (c->rotary_dim < 2 || c->rotary_dim % 2 != 0) {
    fail(
        "{}: head_dim {} * partial_rotary_factor {} gives {} rotary dims; expected an even "
        "number >= 2",
        r.src(), c->head_dim, c->partial_rotary_factor, c->rotary_dim);
  }
}

void parse_linear_attention(const Reader& r, ModelConfig* c) {
  c->linear_conv_kernel_dim = static_cast<int>(r.integer("linear_conv_kernel_dim", 1, 64, 4));
  if (c->num_linear_attention_layers() == 0) return;
  c->linear_num_key_heads = static_cast<int>(r.integer("linear_num_key_heads", 1, 65536));
  c->linear_num_value_heads = static_cast<int>(r.integer("linear_num_value_heads", 1, 65536));
  c->linear_key_head_dim = static_cast<int>(r.integer("linear_key_head_dim", 1, 65536));
  c->linear_value_head_dim = static_cast<int>(r.integer("linear_value_head_dim", 1, 65536));
  if (c->linear_num_value_heads % c->linear_num_key_heads != 0) {
    fail("{}: '{}' = {} is not a multiple of '{}' = {}", r.src(), r.where("linear_num_value_heads"),
         c->linear_num_value_heads, r.where("linear_num_key_heads"), c->linear_num_key_heads);
  }
}

void parse_moe(const Reader& r, ModelConfig* c) {
  c->num_experts = static_cast<int>(r.integer("num_experts", 1, 65536));
  c->num_experts_per_tok = static_cast<int>(r.integer("num_experts_per_tok", 1, c->num_experts));
  c->moe_intermediate_size = r.integer("moe_intermediate_size", 1, kMaxDim);
  c->shared_expert_intermediate_size = r.integer("shared_expert_intermediate_size", 0, kMaxDim, 0);
  // Qwen3.5-MoE always renormalises the top-k weights; Qwen3-Next says so in norm_topk_prob.
  c->norm_topk_prob = r.boolean("norm_topk_prob", true);
  if (r.integer("decoder_sparse_step", 1, kMaxInt, 1) != 1) {
    fail("{}: '{}' = {} is not supported yet (only every layer sparse: 1)", r.src(),
         r.where("decoder_sparse_step"), show(*r.find("decoder_sparse_step")));
  }
  if (const json* m = r.find("mlp_only_layers"); m != nullptr && !(m->is_array() && m->empty())) {
    fail("{}: '{}' = {} is not supported yet (dense layers inside a MoE model); expected []",
         r.src(), r.where("mlp_only_layers"), show(*m));
  }
}

std::optional<int32_t> token_id(const Reader& text, const Reader& outer, const std::string& key) {
  for (const Reader* r : {&text, &outer}) {
    if (r->has(key)) return static_cast<int32_t>(r->integer(key, 0, kMaxInt));
  }
  return std::nullopt;
}

void parse_eos(const Reader& text, const Reader& outer, ModelConfig* c) {
  for (const Reader* r : {&text, &outer}) {
    const json* v = r->find("eos_token_id");
    if (v == nullptr) continue;
    if (v->is_array()) {
      for (const json& e : *v) {
        // Signed or unsigned JSON integers (parsed text gives unsigned, built values signed).
        const bool ok = e.is_number_integer() && e.get<int64_t>() >= 0 &&
                        (e.is_number_unsigned() ? e.get<uint64_t>() <= uint64_t{kMaxInt}
                                                : e.get<int64_t>() <= kMaxInt);
        if (!ok) {
          fail("{}: '{}' contains {}; expected token ids (non-negative integers)", r->src(),
               r->where("eos_token_id"), show(e));
        }
        c->eos_token_ids.push_back(static_cast<int32_t>(e.get<int64_t>()));
      }
    } else {
      c->eos_token_ids.push_back(static_cast<int32_t>(r->integer("eos_token_id", 0, kMaxInt)));
    }
    return;
  }
}

QuantParams parse_quant_entry(const json& v, const QuantParams& def, const std::string& where,
                              const std::string& src) {
  QuantParams q = def;
  Reader r(v, where + ".", src, "");
  // The top-level entry must say both; overrides inherit what they leave out.
  auto inherit = [](int d) { return d ? std::optional<int64_t>(d) : std::nullopt; };
  q.bits = static_cast<int>(r.integer("bits", 0, 64, inherit(def.bits)));
  q.group = static_cast<int>(r.integer("group_size", 0, 1 << 20, inherit(def.group)));
  if (const json* m = r.find("mode")) {
    if (*m != "affine") {
      bool known = *m == "mxfp4" || *m == "mxfp8" || *m == "nvfp4";
      fail("{}: '{}' is {}: {}; supported: \"affine\" (MLX 2-8 bit)", src, r.where("mode"),
           show(*m), known ? "this quantization mode is not supported yet" : "unknown mode");
    }
  }
  if (q.bits != 2 && q.bits != 3 && q.bits != 4 && q.bits != 5 && q.bits != 6 && q.bits != 8) {
    fail("{}: '{}' is {}; supported bits: 2, 3, 4, 5, 6, 8", src, r.where("bits"), q.bits);
  }
  if (q.group != 32 && q.group != 64 && q.group != 128) {
    fail("{}: '{}' is {}; supported group sizes: 32, 64, 128", src, r.where("group_size"), q.group);
  }
  return q;
}

void parse_quantization(const json& outer, const json& text, const std::string& src,
                        ModelConfig* c) {
  const json* q = nullptr;
  std::string key;
  for (const json* o : {&outer, &text}) {
    for (const char* k : {"quantization", "quantization_config"}) {
      if (q == nullptr && o->contains(k) && !(*o)[k].is_null()) {
        q = &(*o)[k];
        key = (o == &outer ? std::string() : std::string("text_config.")) + k;
      }
    }
  }
  if (q == nullptr) return;
  if (!q->is_object()) fail("{}: '{}' is {}; expected an object", src, key, show(*q));
  if (auto m = q->find("quant_method"); m != q->end() && *m != "mlx") {
    fail(
        "{}: '{}.quant_method' is {}: this quantization is not supported yet; supported: MLX "
        "affine (\"quantization\": {{\"group_size\", \"bits\"}}) or unquantized bf16/f16/f32",
        src, key, show(*m));
  }
  c->quant = parse_quant_entry(*q, QuantParams{}, key, src);
  for (const auto& [k, v] : q->items()) {
    if (v.is_object()) {
      c->quant_overrides[k] = parse_quant_entry(v, c->quant, key + "." + k, src);
    } else if (v.is_boolean()) {
      // mlx-lm writes `false` for modules its predicate left in float.
      c->quant_overrides[k] = v.get<bool>() ? c->quant : QuantParams{};
    }
  }
}

}  // namespace

QuantParams ModelConfig::quant_for(const std::string& module_path_as_in_file) const {
  auto it = quant_overrides.find(module_path_as_in_file);
  return it == quant_overrides.end() ? quant : it->second;
}

int ModelConfig::num_full_attention_layers() const {
  int n = 0;
  for (LayerKind k : layer_types) n += k == LayerKind::kFullAttention;
  return n;
}

int ModelConfig::num_linear_attention_layers() const {
  return static_cast<int>(layer_types.size()) - num_full_attention_layers();
}

const char* layer_kind_name(LayerKind k) {
  return k == LayerKind::kFullAttention ? "full_attention" : "linear_attention";
}

ModelConfig parse_model_config(const json& j, const std::string& src) {
  if (!j.is_object()) fail("{}: expected a JSON object at the top level, got {}", src, show(j));
  ModelConfig c;
  auto mt = j.find("model_type");
  if (mt == j.end() || !mt->is_string()) {
    fail("{}: 'model_type' is missing or not a string; supported: {}", src, kSupportedTypes);
  }
  c.model_type = mt->get<std::string>();
  const std::string& t = c.model_type;
  bool wrapper = t == "qwen3_5" || t == "qwen3_5_moe";
  if (!wrapper && t != "qwen3_5_text" && t != "qwen3_5_moe_text" && t != "qwen3_next") {
    fail("{}: model_type '{}' is not supported; supported: {}", src, t, kSupportedTypes);
  }
  c.is_moe = t == "qwen3_5_moe" || t == "qwen3_5_moe_text" || t == "qwen3_next";

  // The text fields: nested under text_config for the VL wrappers when present.
  const json* text = &j;
  std::string prefix;
  if (wrapper && j.contains("text_config") && !j["text_config"].is_null()) {
    text = &j["text_config"];
    prefix = "text_config.";
    if (!text->is_object()) fail("{}: 'text_config' is {}; expected an object", src, show(*text));
    if (auto tt = text->find("model_type"); tt != text->end() && *tt != t + "_text") {
      fail("{}: 'text_config.model_type' is {} but model_type '{}' expects \"{}_text\"", src,
           show(*tt), t, t, t);
    }
  }
  Reader r(*text, prefix, src, t);
  Reader outer(j, "", src, t);

  c.vocab_size = r.integer("vocab_size", 1, kMaxDim);
  c.hidden_size = r.integer("hidden_size", 1, kMaxDim);
  c.num_layers = static_cast<int>(r.integer("num_hidden_layers", 1, 100000));
  c.rms_norm_eps = r.number("rms_norm_eps", 1e-30, 1.0, 1e-6);
  c.tie_word_embeddings =
      r.boolean("tie_word_embeddings", outer.boolean("tie_word_embeddings", false));
  c.max_position_embeddings = r.integer("max_position_embeddings", 0, kMaxInt, 0);
  parse_layer_types(r, &c);
  parse_attention(r, &c);
  parse_linear_attention(r, &c);
  if (c.is_moe && t == "qwen3_next" && !r.has("num_experts")) c.is_moe = false;
  if (c.is_moe) {
    parse_moe(r, &c);
    c.intermediate_size = r.integer("intermediate_size", 0, kMaxDim, 0);
  } else {
    c.intermediate_size = r.integer("intermediate_size", 1, kMaxDim);
  }
  c.mtp_num_hidden_layers =
      static_cast<int>(t == "qwen3_next" ? r.integer("num_nextn_predict_layers", 0, 64, 0)
                                         : r.integer("mtp_num_hidden_layers", 0, 64, 0));
  parse_eos(r, outer, &c);
  c.bos_token_id = token_id(r, outer, "bos_token_id");
  c.pad_token_id = token_id(r, outer, "pad_token_id");
  parse_quantization(j, *text, src, &c);
  return c;
}

ModelConfig parse_model_config_text(std::string_view text, const std::string& src) {
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    fail("{}: not valid JSON ({})", src, e.what());
  }
  return parse_model_config(j, src);
}

ModelConfig load_model_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open the model config (does the directory hold a config.json?)", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_model_config_text(ss.str(), path);
}

}  // namespace tokenmill
