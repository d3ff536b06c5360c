// A Backend that forwards every op to another backend and measures it: each op is followed by
// synchronize(), and its wall time is added to the op's row (linears also by weight shape).
// Synchronizing after every op removes the overlap a real run has (and adds a few microseconds
// per op on devices), so the table says where device time goes, not how fast a step is.
// Rows are split into calls of <= 64 rows ("[small]": decode steps) and larger ("[large]":
// prefill); element-wise ops, which know no rows, have one row ("[elements]"). The linear ops'
// rows also give their rate, 2 x rows x the matrices' multiply-adds per row over their time
// (TFLOP/s; the same count whatever the format or the passes a backend makes). Used by
// `tokenmill bench --profile-ops`.
#pragma once

#include <chrono>
#include <map>
#include <string>

#include "backend/backend.h"

namespace tokenmill {

struct OpTime {
  int64_t calls = 0;
  double seconds = 0;
  double flops = 0;  // the calls' matrix arithmetic (linear ops only; 0 elsewhere)
};

class ProfilingBackend final : public Backend {
 public:
  explicit ProfilingBackend(Backend& inner) : in_(inner) {}

  // Per op name ("linear 5120x17408 q4g64", "attention", ...): calls and seconds.
  const std::map<std::string, OpTime>& table() const { return table_; }
  void reset() { table_.clear(); }
  // The table sorted by time, one line per row, with shares of the total.
  std::string report() const;

  std::string name() const override { return in_.name(); }
  PrecisionModes precision_modes() const override { return in_.precision_modes(); }
  int64_t free_memory_bytes() const override { return in_.free_memory_bytes(); }
  int64_t peak_allocated_bytes() const override { return in_.peak_allocated_bytes(); }
  int64_t allocation_count() const override { return in_.allocation_count(); }
  void reserve_step_workspaces(const StepShape& shape) override {
    in_.reserve_step_workspaces(shape);
  }
  void* alloc(size_t bytes) override { return in_.alloc(bytes); }
  void free(void* p) override { in_.free(p); }
  void upload(void* dst, const void* src, size_t bytes) override { in_.upload(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override {
    in_.download(dst, src, bytes);
  }
  int64_t begin_download(void* dst, const void* src, size_t bytes) override {
    return in_.begin_download(dst, src, bytes);
  }
  void finish_download(int64_t ticket) override { in_.finish_download(ticket); }
  void register_host(void* p, size_t bytes) override { in_.register_host(p, bytes); }
  void unregister_host(void* p) override { in_.unregister_host(p); }
  void fill_zero(void* dst, size_t bytes) override { in_.fill_zero(dst, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { in_.copy(dst, src, bytes); }
  void synchronize() override { in_.synchronize(); }
  bool runs_asynchronously() const override { return in_.runs_asynchronously(); }
  Weight upload_weight(const Weight& host) override { return in_.upload_weight(host); }
  Weight pack_weight(const Weight& w) override { return in_.pack_weight(w); }
  void fill_random(void* dst, DType dtype, int64_t n, float stddev, uint64_t seed) override {
    in_.fill_random(dst, dtype, n, stddev, seed);
  }
  void read_probe(const void* src, size_t bytes, void* sink) override {
    in_.read_probe(src, bytes, sink);
  }

  size_t attention_workspace_floats(int n_tokens, int heads, int head_dim,
                                    int context_capacity) const override {
    return in_.attention_workspace_floats(n_tokens, heads, head_dim, context_capacity);
  }
  size_t max_attention_workspace_floats(int max_tokens, int heads, int head_dim,
                                        int max_context_capacity) const override {
    return in_.max_attention_workspace_floats(max_tokens, heads, head_dim, max_context_capacity);
  }
  void set_attention_workspace(float* p, size_t floats) override {
    in_.set_attention_workspace(p, floats);
  }

  void embed(const Weight& table, const int32_t* ids, int n, float* out) override;
  void rmsnorm(const float* x, const float* w, float* out, int64_t rows, int dim,
               float eps) override;
  void add_rmsnorm(float* x, const float* y, const float* w, float* out, int64_t rows, int dim,
                   float eps) override;
  void rmsnorm_gated(const float* o, const float* z, const float* w, float* out, int64_t rows,
                     int dim, float eps) override;
  void l2norm(float* x, int64_t rows, int dim, float eps, float scale) override;
  void copy_rows(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
                 int64_t cols) override;
  void gather_rows(const float* x, int dim, const int32_t* rows, int n, float* out) override;
  void add(float* x, const float* y, int64_t n) override;
  void silu_mul(const float* gate, const float* up, float* out, int64_t n) override;
  void sigmoid_mul(float* x, const float* gate, int64_t n) override;
  void scale_rows_sigmoid(float* x, const float* gate, int64_t rows, int dim) override;
  void argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* out) override;
  void pick_tokens(const float* x, int64_t rows, int64_t cols, const TokenPick* picks,
                   int32_t* out) override;
  bool can_pick(const TokenPick& pick, int64_t cols) const override;
  void penalize_rows(float* x, int64_t n_rows, int64_t cols, const PenaltyRow* rows,
                     const PenaltyEntry* entries, int64_t n_entries,
                     const int32_t* tokens) override;
  int64_t max_penalty_entries() const override;
  void linear(const float* x, int64_t n, const Weight& w, float* out, int expert = 0) override;
  void rmsnorm_linear_multi(float* x, const float* y, const float* w, float* h, bool keep_h,
                            int64_t rows, int dim, float eps, const Weight* const* ws,
                            float* const* outs, int count) override;
  void rmsnorm_gated_linear(const float* o, const float* z, const float* norm_w, float* normed,
                            int64_t n, int heads, int dim, float eps, const Weight& w,
                            float* out) override;
  void sigmoid_mul_linear(float* x, const float* gate, int64_t n, const Weight& w,
                          float* out) override;
  void silu_mul_linear(const float* gate, const float* up, int64_t n, const Weight& w, float* out,
                       float* act) override;
  void linear_multi(const float* x, int64_t n, const Weight* const* ws, float* const* outs,
                    int count) override;
  void rope(float* x, const int32_t* positions, int n_tokens, int heads, int head_dim,
            int64_t token_stride, int rot_dim, float theta) override;
  bool supports_kv_dtype(DType dtype) const override { return in_.supports_kv_dtype(dtype); }
  void kv_append(const KVLayerView& kv, const KVPaging& paging, const SeqLayout& seqs,
                 const float* k, const float* v) override;
  void attention(const KVLayerView& kv, const KVPaging& paging, const SeqLayout& seqs,
                 const float* q, int heads, float scale, float* out) override;
  void conv1d_silu(const GDNStateView& st, const SeqLayout& seqs, const int32_t* slots,
                   const float* x, const float* weight, float* out) override;
  void gated_delta_rule(const GDNStateView& st, const SeqLayout& seqs, const int32_t* slots,
                        const float* q, const float* k, const float* v, const float* g,
                        const float* beta, float* out, float* step_states) override;
  void gdn_gates(const float* a, const float* b, const float* a_log, const float* dt_bias, float* g,
                 float* beta, int64_t n, int heads) override;
  void attention_front(const KVLayerView& kv, const KVPaging& paging, const SeqLayout& seqs,
                       const float* qp, bool gated, const float* q_norm, const float* k_norm,
                       float eps, int heads, int rot_dim, float theta, float* q, float* gate,
                       float* k, const float* v) override;
  void gdn_front(const GDNStateView& st, const SeqLayout& seqs, const int32_t* slots,
                 const float* qkv, const float* conv_weight, const float* a, const float* b,
                 const float* a_log, const float* dt_bias, float* conv_out, float* q, float* k,
                 float* v, float* g, float* beta) override;
  void topk_softmax(const float* logits, int64_t n, int experts, int k, bool renormalize,
                    int32_t* ids, float* weights) override;
  void moe(const float* x, int64_t n, int k, const int32_t* ids, const float* weights,
           const Weight& gate, const Weight& up, const Weight& down, const SharedExpert* shared,
           float* out, float* scratch) override;
  void mlp_block(float* x, const float* y, int64_t n, int hidden, const MlpBlockWeights& b,
                 const MlpBlockScratch& s, float* out) override;
  void moe_block(float* x, const float* y, int64_t n, int hidden, const MoeBlockWeights& b,
                 const MoeBlockScratch& s, float* out) override;
  void rmsnorm_linear_multi_moe(float* x, const MoeRows& y, float* out, const float* w, float* h,
                                bool keep_h, int64_t rows, int dim, float eps,
                                const Weight* const* ws, float* const* outs, int count) override;
  void add_moe(float* x, const MoeRows& y, float* out, int64_t rows, int dim) override;

 private:
  // Runs fn, waits for the device, and charges the time to `op`, split by the call's size:
  // `rows` is the op's row count (tokens, or tokens x heads for per-head ops), so decode steps
  // (small) and prefill chunks (large) land in different rows.
  template <class Fn>
  void timed(const std::string& op, int64_t rows, Fn&& fn, double flops = 0) {
    timed_as(op + (rows <= kSmallRows ? " [small]" : " [large]"), fn, flops);
  }
  // For element-wise ops, which see an element count and no rows: one table row whatever the
  // size.
  template <class Fn>
  void timed_elements(const std::string& op, Fn&& fn) {
    timed_as(op + " [elements]", fn);
  }
  template <class Fn>
  void timed_as(const std::string& row, Fn&& fn, double flops = 0) {
    in_.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    in_.synchronize();
    OpTime& t = table_[row];
    t.calls++;
    t.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    t.flops += flops;
  }

  static constexpr int64_t kSmallRows = 64;
  Backend& in_;
  std::map<std::string, OpTime> table_;
};

}  // namespace tokenmill
