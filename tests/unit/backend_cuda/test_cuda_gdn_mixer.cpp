// gdn_mixer (a GDN layer's front, delta rule, gated norm and output projection): on CUDA one
// kernel for decode steps of one sequence (one token, k_dim 128), the op-by-op form otherwise;
// against the CPU backend's op-by-op form over consecutive steps, so every state the fused
// kernel writes (the conv state of the key heads' q and k channels, written by each key head's
// cluster after all its blocks read it, and of the value channels; the delta rule's state) is
// read back by the next step. r = 2 and 3 value heads a key head: clusters of 8 and 12 blocks.
// Tolerances: the delta rule's 1e-4 (test_cuda_attention_gdn.cpp); conv states are copies of inputs
// (exact).
#include <algorithm>
#include <string>

#include "cuda_test_util.h"

namespace tokenmill::cudatest {
namespace {

class CudaGdnMixer : public CudaVsCpu {};

TEST_F(CudaGdnMixer, MatchesCpuOverSteps) {
  Rng rng(31);
  struct Geo {
    int Hk, Hv, Dk, Dv;
  };
  // r = 2 and 3 value heads per key head, a head narrower than the block's 128 columns, and
  // k_dim 16 (not fused: the op-by-op form on CUDA too).
  for (Geo geo : {Geo{2, 4, 128, 128}, Geo{2, 6, 128, 64}, Geo{2, 4, 16, 32}}) {
    const int slots_n = 4, hidden = 48;
    GDNStateView st{};
    st.k_heads = geo.Hk;
    st.v_heads = geo.Hv;
    st.k_dim = geo.Dk;
    st.v_dim = geo.Dv;
    st.kernel = 4;
    st.channels = 2 * geo.Hk * geo.Dk + geo.Hv * geo.Dv;
    const int64_t C = st.channels, K = int64_t{geo.Hv} * geo.Dv;
    std::vector<float> conv = rng.normals(static_cast<size_t>(slots_n * C * 3));
    std::vector<float> ssm =
        rng.normals(static_cast<size_t>(slots_n) * geo.Hv * geo.Dk * geo.Dv, 0.1f);
    const std::vector<float> conv_w = rng.normals(static_cast<size_t>(C * 4), 0.5f);
    const std::vector<float> a_log = rng.normals(static_cast<size_t>(geo.Hv), 0.5f);
    const std::vector<float> dt_bias = rng.normals(static_cast<size_t>(geo.Hv), 0.5f);
    const std::vector<float> norm_w = rng.normals(static_cast<size_t>(geo.Dv));
    // A 4-bit output projection (its digits written by the fused kernel) and a bf16
    // one (the kernel's normed rows read by the GEMV).
    std::vector<HostWeight> ws;
    ws.push_back(affine_weight(rng, 4, 64, DType::BF16, hidden, K, 0));
    ws.push_back(float_weight(rng, DType::BF16, hidden, K, 0));
    rebind(ws);
    const std::vector<Weight> dws = {gpu->upload_weight(ws[0].w), gpu->upload_weight(ws[1].w)};
    float *dconv = up(conv), *dssm = up(ssm);
    const float *dconv_w = up(conv_w), *da_log = up(a_log), *ddt = up(dt_bias);
    const float* dnorm = up(norm_w);
    struct Step {
      std::vector<int32_t> slots;
      std::vector<int> lens;
    };
    int step = 0;
    // One-sequence decode steps (fused) continuing each other and the states that op-by-op
    // steps left (three sequences, a sequence without a token, two tokens), and the reverse.
    for (const Step& sp :
         {Step{{2}, {1}}, Step{{2}, {1}}, Step{{0, 2, 3}, {1, 1, 1}}, Step{{3}, {1}},
          Step{{2, 0, 3}, {1, 0, 1}}, Step{{2}, {2}}, Step{{2}, {1}}, Step{{3}, {1}}}) {
      const std::vector<int32_t>& slots = sp.slots;
      const std::vector<int>& lens = sp.lens;
      const int S = static_cast<int>(slots.size());
      const int32_t* dslots = up(slots);
      const HostWeight& hw = ws[static_cast<size_t>(step) % ws.size()];
      const Weight& dw = dws[static_cast<size_t>(step) % ws.size()];
      std::vector<int32_t> cu = {0};
      for (int l : lens) cu.push_back(cu.back() + l);
      const int T = cu.back();
      std::vector<int32_t> positions(static_cast<size_t>(T), 0);
      const std::vector<float> qkv = rng.normals(static_cast<size_t>(T * C));
      const std::vector<float> z = rng.normals(static_cast<size_t>(T * K));
      const std::vector<float> a = rng.normals(static_cast<size_t>(T * geo.Hv), 2.0f);
      const std::vector<float> b = rng.normals(a.size(), 2.0f);
      const size_t nq = static_cast<size_t>(T) * geo.Hk * geo.Dk, nv = static_cast<size_t>(T * K);
      SeqLayout seqs{S, T, cu.data(), positions.data(),
                     *std::max_element(lens.begin(), lens.end())};

      GdnMixerWeights w;
      w.conv = conv_w.data();
      w.a_log = a_log.data();
      w.dt_bias = dt_bias.data();
      w.norm = norm_w.data();
      w.eps = 1e-6f;
      w.out_proj = &hw.w;
      std::vector<float> co(static_cast<size_t>(T * C)), q(nq), k(nq), v(nv), g(a.size()),
          beta(a.size()), o(nv), normed(nv), out(static_cast<size_t>(T) * hidden);
      st.conv = conv.data();
      st.ssm = ssm.data();
      cpu->gdn_mixer(st, seqs, slots.data(), w,
                     GdnMixerIo{qkv.data(), z.data(), a.data(), b.data(), co.data(), q.data(),
                                k.data(), v.data(), g.data(), beta.data(), o.data(), normed.data()},
                     out.data());

      GDNStateView dst = st;
      dst.conv = dconv;
      dst.ssm = dssm;
      SeqLayout dseqs = seqs;
      dseqs.cu_seqlens = up(cu);
      dseqs.positions = up(positions);
      GdnMixerWeights dwm = w;
      dwm.conv = dconv_w;
      dwm.a_log = da_log;
      dwm.dt_bias = ddt;
      dwm.norm = dnorm;
      dwm.out_proj = &dw;
      float *dnormed = poisoned(nv), *dout = poisoned(out.size());
      gpu->gdn_mixer(
          dst, dseqs, dslots, dwm,
          GdnMixerIo{up(qkv), up(z), up(a), up(b), poisoned(co.size()), poisoned(nq), poisoned(nq),
                     poisoned(nv), poisoned(a.size()), poisoned(a.size()), poisoned(nv), dnormed},
          dout);
      const std::string d = " Hv=" + std::to_string(geo.Hv) + " Dk=" + std::to_string(geo.Dk) +
                            " Dv=" + std::to_string(geo.Dv) + " step " + std::to_string(step);
      // A sequence without a token has no rows: every row of normed and out belongs to one.
      expect_close(down(dnormed, nv), normed, 1e-4, "mixer normed" + d);
      expect_close(down(dout, out.size()), out, 1e-4, "mixer out" + d);
      expect_close(down(dconv, conv.size()), conv, 0.0, "mixer conv state" + d);
      expect_close(down(dssm, ssm.size()), ssm, 1e-4, "mixer delta state" + d);
      ++step;
    }
  }
}

}  // namespace
}  // namespace tokenmill::cudatest
