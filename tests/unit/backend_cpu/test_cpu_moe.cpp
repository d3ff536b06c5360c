// topk_softmax and moe against double-precision references. MoE tolerance: 2e-5 relative to
// the sum of magnitudes of the final products (two chained F32 matmuls, see test_cpu_linear).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "cpu_test_util.h"

namespace tokenmill {
namespace {

using test::Backends;
using test::Rng;
using test::TestWeight;

TEST(CpuMoe, TopkSoftmaxMatchesReference) {
  Backends b;
  Rng rng(30);
  const int n = 9, E = 13, k = 4;
  std::vector<float> logits = rng.normals(n * E, 2.0f);
  for (CpuBackend* be : b.all()) {
    for (bool renorm : {true, false}) {
      std::vector<int32_t> ids(n * k);
      std::vector<float> w(n * k);
      be->topk_softmax(logits.data(), n, E, k, renorm, ids.data(), w.data());
      for (int r = 0; r < n; ++r) {
        std::vector<double> p(E);
        double mx = *std::max_element(logits.begin() + r * E, logits.begin() + (r + 1) * E),
               sum = 0;
        for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(logits[r * E + e] - mx));
        for (auto& x : p) x /= sum;
        std::vector<int> order(E);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int c) { return p[a] > p[c]; });
        double picked = 0;
        for (int j = 0; j < k; ++j) picked += p[order[j]];
        for (int j = 0; j < k; ++j) {
          ASSERT_EQ(ids[r * k + j], order[j]) << "row " << r;
          const double ref = renorm ? p[order[j]] / picked : p[order[j]];
          ASSERT_NEAR(w[r * k + j], ref, 1e-6);
        }
      }
    }
  }
}

// A shared expert's plain matrices (gate, up [SI, H], down [H, SI]).
struct Shared {
  TestWeight gate, up, down;
};

// One expert's silu(gate x) * up x, in double.
std::vector<double> expert_act(const std::vector<double>& gate, const std::vector<double>& up,
                               int64_t e, int64_t I, int64_t H, const float* x) {
  std::vector<double> act(static_cast<size_t>(I));
  for (int64_t i = 0; i < I; ++i) {
    double gs = 0, us = 0;
    for (int64_t c = 0; c < H; ++c) {
      gs += gate[(e * I + i) * H + c] * x[c];
      us += up[(e * I + i) * H + c] * x[c];
    }
    act[i] = test::silu_d(gs) * us;
  }
  return act;
}

void check_moe(CpuBackend& be, const TestWeight& gate, const TestWeight& up, const TestWeight& down,
               int64_t n, int k, Rng& rng, const Shared* shared = nullptr) {
  const int64_t E = gate.w.experts, H = gate.w.cols, I = gate.w.rows;
  std::vector<float> x = rng.normals(static_cast<size_t>(n * H));
  std::vector<int32_t> ids(static_cast<size_t>(n * k));
  std::vector<float> w(ids.size());
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int> pick(static_cast<size_t>(E));
    std::iota(pick.begin(), pick.end(), 0);
    std::shuffle(pick.begin(), pick.end(), rng.gen);
    for (int j = 0; j < k; ++j) {
      // Skewed towards expert 0 so that some experts get > 8 rows (GEMM path) at larger n.
      ids[t * k + j] = (j == 0 && t % 3 != 2) ? 0 : pick[j + 1];
      w[t * k + j] = rng.uniform(0.1f, 1.0f);
    }
    if (ids[t * k] == 0) {
      for (int j = 1; j < k; ++j)
        if (ids[t * k + j] == 0) ids[t * k + j] = pick[0] == 0 ? pick[k + 1] : pick[0];
    }
  }
  std::vector<float> out(static_cast<size_t>(n * H), NAN);
  const int64_t SI = shared != nullptr ? shared->gate.w.rows : 0;
  std::vector<float> gate_logit = rng.normals(static_cast<size_t>(n), 2.0f);
  std::vector<float> scratch(static_cast<size_t>(moe_scratch_floats(n, k, I, SI, H)), NAN);
  SharedExpert se;
  if (shared != nullptr) {
    se = SharedExpert{&shared->gate.w, &shared->up.w, &shared->down.w, gate_logit.data()};
  }
  be.moe(x.data(), n, k, ids.data(), w.data(), gate.w, up.w, down.w,
         shared != nullptr ? &se : nullptr, out.data(), scratch.data());
  for (int64_t t = 0; t < n; ++t) {
    std::vector<double> ref(static_cast<size_t>(H), 0.0), mag(static_cast<size_t>(H), 0.0);
    for (int j = 0; j < k; ++j) {
      const int64_t e = ids[t * k + j];
      const std::vector<double> act = expert_act(gate.values, up.values, e, I, H, &x[t * H]);
      for (int64_t c = 0; c < H; ++c) {
        double d = 0, m = 0;
        for (int64_t i = 0; i < I; ++i) {
          d += down.values[(e * H + c) * I + i] * act[i];
          m += std::fabs(down.values[(e * H + c) * I + i] * act[i]);
        }
        ref[c] += w[t * k + j] * d;
        mag[c] += w[t * k + j] * m;
      }
    }
    if (shared != nullptr) {
      const std::vector<double> act =
          expert_act(shared->gate.values, shared->up.values, 0, SI, H, &x[t * H]);
      const double sw = 1.0 / (1.0 + std::exp(-static_cast<double>(gate_logit[t])));
      for (int64_t c = 0; c < H; ++c) {
        for (int64_t i = 0; i < SI; ++i) {
          ref[c] += sw * shared->down.values[c * SI + i] * act[i];
          mag[c] += sw * std::fabs(shared->down.values[c * SI + i] * act[i]);
        }
      }
    }
    for (int64_t c = 0; c < H; ++c) {
      ASSERT_NEAR(out[t * H + c], ref[c], 2e-5 * mag[c] + 1e-5)
          << be.isa() << " n=" << n << " t=" << t;
    }
  }
}

TEST(CpuMoe, ExpertsMatchReferenceGemvAndGemm) {
  Backends b;
  Rng rng(31);
  const int64_t E = 6, H = 128, I = 64;
  TestWeight ga = test::make_affine_weight(rng, 4, 64, DType::BF16, I, H, E);
  TestWeight ua = test::make_affine_weight(rng, 4, 64, DType::BF16, I, H, E);
  TestWeight da = test::make_affine_weight(rng, 4, 32, DType::BF16, H, I, E);
  TestWeight gb = test::make_float_weight(rng, DType::BF16, I, H, E);
  TestWeight ub = test::make_float_weight(rng, DType::BF16, I, H, E);
  TestWeight db = test::make_float_weight(rng, DType::BF16, H, I, E);
  TestWeight ux = test::make_affine_weight(rng, 8, 32, DType::BF16, I, H, E);  // other layout
  for (CpuBackend* be : b.all()) {
    for (int64_t n : {1, 3, 20}) {
      check_moe(*be, ga, ua, da, n, 2, rng);
      check_moe(*be, gb, ub, db, n, 3, rng);
      check_moe(*be, ga, ux, da, n, 2, rng);
    }
  }
}

TEST(CpuMoe, SharedExpertMatchesReference) {
  Backends b;
  Rng rng(33);
  const int64_t E = 5, H = 128, I = 64;
  TestWeight g = test::make_affine_weight(rng, 4, 64, DType::BF16, I, H, E);
  TestWeight u = test::make_affine_weight(rng, 4, 64, DType::BF16, I, H, E);
  TestWeight d = test::make_affine_weight(rng, 4, 32, DType::BF16, H, I, E);
  for (int64_t SI : {I, int64_t{96}}) {  // as wide as the routed experts, and wider
    Shared shared{test::make_affine_weight(rng, 4, 64, DType::BF16, SI, H),
                  test::make_affine_weight(rng, 4, 64, DType::BF16, SI, H),
                  test::make_float_weight(rng, DType::BF16, H, SI)};
    for (CpuBackend* be : b.all()) {
      for (int64_t n : {1, 4, 20}) check_moe(*be, g, u, d, n, 2, rng, &shared);
    }
  }
}

TEST(CpuMoe, RejectsBadExpertIds) {
  Backends b;
  Rng rng(32);
  TestWeight g = test::make_float_weight(rng, DType::BF16, 8, 16, 2);
  TestWeight d = test::make_float_weight(rng, DType::BF16, 16, 8, 2);
  std::vector<float> x(16), out(16), w = {1.0f}, scratch(64);
  std::vector<int32_t> ids = {2};
  EXPECT_THROW(b.simd->moe(x.data(), 1, 1, ids.data(), w.data(), g.w, g.w, d.w, nullptr, out.data(),
                           scratch.data()),
               Error);
}

}  // namespace
}  // namespace tokenmill
