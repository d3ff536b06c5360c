// The Qwen3.5 model (dense and MoE): weights bound from a checkpoint and the forward pass,
// written once against the Backend ops. The model reads caches only through the CacheViews
// the caller passes; it never allocates cache memory or decides what to keep.
#pragma once

#include <algorithm>
#include <deque>
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

// How a step's logit rows become tokens on the backend (Model::launch_picks): picks[i] for
// logit row i (empty: all greedy), after penalties[i] (empty: none) over `entries`
// (Backend::penalize_rows). launch_picks fills in each penalized row's pending_at.
struct StepPicks {
  std::vector<TokenPick> picks;
  std::vector<PenaltyRow> penalties;
  std::vector<PenaltyEntry> entries;
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
  // The same forward, but only each logit row's token leaves the device: the one `picks` takes
  // from it (Backend::penalize_rows, then Backend::pick_tokens: the argmax, or a seeded draw;
  // null: all greedy), ids [batch.logit_rows.size()] in host memory. A penalized row whose
  // input token comes from the last step (Batch::tokens_from_last_step) counts it as one more
  // output occurrence: the caller has not seen it yet. What decoding needs without
  // downloading and scanning rows x vocab logits on the host. In two halves, so the host can
  // prepare and launch the next step while this one runs: launch_picks issues the step (its
  // ids' copy to the host included) and returns without waiting where the backend runs
  // asynchronously; collect_picks waits for the ids of the oldest launched step not yet
  // collected. The next batch may take tokens from the ids of the step launched last
  // (Batch::tokens_from_last_step). At most kMaxLaunched steps are launched and not collected;
  // discard_launched() drops them (after a failure).
  void launch_picks(const Batch& batch, const CacheViews& caches, StepPicks* picks = nullptr);
  void collect_picks(std::vector<int32_t>* ids);
  void discard_launched();
  static constexpr int kMaxLaunched = 2;

  // Reserves the scratch and the backend's step workspaces (Backend::reserve_step_workspaces)
  // for every forward of at most max_tokens rows over at most max_seqs sequences whose block
  // tables are at most max_blocks wide (blocks of block_size positions), with any number of
  // logit rows: such forwards allocate nothing. A larger forward still runs (it grows them).
  void reserve_step(int max_tokens, int max_seqs, int max_blocks, int block_size);

  // Logit rows one lm_head pass computes: the forward projects more in passes of this many, so
  // the logits scratch holds [pass, vocab] floats rather than one row per token of a step that
  // scores its whole prompt (GBs at a 248k vocabulary). At least n_seqs: a decode step (one
  // logit row per sequence, the one that is recorded) is one pass.
  static int logit_pass_rows(int n_seqs) { return std::max(kLogitPassRows, n_seqs); }
  static constexpr int kLogitPassRows = 128;

  // Decode-step recordings made (and the host time spent making them) and replays run.
  struct RecordStats {
    int64_t recordings = 0, replays = 0;
    double seconds = 0;
  };
  const RecordStats& record_stats() const { return record_stats_; }

 private:
  Model(Backend& backend, std::unique_ptr<Checkpoint> ckpt, const ModelOptions& options);
  struct Scratch;
  // Lays the scratch out for a forward of n_tokens rows over n_seqs sequences (block tables
  // max_blocks wide), n_logit_rows logit rows projected pass_rows at a time, and an attention
  // workspace of attn_ws_floats; grows it first when it is smaller. Returns true when it had to
  // move the scratch (recordings that point into it are stale).
  bool ensure_scratch(int n_tokens, int n_seqs, int n_logit_rows, int pass_rows, int max_blocks,
                      size_t attn_ws_floats);
  // The block-table width a forward of this width runs with: recorded decode steps round it up
  // (see forward), so a growing context re-records only log2 times.
  static int table_width(int max_blocks, bool record);
  // The op sequence of a forward over the uploaded batch (T tokens), up to the final hidden
  // states in s.x.
  void run_layers(const CacheViews& caches, int T, bool keep_step_states);
  // Logits (s.logits) and final-normed hidden states (s.sel) of logit rows first..first+rows-1.
  void project_logits(int first, int rows);
  // Uploads the batch and runs its layers (recorded or not; a recorded step also projected its
  // logits, in one pass). Returns the logit rows; *pass: the rows each lm_head pass projects;
  // *recorded: whether the step was a replay. want_hidden: the caller reads s.sel too.
  int run_batch(const Batch& batch, const CacheViews& caches, bool want_hidden, int* pass,
                bool* recorded);
  void forget_recordings();
  // The mixers start from the residual stream s.x: residual (the block before's output, or null
  // for the first layer) is added, then the input norm.
  // x += residual (or the MoE output pending_moe_ left uncombined), then the block's norm and
  // its input projections.
  void block_norm(const float* residual, const float* norm, const Weight* const* ws,
                  float* const* outs, int count, int T);
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
  // Greedy steps launched and not collected, oldest first: the download's ticket and the host
  // buffer it fills (a deque: buffers stay put while others are added).
  struct LaunchedIds {
    int64_t ticket = 0;
    std::vector<int32_t> ids;
  };
  std::deque<LaunchedIds> launched_;
  int last_picked_rows_ = 0;             // logit rows of the step launched last (ids in s.picked)
  std::vector<TokenPick> greedy_picks_;  // launch_picks' all-greedy default
  std::vector<int32_t> index_staging_;   // a step's index arrays, packed for one upload
  ModelOptions options_;
  // Recorded decode steps by shape: (sequences, block-table width, cache identity) -> id.
  std::vector<std::pair<std::vector<uint64_t>, int64_t>> recordings_;
  MoeRows pending_moe_;  // the last MoE block's uncombined output, for the next block's norm
  uint64_t recordings_epoch_ = 0;  // the backend's memory_epoch() the recordings were made in
  std::vector<int32_t> padded_tables_;
  RecordStats record_stats_;
};

}  // namespace tokenmill
