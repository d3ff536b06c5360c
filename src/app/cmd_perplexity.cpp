// `tokenmill perplexity DIR --file TEXT [--context N] [--json]`: perplexity over non-overlapping
// windows of N tokens (each window's first token is not scored: it has no context).
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "app/backend_select.h"
#include "app/commands.h"
#include "app/model_loading.h"
#include "cache/cache_manager.h"
#include "engine/sampler.h"
#include "model/model.h"
#include "text/tokenizer.h"
#include "util/error.h"
#include "util/file_text.h"

namespace tokenmill::app {

namespace {

struct PerplexityOptions {
  std::string dir, file;
  int context = 1024;
  int chunk = 512;
  bool json = false;
  bool ids = false;  // the file holds a JSON array of token ids instead of text
  DeviceOptions device;
};

void perplexity_command(const PerplexityOptions& o) {
  if (o.context < 2) fail("--context must be at least 2, got {}", o.context);
  std::vector<int32_t> ids;
  std::string text = read_text_file(o.file);
  if (o.ids) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
      ids = j.get<std::vector<int32_t>>();
    } catch (const nlohmann::json::exception& e) {
      fail("{}: expected a JSON array of token ids: {}", o.file, e.what());
    }
  } else {
    ids = Tokenizer::from_dir(o.dir).encode(text, false);
  }
  if (ids.size() < 2) fail("{}: needs at least 2 tokens, has {}", o.file, ids.size());

  BackendHandle be = make_backend(o.device);
  auto model = load_model_weights(o.dir, *be.backend);
  const int V = static_cast<int>(model->config().vocab_size);
  CacheOptions co;
  co.block_size = 16;
  co.num_slots = 1;
  co.num_blocks = (o.context + 15) / 16;
  CacheManager cache(*be.backend, model->geometry(), co);

  std::vector<float> lps;
  std::vector<float> logits;
  for (size_t w = 0; w + 1 < ids.size(); w += static_cast<size_t>(o.context)) {
    size_t end = std::min(ids.size(), w + static_cast<size_t>(o.context));
    if (end - w < 2) break;
    int slot = cache.acquire_slot();
    std::vector<int32_t> blocks;
    for (size_t pos = w; pos < end; pos += static_cast<size_t>(o.chunk)) {
      size_t stop = std::min(end, pos + static_cast<size_t>(o.chunk));
      std::vector<int32_t> piece(ids.begin() + static_cast<long>(pos),
                                 ids.begin() + static_cast<long>(stop));
      int cached = static_cast<int>(pos - w);
      cache.reserve(blocks, cached + static_cast<int64_t>(piece.size()));
      Batch b;
      b.add_sequence(piece, cached, slot, blocks, true);
      model->forward(b, cache.views(), &logits);
      for (size_t i = 0; i < piece.size(); ++i) {
        size_t target = pos + i + 1;
        if (target >= end) break;
        lps.push_back(token_logprob(&logits[i * V], V, ids[target], 0, nullptr));
      }
    }
    cache.release(blocks);
    cache.release_slot(slot);
  }
  double sum = 0;
  for (float lp : lps) sum += lp;
  double ppl = std::exp(-sum / static_cast<double>(lps.size()));
  if (o.json) {
    nlohmann::json j = {{"perplexity", ppl},
                        {"scored_tokens", lps.size()},
                        {"context", o.context},
                        {"ids", ids},
                        {"logprobs", lps}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("perplexity %.4f over %zu scored tokens (%zu tokens, windows of %d)\n", ppl,
                lps.size(), ids.size(), o.context);
  }
}

}  // namespace

void register_perplexity(CLI::App& app) {
  auto opt = std::make_shared<PerplexityOptions>();
  auto* cmd = app.add_subcommand("perplexity", "Perplexity of a model on a text file");
  cmd->add_option("dir", opt->dir, "Model directory")->required();
  cmd->add_option("-f,--file", opt->file, "Text file (or JSON ids with --ids)")->required();
  cmd->add_option("-c,--context", opt->context, "Window size in tokens")->capture_default_str();
  cmd->add_option("--chunk", opt->chunk, "Prefill chunk in tokens")->capture_default_str();
  cmd->add_flag("--json", opt->json, "Print JSON with the ids and each token's logprob");
  cmd->add_flag("--ids", opt->ids, "The file is a JSON array of token ids");
  add_device_options(*cmd, opt->device);
  cmd->callback([opt] { perplexity_command(*opt); });
}

}  // namespace tokenmill::app
