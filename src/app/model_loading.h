// Loading everything a model directory provides for chat: tokenizer, chat template, weights,
// and the ids that end a reply.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace tokenmill::app {

// A model directory may hold `dummy_weights.json` instead of config.json and safetensors:
//   {"preset": "qwen3.5-27b", "quant": "q4g64", "vocab": 248320}
// It stands for that bench preset's shapes (vocab optional: the preset's) filled with seeded
// random weights where they live (on the GPU for CUDA), next to real tokenizer files. It lets
// the server be measured at real sizes without a checkpoint; what such a model says is noise.
// tools/make_dummy_model.py writes one.
inline constexpr const char* kDummyWeightsFile = "dummy_weights.json";

// True when `dir` has config.json or dummy_weights.json.
bool has_model_weights(const std::string& dir);

// The weights of `dir`: the checkpoint, or the dummy model its dummy_weights.json describes.
// Throws tokenmill::Error naming the file and the key at fault.
std::unique_ptr<Model> load_model_weights(const std::string& dir, Backend& backend,
                                          const ModelOptions& options = {});

// Bytes of the checkpoint files (*.safetensors) in `dir`; 0 when it has none.
int64_t checkpoint_file_bytes(const std::string& dir);

// Fails when the tokenizer can produce ids the model has no embedding for.
void check_tokenizer_fits(const Tokenizer& tokenizer, const Model& model, const std::string& dir);

struct LoadedModel {
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ChatTemplate> chat_template;  // null when the directory has none
  std::unique_ptr<Model> model;
  std::vector<int32_t> stop_token_ids;  // config eos ids, tokenizer eos, <|im_end|>, <|endoftext|>
};

// Throws tokenmill::Error naming the directory and what is missing. `progress` prints what is
// loaded and how long it took to stderr.
LoadedModel load_model_dir(const std::string& dir, Backend& backend, bool progress,
                           bool need_template = true);

}  // namespace tokenmill::app
