// One cache manager over two stores, chosen per layer kind: paged KV blocks for full-attention
// layers (the same block ids serve every attention layer of a sequence) and recurrent-state
// slots (conv window + S, F32) for Gated DeltaNet layers. The engine's scheduler is the only
// caller that mutates it.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "model/batch.h"
#include "model/model.h"

namespace tokenmill {

// The KV element types a cache can hold, as settings and flags spell them: "f32" (exact) and
// "bf16" (half the memory; what the checkpoint's own dtype usually is).
const char* kv_dtype_setting_name(DType dtype);
// Parses "f32" / "bf16"; false for anything else.
bool parse_kv_dtype(std::string_view text, DType* out);

struct CacheOptions {
  int block_size = 16;          // positions per KV block
  int64_t num_blocks = 0;       // KV blocks (shared by all attention layers)
  int num_slots = 0;            // GDN state slots (one per running sequence, plus spares)
  DType kv_dtype = DType::F32;  // KV element type (F32 or BF16; the backend must take it)
};

class CacheManager {
 public:
  CacheManager(Backend& backend, const CacheGeometry& geo, const CacheOptions& options);
  ~CacheManager();
  CacheManager(const CacheManager&) = delete;
  CacheManager& operator=(const CacheManager&) = delete;

  // Sizes a cache for `budget_bytes`: `slots` state slots first, the rest as KV blocks.
  static CacheOptions plan(const CacheGeometry& geo, int64_t budget_bytes, int slots,
                           int block_size, DType kv_dtype = DType::F32);

  const CacheViews& views() const { return views_; }
  int block_size() const { return opt_.block_size; }
  int64_t total_blocks() const { return opt_.num_blocks; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_blocks_.size()); }
  int total_slots() const { return opt_.num_slots; }
  int free_slots() const { return static_cast<int>(free_slots_.size()); }
  int64_t bytes() const { return bytes_; }
  int64_t blocks_for(int64_t positions) const {
    return (positions + opt_.block_size - 1) / opt_.block_size;
  }

  // Grows `table` so it covers `positions` positions. Returns false (and changes nothing) when
  // not enough blocks are free.
  bool reserve(std::vector<int32_t>& table, int64_t positions);
  // Returns every block of `table` to the pool and clears it.
  void release(std::vector<int32_t>& table);

  // A fresh state slot with zeroed conv and recurrent state; -1 when none is free.
  int acquire_slot();
  void release_slot(int slot);
  // Copies every GDN layer's state of slot `src` to slot `dst` (checkpoint / restore).
  void copy_slot(int src, int dst);

 private:
  Backend& be_;
  CacheGeometry geo_;
  CacheOptions opt_;
  CacheViews views_;
  std::vector<void*> buffers_;
  std::vector<int32_t> free_blocks_;
  std::vector<int> free_slots_;
  int64_t bytes_ = 0;
};

}  // namespace tokenmill
