// Elementwise, normalisation, rope, GDN gates and the MoE router: CUDA against the CPU
// backend. Tolerance 1e-5 relative: single F32 operations and row sums of <= 1000 terms in a
// different order (expf/sinf may differ from glibc's by an ulp or two).
#include <algorithm>
#include <cmath>

#include "cuda_test_util.h"

namespace tokenmill::cudatest {
namespace {

constexpr double kTol = 1e-5;

class CudaOps : public CudaVsCpu {};

// Widths of the vectorized row kernels (dim % 4 == 0, up to 16384: 5120 is the 27B model's)
// and of the scalar fallback (17, 16388).
// The greedy pick per row on the device equals the CPU's (std::max_element's choice): rows of the
// 248,320-token vocabulary (split over blocks), widths off the 16-byte path, ties across threads
// and blocks, NaN first and inside, all -inf, and -0 against +0.
TEST_F(CudaOps, ArgmaxRowsMatchesCpu) {
  Rng rng(12);
  for (int cols : {1, 5, 4096, 248320, 248321}) {
    const int rows = 7;
    std::vector<float> x = rng.normals(static_cast<size_t>(rows) * cols);
    for (float& v : x) v = std::round(v * 3.0f);  // ties everywhere
    const auto at = [&](int r, int j) -> float& { return x[static_cast<size_t>(r) * cols + j]; };
    at(1, 0) = NAN;
    if (cols > 3) at(2, cols / 2) = NAN;
    for (int j = 0; j < cols; ++j) at(3, j) = -INFINITY;
    for (int j = 0; j < cols; ++j) at(4, j) = j % 3 == 0 ? -0.0f : -1.0f;
    if (cols > 7) at(4, 7) = 0.0f;  // +0 after -0 at index 0: index 0 wins
    std::vector<int32_t> want(rows);
    cpu->argmax_rows(x.data(), rows, cols, want.data());
    // Twice: a row split over several blocks leaves its ticket counter at zero for the next call.
    const float* dx = up(x);
    for (int call = 0; call < 2; ++call) {
      int32_t* d = up(std::vector<int32_t>(rows, -1));
      gpu->argmax_rows(dx, rows, cols, d);
      EXPECT_EQ(down(d, rows), want) << "cols " << cols << " call " << call;
    }
  }
}

TEST_F(CudaOps, Norms) {
  Rng rng(11);
  for (int dim : {16, 17, 128, 256, 512, 1000, 5120, 16388}) {
    const int64_t rows = dim > 5000 ? 3 : 37;
    const size_t n = static_cast<size_t>(rows * dim);
    std::vector<float> x = rng.normals(n, 2.0f), z = rng.normals(n), w = rng.normals(dim);
    const std::string d = " dim=" + std::to_string(dim);
    {
      std::vector<float> want(n);
      cpu->rmsnorm(x.data(), w.data(), want.data(), rows, dim, 1e-6f);
      float* o = poisoned(n);
      gpu->rmsnorm(up(x), up(w), o, rows, dim, 1e-6f);
      expect_close(down(o, n), want, kTol, "rmsnorm" + d);
      // In place (out aliases x).
      float* dx = up(x);
      gpu->rmsnorm(dx, up(w), dx, rows, dim, 1e-6f);
      expect_close(down(dx, n), want, kTol, "rmsnorm in place" + d);
    }
    {
      std::vector<float> sum = x, want(n);
      for (size_t i = 0; i < n; ++i) sum[i] += z[i];
      cpu->rmsnorm(sum.data(), w.data(), want.data(), rows, dim, 1e-6f);
      float* dx = up(x);
      float* o = poisoned(n);
      gpu->add_rmsnorm(dx, up(z), up(w), o, rows, dim, 1e-6f);
      expect_close(down(dx, n), sum, kTol, "add_rmsnorm residual" + d);
      expect_close(down(o, n), want, kTol, "add_rmsnorm" + d);
    }
    {
      std::vector<float> want(n);
      cpu->rmsnorm_gated(x.data(), z.data(), w.data(), want.data(), rows, dim, 1e-6f);
      float* o = poisoned(n);
      gpu->rmsnorm_gated(up(x), up(z), up(w), o, rows, dim, 1e-6f);
      expect_close(down(o, n), want, kTol, "rmsnorm_gated" + d);
    }
    {
      std::vector<float> want = x;
      cpu->l2norm(want.data(), rows, dim, 1e-6f, 0.3f);
      float* dx = up(x);
      gpu->l2norm(dx, rows, dim, 1e-6f, 0.3f);
      expect_close(down(dx, n), want, kTol, "l2norm" + d);
    }
  }
}

TEST_F(CudaOps, RowCopies) {
  Rng rng(12);
  const int64_t rows = 23, src_stride = 50, dst_stride = 31, cols = 29;
  std::vector<float> src = rng.normals(static_cast<size_t>(rows * src_stride));
  std::vector<float> dst0 = rng.normals(static_cast<size_t>(rows * dst_stride));
  std::vector<float> want = dst0;
  cpu->copy_rows(src.data(), src_stride, want.data(), dst_stride, rows, cols);
  float* d = up(dst0);
  gpu->copy_rows(up(src), src_stride, d, dst_stride, rows, cols);
  EXPECT_EQ(down(d, want.size()), want) << "copy_rows (and the gaps untouched)";

  const std::vector<int32_t> idx = {5, 0, 22, 5, 7};
  const int dim = 50;
  std::vector<float> g(idx.size() * dim);
  cpu->gather_rows(src.data(), dim, idx.data(), static_cast<int>(idx.size()), g.data());
  float* dg = poisoned(g.size());
  gpu->gather_rows(up(src), dim, up(idx), static_cast<int>(idx.size()), dg);
  EXPECT_EQ(down(dg, g.size()), g) << "gather_rows";
}

TEST_F(CudaOps, PointwiseOps) {
  Rng rng(13);
  for (int64_t n : {1, 1000, 300001}) {
    std::vector<float> x = rng.normals(static_cast<size_t>(n), 3.0f);
    std::vector<float> y = rng.normals(static_cast<size_t>(n), 3.0f);
    const std::string d = " n=" + std::to_string(n);
    std::vector<float> want = x;
    cpu->add(want.data(), y.data(), n);
    float* dx = up(x);
    gpu->add(dx, up(y), n);
    expect_close(down(dx, x.size()), want, 0.0, "add" + d);

    std::vector<float> sm(x.size());
    cpu->silu_mul(x.data(), y.data(), sm.data(), n);
    float* o = poisoned(x.size());
    gpu->silu_mul(up(x), up(y), o, n);
    expect_close(down(o, x.size()), sm, kTol, "silu_mul" + d);

    want = x;
    cpu->sigmoid_mul(want.data(), y.data(), n);
    dx = up(x);
    gpu->sigmoid_mul(dx, up(y), n);
    expect_close(down(dx, x.size()), want, kTol, "sigmoid_mul" + d);
  }
  const int64_t rows = 9;
  const int dim = 70;
  std::vector<float> x = rng.normals(static_cast<size_t>(rows * dim)),
                     gate = rng.normals(rows, 2.0f);
  std::vector<float> want = x;
  cpu->scale_rows_sigmoid(want.data(), gate.data(), rows, dim);
  float* dx = up(x);
  gpu->scale_rows_sigmoid(dx, up(gate), rows, dim);
  expect_close(down(dx, x.size()), want, kTol, "scale_rows_sigmoid");
}

TEST_F(CudaOps, GdnGates) {
  Rng rng(14);
  const int64_t n = 41;
  const int heads = 12;
  std::vector<float> a = rng.normals(static_cast<size_t>(n * heads), 8.0f);  // crosses 20
  std::vector<float> b = rng.normals(a.size(), 3.0f), alog = rng.normals(heads),
                     dt = rng.normals(heads);
  std::vector<float> g(a.size()), beta(a.size());
  cpu->gdn_gates(a.data(), b.data(), alog.data(), dt.data(), g.data(), beta.data(), n, heads);
  float* dg = poisoned(a.size());
  float* db = poisoned(a.size());
  gpu->gdn_gates(up(a), up(b), up(alog), up(dt), dg, db, n, heads);
  expect_close(down(dg, g.size()), g, kTol, "gdn_gates g");
  expect_close(down(db, beta.size()), beta, kTol, "gdn_gates beta");
}

TEST_F(CudaOps, RopePartialAndFull) {
  Rng rng(15);
  struct Case {
    int heads, D, rd;
    int64_t stride;
  };
  const std::vector<int32_t> pos = {0, 1, 7, 63, 4095, 131000, 30};
  for (Case c : {Case{3, 40, 16, 3 * 40 + 8}, Case{4, 128, 64, 4 * 128}, Case{2, 256, 256, 512}}) {
    const int n = static_cast<int>(pos.size());
    std::vector<float> x = rng.normals(static_cast<size_t>(n * c.stride));
    std::vector<float> want = x;
    cpu->rope(want.data(), pos.data(), n, c.heads, c.D, c.stride, c.rd, 1e7f);
    float* dx = up(x);
    gpu->rope(dx, up(pos), n, c.heads, c.D, c.stride, c.rd, 1e7f);
    // Angles up to 1.3e5 rad: the same F32 angle, sin/cos within a few ulps of glibc's.
    expect_close(down(dx, x.size()), want, 1e-5, "rope D=" + std::to_string(c.D));
  }
}

TEST_F(CudaOps, TopkSoftmax) {
  Rng rng(16);
  // Up to 256 experts the logits sit in registers, beyond in shared memory; up to 32 picks the
  // lanes hold them (40 take the other path). Tied logits (rounded to halves, and a row of one
  // value) must pick the lower index, as the CPU does.
  for (int experts : {8, 64, 100, 256, 300}) {
    for (int k : {std::min(8, experts / 2), experts >= 256 ? 40 : 1}) {
      for (bool ties : {false, true}) {
        for (bool renorm : {true, false}) {
          const int64_t n = 33;
          std::vector<float> logits = rng.normals(static_cast<size_t>(n * experts), 2.0f);
          if (ties) {
            for (float& v : logits) v = std::round(2.0f * v) / 2.0f;
            for (int e = 0; e < experts; ++e) logits[static_cast<size_t>(e)] = 0.25f;
          }
          std::vector<int32_t> ids(static_cast<size_t>(n * k));
          std::vector<float> w(ids.size());
          cpu->topk_softmax(logits.data(), n, experts, k, renorm, ids.data(), w.data());
          int32_t* di = up(std::vector<int32_t>(ids.size(), -7));
          float* dw = poisoned(w.size());
          gpu->topk_softmax(up(logits), n, experts, k, renorm, di, dw);
          const std::string what = "experts " + std::to_string(experts) + " k " +
                                   std::to_string(k) + (ties ? " tied" : "");
          EXPECT_EQ(down(di, ids.size()), ids) << what;
          expect_close(down(dw, w.size()), w, kTol, "topk weights " + what);
        }
      }
    }
  }
}

}  // namespace
}  // namespace tokenmill::cudatest
