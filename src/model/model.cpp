// Model loading and the Qwen3.5 forward pass (MODEL-SPEC B): h += Mixer(norm1(h));
// h += FFN(norm2(h)); logits = lm_head(norm(h)). The mixer is Gated DeltaNet or gated attention
// per layer_types.
#include "model/model.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>

#include "io/checkpoint.h"
#include "util/error.h"
#include "util/log.h"

namespace tokenmill {

int64_t CacheGeometry::kv_bytes_per_token(DType kv_dtype) const {
  return int64_t{attention_layers} * 2 * kv_heads * head_dim *
         static_cast<int64_t>(dtype_size(kv_dtype));
}

int64_t CacheGeometry::state_bytes_per_seq() const {
  int64_t conv = int64_t{conv_channels} * (conv_kernel - 1);
  int64_t ssm = int64_t{v_heads} * k_dim * v_dim;
  return int64_t{gdn_layers} * (conv + ssm) * 4;
}

// Backend memory for one forward's activations and index arrays: reserved up front for the
// largest step (reserve_step), else grown (outside the step's ops) when a larger batch arrives.
struct Model::Scratch {
  Backend& be;
  explicit Scratch(Backend& b) : be(b) {}
  ~Scratch() {
    if (arena) be.free(arena);
    if (index) be.free(index);
    if (picked) be.free(picked);
  }
  void* arena = nullptr;
  size_t arena_bytes = 0;
  void* index = nullptr;
  size_t index_bytes = 0;

  // Activations (F32).
  float *x, *h, *mix;
  float *qkv, *conv_out, *z, *a, *b, *g, *beta, *q, *k, *v, *o, *o2;
  float *qg, *gate;
  float *ff_gate, *ff_up, *ff_act, *ff_out, *router, *topw, *moe_scratch, *sg;
  int32_t* topi;
  float *sel, *logits;
  float* attn_ws;  // the backend's attention workspace (may be empty)
  size_t attn_ws_floats = 0;
  // Index arrays in backend memory.
  int32_t *tokens, *positions, *cu_seqlens, *context_lens, *slots, *block_tables, *logit_rows;
  // launch_picks's ids, one per logit row: an allocation of its own, so a step's layout never
  // moves or overwrites the ids of the step before (Batch::tokens_from_last_step reads them).
  int32_t* picked = nullptr;
  int picked_rows = 0;
  SeqLayout seqs;
  KVPaging paging;
};

Model::Model(Backend& backend, std::unique_ptr<Checkpoint> ckpt, const ModelOptions& options)
    : backend_(backend),
      dir_(ckpt->dir()),
      ckpt_(std::move(ckpt)),
      cfg_(ckpt_->config()),
      options_(options) {
  store_ = std::make_unique<WeightStore>(backend_);
  w_ = bind_weights(*ckpt_, cfg_, *store_, options.load_mtp);
  for (LayerKind k : cfg_.layer_types) {
    if (k == LayerKind::kFullAttention) {
      geo_.attention_layers++;
    } else {
      geo_.gdn_layers++;
    }
  }
  geo_.kv_heads = cfg_.num_kv_heads;
  geo_.head_dim = cfg_.head_dim;
  geo_.k_heads = cfg_.linear_num_key_heads;
  geo_.v_heads = cfg_.linear_num_value_heads;
  geo_.k_dim = cfg_.linear_key_head_dim;
  geo_.v_dim = cfg_.linear_value_head_dim;
  geo_.conv_kernel = cfg_.linear_conv_kernel_dim;
  geo_.conv_channels = 2 * geo_.k_heads * geo_.k_dim + geo_.v_heads * geo_.v_dim;
  s_ = std::make_unique<Scratch>(backend_);
}

Model::~Model() {
  try {
    forget_recordings();
  } catch (...) {
    // A failed device already reported its error; the destructor must not throw.
  }
}

void Model::forget_recordings() {
  for (const auto& r : recordings_) backend_.forget_recording(r.second);
  recordings_.clear();
}

std::unique_ptr<Model> Model::load(const std::string& dir, Backend& backend,
                                   const ModelOptions& options) {
  return from_checkpoint(std::make_unique<Checkpoint>(Checkpoint::open(dir)), backend, options);
}

std::unique_ptr<Model> Model::from_checkpoint(std::unique_ptr<Checkpoint> ckpt, Backend& backend,
                                              const ModelOptions& options) {
  return std::unique_ptr<Model>(new Model(backend, std::move(ckpt), options));
}

bool Model::ensure_scratch(int T, int n_seqs, int R, int pass, int max_blocks,
                           size_t attn_ws_floats) {
  bool moved = false;
  const int64_t H = cfg_.hidden_size;
  const int64_t C = geo_.conv_channels;
  const int64_t HvDv = int64_t{geo_.v_heads} * geo_.v_dim;
  const int64_t HkDk = int64_t{geo_.k_heads} * geo_.k_dim;
  const int64_t Hv = geo_.v_heads;
  const int64_t QD = int64_t{cfg_.num_heads} * cfg_.head_dim;
  const int64_t KVD = int64_t{cfg_.num_kv_heads} * cfg_.head_dim;
  const int64_t I = std::max<int64_t>(cfg_.intermediate_size, cfg_.shared_expert_intermediate_size);
  const int64_t E = cfg_.num_experts, K = cfg_.num_experts_per_tok;
  const int64_t Im = cfg_.moe_intermediate_size;
  const int64_t V = cfg_.vocab_size;

  struct Slot {
    float** p;
    int64_t n;
  };
  Scratch& s = *s_;
  std::vector<Slot> slots = {
      {&s.x, T * H},
      {&s.h, T * H},
      {&s.mix, T * H},
      {&s.qkv, T * C},
      {&s.conv_out, T * C},
      {&s.z, T * HvDv},
      {&s.a, T * Hv},
      {&s.b, T * Hv},
      {&s.g, T * Hv},
      {&s.beta, T * Hv},
      {&s.q, T * std::max(HkDk, QD)},
      {&s.k, T * std::max(HkDk, KVD)},
      {&s.v, T * std::max(HvDv, KVD)},
      {&s.o, T * std::max(HvDv, QD)},
      {&s.o2, T * HvDv},
      {&s.qg, T * 2 * QD},
      {&s.gate, T * QD},
      {&s.ff_gate, T * I},
      {&s.ff_up, T * I},
      {&s.ff_act, T * I},
      {&s.ff_out, T * H},
      {&s.router, T * E},
      {&s.topw, T * K},
      {reinterpret_cast<float**>(&s.topi), T * K},
      {&s.moe_scratch, moe_scratch_floats(T, K, Im, cfg_.shared_expert_intermediate_size, H)},
      {&s.sg, T},
      {&s.sel, pass * H},
      {&s.logits, pass * V},
      {&s.attn_ws, static_cast<int64_t>(attn_ws_floats)},
  };
  size_t need = 0;
  for (const Slot& sl : slots) need += (static_cast<size_t>(sl.n) * 4 + 255) / 256 * 256;
  if (need > s.arena_bytes) {
    moved = true;
    if (s.arena) backend_.free(s.arena);
    s.arena = backend_.alloc(need);
    s.arena_bytes = need;
  }
  size_t off = 0;
  for (const Slot& sl : slots) {
    *sl.p = reinterpret_cast<float*>(static_cast<uint8_t*>(s.arena) + off);
    off += (static_cast<size_t>(sl.n) * 4 + 255) / 256 * 256;
  }
  s.attn_ws_floats = attn_ws_floats;

  size_t idx = static_cast<size_t>(T) * 2 + (n_seqs + 1) + n_seqs * 2 +
               static_cast<size_t>(n_seqs) * max_blocks + static_cast<size_t>(R);
  idx *= 4;
  if (idx > s.index_bytes) {
    moved = true;
    if (s.index) backend_.free(s.index);
    s.index_bytes = std::max<size_t>(idx, 4096);
    s.index = backend_.alloc(s.index_bytes);
  }
  int32_t* p = static_cast<int32_t*>(s.index);
  s.tokens = p;
  p += T;
  s.positions = p;
  p += T;
  s.cu_seqlens = p;
  p += n_seqs + 1;
  s.context_lens = p;
  p += n_seqs;
  s.slots = p;
  p += n_seqs;
  s.block_tables = p;
  p += static_cast<size_t>(n_seqs) * max_blocks;
  s.logit_rows = p;
  if (R > s.picked_rows) {  // not recorded (the picks run after a replay): no moved flag
    if (s.picked) backend_.free(s.picked);
    s.picked_rows = std::max(R, 64);
    s.picked = static_cast<int32_t*>(backend_.alloc(static_cast<size_t>(s.picked_rows) * 4));
  }
  return moved;
}

int Model::table_width(int max_blocks, bool record) {
  int width = std::max(1, max_blocks);
  if (!record) return width;
  int w = 16;
  while (w < width) w *= 2;
  return w;
}

void Model::reserve_step(int max_tokens, int max_seqs, int max_blocks, int block_size) {
  TM_CHECK(max_tokens > 0 && max_seqs > 0 && max_blocks >= 0 && block_size > 0,
           "reserve_step: {} tokens, {} sequences, {} blocks of {}", max_tokens, max_seqs,
           max_blocks, block_size);
  // The widest table a step uses: recorded decode steps round theirs up.
  const int width = table_width(max_blocks, options_.record_decode && backend_.can_record());
  // Attention workspaces depend on the rows and the capacity, not always growing with them:
  // the backend's bound over every step up to this one.
  const size_t attn = backend_.max_attention_workspace_floats(max_tokens, cfg_.num_heads,
                                                              cfg_.head_dim, width * block_size);
  // Every row may ask for its logits (prompt logprobs); they are projected in passes.
  const int pass = std::min(max_tokens, logit_pass_rows(max_seqs));
  if (ensure_scratch(max_tokens, max_seqs, max_tokens, pass, width, attn)) forget_recordings();
  StepShape shape;
  shape.max_tokens = max_tokens;
  shape.max_seqs = max_seqs;
  // The linears' inputs: hidden (input projections, router, lm_head), the attention output,
  // the GDN output, and the MLP's, shared expert's and routed experts' intermediates.
  shape.max_linear_cols =
      std::max({cfg_.hidden_size, int64_t{cfg_.num_heads} * cfg_.head_dim,
                int64_t{geo_.v_heads} * geo_.v_dim, cfg_.intermediate_size,
                cfg_.shared_expert_intermediate_size, cfg_.moe_intermediate_size});
  if (geo_.gdn_layers > 0) {
    shape.gdn_k_heads = geo_.k_heads;
    shape.gdn_v_heads = geo_.v_heads;
    shape.gdn_k_dim = geo_.k_dim;
    shape.gdn_v_dim = geo_.v_dim;
  }
  if (geo_.attention_layers > 0) {
    shape.attn_kv_heads = cfg_.num_kv_heads;
    shape.attn_head_dim = cfg_.head_dim;
  }
  shape.max_context =
      static_cast<int>(std::min<int64_t>(int64_t{max_blocks} * block_size, INT_MAX));
  backend_.reserve_step_workspaces(shape);
}

namespace {
void check_batch(const Batch& b, const ModelConfig& cfg) {
  const int n = b.n_seqs();
  TM_CHECK(n > 0 && b.n_tokens() > 0, "empty batch");
  TM_CHECK(static_cast<int>(b.cu_seqlens.size()) == n + 1 && b.cu_seqlens[0] == 0 &&
               b.cu_seqlens[n] == b.n_tokens(),
           "cu_seqlens does not cover the batch");
  TM_CHECK(b.positions.size() == b.tokens.size() && static_cast<int>(b.state_slots.size()) == n,
           "batch arrays disagree in length");
  for (int s = 0; s < n; ++s) {
    int len = b.cu_seqlens[s + 1] - b.cu_seqlens[s];
    TM_CHECK(len > 0, "sequence {} advances by no token", s);
    TM_CHECK(b.positions[b.cu_seqlens[s + 1] - 1] == b.context_lens[s] - 1,
             "sequence {}: positions do not end at its context length", s);
  }
  std::vector<bool> on_device(b.tokens.size(), false);
  for (const auto& [row, id_row] : b.tokens_from_last_step) {
    TM_CHECK(row >= 0 && row < b.n_tokens() && id_row >= 0,
             "token of row {} from logit row {} of the last step: out of range", row, id_row);
    on_device[static_cast<size_t>(row)] = true;
  }
  for (size_t i = 0; i < b.tokens.size(); ++i) {
    const int32_t t = b.tokens[i];
    if (!on_device[i] && (t < 0 || t >= cfg.vocab_size)) {
      fail("token id {} is outside the vocabulary (0..{})", t, cfg.vocab_size - 1);
    }
  }
  for (int32_t r : b.logit_rows)
    TM_CHECK(r >= 0 && r < b.n_tokens(), "logit row {} out of range", r);
}
}  // namespace

void Model::forward(const Batch& batch, const CacheViews& caches, std::vector<float>* logits,
                    std::vector<float>* hidden) {
  int pass = 0;
  bool recorded = false;
  const int R = run_batch(batch, caches, hidden != nullptr, &pass, &recorded);
  if (R == 0) return;
  Scratch& s = *s_;
  const size_t V = static_cast<size_t>(cfg_.vocab_size);
  const int64_t H = cfg_.hidden_size;
  logits->resize(static_cast<size_t>(R) * V);
  if (hidden != nullptr) hidden->resize(static_cast<size_t>(R) * H);
  for (int first = 0; first < R; first += pass) {
    const int rows = std::min(pass, R - first);
    if (!recorded) project_logits(first, rows);  // the replay projected its one pass
    backend_.download(logits->data() + first * V, s.logits, rows * V * 4);
    if (hidden != nullptr) {
      backend_.download(hidden->data() + first * H, s.sel, static_cast<size_t>(rows * H) * 4);
    }
  }
}

void Model::launch_picks(const Batch& batch, const CacheViews& caches, StepPicks* picks) {
  TM_CHECK(static_cast<int>(launched_.size()) < kMaxLaunched,
           "more than {} steps launched and not collected", kMaxLaunched);
  const size_t R0 = batch.logit_rows.size();
  const bool sampled = picks != nullptr && !picks->picks.empty();
  const bool penalized = picks != nullptr && !picks->penalties.empty();
  TM_CHECK((!sampled || picks->picks.size() == R0) && (!penalized || picks->penalties.size() == R0),
           "launch_picks: {} picks and {} penalty rows for {} logit rows",
           sampled ? picks->picks.size() : 0, penalized ? picks->penalties.size() : 0, R0);
  if (!sampled) greedy_picks_.assign(R0, TokenPick{});
  const TokenPick* pick = sampled ? picks->picks.data() : greedy_picks_.data();
  if (penalized) {
    // A penalized row's input token still on the device is its sequence's newest output.
    for (size_t i = 0; i < R0; ++i) {
      PenaltyRow& pr = picks->penalties[i];
      pr.pending_at = -1;
      if (!pr.penalties.any()) continue;
      for (const auto& [row, id_row] : batch.tokens_from_last_step) {
        if (row == batch.logit_rows[i]) pr.pending_at = row;
      }
    }
    TM_CHECK(static_cast<int64_t>(picks->entries.size()) <= backend_.max_penalty_entries(),
             "launch_picks: {} penalty entries, the backend takes {}", picks->entries.size(),
             backend_.max_penalty_entries());
  }
  int pass = 0;
  bool recorded = false;
  const int R = run_batch(batch, caches, false, &pass, &recorded);
  Scratch& s = *s_;
  const int64_t V = cfg_.vocab_size;
  for (int first = 0; first < R; first += pass) {
    const int rows = std::min(pass, R - first);
    if (!recorded) project_logits(first, rows);
    if (penalized) {
      backend_.penalize_rows(s.logits, rows, V, picks->penalties.data() + first,
                             picks->entries.data(), static_cast<int64_t>(picks->entries.size()),
                             s.tokens);
    }
    backend_.pick_tokens(s.logits, rows, V, pick + first, s.picked + first);
  }
  last_picked_rows_ = R;
  LaunchedIds& l = launched_.emplace_back();
  l.ids.resize(static_cast<size_t>(R));
  l.ticket = backend_.begin_download(l.ids.data(), s.picked, l.ids.size() * 4);
}

void Model::collect_picks(std::vector<int32_t>* ids) {
  TM_CHECK(!launched_.empty(), "collect_picks: no step was launched");
  backend_.finish_download(launched_.front().ticket);
  *ids = std::move(launched_.front().ids);
  launched_.pop_front();
}

void Model::discard_launched() {
  while (!launched_.empty()) {
    const int64_t ticket = launched_.front().ticket;
    launched_.pop_front();
    backend_.finish_download(ticket);
  }
  last_picked_rows_ = 0;
}

int Model::run_batch(const Batch& batch, const CacheViews& caches, bool want_hidden, int* pass_out,
                     bool* recorded) {
  check_batch(batch, cfg_);
  TM_CHECK(static_cast<int>(caches.kv.size()) == geo_.attention_layers &&
               static_cast<int>(caches.gdn.size()) == geo_.gdn_layers,
           "cache views do not match the model's layers");
  if (batch.keep_step_states) fail("per-token GDN state snapshots are not supported yet");
  const int T = batch.n_tokens(), n = batch.n_seqs();
  const int R = static_cast<int>(batch.logit_rows.size());
  // Decode steps are recorded once per shape and replayed. The block-table width is rounded up
  // to a power of two (padding with -1) so a growing context re-records only log2 times.
  const bool record = options_.record_decode && backend_.can_record() && T == n && R == n &&
                      !want_hidden && !batch.keep_step_states;
  const std::vector<int32_t>* tables = &batch.block_tables;
  const int width = table_width(batch.max_blocks_per_seq, record);
  if (record) {
    padded_tables_.assign(static_cast<size_t>(n) * width, -1);
    for (int i = 0; i < n; ++i) {
      std::copy_n(batch.block_tables.begin() + static_cast<int64_t>(i) * batch.max_blocks_per_seq,
                  batch.max_blocks_per_seq,
                  padded_tables_.begin() + static_cast<int64_t>(i) * width);
    }
    tables = &padded_tables_;
  }
  const int block_size = caches.kv.empty() ? 1 : caches.kv.front().block_size;
  // A recorded step (R == n) projects its logits in one pass.
  const int pass = std::min(R, logit_pass_rows(n));
  *pass_out = pass;
  *recorded = record;
  const size_t attn_ws =
      backend_.attention_workspace_floats(T, cfg_.num_heads, cfg_.head_dim, width * block_size);
  const int32_t* picked_before = s_->picked;
  if (ensure_scratch(T, n, R, pass, width, attn_ws)) forget_recordings();
  if (s_->picked != picked_before) {
    // The last step's ids went with the old buffer: nothing can read them any more.
    TM_CHECK(batch.tokens_from_last_step.empty(),
             "a step that continues the last one outgrew the reserved ids");
    last_picked_rows_ = 0;
  }
  backend_.set_attention_workspace(s_->attn_ws, s_->attn_ws_floats);
  Scratch& s = *s_;
  // The step's index arrays in one upload: they lie in s.index in this order (ensure_scratch).
  const std::vector<int32_t>* arrays[] = {
      &batch.tokens,      &batch.positions, &batch.cu_seqlens, &batch.context_lens,
      &batch.state_slots, tables,           &batch.logit_rows};
  const int32_t* dests[] = {s.tokens, s.positions,    s.cu_seqlens, s.context_lens,
                            s.slots,  s.block_tables, s.logit_rows};
  index_staging_.assign(static_cast<size_t>(s.logit_rows - s.tokens) + batch.logit_rows.size(), 0);
  for (size_t i = 0; i < std::size(arrays); ++i) {
    const auto at = static_cast<size_t>(dests[i] - s.tokens);
    TM_CHECK(at + arrays[i]->size() <= index_staging_.size(), "index array {} overruns", i);
    std::copy(arrays[i]->begin(), arrays[i]->end(), index_staging_.begin() + at);
  }
  backend_.upload(s.tokens, index_staging_.data(), index_staging_.size() * sizeof(int32_t));
  // Tokens still on the device: copied from the last launched step's ids, a run of consecutive
  // rows at a time (in a decode step that continues the last one, one copy).
  const auto& from_last = batch.tokens_from_last_step;
  for (size_t i = 0; i < from_last.size();) {
    size_t j = i + 1;
    while (j < from_last.size() && from_last[j].first == from_last[j - 1].first + 1 &&
           from_last[j].second == from_last[j - 1].second + 1) {
      ++j;
    }
    TM_CHECK(from_last[j - 1].second < last_picked_rows_,
             "token from logit row {} of the last step, which had {} picked rows",
             from_last[j - 1].second, last_picked_rows_);
    backend_.copy(s.tokens + from_last[i].first, s.picked + from_last[i].second,
                  (j - i) * sizeof(int32_t));
    i = j;
  }
  s.seqs.n_seqs = n;
  s.seqs.n_tokens = T;
  s.seqs.cu_seqlens = s.cu_seqlens;
  s.seqs.positions = s.positions;
  s.seqs.max_seq_tokens = 0;
  for (int i = 0; i < n; ++i) {
    s.seqs.max_seq_tokens =
        std::max(s.seqs.max_seq_tokens, batch.cu_seqlens[i + 1] - batch.cu_seqlens[i]);
  }
  s.paging.block_tables = s.block_tables;
  s.paging.max_blocks_per_seq = width;
  s.paging.context_lens = s.context_lens;
  s.paging.max_context_len = 0;
  for (int c : batch.context_lens) s.paging.max_context_len = std::max(s.paging.max_context_len, c);

  if (record) {
    if (backend_.memory_epoch() != recordings_epoch_) {
      // Device memory was freed since the recordings were made: they may point into it.
      forget_recordings();
      recordings_epoch_ = backend_.memory_epoch();
    }
    // The recording bakes in every pointer: the cache views are part of its identity, all of
    // their pointers and layouts (a cache freed and allocated again, as by a second engine on
    // the same model, may come back with some buffers at their old addresses and others not).
    std::vector<uint64_t> key = {static_cast<uint64_t>(n), static_cast<uint64_t>(width)};
    for (const KVLayerView& kv : caches.kv) {
      key.push_back(reinterpret_cast<uintptr_t>(kv.k));
      key.push_back(reinterpret_cast<uintptr_t>(kv.v));
      key.push_back(static_cast<uint64_t>(kv.block_size) << 32 | static_cast<uint32_t>(kv.dtype));
    }
    for (const GDNStateView& g : caches.gdn) {
      key.push_back(reinterpret_cast<uintptr_t>(g.conv));
      key.push_back(reinterpret_cast<uintptr_t>(g.ssm));
    }
    int64_t id = -1;
    for (const auto& [k, rid] : recordings_) {
      if (k == key) id = rid;
    }
    if (id < 0) {
      // max_context_len is only a hint that recorded kernels must not depend on.
      const auto t0 = std::chrono::steady_clock::now();
      backend_.begin_recording();
      try {
        run_layers(caches, T, false);
        project_logits(0, R);
      } catch (...) {
        backend_.end_recording(false);
        throw;
      }
      id = backend_.end_recording(true);
      recordings_.emplace_back(std::move(key), id);
      record_stats_.recordings++;
      record_stats_.seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    backend_.replay(id);
    record_stats_.replays++;
  } else {
    run_layers(caches, T, batch.keep_step_states);
  }
  return R;
}

void Model::run_layers(const CacheViews& caches, int T, bool keep_step_states) {
  Scratch& s = *s_;
  const int64_t H = cfg_.hidden_size;
  backend_.embed(w_.embed, s.tokens, T, s.x);
  int kv_i = 0, gdn_i = 0;
  // Each block starts with the residual add of the block before (none before the first), the
  // norm and its input projections in one call (Backend::rmsnorm_linear_multi, or its _moe form
  // where the MoE block before left its combine to it).
  pending_moe_ = MoeRows{};
  for (size_t l = 0; l < w_.layers.size(); ++l) {
    const LayerWeights& L = w_.layers[l];
    const float* residual = l == 0 ? nullptr : s.ff_out;
    if (L.kind == LayerKind::kFullAttention) {
      attention_block(L, kv_i++, caches, T, residual);
    } else {
      gdn_block(L, gdn_i++, caches, T, residual, keep_step_states);
    }
    ffn_block(L, T);
  }
  if (pending_moe_.rows != nullptr) {
    backend_.add_moe(s.x, pending_moe_, s.ff_out, T, static_cast<int>(H));
    pending_moe_ = MoeRows{};
  } else {
    backend_.add(s.x, s.ff_out, T * H);
  }
}

void Model::block_norm(const float* residual, const float* norm, const Weight* const* ws,
                       float* const* outs, int count, int T) {
  Scratch& s = *s_;
  const int H = static_cast<int>(cfg_.hidden_size);
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  if (residual != nullptr && pending_moe_.rows != nullptr) {
    backend_.rmsnorm_linear_multi_moe(s.x, pending_moe_, s.ff_out, norm, s.h, false, T, H, eps, ws,
                                      outs, count);
    pending_moe_ = MoeRows{};
    return;
  }
  backend_.rmsnorm_linear_multi(s.x, residual, norm, s.h, false, T, H, eps, ws, outs, count);
}

void Model::project_logits(int first, int rows) {
  Scratch& s = *s_;
  const int H = static_cast<int>(cfg_.hidden_size);
  const Weight* head[] = {&w_.lm_head};
  float* logits[] = {s.logits};
  backend_.gather_rows(s.x, H, s.logit_rows + first, rows, s.sel);
  // h is sel itself: forward() may download it as the final hidden states.
  backend_.rmsnorm_linear_multi(s.sel, nullptr, w_.final_norm.data, s.sel, true, rows, H,
                                static_cast<float>(cfg_.rms_norm_eps), head, logits, 1);
}

void Model::attention_block(const LayerWeights& L, int kv_index, const CacheViews& caches, int T,
                            const float* residual) {
  Scratch& s = *s_;
  const int Hq = cfg_.num_heads, D = cfg_.head_dim;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const AttentionWeights& A = L.attn;
  {
    const Weight* ws[] = {&A.q_proj, &A.k_proj, &A.v_proj};
    float* outs[] = {cfg_.attn_output_gate ? s.qg : s.q, s.k, s.v};
    block_norm(residual, L.input_norm.data, ws, outs, 3, T);
  }
  const KVLayerView& kv = caches.kv[kv_index];
  // q_proj rows per head, gated: [query (D) | gate (D)].
  const bool gated = cfg_.attn_output_gate;
  backend_.attention_front(kv, s.paging, s.seqs, gated ? s.qg : s.q, gated, A.q_norm.data,
                           A.k_norm.data, eps, Hq, cfg_.rotary_dim,
                           static_cast<float>(cfg_.rope_theta), s.q, s.gate, s.k, s.v);
  backend_.attention_out(kv, s.paging, s.seqs, s.q, Hq, 1.0f / std::sqrt(static_cast<float>(D)),
                         gated ? s.gate : nullptr, A.o_proj, s.o, s.mix);
}

void Model::gdn_block(const LayerWeights& L, int gdn_index, const CacheViews& caches, int T,
                      const float* residual, bool keep_step_states) {
  (void)keep_step_states;
  Scratch& s = *s_;
  const GDNWeights& G = L.gdn;
  {
    const Weight* ws[] = {&G.in_proj_qkv, &G.in_proj_z, &G.in_proj_b, &G.in_proj_a};
    float* outs[] = {s.qkv, s.z, s.b, s.a};
    block_norm(residual, L.input_norm.data, ws, outs, 4, T);
  }
  // The front (conv, l2norms, gates), the delta rule, the gated norm and the output projection:
  // a backend may fuse the first three (Backend::gdn_mixer). conv_out rows: [q (Hk*Dk) | k
  // (Hk*Dk) | v (Hv*Dv)].
  GdnMixerWeights mw;
  mw.conv = G.conv.data;
  mw.a_log = G.a_log.data;
  mw.dt_bias = G.dt_bias.data;
  mw.norm = G.norm.data;
  mw.eps = static_cast<float>(cfg_.rms_norm_eps);
  mw.out_proj = &G.out_proj;
  const GdnMixerIo io{s.qkv, s.z, s.a, s.b, s.conv_out, s.q, s.k, s.v, s.g, s.beta, s.o, s.o2};
  backend_.gdn_mixer(caches.gdn[gdn_index], s.seqs, s.slots, mw, io, s.mix);
}

void Model::ffn_block(const LayerWeights& L, int T) {
  Scratch& s = *s_;
  const FFNWeights& f = L.ffn;
  if (!f.moe) {
    // x += the mixer's output; h = post_norm(x); gate and up of h; the down projection.
    MlpBlockWeights b;
    b.norm = L.post_norm.data;
    b.eps = static_cast<float>(cfg_.rms_norm_eps);
    b.gate = &f.gate_proj, b.up = &f.up_proj, b.down = &f.down_proj;
    const MlpBlockScratch bs{s.h, s.ff_gate, s.ff_up, s.ff_act};
    backend_.mlp_block(s.x, s.mix, T, static_cast<int>(cfg_.hidden_size), b, bs, s.ff_out);
    return;
  }
  // The norm, the router (with the shared expert's gate logit), top-k and the experts in one
  // call: a backend may fuse the front of it (Backend::moe_block).
  MoeBlockWeights b;
  b.norm = L.post_norm.data;
  b.eps = static_cast<float>(cfg_.rms_norm_eps);
  b.router = &f.router;
  b.k = cfg_.num_experts_per_tok;
  b.renormalize = cfg_.norm_topk_prob;
  b.gate = &f.experts_gate, b.up = &f.experts_up, b.down = &f.experts_down;
  if (f.has_shared) {
    b.shared_expert_gate = &f.shared_gate;
    b.shared_gate = &f.gate_proj, b.shared_up = &f.up_proj, b.shared_down = &f.down_proj;
  }
  // The combine may be left to the next block's norm (pending_moe_): the rows stay in
  // moe_scratch, which nothing before that norm uses.
  const MoeBlockScratch bs{s.h, s.router, s.sg, s.topi, s.topw, s.moe_scratch, &pending_moe_};
  backend_.moe_block(s.x, s.mix, T, static_cast<int>(cfg_.hidden_size), b, bs, s.ff_out);
}

}  // namespace tokenmill
