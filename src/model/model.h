// The Qwen3.5 model (dense and MoE): weights bound from a checkpoint and the forward pass,
// written once against the Backend ops. The model reads caches only through the CacheViews
// the caller passes; it never allocates cache memory or decides what to keep.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/model_config.h"
#include "model/batch.h"
#include "model/weights.h"

namespace tokenmill {

class Checkpoint;

struct ModelOptions {
  bool load_mtp = true;  // bind mtp.* when the checkpoint has them
  // Record decode steps (one token per sequence) once per batch shape and replay them (CUDA
  // graphs) on backends that can: one launch per step instead of hundreds.
  bool record_decode = true;
};

// Sizes the cache manager needs to allocate per-layer stores.
struct CacheGeometry {
  int attention_layers = 0;
  int kv_heads = 0, head_dim = 0;
  int gdn_layers = 0;
  int conv_channels = 0, conv_kernel = 0;
  int k_heads = 0, v_heads = 0, k_dim = 0, v_dim = 0;
  // Bytes per cached position (all attention layers, K and V, elements of kv_dtype).
  int64_t kv_bytes_per_token(DType kv_dtype = DType::F32) const;
  // Bytes of one sequence's recurrent state (all GDN layers: conv window + S, F32).
  int64_t state_bytes_per_seq() const;
};

class Model {
 public:
  // Opens the directory, validates config and weights, and binds every tensor.
  static std::unique_ptr<Model> load(const std::string& dir, Backend& backend,
                                     const ModelOptions& options = {});
  // A model over an already opened (or in-memory) checkpoint.
  static std::unique_ptr<Model> from_checkpoint(std::unique_ptr<Checkpoint> ckpt, Backend& backend,
                                                const ModelOptions& options = {});
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return cfg_; }
  Backend& backend() { return backend_; }
  const ModelWeights& weights() const { return w_; }
  const CacheGeometry& geometry() const { return geo_; }
  const std::string& dir() const { return dir_; }
  bool has_mtp() const { return w_.mtp.present; }

  // Runs the batch. Appends to the KV caches and advances the GDN states of the batch's
  // sequences. Writes logits [batch.logit_rows.size(), vocab] into *logits (host memory) and,
  // when hidden != nullptr, the final-normed hidden states of the same rows [rows, hidden].
  void forward(const Batch& batch, const CacheViews& caches, std::vector<float>* logits,
               std::vector<float>* hidden = nullptr);
  // The same forward, but only each logit row's argmax leaves the device (util/argmax.h; ids
  // [batch.logit_rows.size()] in host memory): what greedy decoding needs, without downloading
  // and scanning rows x vocab logits on the host.
  void forward_greedy(const Batch& batch, const CacheViews& caches, std::vector<int32_t>* ids);

  // Decode-step recordings made (and the host time spent making them) and replays run.
  struct RecordStats {
    int64_t recordings = 0, replays = 0;
    double seconds = 0;
  };
  const RecordStats& record_stats() const { return record_stats_; }

 private:
  Model(Backend& backend, std::unique_ptr<Checkpoint> ckpt, const ModelOptions& options);
  struct Scratch;
  // Returns true when it had to move the scratch (recordings that point into it are stale).
  bool ensure_scratch(int n_tokens, int n_seqs, int n_logit_rows, int max_blocks, int block_size);
  // Uploads the batch and runs its ops (recorded or not); returns the logit rows (left in the
  // scratch). want_hidden: the caller reads the final-normed hidden rows too.
  int run_batch(const Batch& batch, const CacheViews& caches, bool want_hidden);
  // The op sequence of a forward over the uploaded batch (T tokens, R logit rows).
  void run_layers(const CacheViews& caches, int T, int R, bool keep_step_states);
  void forget_recordings();
  // The mixers start from the residual stream s.x: residual (the block before's output, or null
  // for the first layer) is added, then the input norm.
  void attention_block(const LayerWeights& L, int kv_index, const CacheViews& caches, int T,
                       const float* residual);
  void gdn_block(const LayerWeights& L, int gdn_index, const CacheViews& caches, int T,
                 const float* residual, bool keep_step_states);
  void ffn_block(const LayerWeights& L, int T);

  Backend& backend_;
  std::string dir_;
  std::unique_ptr<Checkpoint> ckpt_;
  ModelConfig cfg_;
  std::unique_ptr<WeightStore> store_;
  ModelWeights w_;
  CacheGeometry geo_;
  std::unique_ptr<Scratch> s_;
  ModelOptions options_;
  // Recorded decode steps by shape: (sequences, block-table width, cache identity) -> id.
  std::vector<std::pair<std::vector<uint64_t>, int64_t>> recordings_;
  std::vector<int32_t> padded_tables_;
  RecordStats record_stats_;
};

}  // namespace tokenmill
