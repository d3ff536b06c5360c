// Mixture of experts: router top-k and the expert FFNs. Token slots are grouped by expert so
// each used expert's gate/up/down weights are read once per call, and all experts' row ranges
// go to the pool as one work list per phase (a pool round trip per expert would cost as much
// as a small expert's GEMV at decode).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_linear.h"
#include "backend/cpu/cpu_simd.h"
#include "util/error.h"

namespace tokenmill {
namespace {
// Weight rows per GEMV task: small enough to balance, large enough to amortise dispatch.
constexpr int64_t kGemvTaskRows = 32;
}  // namespace

void CpuBackend::topk_softmax(const float* logits, int64_t n, int experts, int k, bool renormalize,
                              int32_t* ids, float* weights) {
  TM_CHECK(k >= 1 && k <= experts, "top-{} of {} experts", k, experts);
  reserve_thread_scratch(static_cast<size_t>(experts));
  pool_.run(
      n,
      [&](int64_t b, int64_t e, int worker) {
        float* p = thread_scratch(worker);
        for (int64_t r = b; r < e; ++r) {
          const float* l = logits + r * experts;
          float m = l[0];
          for (int x = 1; x < experts; ++x) m = std::max(m, l[x]);
          float sum = 0.0f;
          for (int x = 0; x < experts; ++x) sum += (p[x] = std::exp(l[x] - m));
          for (int x = 0; x < experts; ++x) p[x] /= sum;
          // k selection passes: highest probability first, lower index on ties.
          float picked = 0.0f;
          for (int j = 0; j < k; ++j) {
            int best = -1;
            for (int x = 0; x < experts; ++x) {
              if (p[x] >= 0.0f && (best < 0 || p[x] > p[best])) best = x;
            }
            ids[r * k + j] = best;
            weights[r * k + j] = p[best];
            picked += p[best];
            p[best] = -1.0f;  // taken
          }
          if (renormalize) {
            for (int j = 0; j < k; ++j) weights[r * k + j] /= picked;
          }
        }
      },
      16);
}

void CpuBackend::moe(const float* x, int64_t n, int k, const int32_t* ids, const float* weights,
                     const Weight& gate, const Weight& up, const Weight& down,
                     const SharedExpert* shared, float* out, float* scratch) {
  if (n <= 0) return;
  const int64_t E = gate.experts, hidden = gate.cols, inter = gate.rows, slots = n * k;
  TM_CHECK(E > 0 && up.experts == E && down.experts == E, "moe experts {} {} {}", gate.experts,
           up.experts, down.experts);
  TM_CHECK(up.rows == inter && up.cols == hidden && down.rows == hidden && down.cols == inter,
           "moe shapes gate {}x{} up {}x{} down {}x{}", gate.rows, gate.cols, up.rows, up.cols,
           down.rows, down.cols);
  // Counting sort of the (token, slot) pairs by expert.
  moe_offsets_.assign(static_cast<size_t>(E + 1), 0);
  for (int64_t i = 0; i < slots; ++i) {
    if (ids[i] < 0 || ids[i] >= E) {
      fail("moe: expert id {} (token {}, slot {}) is outside the {} experts of the layer", ids[i],
           i / k, i % k, E);
    }
    ++moe_offsets_[static_cast<size_t>(ids[i]) + 1];
  }
  for (int64_t e = 0; e < E; ++e) moe_offsets_[e + 1] += moe_offsets_[e];
  moe_rows_.resize(static_cast<size_t>(slots));
  moe_fill_.assign(moe_offsets_.begin(), moe_offsets_.end() - 1);
  for (int64_t i = 0; i < slots; ++i) {
    moe_rows_[static_cast<size_t>(i)] = static_cast<int32_t>(moe_fill_[ids[i]]++);
  }
  // scratch: act [slots, inter] (gate output, then silu(gate)*up), up [slots, inter],
  // xd [slots, hidden] (the gathered inputs, later the down outputs).
  float* act = scratch;
  float* upo = act + slots * inter;
  float* xd = upo + slots * inter;
  pool_.run(
      slots,
      [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) {
          std::memcpy(xd + static_cast<int64_t>(moe_rows_[i]) * hidden, x + (i / k) * hidden,
                      static_cast<size_t>(hidden) * 4);
        }
      },
      std::max<int64_t>(1, 16384 / hidden));

  const bool scalar = options_.scalar_kernels;
  reserve_thread_scratch(cpu::gemm_scratch_floats());
  auto run_tasks = [&] {
    pool_.run(
        static_cast<int64_t>(tasks_.size()),
        [&](int64_t b, int64_t e, int t) {
          for (int64_t i = b; i < e; ++i) cpu::run_task(scalar, tasks_[i], thread_scratch(t));
        },
        1);
  };
  // Appends the tasks of one expert's product.
  auto add_tasks = [&](const Weight& w, int64_t e, const float* xin, int64_t ldx, float* o,
                       int64_t ldo, const float* prep) {
    const int64_t rows_e = moe_offsets_[e + 1] - moe_offsets_[e];
    cpu::LinearTask t;
    t.m = cpu::resolve(w, static_cast<int>(e));
    t.x = xin;
    t.ldx = ldx;
    t.n = rows_e;
    t.prep = prep;
    t.out = o;
    t.ldo = ldo;
    const int64_t step = rows_e <= kGemvMaxRows ? kGemvTaskRows : cpu::kGemmTileRows * 2;
    for (int64_t r0 = 0; r0 < t.m.rows; r0 += step) {
      t.r0 = r0;
      t.r1 = std::min(t.m.rows, r0 + step);
      tasks_.push_back(t);
    }
  };
  // GEMV inputs of the experts with <= 8 rows are prepared on this thread, back to back in the
  // shared scratch (sized first: growing it later would move earlier preparations).
  auto prep_total = [&](const Weight& w) {
    size_t total = 0;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t rows_e = moe_offsets_[e + 1] - moe_offsets_[e];
      if (rows_e > 0 && rows_e <= kGemvMaxRows) {
        total += cpu::gemv_prep_floats(cpu::resolve(w, static_cast<int>(e)), rows_e);
      }
    }
    return total;
  };
  float* prep_base = nullptr;
  size_t prep_used = 0;
  auto prepare = [&](const Weight& w, int64_t e, const float* xin, int64_t ldx) {
    const int64_t rows_e = moe_offsets_[e + 1] - moe_offsets_[e];
    if (rows_e > kGemvMaxRows) return static_cast<const float*>(nullptr);
    const cpu::MatView m = cpu::resolve(w, static_cast<int>(e));
    float* p = prep_base + prep_used;
    cpu::gemv_prepare(scalar, m, xin, ldx, rows_e, p);
    prep_used += cpu::gemv_prep_floats(m, rows_e);
    return static_cast<const float*>(p);
  };

  // Phase 1: gate and up of every used expert (same inputs: gate's preparation serves up when
  // both have the same layout).
  const bool same_layout = gate.bits == up.bits && gate.group == up.group;
  tasks_.clear();
  prep_base = shared_scratch(prep_total(gate) + (same_layout ? 0 : prep_total(up)));
  prep_used = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = moe_offsets_[e];
    if (moe_offsets_[e + 1] == r0) continue;
    const float* xe = xd + r0 * hidden;
    const float* pg = prepare(gate, e, xe, hidden);
    const float* pu = same_layout ? pg : prepare(up, e, xe, hidden);
    add_tasks(gate, e, xe, hidden, act + r0 * inter, inter, pg);
    add_tasks(up, e, xe, hidden, upo + r0 * inter, inter, pu);
  }
  run_tasks();
  silu_mul(act, upo, act, slots * inter);

  // Phase 2: down of every used expert, into xd (the gathered inputs are no longer needed).
  tasks_.clear();
  prep_base = shared_scratch(prep_total(down));
  prep_used = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = moe_offsets_[e];
    if (moe_offsets_[e + 1] == r0) continue;
    const float* ae = act + r0 * inter;
    add_tasks(down, e, ae, inter, xd + r0 * hidden, hidden, prepare(down, e, ae, inter));
  }
  run_tasks();

  // Combine in slot order (deterministic): out[t] = sum_j w[t, j] * down_out[row(t, j)].
  pool_.run(
      n,
      [&](int64_t b, int64_t e, int) {
        for (int64_t t = b; t < e; ++t) {
          float* o = out + t * hidden;
          std::fill(o, o + hidden, 0.0f);
          for (int j = 0; j < k; ++j) {
            const float w = weights[t * k + j];
            const float* d = xd + static_cast<int64_t>(moe_rows_[t * k + j]) * hidden;
            for (int64_t c = 0; c < hidden; ++c) o[c] += w * d[c];
          }
        }
      },
      std::max<int64_t>(1, 16384 / hidden));
  if (shared != nullptr) add_shared_expert(x, n, *shared, out, scratch);
}

}  // namespace tokenmill
