// write_random_checkpoint: the dummy model on disk. Loaded from its files it must compute what the
// in-memory dummy model (--dummy-weights) computes, bit for bit, so that `bench DIR` on such a
// checkpoint measures loading and nothing else.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <random>

#include "io/checkpoint.h"
#include "model/synthetic.h"
#include "support/model_harness.h"
#include "tensor/random_fill.h"

namespace tokenmill::testing {
namespace {

struct Case {
  const char* name;
  SyntheticSpec spec;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

class RandomCheckpoint : public ::testing::TestWithParam<Case> {};

TEST_P(RandomCheckpoint, LoadsAsTheInMemoryDummyModel) {
  const SyntheticSpec& spec = GetParam().spec;
  const std::string dir = temp_dir(std::string("random-") + GetParam().name);
  write_random_checkpoint(dir, spec);
  Harness from_files(dir);
  Harness in_memory(std::make_unique<Checkpoint>(synthetic_checkpoint_in_memory(spec, "dummy")));
  std::mt19937_64 r(5);
  std::vector<int32_t> ids(40);
  for (auto& x : ids) x = static_cast<int32_t>(r() % static_cast<uint64_t>(spec.vocab));
  const std::vector<float> want = in_memory.run({ids}, 0)[0];
  const std::vector<float> got = from_files.run({ids}, 0)[0];
  ASSERT_EQ(got.size(), want.size());
  size_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i] ? 1 : 0;
  EXPECT_EQ(differ, 0u) << "of " << got.size() << " logits; max diff " << max_abs_diff(got, want);
  // Random weights still make a working model: finite logits that differ between tokens.
  for (float x : got) ASSERT_TRUE(std::isfinite(x));
  EXPECT_GT(
      max_abs_diff(std::vector<float>(got.begin(), got.begin() + spec.vocab),
                   std::vector<float>(got.begin() + spec.vocab, got.begin() + 2 * spec.vocab)),
      1e-3);
}

TEST_P(RandomCheckpoint, HoldsTheSyntheticCheckpointsTensors) {
  // The same names, shapes and dtypes as write_synthetic_checkpoint (the model the golden and
  // invariant tests use), so both load through the same binding.
  const SyntheticSpec& spec = GetParam().spec;
  const std::string a = temp_dir(std::string("random-a-") + GetParam().name);
  const std::string b = temp_dir(std::string("random-b-") + GetParam().name);
  write_random_checkpoint(a, spec);
  write_synthetic_checkpoint(b, spec);
  const Checkpoint ra = Checkpoint::open(a), rb = Checkpoint::open(b);
  ASSERT_EQ(ra.tensors().size(), rb.tensors().size());
  std::map<std::string, const TensorInfo*> by_name;
  for (const TensorInfo& u : rb.tensors()) by_name[u.name] = &u;
  for (const TensorInfo& t : ra.tensors()) {
    const auto it = by_name.find(t.name);
    ASSERT_NE(it, by_name.end()) << t.name << " is not in the synthetic checkpoint";
    EXPECT_EQ(t.shape, it->second->shape) << t.name;
    EXPECT_EQ(t.dtype, it->second->dtype) << t.name;
  }
}

TEST(RandomCheckpointValues, CodesAreFillRandomsBits) {
  // The first tensor of a 4-bit checkpoint's embedding: element i is fill_random's value i.
  SyntheticSpec spec;
  spec.bits = 4;
  const std::string dir = temp_dir("random-values");
  write_random_checkpoint(dir, spec);
  const Checkpoint c = Checkpoint::open(dir);
  const TensorInfo* t = c.find("embed_tokens.weight");
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->dtype, DType::U32);
  const auto* w = reinterpret_cast<const uint32_t*>(t->data);
  const uint64_t seed = dummy_linear("embed_tokens", spec.hidden, 4).codes.seed;
  for (uint64_t i : {uint64_t{0}, uint64_t{1}, uint64_t{777}, uint64_t(t->numel() - 1)}) {
    EXPECT_EQ(w[i], static_cast<uint32_t>(random_fill::bits(seed, i))) << "element " << i;
  }
}

SyntheticSpec with(bool moe, int bits) {
  SyntheticSpec s;
  s.moe = moe;
  s.bits = bits;
  return s;
}

INSTANTIATE_TEST_SUITE_P(Specs, RandomCheckpoint,
                         ::testing::Values(Case{"dense_bf16", with(false, 0)},
                                           Case{"dense_q4", with(false, 4)},
                                           Case{"moe_bf16", with(true, 0)},
                                           Case{"moe_q4", with(true, 4)}),
                         [](const auto& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace tokenmill::testing
