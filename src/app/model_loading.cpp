#include "app/model_loading.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "util/error.h"

namespace tokenmill::app {

LoadedModel load_model_dir(const std::string& dir, Backend& backend, bool progress,
                           bool need_template) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) fail("{}: not a directory (give a model directory)", dir);
  if (!fs::exists(fs::path(dir) / "tokenizer.json")) {
    fail("{}: no tokenizer.json: the model directory must contain the tokenizer files", dir);
  }
  auto t0 = std::chrono::steady_clock::now();
  LoadedModel m;
  m.tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_dir(dir));
  if (need_template) m.chat_template = std::make_unique<ChatTemplate>(ChatTemplate::from_dir(dir));
  if (progress) std::fprintf(stderr, "loading %s ...\n", dir.c_str());
  m.model = Model::load(dir, backend);
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
