// Engine-core invariants on synthetic checkpoints (random weights at small real-layout shapes):
// whole-prompt prefill = chunked prefill = token by token, and a batch of sequences = the same
// sequences run alone. These hold for any weights, so random ones test them fully; agreement
// with the reference implementation is the golden tests' job.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "model/synthetic.h"
#include "support/model_harness.h"

namespace tokenmill::testing {
namespace {

std::vector<int32_t> random_ids(int n, int vocab, uint64_t seed) {
  std::mt19937_64 r(seed);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<int32_t>(r() % static_cast<uint64_t>(vocab));
  return v;
}

struct Case {
  const char* name;
  SyntheticSpec spec;
};

class Invariants : public ::testing::TestWithParam<Case> {};

// Logits are O(1..10); F32 sums in a different order differ by ~1e-5 relative.
constexpr double kTol = 2e-4;

TEST_P(Invariants, WholeEqualsChunkedEqualsTokenByToken) {
  std::string dir = temp_dir(std::string("inv-") + GetParam().name);
  write_synthetic_checkpoint(dir, GetParam().spec);
  Harness h(dir);
  auto ids = random_ids(150, h.vocab(), 7);
  auto whole = h.run({ids}, 0)[0];
  for (int chunk : {1, 7, 64}) {
    auto got = h.run({ids}, chunk)[0];
    EXPECT_LT(max_abs_diff(whole, got), kTol) << "chunk " << chunk;
  }
}

TEST_P(Invariants, BatchEqualsSingles) {
  std::string dir = temp_dir(std::string("batch-") + GetParam().name);
  write_synthetic_checkpoint(dir, GetParam().spec);
  Harness h(dir);
  std::vector<std::vector<int32_t>> seqs = {
      random_ids(5, h.vocab(), 1), random_ids(70, h.vocab(), 2), random_ids(33, h.vocab(), 3)};
  for (int chunk : {0, 16}) {
    auto together = h.run(seqs, chunk);
    for (size_t s = 0; s < seqs.size(); ++s) {
      auto alone = h.run({seqs[s]}, chunk)[0];
      EXPECT_LT(max_abs_diff(together[s], alone), kTol) << "seq " << s << " chunk " << chunk;
    }
  }
}

SyntheticSpec dense() {
  return SyntheticSpec{};
}
SyntheticSpec moe() {
  SyntheticSpec s;
  s.moe = true;
  return s;
}
SyntheticSpec q4() {
  SyntheticSpec s;
  s.bits = 4;
  return s;
}
SyntheticSpec moe_q3() {
  SyntheticSpec s;
  s.moe = true;
  s.bits = 3;
  return s;
}

INSTANTIATE_TEST_SUITE_P(Synthetic, Invariants,
                         ::testing::Values(Case{"dense_bf16", dense()}, Case{"moe_bf16", moe()},
                                           Case{"dense_q4", q4()}, Case{"moe_q3", moe_q3()}),
                         [](const auto& p) { return std::string(p.param.name); });

// A BF16 KV cache: the invariants hold as they do with F32 (the same rounded values are read
// whatever the chunking or batching), and the logits stay near the F32 cache's (K and V rounded
// to 8 significant bits) without equalling them (the BF16 path really ran).
TEST(Invariants, Bf16KvCache) {
  std::string dir = temp_dir("bf16kv");
  write_synthetic_checkpoint(dir, SyntheticSpec{});
  Harness h(dir);
  auto ids = random_ids(150, h.vocab(), 7);
  auto other = random_ids(40, h.vocab(), 8);
  auto f32 = h.run({ids}, 0)[0];
  h.make_cache(4, 256, DType::BF16);
  auto whole = h.run({ids}, 0)[0];
  for (int chunk : {1, 64}) {
    EXPECT_LT(max_abs_diff(whole, h.run({ids}, chunk)[0]), kTol) << "chunk " << chunk;
  }
  EXPECT_LT(max_abs_diff(whole, h.run({ids, other}, 16)[0]), kTol) << "batched";
  double scale = 0;
  for (float x : f32) scale = std::max(scale, std::fabs(static_cast<double>(x)));
  const double d = max_abs_diff(whole, f32);
  EXPECT_GT(d, 0.0);
  EXPECT_LT(d, 0.02 * scale) << "largest logit " << scale;
}

TEST(Invariants, CacheRefusesKvTypesTheBackendCannotKeep) {
  std::string dir = temp_dir("f16kv");
  write_synthetic_checkpoint(dir, SyntheticSpec{});
  Harness h(dir);
  try {
    h.make_cache(4, 16, DType::F16);
    FAIL() << "an F16 KV cache was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not keep KV caches in F16"), std::string::npos)
        << e.what();
  }
}

// A damaged weight must change the logits: the invariant tests above would also pass on a model
// that ignored its inputs, so check the forward depends on every layer kind.
TEST(Invariants, OutputDependsOnInput) {
  std::string dir = temp_dir("dep");
  write_synthetic_checkpoint(dir, SyntheticSpec{});
  Harness h(dir);
  auto a = random_ids(20, h.vocab(), 11);
  auto b = a;
  b[0] = (b[0] + 1) % h.vocab();
  auto la = h.run({a}, 0)[0], lb = h.run({b}, 0)[0];
  // The last position sees the changed first token only through attention and GDN state.
  std::vector<float> last_a(la.end() - h.vocab(), la.end()), last_b(lb.end() - h.vocab(), lb.end());
  EXPECT_GT(max_abs_diff(last_a, last_b), 1e-3);
}

// Dummy weights generated in backend memory (what `bench --dummy-weights` runs): the model
// binds every tensor at the declared sizes and computes a finite, consistent function.
TEST(InMemoryCheckpoint, RandomWeightsBindAndRun) {
  SyntheticSpec dense;
  SyntheticSpec q4 = dense;
  q4.bits = 4;
  SyntheticSpec moe;
  moe.moe = true;
  moe.bits = 4;
  moe.group = 32;
  for (const SyntheticSpec& spec : {dense, q4, moe}) {
    const std::string what =
        std::string(spec.moe ? "moe" : "dense") + " bits " + std::to_string(spec.bits);
    Harness h(std::make_unique<Checkpoint>(synthetic_checkpoint_in_memory(spec, "in-memory")));
    const ModelWeights& mw = h.model->weights();
    EXPECT_EQ(mw.stored_bytes, synthetic_weight_bytes(spec)) << what;
    // weight_bytes counts what a token reads: one embedding row, not the whole table, and the
    // routed experts only.
    const auto table = static_cast<int64_t>(mw.embed.total_bytes());
    int64_t expert_bytes = 0;
    for (const LayerWeights& L : mw.layers) {
      if (!L.ffn.moe) continue;
      for (const Weight* w : {&L.ffn.experts_gate, &L.ffn.experts_up, &L.ffn.experts_down})
        expert_bytes += static_cast<int64_t>(w->total_bytes());
    }
    const int64_t routed = spec.moe ? expert_bytes * spec.experts_per_tok / spec.experts : 0;
    EXPECT_EQ(mw.weight_bytes,
              mw.stored_bytes - table + table / mw.embed.rows - expert_bytes + routed)
        << what;
    // layer_macs_per_token (bench's prefill FLOP count): the architecture's matrices per token,
    // routed experts only, from the config.
    const ModelConfig& c = h.model->config();
    const int64_t H = c.hidden_size;
    int64_t macs = 0;
    for (LayerKind kind : c.layer_types) {
      if (kind == LayerKind::kFullAttention) {
        const int64_t q = int64_t{c.num_heads} * c.head_dim;
        macs +=
            H * (q * (c.attn_output_gate ? 2 : 1) + 2 * int64_t{c.num_kv_heads} * c.head_dim + q);
      } else {
        const int64_t v = int64_t{c.linear_num_value_heads} * c.linear_value_head_dim;
        macs += H * (c.linear_conv_channels() + v + 2 * int64_t{c.linear_num_value_heads} + v);
      }
      if (!c.is_moe) {
        macs += 3 * H * c.intermediate_size;
        continue;
      }
      macs += H * (c.num_experts + int64_t{c.num_experts_per_tok} * 3 * c.moe_intermediate_size);
      if (c.shared_expert_intermediate_size > 0) {
        macs += H * (3 * c.shared_expert_intermediate_size + 1);
      }
    }
    EXPECT_EQ(mw.layer_macs_per_token, macs) << what;
    auto ids = random_ids(40, h.vocab(), 11);
    auto whole = h.run({ids}, 0)[0];
    for (float v : whole) ASSERT_TRUE(std::isfinite(v)) << what;
    EXPECT_LT(max_abs_diff(whole, h.run({ids}, 1)[0]), kTol) << what;
    // Same seed, same weights: a second model computes the same logits.
    Harness again(std::make_unique<Checkpoint>(synthetic_checkpoint_in_memory(spec, "again")));
    EXPECT_EQ(whole, again.run({ids}, 0)[0]) << what;
  }
}

}  // namespace
}  // namespace tokenmill::testing
