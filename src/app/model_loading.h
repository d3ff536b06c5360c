// Loading everything a model directory provides for chat: tokenizer, chat template, weights,
// and the ids that end a reply.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace tokenmill::app {

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
