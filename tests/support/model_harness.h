// Test harness: loads a model directory on the CPU backend and runs token sequences through
// the forward with explicit chunking, returning the logits of every position.
#pragma once

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include <unistd.h>

#include "backend/cpu/cpu_backend.h"
#include "cache/cache_manager.h"
#include "engine/sampler.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace tokenmill::testing {

struct Harness {
  ThreadPool pool{2};
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<CacheManager> cache;

  // On the CPU backend.
  explicit Harness(const std::string& dir, int slots = 4, int64_t blocks = 256)
      : Harness(dir, nullptr, slots, blocks) {}
  // On `device` (nullptr: the CPU backend over `pool`).
  Harness(const std::string& dir, std::unique_ptr<Backend> device, int slots, int64_t blocks)
      : backend(device ? std::move(device) : make_cpu_backend(pool)) {
    model = Model::load(dir, *backend);
    make_cache(slots, blocks);
  }
  // A model over an in-memory checkpoint (e.g. synthetic_checkpoint_in_memory), on the CPU.
  explicit Harness(std::unique_ptr<Checkpoint> ckpt, int slots = 4, int64_t blocks = 256)
      : backend(make_cpu_backend(pool)) {
    model = Model::from_checkpoint(std::move(ckpt), *backend);
    make_cache(slots, blocks);
  }
  void make_cache(int slots, int64_t blocks, DType kv_dtype = DType::F32) {
    cache.reset();
    CacheOptions o;
    o.block_size = 16;
    o.num_blocks = blocks;
    o.num_slots = slots;
    o.kv_dtype = kv_dtype;
    cache = std::make_unique<CacheManager>(*backend, model->geometry(), o);
  }
  int vocab() const { return static_cast<int>(model->config().vocab_size); }

  // Runs several sequences together, each split into chunks of `chunk` tokens (0 = whole),
  // all sequences advancing in the same forward calls. Returns per sequence the logits of every
  // position, [len, vocab].
  std::vector<std::vector<float>> run(const std::vector<std::vector<int32_t>>& seqs, int chunk) {
    const size_t n = seqs.size();
    std::vector<int> slot(n), done(n, 0);
    std::vector<std::vector<int32_t>> blocks(n);
    std::vector<std::vector<float>> out(n);
    for (size_t s = 0; s < n; ++s) slot[s] = cache->acquire_slot();
    for (;;) {
      Batch b;
      std::vector<size_t> who;
      std::vector<int> took;
      for (size_t s = 0; s < n; ++s) {
        int left = static_cast<int>(seqs[s].size()) - done[s];
        if (left == 0) continue;
        int take = chunk > 0 ? std::min(chunk, left) : left;
        TM_CHECK(cache->reserve(blocks[s], done[s] + take), "harness: KV blocks exhausted");
        std::vector<int32_t> ids(seqs[s].begin() + done[s], seqs[s].begin() + done[s] + take);
        b.add_sequence(ids, done[s], slot[s], blocks[s], true);
        who.push_back(s);
        took.push_back(take);
      }
      if (who.empty()) break;
      std::vector<float> logits;
      model->forward(b, cache->views(), &logits);
      size_t row = 0;
      for (size_t i = 0; i < who.size(); ++i) {
        size_t bytes = static_cast<size_t>(took[i]) * vocab();
        out[who[i]].insert(out[who[i]].end(), logits.begin() + row * vocab(),
                           logits.begin() + row * vocab() + bytes);
        row += took[i];
        done[who[i]] += took[i];
      }
    }
    for (size_t s = 0; s < n; ++s) {
      cache->release(blocks[s]);
      cache->release_slot(slot[s]);
    }
    return out;
  }
};

// Logprob of each next token of `ids` under per-position logits [len, vocab]: [len - 1].
inline std::vector<double> next_logprobs(const std::vector<int32_t>& ids,
                                         const std::vector<float>& logits, int vocab) {
  std::vector<double> lp;
  for (size_t t = 0; t + 1 < ids.size(); ++t)
    lp.push_back(token_logprob(&logits[t * vocab], vocab, ids[t + 1], 0, nullptr));
  return lp;
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double{a[i]} - b[i]));
  return m;
}

// A fresh directory private to this process. ctest runs every test case as its own process, in
// parallel: a shared path would let one process rewrite a checkpoint another has mapped. The
// directories are removed when the process exits.
inline std::string temp_dir(const std::string& name) {
  struct Owned {
    std::vector<std::filesystem::path> dirs;
    ~Owned() {
      std::error_code ec;
      for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
    }
  };
  static Owned owned;
  auto p = std::filesystem::temp_directory_path() /
           ("tokenmill-test-" + name + "-" + std::to_string(::getpid()) + "-" +
            std::to_string(owned.dirs.size()));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  owned.dirs.push_back(p);
  return p.string();
}

}  // namespace tokenmill::testing
