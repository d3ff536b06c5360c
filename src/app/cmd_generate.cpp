// `tokenmill generate DIR (--prompt TEXT | --ids FILE)`: raw completion, no chat template. Prints
// the continuation, or with --json the prompt ids, generated ids and their logprobs (scripts and
// tests compare these against reference implementations).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "app/backend_select.h"
#include "app/commands.h"
#include "app/model_loading.h"
#include "engine/engine.h"
#include "text/detokenizer.h"
#include "util/error.h"
#include "util/file_text.h"

namespace tokenmill::app {

namespace {

struct GenerateOptions {
  std::string dir, prompt, ids_file;
  int max_tokens = 64;
  float temperature = 0.0f;
  float top_p = 1.0f;
  int top_k = 0;
  uint64_t seed = 0;
  bool json = false;
  bool ignore_eos = false;
  std::string kv_dtype = "auto";
  DeviceOptions device;
};

void generate_command(const GenerateOptions& o) {
  if (o.prompt.empty() == o.ids_file.empty()) fail("give either --prompt TEXT or --ids FILE");
  BackendHandle be = make_backend(o.device);
  LoadedModel m = load_model_dir(o.dir, *be.backend, /*progress=*/!o.json, /*need_template=*/false);
  std::vector<int32_t> ids;
  if (!o.ids_file.empty()) {
    const std::string text = read_text_file(o.ids_file);
    try {
      ids = nlohmann::json::parse(text).get<std::vector<int32_t>>();
    } catch (const nlohmann::json::exception& e) {
      fail("{}: expected a JSON array of token ids: {}", o.ids_file, e.what());
    }
  } else {
    ids = m.tokenizer->encode(o.prompt, true);
  }
  EngineOptions eo;
  eo.max_seqs = 1;
  eo.kv_dtype = kv_dtype_of(o.kv_dtype, *be.backend);
  Engine engine(*m.model, eo);
  GenerationRequest req;
  req.prompt = ids;
  req.max_tokens = o.max_tokens;
  req.sampling.temperature = o.temperature;
  req.sampling.top_p = o.top_p;
  req.sampling.top_k = o.top_k;
  req.sampling.seed = o.seed;
  req.sampling.logprobs = o.json ? 0 : -1;
  req.stop_token_ids = m.stop_token_ids;
  req.ignore_eos = o.ignore_eos;
  auto stream = engine.submit(req);
  IncrementalDetokenizer detok(*m.tokenizer, false);
  std::vector<int32_t> out;
  std::vector<float> lps;
  std::string text, reason;
  for (bool done = false; !done;) {
    for (TokenEvent& ev : stream->wait(std::chrono::milliseconds(200))) {
      if (ev.token >= 0) {
        out.push_back(ev.token);
        lps.push_back(ev.logprob);
        std::string piece = ev.hit_stop_token ? std::string() : detok.push(ev.token);
        text += piece;
        if (!o.json) {
          std::fwrite(piece.data(), 1, piece.size(), stdout);
          std::fflush(stdout);
        }
      }
      if (ev.finished) {
        done = true;
        if (ev.finish_reason == FinishReason::kError) fail("generation failed: {}", ev.error);
        reason = ev.finish_reason == FinishReason::kStop ? "stop" : "length";
      }
    }
  }
  std::string tail = detok.finish();
  text += tail;
  if (o.json) {
    nlohmann::json j = {{"prompt_ids", ids},
                        {"ids", out},
                        {"logprobs", lps},
                        {"text", text},
                        {"finish_reason", reason}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s\n", tail.c_str());
  }
}

}  // namespace

void register_generate(CLI::App& app) {
  auto opt = std::make_shared<GenerateOptions>();
  auto* cmd =
      app.add_subcommand("generate", "Raw completion of a text or of token ids (no chat template)");
  cmd->add_option("dir", opt->dir, "Model directory")->required();
  cmd->add_option("-p,--prompt", opt->prompt, "Prompt text");
  cmd->add_option("--ids", opt->ids_file, "JSON file with the prompt's token ids");
  cmd->add_option("-n,--max-tokens", opt->max_tokens)->capture_default_str();
  cmd->add_option("--temperature", opt->temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-p", opt->top_p)->capture_default_str();
  cmd->add_option("--top-k", opt->top_k)->capture_default_str();
  cmd->add_option("--seed", opt->seed)->capture_default_str();
  cmd->add_flag("--ignore-eos", opt->ignore_eos, "Keep going past end-of-sequence tokens");
  cmd->add_flag("--json", opt->json, "Print ids, logprobs and text as JSON");
  add_device_options(*cmd, opt->device);
  add_kv_dtype_option(*cmd, opt->kv_dtype);
  cmd->callback([opt] { generate_command(*opt); });
}

}  // namespace tokenmill::app
