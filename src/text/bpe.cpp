#include "text/bpe.h"

#include <atomic>
#include <climits>
#include <cstring>
#include <queue>

#include "text/unicode_utf8.h"
#include "util/error.h"

namespace tokenmill::text {

// Open-addressing hash table from a (left id, right id) pair to (rank, merged id). Ranks are the
// merge's index in tokenizer.json; a later duplicate overrides an earlier one (as in the
// reference).
struct BpeModel::MergeTable {
  struct Slot {
    uint64_t key;
    int32_t rank;
    int32_t id;
  };
  static constexpr uint64_t kEmpty = ~0ull;
  std::vector<Slot> slots;
  uint64_t mask = 0;

  explicit MergeTable(size_t n) {
    size_t cap = 16;
    while (cap < n * 2 + 16) cap <<= 1;
    slots.assign(cap, Slot{kEmpty, 0, 0});
    mask = cap - 1;
  }
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  static uint64_t mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
  }
  void insert(uint64_t k, int32_t rank, int32_t id) {
    for (uint64_t i = mix(k) & mask;; i = (i + 1) & mask) {
      if (slots[i].key == kEmpty || slots[i].key == k) {
        slots[i] = Slot{k, rank, id};
        return;
      }
    }
  }
  const Slot* find(uint64_t k) const {
    for (uint64_t i = mix(k) & mask;; i = (i + 1) & mask) {
      if (slots[i].key == k) return &slots[i];
      if (slots[i].key == kEmpty) return nullptr;
    }
  }
};

// Bounded word cache: pre-tokens shorter than kMaxWordBytes map to their ids. Each shard is a
// direct-mapped table (a new word replaces the one in its slot, which bounds memory) guarded by a
// spin flag taken with one try: concurrent encoders never wait, a busy shard counts as a miss.
struct BpeModel::Cache {
  static constexpr size_t kShards = 16;
  static constexpr size_t kSlotsPerShard = 4096;  // power of two
  static constexpr size_t kMaxWordBytes = 256;
  struct Slot {
    uint64_t hash = 0;
    std::string word;
    std::vector<int32_t> ids;
  };
  struct Shard {
    std::atomic_flag busy;
    std::vector<Slot> slots{kSlotsPerShard};
  };
  std::array<Shard, kShards> shards;

  // Words are short: a simple multiplicative hash over 8-byte blocks is enough and fast.
  static uint64_t hash(std::string_view w) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ w.size();
    size_t i = 0;
    for (; i + 8 <= w.size(); i += 8) {
      uint64_t k;
      std::memcpy(&k, w.data() + i, 8);
      h = (h ^ k) * 0xff51afd7ed558ccdULL;
      h ^= h >> 32;
    }
    uint64_t k = 0;
    std::memcpy(&k, w.data() + i, w.size() - i);
    h = (h ^ k) * 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 29);
  }
};

BpeModel::BpeModel(const VocabMap& vocab, const std::vector<Merge>& merges,
                   const std::vector<int32_t>& merged, BpeOptions options)
    : vocab_(vocab),
      opt_(options),
      merges_(std::make_unique<MergeTable>(merges.size())),
      cache_(std::make_unique<Cache>()) {
  TM_CHECK(merges.size() == merged.size(), "{} merges, {} results", merges.size(), merged.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    merges_->insert(MergeTable::key(merges[r].left, merges[r].right), static_cast<int32_t>(r),
                    merged[r]);
  }
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(byte_to_unicode(static_cast<uint8_t>(b)), s);
    auto it = vocab.find(s);
    byte_level_ids_[b] = it == vocab.end() ? -1 : it->second;
    static constexpr char kHex[] = "0123456789ABCDEF";
    const std::string fb = std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">";
    it = vocab.find(fb);
    fallback_ids_[b] = it == vocab.end() ? -1 : it->second;
  }
}

BpeModel::~BpeModel() = default;
BpeModel::BpeModel(BpeModel&&) noexcept = default;

void BpeModel::encode_word(std::string_view word, bool byte_level,
                           std::vector<int32_t>& out) const {
  if (word.empty()) return;
  const bool cacheable = word.size() < Cache::kMaxWordBytes;
  uint64_t h = 0;
  Cache::Shard* shard = nullptr;
  if (cacheable) {
    h = Cache::hash(word);
    shard = &cache_->shards[h % Cache::kShards];
    if (!shard->busy.test_and_set(std::memory_order_acquire)) {
      const Cache::Slot& slot = shard->slots[(h >> 8) & (Cache::kSlotsPerShard - 1)];
      const bool hit = slot.hash == h && slot.word == word;
      if (hit) out.insert(out.end(), slot.ids.begin(), slot.ids.end());
      shard->busy.clear(std::memory_order_release);
      if (hit) return;
    }
  }
  const size_t first = out.size();
  std::string mapped;  // the byte-level spelling of `word`, when needed
  if (byte_level) {
    for (char c : word) append_utf8(byte_to_unicode(static_cast<uint8_t>(c)), mapped);
  }
  auto whole =
      opt_.ignore_merges ? vocab_.find(byte_level ? std::string_view(mapped) : word) : vocab_.end();
  if (whole != vocab_.end()) {
    out.push_back(whole->second);
  } else {
    std::vector<Symbol> syms;
    syms.reserve(word.size());
    if (byte_level) {
      for (size_t i = 0; i < word.size(); ++i) {
        syms.push_back(
            {byte_level_ids_[static_cast<uint8_t>(word[i])], static_cast<uint32_t>(i), 1});
      }
    } else {
      for (size_t i = 0; i < word.size();) {
        const size_t len = utf8_len(static_cast<unsigned char>(word[i]));
        auto it = vocab_.find(word.substr(i, len));
        syms.push_back({it == vocab_.end() ? -1 : it->second, static_cast<uint32_t>(i),
                        static_cast<uint32_t>(len)});
        i += len;
      }
    }
    if (syms.size() > 1) {
      if (syms.size() <= 64) {
        merge_small(syms);
      } else {
        merge_large(syms);
      }
    }
    if (byte_level) {
      // Unknown byte-level characters fall back on the UTF-8 bytes of their spelling.
      for (const auto& s : syms) {
        if (s.id >= 0) {
          out.push_back(s.id);
          continue;
        }
        std::string spelled;
        for (uint32_t k = 0; k < s.len; ++k) {
          append_utf8(byte_to_unicode(static_cast<uint8_t>(word[s.start + k])), spelled);
        }
        const std::vector<Symbol> one{{-1, 0, static_cast<uint32_t>(spelled.size())}};
        emit(spelled, one, out);
      }
    } else {
      emit(word, syms, out);
    }
  }
  if (shard != nullptr && !shard->busy.test_and_set(std::memory_order_acquire)) {
    Cache::Slot& slot = shard->slots[(h >> 8) & (Cache::kSlotsPerShard - 1)];
    slot.hash = h;
    slot.word.assign(word);
    slot.ids.assign(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
    shard->busy.clear(std::memory_order_release);
  }
}

// Symbols are few: keep the rank of each adjacent pair and rescan for the minimum (leftmost wins).
void BpeModel::merge_small(std::vector<Symbol>& syms) const {
  std::array<int32_t, 64> rank{};
  std::array<int32_t, 64> result{};
  auto look = [&](size_t i) {
    rank[i] = INT32_MAX;
    if (syms[i].id < 0 || syms[i + 1].id < 0) return;
    if (const auto* s = merges_->find(MergeTable::key(syms[i].id, syms[i + 1].id))) {
      rank[i] = s->rank;
      result[i] = s->id;
    }
  };
  size_t n = syms.size();
  for (size_t i = 0; i + 1 < n; ++i) look(i);
  while (n > 1) {
    size_t best = 0;
    int32_t best_rank = INT32_MAX;
    for (size_t i = 0; i + 1 < n; ++i) {
      if (rank[i] < best_rank) {
        best_rank = rank[i];
        best = i;
      }
    }
    if (best_rank == INT32_MAX) break;
    syms[best].id = result[best];
    syms[best].len += syms[best + 1].len;
    for (size_t i = best + 1; i + 1 < n; ++i) {
      syms[i] = syms[i + 1];
      rank[i] = rank[i + 1];
      result[i] = result[i + 1];
    }
    --n;
    syms.resize(n);
    if (best + 1 < n) look(best);
    if (best > 0) look(best - 1);
  }
}

// Many symbols: a doubly linked list and a min-heap of candidate pairs ordered by (rank, start).
void BpeModel::merge_large(std::vector<Symbol>& syms) const {
  const size_t n = syms.size();
  std::vector<int32_t> prev(n), next(n);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  struct Cand {
    int32_t rank;
    uint32_t start;
    int32_t left, right;  // symbol indices
    int32_t left_id, right_id, result;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : start > o.start; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<>> heap;
  auto push = [&](int32_t l) {
    if (l < 0) return;
    const int32_t r = next[l];
    if (r < 0 || syms[l].id < 0 || syms[r].id < 0) return;
    if (const auto* s = merges_->find(MergeTable::key(syms[l].id, syms[r].id))) {
      heap.push({s->rank, syms[l].start, l, r, syms[l].id, syms[r].id, s->id});
    }
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    // Stale if either side changed since the candidate was queued.
    if (syms[c.left].len == 0 || next[c.left] != c.right || syms[c.left].id != c.left_id ||
        syms[c.right].id != c.right_id) {
      continue;
    }
    syms[c.left].id = c.result;
    syms[c.left].len += syms[c.right].len;
    syms[c.right].len = 0;
    syms[c.right].id = -3;
    next[c.left] = next[c.right];
    if (next[c.left] >= 0) prev[next[c.left]] = c.left;
    push(prev[c.left]);
    push(c.left);
  }
  size_t k = 0;
  for (int32_t i = 0; i >= 0; i = next[i]) syms[k++] = syms[i];
  syms.resize(k);
}

void BpeModel::emit(std::string_view word, const std::vector<Symbol>& syms,
                    std::vector<int32_t>& out) const {
  bool last_unk = false;
  for (const auto& s : syms) {
    if (s.id >= 0) {
      out.push_back(s.id);
      last_unk = false;
      continue;
    }
    if (opt_.byte_fallback) {
      bool all = true;
      for (uint32_t k = 0; k < s.len; ++k)
        all = all && fallback_ids_[static_cast<uint8_t>(word[s.start + k])] >= 0;
      if (all) {
        for (uint32_t k = 0; k < s.len; ++k)
          out.push_back(fallback_ids_[static_cast<uint8_t>(word[s.start + k])]);
        last_unk = false;
        continue;
      }
    }
    // No unk token configured: the character is dropped (HF errors, the reference emits undefined).
    if (!opt_.unk_id) continue;
    if (opt_.fuse_unk && last_unk) continue;
    out.push_back(*opt_.unk_id);
    last_unk = true;
  }
}

}  // namespace tokenmill::text
