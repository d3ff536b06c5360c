// The whole forward on the CUDA backend: the golden fixtures (transformers float64 references,
// tests/fixtures/golden) and the bundled demo model, loaded through Model::load onto the GPU.
// Checks: per-token logprobs within 2e-3 of the reference (the CPU golden tolerance, see
// tests/unit/golden/test_golden.cpp), whole prefill = chunked (7-token) prefill = all sequences
// batched together, within 1e-3 of each other. And the engine's steps on the device allocate
// nothing (CudaEngine).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cuda_test_util.h"
#include "engine/engine.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "model/synthetic.h"
#include "support/model_harness.h"

namespace tokenmill::cudatest {
namespace {

namespace fs = std::filesystem;
constexpr double kLogprobTol = 2e-3;
constexpr double kChunkTol = 1e-3;

std::vector<double> logprobs(testing::Harness& h, const std::vector<int32_t>& ids,
                             const std::vector<float>& logits) {
  return testing::next_logprobs(ids, logits, h.vocab());
}

double worst_diff(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double w = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = std::fabs(a[i] - b[i]);
    w = std::isnan(e) ? INFINITY : std::max(w, e);
  }
  return w;
}

nlohmann::json load_json(const fs::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

std::vector<std::string> fixture_names() {
  std::vector<std::string> names;
  const fs::path root = fs::path(TM_SOURCE_DIR) / "tests/fixtures/golden";
  for (const auto& e : fs::directory_iterator(root)) {
    if (e.is_directory() && fs::exists(e.path() / "reference.json"))
      names.push_back(e.path().filename());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Sequences (ids) and their reference next-token logprobs from a reference file's entries.
void check_model(const std::string& dir, const nlohmann::json& entries, const char* lp_key,
                 const std::string& label) {
  testing::Harness h(dir, make_cuda_backend(0), 8, 512);
  std::vector<std::vector<int32_t>> seqs;
  std::vector<std::vector<double>> want;
  for (const auto& e : entries) {
    seqs.push_back(e["ids"].get<std::vector<int32_t>>());
    want.push_back(e[lp_key].get<std::vector<double>>());
  }
  ASSERT_FALSE(seqs.empty());
  double worst_ref = 0, worst_chunk = 0, worst_batch = 0;
  // All sequences in one varlen batch, chunked by 7.
  auto batched = h.run(seqs, 7);
  for (size_t i = 0; i < seqs.size(); ++i) {
    auto whole = logprobs(h, seqs[i], h.run({seqs[i]}, 0)[0]);
    auto chunked = logprobs(h, seqs[i], h.run({seqs[i]}, 7)[0]);
    auto batch = logprobs(h, seqs[i], batched[i]);
    ASSERT_EQ(whole.size(), want[i].size());
    worst_ref = std::max(worst_ref, worst_diff(whole, want[i]));
    worst_ref = std::max(worst_ref, worst_diff(chunked, want[i]));
    worst_chunk = std::max(worst_chunk, worst_diff(whole, chunked));
    worst_batch = std::max(worst_batch, worst_diff(whole, batch));
  }
  std::printf(
      "[cuda model] %s: worst |logprob - reference| %.3g, whole vs chunked %.3g, "
      "whole vs batched %.3g\n",
      label.c_str(), worst_ref, worst_chunk, worst_batch);
  EXPECT_LT(worst_ref, kLogprobTol) << label;
  EXPECT_LT(worst_chunk, kChunkTol) << label;
  EXPECT_LT(worst_batch, kChunkTol) << label;
}

class CudaGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaGolden, LogprobsAndChunkingMatchReference) {
  TM_REQUIRE_CUDA_DEVICE();
  const fs::path dir = fs::path(TM_SOURCE_DIR) / "tests/fixtures/golden" / GetParam();
  const nlohmann::json ref = load_json(dir / "reference.json");
  check_model(dir.string(), ref["sequences"], "next_logprobs", GetParam());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaGolden, ::testing::ValuesIn(fixture_names()),
                         [](const auto& p) { return p.param; });

TEST(CudaDemoModel, LogprobsMatchTransformers) {
  TM_REQUIRE_CUDA_DEVICE();
  const fs::path demo = fs::path(TM_SOURCE_DIR) / "models/demo";
  const nlohmann::json ref =
      load_json(fs::path(TM_SOURCE_DIR) / "tests/fixtures/demo/demo_logprobs.json");
  check_model(demo.string(), ref["texts"], "next_logprobs", "demo");
}

// The demo model with BF16 KV caches on both backends: the same logprobs within the F32
// tolerance (both read the same rounded K and V; a value whose F32 form differs in the last bit
// may round to a neighbouring BF16, which the tolerance covers).
TEST(CudaDemoModel, Bf16KvCacheMatchesCpu) {
  TM_REQUIRE_CUDA_DEVICE();
  const fs::path demo = fs::path(TM_SOURCE_DIR) / "models/demo";
  const nlohmann::json ref =
      load_json(fs::path(TM_SOURCE_DIR) / "tests/fixtures/demo/demo_logprobs.json");
  testing::Harness g(demo.string(), make_cuda_backend(0), 8, 512);
  testing::Harness c(demo.string());
  g.make_cache(8, 512, DType::BF16);
  c.make_cache(4, 512, DType::BF16);
  double worst = 0;
  for (const auto& e : ref["texts"]) {
    const auto ids = e["ids"].get<std::vector<int32_t>>();
    worst = std::max(worst, worst_diff(logprobs(g, ids, g.run({ids}, 7)[0]),
                                       logprobs(c, ids, c.run({ids}, 0)[0])));
  }
  std::printf("[cuda model] demo, bf16 KV: worst |cuda - cpu| logprob %.3g\n", worst);
  EXPECT_LT(worst, kLogprobTol);
}

// A small dense 4-bit model for the engine tests (vocabulary 1,024, hidden 256).
SyntheticSpec small_engine_spec() {
  SyntheticSpec spec;
  spec.vocab = 1024;
  spec.hidden = 256;
  spec.intermediate = 512;
  spec.head_dim = 128;
  spec.k_dim = 64;
  spec.v_dim = 64;
  spec.bits = 4;
  return spec;
}

// A request of `len` random prompt tokens that runs to max_tokens (temperature 0: greedy; the
// seed also seeds its sampler).
GenerationRequest random_request(int len, int max_tokens, uint32_t seed, float temperature) {
  Rng rng(seed);
  GenerationRequest r;
  for (int i = 0; i < len; ++i) r.prompt.push_back(rng.integer(2, 1000));
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

// The engine's twin of EngineTest.StepsAllocateNothing on the device: with the largest step
// reserved when the engine is built, steps allocate nothing. The shapes reach every workspace
// that grows with a step: the prefill GEMM's F16 activations (steps above 16 rows, the routed
// experts' GEMMs of the MoE model), the chunked delta rule's (sequences of 64 rows or more),
// split-context decode attention's (head_dim 128, recorded decode steps), and the logits of a
// step whose every row is scored (two lm_head passes).
TEST(CudaEngine, StepsAllocateNothing) {
  TM_REQUIRE_CUDA_DEVICE();
  constexpr int kStep = 160;
  const SyntheticSpec dense = small_engine_spec();
  SyntheticSpec moe = dense;
  moe.moe = true;
  moe.bits = 0;
  for (const SyntheticSpec& spec : {dense, moe}) {
    const std::string label = spec.moe ? "moe" : "dense 4-bit";
    auto gpu = make_cuda_backend(0);
    auto model = Model::from_checkpoint(
        std::make_unique<Checkpoint>(synthetic_checkpoint_in_memory(spec, label)), *gpu);
    EngineOptions o;
    o.max_seqs = 4;
    o.max_step_tokens = kStep;
    o.prefill_chunk = kStep;
    o.max_context = 2048;
    o.memory_budget_bytes = 64 << 20;
    Engine e(*model, o);
    const int64_t count = gpu->allocation_count();
    const int64_t peak = gpu->peak_allocated_bytes();
    ASSERT_GT(count, 0) << label;

    // Runs the requests to their end: each must stop at its length.
    const auto run = [&](std::vector<GenerationRequest> reqs) {
      std::vector<std::shared_ptr<RequestStream>> streams;
      for (auto& r : reqs) streams.push_back(e.submit(std::move(r)));
      for (auto& s : streams) {
        FinishReason why = FinishReason::kNone;
        while (why == FinishReason::kNone) {
          for (TokenEvent& ev : s->wait(std::chrono::milliseconds(100))) {
            if (ev.finished) why = ev.finish_reason;
          }
        }
        EXPECT_EQ(why, FinishReason::kLength) << label;
      }
    };
    const auto request = [](int len, int max_tokens, uint32_t seed) {
      return random_request(len, max_tokens, seed, 0.0f);
    };
    // One step of max_step_tokens rows, every one a logit row; then four sequences: chunked
    // prefills beside decodes, then batched (recorded) decode.
    GenerationRequest scored = request(kStep, 4, 1);
    scored.prompt_logprobs = 0;
    run({std::move(scored)});
    run({request(200, 24, 2), request(140, 24, 3), request(80, 24, 4), request(20, 24, 5)});
    EXPECT_GE(e.stats().steps, 25u) << label;
    e.shutdown(0);
    EXPECT_EQ(gpu->allocation_count(), count) << label << ": a step allocated device memory";
    EXPECT_EQ(gpu->peak_allocated_bytes(), peak) << label;
  }
}

// Overlapped steps on the device: each step's tokens are copied from the last step's picks on
// the device, behind recorded steps that replay. The same requests run with steps that wait for
// their results must give the same tokens (the kernels give the same bits every launch); a
// sampled request without top-k beside them takes the logits path (page-locked downloads),
// sampled ones with top-k are picked on the device.
TEST(CudaEngine, OverlappedStepsEqualWaitingSteps) {
  TM_REQUIRE_CUDA_DEVICE();
  const SyntheticSpec spec = small_engine_spec();
  auto gpu = make_cuda_backend(0);
  auto model = Model::from_checkpoint(
      std::make_unique<Checkpoint>(synthetic_checkpoint_in_memory(spec, "overlap")), *gpu);
  const auto request = random_request;
  std::vector<std::vector<std::vector<int32_t>>> got;
  std::vector<int64_t> recordings;  // the model's recordings after each engine
  for (bool overlap : {false, true}) {
    EngineOptions o;
    o.max_seqs = 4;
    o.max_step_tokens = 128;
    o.prefill_chunk = 64;
    o.max_context = 1024;
    o.memory_budget_bytes = 64 << 20;
    o.overlap_steps = overlap;
    Engine e(*model, o);
    // Four greedy requests (batched decode, recorded), then sampled ones beside greedy ones.
    std::vector<std::vector<GenerationRequest>> waves = {
        {request(150, 40, 1, 0), request(90, 33, 2, 0), request(30, 40, 3, 0),
         request(7, 21, 4, 0)},
        {request(50, 20, 5, 0.8f), request(60, 30, 6, 0), request(5, 25, 7, 0)},
        {request(40, 30, 8, 0.7f), request(20, 26, 9, 1.0f), request(9, 22, 10, 0)}};
    // The third wave's sampled requests are picked on the device (top-k: pick_tokens), so
    // their steps overlap too; the second wave's (no top-k) takes the logits to the host.
    waves[2][0].sampling.top_k = 20;
    waves[2][1].sampling.top_k = 50;
    waves[2][1].sampling.top_p = 0.9f;
    waves[2][1].sampling.presence_penalty = 1.5f;  // penalties on the device too
    waves[2][1].sampling.repetition_penalty = 1.1f;
    got.emplace_back();
    for (auto& wave : waves) {
      // A wave at once: with a submit each, the engine could wake after the first and start a
      // step without the others, and a different batch gives CUDA's GEMVs a different
      // summation order (sampled picks then differ in one mode only).
      std::vector<std::shared_ptr<RequestStream>> streams = e.submit_all(std::move(wave));
      for (auto& st : streams) {
        std::vector<int32_t> tokens;
        bool done = false;
        while (!done) {
          for (TokenEvent& ev : st->wait(std::chrono::milliseconds(100))) {
            if (ev.token >= 0) tokens.push_back(ev.token);
            if (ev.finished) {
              EXPECT_EQ(ev.finish_reason, FinishReason::kLength);
              done = true;
            }
          }
        }
        got.back().push_back(std::move(tokens));
      }
    }
    if (overlap) {
      EXPECT_GT(e.stats().steps_overlapped, 0u);
    } else {
      EXPECT_EQ(e.stats().steps_overlapped, 0u);
    }
    recordings.push_back(model->record_stats().recordings);
  }
  // The second engine's caches may come back at some of the first one's addresses: replaying
  // the first engine's recordings wrote K/V through freed pointers (memcheck). It records anew.
  EXPECT_GT(recordings[0], 0);
  EXPECT_GT(recordings[1], recordings[0]);
  ASSERT_EQ(got[0].size(), 10u);
  for (size_t i = 0; i < got[0].size(); ++i) {
    EXPECT_FALSE(got[0][i].empty()) << "request " << i;
    EXPECT_EQ(got[1][i], got[0][i]) << "request " << i;
  }
}

}  // namespace
}  // namespace tokenmill::cudatest
