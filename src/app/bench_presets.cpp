#include "app/bench_presets.h"

#include <fmt/format.h>

#include <regex>

#include "tensor/affine.h"
#include "util/error.h"

namespace tokenmill::app {

namespace {

std::vector<BenchPreset> make_presets() {
  std::vector<BenchPreset> p;
  {
    // Qwen3.5-27B: hidden 5120, 64 layers (every 4th full attention), 24 q / 4 kv heads of 256,
    // GDN 16 key / 48 value heads of 128, conv 4, MLP 17408, vocab 248320, untied head.
    SyntheticSpec s;
    s.vocab = 248320;
    s.hidden = 5120;
    s.intermediate = 17408;
    s.layers = 64;
    s.heads = 24;
    s.kv_heads = 4;
    s.head_dim = 256;
    s.k_heads = 16;
    s.v_heads = 48;
    s.k_dim = 128;
    s.v_dim = 128;
    s.max_position = 262144;
    p.push_back({"qwen3.5-27b", "Qwen3.5-27B shape (dense, 64 layers)", s});
  }
  {
    // Qwen3.5-35B-A3B: hidden 2048, 40 layers, 16/2 heads of 256, GDN 16/32 heads of 128,
    // 256 experts with 8 per token, expert and shared-expert MLP 512.
    SyntheticSpec s;
    s.moe = true;
    s.vocab = 248320;
    s.hidden = 2048;
    s.layers = 40;
    s.heads = 16;
    s.kv_heads = 2;
    s.head_dim = 256;
    s.k_heads = 16;
    s.v_heads = 32;
    s.k_dim = 128;
    s.v_dim = 128;
    s.experts = 256;
    s.experts_per_tok = 8;
    s.moe_intermediate = 512;
    s.shared_intermediate = 512;
    s.max_position = 262144;
    p.push_back({"qwen3.5-35b-a3b", "Qwen3.5-35B-A3B shape (MoE, 40 layers)", s});
  }
  {
    // A ~120M-parameter model of the same architecture, sized for CPU benchmarks.
    SyntheticSpec s;
    s.vocab = 32768;
    s.hidden = 768;
    s.intermediate = 2048;
    s.layers = 12;
    s.heads = 6;
    s.kv_heads = 2;
    s.head_dim = 128;
    s.k_heads = 4;
    s.v_heads = 8;
    s.k_dim = 96;
    s.v_dim = 96;
    s.max_position = 32768;
    p.push_back({"cpu-120m", "~120M-parameter Qwen3.5-architecture model for CPU runs", s});
  }
  return p;
}

}  // namespace

std::vector<BenchPreset> bench_presets() {
  return make_presets();
}

BenchPreset find_preset(const std::string& name) {
  std::string known;
  for (const BenchPreset& p : bench_presets()) {
    if (p.name == name) return p;
    known += (known.empty() ? "" : ", ") + p.name;
  }
  fail("unknown preset '{}': known presets are {}", name, known);
}

void apply_quant(SyntheticSpec& spec, const std::string& quant) {
  if (quant == "bf16") {
    spec.bits = 0;
    return;
  }
  std::smatch m;
  static const std::regex re("q([0-9])g([0-9]+)");
  if (!std::regex_match(quant, m, re)) {
    fail("--quant '{}': use bf16 or q<bits>g<group>, e.g. q4g64", quant);
  }
  int bits = std::stoi(m[1]), group = std::stoi(m[2]);
  if (!affine::supported_bits(bits) || !affine::supported_group(group)) {
    fail("--quant '{}': bits must be 2, 3, 4, 5, 6 or 8 and group 32, 64 or 128", quant);
  }
  spec.bits = bits;
  spec.group = group;
}

}  // namespace tokenmill::app
