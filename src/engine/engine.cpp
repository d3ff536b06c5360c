// The engine loop: continuous batching over one model.
//
// Every sequence is "tokens = prompt + output" and "cached = how many of them the caches hold".
// A step feeds each scheduled sequence the next uncached tokens (a prefill chunk, or the one
// token sampled last step); when a sequence's cache catches up with its tokens, the logits of its
// last row give the next token. Prefill, decode and recompute after preemption are therefore one
// mechanism. Only this thread touches the caches.
#include "engine/engine.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "cache/cache_manager.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "model/model.h"
#include "util/error.h"
#include "util/log.h"
#include "util/thread_pool.h"

namespace tokenmill {

struct Engine::Impl {
  Model& model;
  EngineOptions opt;
  std::unique_ptr<CacheManager> cache;
  int max_context = 0;

  mutable std::mutex mu;
  std::condition_variable cv;
  std::deque<std::unique_ptr<Sequence>> incoming;  // submitted, not yet seen by the loop
  bool stop = false;
  uint64_t next_id = 1;
  EngineStats stats;

  // Engine-thread state.
  std::deque<std::unique_ptr<Sequence>> waiting;
  std::vector<std::unique_ptr<Sequence>> running;
  // A step's logits on the host, page-locked (Backend::register_host) while they fit
  // kLockedLogitsBytes, so a step that samples 64 rows of a 248k vocabulary (64 MB) downloads
  // at the link's speed, not through pageable staging.
  std::vector<float> logits;
  float* logits_locked = nullptr;  // the registered buffer (logits.data()), or null
  size_t logits_locked_floats = 0;
  bool lock_refused = false;  // the system refused to lock it once: stay pageable
  static constexpr size_t kLockedLogitsBytes = size_t{256} << 20;
  std::vector<int32_t> picked_ids;  // a step's token per logit row (Model::collect_picks)
  StepPicks picks;  // how each logit row of an ids-only step is picked (Model::launch_picks)
  // A step launched and not yet collected (at most one): per plan entry its sequence,
  // its logit row, and where its token goes (an index of s.tokens holding kPendingToken; -1:
  // none) when `outputs` (its prefill is complete after the step). While it runs, the next step
  // can be scheduled and launched behind it, taking those tokens from the device.
  struct LaunchedRow {
    Sequence* seq;
    int logit_row;
    int token_index;
    bool outputs;
  };
  struct Launched {
    std::vector<LaunchedRow> rows;
  };
  std::optional<Launched> launched;
  // Finished sequences a launched step may still name; freed once none is in flight.
  std::vector<std::unique_ptr<Sequence>> retired;
  std::vector<float> work;  // the logits a sampler may modify (penalties, masks)
  std::vector<uint8_t> allowed;
  // Sampled ahead, in parallel on opt.host_pool: token per plan entry (-1: chosen in order), and
  // per-thread scratch rows.
  std::vector<int32_t> presampled;
  std::vector<std::vector<float>> pool_work;
  std::thread thread;

  Impl(Model& m, const EngineOptions& o) : model(m), opt(o) {
    // A backend that runs each op as it is called has finished a step when its launch returns.
    opt.overlap_steps =
        o.overlap_steps && (m.backend().runs_asynchronously() || o.overlap_on_synchronous_backend);
  }
  ~Impl() { unlock_logits(); }
  // Sizes `logits` for a step of `floats` logits, page-locked when they fit.
  void prepare_logits(size_t floats);
  void unlock_logits();
  void loop();
  void step();
  // Done sequences leave running/waiting (into retired while a step is in flight).
  void prune();
  // Whether the next step can be scheduled while the launched one runs (see step()).
  bool can_continue() const;
  // Whether the sequence's next token can be picked next to the logits (Backend::penalize_rows
  // and pick_tokens): no logprobs, prompt scoring or constraint, and a pick the backend makes.
  bool picks_on_device(const Sequence& s) const;
  // Whether the penalties of these sequences fit one step of the backend's (their entries).
  template <class Range, class Seq>
  bool penalties_fit(const Range& r, Seq seq) const;
  // After launching an ids-only step: caches advanced, a pending token per completed prefill.
  Launched advance(const std::vector<StepEntry>& entries);
  // Waits for the launched step's ids and delivers its tokens.
  void complete_launched();
  // A sequence's next output is about to be token `index`: the first event's prompt fields;
  // false when the request asked for no tokens (then it is finished).
  bool begin_output(Sequence& s, int index, TokenEvent& ev);
  // Delivers s.tokens[index], the sequence's newest output: sampler, reasoning, constraint,
  // stop and length checks, the event.
  void emit(Sequence& s, int index, TokenEvent ev);
  // After a failed step: drops the launched step and its finished sequences.
  void abandon_launched();
  void presample(const std::vector<StepEntry>& entries, int V);
  void finish(Sequence& s, FinishReason why, const std::string& error = {});
  void release(Sequence& s);
  void update_stats();
};

void reserve_engine_steps(Model& model, const EngineOptions& options, int max_context) {
  // A step holds at most max_step_tokens rows of at most max_seqs sequences (the scheduler's
  // budgets), each with a block table covering at most max_context positions.
  const int block = options.kv_block_size;
  TM_CHECK(block > 0, "kv_block_size must be positive, got {}", block);
  const int max_blocks = static_cast<int>((int64_t{std::max(max_context, 0)} + block - 1) / block);
  model.reserve_step(options.max_step_tokens, options.max_seqs, max_blocks, block);
}

Engine::Engine(Model& model, const EngineOptions& options)
    : impl_(std::make_unique<Impl>(model, options)) {
  Impl& I = *impl_;
  const CacheGeometry& geo = model.geometry();
  CacheOptions co;
  if (options.kv_blocks > 0) {
    co.block_size = options.kv_block_size;
    co.num_blocks = options.kv_blocks;
    co.num_slots = options.max_seqs;
    co.kv_dtype = options.kv_dtype;
  } else {
    co = CacheManager::plan(geo, options.memory_budget_bytes, options.max_seqs,
                            options.kv_block_size, options.kv_dtype);
  }
  I.cache = std::make_unique<CacheManager>(model.backend(), geo, co);
  int64_t by_memory = co.num_blocks * co.block_size;
  int64_t by_model = model.config().max_position_embeddings > 0
                         ? model.config().max_position_embeddings
                         : by_memory;
  int64_t ctx = options.max_context > 0 ? options.max_context : by_model;
  if (geo.attention_layers > 0) ctx = std::min(ctx, by_memory);
  I.max_context = static_cast<int>(std::min<int64_t>(ctx, 1 << 30));
  I.stats.kv_blocks_total = co.num_blocks;
  I.stats.state_slots_total = co.num_slots;
  I.stats.cache_bytes_total = I.cache->bytes();
  I.stats.max_context = I.max_context;
  I.stats.kv_dtype = options.kv_dtype;
  // Steps allocate nothing: their memory is reserved here, before the first one.
  reserve_engine_steps(model, options, I.max_context);
  I.thread = std::thread([this] { impl_->loop(); });
}

Engine::~Engine() {
  shutdown(0);
}

int Engine::max_context() const {
  return impl_->max_context;
}
int32_t Engine::vocab_size() const {
  return static_cast<int32_t>(impl_->model.config().vocab_size);
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

namespace {
// The ranges the sampler is defined on; the HTTP APIs and settings check theirs before this, so
// this catches the other callers (CLI flags, embedders) with the same words.
void check_sampling(const SamplingParams& sp) {
  if (!std::isfinite(sp.temperature) || sp.temperature < 0.0f)
    fail("temperature must be a finite number >= 0 (0 = greedy), got {}", sp.temperature);
  if (!(sp.top_p > 0.0f && sp.top_p <= 1.0f))
    fail("top_p must be in (0, 1] (1 = off), got {}", sp.top_p);
  if (sp.top_k < 0) fail("top_k must be >= 0 (0 = off), got {}", sp.top_k);
  if (!(sp.min_p >= 0.0f && sp.min_p <= 1.0f))
    fail("min_p must be in [0, 1] (0 = off), got {}", sp.min_p);
  if (!std::isfinite(sp.repetition_penalty) || sp.repetition_penalty <= 0.0f)
    fail("repetition_penalty must be a finite number > 0 (1 = off), got {}", sp.repetition_penalty);
  if (!std::isfinite(sp.presence_penalty) || !std::isfinite(sp.frequency_penalty))
    fail("presence_penalty and frequency_penalty must be finite, got {} and {}",
         sp.presence_penalty, sp.frequency_penalty);
}

// What a step does with a sequence's rows, the same in step() and presample(): whether its
// entry's rows score the prompt (one logit row per token, the last one also the sampling row),
// whether its next token is the forced end of reasoning, and whether a constraint masks it.
bool scores_prompt(const Sequence& s) {
  return s.req.prompt_logprobs >= 0 && s.cached < s.prompt_len && !s.prompt_scored;
}
bool forced_reasoning_end(const Sequence& s) {
  return s.req.reasoning_budget >= 0 && s.in_reasoning &&
         s.reasoning_tokens >= s.req.reasoning_budget && s.req.think_end_token >= 0;
}
bool constrained_now(const Sequence& s) {
  return s.req.constraint && !s.in_reasoning;
}
// The placeholder of a token a launched step is still computing.
constexpr int32_t kPendingToken = -1;

// Why a request can never run (submit's checks), thrown as tokenmill::Error.
void check_request(const GenerationRequest& req, int64_t vocab, int max_context) {
  if (req.prompt.empty()) fail("the prompt is empty: send at least one token");
  for (int32_t t : req.prompt) {
    if (t < 0 || t >= vocab)
      fail("prompt token id {} is outside the vocabulary (0..{})", t, vocab - 1);
  }
  if (req.max_tokens < 0) fail("max_tokens must be >= 0, got {}", req.max_tokens);
  check_sampling(req.sampling);
  const int64_t total = static_cast<int64_t>(req.prompt.size()) + req.max_tokens;
  if (total > max_context) {
    fail(
        "prompt ({} tokens) + max_tokens ({}) = {} exceeds the context window of {} tokens; "
        "shorten the prompt or lower max_tokens",
        req.prompt.size(), req.max_tokens, total, max_context);
  }
  if (req.constraint && req.sampling.logprobs > 20) fail("top_logprobs must be at most 20");
}
}  // namespace

std::shared_ptr<RequestStream> Engine::submit(GenerationRequest req) {
  std::vector<GenerationRequest> one;
  one.push_back(std::move(req));
  return submit_all(std::move(one)).front();
}

std::vector<std::shared_ptr<RequestStream>> Engine::submit_all(
    std::vector<GenerationRequest> requests) {
  Impl& I = *impl_;
  for (const GenerationRequest& req : requests) {
    check_request(req, I.model.config().vocab_size, I.max_context);
  }
  std::vector<std::shared_ptr<RequestStream>> streams;
  streams.reserve(requests.size());
  {
    std::lock_guard<std::mutex> lock(I.mu);
    if (I.stop) fail("the engine is shutting down");
    for (GenerationRequest& req : requests) {
      auto seq = std::make_unique<Sequence>();
      seq->id = I.next_id++;
      uint64_t seed = req.sampling.seed ? *req.sampling.seed : I.opt.seed * 1000003u + seq->id;
      seq->sampler = std::make_unique<Sampler>(req.sampling, seed, req.prompt);
      seq->tokens = req.prompt;
      seq->prompt_len = static_cast<int>(req.prompt.size());
      seq->in_reasoning = req.starts_in_reasoning;
      auto stream = std::make_shared<RequestStream>(seq->id);
      seq->stream = stream;
      seq->req = std::move(req);
      I.incoming.push_back(std::move(seq));
      I.stats.requests_total++;
      I.stats.queued++;
      streams.push_back(std::move(stream));
    }
  }
  I.cv.notify_all();
  return streams;
}

void Engine::shutdown(int timeout_ms) {
  Impl& I = *impl_;
  {
    std::lock_guard<std::mutex> lock(I.mu);
    if (!I.thread.joinable()) return;
    if (timeout_ms > 0) {
      // Let running requests finish for up to timeout_ms before cancelling.
      I.mu.unlock();
      auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
      while (std::chrono::steady_clock::now() < until) {
        {
          std::lock_guard<std::mutex> l2(I.mu);
          if (I.stats.running == 0 && I.stats.queued == 0) break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      I.mu.lock();
    }
    I.stop = true;
  }
  I.cv.notify_all();
  I.thread.join();
}

void Engine::Impl::release(Sequence& s) {
  cache->release(s.blocks);
  if (s.slot >= 0) cache->release_slot(s.slot);
  s.slot = -1;
  s.cached = 0;
}

void Engine::Impl::finish(Sequence& s, FinishReason why, const std::string& error) {
  TokenEvent ev;
  ev.finished = true;
  ev.finish_reason = why;
  ev.error = error;
  if (!s.sent_first) {
    ev.cached_prompt_tokens = 0;
    s.sent_first = true;
  }
  s.stream->push(std::move(ev));
  s.done = true;
  release(s);
}

void Engine::Impl::prepare_logits(size_t floats) {
  // Model::forward resizes `logits` to `floats`: within the locked capacity it stays put.
  if (floats <= logits_locked_floats) return;
  unlock_logits();
  // A long prompt scored stays pageable.
  if (lock_refused || floats * sizeof(float) > kLockedLogitsBytes) return;
  const size_t want =
      std::min(std::max(floats, 2 * logits.size()), kLockedLogitsBytes / sizeof(float));
  logits.resize(want);
  try {
    model.backend().register_host(logits.data(), want * sizeof(float));
  } catch (const std::exception& e) {
    // E.g. a memory-lock limit: slower downloads, the same results.
    log::warn("page-locking {} MB for logits failed, downloading through pageable memory: {}",
              want * sizeof(float) >> 20, e.what());
    lock_refused = true;
    return;
  }
  logits_locked = logits.data();
  logits_locked_floats = want;
}

void Engine::Impl::unlock_logits() {
  if (logits_locked == nullptr) return;
  float* p = logits_locked;
  logits_locked = nullptr;
  logits_locked_floats = 0;
  try {
    model.backend().unregister_host(p);
  } catch (const std::exception& e) {
    log::error("unlocking the logits buffer failed: {}", e.what());
  }
}

void Engine::Impl::abandon_launched() {
  launched.reset();
  try {
    model.discard_launched();
  } catch (const std::exception& e) {
    log::error("dropping a launched step failed: {}", e.what());
  }
  retired.clear();
}

void Engine::Impl::update_stats() {
  std::lock_guard<std::mutex> lock(mu);
  stats.requests_finished = stats.requests_total - static_cast<uint64_t>(running.size()) -
                            static_cast<uint64_t>(waiting.size() + incoming.size());
  stats.running = static_cast<int>(running.size());
  stats.queued = static_cast<int>(waiting.size() + incoming.size());
  stats.kv_blocks_used = cache->total_blocks() - cache->free_blocks();
  stats.state_slots_used = cache->total_slots() - cache->free_slots();
  const CacheGeometry& g = model.geometry();
  stats.cache_bytes_used =
      stats.kv_blocks_used * cache->block_size() * g.kv_bytes_per_token(opt.kv_dtype) +
      int64_t{stats.state_slots_used} * g.state_bytes_per_seq();
}

void Engine::Impl::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] {
        return stop || !incoming.empty() || !running.empty() || !waiting.empty() || launched;
      });
      if (stop) break;
      while (!incoming.empty()) {
        waiting.push_back(std::move(incoming.front()));
        incoming.pop_front();
      }
    }
    try {
      step();
    } catch (const std::exception& e) {
      // A failed step fails the sequences in it; the engine keeps serving the rest.
      log::error("engine step failed: {}", e.what());
      abandon_launched();
      for (auto& s : running) {
        if (!s->done) finish(*s, FinishReason::kError, e.what());
      }
      running.clear();
    }
    update_stats();
  }
  abandon_launched();
  for (auto& s : running) {
    if (!s->done) finish(*s, FinishReason::kCancelled);
  }
  for (auto& s : waiting) finish(*s, FinishReason::kCancelled);
  std::lock_guard<std::mutex> lock(mu);
  for (auto& s : incoming) finish(*s, FinishReason::kCancelled);
  running.clear();
  waiting.clear();
  incoming.clear();
}

void Engine::Impl::prune() {
  for (auto& s : running) {
    if (s->done) retired.push_back(std::move(s));
  }
  std::erase_if(running, [](const auto& s) { return s == nullptr; });
  std::erase_if(waiting, [](const auto& s) { return s->done; });
  if (!launched) retired.clear();
}

bool Engine::Impl::picks_on_device(const Sequence& s) const {
  if (s.req.prompt_logprobs >= 0 || s.req.sampling.logprobs >= 0 || s.req.constraint) return false;
  return model.backend().can_pick(s.sampler->device_pick(), model.config().vocab_size);
}

template <class Range, class Seq>
bool Engine::Impl::penalties_fit(const Range& r, Seq seq) const {
  int64_t n = 0;
  for (const auto& x : r) n += static_cast<int64_t>(seq(x).sampler->penalty_entry_count());
  return n <= model.backend().max_penalty_entries();
}

bool Engine::Impl::can_continue() const {
  if (!launched || !opt.overlap_steps) return false;
  // A sequence admitted now would prefill from host tokens while the others wait: run it the
  // ordinary way.
  if (!waiting.empty() && static_cast<int>(running.size()) < opt.max_seqs) return false;
  int64_t new_blocks = 0;
  for (const auto& sp : running) {
    const Sequence& s = *sp;
    const bool decoding = s.uncached() == 1 && s.cached >= s.prompt_len;
    // Its next token must be the device's pick: no forced end of reasoning, no constraint, no
    // logits on the host; and the token pending from the launched step must not end it.
    if (!decoding || !picks_on_device(s) || forced_reasoning_end(s)) return false;
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    if (n - s.prompt_len >= s.req.max_tokens || n >= max_context) return false;
    new_blocks += std::max<int64_t>(
        0, cache->blocks_for(s.cached + 1) - static_cast<int64_t>(s.blocks.size()));
  }
  // So scheduling preempts nobody, and the step can take its penalties on the device.
  return new_blocks <= cache->free_blocks() &&
         penalties_fit(running, [](const auto& sp) -> const Sequence& { return *sp; });
}

void Engine::Impl::step() {
  // Cancelled requests leave first and free their memory.
  auto drop_cancelled = [&](auto& list) {
    for (auto& s : list) {
      if (s && !s->done && s->stream->cancelled()) finish(*s, FinishReason::kCancelled);
    }
  };
  drop_cancelled(running);
  drop_cancelled(waiting);
  prune();
  // The launched step stays in flight while the next one is scheduled and launched behind it
  // only when the next one is certain to be what its results would have decided.
  if (launched && !can_continue()) {
    complete_launched();
    prune();
  }

  SchedulerConfig sc{opt.max_seqs, opt.max_step_tokens, opt.prefill_chunk, opt.prefer_decode};
  StepPlan plan = schedule_step(sc, *cache, waiting, running);
  if (plan.entries.empty()) {
    if (launched) complete_launched();
    prune();
    return;
  }

  Batch batch;
  for (const StepEntry& e : plan.entries) {
    Sequence& s = *e.seq;
    std::vector<int32_t> ids(s.tokens.begin() + s.cached, s.tokens.begin() + s.cached + e.n_tokens);
    const int first_row = batch.n_tokens();
    batch.add_sequence(ids, s.cached, s.slot, s.blocks, scores_prompt(s));
    if (launched) {
      // A token the launched step is computing: taken from its ids on the device.
      for (const LaunchedRow& r : launched->rows) {
        if (r.seq == &s && r.token_index >= s.cached && r.token_index < s.cached + e.n_tokens) {
          batch.tokens_from_last_step.emplace_back(first_row + (r.token_index - s.cached),
                                                   r.logit_row);
        }
      }
    }
  }
  // A step whose every row is picked on the device (no logprobs, prompt scoring or constraint)
  // takes only the ids from it, not rows x vocab logits.
  const bool ids_only =
      std::all_of(plan.entries.begin(), plan.entries.end(),
                  [&](const StepEntry& e) { return picks_on_device(*e.seq); }) &&
      penalties_fit(plan.entries, [](const StepEntry& e) -> const Sequence& { return *e.seq; });
  {
    std::lock_guard<std::mutex> lock(mu);
    stats.steps++;
    if (launched) stats.steps_overlapped++;
    stats.last_batch_tokens = batch.n_tokens();
  }
  if (ids_only) {
    // One logit row per entry. A row that yields a token takes the next draw of its sequence's
    // generator (even if a forced end of reasoning replaces the token later, so overlapped and
    // waiting steps draw alike); the rows of unfinished prefills are greedy and unused.
    // A penalized row lists the tokens its sequence's host knows; the model adds the one still
    // on the device.
    const size_t n = plan.entries.size();
    picks.picks.assign(n, TokenPick{});
    picks.penalties.assign(n, PenaltyRow{});
    picks.entries.clear();
    bool penalized = false;
    for (size_t i = 0; i < n; ++i) {
      Sequence& s = *plan.entries[i].seq;
      const bool outputs = s.cached + plan.entries[i].n_tokens == static_cast<int>(s.tokens.size());
      if (!outputs || s.req.max_tokens == 0) continue;
      picks.picks[i] = s.sampler->device_pick();
      if (!picks.picks[i].greedy()) picks.picks[i].u = s.sampler->next_uniform();
      PenaltyRow& pr = picks.penalties[i];
      pr.penalties = s.sampler->penalties();
      if (!pr.penalties.any()) continue;
      penalized = true;
      pr.first = static_cast<int32_t>(picks.entries.size());
      s.sampler->penalty_entries(&picks.entries);
      pr.count = static_cast<int32_t>(picks.entries.size()) - pr.first;
    }
    if (!penalized) picks.penalties.clear();
    model.launch_picks(batch, cache->views(), &picks);
    Launched next = advance(plan.entries);
    if (launched) complete_launched();  // the step before, which ran ahead of this one
    launched = std::move(next);
    if (!opt.overlap_steps) complete_launched();
    prune();
    return;
  }
  TM_CHECK(!launched, "a step that needs logits was scheduled behind a launched step");
  {
    std::lock_guard<std::mutex> lock(mu);
    stats.steps_logits_to_host++;
  }
  prepare_logits(batch.logit_rows.size() * static_cast<size_t>(model.config().vocab_size));
  model.forward(batch, cache->views(), &logits);
  const int V = static_cast<int>(model.config().vocab_size);
  presampled.assign(plan.entries.size(), -1);
  presample(plan.entries, V);

  size_t row = 0;
  for (size_t ei = 0; ei < plan.entries.size(); ++ei) {
    const StepEntry& e = plan.entries[ei];
    Sequence& s = *e.seq;
    bool score_prompt = scores_prompt(s);
    int first = s.cached;
    s.cached += e.n_tokens;
    if (score_prompt) {
      // Row i scores token first+i+1 while that token is still part of the prompt.
      for (int i = 0; i < e.n_tokens; ++i, ++row) {
        int target = first + i + 1;
        if (target >= s.prompt_len) continue;
        std::vector<TopLogprob> top;
        float lp =
            token_logprob(&logits[row * V], V, s.tokens[target], s.req.prompt_logprobs, &top);
        s.prompt_lps.push_back(lp);
        s.prompt_tops.push_back(std::move(top));
      }
      --row;  // the last row is also the sampling row below
      if (s.cached >= s.prompt_len) s.prompt_scored = true;
    }
    const size_t this_row = row++;
    const float* lrow = &logits[this_row * V];
    if (s.cached < static_cast<int>(s.tokens.size())) continue;  // prefill not finished
    TokenEvent ev;
    if (!begin_output(s, static_cast<int>(s.tokens.size()), ev)) continue;
    // Choose the next token: a forced end of reasoning, or a (constrained) sample.
    int32_t tok;
    if (forced_reasoning_end(s)) {
      tok = s.req.think_end_token;
    } else {
      const uint8_t* mask = nullptr;
      if (constrained_now(s)) {
        allowed.assign(static_cast<size_t>(V), 1);
        s.req.constraint->mask(allowed);
        mask = allowed.data();
      }
      // sample_row copies the row only when a penalty or the mask changes it.
      tok = presampled[ei] >= 0 ? presampled[ei] : s.sampler->sample_row(lrow, V, mask, &work);
    }
    if (s.req.sampling.logprobs >= 0) {
      ev.logprob = token_logprob(lrow, V, tok, s.req.sampling.logprobs, &ev.top);
    }
    s.tokens.push_back(tok);
    emit(s, static_cast<int>(s.tokens.size()) - 1, std::move(ev));
  }
  prune();
}

Engine::Impl::Launched Engine::Impl::advance(const std::vector<StepEntry>& entries) {
  // One logit row per entry: an ids-only step scores no prompt.
  Launched l;
  for (size_t i = 0; i < entries.size(); ++i) {
    Sequence& s = *entries[i].seq;
    s.cached += entries[i].n_tokens;
    LaunchedRow r{&s, static_cast<int>(i), -1, false};
    if (s.cached == static_cast<int>(s.tokens.size())) {
      r.outputs = true;
      if (s.req.max_tokens > 0) {
        r.token_index = static_cast<int>(s.tokens.size());
        s.tokens.push_back(kPendingToken);
      }
    }
    l.rows.push_back(r);
  }
  return l;
}

void Engine::Impl::complete_launched() {
  model.collect_picks(&picked_ids);
  Launched l = std::move(*launched);
  launched.reset();
  for (const LaunchedRow& r : l.rows) {
    Sequence& s = *r.seq;
    // Finished since the launch (a stop token of the step before, a cancel): its row is moot.
    if (s.done || !r.outputs) continue;
    TokenEvent ev;
    const int index = r.token_index >= 0 ? r.token_index : static_cast<int>(s.tokens.size());
    if (!begin_output(s, index, ev)) continue;
    s.tokens[static_cast<size_t>(index)] = forced_reasoning_end(s)
                                               ? s.req.think_end_token
                                               : picked_ids[static_cast<size_t>(r.logit_row)];
    emit(s, index, std::move(ev));
  }
}

bool Engine::Impl::begin_output(Sequence& s, int index, TokenEvent& ev) {
  if (index == s.prompt_len) {
    std::lock_guard<std::mutex> lock(mu);
    stats.prompt_tokens += static_cast<uint64_t>(s.prompt_len);
  }
  if (!s.sent_first) {
    ev.cached_prompt_tokens = 0;
    ev.prompt_logprobs = std::move(s.prompt_lps);
    ev.prompt_top_logprobs = std::move(s.prompt_tops);
    s.sent_first = true;
  }
  if (s.req.max_tokens == 0) {
    s.stream->push(std::move(ev));
    finish(s, FinishReason::kLength);
    return false;
  }
  return true;
}

void Engine::Impl::emit(Sequence& s, int index, TokenEvent ev) {
  const int32_t tok = s.tokens[static_cast<size_t>(index)];
  s.sampler->accept(tok);
  ev.token = tok;
  bool is_stop = !s.req.ignore_eos &&
                 std::find(s.req.stop_token_ids.begin(), s.req.stop_token_ids.end(), tok) !=
                     s.req.stop_token_ids.end();
  ev.hit_stop_token = is_stop;
  if (s.in_reasoning) {
    if (tok == s.req.think_end_token) {
      s.in_reasoning = false;
    } else {
      s.reasoning_tokens++;
    }
  }
  bool constraint_done = false;
  if (s.req.constraint && !s.in_reasoning && tok != s.req.think_end_token && !is_stop) {
    constraint_done = !s.req.constraint->accept(tok);
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    stats.generated_tokens++;
  }
  s.stream->push(std::move(ev));
  // Counted up to this token: a token launched after it (still pending) is not an output yet.
  if (is_stop || constraint_done) {
    finish(s, FinishReason::kStop);
  } else if (index + 1 - s.prompt_len >= s.req.max_tokens || index + 1 >= max_context) {
    finish(s, FinishReason::kLength);
  }
}

// Draws the tokens of the step's plain sampled rows (no constraint, no forced end of reasoning)
// on the host pool, each from its own sequence's sampler, before step() walks the entries in
// order: a 248,320-logit row costs ~0.3 ms on the host, so a 16-row step spent about 5 ms
// sampling one row after another. The rows are found as step() finds them (a sequence whose
// prefill ends in this step samples from its entry's last row).
void Engine::Impl::presample(const std::vector<StepEntry>& entries, int V) {
  if (opt.host_pool == nullptr || opt.host_pool->size() < 2) return;
  struct Job {
    size_t entry, row;
  };
  std::vector<Job> jobs;
  size_t row = 0;
  for (size_t ei = 0; ei < entries.size(); ++ei) {
    const StepEntry& e = entries[ei];
    const Sequence& s = *e.seq;
    row += scores_prompt(s) ? static_cast<size_t>(e.n_tokens) : 1;
    const size_t this_row = row - 1;
    if (s.cached + e.n_tokens < static_cast<int>(s.tokens.size())) continue;  // still prefilling
    if (s.req.max_tokens == 0 || forced_reasoning_end(s) || constrained_now(s)) continue;
    jobs.push_back({ei, this_row});
  }
  if (jobs.size() < 2) return;
  pool_work.resize(static_cast<size_t>(opt.host_pool->size()));
  opt.host_pool->run(static_cast<int64_t>(jobs.size()), [&](int64_t b, int64_t end, int worker) {
    for (int64_t j = b; j < end; ++j) {
      const Job& job = jobs[static_cast<size_t>(j)];
      Sequence& s = *entries[job.entry].seq;
      presampled[job.entry] =
          s.sampler->sample_row(&logits[job.row * static_cast<size_t>(V)], V, nullptr,
                                &pool_work[static_cast<size_t>(worker)]);
    }
  });
}

}  // namespace tokenmill
