#include "model/batch.h"

#include <algorithm>

#include "util/error.h"

namespace tokenmill {

int Batch::add_sequence(const std::vector<int32_t>& ids, int cached, int slot,
                        const std::vector<int32_t>& blocks, bool logits_for_all_rows) {
  TM_CHECK(!ids.empty(), "a sequence advances by at least one token");
  if (cu_seqlens.empty()) cu_seqlens.push_back(0);
  int first_row = n_tokens();
  for (size_t i = 0; i < ids.size(); ++i) {
    tokens.push_back(ids[i]);
    positions.push_back(cached + static_cast<int>(i));
  }
  cu_seqlens.push_back(n_tokens());
  context_lens.push_back(cached + static_cast<int>(ids.size()));
  state_slots.push_back(slot);
  // Block tables are a dense [n_seqs, max_blocks] matrix: widen earlier rows when needed.
  int width = std::max<int>(max_blocks_per_seq, static_cast<int>(blocks.size()));
  if (width != max_blocks_per_seq) {
    std::vector<int32_t> wide(static_cast<size_t>(n_seqs()) * width, 0);
    for (int s = 0; s + 1 < n_seqs(); ++s) {
      std::copy_n(block_tables.begin() + s * max_blocks_per_seq, max_blocks_per_seq,
                  wide.begin() + s * width);
    }
    block_tables.swap(wide);
    max_blocks_per_seq = width;
  } else {
    block_tables.resize(static_cast<size_t>(n_seqs()) * width, 0);
  }
  std::copy(blocks.begin(), blocks.end(), block_tables.begin() + (n_seqs() - 1) * width);
  if (logits_for_all_rows) {
    for (int r = first_row; r < n_tokens(); ++r) logit_rows.push_back(r);
  } else {
    logit_rows.push_back(n_tokens() - 1);
  }
  return n_seqs() - 1;
}

void Batch::clear() {
  *this = Batch{};
}

}  // namespace tokenmill
