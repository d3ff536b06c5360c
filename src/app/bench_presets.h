// Real-shape model presets for `tokenmill bench --preset NAME` (bench/README.md lists them).
#pragma once

#include <string>
#include <vector>

#include "model/synthetic.h"

namespace tokenmill::app {

struct BenchPreset {
  std::string name;
  std::string description;
  SyntheticSpec spec;  // bf16; --quant changes bits/group
};

std::vector<BenchPreset> bench_presets();
BenchPreset find_preset(const std::string& name);  // throws listing the known names

// Applies "bf16" or "q<bits>g<group>" (e.g. q4g64) to a spec; throws on other spellings.
void apply_quant(SyntheticSpec& spec, const std::string& quant);

}  // namespace tokenmill::app
