// `tokenmill run DIR [--prompt TEXT]`: chat with a model in the terminal. The conversation goes
// through the model's chat template; the reply streams with reasoning shown dimmed; prompt and
// decode speeds are printed at the end of each reply. Sampling follows the model's
// generation_config.json where a flag does not say otherwise (as the server does).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "app/backend_select.h"
#include "app/commands.h"
#include "app/model_loading.h"
#include "engine/engine.h"
#include "server/generation_config.h"
#include "server/plan.h"
#include "text/detokenizer.h"
#include "text/output_parser.h"
#include "util/error.h"

namespace tokenmill::app {

namespace {

struct RunOptions {
  std::string dir;
  std::string prompt;
  std::string system;
  std::optional<int> max_tokens;  // unset: generation_config's max_new_tokens, else 512
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
  std::optional<uint64_t> seed;
  bool think = true;
  bool color = true;
  std::string kv_dtype = "auto";
  DeviceOptions device;
};

using Clock = std::chrono::steady_clock;

// One assistant turn: renders, generates, streams; returns the reply for the history.
nlohmann::ordered_json chat_turn(LoadedModel& m, Engine& engine, const RunOptions& o,
                                 const SamplingParams& sampling, int max_tokens,
                                 const nlohmann::ordered_json& messages) {
  ChatTemplateInputs in;
  in.messages = messages;
  in.add_generation_prompt = true;
  in.extra["enable_thinking"] = o.think;
  in.bos_token = m.tokenizer->bos_token();
  in.eos_token = m.tokenizer->eos_token();
  std::string prompt = m.chat_template->render(in);
  std::vector<int32_t> ids = m.tokenizer->encode(prompt, false);

  GenerationRequest req;
  req.prompt = ids;
  req.max_tokens = max_tokens;
  req.sampling = sampling;
  req.stop_token_ids = m.stop_token_ids;
  OutputParserOptions po =
      choose_output_parser_options(m.chat_template->source(), m.model->config().model_type, prompt);
  req.starts_in_reasoning = po.starts_in_reasoning;
  req.think_end_token = m.tokenizer->token_to_id("</think>").value_or(-1);

  auto t0 = Clock::now();
  auto stream = engine.submit(req);
  std::span<const int32_t> tail(ids.data() + ids.size() - std::min<size_t>(ids.size(), 6),
                                std::min<size_t>(ids.size(), 6));
  IncrementalDetokenizer detok(*m.tokenizer, true, {}, tail);
  auto parser = make_output_parser(po);
  OutputAccumulator acc;
  bool in_dim = false;
  auto show = [&](const std::vector<OutputEvent>& evs) {
    acc.add(evs);
    for (const OutputEvent& e : evs) {
      bool dim = e.type == OutputEventType::kReasoning;
      if (o.color && dim != in_dim) {
        std::fputs(dim ? "\x1b[2m" : "\x1b[0m", stdout);
        in_dim = dim;
      }
      if (e.type == OutputEventType::kToolCallEnd) {
        std::printf("[tool call %s %s]", e.name.c_str(), e.text.c_str());
      } else if (e.type == OutputEventType::kReasoning || e.type == OutputEventType::kContent) {
        std::fwrite(e.text.data(), 1, e.text.size(), stdout);
      }
    }
    std::fflush(stdout);
  };
  Clock::time_point first{};
  int generated = 0;
  bool finished = false;
  std::string error;
  while (!finished) {
    for (TokenEvent& ev : stream->wait(std::chrono::milliseconds(200))) {
      if (ev.token >= 0) {
        if (generated++ == 0) first = Clock::now();
        if (!ev.hit_stop_token) show(parser->feed(detok.push(ev.token)));
      }
      if (ev.finished) {
        finished = true;
        if (ev.finish_reason == FinishReason::kError) error = ev.error;
      }
    }
  }
  auto t1 = Clock::now();
  show(parser->feed(detok.finish()));
  show(parser->finish());
  if (o.color && in_dim) std::fputs("\x1b[0m", stdout);
  std::printf("\n");
  std::fflush(stdout);  // the speed line goes to stderr: keep it after the reply
  if (!error.empty()) fail("generation failed: {}", error);
  double prefill_s = std::chrono::duration<double>((generated ? first : t1) - t0).count();
  double decode_s = std::chrono::duration<double>(t1 - first).count();
  std::fprintf(stderr, "[prompt %zu tokens, %.1f tok/s | reply %d tokens, %.1f tok/s]\n",
               ids.size(), ids.size() / std::max(prefill_s, 1e-9), generated,
               generated > 1 ? (generated - 1) / std::max(decode_s, 1e-9) : 0.0);
  ParsedOutput out = acc.result(parser->flags());
  nlohmann::ordered_json reply = {{"role", "assistant"}, {"content", out.content}};
  if (!out.reasoning.empty()) reply["reasoning_content"] = out.reasoning;
  return reply;
}

// Flags, then the model's generation_config.json, then the built-in defaults.
SamplingParams run_sampling(const RunOptions& o, const server::GenerationConfig& gc) {
  server::GenerationPlan plan;
  plan.temperature = o.temperature;
  plan.top_p = o.top_p;
  plan.top_k = o.top_k;
  plan.min_p = o.min_p;
  plan.repetition_penalty = o.repetition_penalty;
  SamplingParams p = server::resolve_sampling(plan, {}, gc.sampling);
  p.seed = o.seed;
  return p;
}

void run_command(const RunOptions& o) {
  BackendHandle be = make_backend(o.device);
  LoadedModel m = load_model_dir(o.dir, *be.backend, /*progress=*/true);
  const server::GenerationConfig gc = server::load_generation_config(o.dir);
  for (int32_t id : gc.eos_token_ids) {
    if (std::find(m.stop_token_ids.begin(), m.stop_token_ids.end(), id) == m.stop_token_ids.end()) {
      m.stop_token_ids.push_back(id);
    }
  }
  const SamplingParams sampling = run_sampling(o, gc);
  const int max_tokens = o.max_tokens.value_or(gc.max_new_tokens.value_or(512));
  if (max_tokens < 1) fail("--max-tokens must be at least 1, got {}", max_tokens);
  std::fprintf(stderr,
               "sampling: temperature %g, top_p %g, top_k %d, min_p %g, repetition_penalty %g; "
               "replies up to %d tokens (%s; flags override)\n",
               sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p,
               sampling.repetition_penalty, max_tokens,
               gc.file.empty() ? "no generation_config.json: built-in defaults"
                               : "defaults from generation_config.json");
  EngineOptions eo;
  eo.max_seqs = 1;
  eo.kv_dtype = kv_dtype_of(o.kv_dtype, *be.backend);
  Engine engine(*m.model, eo);
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
  if (!o.prompt.empty()) {
    messages.push_back({{"role", "user"}, {"content", o.prompt}});
    chat_turn(m, engine, o, sampling, max_tokens, messages);
    return;
  }
  std::fprintf(
      stderr, "Interactive chat. Type a message and press Enter; an empty line or Ctrl-D quits.\n");
  std::string line;
  for (;;) {
    std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line) || line.empty()) break;
    messages.push_back({{"role", "user"}, {"content", line}});
    messages.push_back(chat_turn(m, engine, o, sampling, max_tokens, messages));
  }
}

}  // namespace

void register_run(CLI::App& app) {
  auto opt = std::make_shared<RunOptions>();
  auto* cmd = app.add_subcommand("run", "Chat with a model (one prompt, or interactively)");
  cmd->add_option("dir", opt->dir, "Model directory")->required();
  cmd->add_option("-p,--prompt", opt->prompt, "Send this message and exit");
  cmd->add_option("--system", opt->system, "System message");
  cmd->add_option("-n,--max-tokens", opt->max_tokens,
                  "Reply length limit (default: generation_config's max_new_tokens, else 512)");
  cmd->add_option("--temperature", opt->temperature,
                  "0 = greedy (default: generation_config.json, else 1)");
  cmd->add_option("--top-p", opt->top_p, "Default: generation_config.json, else 1 (off)");
  cmd->add_option("--top-k", opt->top_k, "Default: generation_config.json, else 0 (off)");
  cmd->add_option("--min-p", opt->min_p, "Default: generation_config.json, else 0 (off)");
  cmd->add_option("--repetition-penalty", opt->repetition_penalty,
                  "Default: generation_config.json, else 1 (off)");
  cmd->add_option("--seed", opt->seed, "Sampling seed (default: a fresh one per reply)");
  cmd->add_flag("!--no-think", opt->think, "Turn thinking off (enable_thinking=false)");
  cmd->add_flag("!--no-color", opt->color, "Plain output (no dimmed reasoning)");
  add_device_options(*cmd, opt->device);
  add_kv_dtype_option(*cmd, opt->kv_dtype);
  cmd->callback([opt] { run_command(*opt); });
}

}  // namespace tokenmill::app
