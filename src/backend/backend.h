// The Backend interface: the ops the model's forward is written against, once. The CPU backend
// (backend/cpu) is the reference; the CUDA backend (backend/cuda) implements the same ops.
//
// Conventions (invariants every implementation keeps):
// - Every pointer in an op's parameters is backend memory (host memory for the CPU backend,
//   device memory for CUDA), obtained from alloc() or upload_weight().
// - Activations crossing op boundaries are F32, row-major, one row per token.
// - Ops never allocate. Scratch comes from the caller's workspace.
// - Index arrays (positions, cu_seqlens, block tables, state slots) are int32 in backend memory.
// - Ops are asynchronous with respect to the host on devices that can be; synchronize() waits.
#pragma once

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensor/dtype.h"
#include "util/token_pick.h"

namespace tokenmill {

// A weight matrix [rows = out_features, cols = in_features], optionally stacked over experts.
// Float formats (F32, F16, BF16): `data` holds rows*cols elements per expert.
// MLX affine (bits 2..8): `data` holds each row as a little-endian bit stream packed in U32
// words (row stride = cols*bits/32 words); `scales` and `biases` hold [rows, cols/group] values
// of `scale_dtype`; w = scale*q + bias.
struct Weight {
  DType dtype = DType::F32;         // element type of `data` (U32 for affine)
  int bits = 0;                     // 0 = float weight; 2,3,4,5,6,8 = MLX affine
  int group = 0;                    // affine group size (32, 64 or 128)
  DType scale_dtype = DType::BF16;  // affine scales and biases
  const void* data = nullptr;
  const void* scales = nullptr;
  const void* biases = nullptr;
  int64_t experts = 0;  // 0: a plain matrix; E > 0: E matrices laid out one after another
  int64_t rows = 0, cols = 0;
  // 0: `data`, `scales` and `biases` in the layout above. Nonzero: a backend's own arrangement of
  // the same values (made by upload_weight or pack_weight), read only by that backend.
  int packing = 0;

  bool quantized() const { return bits > 0; }
  // Bytes of `data` and of `scales` (as many as `biases`) over all matrices, in the layout above.
  size_t data_bytes() const;
  size_t scale_bytes() const;  // 0 for float weights
  // Bytes of one expert's (or the whole plain matrix's) data, scales and biases.
  size_t bytes_per_matrix() const;
  size_t total_bytes() const {
    return bytes_per_matrix() * static_cast<size_t>(experts ? experts : 1);
  }
};

class Backend;
// After `after = backend.pack_weight(before)`: frees the buffers of `before` that `after` does
// not use, and drops them from `owned` (the caller's list of buffers it frees at the end).
void release_replaced(Backend& backend, const Weight& before, const Weight& after,
                      std::vector<void*>& owned);

// Varlen sequence layout for one forward call: sequence s owns rows
// [cu_seqlens[s], cu_seqlens[s+1]) of every activation.
struct SeqLayout {
  int n_seqs = 0;
  int n_tokens = 0;
  const int32_t* cu_seqlens = nullptr;  // [n_seqs + 1]
  const int32_t* positions = nullptr;   // [n_tokens] absolute position of each row
  int max_seq_tokens = 0;               // max over s of the rows it advances (host-side hint)
};

// Paged KV cache of one attention layer: blocks of `block_size` positions, each holding
// k and v as [block_size, kv_heads, head_dim] elements of `dtype` (F32, or BF16: half the
// memory and the bytes each decode step reads, values rounded to 8 significant bits when
// appended; Backend::supports_kv_dtype says which a backend takes).
struct KVLayerView {
  void* k = nullptr;  // [num_blocks, block_size, kv_heads, head_dim]
  void* v = nullptr;
  int block_size = 0;
  int kv_heads = 0;
  int head_dim = 0;
  DType dtype = DType::F32;
};

// Per-sequence paging info shared by all attention layers of a forward.
struct KVPaging {
  const int32_t* block_tables = nullptr;  // [n_seqs, max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  const int32_t* context_lens = nullptr;  // [n_seqs] tokens in cache after this step's append
  int max_context_len = 0;                // host-side hint
};

// Recurrent state of one Gated DeltaNet layer for all slots.
struct GDNStateView {
  float* conv = nullptr;  // [slots, channels, kernel-1]: the last K-1 pre-conv inputs, oldest first
  float* ssm = nullptr;   // [slots, v_heads, k_dim, v_dim]
  int channels = 0;
  int kernel = 0;
  int v_heads = 0, k_heads = 0, k_dim = 0, v_dim = 0;
};

// A GDN layer past its input projections (Backend::gdn_mixer): the conv weights [channels,
// kernel] F32, A_log and dt_bias [v_heads], the gated norm's weights [v_dim] and its eps, and the
// output projection [hidden, v_heads * v_dim].
struct GdnMixerWeights {
  const float* conv = nullptr;
  const float* a_log = nullptr;
  const float* dt_bias = nullptr;
  const float* norm = nullptr;
  float eps = 0.0f;
  const Weight* out_proj = nullptr;
};

// Its inputs, the input projections' outputs (qkv [n_tokens, channels], z [n_tokens, v_heads *
// v_dim], a and b [n_tokens, v_heads]), and the op-by-op form's intermediates (gdn_front's
// outputs, the delta rule's o and the gated norm's rows `normed`, [n_tokens, v_heads * v_dim]).
struct GdnMixerIo {
  const float* qkv = nullptr;
  const float* z = nullptr;
  const float* a = nullptr;
  const float* b = nullptr;
  float* conv_out = nullptr;
  float* q = nullptr;
  float* k = nullptr;
  float* v = nullptr;
  float* g = nullptr;
  float* beta = nullptr;
  float* o = nullptr;
  float* normed = nullptr;
};

// A MoE layer's shared expert, run for every token next to the routed ones: gate, up
// [inter, hidden] and down [hidden, inter] plain matrices, and gate_logit [n], the layer's
// shared_expert_gate output, whose sigmoid scales the expert's output.
struct SharedExpert {
  const Weight* gate = nullptr;
  const Weight* up = nullptr;
  const Weight* down = nullptr;
  const float* gate_logit = nullptr;
};

// A MoE block (Backend::moe_block): its post-attention norm, router, top-k rule and experts.
// router [E, hidden]; with a shared expert (shared_gate non-null): shared_expert_gate [1,
// hidden], the logit whose sigmoid scales it, and its own gate, up and down matrices.
struct MoeBlockWeights {
  const float* norm = nullptr;  // [hidden]
  float eps = 0.0f;
  const Weight* router = nullptr;
  int k = 0;
  bool renormalize = true;
  const Weight* gate = nullptr;  // [E, inter, hidden]
  const Weight* up = nullptr;
  const Weight* down = nullptr;  // [E, hidden, inter]
  const Weight* shared_expert_gate = nullptr;
  const Weight* shared_gate = nullptr;  // [inter', hidden]
  const Weight* shared_up = nullptr;
  const Weight* shared_down = nullptr;  // [hidden, inter']
  bool has_shared() const { return shared_gate != nullptr; }
};

// A MoE block's output left uncombined (MoeBlockScratch::defer): row t of it is
// sum_j weights[t * k + j] * rows[t * per_token + j] (+ sigmoid(gate_logit[t]) *
// rows[t * per_token + k] when per_token > k), rows of `hidden` floats, added in that order.
struct MoeRows {
  const float* rows = nullptr;  // null: nothing deferred, the block wrote its output
  const float* weights = nullptr;
  const float* gate_logit = nullptr;
  int k = 0, per_token = 0;
};

// Where a MoE block's intermediates go: h [n, hidden] (the normed rows), logits [n, E], the
// shared expert's gate logits [n], ids and weights [n, k], and `scratch` for moe
// (moe_scratch_floats).
struct MoeBlockScratch {
  float* h = nullptr;
  float* logits = nullptr;
  float* shared_logit = nullptr;
  int32_t* ids = nullptr;
  float* weights = nullptr;
  float* scratch = nullptr;
  // Non-null: the backend may leave the combine to the op that adds the block's output to the
  // residual (rmsnorm_linear_multi_moe, add_moe), describing the rows here and writing nothing
  // to `out`; the rows stay in `scratch` until that op. Where it does not, defer->rows is null.
  MoeRows* defer = nullptr;
};

// A dense gated MLP block (Backend::mlp_block): its post-mixer norm and its three matrices.
struct MlpBlockWeights {
  const float* norm = nullptr;  // [hidden]
  float eps = 0.0f;
  const Weight* gate = nullptr;  // [inter, hidden]
  const Weight* up = nullptr;
  const Weight* down = nullptr;  // [hidden, inter]
};

// Where a dense MLP block's intermediates may go: h [n, hidden], gate, up and act [n, inter]
// floats each. They are the block's workspace: what they hold afterwards is unspecified.
struct MlpBlockScratch {
  float* h = nullptr;
  float* gate = nullptr;
  float* up = nullptr;
  float* act = nullptr;
};

// Scratch floats Backend::moe needs for n tokens of k routed experts (expert width inter) and an
// optional shared expert (width shared_inter; 0: none).
inline int64_t moe_scratch_floats(int64_t n, int64_t k, int64_t inter, int64_t shared_inter,
                                  int64_t hidden) {
  const int64_t slots = n * (k + (shared_inter > 0 ? 1 : 0));
  return slots * (2 * std::max(inter, shared_inter) + hidden);
}

// The largest forward a caller will run, for Backend::reserve_step_workspaces: what the
// workspaces a backend grows for large steps depend on (model dimensions and step limits).
struct StepShape {
  int max_tokens = 0;           // rows of one forward (all its sequences' tokens)
  int max_seqs = 0;             // sequences in one forward
  int64_t max_linear_cols = 0;  // widest input (in_features) of a linear() the forward runs
  int gdn_k_heads = 0;          // Gated DeltaNet layers' heads and head dims (0: no such layers)
  int gdn_v_heads = 0;
  int gdn_k_dim = 0;
  int gdn_v_dim = 0;
  int attn_kv_heads = 0;  // full-attention layers' kv heads and head dim (0: no such layers)
  int attn_head_dim = 0;
  int max_context = 0;  // positions one sequence's block table covers (0: unknown)
};

// The reduced-precision modes a backend runs with. A mode asked for that this device cannot
// run (fast batches need Hopper's wgmma) reads as off, so reports never claim it.
struct PrecisionModes {
  bool prefill_fast = false;  // `--prefill-precision fast`: one F16 / TF32 pass per prefill matmul
  bool batch_fast = false;    // `--batch-precision fast`: 17-64-row 4-bit matmuls in one F16 pass
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // F32 everywhere unless a backend says otherwise.
  virtual PrecisionModes precision_modes() const { return {}; }

  // ---- memory ----
  virtual void* alloc(size_t bytes) = 0;  // throws tokenmill::Error when it does not fit
  // Device memory free now, in bytes; -1 when the backend allocates host memory.
  virtual int64_t free_memory_bytes() const { return -1; }
  // The most bytes held through alloc() at once since the backend was created (weights it
  // uploads, caches, workspaces); -1 when the backend does not count them.
  virtual int64_t peak_allocated_bytes() const { return -1; }
  // Calls of alloc() that succeeded since the backend was created; -1 when not counted.
  virtual int64_t allocation_count() const { return -1; }
  virtual void free(void* p) = 0;
  virtual void upload(void* dst, const void* src, size_t bytes) = 0;
  virtual void download(void* dst, const void* src, size_t bytes) = 0;
  // A download that does not wait: it starts copying `bytes` from backend memory `src` once the
  // ops issued so far have run, and returns a ticket; `dst` (host memory, kept alive by the
  // caller) holds the bytes once finish_download(ticket) returns. The host can issue the next
  // ops in between. Tickets are finished in the order they were begun. Backends whose ops run
  // synchronously copy at once (the default).
  virtual int64_t begin_download(void* dst, const void* src, size_t bytes) {
    download(dst, src, bytes);
    return 0;
  }
  virtual void finish_download(int64_t ticket) { (void)ticket; }
  // Page-locks host memory that downloads will write (a step's logits), so a device copies into
  // it at full speed instead of through pageable staging; unregister_host before it is freed or
  // moved. No-ops where there is nothing to lock.
  virtual void register_host(void* p, size_t bytes) {
    (void)p;
    (void)bytes;
  }
  virtual void unregister_host(void* p) { (void)p; }
  virtual void fill_zero(void* dst, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;  // backend to backend
  virtual void synchronize() = 0;
  // Whether an op can still be running when its call returns (queued on a device). Only then
  // does the engine launch a step behind the one still running (EngineOptions::overlap_steps):
  // where each op runs before its call returns, that would only hold each token back a step.
  virtual bool runs_asynchronously() const { return false; }
  // Fills n elements of `dtype` at dst with seeded pseudo-random values: U32 gets uniformly random
  // bits (any packed affine data), float types get a uniform distribution of standard deviation
  // `stddev` around zero. Deterministic for a given seed. Used for dummy weights at real shapes.
  virtual void fill_random(void* dst, DType dtype, int64_t n, float stddev, uint64_t seed) = 0;
  // Reads every byte of [src, src + bytes) once (a read-bandwidth probe) and writes a value
  // derived from them to `sink` (backend memory, 64 bytes) so the reads cannot be elided.
  virtual void read_probe(const void* src, size_t bytes, void* sink) = 0;
  // Makes a host weight usable by ops. The CPU backend returns the same pointers (no copy);
  // devices copy (and may repack) into memory they own until the backend is destroyed.
  virtual Weight upload_weight(const Weight& host) = 0;
  // A weight already in backend memory (e.g. filled by fill_random), arranged the way
  // upload_weight would arrange it. When the result's buffers differ from w's, they belong to the
  // backend and the caller may free w's.
  virtual Weight pack_weight(const Weight& w) { return w; }
  // Grows the workspaces the backend keeps for large ops (beyond the caller's scratch) to what
  // any forward within `shape` asks for, so no op of such a step allocates. Not while a step is
  // being recorded. The default has none to grow (the CPU backend works in the caller's scratch
  // and host vectors).
  virtual void reserve_step_workspaces(const StepShape& shape) { (void)shape; }

  // ---- recorded op sequences (CUDA graphs) ----
  // Devices that can record the ops issued between begin_recording() and end_recording() and
  // replay them with one launch return true here. A replay runs the same ops with the same
  // arguments; only the contents of the memory they point to may differ. Recording does not
  // run the ops. Nothing else may use the backend while recording.
  virtual bool can_record() const { return false; }
  virtual void begin_recording() {}
  // The id of the recorded sequence; `keep` false discards it (after a failed op) and returns -1.
  virtual int64_t end_recording(bool keep) {
    (void)keep;
    return -1;
  }
  virtual void replay(int64_t id) { (void)id; }
  virtual void forget_recording(int64_t id) { (void)id; }
  // Counts the frees of device memory. A recording made at an earlier count may hold pointers to
  // memory that is gone or handed out again (a workspace that grew, the caches of an engine that
  // ended): its owner must not replay it.
  virtual uint64_t memory_epoch() const { return 0; }

  // ---- elementwise and normalisation ----
  // out[i, :] = table row ids[i] (dequantized), for i < n. `table` has rows = vocab.
  virtual void embed(const Weight& table, const int32_t* ids, int n, float* out) = 0;
  // out = x / sqrt(mean(x^2) + eps) * w over rows of `dim` elements; `w` is the plain multiplier
  // (zero-centered checkpoint norms are stored as 1+w at load). out may alias x.
  virtual void rmsnorm(const float* x, const float* w, float* out, int64_t rows, int dim,
                       float eps) = 0;
  // Gated RMSNorm per head: out = w * rmsnorm(o) * silu(z); rows = tokens*heads of `dim`.
  virtual void rmsnorm_gated(const float* o, const float* z, const float* w, float* out,
                             int64_t rows, int dim, float eps) = 0;
  // Residual add then norm, one pass: x += y; out = rmsnorm(x) * w (rows of `dim`). out must not
  // alias x or y. The default composes add() and rmsnorm(); backends fuse it.
  virtual void add_rmsnorm(float* x, const float* y, const float* w, float* out, int64_t rows,
                           int dim, float eps) {
    add(x, y, rows * dim);
    rmsnorm(x, w, out, rows, dim, eps);
  }
  // x = x / sqrt(sum(x^2) + eps) * scale over rows of `dim` (GDN q/k normalisation).
  virtual void l2norm(float* x, int64_t rows, int dim, float eps, float scale) = 0;
  // out[r, :cols] = src[r * src_stride + :cols] for r < rows (dst rows packed with dst_stride).
  virtual void copy_rows(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                         int64_t rows, int64_t cols) = 0;
  // out[i, :] = x[rows[i], :] for i < n.
  virtual void gather_rows(const float* x, int dim, const int32_t* rows, int n, float* out) = 0;
  virtual void add(float* x, const float* y, int64_t n) = 0;  // x += y
  virtual void silu_mul(const float* gate, const float* up, float* out, int64_t n) = 0;
  virtual void sigmoid_mul(float* x, const float* gate, int64_t n) = 0;  // x *= sigmoid(gate)
  // x[r, :] *= sigmoid(gate[r]) for a gate column per row: used by the shared-expert gate.
  virtual void scale_rows_sigmoid(float* x, const float* gate, int64_t rows, int dim) = 0;
  // out[r] = argmax of x[r, :cols] (util/argmax.h: the lowest index of the largest value, NaN
  // skipped except at index 0) for r < rows. Greedy decoding then downloads one id per row
  // instead of rows x vocab logits and scanning them on the host.
  virtual void argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* out) = 0;
  // out[r] = the token picks[r] takes from row r of x[rows, cols] (util/token_pick.h: the argmax
  // for a greedy pick, the seeded min-p / top-k / top-p draw otherwise) for r < rows, each pick
  // one can_pick() accepts. `picks` is host memory, read before the call returns. A step whose
  // rows are all picked here downloads one id per row, not rows x vocab logits. The default
  // takes greedy picks only (argmax_rows).
  virtual void pick_tokens(const float* x, int64_t rows, int64_t cols, const TokenPick* picks,
                           int32_t* out);
  // Applies the penalties of rows[r] to row r of x[n_rows, cols] in place (util/token_pick.h:
  // penalized_logit for each of its entries, plus one more output occurrence of
  // tokens[pending_at] when pending_at >= 0), before pick_tokens. `rows` and `entries` are host
  // memory, read before the call returns; `tokens` (the step's token ids) is backend memory.
  // At most max_penalty_entries() entries a call.
  virtual void penalize_rows(float* x, int64_t n_rows, int64_t cols, const PenaltyRow* rows,
                             const PenaltyEntry* entries, int64_t n_entries,
                             const int32_t* tokens) = 0;
  virtual int64_t max_penalty_entries() const { return INT64_MAX; }
  // Whether pick_tokens makes `pick` over rows of `cols` logits. The default: greedy picks only.
  virtual bool can_pick(const TokenPick& pick, int64_t cols) const {
    (void)cols;
    return pick.greedy();
  }

  // ---- matrices ----
  // out[n, w.rows] = x[n, w.cols] @ W^T (F32 accumulation). For stacked weights, `expert`
  // picks the matrix.
  virtual void linear(const float* x, int64_t n, const Weight& w, float* out, int expert = 0) = 0;

  // Several linears of the same input in one call: outs[i][n, ws[i].rows] = x @ ws[i]^T for
  // i < count (plain matrices, possibly of different formats). Decode runs one kernel over the
  // matrices of each format instead of one per matrix. The default calls linear() for each.
  virtual void linear_multi(const float* x, int64_t n, const Weight* const* ws, float* const* outs,
                            int count) {
    for (int i = 0; i < count; ++i) linear(x, n, *ws[i], outs[i]);
  }

  // x += y (when y is not null), h = rmsnorm(x) * w over rows of `dim`, then outs[i] = h @ ws[i]^T
  // as linear_multi: the norm that starts a block and the block's input projections. keep_h:
  // whether the caller reads h afterwards; without it h is workspace a backend may leave
  // unwritten (when its norm's kernel feeds the matrices directly). The default runs add_rmsnorm
  // (or rmsnorm), then linear_multi; a backend may prepare its matrix kernels' input in the
  // norm's kernel.
  virtual void rmsnorm_linear_multi(float* x, const float* y, const float* w, float* h, bool keep_h,
                                    int64_t rows, int dim, float eps, const Weight* const* ws,
                                    float* const* outs, int count) {
    (void)keep_h;
    if (y != nullptr) {
      add_rmsnorm(x, y, w, h, rows, dim, eps);
    } else {
      rmsnorm(x, w, h, rows, dim, eps);
    }
    linear_multi(h, rows, ws, outs, count);
  }

  // out[n, w.rows] = g @ W^T with g = rmsnorm_gated(o, z, norm_w) over `heads` heads of `dim`
  // per row (g [n, heads * dim] is written to `normed`): the GDN output projection. The default
  // runs rmsnorm_gated, then linear.
  virtual void rmsnorm_gated_linear(const float* o, const float* z, const float* norm_w,
                                    float* normed, int64_t n, int heads, int dim, float eps,
                                    const Weight& w, float* out) {
    rmsnorm_gated(o, z, norm_w, normed, n * heads, dim, eps);
    linear(normed, n, w, out);
  }

  // out[n, w.rows] = (x * sigmoid(gate)) @ W^T, x and gate [n, w.cols]: the gated attention
  // output's projection. x may hold the product afterwards (the default multiplies in place,
  // then runs linear).
  virtual void sigmoid_mul_linear(float* x, const float* gate, int64_t n, const Weight& w,
                                  float* out) {
    sigmoid_mul(x, gate, n * w.cols);
    linear(x, n, w, out);
  }

  // out[n, w.rows] = (silu(gate) * up) @ W^T, gate and up [n, w.cols]: an MLP's down
  // projection. act [n, w.cols] receives silu(gate) * up unless the backend feeds the product
  // to its matrix kernel directly (then act is left as it was). The default runs silu_mul, then
  // linear.
  virtual void silu_mul_linear(const float* gate, const float* up, int64_t n, const Weight& w,
                               float* out, float* act) {
    silu_mul(gate, up, act, n * w.cols);
    linear(act, n, w, out);
  }

  // ---- attention ----
  // Whether kv_append, attention_front and attention take caches of this element type.
  virtual bool supports_kv_dtype(DType dtype) const { return dtype == DType::F32; }
  // NeoX rotary embedding in place on the first rot_dim dims of each head:
  // x is [n_tokens, heads, row_stride...]: head h of token t starts at t*token_stride + h*head_dim.
  virtual void rope(float* x, const int32_t* positions, int n_tokens, int heads, int head_dim,
                    int64_t token_stride, int rot_dim, float theta) = 0;
  // Writes k, v rows ([n_tokens, kv_heads, head_dim]) into their cache slots:
  // token i goes to position positions[i] of its sequence (found through seqs.cu_seqlens).
  virtual void kv_append(const KVLayerView& kv, const KVPaging& paging, const SeqLayout& seqs,
                         const float* k, const float* v) = 0;
  // The attention layer's front. qp is q_proj's output [n_tokens, heads * head_dim * (gated ?
  // 2 : 1)], per head [query | gate] when gated; q gets the queries [n_tokens, heads, head_dim]
  // (qp may be q when not gated) and gate the gates (gated only). q and k ([n_tokens, kv_heads,
  // head_dim], in place) are RMS-normalised per head (q_norm, k_norm, eps) and rotated (rope
  // at seqs.positions), then k and v are appended to the cache. The default runs copy_rows,
  // rmsnorm, rope and kv_append one by one; a backend may fuse them (within F32 rounding).
  virtual void attention_front(const KVLayerView& kv, const KVPaging& paging, const SeqLayout& seqs,
                               const float* qp, bool gated, const float* q_norm,
                               const float* k_norm, float eps, int heads, int rot_dim, float theta,
                               float* q, float* gate, float* k, const float* v) {
    const int D = kv.head_dim, T = seqs.n_tokens;
    const int64_t QD = int64_t{heads} * D;
    if (gated) {
      copy_rows(qp, 2 * D, q, D, int64_t{T} * heads, D);
      copy_rows(qp + D, 2 * D, gate, D, int64_t{T} * heads, D);
    } else if (qp != q) {
      copy_rows(qp, QD, q, QD, T, QD);
    }
    rmsnorm(q, q_norm, q, int64_t{T} * heads, D, eps);
    rmsnorm(k, k_norm, k, int64_t{T} * kv.kv_heads, D, eps);
    rope(q, seqs.positions, T, heads, D, QD, rot_dim, theta);
    rope(k, seqs.positions, T, kv.kv_heads, D, int64_t{kv.kv_heads} * D, rot_dim, theta);
    kv_append(kv, paging, seqs, k, v);
  }
  // Attention may use a caller-provided workspace (backend memory) for split-context decoding.
  // attention_workspace_floats says how much a call of this size wants (0: none);
  // set_attention_workspace hands it over until the next call of it. A call whose workspace is
  // missing or too small still computes the same result, by a slower path.
  virtual size_t attention_workspace_floats(int n_tokens, int heads, int head_dim,
                                            int context_capacity) const {
    (void)n_tokens, (void)heads, (void)head_dim, (void)context_capacity;
    return 0;
  }
  // At least attention_workspace_floats(t, heads, head_dim, c) for every t <= max_tokens and
  // c <= max_context_capacity: what a caller reserves for every step up to that shape. The
  // default takes the largest over t at max_context_capacity, which suffices when the workspace
  // does not shrink as the capacity grows; a backend whose workspace can shrink overrides it.
  virtual size_t max_attention_workspace_floats(int max_tokens, int heads, int head_dim,
                                                int max_context_capacity) const {
    size_t most = 0;
    for (int t = 1; t <= max_tokens; ++t) {
      most = std::max(most, attention_workspace_floats(t, heads, head_dim, max_context_capacity));
    }
    return most;
  }
  virtual void set_attention_workspace(float* p, size_t floats) { (void)p, (void)floats; }
  // Causal GQA attention of each new query row against its sequence's cached keys up to and
  // including its own position: q [n_tokens, heads, head_dim], out [n_tokens, heads, head_dim].
  virtual void attention(const KVLayerView& kv, const KVPaging& paging, const SeqLayout& seqs,
                         const float* q, int heads, float scale, float* out) = 0;
  // An attention layer past its front: o = attention(q) as above, then out[n_tokens, w.rows] =
  // (o * sigmoid(gate)) @ W^T, or o @ W^T when gate is null (gate and o [n_tokens, heads *
  // head_dim]). A backend may fuse the gate and the projection's input preparation into the
  // attention; o's contents are then unspecified.
  virtual void attention_out(const KVLayerView& kv, const KVPaging& paging, const SeqLayout& seqs,
                             const float* q, int heads, float scale, const float* gate,
                             const Weight& w, float* o, float* out) {
    attention(kv, paging, seqs, q, heads, scale, o);
    if (gate != nullptr) {
      sigmoid_mul_linear(o, gate, seqs.n_tokens, w, out);
    } else {
      linear(o, seqs.n_tokens, w, out);
    }
  }

  // ---- Gated DeltaNet ----
  // Causal depthwise conv over each sequence's rows followed by SiLU, continuing from and
  // updating the sequence's conv state. x, out: [n_tokens, channels]; weight: [channels, kernel]
  // F32. slots[s] is the state slot of sequence s.
  virtual void conv1d_silu(const GDNStateView& st, const SeqLayout& seqs, const int32_t* slots,
                           const float* x, const float* weight, float* out) = 0;
  // Gated delta rule over each sequence's rows, continuing from and updating its state:
  // q, k [n_tokens, k_heads, k_dim] (already normalised), v [n_tokens, v_heads, v_dim],
  // g (log decay) and beta [n_tokens, v_heads], out [n_tokens, v_heads, v_dim].
  // When step_states != nullptr, the state after each row t is also written to
  // step_states[t] ([n_tokens, v_heads, k_dim, v_dim]) for speculative rollback.
  virtual void gated_delta_rule(const GDNStateView& st, const SeqLayout& seqs, const int32_t* slots,
                                const float* q, const float* k, const float* v, const float* g,
                                const float* beta, float* out, float* step_states) = 0;
  // g = -exp(A_log) * softplus(a + dt_bias); beta = sigmoid(b); a, b, g, beta: [n, heads].
  virtual void gdn_gates(const float* a, const float* b, const float* a_log, const float* dt_bias,
                         float* g, float* beta, int64_t n, int heads) = 0;
  // The GDN layer's front: conv1d_silu of the in-projection's qkv rows into conv_out ([n_tokens,
  // channels], channels = [q | k | v]), then q = l2norm(conv q) / sqrt(k_dim), k = l2norm(conv
  // k) (eps 1e-6), v = conv v, packed [n_tokens, heads, dim], and gdn_gates(a, b) over v_heads.
  // The default runs those ops one by one; a backend may fuse them (few launches per decode
  // step), agreeing within F32 rounding. conv_out may then be left unwritten.
  virtual void gdn_front(const GDNStateView& st, const SeqLayout& seqs, const int32_t* slots,
                         const float* qkv, const float* conv_weight, const float* a, const float* b,
                         const float* a_log, const float* dt_bias, float* conv_out, float* q,
                         float* k, float* v, float* g, float* beta) {
    const int64_t T = seqs.n_tokens, C = st.channels;
    const int64_t qk = int64_t{st.k_heads} * st.k_dim, vd = int64_t{st.v_heads} * st.v_dim;
    conv1d_silu(st, seqs, slots, qkv, conv_weight, conv_out);
    copy_rows(conv_out, C, q, qk, T, qk);
    copy_rows(conv_out + qk, C, k, qk, T, qk);
    copy_rows(conv_out + 2 * qk, C, v, vd, T, vd);
    l2norm(q, T * st.k_heads, st.k_dim, 1e-6f, 1.0f / std::sqrt(static_cast<float>(st.k_dim)));
    l2norm(k, T * st.k_heads, st.k_dim, 1e-6f, 1.0f);
    gdn_gates(a, b, a_log, dt_bias, g, beta, T, st.v_heads);
  }

  // A GDN layer's mixer after its input projections: gdn_front, gated_delta_rule (no step
  // states), then rmsnorm_gated_linear into out [n_tokens, hidden]. The default runs those ops; a
  // backend may fuse the front, the rule and the gated norm (decode: one launch instead of three)
  // and leave io's intermediates other than `normed` unwritten, agreeing within F32 rounding.
  virtual void gdn_mixer(const GDNStateView& st, const SeqLayout& seqs, const int32_t* slots,
                         const GdnMixerWeights& w, const GdnMixerIo& io, float* out);

  // ---- mixture of experts ----
  // Router: probabilities = softmax(logits) over E experts per row; picks the top k; weights are
  // renormalised to sum to 1 when `renormalize`. ids [n, k] int32, weights [n, k] F32.
  virtual void topk_softmax(const float* logits, int64_t n, int experts, int k, bool renormalize,
                            int32_t* ids, float* weights) = 0;
  // out[n, hidden] = sum_j weights[i, j] * down_e(silu(gate_e x) * up_e x) with e = ids[i, j],
  // plus, with a shared expert, sigmoid(shared->gate_logit[i]) * its own down(silu(gate x) * up x).
  // gate, up: [E, inter, hidden]; down: [E, hidden, inter]. `scratch` holds at least
  // moe_scratch_floats(...) floats.
  virtual void moe(const float* x, int64_t n, int k, const int32_t* ids, const float* weights,
                   const Weight& gate, const Weight& up, const Weight& down,
                   const SharedExpert* shared, float* out, float* scratch) = 0;
  // The dense MLP block of n rows: x += y (when y is not null), h = rmsnorm(x) * b.norm, then
  // out = down(silu(gate(h)) * up(h)). The default runs rmsnorm_linear_multi and
  // silu_mul_linear; a backend may keep the intermediates in its own formats (s is workspace).
  virtual void mlp_block(float* x, const float* y, int64_t n, int hidden, const MlpBlockWeights& b,
                         const MlpBlockScratch& s, float* out);
  // The MoE block of n rows: x += y (when y is not null), h = rmsnorm(x) * b.norm, the router's
  // logits of h (and the shared expert's gate logit), topk_softmax,
  // then moe(h, ...) into out. The default runs those ops; a backend may fuse the norm, router
  // and top-k (decode: one launch instead of four) as long as it picks the same experts.
  virtual void moe_block(float* x, const float* y, int64_t n, int hidden, const MoeBlockWeights& b,
                         const MoeBlockScratch& s, float* out);
  // rmsnorm_linear_multi with a deferred MoE output (MoeBlockScratch::defer) as its residual,
  // and x += that output. Only a backend whose moe_block defers is given one; `out` is where
  // the block's output would have gone (the backend may combine into it first).
  virtual void rmsnorm_linear_multi_moe(float* x, const MoeRows& y, float* out, const float* w,
                                        float* h, bool keep_h, int64_t rows, int dim, float eps,
                                        const Weight* const* ws, float* const* outs, int count);
  virtual void add_moe(float* x, const MoeRows& y, float* out, int64_t rows, int dim);

 protected:
  // out += the shared expert's gated output, composed of the ops above (for backends and weight
  // formats with no fused form). Uses n*(2*inter + hidden) floats of scratch.
  void add_shared_expert(const float* x, int64_t n, const SharedExpert& shared, float* out,
                         float* scratch);
};

}  // namespace tokenmill
