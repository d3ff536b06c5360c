// What the engine accepts and what it streams back. The engine sees token ids only: templates,
// tokenization and detokenization happen on the caller's (HTTP or CLI) thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tokenmill {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  float top_p = 1.0f;        // 1 = off
  int top_k = 0;             // 0 = off
  float min_p = 0.0f;        // 0 = off
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::optional<uint64_t> seed;  // absent: drawn from the engine's seed sequence
  // Logprobs of each generated token: -1 none; 0 the chosen token's only; k > 0 also the top k.
  int logprobs = -1;
};

// Restricts which tokens may come next (grammar-constrained decoding). Called on the engine
// thread, once per generated token, in order.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Sets allowed[id] = 0 for every token that may not come next (allowed has vocab entries,
  // all 1 on entry).
  virtual void mask(std::vector<uint8_t>& allowed) = 0;
  // The sampled token; returns false if it ends the constrained output (a complete value).
  virtual bool accept(int32_t token) = 0;
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int max_tokens = 256;                 // generated tokens, at most
  std::vector<int32_t> stop_token_ids;  // end of generation (eos ids); not emitted as text
  bool ignore_eos = false;
  // Prompt scoring: logprob of every prompt token after the first (and top k when > 0);
  // -1 = none. Used by /v1/completions echo with logprobs.
  int prompt_logprobs = -1;
  // Reasoning budget: after `reasoning_budget` tokens inside reasoning with no `think_end`
  // token, the engine forces `think_end`. -1 = no budget. `starts_in_reasoning`: the prompt
  // already opened the reasoning block.
  int reasoning_budget = -1;
  int32_t think_end_token = -1;
  bool starts_in_reasoning = false;
  std::shared_ptr<TokenConstraint> constraint;  // may be null
};

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };

struct TopLogprob {
  int32_t token;
  float logprob;
};

// One event of a request's stream. Tokens arrive in order; exactly one event has finished=true
// and it is the last.
struct TokenEvent {
  int32_t token = -1;  // -1 for an event that carries no token (prompt scores, finish, error)
  float logprob = 0.0f;
  std::vector<TopLogprob> top;  // when requested
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  bool hit_stop_token = false;  // the token is a stop token (callers emit no text for it)
  std::string error;            // set with kError
  // Sent once, with the first event: prompt tokens served from the prefix cache, and the
  // prompt logprobs when requested (entry i scores prompt[i+1]).
  int cached_prompt_tokens = -1;
  std::vector<float> prompt_logprobs;
  std::vector<std::vector<TopLogprob>> prompt_top_logprobs;
  // When the engine queued the event (RequestStream::push): callers that drain the stream in
  // bursts still see each token's own time.
  std::chrono::steady_clock::time_point queued_at{};
};

// The caller's side of a submitted request: a thread-safe queue of events.
class RequestStream {
 public:
  explicit RequestStream(uint64_t id) : id_(id) {}
  uint64_t id() const { return id_; }

  // Waits up to `timeout` for events; returns all pending ones (empty on timeout).
  std::vector<TokenEvent> wait(std::chrono::milliseconds timeout);
  // Asks the engine to stop this request; its memory is freed at the engine's next step and a
  // final event with kCancelled follows.
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

  // Engine side.
  void push(TokenEvent ev);

 private:
  uint64_t id_;
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TokenEvent> events_;
};

}  // namespace tokenmill
