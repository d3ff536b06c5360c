// The engine: one thread per model that runs continuous batching. Requests join and leave the
// running batch at every step; prompts prefill in chunks interleaved with decode steps; a
// request is admitted only when its KV blocks and state slot fit.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/request.h"
#include "tensor/dtype.h"

namespace tokenmill {

class Model;
class ThreadPool;

struct EngineOptions {
  int max_seqs = 16;          // sequences running at once
  int max_step_tokens = 512;  // tokens per forward (prefill chunk budget incl. decodes)
  int prefill_chunk = 256;    // largest prefill piece of one sequence per step
  bool prefer_decode = true;  // decode tokens are scheduled before new prefill chunks
  int kv_block_size = 16;     // positions per KV block
  int64_t kv_blocks = 0;      // 0: derived from memory_budget_bytes
  int64_t memory_budget_bytes = 2LL << 30;  // KV blocks + state slots
  DType kv_dtype = DType::F32;              // KV cache elements (F32 or BF16)
  int max_context = 0;  // 0: the model's max_position_embeddings (capped by memory)
  uint64_t seed = 0;    // seeds requests that give none
  // Host threads for per-row work between forwards (sampling rows of a step in parallel); may
  // be the CPU backend's pool, which the engine thread uses only between the model's ops. Not
  // owned; nullptr: one row after another. Results do not depend on it (each request samples
  // from its own generator).
  ThreadPool* host_pool = nullptr;
  // Decode steps whose tokens are picked on the device (greedy, or sampled without penalties:
  // Backend::pick_tokens) overlap: the next step is scheduled and launched while the last one
  // runs, its tokens taken from the device, when nothing the last step returns could change it
  // (no admission, no length limit reached, no host-side choice of the token). A stop token
  // then costs one discarded row. Off: every step waits for its results first (for comparison).
  // Only on backends whose ops run asynchronously (Backend::runs_asynchronously): on the CPU a
  // step is done when its launch returns, and overlapping would hold each token back a step.
  bool overlap_steps = true;
  // Tests: overlap there too (it only delays tokens), to check the overlap's bookkeeping
  // without a GPU.
  bool overlap_on_synchronous_backend = false;
};

struct EngineStats {
  int running = 0;
  int queued = 0;
  int64_t kv_blocks_total = 0, kv_blocks_used = 0;
  int state_slots_total = 0, state_slots_used = 0;
  int64_t cache_bytes_total = 0, cache_bytes_used = 0;
  uint64_t requests_total = 0, requests_finished = 0;
  uint64_t prompt_tokens = 0, generated_tokens = 0, cached_prompt_tokens = 0;
  uint64_t steps = 0;
  uint64_t steps_overlapped = 0;  // launched while the step before was still running
  // Steps whose logits came to the host for the engine's sampler (a row asked for logprobs,
  // prompt scoring or a grammar, or a pick the backend does not make): these neither overlap nor
  // leave the logits on the device.
  uint64_t steps_logits_to_host = 0;
  double last_batch_tokens = 0;
  int max_context = 0;
  DType kv_dtype = DType::F32;  // the KV cache's elements
};

// Reserves the model's step memory (Model::reserve_step: scratch and backend workspaces) for
// the largest step an engine with these options runs over sequences of at most max_context
// positions, so no step allocates. The Engine constructor calls it; a caller that measures free
// device memory before constructing the engine (tokenmill serve's automatic cache budget)
// calls it first so the measurement sees the reservation.
void reserve_engine_steps(Model& model, const EngineOptions& options, int max_context);

class Engine {
 public:
  Engine(Model& model, const EngineOptions& options);
  ~Engine();  // cancels everything and joins the thread
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. Throws tokenmill::Error (an invalid request: 400) when it can never run:
  // empty prompt, prompt + max_tokens beyond the context window or the memory budget, ids
  // outside the vocabulary. The message gives the numbers.
  std::shared_ptr<RequestStream> submit(GenerationRequest request);
  // Queues several requests at once: each is checked as submit() checks it, and nothing is
  // queued when any is invalid; the engine sees them together, so the first step can take them
  // all (the choices of one API call, a benchmark's batch). Streams in the requests' order.
  std::vector<std::shared_ptr<RequestStream>> submit_all(std::vector<GenerationRequest> requests);
  EngineStats stats() const;
  int max_context() const;
  int32_t vocab_size() const;

  // Cancels all requests and waits up to timeout_ms for running ones to finish.
  void shutdown(int timeout_ms);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tokenmill
