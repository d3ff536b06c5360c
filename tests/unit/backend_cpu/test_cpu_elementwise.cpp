// Normalisations and elementwise ops against double-precision formulas (1e-5 relative: one F32
// reduction of <= 300 terms and a few roundings per element).
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_simd.h"
#include "cpu_test_util.h"

namespace tokenmill {
namespace {

using test::Backends;
using test::Rng;

TEST(CpuElementwise, RmsnormPlainGatedAndL2) {
  Backends b;
  Rng rng(40);
  for (int dim : {1, 17, 256, 300}) {
    const int rows = 5;
    std::vector<float> x = rng.normals(rows * dim, 3.0f), z = rng.normals(rows * dim);
    std::vector<float> w = rng.normals(dim);
    for (CpuBackend* be : b.all()) {
      std::vector<float> out(x.size()), inplace = x, gated(x.size()), l2 = x;
      be->rmsnorm(x.data(), w.data(), out.data(), rows, dim, 1e-6f);
      be->rmsnorm(inplace.data(), w.data(), inplace.data(), rows, dim, 1e-6f);
      be->rmsnorm_gated(x.data(), z.data(), w.data(), gated.data(), rows, dim, 1e-6f);
      be->l2norm(l2.data(), rows, dim, 1e-6f, 0.25f);
      for (int r = 0; r < rows; ++r) {
        double ss = 0;
        for (int j = 0; j < dim; ++j) ss += static_cast<double>(x[r * dim + j]) * x[r * dim + j];
        const double inv = 1.0 / std::sqrt(ss / dim + 1e-6), l2f = 0.25 / std::sqrt(ss + 1e-6);
        for (int j = 0; j < dim; ++j) {
          const int i = r * dim + j;
          const double ref = x[i] * inv * w[j];
          ASSERT_NEAR(out[i], ref, 1e-5 * (1 + std::fabs(ref))) << be->isa() << " dim " << dim;
          ASSERT_EQ(inplace[i], out[i]) << "out may alias x";
          const double rg = w[j] * x[i] * inv * test::silu_d(z[i]);
          ASSERT_NEAR(gated[i], rg, 1e-5 * (1 + std::fabs(rg)));
          ASSERT_NEAR(l2[i], x[i] * l2f, 1e-5 * (1 + std::fabs(x[i] * l2f)));
        }
      }
    }
  }
}

// The fused residual add + norm is add() then rmsnorm(), bit for bit.
TEST(CpuElementwise, AddRmsnormIsAddThenRmsnorm) {
  Backends b;
  Rng rng(42);
  for (int dim : {7, 256, 768}) {
    const int rows = 3;
    std::vector<float> x = rng.normals(rows * dim, 2.0f), y = rng.normals(rows * dim);
    std::vector<float> w = rng.normals(dim);
    for (CpuBackend* be : b.all()) {
      std::vector<float> xf = x, xs = x, of(x.size()), os(x.size());
      be->add_rmsnorm(xf.data(), y.data(), w.data(), of.data(), rows, dim, 1e-6f);
      be->add(xs.data(), y.data(), rows * dim);
      be->rmsnorm(xs.data(), w.data(), os.data(), rows, dim, 1e-6f);
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_EQ(xf[i], xs[i]) << be->isa() << " dim " << dim;
        ASSERT_EQ(of[i], os[i]) << be->isa() << " dim " << dim;
      }
    }
  }
}

// The vector e^x the activations use: within 2 ulp of the exact value over the whole float
// range where the result is normal, 0 / +inf beyond it, NaN for NaN.
TEST(CpuElementwise, VectorExpIsAccurate) {
  using S = cpu::BestIsa;
  constexpr int W = S::W;
  std::vector<float> xs;
  for (double x = -87.0; x <= 88.5; x += 0.00137) xs.push_back(static_cast<float>(x));
  for (float x : {0.0f, -0.0f, 1e-30f, -1e-30f, 0.5f * 0.693147f, -0.5f * 0.693147f, 88.7f})
    xs.push_back(x);
  while (xs.size() % W) xs.push_back(0.0f);
  double worst_ulp = 0;
  for (size_t i = 0; i < xs.size(); i += W) {
    float out[W];
    S::store(out, S::exp(S::load(&xs[i])));
    for (int l = 0; l < W; ++l) {
      const double ref = std::exp(static_cast<double>(xs[i + l]));
      const double ulp = std::ldexp(1.0, std::ilogb(ref) - 23);
      worst_ulp = std::max(worst_ulp, std::fabs(out[l] - ref) / ulp);
    }
  }
  EXPECT_LE(worst_ulp, 2.0) << S::kName;
  alignas(64) float special[16] = {-120.0f, -1000.0f, 120.0f, 1000.0f, NAN};
  float out[16];
  for (int i = 0; i < 16; i += W) S::store(out + i, S::exp(S::load(special + i)));
  EXPECT_LT(out[0], 1e-37f);
  EXPECT_LT(out[1], 1e-37f);
  EXPECT_GE(out[0], 0.0f);
  EXPECT_GT(out[2], 3e38f);  // +inf with AVX-512, FLT_MAX-ish with AVX2
  EXPECT_GT(out[3], 3e38f);
  EXPECT_TRUE(std::isnan(out[4]));
}

TEST(CpuElementwise, ActivationsAndRowOps) {
  Backends b;
  Rng rng(41);
  const int64_t n = 40000;  // above the parallel grain
  std::vector<float> a = rng.normals(n, 4.0f), c = rng.normals(n, 4.0f);
  a[0] = -100.0f;  // exp overflow side of silu/sigmoid
  for (CpuBackend* be : b.all()) {
    std::vector<float> s(n), x = a, y = a;
    be->silu_mul(a.data(), c.data(), s.data(), n);
    be->add(x.data(), c.data(), n);
    be->sigmoid_mul(y.data(), c.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_NEAR(s[i], test::silu_d(a[i]) * c[i], 1e-5 * (1 + std::fabs(s[i])));
      ASSERT_EQ(x[i], a[i] + c[i]);
      ASSERT_NEAR(y[i], a[i] * test::sigmoid_d(c[i]), 1e-5 * (1 + std::fabs(y[i])));
    }
    const int rows = 7, dim = 33;
    std::vector<float> m = rng.normals(rows * dim), gate = rng.normals(rows), sr = m;
    be->scale_rows_sigmoid(sr.data(), gate.data(), rows, dim);
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < dim; ++j)
        ASSERT_NEAR(sr[r * dim + j], m[r * dim + j] * test::sigmoid_d(gate[r]), 1e-6);
    // copy_rows between strided layouts, gather_rows by index.
    std::vector<float> dst(rows * 40, -1.0f);
    be->copy_rows(m.data(), dim, dst.data(), 40, rows, 20);
    for (int r = 0; r < rows; ++r) {
      for (int j = 0; j < 20; ++j) ASSERT_EQ(dst[r * 40 + j], m[r * dim + j]);
      for (int j = 20; j < 40; ++j) ASSERT_EQ(dst[r * 40 + j], -1.0f);
    }
    const std::vector<int32_t> pick = {6, 0, 6, 3};
    std::vector<float> gathered(4 * dim);
    be->gather_rows(m.data(), dim, pick.data(), 4, gathered.data());
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < dim; ++j) ASSERT_EQ(gathered[i * dim + j], m[pick[i] * dim + j]);
  }
}

TEST(CpuElementwise, MemoryOps) {
  Backends b;
  CpuBackend& be = *b.simd;
  float* p = static_cast<float*>(be.alloc(100 * 4));
  ASSERT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  std::vector<float> src(100, 2.5f), back(100, 0.0f);
  be.upload(p, src.data(), 400);
  be.download(back.data(), p, 400);
  EXPECT_EQ(back, src);
  be.fill_zero(p, 400);
  be.download(back.data(), p, 400);
  EXPECT_EQ(back, std::vector<float>(100, 0.0f));
  be.free(p);
  Weight w;
  w.data = src.data();
  EXPECT_EQ(be.upload_weight(w).data, src.data()) << "host weights are used in place";
  EXPECT_THROW(be.alloc(size_t{1} << 62), Error);
}

// argmax_rows is std::max_element per row: lowest index among equal maxima, NaN skipped except
// at index 0 (the reference here is std::max_element itself, not util/argmax).
TEST(CpuElementwise, ArgmaxRowsIsMaxElementPerRow) {
  Backends b;
  Rng rng(41);
  for (int cols : {1, 3, 64, 1001}) {
    const int rows = 6;
    std::vector<float> x = rng.normals(static_cast<size_t>(rows) * cols);
    for (float& v : x) v = std::round(v * 2.0f);                 // many ties
    x[1 * cols] = NAN;                                           // row 1: NaN first
    if (cols > 2) x[2 * cols + 2] = NAN;                         // row 2: NaN inside
    for (int j = 0; j < cols; ++j) x[3 * cols + j] = -INFINITY;  // row 3: all -inf
    for (CpuBackend* be : b.all()) {
      std::vector<int32_t> got(rows, -1);
      be->argmax_rows(x.data(), rows, cols, got.data());
      for (int r = 0; r < rows; ++r) {
        const float* row = x.data() + static_cast<size_t>(r) * cols;
        EXPECT_EQ(got[r], std::max_element(row, row + cols) - row)
            << "cols " << cols << " row " << r;
      }
    }
  }
}

}  // namespace
}  // namespace tokenmill
