#include "app/model_loading.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "app/bench_presets.h"
#include "model/synthetic.h"
#include "util/error.h"
#include "util/file_text.h"

namespace tokenmill::app {

namespace fs = std::filesystem;

bool has_model_weights(const std::string& dir) {
  return fs::exists(fs::path(dir) / "config.json") || fs::exists(fs::path(dir) / kDummyWeightsFile);
}

namespace {

SyntheticSpec read_dummy_spec(const std::string& path, std::string& label) {
  const std::string text = read_text_file(path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON: {}", path, e.what());
  }
  if (!j.is_object()) fail("{}: expected an object like {{\"preset\": \"qwen3.5-27b\"}}", path);
  std::string preset, quant = "bf16";
  int64_t vocab = 0;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (k == "preset" && it->is_string()) {
      preset = it->get<std::string>();
    } else if (k == "quant" && it->is_string()) {
      quant = it->get<std::string>();
    } else if (k == "vocab" && it->is_number_integer() && it->get<int64_t>() > 0) {
      vocab = it->get<int64_t>();
    } else if (k == "preset" || k == "quant" || k == "vocab") {
      fail(
          "{}: \"{}\" has the wrong type (preset and quant are strings, vocab a positive "
          "integer)",
          path, k);
    } else {
      fail("{}: unknown key \"{}\" (known: preset, quant, vocab)", path, k);
    }
  }
  if (preset.empty()) fail("{}: \"preset\" is missing (e.g. \"qwen3.5-27b\")", path);
  SyntheticSpec spec = find_preset(preset).spec;
  apply_quant(spec, quant);
  if (vocab > 0) spec.vocab = vocab;
  label = preset + " " + quant;
  return spec;
}

}  // namespace

std::unique_ptr<Model> load_model_weights(const std::string& dir, Backend& backend,
                                          const ModelOptions& options) {
  const fs::path marker = fs::path(dir) / kDummyWeightsFile;
  if (!fs::exists(marker) || fs::exists(fs::path(dir) / "config.json")) {
    return Model::load(dir, backend, options);
  }
  std::string label;
  SyntheticSpec spec = read_dummy_spec(marker.string(), label);
  auto model = Model::from_checkpoint(
      std::make_unique<Checkpoint>(synthetic_checkpoint_in_memory(spec, label)), backend, options);
  backend.synchronize();
  return model;
}

int64_t checkpoint_file_bytes(const std::string& dir) {
  int64_t total = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.is_regular_file(ec) && e.path().extension() == ".safetensors") {
      total += static_cast<int64_t>(e.file_size(ec));
    }
  }
  return total;
}

void check_tokenizer_fits(const Tokenizer& tokenizer, const Model& model, const std::string& dir) {
  const int64_t vocab = model.config().vocab_size;
  if (tokenizer.vocab_size() > vocab) {
    fail(
        "{}: the tokenizer has ids up to {} but the model's vocabulary has {} entries (the "
        "tokenizer belongs to another model)",
        dir, tokenizer.vocab_size() - 1, vocab);
  }
}

LoadedModel load_model_dir(const std::string& dir, Backend& backend, bool progress,
                           bool need_template) {
  if (!fs::is_directory(dir)) fail("{}: not a directory (give a model directory)", dir);
  if (!fs::exists(fs::path(dir) / "tokenizer.json")) {
    fail("{}: no tokenizer.json: the model directory must contain the tokenizer files", dir);
  }
  auto t0 = std::chrono::steady_clock::now();
  LoadedModel m;
  m.tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_dir(dir));
  if (need_template) m.chat_template = std::make_unique<ChatTemplate>(ChatTemplate::from_dir(dir));
  if (progress) std::fprintf(stderr, "loading %s ...\n", dir.c_str());
  m.model = load_model_weights(dir, backend);
  check_tokenizer_fits(*m.tokenizer, *m.model, dir);
  auto add = [&](std::optional<int32_t> id) {
    if (id && std::find(m.stop_token_ids.begin(), m.stop_token_ids.end(), *id) ==
                  m.stop_token_ids.end()) {
      m.stop_token_ids.push_back(*id);
    }
  };
  for (int32_t id : m.model->config().eos_token_ids) add(id);
  add(m.tokenizer->eos_id());
  add(m.tokenizer->token_to_id("<|im_end|>"));
  add(m.tokenizer->token_to_id("<|endoftext|>"));
  if (progress) {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "loaded %s: %d layers, %.1f MB of weights read per token, %.2f s\n",
                 m.model->config().model_type.c_str(), m.model->config().num_layers,
                 m.model->weights().weight_bytes / 1e6, s);
  }
  return m;
}

}  // namespace tokenmill::app
