// Internal to backend/cuda: the CudaBackend class. Plain C++ (no CUDA headers: the stream is
// held through the runtime's opaque struct type) so both the .cpp and the .cu files include it.
// Op implementations are split by topic: cuda_backend.cpp (memory, weights), cuda_fill.cu
// (random fill, read probe), cuda_linear.cu (generic GEMV, GEMM, embed), cuda_gemv.cu (fast
// decode GEMV; cuda_l2_prefetch.cpp, the order it prefetches the next matrix by),
// cuda_attention.cu (decode; cuda_attention_combine.cu), cuda_attention_prefill.cu, cuda_gdn.cu,
// cuda_gdn_chunked.cu (prefill), cuda_elementwise.cu, cuda_pick.cu (sampling), cuda_moe.cu.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/alloc_stats.h"
#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_l2_prefetch.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*
struct CUevent_st;   // cudaEvent_t is CUevent_st*

namespace tokenmill {

namespace cuda {
struct DevMat;
struct Q4Act;
struct Q4Picks;
struct GemvJobs;

// Device memory the decode GEMVs work in, allocated once by the backend: prepared 4-bit
// activations, stream-K partials and counters (counters zero between launches), and the
// device's SM count.
struct GemvWorkspace {
  void* act = nullptr;
  size_t act_bytes = 0;
  float* partials = nullptr;
  size_t partial_floats = 0;
  int* counters = nullptr;
  int* ticket = nullptr;  // one more counter: the last-block tickets (moe_block's front)
  int64_t max_warps = 0;  // counters and partial slots exist for this many warps
  int sm_count = 0;
  bool wgmma = false;  // an sm_90 device: the wgmma kernels (sm_90a machine code) run on it
  void* encode_tiled = nullptr;  // the driver's cuTensorMapEncodeTiled (wgmma devices)
  // BatchPrecision::kFast: the 17-64-row wgmma GEMV multiplies F16 weights by F16 activations
  // in one pass (cuda_gemv_q4g.cu).
  bool fast_gmma = false;
};

// gdn_mixer's decode kernel (cuda_gdn_decode.cu): allows its non-portable cluster sizes and
// returns the largest cluster (a multiple of 4 blocks, at most 16) the device can run.
int init_gdn_mixer();

// Causal GQA attention on the tensor cores (cuda_attention_prefill.cu) for head_dim 32, 64, 128
// or 256 and up to 8 query heads per kv head; false, launching nothing, for other shapes.
// fast: one F16 pass per product (PrefillPrecision::kFast) instead of three.
bool launch_attention_prefill(CUstream_st* st, const KVLayerView& kv, const KVPaging& pg,
                              const SeqLayout& seqs, const float* q, int heads, float scale,
                              float* out, bool fast);
// The fast prefill attention on wgmma (cuda_attention_prefill_wg.cu; sm_90, BF16 caches,
// head_dim 128 or 256, even groups up to 8): the workspace its F16 copy of every sequence's
// context takes (n_seqs x max_context_len rows of K and V), 0 where it does not take the shape;
// and the launch into that workspace (false, launching nothing, where it does not).
size_t attention_prefill_wg_kv16_bytes(const KVLayerView& kv, const KVPaging& pg,
                                       const SeqLayout& seqs, int heads);
bool launch_attention_prefill_wg(CUstream_st* st, const KVLayerView& kv, const KVPaging& pg,
                                 const SeqLayout& seqs, const float* q, int heads, float scale,
                                 float* out, void* kv16, void* encode_tiled);

// The first pass of split-context decode attention on the tensor cores
// (cuda_attention_split_tc.cu), for BF16 caches, head_dim 128 or 256 and up to 8 query heads
// per kv head, on sm_90: writes per-split partials into ws in the layout the combine kernel
// reads, with at most max_splits splits per row. Returns the splits used, or 0, launching
// nothing, for other shapes.
int launch_attention_split_tc(CUstream_st* st, const KVLayerView& kv, const KVPaging& pg,
                              const SeqLayout& seqs, const float* q, int heads, float scale,
                              int max_splits, float* ws, int sm_count,
                              const L2Spans* next = nullptr);

// Split-context decode attention: at most this many splits per query row (the combine's
// shared memory holds a row's weights).
constexpr int kMaxSplits = 256;
// Its second pass (cuda_attention_combine.cu): the partials of `splits` splits of rows * heads
// (query row, head) pairs in ws, head_dim D (128 or 256), into out (rows x heads x D), or with a
// gate: out * sigmoid(gate) as the digits act of a 4-bit output projection (out unused).
void launch_attention_combine(CUstream_st* st, const float* ws, int splits, int D, int rows,
                              int heads, float* out, const float* gate, const Q4Act& act);

// The gated delta rule in chunks of 64 tokens (cuda_gdn_chunked.cu). Workspace it needs (floats)
// for k_dim 4..128 (a multiple of 4) and v_dim 1..128; 0 for shapes it does not take.
size_t delta_rule_chunked_ws_floats(const GDNStateView& state, const SeqLayout& seqs);
// Launches it; false, launching nothing, for a shape it does not take, a workspace shorter than
// delta_rule_chunked_ws_floats, or q, k or ws not 16-byte aligned. fast: the walk's products in
// one TF32 pass (PrefillPrecision::kFast) instead of three.
bool launch_delta_rule_chunked(CUstream_st* st, const GDNStateView& state, const SeqLayout& seqs,
                               const int32_t* slots, const float* q, const float* k, const float* v,
                               const float* g, const float* beta, float* out, float* ws,
                               size_t ws_floats, bool fast);

// pick_tokens' sampled rows and penalize_rows (cuda_pick.cu): the workspace they need (allocated
// once, zeroed) and the picks it makes (greedy ones always; sampled ones with 1 <= top_k <= 128
// below the width).
size_t pick_workspace_bytes();
bool pick_supported(const TokenPick& pick, int64_t cols);
int64_t penalty_max_entries();  // penalize_rows' entries a call
}  // namespace cuda

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, PrefillPrecision prefill_precision, bool l2_prefetch,
              BatchPrecision batch_precision);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override;
  // Activation rows at or below which linear() runs the fused GEMV (each weight byte read
  // once for all rows; 4-bit weights: up to cuda::kQ4GemvMaxRows); above, the tiled GEMM.
  static constexpr int64_t kGemvMaxRows = 16;

  int64_t free_memory_bytes() const override;
  int64_t peak_allocated_bytes() const override { return alloc_stats_.peak(); }
  int64_t allocation_count() const override { return alloc_stats_.count(); }
  // Grows gemm_x_ and gdn_ws_ to what the largest step of `shape` asks (the same sizes as
  // gemm() and gated_delta_rule() compute), so steps within it never grow them.
  void reserve_step_workspaces(const StepShape& shape) override;
  void* alloc(size_t bytes) override;
  void free(void* p) override;
  void upload(void* dst, const void* src, size_t bytes) override;
  void download(void* dst, const void* src, size_t bytes) override;
  int64_t begin_download(void* dst, const void* src, size_t bytes) override;
  void finish_download(int64_t ticket) override;
  void register_host(void* p, size_t bytes) override;
  void unregister_host(void* p) override;
  void fill_zero(void* dst, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void synchronize() override;
  // 4-bit weights are repacked into the tile layout of cuda_q4_pack.cu (kQ4TilePacking).
  Weight upload_weight(const Weight& host) override;
  Weight pack_weight(const Weight& w) override;
  bool can_record() const override { return true; }
  bool runs_asynchronously() const override { return true; }
  void begin_recording() override;
  int64_t end_recording(bool keep) override;
  void replay(int64_t id) override;
  void forget_recording(int64_t id) override;
  uint64_t memory_epoch() const override { return memory_epoch_; }
  void fill_random(void* dst, DType dtype, int64_t n, float stddev, uint64_t seed) override;
  void read_probe(const void* src, size_t bytes, void* sink) override;

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
  void rmsnorm_linear_multi_moe(float* x, const MoeRows& y, float* out, const float* w, float* h,
                                bool keep_h, int64_t rows, int dim, float eps,
                                const Weight* const* ws, float* const* outs, int count) override;
  void add_moe(float* x, const MoeRows& y, float* out, int64_t rows, int dim) override;
  void gdn_mixer(const GDNStateView& st, const SeqLayout& seqs, const int32_t* slots,
                 const GdnMixerWeights& w, const GdnMixerIo& io, float* out) override;
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
  bool supports_kv_dtype(DType dtype) const override {
    return dtype == DType::F32 || dtype == DType::BF16;
  }
  PrecisionModes precision_modes() const override {
    return {prefill_precision_ == PrefillPrecision::kFast, gemv_ws_.fast_gmma && gemv_ws_.wgmma};
  }
  void kv_append(const KVLayerView& kv, const KVPaging& paging, const SeqLayout& seqs,
                 const float* k, const float* v) override;
  size_t attention_workspace_floats(int n_tokens, int heads, int head_dim,
                                    int context_capacity) const override;
  size_t max_attention_workspace_floats(int max_tokens, int heads, int head_dim,
                                        int max_context_capacity) const override;
  void set_attention_workspace(float* p, size_t floats) override {
    attn_ws_ = p;
    attn_ws_floats_ = floats;
  }
  void attention(const KVLayerView& kv, const KVPaging& paging, const SeqLayout& seqs,
                 const float* q, int heads, float scale, float* out) override;
  void attention_out(const KVLayerView& kv, const KVPaging& paging, const SeqLayout& seqs,
                     const float* q, int heads, float scale, const float* gate, const Weight& w,
                     float* o, float* out) override;

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
  void moe_block(float* x, const float* y, int64_t n, int hidden, const MoeBlockWeights& b,
                 const MoeBlockScratch& s, float* out) override;
  void mlp_block(float* x, const float* y, int64_t n, int hidden, const MlpBlockWeights& b,
                 const MlpBlockScratch& s, float* out) override;

  CUstream_st* stream() const { return stream_; }

 private:
  // Prefill GEMM on tensor cores (cuda_gemm.cu): out[n, rows] = x[n, cols] . m^T. In two halves
  // for matrices that share x (linear_multi): gemm_split writes x's F16 parts (`parts` of the
  // most any of them takes, gemm_parts) to the workspace once, gemm_split_done multiplies one
  // matrix by them; anything between the two must leave gemm_x_ and gemm_consts_ alone.
  // gemm_abs_max (op 1: out = silu(x) * y, op 2: x *= sigmoid(y), then) finds the scale
  // gemm_split uses, so a gate before a GEMM needs no pass of its own (max_done: already found).
  void gemm(const float* x, int64_t n, const cuda::DevMat& m, float* out);
  int gemm_parts(const cuda::DevMat& m) const;
  void gemm_abs_max(int op, float* x, const float* y, float* out, int64_t elems);
  void gemm_split(const float* x, int64_t n, int64_t K, int parts, bool max_done = false);
  // parts 0 (gemm_parts: fast mode, BF16 weights read in place): x goes to the workspace as
  // BF16 instead, in one pass with its gate (op as gemm_abs_max's); no scale, no F32 product.
  // gemm_gate_split is either form of a gate and the split.
  void gemm_to_bf16(int op, const float* x, const float* y, int64_t n, int64_t K);
  // gemm_x_ grown for [n][K] BF16 activations (__nv_bfloat16), the form gemm_split_done takes
  // with split_parts 0.
  void* gemm_bf16_input(int64_t n, int64_t K);
  // The norms (x += y when y is given) with, when to_gemm, their output also written as a BF16
  // prefill GEMM's activations (gemm_bf16_input; alpha 1): the norm's kernel replaces
  // gemm_to_bf16's pass (and out may then be null: the BF16 rows only). With to_gemm, false
  // (nothing launched) where the fused form does not apply.
  bool launch_rmsnorm(float* x, const float* y, const float* w, float* out, int64_t rows, int dim,
                      float eps, bool to_gemm);
  bool launch_rmsnorm_gated(const float* o, const float* z, const float* w, float* out,
                            int64_t rows, int dim, float eps, bool to_gemm);
  void gemm_gate_split(int op, float* x, const float* y, float* act, int64_t n, int64_t K,
                       int parts);
  // Whether linear() takes the prefill GEMM at n rows.
  bool gemm_rows(int64_t n) const;
  void gemm_split_done(int64_t n, const cuda::DevMat& m, int parts, int split_parts, float* out);
  // A BF16 weight (gemm_parts 0) times the BF16 activations in the workspace, the product
  // rounded to BF16: out16 [n][m.rows] (__nv_bfloat16).
  void gemm_bf16_product(int64_t n, const cuda::DevMat& m, void* out16);
  // The down projection's BF16 activations bf16(silu(gate) * up) from BF16 gate and up rows of
  // K values into the workspace (gemm_bf16_input), alpha 1.
  void gemm_silu_mul_bf16(const void* gate16, const void* up16, int64_t n, int64_t K);
  bool norm_into_bf16_gemms(float* x, const float* y, const float* w, float* h, int64_t rows,
                            int dim, float eps, const Weight* const* ws, float* const* outs,
                            int count);
  // next: a matrix the split pass starts towards L2 (the output projection after it), or null.
  int attention_split(const KVLayerView& kv, const KVPaging& paging, const SeqLayout& seqs,
                      const float* q, int heads, float scale, const cuda::L2Spans* next = nullptr);
  // Whether the 4-bit digit GEMV takes `m` over n rows of K values prepared by a kernel that
  // writes `unit` values in one piece (whole groups of m).
  bool q4_digit_gemv_takes(const cuda::DevMat& m, int64_t n, int64_t K, int64_t unit) const;
  // The 4-bit digit GEMV of one matrix over n rows whose digits are already in `act`.
  void q4_gemv_prepared(const cuda::DevMat& m, const cuda::Q4Act& act, int64_t n, float* out);
  bool gated_q4_linear(const float* x, const float* y, bool sigmoid_gate, int64_t n,
                       const Weight& w, float* out);
  // moe, with x's 4-bit digits already in the GEMV workspace when `prepared` is given
  // (moe_block's fused front; used when the slot kernels take all n rows in one piece).
  // defer: as MoeBlockScratch::defer (the slot kernels' decode rows may leave their combine).
  // picks: the router's top-k (into ids and weights) and a residual add not yet made
  // (moe_block's front left them to the gate/up launch); made first where another path runs.
  void moe_experts(const float* x, int64_t n, int k, const int32_t* ids, const float* weights,
                   const Weight& gate, const Weight& up, const Weight& down,
                   const SharedExpert* shared, float* out, float* scratch,
                   const cuda::Q4Act* prepared, MoeRows* defer = nullptr,
                   const cuda::Q4Picks* picks = nullptr);
  // out = the combine of a deferred MoE output (rows of dim).
  void moe_combine_into(const MoeRows& y, int64_t rows, int dim, float* out);
  // rmsnorm_linear_multi; with moe non-null, a deferred MoE output is the residual instead of y
  // (combined into moe_out first where the norm's kernel cannot take it).
  void rmsnorm_linear_multi_impl(float* x, const float* y, const MoeRows* moe, float* moe_out,
                                 const float* w, float* h, bool keep_h, int64_t rows, int dim,
                                 float eps, const Weight* const* ws, float* const* outs, int count);
  // moe's general form: per-slot indexed GEMVs of any fast format, no shared expert.
  void moe_routed_indexed(const float* x, int64_t n, int k, const int32_t* ids,
                          const float* weights, const cuda::DevMat& gate, const cuda::DevMat& up,
                          const cuda::DevMat& down, float* out, float* scratch);
  // The routing ids of `slots` slots brought to the host and counting-sorted by expert
  // (stable): expert e's slots are slot_at[start[e] .. start[e+1]). Fails on an id outside
  // 0..E-1. The one host sync of the prefill MoE forms.
  struct ExpertOrder {
    std::vector<int64_t> start;    // [E + 1]
    std::vector<int32_t> slot_at;  // [slots]
  };
  ExpertOrder expert_order(const int32_t* ids, int64_t slots, int64_t E);
  // moe's prefill form for 4-bit experts: rows grouped by expert on the host, then per piece of
  // rows one wide-GEMV launch per projection over chunks of up to 64 rows of one expert. False
  // (nothing done) while a stream capture runs or the scratch is short.
  bool moe_chunks(const float* x, int64_t n, int k, const int32_t* ids, const float* weights,
                  const cuda::DevMat& mg, const cuda::DevMat& mu, const cuda::DevMat& md,
                  float* out, float* scratch, int64_t scratch_floats);
  // moe's prefill form for other formats: slots grouped by expert on the host, each expert's
  // tokens through its matrices once. False (nothing done) while a stream capture runs or the
  // scratch is short.
  bool moe_grouped(const float* x, int64_t n, int k, const int32_t* ids, const float* weights,
                   const Weight& gate, const Weight& up, const Weight& down, float* out,
                   float* scratch, int64_t scratch_floats);
  void init_gemm();
  void destroy_gemm();
  // A device buffer that grows to the largest size asked of it (`*p`, `*bytes` its current
  // allocation); growing waits for the stream and is refused while a step is being recorded.
  // After reserve_step_workspaces it should not grow (a warning says a step outgrew the shape).
  void* grow_workspace(void** p, size_t* bytes, size_t need, const char* what);
  // Bytes of gemm_x_ gemm() uses at most for n rows of `cols` inputs: one F16 part a value
  // when fast, else kGemmParts (gemm() asks for what its weights need; the reservation for the
  // most).
  size_t gemm_x_bytes(int64_t n, int64_t cols) const;
  // Bytes of gdn_ws_ gated_delta_rule() uses: the chunked form's W, U, P and G when it takes the
  // call (a sequence of kChunkedDeltaMinRows rows or more, no per-row states wanted), else 0.
  static size_t gdn_ws_bytes(const GDNStateView& st, const SeqLayout& seqs, bool step_states);
  static constexpr int kChunkedDeltaMinRows = 64;  // as the CPU backend switches

  int device_ = 0;
  PrefillPrecision prefill_precision_ = PrefillPrecision::kExact;
  std::string device_name_;
  CUstream_st* stream_ = nullptr;
  std::vector<void*> owned_;   // device allocations freed in the destructor
  AllocStats alloc_stats_;     // what alloc() holds (peak_allocated_bytes)
  uint64_t memory_epoch_ = 0;  // frees so far (memory_epoch)
  std::vector<void*> graphs_;  // cudaGraphExec_t of recorded sequences, by id
  bool recording_ = false;     // between begin_recording and end_recording
  // argmax_rows' workspace for rows split over several blocks: each chunk's value and index
  // (kArgmaxWsSlots each) and a counter per row (zero at rest), allocated in the constructor.
  static constexpr int64_t kArgmaxMaxRows = 1024;
  static constexpr int64_t kArgmaxWsSlots = kArgmaxMaxRows * 32;  // cuda::kArgmaxMaxChunks
  float* argmax_ws_ = nullptr;
  void* pick_ws_ = nullptr;  // pick_tokens' (cuda::pick_workspace_bytes, zeroed)
  // The largest thread-block cluster gdn_mixer's decode kernel can launch (0: none).
  int mixer_max_cluster_ = 0;
  // begin_download's pinned staging: a ring of slots, each reused once its ticket is finished
  // (pinned memory lets the copy run after the ops before it without the host waiting).
  struct PendingDownload {
    void* staging = nullptr;  // pinned host memory of `capacity` bytes
    size_t capacity = 0;
    CUevent_st* done = nullptr;
    void* dst = nullptr;
    size_t bytes = 0;
    int64_t ticket = -1;  // -1: the slot is free
  };
  static constexpr int kDownloadSlots = 4;
  PendingDownload downloads_[kDownloadSlots];
  int64_t next_ticket_ = 0;
  // Small uploads (a step's tokens, positions, block tables) go through pinned memory: upload()
  // returns once the bytes are staged and never waits for the device. Two halves; the host
  // enters a half again only after the copies out of it have run (the event recorded when it
  // left that half).
  struct UploadRing {
    char* host = nullptr;  // pinned, 2 * kUploadRingHalf bytes, allocated at the first use
    int half = 0;
    size_t used = 0;
    CUevent_st* left[2] = {nullptr, nullptr};
  };
  UploadRing upload_ring_;
  static constexpr size_t kUploadRingHalf = size_t{1} << 20;
  float* attn_ws_ = nullptr;  // split-context attention partials (set_attention_workspace)
  size_t attn_ws_floats_ = 0;
  // Decode GEMV workspace (allocated once, in the constructor).
  cuda::GemvWorkspace gemv_ws_;
  // Each bf16/8-bit decode GEMV of kL2PrefetchMinSourceBytes or more prefetches the start of
  // the next one's weights into L2 (cuda_l2_prefetch.h), kL2PrefetchBytes of it. H200, batch 1:
  // 27B bf16 (GEMVs of 63-356 MB) 8 MB and 16 MB +2%, 32 MB -2%; 35B-A3B bf16 (1-50 MB) -2%
  // with every launch prefetching, hence the floor. The table holds kL2PrefetchEntries launches
  // (a 64-layer model uses about 260).
  cuda::L2PrefetchChain l2_chain_;
  static constexpr int kL2PrefetchEntries = 4096;
  static constexpr uint64_t kL2PrefetchBytes = uint64_t{8} << 20;
  static constexpr uint64_t kL2PrefetchMinSourceBytes = uint64_t{56} << 20;
  // Sets jobs.next for a bf16/8-bit decode GEMV launch (and learns the launch order).
  void chain_gemv(cuda::GemvJobs& jobs);
  static constexpr size_t kGemvWorkspaceBytes = size_t{16} << 20;
  static constexpr int kMaxGemvSlotFloats = 256;
  // cuBLAS handle, its workspace, {alpha, 0, (unused), max bits} on the device, the F16 weight slab
  // and the F16 activations (grown for long prefills, never while a step is recorded).
  void* cublas_ = nullptr;
  float* gemm_consts_ = nullptr;
  void* gemm_w_ = nullptr;
  void* gemm_x_ = nullptr;
  size_t gemm_x_bytes_ = 0;
  static constexpr size_t kGemmSlabBytes = size_t{256}
                                           << 20;  // gemm_w_: F16 weight rows, all parts
  static constexpr int kGemmParts = 3;             // the most F16 parts a product is split into
  static constexpr size_t kGemmInitialXBytes = size_t{64} << 20;
  static constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
  // The chunked delta rule's W, U, P and G for a prefill call (grown like gemm_x_).
  void* gdn_ws_ = nullptr;
  size_t gdn_ws_bytes_ = 0;
  // The fast wgmma prefill attention's F16 copy of its sequences' contexts (grown like
  // gemm_x_). It is reserved up to this size: 32k positions of the 27B shape (4 kv heads of
  // 256).
  void* kv16_ = nullptr;
  size_t kv16_bytes_ = 0;
  static constexpr size_t kKv16ContextBytes = size_t{128} << 20;
  bool step_reserved_ = false;  // reserve_step_workspaces ran: growth means a missed shape
};

}  // namespace tokenmill
