// The engine against the bare model: continuous batching, chunked prefill, preemption and
// cancellation must not change what a request produces.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <utility>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "model/model.h"
#include "model/synthetic.h"
#include "support/model_harness.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace tokenmill::testing {
namespace {

std::vector<int32_t> random_ids(int n, int vocab, uint64_t seed) {
  std::mt19937_64 r(seed);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<int32_t>(2 + r() % static_cast<uint64_t>(vocab - 2));
  return v;
}

// Greedy continuation computed the slow, obvious way: rerun the whole sequence every step.
std::vector<int32_t> reference_greedy(Harness& h, std::vector<int32_t> ids, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    auto logits = h.run({ids}, 0)[0];
    const float* last = logits.data() + logits.size() - h.vocab();
    int32_t t = static_cast<int32_t>(std::max_element(last, last + h.vocab()) - last);
    out.push_back(t);
    ids.push_back(t);
  }
  return out;
}

struct Collected {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::kNone;
  std::vector<float> prompt_logprobs;
};

Collected collect(RequestStream& s) {
  Collected c;
  for (;;) {
    for (TokenEvent& e : s.wait(std::chrono::milliseconds(100))) {
      if (e.token >= 0) c.tokens.push_back(e.token);
      if (!e.prompt_logprobs.empty()) c.prompt_logprobs = e.prompt_logprobs;
      if (e.finished) {
        c.reason = e.finish_reason;
        return c;
      }
    }
  }
}

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(temp_dir("engine"));
    SyntheticSpec s;
    s.init_scale = 0.15f;  // peaky logits: greedy ties are improbable
    write_synthetic_checkpoint(*dir_, s);
  }
  static std::string* dir_;
};
std::string* EngineTest::dir_ = nullptr;

GenerationRequest greedy(std::vector<int32_t> prompt, int n) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0;
  r.max_tokens = n;
  r.ignore_eos = true;
  return r;
}

TEST_F(EngineTest, ConcurrentChunkedPreemptedEqualsReference) {
  Harness h(*dir_);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int32_t>> expect;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(random_ids(3 + 17 * i, h.vocab(), 100 + i));
    expect.push_back(reference_greedy(h, prompts.back(), 12));
  }
  // Small step budget (chunked prefill interleaved with decode) and few blocks (preemption).
  for (int64_t blocks : {int64_t{0}, int64_t{16}}) {
    EngineOptions o;
    o.max_seqs = 4;
    o.max_step_tokens = 24;
    o.prefill_chunk = 16;
    o.kv_blocks = blocks;
    o.memory_budget_bytes = 64 << 20;
    Engine e(*h.model, o);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (auto& p : prompts) streams.push_back(e.submit(greedy(p, 12)));
    for (size_t i = 0; i < prompts.size(); ++i) {
      Collected c = collect(*streams[i]);
      EXPECT_EQ(c.reason, FinishReason::kLength);
      EXPECT_EQ(c.tokens, expect[i]) << "request " << i << " blocks " << blocks;
    }
  }
}

// A step of plain greedy rows takes only the argmax ids from the backend (launch_picks); a step
// with a row that asks for logprobs downloads the logits. Both pick the reference's tokens,
// alone and mixed in one step.
TEST_F(EngineTest, GreedyIdsAndLogitsStepsAgree) {
  Harness h(*dir_);
  std::vector<std::vector<int32_t>> prompts, expect;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(random_ids(5 + 9 * i, h.vocab(), 300 + i));
    expect.push_back(reference_greedy(h, prompts.back(), 10));
  }
  for (int with_logprobs : {-1, 0, 3}) {  // none, request 0 alone, every request
    EngineOptions o;
    o.max_seqs = 4;
    o.memory_budget_bytes = 64 << 20;
    Engine e(*h.model, o);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int i = 0; i < 4; ++i) {
      GenerationRequest r = greedy(prompts[i], 10);
      if (with_logprobs == 3 || with_logprobs == i) r.sampling.logprobs = 0;
      streams.push_back(e.submit(std::move(r)));
    }
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(collect(*streams[i]).tokens, expect[i])
          << "request " << i << " logprobs case " << with_logprobs;
    }
  }
}

// A request without logprobs is picked by the backend (Backend::penalize_rows and
// pick_tokens: only ids leave it, and its steps overlap, the newest output token still on the
// device counted in the penalties); asking for logprobs brings its logits to the host, where the
// engine's sampler penalizes and draws. Both take the same draws from the request's generator
// and follow util/token_pick.h, so they choose the same tokens: top-k alone, with top-p, with
// min-p, neither (the whole vocabulary), with each penalty, and greedy with penalties.
TEST_F(EngineTest, SampledPicksOnBackendEqualHostSampling) {
  Harness h(*dir_);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 7; ++i) {
    GenerationRequest r = greedy(random_ids(6 + 7 * i, h.vocab(), 700 + i), 14);
    r.sampling.temperature = i == 6 ? 0.0f : 0.6f + 0.3f * static_cast<float>(i % 4);
    r.sampling.top_k = i == 3 ? 0 : 5 + 10 * (i % 4);
    r.sampling.top_p = i == 0 || i == 3 ? 1.0f : 0.9f;
    r.sampling.min_p = i == 2 ? 0.02f : 0.0f;
    if (i == 4) r.sampling.repetition_penalty = 1.3f;
    if (i == 5 || i == 6) r.sampling.presence_penalty = i == 5 ? 1.5f : -50.0f;  // repeats
    if (i == 5) r.sampling.frequency_penalty = -1.5f;  // repeats, more with every one
    r.sampling.seed = 77 + static_cast<uint64_t>(i);
    reqs.push_back(r);
  }
  std::vector<std::vector<int32_t>> got[2];
  for (int host = 0; host < 2; ++host) {
    EngineOptions o;
    o.max_seqs = 7;
    o.memory_budget_bytes = 64 << 20;
    o.overlap_on_synchronous_backend = true;  // the CPU backend: overlap is off by default
    Engine e(*h.model, o);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (GenerationRequest r : reqs) {
      if (host) r.sampling.logprobs = 0;
      streams.push_back(e.submit(std::move(r)));
    }
    for (auto& st : streams) got[host].push_back(collect(*st).tokens);
    const EngineStats st = e.stats();
    if (host) {
      EXPECT_EQ(st.steps_overlapped, 0u);
      EXPECT_EQ(st.steps_logits_to_host, st.steps);
    } else {
      EXPECT_GT(st.steps_overlapped, 0u) << "sampled steps did not overlap";
      EXPECT_EQ(st.steps_logits_to_host, 0u);
    }
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_EQ(got[0][i].size(), 14u);
    EXPECT_EQ(got[0][i], got[1][i]) << "request " << i;
    // Sampling, not the greedy continuation (a request's tokens differ from it somewhere).
    EXPECT_NE(got[0][i], reference_greedy(h, reqs[i].prompt, 14)) << "request " << i;
  }
}

TEST_F(EngineTest, PromptLogprobsMatchModel) {
  Harness h(*dir_);
  auto prompt = random_ids(40, h.vocab(), 5);
  auto logits = h.run({prompt}, 0)[0];
  EngineOptions o;
  Engine e(*h.model, o);
  GenerationRequest r = greedy(prompt, 0);
  r.prompt_logprobs = 0;
  Collected c = collect(*e.submit(r));
  ASSERT_EQ(c.prompt_logprobs.size(), prompt.size() - 1);
  for (size_t i = 0; i + 1 < prompt.size(); ++i) {
    float want = token_logprob(&logits[i * h.vocab()], h.vocab(), prompt[i + 1], 0, nullptr);
    EXPECT_NEAR(c.prompt_logprobs[i], want, 1e-4) << i;
  }
  EXPECT_TRUE(c.tokens.empty());
}

TEST_F(EngineTest, SeededSamplingIsReproducible) {
  Harness h(*dir_);
  Engine e(*h.model, EngineOptions{});
  GenerationRequest r = greedy(random_ids(8, h.vocab(), 9), 20);
  r.sampling.temperature = 1.0f;
  r.sampling.top_p = 0.9f;
  r.sampling.seed = 42;
  auto a = collect(*e.submit(r)).tokens, b = collect(*e.submit(r)).tokens;
  EXPECT_EQ(a, b);
  r.sampling.seed = 43;
  EXPECT_NE(collect(*e.submit(r)).tokens, a);
}

// The rows of a step sampled in parallel on a host pool (EngineOptions::host_pool) give what
// sampling them one after another gives: each request draws from its own generator. The step
// mixes decodes, prefills finishing inside it, a row scoring its prompt (its sampling row is
// the entry's last), penalties and greedy rows, so a wrong row or a shared generator shows.
TEST_F(EngineTest, ParallelSamplingEqualsSerial) {
  Harness h(*dir_);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 7; ++i) {
    GenerationRequest r = greedy(random_ids(4 + 11 * i, h.vocab(), 500 + i), 16);
    if (i != 3) {
      r.sampling.temperature = 0.7f + 0.1f * static_cast<float>(i);
      r.sampling.top_k = i % 2 == 0 ? 20 : 0;
      r.sampling.top_p = 0.9f;
      r.sampling.seed = 1000 + static_cast<uint64_t>(i);
    }
    if (i == 2) r.prompt_logprobs = 0;
    if (i == 4) r.sampling.repetition_penalty = 1.3f;
    reqs.push_back(r);
  }
  ThreadPool pool(3);
  std::vector<std::vector<int32_t>> got[2];
  for (int parallel = 0; parallel < 2; ++parallel) {
    EngineOptions o;
    o.max_seqs = 7;
    o.max_step_tokens = 40;  // prefills spread over steps that also decode
    o.prefill_chunk = 24;
    o.memory_budget_bytes = 64 << 20;
    o.host_pool = parallel ? &pool : nullptr;
    Engine e(*h.model, o);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const GenerationRequest& r : reqs) streams.push_back(e.submit(r));
    for (auto& st : streams) got[parallel].push_back(collect(*st).tokens);
  }
  ASSERT_EQ(got[0].size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[1][i], got[0][i]) << "request " << i;
    EXPECT_EQ(got[0][i].size(), 16u) << "request " << i;
  }
}

TEST_F(EngineTest, CancelFreesMemory) {
  Harness h(*dir_);
  Engine e(*h.model, EngineOptions{});
  auto s = e.submit(greedy(random_ids(30, h.vocab(), 3), 10000 - 30));
  while (e.stats().generated_tokens < 3) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(e.stats().state_slots_used, 1);
  s->cancel();
  EXPECT_EQ(collect(*s).reason, FinishReason::kCancelled);
  for (int i = 0; i < 100 && e.stats().running > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(e.stats().state_slots_used, 0);
  EXPECT_EQ(e.stats().kv_blocks_used, 0);
}

// No allocation inside a step: the engine reserves the largest step's memory when it is built
// (reserve_engine_steps), so a whole max-size prefill chunk whose every row asks for logits
// (prompt logprobs: more rows than one lm_head pass), prefill chunks next to decodes, and
// batched decode of several sequences leave the backend's allocation count and peak where the
// constructor left them. The prompt logprobs (two passes) match the model's, run in chunks of
// one pass each.
TEST_F(EngineTest, StepsAllocateNothing) {
  Harness h(*dir_);
  constexpr int kStep = 160;  // > Model::kLogitPassRows, > the GDN chunked form's 64 rows
  static_assert(kStep > Model::kLogitPassRows);
  const auto prompt = random_ids(kStep, h.vocab(), 21);
  const auto logits = h.run({prompt}, 50)[0];
  EngineOptions o;
  o.max_seqs = 4;
  o.max_step_tokens = kStep;
  o.prefill_chunk = kStep;
  o.max_context = 400;
  o.memory_budget_bytes = 64 << 20;
  Engine e(*h.model, o);
  const int64_t count = h.backend->allocation_count();
  const int64_t peak = h.backend->peak_allocated_bytes();
  ASSERT_GT(count, 0);
  ASSERT_GT(peak, 0);

  // One step of exactly max_step_tokens rows, every one a logit row.
  GenerationRequest first = greedy(prompt, 4);
  first.prompt_logprobs = 0;
  const Collected c = collect(*e.submit(first));
  EXPECT_EQ(c.reason, FinishReason::kLength);
  ASSERT_EQ(c.prompt_logprobs.size(), prompt.size() - 1);
  for (size_t i = 0; i + 1 < prompt.size(); ++i) {
    const float want = token_logprob(&logits[i * h.vocab()], h.vocab(), prompt[i + 1], 0, nullptr);
    EXPECT_NEAR(c.prompt_logprobs[i], want, 1e-4) << i;
  }
  // Four at once: chunked prefills beside decodes, then batched decode with block tables of
  // up to 14 blocks.
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 4; ++i) {
    streams.push_back(e.submit(greedy(random_ids(200 - 60 * i, h.vocab(), 30 + i), 24)));
  }
  for (auto& s : streams) EXPECT_EQ(collect(*s).reason, FinishReason::kLength);
  EXPECT_GE(e.stats().steps, 25u);

  EXPECT_EQ(h.backend->allocation_count(), count) << "a step allocated backend memory";
  EXPECT_EQ(h.backend->peak_allocated_bytes(), peak);
}

// On the CPU backend a step is computed when it is launched: overlapping the next one would only
// hold each token back a step (the first until the second is computed), so the engine does not,
// whatever overlap_steps says (each token then reaches its stream before the next step runs).
TEST_F(EngineTest, StepsDoNotOverlapWhereOpsRunAsCalled) {
  Harness h(*dir_);
  ASSERT_FALSE(h.backend->runs_asynchronously());
  EngineOptions o;
  o.memory_budget_bytes = 64 << 20;
  ASSERT_TRUE(o.overlap_steps);
  Engine e(*h.model, o);
  Collected c = collect(*e.submit(greedy(random_ids(9, h.vocab(), 3), 6)));
  EXPECT_EQ(c.tokens.size(), 6u);
  EXPECT_GE(e.stats().steps, 6u);
  EXPECT_EQ(e.stats().steps_overlapped, 0u);
}

// Overlapped steps (EngineOptions::overlap_steps): the next decode step is launched before the
// last one's ids are read, its tokens taken from them on the device. Stop tokens (the
// overlapped row is discarded), length limits, a forced end of reasoning, a sampled request
// with penalties (picked by the backend) beside greedy ones, a request whose logprobs need its
// logits on the host, requests arriving mid-decode and queued behind a full batch, and preemption
// must give exactly what steps that wait for their results give.
TEST_F(EngineTest, OverlappedStepsEqualWaitingSteps) {
  Harness h(*dir_);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 7; ++i) prompts.push_back(random_ids(4 + 11 * i, h.vocab(), 500 + i));
  const std::vector<int32_t> ref0 = reference_greedy(h, prompts[0], 14);
  const std::vector<int32_t> ref1 = reference_greedy(h, prompts[1], 12);
  const std::vector<int32_t> ref4 = reference_greedy(h, prompts[4], 1);
  const std::vector<int32_t> ref6 = reference_greedy(h, prompts[6], 11);
  // Request 1 stops at the first occurrence of its ninth greedy token (emitted, then done).
  const int32_t stop = ref1[8];
  const std::vector<int32_t> ref1_stop(ref1.begin(), std::find(ref1.begin(), ref1.end(), stop) + 1);
  constexpr int32_t kThinkEnd = 1;  // random_ids never draws 0 or 1
  // Set 0: every case at once (the logprobs request's steps wait for their logits); set 1: the
  // stop token alone beside a longer greedy request, so it comes while steps overlap.
  auto requests = [&](int set) {
    std::vector<GenerationRequest> rs;
    rs.push_back(greedy(prompts[0], 14));
    rs.push_back(greedy(prompts[1], 12));
    rs.back().ignore_eos = false;
    rs.back().stop_token_ids = {stop};
    if (set == 1) return rs;
    rs.push_back(greedy(prompts[2], 9));
    rs.back().starts_in_reasoning = true;
    rs.back().reasoning_budget = 3;
    rs.back().think_end_token = kThinkEnd;
    rs.push_back(greedy(prompts[3], 8));
    rs.back().sampling.temperature = 0.8f;
    rs.back().sampling.seed = 11;
    rs.back().sampling.presence_penalty = 1.0f;
    rs.back().sampling.repetition_penalty = 1.2f;
    rs.push_back(greedy(prompts[4], 1));
    rs.push_back(greedy(prompts[5], 0));
    rs.push_back(greedy(prompts[6], 11));
    rs.back().sampling.logprobs = 0;
    return rs;
  };
  for (int set : {0, 1}) {
    for (int64_t blocks : {int64_t{0}, int64_t{12}}) {  // 12 blocks of 16: preemption
      std::vector<std::vector<Collected>> got;
      for (bool overlap : {false, true}) {
        EngineOptions o;
        o.max_seqs = 3;  // set 0's later requests queue behind a full batch
        o.max_step_tokens = 32;
        o.prefill_chunk = 16;
        o.kv_blocks = blocks;
        o.memory_budget_bytes = 64 << 20;
        o.overlap_steps = overlap;
        o.overlap_on_synchronous_backend = true;
        Engine e(*h.model, o);
        std::vector<GenerationRequest> rs = requests(set);
        // The first three together, the rest mid-decode (also together: the engine must see the
        // same steps in both modes).
        const size_t first = std::min<size_t>(3, rs.size());
        std::vector<std::shared_ptr<RequestStream>> streams =
            e.submit_all(std::vector<GenerationRequest>(rs.begin(), rs.begin() + first));
        while (set == 0 && e.stats().generated_tokens < 4)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (rs.size() > first) {
          for (auto& st :
               e.submit_all(std::vector<GenerationRequest>(rs.begin() + first, rs.end())))
            streams.push_back(std::move(st));
        }
        got.emplace_back();
        for (auto& st : streams) got.back().push_back(collect(*st));
        const EngineStats stats = e.stats();
        const std::string where = "set " + std::to_string(set) + " overlap " +
                                  std::to_string(overlap) + " blocks " + std::to_string(blocks);
        if (overlap) {
          EXPECT_GT(stats.steps_overlapped, 0u) << where << ": no step overlapped";
        } else {
          EXPECT_EQ(stats.steps_overlapped, 0u) << where;
        }
        const auto& c = got.back();
        EXPECT_EQ(c[0].tokens, ref0) << where;
        EXPECT_EQ(c[0].reason, FinishReason::kLength) << where;
        EXPECT_EQ(c[1].tokens, ref1_stop) << where;
        EXPECT_EQ(c[1].reason, FinishReason::kStop) << where;
        uint64_t total = 0;
        for (const Collected& x : c) total += x.tokens.size();
        EXPECT_EQ(stats.generated_tokens, total) << where << ": a discarded row was counted";
        if (set == 1) continue;
        ASSERT_EQ(c[2].tokens.size(), 9u) << where;
        EXPECT_EQ(c[2].tokens[3], kThinkEnd) << where;  // three reasoning tokens, then forced
        EXPECT_EQ(c[3].tokens.size(), 8u) << where;
        EXPECT_EQ(c[4].tokens, ref4) << where;
        EXPECT_TRUE(c[5].tokens.empty()) << where;
        EXPECT_EQ(c[5].reason, FinishReason::kLength) << where;
        EXPECT_EQ(c[6].tokens, ref6) << where;
      }
      for (size_t i = 0; i < got[0].size(); ++i) {
        EXPECT_EQ(got[1][i].tokens, got[0][i].tokens) << "request " << i << " set " << set;
        EXPECT_EQ(got[1][i].reason, got[0][i].reason) << "request " << i << " set " << set;
      }
    }
  }
}

TEST_F(EngineTest, RejectsRequestsThatCanNeverRun) {
  Harness h(*dir_);
  EngineOptions o;
  o.max_context = 100;
  Engine e(*h.model, o);
  EXPECT_THROW(e.submit(greedy({}, 5)), Error);
  EXPECT_THROW(e.submit(greedy({h.vocab() + 5}, 5)), Error);
  // Sampling parameters outside the sampler's ranges, each named in its error.
  const std::vector<std::pair<std::string, std::function<void(SamplingParams&)>>> bad = {
      {"temperature", [](SamplingParams& s) { s.temperature = -1.0f; }},
      {"temperature", [](SamplingParams& s) { s.temperature = NAN; }},
      {"top_p", [](SamplingParams& s) { s.top_p = 0.0f; }},
      {"top_p", [](SamplingParams& s) { s.top_p = 2.0f; }},
      {"top_k", [](SamplingParams& s) { s.top_k = -2; }},
      {"min_p", [](SamplingParams& s) { s.min_p = 1.5f; }},
      {"repetition_penalty", [](SamplingParams& s) { s.repetition_penalty = 0.0f; }},
      {"presence_penalty", [](SamplingParams& s) { s.presence_penalty = INFINITY; }}};
  for (const auto& [name, set] : bad) {
    GenerationRequest r = greedy({1, 2, 3}, 2);
    set(r.sampling);
    try {
      e.submit(r);
      FAIL() << "expected an error for " << name;
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find(name), std::string::npos) << err.what();
    }
  }
  try {
    e.submit(greedy(random_ids(90, h.vocab(), 1), 20));
    FAIL() << "expected an error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("110"), std::string::npos) << err.what();
    EXPECT_NE(std::string(err.what()).find("100"), std::string::npos) << err.what();
  }
}

// submit_all: nothing is queued when any request is invalid; requests queued together reach the
// engine together, so one step prefills them all (with separate submits the engine may wake
// after the first and start a step without the others).
TEST_F(EngineTest, SubmitAllQueuesTogetherOrNotAtAll) {
  Harness h(*dir_);
  EngineOptions o;
  o.max_seqs = 4;
  o.max_step_tokens = 64;
  o.prefill_chunk = 64;
  o.max_context = 100;
  o.memory_budget_bytes = 64 << 20;
  Engine e(*h.model, o);
  std::vector<GenerationRequest> bad;
  bad.push_back(greedy(random_ids(5, h.vocab(), 1), 2));
  bad.push_back(greedy({h.vocab() + 5}, 2));
  EXPECT_THROW(e.submit_all(std::move(bad)), Error);
  EXPECT_EQ(e.stats().requests_total, 0u) << "a valid request was queued beside an invalid one";
  for (int round = 0; round < 5; ++round) {
    const uint64_t steps_before = e.stats().steps;
    std::vector<GenerationRequest> rs;
    for (int i = 0; i < 4; ++i) rs.push_back(greedy(random_ids(5 + i, h.vocab(), 20 + i), 1));
    const std::vector<std::shared_ptr<RequestStream>> streams = e.submit_all(std::move(rs));
    ASSERT_EQ(streams.size(), 4u);
    for (const auto& st : streams) EXPECT_EQ(collect(*st).tokens.size(), 1u);
    // Four prompts of 5-8 tokens fit one step, and each needs one token: one step.
    EXPECT_EQ(e.stats().steps - steps_before, 1u) << "round " << round;
  }
}

}  // namespace
}  // namespace tokenmill::testing
