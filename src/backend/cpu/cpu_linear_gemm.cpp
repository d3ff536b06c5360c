// Cache-blocked GEMM for many activation rows (prefill). A tile of W (kGemmTileRows rows x
// kGemmTileCols columns) is dequantized once into per-thread F32 scratch, stored k-major
// (wt[k][r]) so the microkernel is an outer product: MR activation rows x NR = 2 vector widths
// of W rows, MR*2 vector accumulators, one broadcast of x and two vector loads of W per k.
// The tile (32 KiB) stays in L1/L2 while every activation row of the block streams past it.
#include <algorithm>
#include <cstring>

#include "backend/cpu/cpu_linear.h"
#include "backend/cpu/cpu_simd.h"
#include "util/error.h"

namespace tokenmill::cpu {
namespace {

constexpr int kMR = 6;

template <class S, int MR>
void micro(const float* x, int64_t ldx, const float* wt, int64_t kl, float* out, int64_t ldo,
           int64_t nc) {
  using V = typename S::V;
  constexpr int W = S::W, NR = 2 * W;
  V acc[MR][2];
  TM_UNROLL
  for (int m = 0; m < MR; ++m) acc[m][0] = S::zero(), acc[m][1] = S::zero();
  for (int64_t k = 0; k < kl; ++k) {
    const V w0 = S::load(wt + k * kGemmTileRows), w1 = S::load(wt + k * kGemmTileRows + W);
    TM_UNROLL
    for (int m = 0; m < MR; ++m) {
      const V xb = S::set1(x[m * ldx + k]);
      acc[m][0] = S::fma(xb, w0, acc[m][0]);
      acc[m][1] = S::fma(xb, w1, acc[m][1]);
    }
  }
  if (nc == NR) {
    TM_UNROLL
    for (int m = 0; m < MR; ++m) {
      float* o = out + m * ldo;
      S::store(o, S::add(S::load(o), acc[m][0]));
      S::store(o + W, S::add(S::load(o + W), acc[m][1]));
    }
    return;
  }
  alignas(64) float t[NR];
  TM_UNROLL
  for (int m = 0; m < MR; ++m) {
    S::store(t, acc[m][0]);
    S::store(t + W, acc[m][1]);
    for (int64_t c = 0; c < nc; ++c) out[m * ldo + c] += t[c];
  }
}

template <class S>
void micro_dispatch(int mr, const float* x, int64_t ldx, const float* wt, int64_t kl, float* out,
                    int64_t ldo, int64_t nc) {
  switch (mr) {
    case 6:
      return micro<S, 6>(x, ldx, wt, kl, out, ldo, nc);
    case 5:
      return micro<S, 5>(x, ldx, wt, kl, out, ldo, nc);
    case 4:
      return micro<S, 4>(x, ldx, wt, kl, out, ldo, nc);
    case 3:
      return micro<S, 3>(x, ldx, wt, kl, out, ldo, nc);
    case 2:
      return micro<S, 2>(x, ldx, wt, kl, out, ldo, nc);
    default:
      return micro<S, 1>(x, ldx, wt, kl, out, ldo, nc);
  }
}

template <class S>
void tile(const MatView& m, const float* x, int64_t ldx, int64_t i0, int64_t i1, float* out,
          int64_t ldo, int64_t r0, int64_t r1, float* scratch) {
  constexpr int64_t NR = 2 * S::W;
  const int64_t nr = r1 - r0;
  float* wt = scratch;                                   // [kGemmTileCols][kGemmTileRows]
  float* row = scratch + kGemmTileCols * kGemmTileRows;  // [kGemmTileCols]
  for (int64_t i = i0; i < i1; ++i) std::fill(out + i * ldo + r0, out + i * ldo + r1, 0.0f);
  for (int64_t k0 = 0; k0 < m.cols; k0 += kGemmTileCols) {
    const int64_t kl = std::min(kGemmTileCols, m.cols - k0);
    for (int64_t rr = 0; rr < kGemmTileRows; ++rr) {
      if (rr < nr) {
        dequantize_segment(m, r0 + rr, k0, kl, row);
        for (int64_t k = 0; k < kl; ++k) wt[k * kGemmTileRows + rr] = row[k];
      } else {
        for (int64_t k = 0; k < kl; ++k) wt[k * kGemmTileRows + rr] = 0.0f;
      }
    }
    for (int64_t i = i0; i < i1; i += kMR) {
      const int mr = static_cast<int>(std::min<int64_t>(kMR, i1 - i));
      for (int64_t c = 0; c < nr; c += NR) {
        micro_dispatch<S>(mr, x + i * ldx + k0, ldx, wt + c, kl, out + i * ldo + r0 + c, ldo,
                          std::min(NR, nr - c));
      }
    }
  }
}

}  // namespace

size_t gemm_scratch_floats() {
  return static_cast<size_t>(kGemmTileCols * kGemmTileRows + kGemmTileCols);
}

void gemm_tile(bool scalar, const MatView& m, const float* x, int64_t ldx, int64_t i0, int64_t i1,
               float* out, int64_t ldo, int64_t r0, int64_t r1, float* scratch) {
  TM_CHECK(r1 - r0 <= kGemmTileRows, "gemm tile of {} rows", r1 - r0);
  if (scalar) return tile<ScalarIsa>(m, x, ldx, i0, i1, out, ldo, r0, r1, scratch);
  tile<BestIsa>(m, x, ldx, i0, i1, out, ldo, r0, r1, scratch);
}

}  // namespace tokenmill::cpu
