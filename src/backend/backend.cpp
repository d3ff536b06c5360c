#include "backend/backend.h"

#include <algorithm>

#include "util/error.h"

namespace tokenmill {

void release_replaced(Backend& backend, const Weight& before, const Weight& after,
                      std::vector<void*>& owned) {
  for (const void* p : {before.data, before.scales, before.biases}) {
    if (p == nullptr || p == after.data || p == after.scales || p == after.biases) continue;
    auto it = std::find(owned.begin(), owned.end(), p);
    if (it != owned.end()) {
      backend.free(*it);
      owned.erase(it);
    }
  }
}

size_t Weight::data_bytes() const {
  const size_t mats = static_cast<size_t>(experts ? experts : 1);
  if (!quantized()) return static_cast<size_t>(rows * cols) * dtype_size(dtype) * mats;
  return static_cast<size_t>(rows) * static_cast<size_t>(cols * bits / 32) * 4 * mats;
}

size_t Weight::scale_bytes() const {
  if (!quantized()) return 0;
  const size_t mats = static_cast<size_t>(experts ? experts : 1);
  return static_cast<size_t>(rows) * static_cast<size_t>(cols / group) * dtype_size(scale_dtype) *
         mats;
}

size_t Weight::bytes_per_matrix() const {
  return (data_bytes() + 2 * scale_bytes()) / static_cast<size_t>(experts ? experts : 1);
}

void Backend::pick_tokens(const float* x, int64_t rows, int64_t cols, const TokenPick* picks,
                          int32_t* out) {
  for (int64_t r = 0; r < rows; ++r) {
    TM_CHECK(can_pick(picks[r], cols),
             "pick_tokens: backend {} cannot sample row {} (temperature {}, top_k {})", name(), r,
             picks[r].temperature, picks[r].top_k);
  }
  argmax_rows(x, rows, cols, out);
}

void Backend::add_shared_expert(const float* x, int64_t n, const SharedExpert& shared, float* out,
                                float* scratch) {
  const int64_t inter = shared.gate->rows, hidden = shared.down->rows;
  if (shared.up->rows != inter || shared.gate->cols != hidden || shared.up->cols != hidden ||
      shared.down->cols != inter || shared.gate_logit == nullptr) {
    fail(
        "moe: shared expert shapes disagree (gate {}x{}, up {}x{}, down {}x{}; want gate/up "
        "[inter, hidden], down [hidden, inter]) or no gate logits",
        shared.gate->rows, shared.gate->cols, shared.up->rows, shared.up->cols, shared.down->rows,
        shared.down->cols);
  }
  float* gate = scratch;
  float* up = gate + n * inter;
  float* down = up + n * inter;
  const Weight* ws[] = {shared.gate, shared.up};
  float* outs[] = {gate, up};
  linear_multi(x, n, ws, outs, 2);
  silu_mul_linear(gate, up, n, *shared.down, down, gate);
  scale_rows_sigmoid(down, shared.gate_logit, n, static_cast<int>(hidden));
  add(out, down, n * hidden);
}

void Backend::gdn_mixer(const GDNStateView& st, const SeqLayout& seqs, const int32_t* slots,
                        const GdnMixerWeights& w, const GdnMixerIo& io, float* out) {
  gdn_front(st, seqs, slots, io.qkv, w.conv, io.a, io.b, w.a_log, w.dt_bias, io.conv_out, io.q,
            io.k, io.v, io.g, io.beta);
  gated_delta_rule(st, seqs, slots, io.q, io.k, io.v, io.g, io.beta, io.o, nullptr);
  rmsnorm_gated_linear(io.o, io.z, w.norm, io.normed, seqs.n_tokens, st.v_heads, st.v_dim, w.eps,
                       *w.out_proj, out);
}

void Backend::mlp_block(float* x, const float* y, int64_t n, int hidden, const MlpBlockWeights& b,
                        const MlpBlockScratch& s, float* out) {
  const Weight* ws[] = {b.gate, b.up};
  float* outs[] = {s.gate, s.up};
  rmsnorm_linear_multi(x, y, b.norm, s.h, false, n, hidden, b.eps, ws, outs, 2);
  silu_mul_linear(s.gate, s.up, n, *b.down, out, s.act);
}

void Backend::rmsnorm_linear_multi_moe(float* x, const MoeRows& y, float* out, const float* w,
                                       float* h, bool keep_h, int64_t rows, int dim, float eps,
                                       const Weight* const* ws, float* const* outs, int count) {
  (void)x, (void)y, (void)out, (void)w, (void)h, (void)keep_h, (void)rows, (void)dim, (void)eps;
  (void)ws, (void)outs, (void)count;
  fail("internal: a deferred MoE output reached a backend whose moe_block never defers");
}

void Backend::add_moe(float* x, const MoeRows& y, float* out, int64_t rows, int dim) {
  (void)x, (void)y, (void)out, (void)rows, (void)dim;
  fail("internal: a deferred MoE output reached a backend whose moe_block never defers");
}

void Backend::moe_block(float* x, const float* y, int64_t n, int hidden, const MoeBlockWeights& b,
                        const MoeBlockScratch& s, float* out) {
  if (s.defer != nullptr) *s.defer = MoeRows{};
  const int E = static_cast<int>(b.router->rows);
  const bool shared = b.has_shared();
  const Weight* ws[] = {b.router, b.shared_expert_gate};
  float* outs[] = {s.logits, s.shared_logit};
  rmsnorm_linear_multi(x, y, b.norm, s.h, true, n, hidden, b.eps, ws, outs, shared ? 2 : 1);
  topk_softmax(s.logits, n, E, b.k, b.renormalize, s.ids, s.weights);
  const SharedExpert se{b.shared_gate, b.shared_up, b.shared_down, s.shared_logit};
  moe(s.h, n, b.k, s.ids, s.weights, *b.gate, *b.up, *b.down, shared ? &se : nullptr, out,
      s.scratch);
}

}  // namespace tokenmill
