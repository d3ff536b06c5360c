// The CPU backend: the reference implementation of every Backend op (backend/backend.h).
// Threaded over a caller-owned ThreadPool, F32 accumulation, quantized weights dequantized on
// the fly inside the matmul (never a full-precision copy of a weight). upload_weight copies a
// checkpoint's weights out of the loader's mapping into huge pages (cpu_memory.h).
//
// Ops are split by topic: cpu_backend.cpp (memory, scratch), cpu_elementwise.cpp,
// cpu_linear*.cpp (GEMV for <= 8 rows, cache-blocked GEMM above), cpu_attention.cpp,
// cpu_gdn.cpp, cpu_moe.cpp. Kernels are templates over an ISA (cpu_simd.h); the portable
// scalar instantiation is selectable at runtime so tests cover it too.
#pragma once

#include <memory>
#include <vector>

#include "backend/alloc_stats.h"
#include "backend/backend.h"
#include "backend/cpu/cpu_memory.h"
#include "util/thread_pool.h"

namespace tokenmill {
namespace cpu {
struct LinearTask;
}

// The backend the rest of the program uses. `pool` must outlive it.
std::unique_ptr<Backend> make_cpu_backend(ThreadPool& pool);

struct CpuBackendOptions {
  // Run the portable scalar kernels even when SIMD ones are compiled in (tests, debugging).
  bool scalar_kernels = false;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(ThreadPool& pool, CpuBackendOptions options = {});
  ~CpuBackend() override;

  std::string name() const override;
  // "avx512", "avx2" or "scalar": the kernels this instance runs.
  const char* isa() const;
  // Rows per linear() call at or below which the fused GEMV path runs (above: GEMM).
  static constexpr int64_t kGemvMaxRows = 8;

  void* alloc(size_t bytes) override;
  void free(void* p) override;
  int64_t peak_allocated_bytes() const override { return alloc_stats_.peak(); }
  int64_t allocation_count() const override { return alloc_stats_.count(); }
  void upload(void* dst, const void* src, size_t bytes) override;
  void download(void* dst, const void* src, size_t bytes) override;
  void fill_zero(void* dst, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void synchronize() override {}
  Weight upload_weight(const Weight& host) override;
  void fill_random(void* dst, DType dtype, int64_t n, float stddev, uint64_t seed) override;
  void read_probe(const void* src, size_t bytes, void* sink) override;

  void embed(const Weight& table, const int32_t* ids, int n, float* out) override;
  void rmsnorm(const float* x, const float* w, float* out, int64_t rows, int dim,
               float eps) override;
  void rmsnorm_gated(const float* o, const float* z, const float* w, float* out, int64_t rows,
                     int dim, float eps) override;
  void add_rmsnorm(float* x, const float* y, const float* w, float* out, int64_t rows, int dim,
                   float eps) override;
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

  void linear(const float* x, int64_t n, const Weight& w, float* out, int expert = 0) override;
  // Decode (n <= kGemvMaxRows): one parallel GEMV over the rows of all the matrices, with x
  // prepared once per weight layout. Larger n: linear() per matrix.
  void linear_multi(const float* x, int64_t n, const Weight* const* ws, float* const* outs,
                    int count) override;

  void rope(float* x, const int32_t* positions, int n_tokens, int heads, int head_dim,
            int64_t token_stride, int rot_dim, float theta) override;
  bool supports_kv_dtype(DType dtype) const override;
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

  void topk_softmax(const float* logits, int64_t n, int experts, int k, bool renormalize,
                    int32_t* ids, float* weights) override;
  void moe(const float* x, int64_t n, int k, const int32_t* ids, const float* weights,
           const Weight& gate, const Weight& up, const Weight& down, const SharedExpert* shared,
           float* out, float* scratch) override;

  // Rows per sequence at or above which gated_delta_rule uses the chunked form (when no
  // per-step states are requested); exposed so tests can force either path.
  void set_gdn_chunk_threshold(int rows) { gdn_chunk_threshold_ = rows; }

 private:
  // Host scratch, grown only at the start of an op (never inside a hot loop): one buffer per
  // pool thread, and one shared by all threads for per-call prepared inputs.
  float* thread_scratch(int worker) { return thread_scratch_[static_cast<size_t>(worker)].data(); }
  void reserve_thread_scratch(size_t floats);
  float* shared_scratch(size_t floats);
  // Linear over a row range of a matrix with explicit row strides, for linear() and moe().
  void linear_strided(const float* x, int64_t ldx, int64_t n, const Weight& w, int expert,
                      float* out, int64_t ldo);

  ThreadPool& pool_;
  CpuBackendOptions options_;
  std::unique_ptr<cpu::HostMemory> memory_;  // what alloc() hands out (cpu_memory.h)
  AllocStats alloc_stats_;
  int gdn_chunk_threshold_ = 64;
  std::vector<cpu::AlignedVector<float>> thread_scratch_;  // 64-byte aligned (cpu_memory.h)
  cpu::AlignedVector<float> shared_;
  std::vector<int32_t> index_scratch_;
  std::vector<int64_t> attn_first_;   // attention: first work item of each token
  std::vector<int32_t> moe_rows_;     // per (token, slot): its row in the expert-sorted order
  std::vector<int64_t> moe_offsets_;  // [experts + 1] first sorted row of each expert
  std::vector<int64_t> moe_fill_;
  std::vector<cpu::LinearTask> tasks_;
  std::vector<void*> weights_;  // upload_weight's copies, freed with the backend
};

}  // namespace tokenmill
