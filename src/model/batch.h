// Batch: the forward's input contract. Varlen from day one: several sequences, each advancing
// n_i >= 1 tokens, flattened into one list of rows. Prefill chunks, decode steps and
// speculative verification are all the same call.
//
// Invariants (checked by Model::forward):
// - cu_seqlens has n_seqs+1 entries, starts at 0, strictly increases, ends at tokens.size().
// - positions[r] for the rows of sequence s are context_lens[s]-n_s .. context_lens[s]-1: a
//   sequence continues exactly where its cache ends.
// - block_tables row s holds at least ceil(context_lens[s] / block_size) valid block ids.
// - state_slots[s] is the sequence's GDN state slot; padding rows do not exist.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace tokenmill {

struct Batch {
  std::vector<int32_t> tokens;        // [n_tokens]
  std::vector<int32_t> positions;     // [n_tokens]
  std::vector<int32_t> cu_seqlens;    // [n_seqs + 1]
  std::vector<int32_t> context_lens;  // [n_seqs] cached positions after this step
  std::vector<int32_t> state_slots;   // [n_seqs]
  std::vector<int32_t> block_tables;  // [n_seqs, max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  std::vector<int32_t> logit_rows;  // rows whose logits the caller wants, in output order
  // When true, the GDN layers also write the state after every row (speculative verify).
  bool keep_step_states = false;
  // Rows whose token is still on the device: {row of this batch, logit row of the step
  // launched last (Model::launch_picks)}, whose id becomes the row's token. Their entries in
  // `tokens` are placeholders. Lets a step be launched before the one it continues has
  // returned its ids.
  std::vector<std::pair<int32_t, int32_t>> tokens_from_last_step;

  int n_seqs() const { return static_cast<int>(context_lens.size()); }
  int n_tokens() const { return static_cast<int>(tokens.size()); }

  // Appends sequence rows: `ids` continue a sequence that has `cached` positions in its cache,
  // lives in `slot`, and pages through `blocks`. Returns the sequence's index in the batch.
  int add_sequence(const std::vector<int32_t>& ids, int cached, int slot,
                   const std::vector<int32_t>& blocks, bool logits_for_all_rows);
  void clear();
};

// The caches' memory as the forward sees it: one view per attention layer and per GDN layer,
// in layer order within each kind.
struct CacheViews {
  std::vector<KVLayerView> kv;
  std::vector<GDNStateView> gdn;
};

}  // namespace tokenmill
