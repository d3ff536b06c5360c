// linear() and embed() against a double-precision reference, for every weight format, both
// kernel sets, the GEMV path (n <= 8) and the GEMM path (n > 8, tile edges included).
//
// Tolerance: |got - ref| <= 2e-5 * sum_k |w_k x_k| + 1e-6. F32 accumulation of K products in
// 16+ partial sums has a worst-case relative error (to the sum of magnitudes) of about
// (K/16 + log2 16) * 6e-8, i.e. <= 5e-6 for K <= 1024; the affine form s*dot(q,x) + b*sum(x)
// adds a few roundings of the same size. The bound is relative to sum |w x|, not |ref|,
// because results near zero are legitimately dominated by cancellation.
#include "cpu_test_util.h"

namespace tokenmill {
namespace {

using test::Backends;
using test::Rng;
using test::TestWeight;

void check_linear(CpuBackend& be, const TestWeight& tw, int64_t n, int expert, Rng& rng,
                  const char* what) {
  const int64_t rows = tw.w.rows, cols = tw.w.cols;
  std::vector<float> x = rng.normals(static_cast<size_t>(n * cols));
  std::vector<float> out(static_cast<size_t>(n * rows), NAN);
  be.linear(x.data(), n, tw.w, out.data(), expert);
  const double* wv = tw.values.data() + static_cast<int64_t>(expert) * rows * cols;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      double ref = 0.0, mag = 0.0;
      for (int64_t k = 0; k < cols; ++k) {
        const double p = wv[r * cols + k] * x[static_cast<size_t>(i * cols + k)];
        ref += p;
        mag += std::fabs(p);
      }
      const double got = out[static_cast<size_t>(i * rows + r)];
      ASSERT_NEAR(got, ref, 2e-5 * mag + 1e-6)
          << what << " isa=" << be.isa() << " n=" << n << " row=" << r << " i=" << i
          << " rows=" << rows << " cols=" << cols;
    }
  }
}

TEST(CpuLinear, FloatWeightsAllTypesOddSizes) {
  Backends b;
  Rng rng(1);
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    for (int64_t cols : {1, 15, 67, 256}) {
      TestWeight tw = test::make_float_weight(rng, t, 37, cols);
      for (int64_t n : {1, 2, 3, 5, 8, 9, 20}) {
        for (CpuBackend* be : b.all()) check_linear(*be, tw, n, 0, rng, dtype_name(t));
      }
    }
  }
}

TEST(CpuLinear, AffineEveryBitsAndGroupWithNegativeScales) {
  Backends b;
  Rng rng(2);
  for (int bits : {2, 3, 4, 5, 6, 8}) {
    for (int group : {32, 64, 128}) {
      TestWeight tw = test::make_affine_weight(rng, bits, group, DType::BF16, 19, 3 * group);
      int negative = 0;
      for (size_t i = 0; i < tw.scales.size() / 2; ++i) {
        negative += test::scale_value(DType::BF16, tw.scales.data(), static_cast<int64_t>(i)) < 0;
      }
      ASSERT_GT(negative, 0) << "the test weights must include negative scales";
      for (int64_t n : {1, 2, 3, 8, 9, 13}) {
        for (CpuBackend* be : b.all()) check_linear(*be, tw, n, 0, rng, "affine");
      }
    }
  }
}

TEST(CpuLinear, AffineScaleTypesAndStackedExperts) {
  Backends b;
  Rng rng(3);
  for (DType sd : {DType::F32, DType::F16, DType::BF16}) {
    for (int bits : {4, 3}) {
      TestWeight tw = test::make_affine_weight(rng, bits, 64, sd, 23, 128, /*experts=*/3);
      for (int expert : {0, 2}) {
        for (int64_t n : {1, 4, 11}) {
          for (CpuBackend* be : b.all()) check_linear(*be, tw, n, expert, rng, "affine experts");
        }
      }
    }
  }
  TestWeight tf = test::make_float_weight(rng, DType::BF16, 21, 40, /*experts=*/4);
  for (CpuBackend* be : b.all()) {
    check_linear(*be, tf, 1, 3, rng, "bf16 experts");
    check_linear(*be, tf, 12, 1, rng, "bf16 experts");
  }
}

TEST(CpuLinear, GemmTileEdgesAndManyRows) {
  Backends b;
  Rng rng(4);
  // 130 rows: two full 64-row tiles and a 2-row tail; 384 columns: three column tiles;
  // n = 70: eleven 6-row microkernel blocks and a 4-row tail.
  TestWeight ta = test::make_affine_weight(rng, 4, 64, DType::BF16, 130, 384);
  TestWeight tb = test::make_float_weight(rng, DType::BF16, 130, 300);
  for (CpuBackend* be : b.all()) {
    check_linear(*be, ta, 70, 0, rng, "gemm affine");
    check_linear(*be, tb, 70, 0, rng, "gemm bf16");
    check_linear(*be, ta, 200, 0, rng, "gemm affine n=200");
  }
}

TEST(CpuLinear, GemvAndGemmAgree) {
  // The same rows through both paths: 8 rows (GEMV) vs the first 8 of 9 (GEMM).
  Backends b;
  Rng rng(5);
  TestWeight tw = test::make_affine_weight(rng, 4, 32, DType::BF16, 45, 256);
  std::vector<float> x = rng.normals(9 * 256), o8(8 * 45), o9(9 * 45);
  for (CpuBackend* be : b.all()) {
    be->linear(x.data(), 8, tw.w, o8.data());
    be->linear(x.data(), 9, tw.w, o9.data());
    for (size_t i = 0; i < o8.size(); ++i)
      ASSERT_NEAR(o8[i], o9[i], 1e-4f * (1 + std::fabs(o9[i])));
  }
}

// linear_multi is linear() on each matrix: bit-identical outputs, for matrices of mixed formats
// and row counts (the pool's pieces then span matrix boundaries), shared and separate x
// preparations, the GEMV and the GEMM path.
TEST(CpuLinear, MultiMatchesSeparateLinears) {
  Backends b;
  Rng rng(6);
  const int64_t cols = 256;
  std::vector<TestWeight> tws;
  tws.push_back(test::make_affine_weight(rng, 4, 64, DType::BF16, 70, cols));
  tws.push_back(test::make_affine_weight(rng, 4, 64, DType::BF16, 9, cols));
  tws.push_back(test::make_affine_weight(rng, 8, 32, DType::F16, 33, cols));
  tws.push_back(test::make_float_weight(rng, DType::BF16, 5, cols));
  tws.push_back(test::make_affine_weight(rng, 4, 64, DType::BF16, 1, cols));
  for (int count : {1, 2, 5}) {
    for (int64_t n : {1, 3, 8, 12}) {
      std::vector<float> x = rng.normals(static_cast<size_t>(n * cols));
      for (CpuBackend* be : b.all()) {
        std::vector<const Weight*> ws;
        std::vector<std::vector<float>> multi, single;
        std::vector<float*> outs;
        for (int i = 0; i < count; ++i) {
          ws.push_back(&tws[i].w);
          multi.emplace_back(static_cast<size_t>(n * tws[i].w.rows), NAN);
          single.emplace_back(static_cast<size_t>(n * tws[i].w.rows), NAN);
        }
        for (auto& m : multi) outs.push_back(m.data());
        be->linear_multi(x.data(), n, ws.data(), outs.data(), count);
        for (int i = 0; i < count; ++i) be->linear(x.data(), n, tws[i].w, single[i].data());
        for (int i = 0; i < count; ++i) {
          for (size_t k = 0; k < multi[i].size(); ++k) {
            ASSERT_EQ(multi[i][k], single[i][k]) << be->isa() << " count " << count << " n " << n
                                                 << " matrix " << i << " element " << k;
          }
        }
      }
    }
  }
}

TEST(CpuLinear, EmbedDequantizesRows) {
  Backends b;
  Rng rng(6);
  TestWeight ta = test::make_affine_weight(rng, 6, 32, DType::BF16, 50, 96);
  TestWeight tb = test::make_float_weight(rng, DType::BF16, 50, 33);
  const std::vector<int32_t> ids = {0, 49, 7, 7, 23};
  for (CpuBackend* be : b.all()) {
    for (const TestWeight* tw : {&ta, &tb}) {
      const int64_t cols = tw->w.cols;
      std::vector<float> out(ids.size() * static_cast<size_t>(cols));
      be->embed(tw->w, ids.data(), static_cast<int>(ids.size()), out.data());
      for (size_t i = 0; i < ids.size(); ++i) {
        for (int64_t j = 0; j < cols; ++j) {
          const double ref = tw->values[static_cast<size_t>(ids[i] * cols + j)];
          ASSERT_NEAR(out[i * static_cast<size_t>(cols) + j], ref, 1e-6 * (1 + std::fabs(ref)));
        }
      }
    }
    const int32_t bad = 50;
    std::vector<float> out(96);
    EXPECT_THROW(be->embed(ta.w, &bad, 1, out.data()), Error);
  }
}

TEST(CpuLinear, RejectsBadWeights) {
  Backends b;
  Rng rng(7);
  TestWeight tw = test::make_affine_weight(rng, 4, 64, DType::BF16, 4, 128);
  tw.w.group = 48;
  std::vector<float> x(128), out(4);
  EXPECT_THROW(b.simd->linear(x.data(), 1, tw.w, out.data()), Error);
  tw.w.group = 64;
  EXPECT_THROW(b.simd->linear(x.data(), 1, tw.w, out.data(), /*expert=*/1), Error);
}

}  // namespace
}  // namespace tokenmill
