#include "server/generation.h"

#include <algorithm>
#include <random>

#include "engine/engine.h"
#include "server/api_error.h"
#include "server/json_schema_constraint.h"
#include "server/prompt.h"
#include "server/tool_call_constraint.h"
#include "text/detokenizer.h"
#include "text/tokenizer.h"

namespace tokenmill::server {

struct Generation::Choice {
  int index = 0, prompt_index = 0;
  std::shared_ptr<RequestStream> stream;
  std::unique_ptr<IncrementalDetokenizer> detok;
  std::unique_ptr<OutputParser> parser;
  OutputAccumulator acc;
  bool in_reasoning = false;
  bool finished = false;
};

namespace {

std::string random_id(const char* prefix) {
  std::random_device rd;
  std::mt19937_64 g((uint64_t(rd()) << 32) ^ rd());
  return fmt::format("{}{:016x}{:08x}", prefix, g(), uint32_t(g()));
}

TokenLogprob make_logprob(const ServedModel& m, int32_t id, float lp,
                          const std::vector<TopLogprob>& top) {
  TokenLogprob t;
  t.id = id;
  t.logprob = lp;
  const auto& bytes = *m.token_bytes;
  if (id >= 0 && size_t(id) < bytes.size()) t.bytes = bytes[id];
  for (const auto& x : top) {
    t.top.emplace_back(x.token >= 0 && size_t(x.token) < bytes.size() ? bytes[x.token] : "",
                       x.logprob);
  }
  return t;
}

}  // namespace

Generation::Generation(const ServedModel& model, const ModelSettings& settings, GenerationPlan plan)
    : model_(model), settings_(settings), plan_(std::move(plan)) {
  const Tokenizer& tok = *model_.tokenizer;
  const bool chat = plan_.api != PlanApi::kCompletion;
  request_id_ = random_id(plan_.api == PlanApi::kChat         ? "chatcmpl-"
                          : plan_.api == PlanApi::kCompletion ? "cmpl-"
                                                              : "msg_");
  thinking_ = chat && plan_.enable_thinking.value_or(settings_.thinking);
  if (chat) {
    std::string rendered = render_chat_prompt(model_, plan_, thinking_);
    prompts_.push_back(tok.encode(rendered, false));
    prompt_texts_.push_back(rendered);
    // The parser types XML tool parameters by the tools' schemas (key order does not matter).
    nlohmann::json tools = plan_.tool_choice == "none" || plan_.tools.is_null()
                               ? nlohmann::json()
                               : nlohmann::json::parse(plan_.tools.dump());
    parser_options_ = choose_output_parser_options(model_.chat_template_source, model_.model_type,
                                                   rendered, tools);
    if (plan_.tool_choice == "none" || plan_.tools.is_null() ||
        plan_.response_format.kind != ResponseFormat::Kind::kText) {
      parser_options_.tool_format = ToolCallFormat::kNone;
    }
    parser_options_.tool_call_id_prefix = "call_" + request_id_.substr(9, 12) + "_";
    thinking_ = thinking_ && parser_options_.reasoning;
  } else {
    for (const auto& t : plan_.prompt_texts) {
      prompts_.push_back(tok.encode(t, true));
      prompt_texts_.push_back(t);
    }
    for (const auto& ids : plan_.prompt_ids) {
      for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] >= tok.vocab_size() && ids[i] >= model_.engine->vocab_size()) {
          bad_request(fmt::format("prompt[{}]", i), "token id {} is outside the vocabulary (0..{})",
                      ids[i], model_.engine->vocab_size() - 1);
        }
      }
      prompts_.push_back(ids);
      prompt_texts_.push_back(tok.decode(ids, false));
    }
    parser_options_ = OutputParserOptions{};
  }

  // Limits: the context window (engine, capped by the model's settings) and max output tokens.
  int ctx = model_.engine->max_context();
  if (settings_.context_window > 0) ctx = std::min(ctx, settings_.context_window);
  const char* field = plan_.api == PlanApi::kChat ? "max_completion_tokens" : "max_tokens";
  if (plan_.max_tokens && settings_.max_output_tokens > 0 &&
      *plan_.max_tokens > settings_.max_output_tokens) {
    bad_request(plan_.api == PlanApi::kChat ? "max_tokens" : field,
                "{} tokens requested, but model '{}' allows at most {} output tokens",
                *plan_.max_tokens, model_.name, settings_.max_output_tokens);
  }
  int longest = 0;
  for (const auto& p : prompts_) longest = std::max<int>(longest, int(p.size()));
  for (const auto& p : prompts_) {
    if (p.empty()) bad_request("prompt", "is empty after tokenization: send at least one token");
  }
  if (longest >= ctx) {
    bad_request(chat ? "messages" : "prompt",
                "the prompt has {} tokens, which leaves no room in model '{}''s context window of "
                "{} tokens; shorten it",
                longest, model_.name, ctx);
  }
  int max_tokens;
  if (plan_.max_tokens) {
    max_tokens = *plan_.max_tokens;
    if (int64_t(longest) + max_tokens > ctx) {
      bad_request(field,
                  "the prompt ({} tokens) + {} ({}) = {} exceeds model '{}''s context window of {} "
                  "tokens; lower {} or shorten the prompt",
                  longest, field, max_tokens, int64_t(longest) + max_tokens, model_.name, ctx,
                  field);
    }
  } else {
    max_tokens = ctx - longest;
    // Default length: the settings' max_output_tokens, else generation_config's max_new_tokens.
    int cap = settings_.max_output_tokens > 0 ? settings_.max_output_tokens
                                              : model_.generation_config.max_new_tokens.value_or(0);
    if (cap > 0) max_tokens = std::min(max_tokens, cap);
  }

  GenerationRequest& r = base_;
  r.max_tokens = max_tokens;
  r.sampling = resolve_sampling(plan_, settings_.sampling, model_.generation_config.sampling);
  r.ignore_eos = plan_.ignore_eos;
  if (!plan_.ignore_eos) r.stop_token_ids = model_.stop_ids;
  if (plan_.api == PlanApi::kCompletion && plan_.echo && plan_.logprobs >= 0) {
    r.prompt_logprobs = plan_.logprobs;
  }
  if (plan_.response_format.kind == ResponseFormat::Kind::kJsonSchema) {
    validate_json_schema(plan_.response_format.schema);
  }
  auto think_end = tok.token_to_id("</think>");
  think_start_ = tok.token_to_id("<think>").value_or(-1);
  int budget = plan_.reasoning_budget ? *plan_.reasoning_budget : settings_.thinking_budget;
  if (thinking_ && think_end) {
    r.think_end_token = *think_end;
    r.reasoning_budget = budget;
    r.starts_in_reasoning = parser_options_.starts_in_reasoning;
  }
  think_end_ = r.think_end_token;
  in_reasoning_at_start_ = r.starts_in_reasoning;
  if (chat && (plan_.tool_choice == "required" || plan_.tool_choice == "function")) {
    compile_tool_choice();
  }
}

void Generation::compile_tool_choice() {
  const std::string what =
      plan_.tool_choice == "function"
          ? fmt::format("a named tool ('{}')", plan_.tool_choice_name)
          : std::string(plan_.api == PlanApi::kAnthropic ? "'any'" : "'required'");
  if (plan_.response_format.kind != ResponseFormat::Kind::kText) {
    bad_request("tool_choice",
                "{} conflicts with response_format {}: ask for tool calls or for "
                "JSON text, not both",
                what,
                plan_.response_format.kind == ResponseFormat::Kind::kJsonObject ? "json_object"
                                                                                : "json_schema");
  }
  ToolCallGrammarSpec spec;
  switch (parser_options_.tool_format) {
    case ToolCallFormat::kXml:
      spec.format = ToolCallFormat::kXml;
      break;
    case ToolCallFormat::kJson:
    case ToolCallFormat::kAuto:
      spec.format = ToolCallFormat::kJson;
      break;
    case ToolCallFormat::kNone:
      bad_request("tool_choice",
                  "{} cannot be enforced: model '{}''s chat template has no tool-call format "
                  "this server can parse; use tool_choice 'auto' or 'none'",
                  what, model_.name);
  }
  for (size_t i = 0; i < plan_.tools.size(); ++i) {
    const auto& t = plan_.tools[i];
    if (plan_.tool_choice == "function" && t["function"]["name"] != plan_.tool_choice_name)
      continue;
    spec.tools.push_back(t);
    spec.schema_params.push_back(plan_.api == PlanApi::kAnthropic
                                     ? fmt::format("tools[{}].input_schema", i)
                                     : fmt::format("tools[{}].function.parameters", i));
  }
  spec.parallel = plan_.tool_choice != "function" && plan_.parallel_tool_calls;
  // The constraint owns reasoning too, so that no end-of-generation token can come before the
  // call: the engine sees no reasoning markers, and the budget is enforced by the constraint.
  spec.reasoning = !parser_options_.reasoning ? ToolCallGrammarSpec::Reasoning::kNone
                   : parser_options_.starts_in_reasoning
                       ? ToolCallGrammarSpec::Reasoning::kOpen
                       : ToolCallGrammarSpec::Reasoning::kOptional;
  spec.reasoning_budget = base_.reasoning_budget;
  spec.think_end_token = base_.think_end_token;
  base_.reasoning_budget = -1;
  base_.think_end_token = -1;
  base_.starts_in_reasoning = false;
  tool_grammar_ = compile_tool_call_grammar(spec);
}

Generation::~Generation() {
  cancel();
}

void Generation::start() {
  started_ = std::chrono::steady_clock::now();
  const auto& fmt_kind = plan_.response_format.kind;
  // Every choice of every prompt is queued at once: the engine can prefill them in one step.
  std::vector<GenerationRequest> requests;
  for (size_t p = 0; p < prompts_.size(); ++p) {
    for (int i = 0; i < plan_.n; ++i) {
      auto c = std::make_unique<Choice>();
      c->index = int(choices_.size());
      c->prompt_index = int(p);
      GenerationRequest req = base_;
      req.prompt = prompts_[p];
      if (plan_.seed) req.sampling.seed = *plan_.seed + uint64_t(i);
      if (tool_grammar_) {
        req.constraint =
            make_tool_call_constraint(tool_grammar_, model_.token_bytes, model_.token_order,
                                      model_.token_special, model_.stop_ids);
      } else if (fmt_kind != ResponseFormat::Kind::kText) {
        req.constraint = make_json_constraint(
            model_.token_bytes, model_.token_special, model_.stop_ids,
            fmt_kind == ResponseFormat::Kind::kJsonSchema ? plan_.response_format.schema
                                                          : nlohmann::ordered_json::object(),
            /*any_value=*/fmt_kind == ResponseFormat::Kind::kJsonObject);
      }
      std::span<const int32_t> tail(prompts_[p]);
      if (tail.size() > 6) tail = tail.subspan(tail.size() - 6);
      c->detok =
          std::make_unique<IncrementalDetokenizer>(*model_.tokenizer, true, plan_.stop, tail);
      c->parser = make_output_parser(parser_options_);
      c->in_reasoning = in_reasoning_at_start_;
      ChoiceResult res;
      res.index = c->index;
      if (plan_.echo) res.prompt_text = prompt_texts_[p];
      results_.push_back(std::move(res));
      requests.push_back(std::move(req));
      choices_.push_back(std::move(c));
    }
  }
  std::vector<std::shared_ptr<RequestStream>> streams;
  try {
    streams = model_.engine->submit_all(std::move(requests));
  } catch (const Error& e) {
    throw ApiError(400, e.what());  // nothing was queued
  }
  for (size_t i = 0; i < choices_.size(); ++i) choices_[i]->stream = std::move(streams[i]);
}

void Generation::finish_choice(Choice& c, ChoiceDelta& d, const std::string& reason) {
  if (c.finished) return;
  c.finished = true;
  ChoiceResult& res = results_[c.index];
  std::string rest = c.detok->finish();
  if (!rest.empty()) {
    res.text += rest;
    auto evs = c.parser->feed(rest);
    c.acc.add(evs);
    d.events.insert(d.events.end(), evs.begin(), evs.end());
  }
  auto evs = c.parser->finish();
  c.acc.add(evs);
  d.events.insert(d.events.end(), evs.begin(), evs.end());
  res.output = c.acc.result(c.parser->flags());
  std::string r = reason;
  if (r == "stop" && !res.output.tool_calls.empty() && plan_.api != PlanApi::kCompletion) {
    r = "tool_calls";
  }
  res.finish_reason = d.finish_reason = r;
  if (c.detok->stopped()) res.stop_sequence = d.stop_sequence = std::string(c.detok->stop_string());
}

void Generation::handle(Choice& c, TokenEvent& ev, ChoiceDelta& d) {
  ChoiceResult& res = results_[c.index];
  if (ev.cached_prompt_tokens >= 0 && c.index % plan_.n == 0)
    cached_tokens_ += ev.cached_prompt_tokens;
  if (!ev.prompt_logprobs.empty() ||
      (plan_.echo && base_.prompt_logprobs >= 0 && res.prompt_logprobs.empty() &&
       ev.cached_prompt_tokens >= 0)) {
    const auto& prompt = prompts_[c.prompt_index];
    for (size_t i = 0; i < prompt.size(); ++i) {
      float lp = i == 0 || i - 1 >= ev.prompt_logprobs.size() ? 0.0f : ev.prompt_logprobs[i - 1];
      std::vector<TopLogprob> top;
      if (i > 0 && i - 1 < ev.prompt_top_logprobs.size()) top = ev.prompt_top_logprobs[i - 1];
      res.prompt_logprobs.push_back(make_logprob(model_, prompt[i], lp, top));
    }
  }
  if (c.finished) return;
  if (ev.token >= 0) {
    if (ttft_ < 0) {
      ttft_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    }
    res.completion_tokens++;
    if (c.in_reasoning) res.reasoning_tokens++;
    if (think_end_ >= 0 && ev.token == think_end_) c.in_reasoning = false;
    if (think_start_ >= 0 && ev.token == think_start_) c.in_reasoning = true;
    if (!ev.hit_stop_token) {
      if (plan_.logprobs >= 0) {
        d.logprobs.push_back(make_logprob(model_, ev.token, ev.logprob, ev.top));
        res.logprobs.push_back(d.logprobs.back());
      }
      std::string text = c.detok->push(ev.token);
      if (!text.empty()) {
        res.text += text;
        auto evs = c.parser->feed(text);
        c.acc.add(evs);
        d.events.insert(d.events.end(), evs.begin(), evs.end());
      }
      if (c.detok->stopped()) {
        c.stream->cancel();
        finish_choice(c, d, "stop");
        return;
      }
    }
  }
  if (ev.finished) {
    switch (ev.finish_reason) {
      case FinishReason::kLength:
        finish_choice(c, d, "length");
        break;
      case FinishReason::kError:
        finish_choice(c, d, "error");
        res.error = d.error = ev.error.empty() ? "the engine failed this request" : ev.error;
        break;
      default:
        finish_choice(c, d, "stop");
        break;
    }
  }
}

std::vector<ChoiceDelta> Generation::poll(std::chrono::milliseconds timeout) {
  std::vector<ChoiceDelta> out;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    bool waited = false;
    for (auto& c : choices_) {
      if (c->finished) continue;
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      // Block on the first unfinished choice only; the others are drained without waiting.
      auto wait = !waited && out.empty() ? std::clamp(left, std::chrono::milliseconds(0),
                                                      std::chrono::milliseconds(50))
                                         : std::chrono::milliseconds(0);
      waited = true;
      auto events = c->stream->wait(wait);
      if (events.empty()) continue;
      ChoiceDelta d;
      d.index = c->index;
      for (auto& ev : events) handle(*c, ev, d);
      out.push_back(std::move(d));
    }
    if (!out.empty() || done() || std::chrono::steady_clock::now() >= deadline) return out;
  }
}

bool Generation::done() const {
  return std::all_of(choices_.begin(), choices_.end(), [](const auto& c) { return c->finished; });
}

void Generation::cancel() {
  // May run on another thread (drain): touches only the streams' atomic flags. Cancelling a
  // finished request is harmless.
  for (auto& c : choices_) {
    if (c->stream) c->stream->cancel();
  }
}

int Generation::prompt_tokens() const {
  int n = 0;
  for (const auto& p : prompts_) n += int(p.size());
  return n;
}

Usage Generation::usage() const {
  Usage u;
  u.prompt_tokens = prompt_tokens();
  u.cached_tokens = cached_tokens_;
  for (const auto& r : results_) {
    u.completion_tokens += r.completion_tokens;
    u.reasoning_tokens += r.reasoning_tokens;
  }
  return u;
}

int count_prompt_tokens(const ServedModel& model, const ModelSettings& settings,
                        const GenerationPlan& plan) {
  bool thinking = plan.enable_thinking.value_or(settings.thinking);
  return int(model.tokenizer->encode(render_chat_prompt(model, plan, thinking), false).size());
}

}  // namespace tokenmill::server
