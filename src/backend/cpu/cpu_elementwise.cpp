// Elementwise and normalisation ops. Sums of squares accumulate in F32 with several vector
// accumulators (as the reference implementations do in F32).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_simd.h"
#include "util/argmax.h"
#include "util/error.h"

namespace tokenmill {
namespace {
// Elements per parallel chunk: below this a pool round trip costs more than the work.
constexpr int64_t kGrain = 16384;
int64_t row_grain(int64_t dim) {
  return std::max<int64_t>(1, kGrain / std::max<int64_t>(1, dim));
}
}  // namespace

void CpuBackend::rmsnorm(const float* x, const float* w, float* out, int64_t rows, int dim,
                         float eps) {
  cpu::with_isa(options_.scalar_kernels, [&](auto isa) {
    using S = decltype(isa);
    pool_.run(
        rows,
        [&](int64_t b, int64_t e, int) {
          for (int64_t r = b; r < e; ++r) {
            const float* xr = x + r * dim;
            float* o = out + r * dim;
            const float inv = 1.0f / std::sqrt(cpu::dot<S>(xr, xr, dim) / dim + eps);
            for (int j = 0; j < dim; ++j) o[j] = xr[j] * inv * w[j];
          }
        },
        row_grain(dim));
  });
}

void CpuBackend::rmsnorm_gated(const float* o, const float* z, const float* w, float* out,
                               int64_t rows, int dim, float eps) {
  cpu::with_isa(options_.scalar_kernels, [&](auto isa) {
    using S = decltype(isa);
    constexpr int W = S::W;
    pool_.run(
        rows,
        [&](int64_t b, int64_t e, int) {
          for (int64_t r = b; r < e; ++r) {
            const float* orow = o + r * dim;
            const float* zr = z + r * dim;
            float* y = out + r * dim;
            const float inv = 1.0f / std::sqrt(cpu::dot<S>(orow, orow, dim) / dim + eps);
            const typename S::V vinv = S::set1(inv);
            int j = 0;
            for (; j + W <= dim; j += W) {
              S::store(y + j, S::mul(S::mul(S::load(w + j), S::mul(S::load(orow + j), vinv)),
                                     cpu::silu_v<S>(S::load(zr + j))));
            }
            for (; j < dim; ++j) y[j] = w[j] * (orow[j] * inv) * cpu::silu(zr[j]);
          }
        },
        row_grain(dim));
  });
}

void CpuBackend::add_rmsnorm(float* x, const float* y, const float* w, float* out, int64_t rows,
                             int dim, float eps) {
  TM_CHECK(out != x && out != y, "add_rmsnorm: out must not alias x or y");
  cpu::with_isa(options_.scalar_kernels, [&](auto isa) {
    using S = decltype(isa);
    pool_.run(
        rows,
        [&](int64_t b, int64_t e, int) {
          for (int64_t r = b; r < e; ++r) {
            float* xr = x + r * dim;
            const float* yr = y + r * dim;
            float* o = out + r * dim;
            for (int j = 0; j < dim; ++j) xr[j] += yr[j];
            // The same arithmetic as add() then rmsnorm().
            const float inv = 1.0f / std::sqrt(cpu::dot<S>(xr, xr, dim) / dim + eps);
            for (int j = 0; j < dim; ++j) o[j] = xr[j] * inv * w[j];
          }
        },
        row_grain(dim));
  });
}

void CpuBackend::l2norm(float* x, int64_t rows, int dim, float eps, float scale) {
  cpu::with_isa(options_.scalar_kernels, [&](auto isa) {
    using S = decltype(isa);
    pool_.run(
        rows,
        [&](int64_t b, int64_t e, int) {
          for (int64_t r = b; r < e; ++r) {
            float* xr = x + r * dim;
            const float f = scale / std::sqrt(cpu::dot<S>(xr, xr, dim) + eps);
            for (int j = 0; j < dim; ++j) xr[j] *= f;
          }
        },
        row_grain(dim));
  });
}

void CpuBackend::copy_rows(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                           int64_t rows, int64_t cols) {
  pool_.run(
      rows,
      [&](int64_t b, int64_t e, int) {
        for (int64_t r = b; r < e; ++r) {
          std::memcpy(dst + r * dst_stride, src + r * src_stride, static_cast<size_t>(cols) * 4);
        }
      },
      row_grain(cols));
}

void CpuBackend::gather_rows(const float* x, int dim, const int32_t* rows, int n, float* out) {
  pool_.run(
      n,
      [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) {
          std::memcpy(out + i * dim, x + static_cast<int64_t>(rows[i]) * dim,
                      static_cast<size_t>(dim) * 4);
        }
      },
      row_grain(dim));
}

void CpuBackend::add(float* x, const float* y, int64_t n) {
  pool_.run(
      n,
      [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) x[i] += y[i];
      },
      kGrain);
}

void CpuBackend::silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  cpu::with_isa(options_.scalar_kernels, [&](auto isa) {
    using S = decltype(isa);
    pool_.run(
        n,
        [&](int64_t b, int64_t e, int) {
          int64_t i = b;
          for (; i + S::W <= e; i += S::W)
            S::store(out + i, S::mul(cpu::silu_v<S>(S::load(gate + i)), S::load(up + i)));
          for (; i < e; ++i) out[i] = cpu::silu(gate[i]) * up[i];
        },
        kGrain);
  });
}

void CpuBackend::sigmoid_mul(float* x, const float* gate, int64_t n) {
  cpu::with_isa(options_.scalar_kernels, [&](auto isa) {
    using S = decltype(isa);
    pool_.run(
        n,
        [&](int64_t b, int64_t e, int) {
          int64_t i = b;
          for (; i + S::W <= e; i += S::W)
            S::store(x + i, S::mul(S::load(x + i), cpu::sigmoid_v<S>(S::load(gate + i))));
          for (; i < e; ++i) x[i] *= cpu::sigmoid(gate[i]);
        },
        kGrain);
  });
}

void CpuBackend::scale_rows_sigmoid(float* x, const float* gate, int64_t rows, int dim) {
  pool_.run(
      rows,
      [&](int64_t b, int64_t e, int) {
        for (int64_t r = b; r < e; ++r) {
          const float s = cpu::sigmoid(gate[r]);
          for (int j = 0; j < dim; ++j) x[r * dim + j] *= s;
        }
      },
      row_grain(dim));
}

void CpuBackend::argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* out) {
  TM_CHECK(cols >= 1 && cols <= INT32_MAX, "argmax_rows: rows of 1..2^31-1 values");
  for (int64_t r = 0; r < rows; ++r) out[r] = argmax(x + r * cols, static_cast<int>(cols));
}

// Rows in parallel, each thread with its own scratch: a sampled 248k row costs about 0.3 ms.
void CpuBackend::pick_tokens(const float* x, int64_t rows, int64_t cols, const TokenPick* picks,
                             int32_t* out) {
  TM_CHECK(cols >= 1 && cols <= INT32_MAX, "pick_tokens: rows of 1..2^31-1 values");
  std::vector<PickScratch> scratch(static_cast<size_t>(pool_.size()));
  pool_.run(rows, [&](int64_t rb, int64_t re, int worker) {
    for (int64_t r = rb; r < re; ++r) {
      out[r] = pick_token(x + r * cols, static_cast<int>(cols), picks[r],
                          &scratch[static_cast<size_t>(worker)]);
    }
  });
}

void CpuBackend::penalize_rows(float* x, int64_t n_rows, int64_t cols, const PenaltyRow* rows,
                               const PenaltyEntry* entries, int64_t n_entries,
                               const int32_t* tokens) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const PenaltyRow& pr = rows[r];
    TM_CHECK(pr.first >= 0 && pr.count >= 0 && pr.first + int64_t{pr.count} <= n_entries,
             "penalize_rows: row {} names entries {}..{} of {}", r, pr.first,
             pr.first + int64_t{pr.count}, n_entries);
    float* row = x + r * cols;
    const int32_t pending = pr.pending_at >= 0 ? tokens[pr.pending_at] : -1;
    bool pending_seen = false;
    for (int32_t i = pr.first; i < pr.first + pr.count; ++i) {
      const PenaltyEntry& e = entries[i];
      if (e.token < 0 || e.token >= cols) continue;
      const bool is_pending = e.token == pending;
      pending_seen |= is_pending;
      row[e.token] = penalized_logit(row[e.token], pr.penalties, e.output_count + is_pending);
    }
    if (!pending_seen && pending >= 0 && pending < cols) {
      row[pending] = penalized_logit(row[pending], pr.penalties, 1);
    }
  }
}

bool CpuBackend::can_pick(const TokenPick& pick, int64_t cols) const {
  (void)pick;
  (void)cols;
  return true;
}

void CpuBackend::gdn_gates(const float* a, const float* b, const float* a_log, const float* dt_bias,
                           float* g, float* beta, int64_t n, int heads) {
  pool_.run(
      n,
      [&](int64_t rb, int64_t re, int) {
        for (int64_t r = rb; r < re; ++r) {
          for (int h = 0; h < heads; ++h) {
            const int64_t i = r * heads + h;
            const float u = a[i] + dt_bias[h];
            // softplus with torch's threshold: linear above 20 (exp would only round to u).
            const float sp = u > 20.0f ? u : std::log1p(std::exp(u));
            g[i] = -std::exp(a_log[h]) * sp;
            beta[i] = cpu::sigmoid(b[i]);
          }
        }
      },
      row_grain(heads));
}

}  // namespace tokenmill
