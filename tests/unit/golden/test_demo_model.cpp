// The bundled demo model (models/demo) against transformers' float64 outputs written by
// tools/train_demo.py: per-token logprobs of held-out texts, tokenization of those texts, the
// chat template's rendering, and greedy chat continuations (engine path, not just the forward).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "support/model_harness.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace tokenmill::testing {
namespace {

namespace fs = std::filesystem;
constexpr double kLogprobTol = 2e-3;  // see test_golden.cpp
constexpr double kNearTie = 1e-2;

fs::path demo_dir() {
  return fs::path(TM_SOURCE_DIR) / "models/demo";
}
nlohmann::json reference() {
  std::ifstream f(fs::path(TM_SOURCE_DIR) / "tests/fixtures/demo/demo_logprobs.json");
  return nlohmann::json::parse(f);
}

TEST(DemoModel, TokenizationMatchesReference) {
  Tokenizer tok = Tokenizer::from_dir(demo_dir().string());
  const nlohmann::json ref = reference();
  for (const auto& t : ref["texts"]) {
    EXPECT_EQ(tok.encode(t["text"].get<std::string>(), false), t["ids"].get<std::vector<int32_t>>())
        << t["split"];
  }
}

TEST(DemoModel, LogprobsMatchTransformers) {
  Harness h(demo_dir().string());
  double worst = 0;
  const nlohmann::json ref = reference();
  for (const auto& t : ref["texts"]) {
    std::vector<int32_t> ids = t["ids"].get<std::vector<int32_t>>();
    auto logits = h.run({ids}, 64)[0];
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      double got = token_logprob(&logits[i * h.vocab()], h.vocab(), ids[i + 1], 0, nullptr);
      double err = std::fabs(got - t["next_logprobs"][i].get<double>());
      worst = std::isnan(err) ? INFINITY : std::max(worst, err);  // NaN must fail
    }
  }
  std::printf("[demo] worst |logprob error| %.3g\n", worst);
  EXPECT_LT(worst, kLogprobTol);
}

TEST(DemoModel, ChatTemplateAndGreedyRepliesMatchTransformers) {
  Harness h(demo_dir().string());
  Tokenizer tok = Tokenizer::from_dir(demo_dir().string());
  ChatTemplate tmpl = ChatTemplate::from_dir(demo_dir().string());
  EngineOptions eo;
  eo.memory_budget_bytes = 256 << 20;
  Engine engine(*h.model, eo);
  size_t checked = 0;
  const nlohmann::json ref = reference();
  for (const auto& c : ref["chat"]) {
    ChatTemplateInputs in;
    in.messages = c["messages"];
    in.add_generation_prompt = c["add_generation_prompt"].get<bool>();
    std::string rendered = tmpl.render(in);
    ASSERT_EQ(rendered, c["rendered"].get<std::string>());
    std::vector<int32_t> prompt = tok.encode(rendered, false);
    ASSERT_EQ(prompt, c["prompt_ids"].get<std::vector<int32_t>>());
    std::vector<int32_t> want = c["tokens"].get<std::vector<int32_t>>();
    GenerationRequest r;
    r.prompt = prompt;
    r.max_tokens = static_cast<int>(want.size());
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    auto stream = engine.submit(r);
    std::vector<int32_t> got;
    for (bool done = false; !done;) {
      for (TokenEvent& e : stream->wait(std::chrono::milliseconds(100))) {
        if (e.token >= 0) got.push_back(e.token);
        done = done || e.finished;
      }
    }
    ASSERT_EQ(got.size(), want.size());
    ++checked;
    for (size_t i = 0; i < want.size(); ++i) {
      if (got[i] != want[i]) {
        EXPECT_LT(c["margins"][i].get<double>(), kNearTie) << "step " << i;
        break;
      }
    }
  }
  EXPECT_EQ(checked, 2u);
}

}  // namespace
}  // namespace tokenmill::testing
