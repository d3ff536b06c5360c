#include "backend/profiling_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace tokenmill {

namespace {
std::string weight_label(const Weight& w) {
  std::string fmt_name =
      w.quantized() ? fmt::format("q{}g{}", w.bits, w.group) : std::string(dtype_name(w.dtype));
  return fmt::format("{}x{} {}{}", w.rows, w.cols, fmt_name,
                     w.experts ? fmt::format(" x{} experts", w.experts) : "");
}
// FLOPs of n rows through one matrix (one expert's when stacked).
double matrix_flops(int64_t n, const Weight& w) {
  return 2.0 * static_cast<double>(n) * static_cast<double>(w.rows) * static_cast<double>(w.cols);
}
double matrices_flops(int64_t n, const Weight* const* ws, int count) {
  double f = 0;
  for (int i = 0; i < count; ++i) f += matrix_flops(n, *ws[i]);
  return f;
}
// An op's label followed by each of its matrices'.
std::string matrices_label(std::string op, const Weight* const* ws, int count) {
  for (int i = 0; i < count; ++i) op += " " + weight_label(*ws[i]);
  return op;
}
}  // namespace

std::string ProfilingBackend::report() const {
  std::vector<std::pair<std::string, OpTime>> rows(table_.begin(), table_.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  double total = 0;
  for (const auto& r : rows) total += r.second.seconds;
  std::string out = fmt::format("  {:<44} {:>8} {:>11} {:>10} {:>6} {:>9}\n", "op (synchronized)",
                                "calls", "total ms", "us/call", "share", "TFLOP/s");
  for (const auto& [name, t] : rows) {
    // Four significant digits: a device's hundreds and a small CPU model's tenths alike.
    const std::string rate =
        t.flops > 0 && t.seconds > 0 ? fmt::format(" {:>9.4g}", t.flops / t.seconds / 1e12) : "";
    out += fmt::format("  {:<44} {:>8} {:>11.3f} {:>10.2f} {:>5.1f}%{}\n", name, t.calls,
                       t.seconds * 1e3, t.seconds * 1e6 / static_cast<double>(t.calls),
                       total > 0 ? 100.0 * t.seconds / total : 0.0, rate);
  }
  out += fmt::format("  {:<44} {:>8} {:>11.3f}\n", "total", "", total * 1e3);
  return out;
}

void ProfilingBackend::embed(const Weight& table, const int32_t* ids, int n, float* out) {
  timed("embed", n, [&] { in_.embed(table, ids, n, out); });
}
void ProfilingBackend::rmsnorm(const float* x, const float* w, float* out, int64_t rows, int dim,
                               float eps) {
  timed("rmsnorm", rows, [&] { in_.rmsnorm(x, w, out, rows, dim, eps); });
}
void ProfilingBackend::add_rmsnorm(float* x, const float* y, const float* w, float* out,
                                   int64_t rows, int dim, float eps) {
  timed("add_rmsnorm", rows, [&] { in_.add_rmsnorm(x, y, w, out, rows, dim, eps); });
}
void ProfilingBackend::rmsnorm_gated(const float* o, const float* z, const float* w, float* out,
                                     int64_t rows, int dim, float eps) {
  timed("rmsnorm_gated", rows, [&] { in_.rmsnorm_gated(o, z, w, out, rows, dim, eps); });
}
void ProfilingBackend::l2norm(float* x, int64_t rows, int dim, float eps, float scale) {
  timed("l2norm", rows, [&] { in_.l2norm(x, rows, dim, eps, scale); });
}
void ProfilingBackend::copy_rows(const float* src, int64_t src_stride, float* dst,
                                 int64_t dst_stride, int64_t rows, int64_t cols) {
  timed("copy_rows", rows, [&] { in_.copy_rows(src, src_stride, dst, dst_stride, rows, cols); });
}
void ProfilingBackend::gather_rows(const float* x, int dim, const int32_t* rows, int n,
                                   float* out) {
  timed("gather_rows", n, [&] { in_.gather_rows(x, dim, rows, n, out); });
}
void ProfilingBackend::add(float* x, const float* y, int64_t n) {
  timed_elements("add", [&] { in_.add(x, y, n); });
}
void ProfilingBackend::silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  timed_elements("silu_mul", [&] { in_.silu_mul(gate, up, out, n); });
}
void ProfilingBackend::sigmoid_mul(float* x, const float* gate, int64_t n) {
  timed_elements("sigmoid_mul", [&] { in_.sigmoid_mul(x, gate, n); });
}
void ProfilingBackend::scale_rows_sigmoid(float* x, const float* gate, int64_t rows, int dim) {
  timed("scale_rows_sigmoid", rows, [&] { in_.scale_rows_sigmoid(x, gate, rows, dim); });
}
void ProfilingBackend::argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* out) {
  timed("argmax_rows", rows, [&] { in_.argmax_rows(x, rows, cols, out); });
}
void ProfilingBackend::pick_tokens(const float* x, int64_t rows, int64_t cols,
                                   const TokenPick* picks, int32_t* out) {
  timed("pick_tokens", rows, [&] { in_.pick_tokens(x, rows, cols, picks, out); });
}
bool ProfilingBackend::can_pick(const TokenPick& pick, int64_t cols) const {
  return in_.can_pick(pick, cols);
}
void ProfilingBackend::penalize_rows(float* x, int64_t n_rows, int64_t cols, const PenaltyRow* rows,
                                     const PenaltyEntry* entries, int64_t n_entries,
                                     const int32_t* tokens) {
  timed("penalize_rows", n_rows,
        [&] { in_.penalize_rows(x, n_rows, cols, rows, entries, n_entries, tokens); });
}
int64_t ProfilingBackend::max_penalty_entries() const {
  return in_.max_penalty_entries();
}
void ProfilingBackend::linear(const float* x, int64_t n, const Weight& w, float* out, int expert) {
  timed(
      "linear " + weight_label(w), n, [&] { in_.linear(x, n, w, out, expert); },
      matrix_flops(n, w));
}
void ProfilingBackend::rmsnorm_linear_multi(float* x, const float* y, const float* w, float* h,
                                            bool keep_h, int64_t rows, int dim, float eps,
                                            const Weight* const* ws, float* const* outs,
                                            int count) {
  const std::string label = matrices_label("rmsnorm_linear_multi", ws, count);
  timed(
      label, rows,
      [&] { in_.rmsnorm_linear_multi(x, y, w, h, keep_h, rows, dim, eps, ws, outs, count); },
      matrices_flops(rows, ws, count));
}
void ProfilingBackend::rmsnorm_linear_multi_moe(float* x, const MoeRows& y, float* out,
                                                const float* w, float* h, bool keep_h, int64_t rows,
                                                int dim, float eps, const Weight* const* ws,
                                                float* const* outs, int count) {
  const std::string label = matrices_label("rmsnorm_linear_multi_moe", ws, count);
  timed(
      label, rows,
      [&] {
        in_.rmsnorm_linear_multi_moe(x, y, out, w, h, keep_h, rows, dim, eps, ws, outs, count);
      },
      matrices_flops(rows, ws, count));
}
void ProfilingBackend::add_moe(float* x, const MoeRows& y, float* out, int64_t rows, int dim) {
  timed("add_moe", rows, [&] { in_.add_moe(x, y, out, rows, dim); });
}
void ProfilingBackend::rmsnorm_gated_linear(const float* o, const float* z, const float* norm_w,
                                            float* normed, int64_t n, int heads, int dim, float eps,
                                            const Weight& w, float* out) {
  timed(
      "rmsnorm_gated_linear " + weight_label(w), n,
      [&] { in_.rmsnorm_gated_linear(o, z, norm_w, normed, n, heads, dim, eps, w, out); },
      matrix_flops(n, w));
}
void ProfilingBackend::sigmoid_mul_linear(float* x, const float* gate, int64_t n, const Weight& w,
                                          float* out) {
  timed(
      "sigmoid_mul_linear " + weight_label(w), n,
      [&] { in_.sigmoid_mul_linear(x, gate, n, w, out); }, matrix_flops(n, w));
}
void ProfilingBackend::silu_mul_linear(const float* gate, const float* up, int64_t n,
                                       const Weight& w, float* out, float* act) {
  timed(
      "silu_mul_linear " + weight_label(w), n,
      [&] { in_.silu_mul_linear(gate, up, n, w, out, act); }, matrix_flops(n, w));
}
void ProfilingBackend::linear_multi(const float* x, int64_t n, const Weight* const* ws,
                                    float* const* outs, int count) {
  std::string label = "linear_multi";
  for (int i = 0; i < count; ++i) label += (i ? " + " : " ") + weight_label(*ws[i]);
  timed(
      label, n, [&] { in_.linear_multi(x, n, ws, outs, count); }, matrices_flops(n, ws, count));
}
void ProfilingBackend::rope(float* x, const int32_t* positions, int n_tokens, int heads,
                            int head_dim, int64_t token_stride, int rot_dim, float theta) {
  timed("rope", n_tokens,
        [&] { in_.rope(x, positions, n_tokens, heads, head_dim, token_stride, rot_dim, theta); });
}
void ProfilingBackend::kv_append(const KVLayerView& kv, const KVPaging& paging,
                                 const SeqLayout& seqs, const float* k, const float* v) {
  timed("kv_append", seqs.n_tokens, [&] { in_.kv_append(kv, paging, seqs, k, v); });
}
void ProfilingBackend::attention(const KVLayerView& kv, const KVPaging& paging,
                                 const SeqLayout& seqs, const float* q, int heads, float scale,
                                 float* out) {
  timed("attention", seqs.n_tokens, [&] { in_.attention(kv, paging, seqs, q, heads, scale, out); });
}
void ProfilingBackend::conv1d_silu(const GDNStateView& st, const SeqLayout& seqs,
                                   const int32_t* slots, const float* x, const float* weight,
                                   float* out) {
  timed("conv1d_silu", seqs.n_tokens, [&] { in_.conv1d_silu(st, seqs, slots, x, weight, out); });
}
void ProfilingBackend::gated_delta_rule(const GDNStateView& st, const SeqLayout& seqs,
                                        const int32_t* slots, const float* q, const float* k,
                                        const float* v, const float* g, const float* beta,
                                        float* out, float* step_states) {
  timed("gated_delta_rule", seqs.n_tokens,
        [&] { in_.gated_delta_rule(st, seqs, slots, q, k, v, g, beta, out, step_states); });
}
void ProfilingBackend::gdn_gates(const float* a, const float* b, const float* a_log,
                                 const float* dt_bias, float* g, float* beta, int64_t n,
                                 int heads) {
  timed("gdn_gates", n, [&] { in_.gdn_gates(a, b, a_log, dt_bias, g, beta, n, heads); });
}

void ProfilingBackend::attention_front(const KVLayerView& kv, const KVPaging& paging,
                                       const SeqLayout& seqs, const float* qp, bool gated,
                                       const float* q_norm, const float* k_norm, float eps,
                                       int heads, int rot_dim, float theta, float* q, float* gate,
                                       float* k, const float* v) {
  timed("attention_front", seqs.n_tokens, [&] {
    in_.attention_front(kv, paging, seqs, qp, gated, q_norm, k_norm, eps, heads, rot_dim, theta, q,
                        gate, k, v);
  });
}

void ProfilingBackend::gdn_front(const GDNStateView& st, const SeqLayout& seqs,
                                 const int32_t* slots, const float* qkv, const float* conv_weight,
                                 const float* a, const float* b, const float* a_log,
                                 const float* dt_bias, float* conv_out, float* q, float* k,
                                 float* v, float* g, float* beta) {
  timed("gdn_front", seqs.n_tokens, [&] {
    in_.gdn_front(st, seqs, slots, qkv, conv_weight, a, b, a_log, dt_bias, conv_out, q, k, v, g,
                  beta);
  });
}
void ProfilingBackend::topk_softmax(const float* logits, int64_t n, int experts, int k,
                                    bool renormalize, int32_t* ids, float* weights) {
  timed("topk_softmax", n,
        [&] { in_.topk_softmax(logits, n, experts, k, renormalize, ids, weights); });
}
void ProfilingBackend::moe(const float* x, int64_t n, int k, const int32_t* ids,
                           const float* weights, const Weight& gate, const Weight& up,
                           const Weight& down, const SharedExpert* shared, float* out,
                           float* scratch) {
  timed("moe " + weight_label(gate), n,
        [&] { in_.moe(x, n, k, ids, weights, gate, up, down, shared, out, scratch); });
}
// The inner backend's own blocks (fused where it fuses them), each timed as one op.
void ProfilingBackend::mlp_block(float* x, const float* y, int64_t n, int hidden,
                                 const MlpBlockWeights& b, const MlpBlockScratch& s, float* out) {
  timed(
      "mlp_block " + weight_label(*b.gate) + " " + weight_label(*b.up) + " " +
          weight_label(*b.down),
      n, [&] { in_.mlp_block(x, y, n, hidden, b, s, out); },
      matrix_flops(n, *b.gate) + matrix_flops(n, *b.up) + matrix_flops(n, *b.down));
}
void ProfilingBackend::moe_block(float* x, const float* y, int64_t n, int hidden,
                                 const MoeBlockWeights& b, const MoeBlockScratch& s, float* out) {
  timed("moe_block " + weight_label(*b.gate), n,
        [&] { in_.moe_block(x, y, n, hidden, b, s, out); });
}

}  // namespace tokenmill
