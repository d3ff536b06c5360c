// linear (GEMV n <= 16 and the tensor-core GEMM above) and embed: CUDA against the CPU backend
// on the same weights, every float format and every MLX affine bits/group/scale type.
// Tolerance 1e-4 relative: F32 accumulation on both sides, in different orders over <= 5120
// terms; on the tensor cores operands that F16 would round are split into two F16 parts (about
// 22 significant bits).
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "cuda_test_util.h"
#include "tensor/affine.h"
#include "tensor/dtype.h"

namespace tokenmill::cudatest {
namespace {

constexpr double kTol = 1e-4;

class CudaLinear : public CudaVsCpu {
 protected:
  // Runs linear on both backends for each n and compares.
  void check(const HostWeight& hw, const std::vector<int64_t>& ns, int expert,
             const std::string& what) {
    const Weight dw = gpu->upload_weight(hw.w);
    Rng rng(static_cast<uint32_t>(hw.w.rows * 31 + hw.w.cols + expert));
    for (int64_t n : ns) {
      std::vector<float> x = rng.normals(static_cast<size_t>(n * hw.w.cols));
      std::vector<float> want(static_cast<size_t>(n * hw.w.rows));
      cpu->linear(x.data(), n, hw.w, want.data(), expert);
      float* dout = poisoned(want.size());
      gpu->linear(up(x), n, dw, dout, expert);
      expect_close(down(dout, want.size()), want, kTol, what + " n=" + std::to_string(n));
    }
  }
  const std::vector<int64_t> ns_ = {1, 2, 5, 16, 17, 70, 130};
};

TEST_F(CudaLinear, FloatFormats) {
  Rng rng(1);
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    // cols 256 takes the 8-wide loads; cols 45 the element path (no multiple of 8).
    for (int64_t cols : {256, 45}) {
      HostWeight hw = float_weight(rng, t, 37, cols, 0);
      check(hw, ns_, 0, std::string(dtype_name(t)) + " cols=" + std::to_string(cols));
    }
  }
}

TEST_F(CudaLinear, AffineEveryBitsGroupScaleType) {
  Rng rng(2);
  for (int bits : {2, 3, 4, 5, 6, 8}) {
    for (int group : {32, 64, 128}) {
      for (DType sd : {DType::BF16, DType::F16, DType::F32}) {
        HostWeight hw = affine_weight(rng, bits, group, sd, 40, 256, 0);
        check(hw, {1, 3, 16, 33}, 0,
              "q" + std::to_string(bits) + "g" + std::to_string(group) + " " + dtype_name(sd));
      }
    }
  }
}

TEST_F(CudaLinear, StackedExpertsPickTheMatrix) {
  Rng rng(3);
  HostWeight a = affine_weight(rng, 4, 64, DType::BF16, 24, 128, 3);
  check(a, {1, 7, 20}, 2, "affine expert 2");
  HostWeight f = float_weight(rng, DType::BF16, 24, 128, 3);
  check(f, {1, 7, 20}, 1, "bf16 expert 1");
}

TEST_F(CudaLinear, LargeShapes) {
  Rng rng(4);
  HostWeight hw = affine_weight(rng, 4, 64, DType::BF16, 1000, 1024, 0);
  check(hw, {1, 8, 29, 64, 300}, 0, "q4g64 1000x1024");
  // 17..64 rows (the weight-stationary kernel) at every group size, a row count that leaves a
  // partial block tile and one that leaves a partial 16-row tile.
  for (int group : {32, 128}) {
    HostWeight g = affine_weight(rng, 4, group, DType::BF16, 200, 1024, 0);
    check(g, {20, 64}, 0, "q4g" + std::to_string(group) + " 200x1024");
  }
  HostWeight odd = affine_weight(rng, 4, 64, DType::F16, 1000 + 7, 512, 0);
  check(odd, {40}, 0, "q4g64 1007x512");
  HostWeight fw = float_weight(rng, DType::BF16, 515, 768, 0);
  check(fw, {4, 129}, 0, "bf16 515x768");
}

// Prefill rows (the GEMM path) over 4-bit weights in the tile layout: every group size, rows
// that leave a partial 16-row tile, and a matrix whose F16 parts take two workspace slabs (the
// second starting at row 3,008; the three exact parts of 8,192 columns are 48 KB a row).
TEST_F(CudaLinear, GemmOfTiledQ4EveryGroupAndSlab) {
  Rng rng(15);
  for (int group : {32, 64, 128}) {
    HostWeight hw = affine_weight(rng, 4, group, DType::BF16, 1007, 512, 0);
    check(hw, {65, 100}, 0, "q4g" + std::to_string(group) + " 1007x512");
  }
  HostWeight f32s = affine_weight(rng, 4, 64, DType::F32, 77, 256, 0);
  check(f32s, {100}, 0, "q4g64 f32 scales 77x256");
  HostWeight big = affine_weight(rng, 4, 64, DType::BF16, 6007, 8192, 0);
  check(big, {80}, 0, "q4g64 6007x8192 (two slabs)");
}

// More tiles than the device holds warps (an LM head's 248,320 rows make 15,520 tiles): stream-K
// splits tiles far past the first few thousand, and their fixups must stay inside the workspace
// (run under compute-sanitizer by tools/gpu_test.sh).
TEST_F(CudaLinear, ManyTilesStreamK) {
  Rng rng(9);
  HostWeight q4 = affine_weight(rng, 4, 64, DType::BF16, 150000, 128, 0);
  check(q4, {1, 3, 20, 64}, 0, "q4g64 150000x128");
  HostWeight bf = float_weight(rng, DType::BF16, 150000, 64, 0);
  check(bf, {1}, 0, "bf16 150000x64");
}

// A split tile's output is written by whichever of its warps finishes last (which one depends on
// timing), adding the partials in warp order: every launch must give the same bits, and a
// counter left nonzero would corrupt the next launch.
// (Where 2,640 warps are resident, as on the H100 and H200: at n = 1 the 5120x6144 matrix's 320
// tiles get a tile-aligned launch, 8 warps a tile in clusters of two blocks, and the 16480x5120
// matrix's 1,030 tiles 2 warps a tile, both with local fixups (StreamK::local); the 22400x5120
// matrix's 1,400 tiles a full wave in which warps cross from one split tile into the next; warps
// hold 10 steps or more, so those fixups peek, StreamK::peek; the 12352x2048 matrix's 772 tiles
// 3 warps a tile, four tiles to a cluster of three blocks, a tile's warps in two blocks. n = 3
// takes the global fixups.)
TEST_F(CudaLinear, SplitTilesSameBitsEveryLaunch) {
  Rng rng(12);
  for (const auto& [rows, cols] :
       {std::pair<int64_t, int64_t>{5120, 6144}, {16480, 5120}, {22400, 5120}, {12352, 2048}}) {
    HostWeight hw = affine_weight(rng, 4, 64, DType::BF16, rows, cols, 0);
    const Weight dw = gpu->upload_weight(hw.w);
    for (int64_t n : {1, 3}) {
      const std::string what =
          "q4g64 " + std::to_string(rows) + "x" + std::to_string(cols) + " n=" + std::to_string(n);
      std::vector<float> x = rng.normals(static_cast<size_t>(n * hw.w.cols));
      std::vector<float> want(static_cast<size_t>(n * hw.w.rows));
      cpu->linear(x.data(), n, hw.w, want.data(), 0);
      const float* dx = up(x);
      float* dout = poisoned(want.size());
      std::vector<float> first;
      for (int launch = 0; launch < 60; ++launch) {
        gpu->linear(dx, n, dw, dout, 0);
        std::vector<float> got = down(dout, want.size());
        if (launch == 0) {
          expect_close(got, want, kTol, what);
          first = got;
        } else {
          ASSERT_EQ(std::memcmp(got.data(), first.data(), got.size() * sizeof(float)), 0)
              << what << ": launch " << launch << " differs from the first";
        }
      }
    }
  }
}

// linear_multi runs the matrices of each fast format in one launch (up to four per launch) and
// the rest as separate linears; all must equal the CPU's separate linears. Row counts that are
// not a multiple of the per-warp rows (37, 5, 1) exercise the tails.
TEST_F(CudaLinear, MultiMatchesSeparateLinears) {
  Rng rng(6);
  std::vector<std::vector<HostWeight>> sets;
  sets.push_back({affine_weight(rng, 4, 64, DType::BF16, 37, 256, 0),
                  affine_weight(rng, 4, 64, DType::BF16, 200, 256, 0),
                  affine_weight(rng, 4, 64, DType::BF16, 5, 256, 0),
                  affine_weight(rng, 4, 64, DType::BF16, 1, 256, 0)});
  sets.push_back(
      {float_weight(rng, DType::BF16, 37, 256, 0), float_weight(rng, DType::BF16, 64, 256, 0)});
  sets.push_back({affine_weight(rng, 8, 32, DType::F16, 33, 256, 0),
                  affine_weight(rng, 8, 32, DType::F16, 3, 256, 0)});
  // Mixed formats: the fallback path.
  sets.push_back({affine_weight(rng, 4, 64, DType::BF16, 20, 256, 0),
                  affine_weight(rng, 8, 64, DType::BF16, 4, 256, 0),
                  float_weight(rng, DType::BF16, 9, 256, 0)});
  // Interleaved formats, as a MoE layer's router, shared expert and shared gate: grouped.
  sets.push_back({affine_weight(rng, 4, 64, DType::BF16, 48, 256, 0),
                  float_weight(rng, DType::BF16, 16, 256, 0),
                  affine_weight(rng, 4, 64, DType::BF16, 48, 256, 0),
                  float_weight(rng, DType::BF16, 1, 256, 0),
                  affine_weight(rng, 4, 32, DType::BF16, 7, 256, 0)});
  // Five of one format: two launches.
  sets.push_back({affine_weight(rng, 4, 64, DType::BF16, 16, 256, 0),
                  affine_weight(rng, 4, 64, DType::BF16, 17, 256, 0),
                  affine_weight(rng, 4, 64, DType::BF16, 3, 256, 0),
                  affine_weight(rng, 4, 64, DType::BF16, 32, 256, 0),
                  affine_weight(rng, 4, 64, DType::BF16, 9, 256, 0)});
  for (size_t si = 0; si < sets.size(); ++si) {
    auto& set = sets[si];
    rebind(set);  // the copies into `sets` must point at their own bytes
    std::vector<Weight> dws;
    for (const HostWeight& hw : set) dws.push_back(gpu->upload_weight(hw.w));
    // 100 rows: the prefill GEMM, every matrix from one split of x (mixed sets: into the most
    // parts any of them takes).
    for (int64_t n : {1, 3, 16, 40, 100}) {
      std::vector<float> x = rng.normals(static_cast<size_t>(n * 256));
      float* dx = up(x);
      std::vector<const Weight*> ws;
      std::vector<float*> outs;
      for (size_t i = 0; i < set.size(); ++i) {
        ws.push_back(&dws[i]);
        outs.push_back(poisoned(static_cast<size_t>(n * set[i].w.rows)));
      }
      gpu->linear_multi(dx, n, ws.data(), outs.data(), static_cast<int>(set.size()));
      // Compared as one vector per set: a lone near-zero dot of a 1-row matrix has no scale of
      // its own to be relative to.
      std::vector<float> got_all, want_all;
      for (size_t i = 0; i < set.size(); ++i) {
        std::vector<float> want(static_cast<size_t>(n * set[i].w.rows));
        cpu->linear(x.data(), n, set[i].w, want.data());
        std::vector<float> got = down(outs[i], want.size());
        got_all.insert(got_all.end(), got.begin(), got.end());
        want_all.insert(want_all.end(), want.begin(), want.end());
      }
      expect_close(got_all, want_all, kTol,
                   "set " + std::to_string(si) + " n=" + std::to_string(n));
    }
  }
}

// The norm that starts a block and its projections: for 1-4 rows the norm's kernel prepares the
// 4-bit matrices of the first one's group size (here 64: two of them, one launch), the rest (a
// bf16 matrix and a 4-bit one of group 32) read h; more rows take the default (the norm, then
// the projections: 17-64 rows in the wide 4-bit kernels). x, h and every output against the
// CPU's add_rmsnorm (or rmsnorm) then linear.
TEST_F(CudaLinear, RmsnormLinearMultiMatchesCpu) {
  Rng rng(9);
  const int64_t H = 512;
  std::vector<HostWeight> set;
  set.push_back(affine_weight(rng, 4, 64, DType::BF16, 80, H, 0));
  set.push_back(float_weight(rng, DType::BF16, 16, H, 0));
  set.push_back(affine_weight(rng, 4, 64, DType::BF16, 33, H, 0));
  set.push_back(affine_weight(rng, 4, 32, DType::BF16, 24, H, 0));
  rebind(set);
  std::vector<Weight> dws;
  for (const HostWeight& hw : set) dws.push_back(gpu->upload_weight(hw.w));
  const std::vector<float> norm_w = rng.normals(static_cast<size_t>(H));
  for (bool residual : {false, true}) {
    for (int64_t n : {1, 3, 4, 6, 17, 40, 64}) {
      const std::string what = std::string(residual ? "add" : "plain") + " n=" + std::to_string(n);
      std::vector<float> x = rng.normals(static_cast<size_t>(n * H), 3.0f),
                         y = rng.normals(static_cast<size_t>(n * H));
      float* dx = up(x);
      std::vector<float> h(x.size());
      if (residual) {
        cpu->add_rmsnorm(x.data(), y.data(), norm_w.data(), h.data(), n, static_cast<int>(H),
                         1e-6f);
      } else {
        cpu->rmsnorm(x.data(), norm_w.data(), h.data(), n, static_cast<int>(H), 1e-6f);
      }
      std::vector<const Weight*> ws;
      std::vector<float*> outs;
      for (size_t i = 0; i < set.size(); ++i) {
        ws.push_back(&dws[i]);
        outs.push_back(poisoned(static_cast<size_t>(n * set[i].w.rows)));
      }
      float* dh = poisoned(h.size());
      gpu->rmsnorm_linear_multi(dx, residual ? up(y) : nullptr, up(norm_w), dh, true, n,
                                static_cast<int>(H), 1e-6f, ws.data(), outs.data(),
                                static_cast<int>(set.size()));
      expect_close(down(dx, x.size()), x, kTol, what + " x");
      expect_close(down(dh, h.size()), h, kTol, what + " h");
      for (size_t i = 0; i < set.size(); ++i) {
        std::vector<float> want(static_cast<size_t>(n * set[i].w.rows));
        cpu->linear(h.data(), n, set[i].w, want.data());
        expect_close(down(outs[i], want.size()), want, kTol, what + " matrix " + std::to_string(i));
      }
    }
  }
}

// The GDN output projection of the gated norm: fused for 4-bit weights at 1-4 rows, the default
// otherwise; the normed rows and the outputs against the CPU's rmsnorm_gated then linear.
TEST_F(CudaLinear, RmsnormGatedLinearMatchesCpu) {
  Rng rng(10);
  const int heads = 6, D = 128;
  const int64_t K = int64_t{heads} * D, R = 40;
  std::vector<HostWeight> ws;
  ws.push_back(affine_weight(rng, 4, 64, DType::BF16, R, K, 0));
  ws.push_back(affine_weight(rng, 4, 128, DType::F16, R, K, 0));
  ws.push_back(float_weight(rng, DType::BF16, R, K, 0));
  rebind(ws);
  const std::vector<float> norm_w = rng.normals(static_cast<size_t>(D));
  for (size_t wi = 0; wi < ws.size(); ++wi) {
    const Weight dw = gpu->upload_weight(ws[wi].w);
    for (int64_t n : {1, 4, 5}) {
      const std::string what = "weight " + std::to_string(wi) + " n=" + std::to_string(n);
      const std::vector<float> o = rng.normals(static_cast<size_t>(n * K), 2.0f),
                               z = rng.normals(static_cast<size_t>(n * K));
      std::vector<float> g(o.size()), want(static_cast<size_t>(n * R));
      cpu->rmsnorm_gated(o.data(), z.data(), norm_w.data(), g.data(), n * heads, D, 1e-6f);
      cpu->linear(g.data(), n, ws[wi].w, want.data());
      float* dg = poisoned(g.size());
      float* dout = poisoned(want.size());
      gpu->rmsnorm_gated_linear(up(o), up(z), up(norm_w), dg, n, heads, D, 1e-6f, dw, dout);
      expect_close(down(dg, g.size()), g, kTol, what + " normed");
      expect_close(down(dout, want.size()), want, kTol, what);
    }
  }
}

// A down projection of silu(gate) * up, and a projection of x * sigmoid(gate): fused into the
// 4-bit digit GEMV's preparation at 1-4 rows, the default (the elementwise op, then linear)
// otherwise; either way the CPU's elementwise op then linear.
TEST_F(CudaLinear, SiluMulLinearMatchesCpu) {
  Rng rng(8);
  const int64_t I = 320, H = 96;
  std::vector<HostWeight> ws;
  ws.push_back(affine_weight(rng, 4, 64, DType::BF16, H, I, 0));
  ws.push_back(affine_weight(rng, 4, 32, DType::F16, H, I, 0));
  ws.push_back(float_weight(rng, DType::BF16, H, I, 0));
  rebind(ws);
  for (size_t wi = 0; wi < ws.size(); ++wi) {
    const Weight dw = gpu->upload_weight(ws[wi].w);
    // 64 rows: the widest 4-bit GEMV; 100 rows: the prefill GEMM, the gate applied in the pass
    // that finds its scale.
    for (int64_t n : {1, 2, 4, 5, 17, 64, 100}) {
      const std::vector<float> gate = rng.normals(static_cast<size_t>(n * I), 2.0f),
                               upv = rng.normals(static_cast<size_t>(n * I));
      std::vector<float> act(gate.size()), want(static_cast<size_t>(n * H));
      cpu->silu_mul(gate.data(), upv.data(), act.data(), n * I);
      cpu->linear(act.data(), n, ws[wi].w, want.data());
      float* dout = poisoned(want.size());
      gpu->silu_mul_linear(up(gate), up(upv), n, dw, dout, poisoned(act.size()));
      expect_close(down(dout, want.size()), want, kTol,
                   "weight " + std::to_string(wi) + " n=" + std::to_string(n));
      // The gated attention output's form: x * sigmoid(gate).
      std::vector<float> gated = upv;
      cpu->sigmoid_mul(gated.data(), gate.data(), n * I);
      cpu->linear(gated.data(), n, ws[wi].w, want.data());
      dout = poisoned(want.size());
      gpu->sigmoid_mul_linear(up(upv), up(gate), n, dw, dout);
      expect_close(down(dout, want.size()), want, kTol,
                   "sigmoid weight " + std::to_string(wi) + " n=" + std::to_string(n));
    }
  }
}

// The 4-bit tensor-core GEMV scales each activation row into F16 range: rows of very different
// magnitudes (1e4 and 1e-6) and rows with one large outlier must keep F32-level accuracy, at a
// real model width (5120) and every group size.
TEST_F(CudaLinear, Q4DecodeKeepsF32AccuracyOverWideRanges) {
  Rng rng(7);
  for (int group : {32, 64, 128}) {
    HostWeight hw = affine_weight(rng, 4, group, DType::BF16, 70, 5120, 0);
    const Weight dw = gpu->upload_weight(hw.w);
    for (int64_t n : {1, 4, 9, 16, 37, 64}) {  // 37, 64: the wide (17..64-row) kernel
      std::vector<float> x = rng.normals(static_cast<size_t>(n * 5120));
      for (int64_t i = 0; i < n; ++i) {
        const float scale = i % 3 == 0 ? 1e4f : i % 3 == 1 ? 1e-6f : 1.0f;
        for (int64_t k = 0; k < 5120; ++k) x[i * 5120 + k] *= scale;
        if (i % 3 == 2) x[i * 5120 + 17] = 3e4f;  // one outlier far above the rest
      }
      for (int64_t i = 0; i < n; ++i) {
        std::vector<float> want(static_cast<size_t>(hw.w.rows));
        cpu->linear(x.data() + i * 5120, 1, hw.w, want.data());
        float* dout = poisoned(static_cast<size_t>(n * hw.w.rows));
        gpu->linear(up(x), n, dw, dout);
        std::vector<float> got = down(dout, static_cast<size_t>(n * hw.w.rows));
        got.erase(got.begin(), got.begin() + i * hw.w.rows);
        got.resize(want.size());
        expect_close(got, want, kTol,
                     "q4g" + std::to_string(group) + " n=" + std::to_string(n) + " row " +
                         std::to_string(i));
      }
    }
  }
}

// The largest |got - bf16(x) . w| over got's rms, for BF16 weights hw (double sums). rel: how
// far (relatively) the device's x may be from the given one (its own gate arithmetic); where
// that straddles a BF16 rounding boundary, either rounding is accepted.
double off_bf16_product(const std::vector<float>& got, const std::vector<float>& x, int64_t n,
                        const HostWeight& hw, double rel = 0) {
  const auto* wb = reinterpret_cast<const uint16_t*>(hw.data.data());
  const int64_t K = hw.w.cols, R = hw.w.rows;
  const auto bf = [](double v) { return double{bf16_to_f32(f32_to_bf16(static_cast<float>(v)))}; };
  double off = 0, ss = 0;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t o = 0; o < R; ++o) {
      double dot = 0, slack = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double v = x[static_cast<size_t>(r * K + k)], w = bf16_to_f32(wb[o * K + k]);
        dot += bf(v) * w;
        slack += std::fabs(w) * std::fabs(bf(v * (1 + rel)) - bf(v * (1 - rel)));
      }
      const float g = got[static_cast<size_t>(r * R + o)];
      off = std::max(off, std::fabs(g - dot) - slack);
      ss += double{g} * g;
    }
  }
  return off / std::sqrt(ss / static_cast<double>(n * R));
}

// The gated GEMM inputs at kFast with BF16 weights: the gate and the BF16 rounding in one
// pass, then the weights in place; the result is the product of the BF16-rounded gated values.
TEST_F(CudaLinear, FastBf16GatedPrefillIsTheBf16Product) {
  std::unique_ptr<Backend> fast = make_cuda_backend(0, PrefillPrecision::kFast);
  Rng rng(13);
  const int64_t I = 320, H = 96, n = 100;
  HostWeight hw = float_weight(rng, DType::BF16, H, I, 0);
  const Weight dw = fast->upload_weight(hw.w);
  const std::vector<float> gate = rng.normals(static_cast<size_t>(n * I), 2.0f),
                           upv = rng.normals(static_cast<size_t>(n * I));
  auto* dg = static_cast<float*>(fast->alloc(gate.size() * sizeof(float)));
  auto* du = static_cast<float*>(fast->alloc(upv.size() * sizeof(float)));
  auto* dact = static_cast<float*>(fast->alloc(upv.size() * sizeof(float)));
  auto* dout = static_cast<float*>(fast->alloc(static_cast<size_t>(n * H) * sizeof(float)));
  std::vector<float> act(gate.size()), got(static_cast<size_t>(n * H));
  fast->upload(dg, gate.data(), gate.size() * sizeof(float));
  fast->upload(du, upv.data(), upv.size() * sizeof(float));
  fast->silu_mul_linear(dg, du, n, dw, dout, dact);
  fast->download(got.data(), dout, got.size() * sizeof(float));
  cpu->silu_mul(gate.data(), upv.data(), act.data(), n * I);
  EXPECT_LT(off_bf16_product(got, act, n, hw, 4e-6), 1e-5) << "silu(gate) * up";
  act = upv;
  cpu->sigmoid_mul(act.data(), gate.data(), n * I);
  fast->sigmoid_mul_linear(du, dg, n, dw, dout);
  fast->download(got.data(), dout, got.size() * sizeof(float));
  EXPECT_LT(off_bf16_product(got, act, n, hw, 4e-6), 1e-5) << "x * sigmoid(gate)";
  for (float* p : {dg, du, dact, dout}) fast->free(p);
}

// Host <-> device copies of F32 values on a backend a test makes for itself (a fast-precision
// one); the caller frees what up() allocates.
struct FloatCopies {
  Backend& be;
  float* up(const std::vector<float>& v) const {
    auto* p = static_cast<float*>(be.alloc(v.size() * sizeof(float)));
    be.upload(p, v.data(), v.size() * sizeof(float));
    return p;
  }
  std::vector<float> down(const float* p, size_t count) const {
    std::vector<float> v(count);
    be.download(v.data(), p, count * sizeof(float));
    return v;
  }
};

// The prefill norms before BF16 GEMMs at kFast: the norm's kernel writes the GEMM's BF16
// activations itself (no conversion pass). The products are those of the BF16-rounded norm
// outputs; h and the residual stream are still written in F32. A 4-bit GEMM runs first, so the
// F16 split's activation scale sits where the BF16 GEMM's alpha must be 1 again.
TEST_F(CudaLinear, FastBf16NormedPrefillIsTheBf16Product) {
  std::unique_ptr<Backend> fast = make_cuda_backend(0, PrefillPrecision::kFast);
  Rng rng(14);
  const int64_t D = 256, R0 = 96, R1 = 40, n = 100, heads = 2, hd = 128;
  const float eps = 1e-6f;
  const HostWeight w0 = float_weight(rng, DType::BF16, R0, D, 0);
  const HostWeight w1 = float_weight(rng, DType::BF16, R1, D, 0);
  const HostWeight q4 = affine_weight(rng, 4, 64, DType::BF16, 64, D, 0);
  const Weight dw0 = fast->upload_weight(w0.w), dw1 = fast->upload_weight(w1.w);
  const Weight dq4 = fast->upload_weight(q4.w);
  const std::vector<float> norm_w = rng.normals(static_cast<size_t>(D), 0.5f);
  const FloatCopies io{*fast};
  const auto worst_rel = [](const std::vector<float>& got, const std::vector<float>& want) {
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      worst = std::max(worst, std::fabs(double{got[i]} - want[i]) / (std::fabs(want[i]) + 1e-3));
    }
    return worst;
  };
  float* dnw = io.up(norm_w);
  float* dh = io.up(std::vector<float>(static_cast<size_t>(n * D)));
  float* dout0 = io.up(std::vector<float>(static_cast<size_t>(n * R0)));
  float* dout1 = io.up(std::vector<float>(static_cast<size_t>(n * R1)));
  float* dq = io.up(std::vector<float>(static_cast<size_t>(n * 64)));
  // keep_h false: h is the caller's workspace, the products and the residual stream the same.
  for (const auto& [residual, keep_h] :
       {std::pair{false, true}, std::pair{true, true}, std::pair{true, false}}) {
    const std::vector<float> x = rng.normals(static_cast<size_t>(n * D), 3.0f),
                             y = rng.normals(x.size());
    float *dx = io.up(x), *dy = io.up(y);
    fast->linear(dx, n, dq4, dq);  // leaves the F16 split's scale in the GEMM's constants
    const Weight* ws[] = {&dw0, &dw1};
    float* outs[] = {dout0, dout1};
    fast->rmsnorm_linear_multi(dx, residual ? dy : nullptr, dnw, dh, keep_h, n, static_cast<int>(D),
                               eps, ws, outs, 2);
    std::vector<float> xs = x, h(x.size());
    if (residual) {
      cpu->add_rmsnorm(xs.data(), y.data(), norm_w.data(), h.data(), n, static_cast<int>(D), eps);
    } else {
      cpu->rmsnorm(xs.data(), norm_w.data(), h.data(), n, static_cast<int>(D), eps);
    }
    const std::string what =
        std::string(residual ? "add_rmsnorm" : "rmsnorm") + (keep_h ? "" : ", h not kept");
    if (keep_h) {
      EXPECT_LT(worst_rel(io.down(dh, h.size()), h), 1e-5) << what << ": h in F32";
    }
    EXPECT_LT(worst_rel(io.down(dx, xs.size()), xs), 1e-6) << what << ": the residual stream";
    EXPECT_LT(off_bf16_product(io.down(dout0, static_cast<size_t>(n * R0)), h, n, w0, 4e-6), 1e-5)
        << what << ": first matrix";
    EXPECT_LT(off_bf16_product(io.down(dout1, static_cast<size_t>(n * R1)), h, n, w1, 4e-6), 1e-5)
        << what << ": second matrix";
    fast->free(dx);
    fast->free(dy);
  }
  // The GDN output projection: heads of hd, gated by silu(z).
  const std::vector<float> o = rng.normals(static_cast<size_t>(n * D), 2.0f),
                           z = rng.normals(o.size());
  const std::vector<float> gnw = rng.normals(static_cast<size_t>(hd), 0.5f);
  float *d_o = io.up(o), *dz = io.up(z), *dgnw = io.up(gnw);
  fast->linear(d_o, n, dq4, dq);
  fast->rmsnorm_gated_linear(d_o, dz, dgnw, dh, n, static_cast<int>(heads), static_cast<int>(hd),
                             eps, dw0, dout0);
  std::vector<float> g(o.size());
  cpu->rmsnorm_gated(o.data(), z.data(), gnw.data(), g.data(), n * heads, static_cast<int>(hd),
                     eps);
  EXPECT_LT(worst_rel(io.down(dh, g.size()), g), 1e-5) << "rmsnorm_gated: normed in F32";
  EXPECT_LT(off_bf16_product(io.down(dout0, static_cast<size_t>(n * R0)), g, n, w0, 4e-6), 1e-5)
      << "rmsnorm_gated_linear";
  for (float* p : {dnw, dh, dout0, dout1, dq, d_o, dz, dgnw}) fast->free(p);
}

// Interval arithmetic for products of BF16-rounded values: each value as the span [lo, hi] of
// what the device may hold, so a rounding may go either way only where the value sits that close
// to a BF16 boundary.
struct Span {
  double lo = 0, hi = 0;
};
double bf16_of(double v) {
  return bf16_to_f32(f32_to_bf16(static_cast<float>(v)));
}
// The BF16 roundings of [lo, hi] widened by rel (the device's F32 arithmetic).
Span bf16_span(double lo, double hi, double rel) {
  const double a = bf16_of(lo - rel * std::fabs(lo)), b = bf16_of(hi + rel * std::fabs(hi));
  return {std::min(a, b), std::max(a, b)};
}
// Rows of x [n][K] (spans) times BF16 weights hw: each output's span, widened by F32
// accumulation's reach (2^-20 of the sum of the terms' magnitudes).
std::vector<Span> span_product(const std::vector<Span>& x, int64_t n, const HostWeight& hw) {
  const auto* wb = reinterpret_cast<const uint16_t*>(hw.data.data());
  const int64_t K = hw.w.cols, R = hw.w.rows;
  std::vector<Span> out(static_cast<size_t>(n * R));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t o = 0; o < R; ++o) {
      double mid = 0, half = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const Span& v = x[static_cast<size_t>(r * K + k)];
        const double w = bf16_to_f32(wb[o * K + k]);
        mid += w * (v.lo + v.hi) / 2;
        half += std::fabs(w) * (v.hi - v.lo) / 2;
        mag += std::fabs(w) * std::max(std::fabs(v.lo), std::fabs(v.hi));
      }
      half += mag * std::ldexp(1.0, -20);
      out[static_cast<size_t>(r * R + o)] = {mid - half, mid + half};
    }
  }
  return out;
}

// The dense MLP block at kFast with BF16 weights: the norm feeds the gate and up GEMMs in BF16,
// gate and up come out rounded to BF16, and the down GEMM takes bf16(silu(gate) * up). The
// output must be that chain's product (each rounding may go either way only where the value sits
// at a BF16 boundary within F32 accumulation's reach); with gate and up kept in F32 its worst
// output is about 2e-2 of the output's rms away (a host simulation of these shapes), far past
// the bound.
TEST_F(CudaLinear, FastBf16MlpBlockRoundsGateAndUp) {
  std::unique_ptr<Backend> fast = make_cuda_backend(0, PrefillPrecision::kFast);
  Rng rng(15);
  const int64_t D = 256, I = 96, n = 100;
  const float eps = 1e-6f;
  const HostWeight wg = float_weight(rng, DType::BF16, I, D, 0);
  const HostWeight wu = float_weight(rng, DType::BF16, I, D, 0);
  const HostWeight wd = float_weight(rng, DType::BF16, D, I, 0);
  const Weight dg = fast->upload_weight(wg.w), du = fast->upload_weight(wu.w),
               dd = fast->upload_weight(wd.w);
  const std::vector<float> norm_w = rng.normals(static_cast<size_t>(D), 0.5f);
  const FloatCopies io{*fast};
  for (bool residual : {false, true}) {
    const std::string what = residual ? "with the residual add" : "without";
    const std::vector<float> x = rng.normals(static_cast<size_t>(n * D), 3.0f),
                             y = rng.normals(x.size());
    std::vector<float*> scratch;
    for (int64_t floats : {n * D, n * I, n * I, n * I}) {
      scratch.push_back(io.up(std::vector<float>(static_cast<size_t>(floats))));
    }
    float *dx = io.up(x), *dy = io.up(y), *dnw = io.up(norm_w);
    float* dout = io.up(std::vector<float>(static_cast<size_t>(n * D)));
    MlpBlockWeights b;
    b.norm = dnw, b.eps = eps, b.gate = &dg, b.up = &du, b.down = &dd;
    const MlpBlockScratch bs{scratch[0], scratch[1], scratch[2], scratch[3]};
    fast->mlp_block(dx, residual ? dy : nullptr, n, static_cast<int>(D), b, bs, dout);

    std::vector<float> xs = x, h(x.size());
    if (residual) {
      cpu->add_rmsnorm(xs.data(), y.data(), norm_w.data(), h.data(), n, static_cast<int>(D), eps);
    } else {
      cpu->rmsnorm(xs.data(), norm_w.data(), h.data(), n, static_cast<int>(D), eps);
    }
    std::vector<Span> h16(h.size());
    for (size_t i = 0; i < h.size(); ++i) h16[i] = bf16_span(h[i], h[i], 4e-6);
    const std::vector<Span> gate = span_product(h16, n, wg), upv = span_product(h16, n, wu);
    std::vector<Span> act(gate.size());
    const auto silu = [](double v) { return v / (1 + std::exp(-v)); };
    for (size_t i = 0; i < act.size(); ++i) {
      const Span g = bf16_span(gate[i].lo, gate[i].hi, 0), u = bf16_span(upv[i].lo, upv[i].hi, 0);
      double lo = INFINITY, hi = -INFINITY;
      for (double gv : {g.lo, g.hi}) {
        for (double uv : {u.lo, u.hi}) {
          lo = std::min(lo, silu(gv) * uv), hi = std::max(hi, silu(gv) * uv);
        }
      }
      act[i] = bf16_span(lo, hi, 2e-6);
    }
    const std::vector<Span> want = span_product(act, n, wd);
    const std::vector<float> got = io.down(dout, want.size());
    double off = 0, ss = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      off = std::max({off, want[i].lo - got[i], got[i] - want[i].hi});
      ss += double{got[i]} * got[i];
    }
    EXPECT_LT(off / std::sqrt(ss / static_cast<double>(want.size())), 1e-5) << what;
    expect_close(io.down(dx, xs.size()), xs, 1e-6, what + ": the residual stream");
    for (float* p : {dx, dy, dnw, dout}) fast->free(p);
    for (float* p : scratch) fast->free(p);
  }
}

// PrefillPrecision::kFast: one pass. Its error is F16's (2^-11 relative per operand, summed
// over K terms: about 1e-3 of the output's rms) where the exact mode's is F32's (1e-6), so both
// bounds show the fast pass is the one taken; decode (n <= 16) stays exact. BF16 weights are
// multiplied as they are by BF16-rounded activations: the result equals that product to F32
// accumulation (1e-5 of the rms, where F16-rounded activations would be 1e-4 off).
TEST_F(CudaLinear, FastPrefillPrecisionIsOnePass) {
  std::unique_ptr<Backend> fast = make_cuda_backend(0, PrefillPrecision::kFast);
  Rng rng(12);
  for (DType kind : {DType::U32, DType::F32, DType::BF16}) {  // U32: 4-bit affine
    const bool quantized = kind == DType::U32;
    HostWeight hw = quantized ? affine_weight(rng, 4, 64, DType::BF16, 300, 1024, 0)
                              : float_weight(rng, kind, 300, 1024, 0);
    const Weight dw = fast->upload_weight(hw.w);
    for (int64_t n : {4, 100}) {
      std::vector<float> x = rng.normals(static_cast<size_t>(n * hw.w.cols));
      std::vector<float> want(static_cast<size_t>(n * hw.w.rows));
      cpu->linear(x.data(), n, hw.w, want.data());
      const std::vector<float> got = device_linear(*fast, x, n, dw);
      double ss = 0, worst = 0;
      for (float w : want) ss += double{w} * w;
      const double rms = std::sqrt(ss / static_cast<double>(want.size()));
      for (size_t i = 0; i < want.size(); ++i) {
        worst = std::max(worst, std::fabs(double{got[i]} - want[i]) / rms);
      }
      const std::string what = std::string(quantized            ? "q4g64"
                                           : kind == DType::F32 ? "f32"
                                                                : "bf16") +
                               " n=" + std::to_string(n);
      if (n <= 16) {
        EXPECT_LT(worst, kTol) << what << ": decode rows keep the exact kernels";
      } else {
        EXPECT_LT(worst, 1e-2) << what << ": beyond F16 rounding";
        EXPECT_GT(worst, 1e-5) << what << ": F32-accurate, so the exact GEMM ran";
      }
      if (kind == DType::BF16 && n > 16) {
        EXPECT_LT(off_bf16_product(got, x, n, hw), 1e-5)
            << what << ": the product of BF16-rounded activations";
      }
    }
  }
}

// 4-bit weights are repacked into the GEMV's tile layout at upload; pack_weight does the same to
// a weight already in device memory (dummy weights are filled there). Both must give the same
// results bit for bit, in the GEMV (n = 1, 16) and the GEMM (n = 40), for stacked experts whose
// rows are not a multiple of the 16-row tiles; other formats pass through unchanged.
TEST_F(CudaLinear, PackWeightOfDeviceDataEqualsUpload) {
  Rng rng(8);
  for (DType sd : {DType::BF16, DType::F32}) {
    HostWeight hw = affine_weight(rng, 4, 64, sd, 20, 256, 3);
    const Weight uploaded = gpu->upload_weight(hw.w);
    EXPECT_NE(uploaded.packing, 0) << "4-bit weights are repacked at upload";
    Weight raw = hw.w;  // the checkpoint layout, in device memory
    raw.data = up(hw.data);
    raw.scales = up(hw.scales);
    raw.biases = up(hw.biases);
    const Weight packed = gpu->pack_weight(raw);
    EXPECT_EQ(packed.packing, uploaded.packing);
    EXPECT_NE(packed.data, raw.data);
    for (int64_t n : {1, 16, 40}) {
      std::vector<float> x = rng.normals(static_cast<size_t>(n * 256));
      float* dx = up(x);
      const size_t outs = static_cast<size_t>(n * 20);
      float* a = poisoned(outs);
      float* b = poisoned(outs);
      gpu->linear(dx, n, uploaded, a, 2);
      gpu->linear(dx, n, packed, b, 2);
      EXPECT_EQ(down(a, outs), down(b, outs)) << dtype_name(sd) << " n=" << n;
    }
  }
  HostWeight q8 = affine_weight(rng, 8, 64, DType::BF16, 20, 256, 0);
  Weight raw = q8.w;
  raw.data = up(q8.data);
  raw.scales = up(q8.scales);
  raw.biases = up(q8.biases);
  const Weight same = gpu->pack_weight(raw);
  EXPECT_EQ(same.data, raw.data);
  EXPECT_EQ(same.packing, 0);
}

// Dummy weights are the same on every backend: the values are a function of (seed, index).
TEST_F(CudaLinear, FillRandomMatchesCpu) {
  const int64_t n = 5000;
  for (DType t : {DType::U32, DType::F32, DType::BF16}) {
    const size_t bytes = static_cast<size_t>(n) * dtype_size(t);
    std::vector<uint8_t> want(bytes);
    cpu->fill_random(want.data(), t, n, 0.7f, 42);
    auto* d = up(std::vector<uint8_t>(bytes, 0));
    gpu->fill_random(d, t, n, 0.7f, 42);
    EXPECT_EQ(down(d, bytes), want) << dtype_name(t);
  }
  std::vector<float> v(static_cast<size_t>(n));
  cpu->fill_random(v.data(), DType::F32, n, 0.7f, 42);
  double ss = 0;
  for (float x : v) ss += double{x} * x;
  EXPECT_NEAR(std::sqrt(ss / n), 0.7, 0.03) << "standard deviation";
}

// Rows of 96 values (one block of the embed kernel) and of 600 (three, the last partial).
TEST_F(CudaLinear, EmbedEveryFormat) {
  Rng rng(5);
  const std::vector<int32_t> ids = {0, 7, 3, 99, 7, 50};
  std::vector<HostWeight> tables;
  for (int64_t cols : {96, 608}) {
    tables.push_back(float_weight(rng, DType::BF16, 100, cols, 0));
    tables.push_back(float_weight(rng, DType::F32, 100, cols, 0));
    tables.push_back(float_weight(rng, DType::F16, 100, cols, 0));
    for (int bits : {2, 3, 4, 5, 6, 8})
      tables.push_back(affine_weight(rng, bits, 32, DType::F16, 100, cols, 0));
  }
  rebind(tables);
  for (const HostWeight& hw : tables) {
    const Weight dw = gpu->upload_weight(hw.w);
    const int64_t cols = hw.w.cols;
    std::vector<float> want(ids.size() * cols);
    cpu->embed(hw.w, ids.data(), static_cast<int>(ids.size()), want.data());
    float* dout = poisoned(want.size());
    gpu->embed(dw, up(ids), static_cast<int>(ids.size()), dout);
    // Dequantization is one multiply-add per element: agreement to F32 rounding.
    expect_close(down(dout, want.size()), want, 1e-6,
                 std::string("embed ") + dtype_name(hw.w.dtype) + " bits " +
                     std::to_string(hw.w.bits) + " cols " + std::to_string(cols));
  }
  // An id outside the table gives a row of NaN on the device (the model validates ids first).
  const Weight dw = gpu->upload_weight(tables.back().w);
  const std::vector<int32_t> bad = {5, 100, -1};
  const int64_t cols = tables.back().w.cols;
  float* dout = up(std::vector<float>(bad.size() * cols, 1.0f));  // finite: NaN must be written
  gpu->embed(dw, up(bad), static_cast<int>(bad.size()), dout);
  const std::vector<float> got = down(dout, bad.size() * cols);
  for (int64_t j = 0; j < cols; ++j) {
    ASSERT_FALSE(std::isnan(got[j])) << "id 5, column " << j;
    ASSERT_TRUE(std::isnan(got[cols + j]) && std::isnan(got[2 * cols + j]))
        << "ids 100 and -1, column " << j;
  }
}

}  // namespace
}  // namespace tokenmill::cudatest
