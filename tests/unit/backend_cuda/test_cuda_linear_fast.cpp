// BatchPrecision::kFast: on Hopper (sm_90) the 4-bit GEMV of 17-64 rows multiplies the weights
// dequantized to F16 (digit * scale + bias with the scale and bias rounded to F16, the sum
// rounded once) by the activations rounded to F16, accumulating in F32. Its result is that
// product to F32 accumulation (below 5e-5 of the output's rms), where the exact product is
// about 1e-3 away (F16 rounding of both operands over K terms): both bounds together show the
// fast pass is the one that ran. 16 rows and fewer keep the exact kernels, and so does every
// row count on other GPUs (the fast pass is Hopper's wgmma kernel).
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "cuda_test_util.h"
#include "tensor/affine.h"
#include "tensor/dtype.h"

namespace tokenmill::cudatest {
namespace {

// v rounded to the nearest F16 (ties to even) once, as the kernel's F16 FMA rounds: rounding
// through F32 first could round twice.
double f16_nearest(double v) {
  const uint16_t h = f32_to_f16(static_cast<float>(v));
  uint16_t best = h;
  for (const uint16_t c : {static_cast<uint16_t>(h - 1), static_cast<uint16_t>(h + 1)}) {
    const double cv = f16_to_f32(c), bv = f16_to_f32(best);
    if (!std::isfinite(cv)) continue;
    const double dc = std::fabs(v - cv), db = std::fabs(v - bv);
    if (dc < db || (dc == db && (c & 1) == 0)) best = c;
  }
  return f16_to_f32(best);
}

// out[r * rows + o] = sum_k w16[o][k] * x16[r][k], in double.
std::vector<double> f16_product(const HostWeight& hw, const std::vector<float>& x, int64_t n) {
  const Weight& w = hw.w;
  const int64_t groups = w.cols / w.group, words = w.cols * w.bits / 32;
  std::vector<double> w16(static_cast<size_t>(w.rows * w.cols));
  const auto f16 = [](double v) { return f16_nearest(v); };
  for (int64_t o = 0; o < w.rows; ++o) {
    const auto* row = reinterpret_cast<const uint32_t*>(hw.data.data()) + o * words;
    for (int64_t k = 0; k < w.cols; ++k) {
      const int64_t g = o * groups + k / w.group;
      const double s = f16(affine::load_scale(w.scale_dtype, hw.scales.data(), g));
      const double b = f16(affine::load_scale(w.scale_dtype, hw.biases.data(), g));
      w16[static_cast<size_t>(o * w.cols + k)] = f16(affine::get(row, k, w.bits) * s + b);
    }
  }
  std::vector<double> out(static_cast<size_t>(n * w.rows));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t o = 0; o < w.rows; ++o) {
      double acc = 0;
      for (int64_t k = 0; k < w.cols; ++k) {
        acc +=
            w16[static_cast<size_t>(o * w.cols + k)] * f16(x[static_cast<size_t>(r * w.cols + k)]);
      }
      out[static_cast<size_t>(r * w.rows + o)] = acc;
    }
  }
  return out;
}

// The largest |a - b| over the rms of b.
template <class A, class B>
double off_by_rms(const std::vector<A>& a, const std::vector<B>& b) {
  double ss = 0, worst = 0;
  for (const B v : b) ss += double{v} * double{v};
  const double rms = std::sqrt(ss / static_cast<double>(b.size()));
  for (size_t i = 0; i < b.size(); ++i) {
    worst = std::max(worst, std::fabs(double{a[i]} - double{b[i]}));
  }
  return worst / rms;
}

class CudaLinearFast : public CudaVsCpu {};

TEST_F(CudaLinearFast, BatchPrecisionFastIsTheF16Product) {
  std::unique_ptr<Backend> fast =
      make_cuda_backend(0, PrefillPrecision::kExact, true, BatchPrecision::kFast);
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  const bool hopper = prop.major == 9 && prop.minor == 0;
  Rng rng(21);
  // 400 rows: three block tiles, the last one partial; 1088 columns at groups of 64 (17 groups:
  // the register-fed kernel's rounds of 4 groups leave a last round of one real group and three
  // padded ones) and 1024 at groups of 128 (8 groups: the shared-memory kernel, lockstep),
  // split across blocks. Rows 17-32 and 33-64 are the two kernel widths.
  for (int group : {64, 128}) {
    for (DType sd : {DType::BF16, DType::F16, DType::F32}) {
      const HostWeight hw = affine_weight(rng, 4, group, sd, 400, group == 64 ? 1088 : 1024, 0);
      const Weight dw = fast->upload_weight(hw.w);
      for (int64_t n : {16, 17, 40, 64}) {
        const std::vector<float> x = rng.normals(static_cast<size_t>(n * hw.w.cols));
        std::vector<float> exact(static_cast<size_t>(n * hw.w.rows));
        cpu->linear(x.data(), n, hw.w, exact.data());
        const std::vector<float> got = device_linear(*fast, x, n, dw);
        const std::string what = "group " + std::to_string(group) + " scales " + dtype_name(sd) +
                                 " n=" + std::to_string(n);
        const double off_exact = off_by_rms(got, exact);
        if (n <= 16 || !hopper) {
          EXPECT_LT(off_exact, 1e-4) << what << ": the exact kernels";
          continue;
        }
        EXPECT_LT(off_by_rms(got, f16_product(hw, x, n)), 5e-5)
            << what << ": the product of the F16 weights and activations";
        EXPECT_GT(off_exact, 1e-4) << what << ": F32-accurate, so the exact kernel ran";
        EXPECT_LT(off_exact, 1e-2) << what << ": beyond F16 rounding";
      }
    }
  }
}

}  // namespace
}  // namespace tokenmill::cudatest
