#include "io/model_summary.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "util/error.h"

namespace tokenmill {

namespace fs = std::filesystem;

namespace {

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// A chat template ships as chat_template.jinja, chat_template.json or a "chat_template" key of
// tokenizer_config.json. An unreadable tokenizer_config.json counts as "no template" here: the
// tokenizer module reports it properly when the model is served.
bool has_chat_template(const fs::path& dir) {
  if (fs::exists(dir / "chat_template.jinja") || fs::exists(dir / "chat_template.json"))
    return true;
  std::ifstream in(dir / "tokenizer_config.json", std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  auto j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("chat_template") && !j["chat_template"].is_null();
}

std::string format_name(const QuantParams& q) {
  if (q.bits == 0) return "affine (bits unknown: config.json has no quantization)";
  return fmt::format("affine q{} g{}", q.bits, q.group);
}

}  // namespace

std::string layer_pattern(const ModelConfig& c) {
  std::string s;
  for (LayerKind k : c.layer_types) s += k == LayerKind::kFullAttention ? 'F' : 'L';
  const size_t n = s.size();
  for (size_t p = 1; p <= n; ++p) {
    if (n % p != 0) continue;
    bool repeats = true;
    for (size_t i = p; i < n && repeats; ++i) repeats = s[i] == s[i - p];
    if (repeats) return fmt::format("{} x {}", s.substr(0, p), n / p);
  }
  return s;  // empty
}

int64_t kv_bytes_per_token(const ModelConfig& c) {
  return int64_t{c.num_full_attention_layers()} * 2 * c.num_kv_heads * c.head_dim * 4;
}

int64_t mtp_kv_bytes_per_token(const ModelConfig& c) {
  return int64_t{c.mtp_num_hidden_layers} * 2 * c.num_kv_heads * c.head_dim * 4;
}

int64_t gdn_state_bytes_per_sequence(const ModelConfig& c) {
  const int64_t conv = int64_t{c.linear_conv_kernel_dim - 1} * c.linear_conv_channels();
  const int64_t ssm =
      int64_t{c.linear_num_value_heads} * c.linear_key_head_dim * c.linear_value_head_dim;
  return int64_t{c.num_linear_attention_layers()} * (conv + ssm) * 4;
}

std::string format_bytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (int64_t{1} << 30)) return fmt::format("{:.2f} GiB", b / (1 << 30));
  if (bytes >= (int64_t{1} << 20)) return fmt::format("{:.1f} MiB", b / (1 << 20));
  if (bytes >= (int64_t{1} << 10)) return fmt::format("{:.1f} KiB", b / (1 << 10));
  return fmt::format("{} B", bytes);
}

ModelSummary summarize(const Checkpoint& ck, int64_t context) {
  const ModelConfig& c = ck.config();
  ModelSummary s;
  s.dir = ck.dir();
  s.model_type = c.model_type;
  s.layout = layout_name(ck.layout());
  s.is_moe = c.is_moe;
  s.norms_stored_plus_one = ck.norms_stored_plus_one();
  s.hidden_size = c.hidden_size;
  s.vocab_size = c.vocab_size;
  s.num_layers = c.num_layers;
  s.full_layers = c.num_full_attention_layers();
  s.linear_layers = c.num_linear_attention_layers();
  s.layer_pattern = layer_pattern(c);
  s.quant = c.quant;
  s.quant_overrides = c.quant_overrides.size();
  s.mtp_tensors = ck.mtp_tensor_count();
  s.vision_tensors = ck.vision_tensor_count();
  s.weight_bytes = ck.total_bytes();
  s.mtp_weight_bytes = ck.mtp_bytes();

  // A module is MLX-quantized when "<m>.scales" sits beside a U32 "<m>.weight"; its weight,
  // scales and biases are one format, and the weight holds 32/bits logical elements per word.
  std::map<std::string, FormatBytes> by_format;
  for (const TensorInfo& t : ck.tensors()) {
    std::string module, suffix;
    if (size_t dot = t.canonical.rfind('.'); dot != std::string::npos) {
      module = t.canonical.substr(0, dot);
      suffix = t.canonical.substr(dot + 1);
    }
    const TensorInfo* scales = module.empty() ? nullptr : ck.find(module + ".scales");
    const TensorInfo* weight = module.empty() ? nullptr : ck.find(module + ".weight");
    const bool quantized = scales != nullptr && weight != nullptr && weight->dtype == DType::U32 &&
                           (suffix == "weight" || suffix == "scales" || suffix == "biases");
    std::string fmt_name = lower(dtype_name(t.dtype));
    int64_t params = t.numel();
    if (quantized) {
      QuantParams q = c.quant_for(ck.module_path_in_file(module));
      fmt_name = format_name(q);
      if (suffix != "weight")
        params = 0;
      else if (q.bits > 0)
        params = params * 32 / q.bits;
      if (suffix == "weight") ++s.quantized_modules;
    }
    FormatBytes& fb = by_format[fmt_name];
    fb.format = fmt_name;
    fb.bytes += static_cast<int64_t>(t.nbytes);
    if (!quantized || suffix == "weight") ++fb.tensors;
    (t.mtp ? s.mtp_params : s.params) += params;
  }
  for (auto& [name, fb] : by_format) s.bytes_by_format.push_back(fb);
  std::sort(s.bytes_by_format.begin(), s.bytes_by_format.end(),
            [](const auto& a, const auto& b) { return a.bytes > b.bytes; });

  const fs::path dir(ck.dir());
  s.has_tokenizer = fs::exists(dir / "tokenizer.json");
  s.has_chat_template = has_chat_template(dir);

  s.kv_bytes_per_token = kv_bytes_per_token(c);
  s.mtp_kv_bytes_per_token = ck.mtp_tensor_count() > 0 ? mtp_kv_bytes_per_token(c) : 0;
  s.gdn_state_bytes_per_sequence = gdn_state_bytes_per_sequence(c);
  s.context = context;
  s.cache_bytes_per_sequence = s.kv_bytes_per_token * context + s.gdn_state_bytes_per_sequence;
  return s;
}

nlohmann::ordered_json summary_to_json(const ModelSummary& s) {
  nlohmann::ordered_json formats = nlohmann::ordered_json::array();
  for (const auto& f : s.bytes_by_format) {
    formats.push_back({{"format", f.format}, {"bytes", f.bytes}, {"tensors", f.tensors}});
  }
  nlohmann::ordered_json j = {
      {"dir", s.dir},
      {"model_type", s.model_type},
      {"layout", s.layout},
      {"moe", s.is_moe},
      {"norms_stored_plus_one", s.norms_stored_plus_one},
      {"hidden_size", s.hidden_size},
      {"vocab_size", s.vocab_size},
      {"num_layers", s.num_layers},
      {"full_attention_layers", s.full_layers},
      {"linear_attention_layers", s.linear_layers},
      {"layer_pattern", s.layer_pattern},
      {"params", s.params},
      {"mtp_params", s.mtp_params},
      {"bytes_by_format", formats},
      {"quantization", s.quant.bits == 0
                           ? nlohmann::ordered_json(nullptr)
                           : nlohmann::ordered_json{{"bits", s.quant.bits},
                                                    {"group_size", s.quant.group},
                                                    {"overrides", s.quant_overrides},
                                                    {"quantized_modules", s.quantized_modules}}},
      {"mtp_tensors", s.mtp_tensors},
      {"vision_tensors_skipped", s.vision_tensors},
      {"tokenizer_json", s.has_tokenizer},
      {"chat_template", s.has_chat_template},
      {"weight_bytes", s.weight_bytes},
      {"mtp_weight_bytes", s.mtp_weight_bytes},
      {"kv_dtype", "f32"},
      {"kv_bytes_per_token", s.kv_bytes_per_token},
      {"mtp_kv_bytes_per_token", s.mtp_kv_bytes_per_token},
      {"gdn_state_bytes_per_sequence", s.gdn_state_bytes_per_sequence},
      {"context", s.context},
      {"cache_bytes_per_sequence", s.cache_bytes_per_sequence},
  };
  return j;
}

std::string summary_to_text(const ModelSummary& s) {
  std::string o;
  auto line = [&o](std::string_view key, const std::string& value) {
    o += fmt::format("{:<22}{}\n", key.empty() ? std::string() : std::string(key) + ":", value);
  };
  line("model", s.dir);
  line("architecture",
       fmt::format("{} ({}), hidden {}, {} layers, vocab {}", s.model_type,
                   s.is_moe ? "MoE" : "dense", s.hidden_size, s.num_layers, s.vocab_size));
  line("layer pattern", fmt::format("{} ({} linear attention, {} full attention)", s.layer_pattern,
                                    s.linear_layers, s.full_layers));
  line("tensor layout",
       fmt::format("{}{}", s.layout, s.norms_stored_plus_one ? " (norms stored as 1+w)" : ""));
  line("parameters", fmt::format("{} (text model), {} (MTP)", s.params, s.mtp_params));
  size_t width = 0;
  for (const auto& f : s.bytes_by_format) width = std::max(width, f.format.size());
  for (size_t i = 0; i < s.bytes_by_format.size(); ++i) {
    const FormatBytes& f = s.bytes_by_format[i];
    line(i == 0 ? "weights by format" : "",
         fmt::format("{:<{}}  {} ({} tensors)", f.format, width, format_bytes(f.bytes), f.tensors));
  }
  if (s.quant.bits == 0) {
    line("quantization", "none");
  } else {
    line("quantization",
         fmt::format("affine q{} g{} default, {} overrides, {} quantized modules", s.quant.bits,
                     s.quant.group, s.quant_overrides, s.quantized_modules));
  }
  line("mtp tensors", fmt::format("{}", s.mtp_tensors));
  if (s.vision_tensors > 0) line("vision tensors", fmt::format("{} (skipped)", s.vision_tensors));
  line("tokenizer.json", s.has_tokenizer ? "present" : "missing");
  line("chat template", s.has_chat_template ? "present" : "missing");
  line("weight memory", fmt::format("{} ({} bytes) + MTP {}", format_bytes(s.weight_bytes),
                                    s.weight_bytes, format_bytes(s.mtp_weight_bytes)));
  line("kv cache per token",
       fmt::format("{} bytes (f32, half in bf16; {} full-attention layers){}", s.kv_bytes_per_token,
                   s.full_layers,
                   s.mtp_kv_bytes_per_token > 0
                       ? fmt::format(" + MTP {} bytes", s.mtp_kv_bytes_per_token)
                       : std::string()));
  line("gdn state per seq", fmt::format("{} bytes (f32; {} linear-attention layers)",
                                        s.gdn_state_bytes_per_sequence, s.linear_layers));
  line("cache per sequence",
       fmt::format("{} ({} bytes) at context {}", format_bytes(s.cache_bytes_per_sequence),
                   s.cache_bytes_per_sequence, s.context));
  return o;
}

}  // namespace tokenmill
