// The generation adapter: a validated GenerationPlan -> chat template -> tokens -> n engine
// requests (choice i gets seed + i) -> per-event detokenize + output parse -> ChoiceDeltas for
// the response writers. Runs on the HTTP thread that owns the request; the engine sees ids only.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/request.h"
#include "server/generation_config.h"
#include "server/plan.h"
#include "server/settings.h"
#include "text/output_parser.h"

namespace tokenmill {
class Engine;
class Tokenizer;
class ChatTemplate;
}  // namespace tokenmill

namespace tokenmill::server {

class ToolCallGrammar;
struct TokenOrder;

// A model the server serves: the engine and text layer objects, owned by the caller (serve).
struct ServedModel {
  std::string name;  // id in /v1/models
  std::string path;  // model directory (matches ModelSettings::path)
  Engine* engine = nullptr;
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;  // null: chat requests get 400
  std::string chat_template_source;             // Jinja source (picks the output parser)
  std::string model_type;                       // config.json model_type
  std::vector<int32_t> stop_ids;                // end-of-generation ids (eos, <|im_end|>)
  GenerationConfig generation_config;           // the directory's generation_config.json
  std::string device;                           // the backend's name (Backend::name)
  PrecisionModes precision;                     // the backend's modes in effect
  // Byte string of every token id (precomputed once; used by logprobs and JSON constraints).
  std::shared_ptr<const std::vector<std::string>> token_bytes;
  std::vector<uint8_t> token_special;             // 1 for special added tokens
  std::shared_ptr<const TokenOrder> token_order;  // token_bytes sorted (tool-call constraints)
};

// Fills token_bytes / token_special / token_order from the tokenizer (byte-level BPE vocabulary
// strings are mapped back to bytes; SentencePiece "\u2581" is a space and <0xNN> a byte).
void compute_token_bytes(ServedModel& m);

struct TokenLogprob {
  int32_t id = -1;
  std::string bytes;  // the token's bytes (may be part of a UTF-8 character)
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;  // bytes, logprob
};

// What a choice produced since the last poll.
struct ChoiceDelta {
  int index = 0;
  std::vector<OutputEvent> events;     // reasoning / content / tool-call events, in order
  std::vector<TokenLogprob> logprobs;  // generated tokens received in this poll
  std::string finish_reason;           // "" while running; stop | length | tool_calls
  std::string stop_sequence;           // the stop string that ended it, if one did
  std::string error;                   // finish_reason "error": what went wrong
};

// A choice's whole reply (non-streaming responses; usage).
struct ChoiceResult {
  int index = 0;
  ParsedOutput output;
  std::string text;  // raw detokenized text (completions)
  std::vector<TokenLogprob> logprobs;
  std::string finish_reason, stop_sequence, error;
  int completion_tokens = 0, reasoning_tokens = 0;
  // /v1/completions echo: the prompt's tokens and their scores (first one has none).
  std::vector<TokenLogprob> prompt_logprobs;
  std::string prompt_text;
};

struct Usage {
  int prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0, reasoning_tokens = 0;
};

class Generation {
 public:
  // Renders and tokenizes the prompt(s) and resolves limits and defaults. Throws ApiError (400)
  // for requests that can never run (no chat template, prompt or max_tokens beyond limits).
  Generation(const ServedModel& model, const ModelSettings& settings, GenerationPlan plan);
  ~Generation();  // cancels unfinished choices
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  // Submits every choice to the engine; an engine refusal becomes ApiError 400.
  void start();
  // Waits up to `timeout` for events; returns the deltas of choices that advanced.
  std::vector<ChoiceDelta> poll(std::chrono::milliseconds timeout);
  bool done() const;
  // Cancels every unfinished choice (client gone); their sequences are freed by the engine.
  void cancel();

  const GenerationPlan& plan() const { return plan_; }
  const ServedModel& model() const { return model_; }
  int prompt_tokens() const;  // summed over prompts (each counted once, not per choice)
  Usage usage() const;
  const std::vector<ChoiceResult>& results() const { return results_; }
  // Reasoning is on in the prompt; show_reasoning: it is sent to the client (the Anthropic API
  // hides it unless the request enabled thinking).
  bool thinking_enabled() const { return thinking_; }
  bool show_reasoning() const {
    return plan_.api != PlanApi::kAnthropic || plan_.enable_thinking.value_or(false);
  }
  const std::string& request_id() const { return request_id_; }
  // Seconds from start() to the first generated token (-1 until then), for metrics.
  double ttft_seconds() const { return ttft_; }

 private:
  struct Choice;
  void handle(Choice& c, TokenEvent& ev, ChoiceDelta& d);
  void finish_choice(Choice& c, ChoiceDelta& d, const std::string& reason);
  // tool_choice required / named: compiles the constraint that forces a tool call.
  void compile_tool_choice();

  const ServedModel& model_;
  ModelSettings settings_;
  GenerationPlan plan_;
  std::string request_id_;
  std::vector<std::vector<int32_t>> prompts_;
  std::vector<std::string> prompt_texts_;
  OutputParserOptions parser_options_;
  GenerationRequest base_;
  bool thinking_ = false;
  int32_t think_start_ = -1;
  int32_t think_end_ = -1;              // counts reasoning tokens (the engine may not know it)
  bool in_reasoning_at_start_ = false;  // the prompt opened the reasoning block
  std::shared_ptr<const ToolCallGrammar> tool_grammar_;  // tool_choice required / named
  std::vector<std::unique_ptr<Choice>> choices_;
  std::vector<ChoiceResult> results_;
  int cached_tokens_ = 0;
  std::chrono::steady_clock::time_point started_;
  double ttft_ = -1;
};

// Tokens of a /v1/messages/count_tokens or chat prompt, as the model would see it.
int count_prompt_tokens(const ServedModel& model, const ModelSettings& settings,
                        const GenerationPlan& plan);

}  // namespace tokenmill::server
