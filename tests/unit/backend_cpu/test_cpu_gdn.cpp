// Gated DeltaNet ops: conv1d_silu, gated_delta_rule (recurrent and chunked), gdn_gates, against
// double-precision references, plus state continuation across calls.
// Tolerances: conv and gates 1e-5 relative (a K=4 dot and one exp); the delta rule 1e-5
// relative to the output's scale (unit-norm q, k keep |S| bounded; F32 state updates over
// 130 tokens accumulate ~1e-6 relative error).
#include <algorithm>

#include "cpu_test_util.h"

namespace tokenmill {
namespace {

using test::Backends;
using test::Rng;

struct Layout {
  std::vector<int32_t> cu, pos;
  SeqLayout view(int max_len) {
    return SeqLayout{static_cast<int>(cu.size()) - 1, cu.back(), cu.data(), pos.data(), max_len};
  }
};
Layout layout_of(const std::vector<int>& lens) {
  Layout l;
  l.cu.push_back(0);
  for (int n : lens) {
    for (int i = 0; i < n; ++i) l.pos.push_back(i);
    l.cu.push_back(l.cu.back() + n);
  }
  return l;
}

TEST(CpuConv, MatchesReferenceAndContinuesState) {
  Backends b;
  Rng rng(20);
  const int C = 37, K = 4;
  const std::vector<int> lens = {10, 1, 0, 7};
  const std::vector<int32_t> slots = {2, 0, 3, 1};
  std::vector<float> w = rng.normals(C * K, 0.5f);
  const int total = 18;
  std::vector<float> x = rng.normals(static_cast<size_t>(total * C));
  std::vector<float> init = rng.normals(static_cast<size_t>(4 * C * (K - 1)));
  for (CpuBackend* be : b.all()) {
    // All rows at once.
    std::vector<float> state = init, out(x.size(), NAN);
    Layout l = layout_of(lens);
    GDNStateView st{state.data(), nullptr, C, K, 0, 0, 0, 0};
    be->conv1d_silu(st, l.view(10), slots.data(), x.data(), w.data(), out.data());
    for (int s = 0, t0 = 0; s < 4; t0 += lens[s], ++s) {
      const float* s0 = init.data() + slots[s] * C * (K - 1);
      for (int c = 0; c < C; ++c) {
        auto u = [&](int j) -> double {  // input j of sequence s, j < 0 from the initial state
          return j < 0 ? s0[c * (K - 1) + (K - 1) + j] : x[(t0 + j) * C + c];
        };
        for (int t = 0; t < lens[s]; ++t) {
          double acc = 0;
          for (int i = 0; i < K; ++i) acc += w[c * K + i] * u(t - K + 1 + i);
          const double ref = test::silu_d(acc);
          ASSERT_NEAR(out[(t0 + t) * C + c], ref, 1e-5 * (1 + std::fabs(ref))) << be->isa();
        }
        for (int i = 0; i < K - 1; ++i) {
          ASSERT_EQ(state[(slots[s] * C + c) * (K - 1) + i],
                    static_cast<float>(u(lens[s] - K + 1 + i)))
              << "state keeps the last K-1 inputs, oldest first";
        }
      }
    }
    // Sequence 0 (10 rows) as 3 + 7 and as 1 x 10 gives identical outputs and state.
    for (const std::vector<int>& split : {std::vector<int>{3, 7}, std::vector<int>(10, 1)}) {
      std::vector<float> st2 = init, o2(10 * C, NAN);
      GDNStateView v2{st2.data(), nullptr, C, K, 0, 0, 0, 0};
      int done = 0;
      for (int part : split) {
        Layout lp = layout_of({part});
        be->conv1d_silu(v2, lp.view(part), &slots[0], x.data() + done * C, w.data(),
                        o2.data() + done * C);
        done += part;
      }
      for (int i = 0; i < 10 * C; ++i) ASSERT_EQ(o2[i], out[i]) << "split run differs at " << i;
      for (int i = 0; i < C * (K - 1); ++i) {
        ASSERT_EQ(st2[slots[0] * C * (K - 1) + i], state[slots[0] * C * (K - 1) + i]);
      }
    }
  }
}

struct GdnData {
  int Hk = 2, Hv = 4, Dk = 32, Dv = 24;
  int T = 0;
  std::vector<float> q, k, v, g, beta;
  GdnData(Rng& rng, int tokens) : T(tokens) {
    auto unit_rows = [&](int rows, int d, float sc) {
      std::vector<float> a = rng.normals(static_cast<size_t>(rows * d));
      for (int r = 0; r < rows; ++r) {
        double n = 0;
        for (int i = 0; i < d; ++i) n += a[r * d + i] * a[r * d + i];
        for (int i = 0; i < d; ++i)
          a[r * d + i] = static_cast<float>(a[r * d + i] / std::sqrt(n) * sc);
      }
      return a;
    };
    q = unit_rows(T * Hk, Dk, 1.0f / std::sqrt(static_cast<float>(Dk)));
    k = unit_rows(T * Hk, Dk, 1.0f);
    v = rng.normals(static_cast<size_t>(T * Hv * Dv));
    g.resize(static_cast<size_t>(T * Hv));
    beta.resize(g.size());
    for (auto& x : g) x = -rng.uniform(0.01f, 0.7f);
    for (auto& x : beta) x = rng.uniform(0.05f, 0.95f);
  }
};

// Double recurrence over one sequence's rows [t0, t1) from state S (Hv x Dk x Dv), writing out
// and, when steps is given, the state after every row.
void reference(const GdnData& d, int t0, int t1, std::vector<double>& S, std::vector<double>& out,
               std::vector<double>* steps) {
  const int r = d.Hv / d.Hk;
  for (int t = t0; t < t1; ++t) {
    for (int h = 0; h < d.Hv; ++h) {
      double* s = S.data() + static_cast<size_t>(h) * d.Dk * d.Dv;
      const float* k = d.k.data() + (t * d.Hk + h / r) * d.Dk;
      const float* q = d.q.data() + (t * d.Hk + h / r) * d.Dk;
      const float* v = d.v.data() + (t * d.Hv + h) * d.Dv;
      const double a = std::exp(static_cast<double>(d.g[t * d.Hv + h])), bt = d.beta[t * d.Hv + h];
      for (int i = 0; i < d.Dk * d.Dv; ++i) s[i] *= a;
      for (int j = 0; j < d.Dv; ++j) {
        double ks = 0;
        for (int i = 0; i < d.Dk; ++i) ks += s[i * d.Dv + j] * k[i];
        const double delta = bt * (v[j] - ks);
        for (int i = 0; i < d.Dk; ++i) s[i * d.Dv + j] += k[i] * delta;
        double o = 0;
        for (int i = 0; i < d.Dk; ++i) o += s[i * d.Dv + j] * q[i];
        out[(t * d.Hv + h) * d.Dv + j] = o;
      }
    }
    if (steps) steps->insert(steps->end(), S.begin(), S.end());
  }
}

TEST(CpuGdn, RecurrentAndChunkedMatchReferenceAndEachOther) {
  Backends b;
  Rng rng(21);
  const std::vector<int> lens = {1, 5, 70, 130};
  const std::vector<int32_t> slots = {3, 1, 0, 2};
  int total = 0;
  for (int n : lens) total += n;
  GdnData d(rng, total);
  const size_t ss = static_cast<size_t>(d.Hv * d.Dk * d.Dv);
  std::vector<float> init = rng.normals(4 * ss, 0.3f);
  Layout l = layout_of(lens);
  // Double reference per sequence from its slot's initial state.
  std::vector<double> ref_out(static_cast<size_t>(total * d.Hv * d.Dv));
  std::vector<std::vector<double>> ref_state(4);
  for (int s = 0; s < 4; ++s) {
    ref_state[s].assign(init.begin() + slots[s] * ss, init.begin() + (slots[s] + 1) * ss);
    reference(d, l.cu[s], l.cu[s + 1], ref_state[s], ref_out, nullptr);
  }
  for (CpuBackend* be : b.all()) {
    std::vector<float> outs[2], states[2];
    for (int mode = 0; mode < 2; ++mode) {  // 0: recurrent everywhere, 1: chunked from 64 rows
      be->set_gdn_chunk_threshold(mode == 0 ? 1 << 30 : 64);
      states[mode] = init;
      outs[mode].assign(ref_out.size(), NAN);
      GDNStateView st{nullptr, states[mode].data(), 0, 0, d.Hv, d.Hk, d.Dk, d.Dv};
      be->gated_delta_rule(st, l.view(130), slots.data(), d.q.data(), d.k.data(), d.v.data(),
                           d.g.data(), d.beta.data(), outs[mode].data(), nullptr);
      double scale = 0;
      for (double x : ref_out) scale = std::max(scale, std::fabs(x));
      for (size_t i = 0; i < ref_out.size(); ++i) {
        ASSERT_NEAR(outs[mode][i], ref_out[i], 1e-5 * scale)
            << be->isa() << " mode " << mode << " i=" << i;
      }
      for (int s = 0; s < 4; ++s) {
        for (size_t i = 0; i < ss; ++i) {
          ASSERT_NEAR(states[mode][slots[s] * ss + i], ref_state[s][i],
                      1e-5 * (1 + std::fabs(ref_state[s][i])))
              << be->isa() << " mode " << mode << " state of seq " << s;
        }
      }
    }
    for (size_t i = 0; i < ref_out.size(); ++i) {
      ASSERT_NEAR(outs[0][i], outs[1][i], 1e-5 * (1e-3 + std::fabs(outs[0][i])) + 1e-6)
          << "recurrent vs chunked at " << i;
    }
    be->set_gdn_chunk_threshold(64);
  }
}

TEST(CpuGdn, StateContinuesAcrossCallsAndStepStates) {
  Backends b;
  Rng rng(22);
  GdnData d(rng, 140);
  const size_t ss = static_cast<size_t>(d.Hv * d.Dk * d.Dv);
  std::vector<float> init = rng.normals(ss, 0.3f);
  const int32_t slot = 0;
  std::vector<double> ref_state(init.begin(), init.end()),
      ref_out(static_cast<size_t>(140 * d.Hv * d.Dv));
  std::vector<double> ref_steps;
  reference(d, 0, 140, ref_state, ref_out, &ref_steps);
  for (CpuBackend* be : b.all()) {
    // 10 at once == 3 + 7 == 1 by 1 (recurrent); 140 at once (chunked) == 64 + 76 (chunked).
    for (const std::vector<int>& split :
         {std::vector<int>{10}, std::vector<int>{3, 7}, std::vector<int>(10, 1),
          std::vector<int>{140}, std::vector<int>{64, 76}}) {
      std::vector<float> state = init, out(static_cast<size_t>(140 * d.Hv * d.Dv), NAN);
      GDNStateView st{nullptr, state.data(), 0, 0, d.Hv, d.Hk, d.Dk, d.Dv};
      int done = 0;
      for (int part : split) {
        Layout l = layout_of({part});
        be->gated_delta_rule(st, l.view(part), &slot, d.q.data() + done * d.Hk * d.Dk,
                             d.k.data() + done * d.Hk * d.Dk, d.v.data() + done * d.Hv * d.Dv,
                             d.g.data() + done * d.Hv, d.beta.data() + done * d.Hv,
                             out.data() + done * d.Hv * d.Dv, nullptr);
        done += part;
      }
      for (int i = 0; i < done * d.Hv * d.Dv; ++i) {
        ASSERT_NEAR(out[i], ref_out[i], 1e-5 * (1 + std::fabs(ref_out[i])))
            << "split " << split.size();
      }
      if (done == 140) {
        for (size_t i = 0; i < ss; ++i)
          ASSERT_NEAR(state[i], ref_state[i], 1e-5 * (1 + std::fabs(ref_state[i])));
      }
    }
    // Per-step states (forces the recurrent path even for 70 rows).
    std::vector<float> state = init, out(static_cast<size_t>(70 * d.Hv * d.Dv)),
                       steps(70 * ss, NAN);
    GDNStateView st{nullptr, state.data(), 0, 0, d.Hv, d.Hk, d.Dk, d.Dv};
    Layout l = layout_of({70});
    be->gated_delta_rule(st, l.view(70), &slot, d.q.data(), d.k.data(), d.v.data(), d.g.data(),
                         d.beta.data(), out.data(), steps.data());
    for (size_t i = 0; i < 70 * ss; ++i) {
      ASSERT_NEAR(steps[i], ref_steps[i], 1e-5 * (1 + std::fabs(ref_steps[i])))
          << "step state " << i / ss;
    }
  }
}

TEST(CpuGdn, GatesMatchFormula) {
  Backends b;
  Rng rng(23);
  const int n = 7, H = 5;
  std::vector<float> a = rng.normals(n * H, 4.0f), bb = rng.normals(n * H, 3.0f);
  std::vector<float> alog = rng.normals(H), dt = rng.normals(H);
  a[3] = 30.0f;  // softplus linear region
  for (CpuBackend* be : b.all()) {
    std::vector<float> g(n * H), beta(n * H);
    be->gdn_gates(a.data(), bb.data(), alog.data(), dt.data(), g.data(), beta.data(), n, H);
    for (int i = 0; i < n * H; ++i) {
      const double u = static_cast<double>(a[i]) + dt[i % H];
      const double ref = -std::exp(static_cast<double>(alog[i % H])) * std::log1p(std::exp(u));
      ASSERT_NEAR(g[i], ref, 1e-5 * (1 + std::fabs(ref)));
      ASSERT_NEAR(beta[i], test::sigmoid_d(bb[i]), 1e-6);
    }
  }
}

}  // namespace
}  // namespace tokenmill
