// moe: CUDA against the CPU backend with the router's ids and weights from the CPU (the same
// routing on both sides), float and affine experts, decode and prefill row counts. moe_block:
// the whole block (norm, router, top-k, experts) on both, decode rows through the fused front.
// Tolerance 1e-4 relative (F32 accumulation in different orders through two products).
#include <algorithm>
#include <cmath>

#include "cuda_test_util.h"

namespace tokenmill::cudatest {
namespace {

// E stacked experts of [rows, cols]: bf16 (bits 0) or MLX affine with F32 scales.
HostWeight make_experts(Rng& rng, int bits, int64_t E, int64_t rows, int64_t cols, int group = 32) {
  // if/else, not ?: (a copy would leave w pointing at the temporary's bytes).
  if (bits == 0) return float_weight(rng, DType::BF16, rows, cols, E);
  return affine_weight(rng, bits, group, DType::F32, rows, cols, E);
}

class CudaMoe : public CudaVsCpu {
 protected:
  // A 4-bit decode block (n <= 4) may leave its combine to the next block's norm
  // (MoeBlockScratch::defer): x then gets the block's output from rmsnorm_linear_multi_moe or
  // add_moe. Either must give the bits of the block's own combine followed by
  // rmsnorm_linear_multi (or add): the same sums in the same order. `proj` is a 4-bit [*,
  // hidden] matrix, so the norm takes the kernel that does the combine itself.
  void expect_deferred_combine_same_bits(const MoeBlockWeights& gb, const std::vector<float>& x0,
                                         const std::vector<float>& y, int64_t n, int64_t hidden,
                                         int k, int64_t shared_inter, int64_t inter,
                                         const Weight& proj, const std::string& what) {
    const int H = static_cast<int>(hidden);
    const size_t floats = x0.size(), proj_floats = static_cast<size_t>(n * proj.rows);
    const auto scratch = [&](MoeRows* defer) {
      MoeBlockScratch s{
          poisoned(floats),
          poisoned(static_cast<size_t>(n * gb.router->rows)),
          poisoned(static_cast<size_t>(n)),
          up(std::vector<int32_t>(static_cast<size_t>(n * k))),
          poisoned(static_cast<size_t>(n * k)),
          poisoned(static_cast<size_t>(moe_scratch_floats(n, k, inter, shared_inter, hidden)))};
      s.defer = defer;
      return s;
    };
    const Weight* ws[1] = {&proj};
    // The block's own combine, then the norm and the projection.
    float *xa = up(x0), *outa = poisoned(floats), *ha = poisoned(floats);
    float* pa = poisoned(proj_floats);
    gpu->moe_block(xa, up(y), n, H, gb, scratch(nullptr), outa);
    gpu->rmsnorm_linear_multi(xa, outa, gb.norm, ha, true, n, H, gb.eps, ws, &pa, 1);
    // Deferred into the norm.
    MoeRows rows;
    float *xb = up(x0), *outb = poisoned(floats), *hb = poisoned(floats);
    float* pb = poisoned(proj_floats);
    gpu->moe_block(xb, up(y), n, H, gb, scratch(&rows), outb);
    ASSERT_EQ(rows.rows != nullptr, n <= 4) << what << ": decode rows defer their combine";
    if (rows.rows != nullptr) {
      gpu->rmsnorm_linear_multi_moe(xb, rows, outb, gb.norm, hb, true, n, H, gb.eps, ws, &pb, 1);
    } else {
      gpu->rmsnorm_linear_multi(xb, outb, gb.norm, hb, true, n, H, gb.eps, ws, &pb, 1);
    }
    EXPECT_EQ(down(xb, floats), down(xa, floats)) << what << " deferred: residual";
    EXPECT_EQ(down(hb, floats), down(ha, floats)) << what << " deferred: normed rows";
    EXPECT_EQ(down(pb, proj_floats), down(pa, proj_floats)) << what << " deferred: projection";
    // Deferred into the plain residual add.
    float *xc = up(x0), *outc = poisoned(floats);
    gpu->moe_block(xc, up(y), n, H, gb, scratch(&rows), outc);
    if (rows.rows != nullptr) {
      gpu->add_moe(xc, rows, outc, n, H);
    } else {
      gpu->add(xc, outc, n * hidden);
    }
    EXPECT_EQ(down(xc, floats), down(xa, floats)) << what << " deferred: add_moe";
  }
};

// Shared expert: none, one as wide as the routed experts (the 4-bit kernels run it as one more
// slot per token) and a narrower one (run after the routed experts).
TEST_F(CudaMoe, MatchesCpu) {
  Rng rng(31);
  const int64_t E = 6, hidden = 64, inter = 96;
  const int k = 2;
  for (int bits : {0, 4, 3}) {
    HostWeight g = make_experts(rng, bits, E, inter, hidden),
               u = make_experts(rng, bits, E, inter, hidden),
               d = make_experts(rng, bits, E, hidden, inter);
    const Weight dg = gpu->upload_weight(g.w), du = gpu->upload_weight(u.w),
                 dd = gpu->upload_weight(d.w);
    for (int64_t shared_inter : {int64_t{0}, inter, int64_t{32}}) {
      // One expert's matrices, then made plain.
      HostWeight sg = make_experts(rng, bits, 1, std::max<int64_t>(shared_inter, 32), hidden),
                 su = make_experts(rng, bits, 1, std::max<int64_t>(shared_inter, 32), hidden),
                 sd = make_experts(rng, bits, 1, hidden, std::max<int64_t>(shared_inter, 32));
      sg.w.experts = su.w.experts = sd.w.experts = 0;
      const Weight dsg = gpu->upload_weight(sg.w), dsu = gpu->upload_weight(su.w),
                   dsd = gpu->upload_weight(sd.w);
      // Grouped by expert: 4-bit from n = 200 (64-row chunks in pieces of rows, two pieces at
      // 500), other formats from 40 (per-expert GEMMs of more than 64 rows at 200 and 500).
      for (int64_t n : {1, 5, 40, 200, 500}) {
        const std::string what = "moe bits " + std::to_string(bits) + " shared " +
                                 std::to_string(shared_inter) + " n=" + std::to_string(n);
        std::vector<float> x = rng.normals(static_cast<size_t>(n * hidden));
        std::vector<float> logits = rng.normals(static_cast<size_t>(n * E));
        std::vector<float> gate_logit = rng.normals(static_cast<size_t>(n));
        std::vector<int32_t> ids(static_cast<size_t>(n * k));
        std::vector<float> w(ids.size());
        cpu->topk_softmax(logits.data(), n, static_cast<int>(E), k, true, ids.data(), w.data());
        std::vector<float> scratch(
            static_cast<size_t>(moe_scratch_floats(n, k, inter, shared_inter, hidden)));
        std::vector<float> want(static_cast<size_t>(n * hidden));
        const SharedExpert cpu_shared{&sg.w, &su.w, &sd.w, gate_logit.data()};
        const SharedExpert gpu_shared{&dsg, &dsu, &dsd, up(gate_logit)};
        const bool has = shared_inter > 0;
        cpu->moe(x.data(), n, k, ids.data(), w.data(), g.w, u.w, d.w, has ? &cpu_shared : nullptr,
                 want.data(), scratch.data());
        float* dout = poisoned(want.size());
        gpu->moe(up(x), n, k, up(ids), up(w), dg, du, dd, has ? &gpu_shared : nullptr, dout,
                 poisoned(scratch.size()));
        const std::vector<float> got = down(dout, want.size());
        expect_close(got, want, 1e-4, what);
        if (has) {  // the shared expert made a difference the comparison could see
          std::vector<float> routed(want.size());
          cpu->moe(x.data(), n, k, ids.data(), w.data(), g.w, u.w, d.w, nullptr, routed.data(),
                   scratch.data());
          double diff = 0.0;
          for (size_t i = 0; i < routed.size(); ++i) diff += std::fabs(routed[i] - want[i]);
          EXPECT_GT(diff / static_cast<double>(routed.size()), 1e-3) << what;
        }
      }
    }
  }
}

// More tokens than the 4-bit slot kernels' activation workspace holds (8,192-wide rows) but too
// few slots per expert for the chunked form (600 slots over 160 experts): the slot kernels run
// in pieces of tokens, with the shared expert as a slot.
TEST_F(CudaMoe, LongBatchRunsSlotKernelsInPieces) {
  Rng rng(32);
  const int64_t E = 160, hidden = 8192, inter = 32, n = 600;
  const int k = 1;
  HostWeight g = make_experts(rng, 4, E, inter, hidden), u = make_experts(rng, 4, E, inter, hidden),
             d = make_experts(rng, 4, E, hidden, inter);
  HostWeight sg = make_experts(rng, 4, 1, inter, hidden),
             su = make_experts(rng, 4, 1, inter, hidden),
             sd = make_experts(rng, 4, 1, hidden, inter);
  sg.w.experts = su.w.experts = sd.w.experts = 0;
  const Weight dg = gpu->upload_weight(g.w), du = gpu->upload_weight(u.w),
               dd = gpu->upload_weight(d.w), dsg = gpu->upload_weight(sg.w),
               dsu = gpu->upload_weight(su.w), dsd = gpu->upload_weight(sd.w);
  std::vector<float> x = rng.normals(static_cast<size_t>(n * hidden));
  std::vector<float> logits = rng.normals(static_cast<size_t>(n * E));
  std::vector<float> gate_logit = rng.normals(static_cast<size_t>(n));
  std::vector<int32_t> ids(static_cast<size_t>(n * k));
  std::vector<float> w(ids.size());
  cpu->topk_softmax(logits.data(), n, static_cast<int>(E), k, true, ids.data(), w.data());
  std::vector<float> scratch(static_cast<size_t>(moe_scratch_floats(n, k, inter, inter, hidden)));
  std::vector<float> want(static_cast<size_t>(n * hidden));
  const SharedExpert cpu_shared{&sg.w, &su.w, &sd.w, gate_logit.data()};
  const SharedExpert gpu_shared{&dsg, &dsu, &dsd, up(gate_logit)};
  cpu->moe(x.data(), n, k, ids.data(), w.data(), g.w, u.w, d.w, &cpu_shared, want.data(),
           scratch.data());
  float* dout = poisoned(want.size());
  gpu->moe(up(x), n, k, up(ids), up(w), dg, du, dd, &gpu_shared, dout, poisoned(scratch.size()));
  expect_close(down(dout, want.size()), want, 1e-4, "moe q4 n=600 in pieces");
}

// The whole block, CUDA (decode rows: the fused front; 5 rows: the ops one by one) against the
// CPU's ops one by one: the residual, the normed rows, the logits, the same experts picked,
// their weights and the output. Routers in bf16 and 8 bits (2,560 wide: past the chunks loaded
// before the wait); 4-bit experts (their digits from the front, the picks and the residual add
// in the gate/up launch), bf16 ones, and 4-bit gate/up with an 8-bit down projection (the front
// leaves the picks, but the slot kernels do not take the experts: moe_experts makes them).
TEST_F(CudaMoe, BlockMatchesCpu) {
  Rng rng(33);
  const int64_t E = 64;
  const int k = 4;
  // Expert bits (gate and up, down), the intermediate size and the hidden size: 512 (the
  // 35B-A3B's) takes the fused expert MLP at one token (cuda_moe_mlp.cu), at hidden 2560 (more
  // down tiles than warps) and 1024 (fewer), groups of 64; 64 takes the slot kernels.
  struct ExpertCase {
    int gate_up, down;
    int64_t inter, hidden;
    int group;
  };
  for (int router_bits : {0, 8}) {
    for (const ExpertCase bits : {ExpertCase{4, 4, 64, 2560, 32}, ExpertCase{0, 0, 64, 2560, 32},
                                  ExpertCase{4, 8, 64, 2560, 32}, ExpertCase{4, 4, 512, 2560, 64},
                                  ExpertCase{4, 4, 512, 1024, 64}}) {
      const int64_t inter = bits.inter, hidden = bits.hidden;
      const int group = bits.group;
      std::vector<float> norm = rng.normals(static_cast<size_t>(hidden));
      for (float& v : norm) v = 1.0f + 0.2f * v;
      HostWeight router = make_experts(rng, router_bits, 1, E, hidden, 64),
                 sgate = make_experts(rng, router_bits, 1, 1, hidden, 64);
      router.w.experts = sgate.w.experts = 0;
      HostWeight g = make_experts(rng, bits.gate_up, E, inter, hidden, group),
                 u = make_experts(rng, bits.gate_up, E, inter, hidden, group),
                 d = make_experts(rng, bits.down, E, hidden, inter, group);
      HostWeight sg = make_experts(rng, bits.gate_up, 1, inter, hidden, group),
                 su = make_experts(rng, bits.gate_up, 1, inter, hidden, group),
                 sd = make_experts(rng, bits.down, 1, hidden, inter, group);
      sg.w.experts = su.w.experts = sd.w.experts = 0;
      const Weight dr = gpu->upload_weight(router.w), dsgate = gpu->upload_weight(sgate.w),
                   dg = gpu->upload_weight(g.w), du = gpu->upload_weight(u.w),
                   dd = gpu->upload_weight(d.w), dsg = gpu->upload_weight(sg.w),
                   dsu = gpu->upload_weight(su.w), dsd = gpu->upload_weight(sd.w);
      for (bool shared : {true, false}) {
        MoeBlockWeights cb;
        cb.norm = norm.data();
        cb.eps = 1e-6f;
        cb.router = &router.w;
        cb.k = k;
        cb.gate = &g.w, cb.up = &u.w, cb.down = &d.w;
        MoeBlockWeights gb = cb;
        gb.norm = up(norm);
        gb.router = &dr;
        gb.gate = &dg, gb.up = &du, gb.down = &dd;
        if (shared) {
          cb.shared_expert_gate = &sgate.w;
          cb.shared_gate = &sg.w, cb.shared_up = &su.w, cb.shared_down = &sd.w;
          gb.shared_expert_gate = &dsgate;
          gb.shared_gate = &dsg, gb.shared_up = &dsu, gb.shared_down = &dsd;
        }
        for (int64_t n : {1, 3, 4, 5}) {
          const std::string what = "moe_block router bits " + std::to_string(router_bits) +
                                   " expert bits " + std::to_string(bits.gate_up) + "/" +
                                   std::to_string(bits.down) + " inter " + std::to_string(inter) +
                                   " group " + std::to_string(group) + " shared " +
                                   std::to_string(shared) + " n=" + std::to_string(n);
          std::vector<float> x = rng.normals(static_cast<size_t>(n * hidden));
          const std::vector<float> x0 = x;
          const std::vector<float> y = rng.normals(static_cast<size_t>(n * hidden));
          const size_t scratch_floats =
              static_cast<size_t>(moe_scratch_floats(n, k, inter, shared ? inter : 0, hidden));
          std::vector<float> h(x.size()), logits(static_cast<size_t>(n * E)),
              sl(static_cast<size_t>(n)), w(static_cast<size_t>(n * k)), scratch(scratch_floats),
              out(x.size());
          std::vector<int32_t> ids(w.size());
          float* dx = up(x);
          const MoeBlockScratch gs{poisoned(h.size()),  poisoned(logits.size()),
                                   poisoned(sl.size()), up(std::vector<int32_t>(ids.size())),
                                   poisoned(w.size()),  poisoned(scratch.size())};
          float* dout = poisoned(out.size());
          gpu->moe_block(dx, up(y), n, static_cast<int>(hidden), gb, gs, dout);
          cpu->moe_block(x.data(), y.data(), n, static_cast<int>(hidden), cb,
                         MoeBlockScratch{h.data(), logits.data(), sl.data(), ids.data(), w.data(),
                                         scratch.data()},
                         out.data());
          expect_close(down(dx, x.size()), x, 1e-6, what + " residual");
          expect_close(down(gs.h, h.size()), h, 1e-5, what + " h");
          expect_close(down(gs.logits, logits.size()), logits, 1e-4, what + " logits");
          EXPECT_EQ(down(gs.ids, ids.size()), ids) << what;
          expect_close(down(gs.weights, w.size()), w, 1e-4, what + " weights");
          if (shared)
            expect_close(down(gs.shared_logit, sl.size()), sl, 1e-4, what + " gate logit");
          expect_close(down(dout, out.size()), out, 1e-4, what + " out");
          if (bits.gate_up == 4 && bits.down == 4) {
            expect_deferred_combine_same_bits(gb, x0, y, n, hidden, k, shared ? inter : 0, inter,
                                              dsg, what);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace tokenmill::cudatest
