#include "cache/cache_manager.h"

#include <algorithm>

#include "util/error.h"

namespace tokenmill {

namespace {
int64_t kv_block_bytes(const CacheGeometry& g, int block_size, DType kv_dtype) {
  return int64_t{block_size} * g.kv_bytes_per_token(kv_dtype);
}
}  // namespace

const char* kv_dtype_setting_name(DType dtype) {
  return dtype == DType::BF16 ? "bf16" : dtype == DType::F32 ? "f32" : dtype_name(dtype);
}

bool parse_kv_dtype(std::string_view text, DType* out) {
  if (text == "f32") {
    *out = DType::F32;
  } else if (text == "bf16") {
    *out = DType::BF16;
  } else {
    return false;
  }
  return true;
}

CacheOptions CacheManager::plan(const CacheGeometry& geo, int64_t budget_bytes, int slots,
                                int block_size, DType kv_dtype) {
  CacheOptions o;
  o.block_size = block_size;
  o.num_slots = slots;
  o.kv_dtype = kv_dtype;
  int64_t left = budget_bytes - int64_t{slots} * geo.state_bytes_per_seq();
  int64_t per_block = kv_block_bytes(geo, block_size, kv_dtype);
  if (left <= 0 || (per_block > 0 && left < per_block)) {
    fail(
        "cache memory budget of {} MiB is too small: {} state slots need {} MiB and one KV "
        "block {} KiB; raise the budget or lower max_seqs",
        budget_bytes >> 20, slots, (int64_t{slots} * geo.state_bytes_per_seq()) >> 20,
        per_block >> 10);
  }
  o.num_blocks = per_block > 0 ? left / per_block : 0;
  return o;
}

CacheManager::CacheManager(Backend& backend, const CacheGeometry& geo, const CacheOptions& opt)
    : be_(backend), geo_(geo), opt_(opt) {
  TM_CHECK(opt.block_size > 0 && opt.num_slots > 0, "cache needs blocks and slots");
  if (!backend.supports_kv_dtype(opt.kv_dtype)) {
    fail("the {} backend does not keep KV caches in {}; use {}", backend.name(),
         kv_dtype_setting_name(opt.kv_dtype), kv_dtype_setting_name(DType::F32));
  }
  // KV memory is written before it is read (kv_append precedes attention), so it is not
  // cleared: a large pool costs nothing until used. State slots are cleared on acquire.
  auto alloc = [&](size_t bytes) {
    void* p = be_.alloc(std::max<size_t>(bytes, 4));
    buffers_.push_back(p);
    bytes_ += static_cast<int64_t>(bytes);
    return static_cast<float*>(p);
  };
  size_t kv_elems = static_cast<size_t>(opt.num_blocks) * opt.block_size * geo.kv_heads *
                    static_cast<size_t>(geo.head_dim);
  const size_t kv_elem = dtype_size(opt.kv_dtype);
  for (int l = 0; l < geo.attention_layers; ++l) {
    KVLayerView v;
    v.k = alloc(kv_elems * kv_elem);
    v.v = alloc(kv_elems * kv_elem);
    v.dtype = opt.kv_dtype;
    v.block_size = opt.block_size;
    v.kv_heads = geo.kv_heads;
    v.head_dim = geo.head_dim;
    views_.kv.push_back(v);
  }
  for (int l = 0; l < geo.gdn_layers; ++l) {
    GDNStateView v;
    v.channels = geo.conv_channels;
    v.kernel = geo.conv_kernel;
    v.k_heads = geo.k_heads;
    v.v_heads = geo.v_heads;
    v.k_dim = geo.k_dim;
    v.v_dim = geo.v_dim;
    v.conv = alloc(static_cast<size_t>(opt.num_slots) * v.channels * (v.kernel - 1) * 4);
    v.ssm = alloc(static_cast<size_t>(opt.num_slots) * v.v_heads * v.k_dim * v.v_dim * 4);
    views_.gdn.push_back(v);
  }
  for (int64_t b = opt.num_blocks - 1; b >= 0; --b) free_blocks_.push_back(static_cast<int32_t>(b));
  for (int s = opt.num_slots - 1; s >= 0; --s) free_slots_.push_back(s);
}

CacheManager::~CacheManager() {
  for (void* p : buffers_) be_.free(p);
}

bool CacheManager::reserve(std::vector<int32_t>& table, int64_t positions) {
  int64_t need = blocks_for(positions) - static_cast<int64_t>(table.size());
  if (need <= 0) return true;
  if (need > free_blocks()) return false;
  for (int64_t i = 0; i < need; ++i) {
    table.push_back(free_blocks_.back());
    free_blocks_.pop_back();
  }
  return true;
}

void CacheManager::release(std::vector<int32_t>& table) {
  for (int32_t b : table) free_blocks_.push_back(b);
  table.clear();
}

int CacheManager::acquire_slot() {
  if (free_slots_.empty()) return -1;
  int s = free_slots_.back();
  free_slots_.pop_back();
  for (const GDNStateView& v : views_.gdn) {
    size_t conv = static_cast<size_t>(v.channels) * (v.kernel - 1);
    size_t ssm = static_cast<size_t>(v.v_heads) * v.k_dim * v.v_dim;
    be_.fill_zero(v.conv + s * conv, conv * 4);
    be_.fill_zero(v.ssm + s * ssm, ssm * 4);
  }
  return s;
}

void CacheManager::release_slot(int slot) {
  TM_CHECK(slot >= 0 && slot < opt_.num_slots, "bad slot {}", slot);
  free_slots_.push_back(slot);
}

void CacheManager::copy_slot(int src, int dst) {
  for (const GDNStateView& v : views_.gdn) {
    size_t conv = static_cast<size_t>(v.channels) * (v.kernel - 1);
    size_t ssm = static_cast<size_t>(v.v_heads) * v.k_dim * v.v_dim;
    be_.copy(v.conv + dst * conv, v.conv + src * conv, conv * 4);
    be_.copy(v.ssm + dst * ssm, v.ssm + src * ssm, ssm * 4);
  }
}

}  // namespace tokenmill
