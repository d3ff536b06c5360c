#include "engine/scheduler.h"

#include <algorithm>

#include "cache/cache_manager.h"
#include "util/log.h"

namespace tokenmill {

namespace {
void preempt(CacheManager& cache, Sequence& s) {
  cache.release(s.blocks);
  if (s.slot >= 0) cache.release_slot(s.slot);
  s.slot = -1;
  s.cached = 0;  // recomputed from scratch when readmitted: same tokens, same caches
}
}  // namespace

StepPlan schedule_step(const SchedulerConfig& cfg, CacheManager& cache,
                       std::deque<std::unique_ptr<Sequence>>& waiting,
                       std::vector<std::unique_ptr<Sequence>>& running) {
  StepPlan plan;
  int budget = cfg.max_step_tokens;

  // 1. Decode tokens of running sequences (one each), growing their block tables. When blocks
  //    run out, the newest running sequence is preempted until the older ones fit.
  auto schedule_running = [&](bool decode_only) {
    for (size_t i = 0; i < running.size() && budget > 0;) {
      Sequence& s = *running[i];
      bool decoding = s.uncached() == 1 && s.cached >= s.prompt_len;
      if (decoding != decode_only || std::any_of(plan.entries.begin(), plan.entries.end(),
                                                 [&](const StepEntry& e) { return e.seq == &s; })) {
        ++i;
        continue;
      }
      int n = std::min({s.uncached(), budget, decoding ? 1 : cfg.prefill_chunk});
      if (!cache.reserve(s.blocks, s.cached + n)) {
        // Preempt the newest other sequence that is not already in this step.
        auto victim = std::find_if(running.rbegin(), running.rend(), [&](const auto& v) {
          return v.get() != &s &&
                 std::none_of(plan.entries.begin(), plan.entries.end(),
                              [&](const StepEntry& e) { return e.seq == v.get(); });
        });
        if (victim == running.rend()) {
          ++i;  // nothing to free: this sequence waits for blocks
          continue;
        }
        log::info("preempting sequence {} to free KV blocks", (*victim)->id);
        preempt(cache, **victim);
        waiting.push_front(std::move(*victim));
        running.erase(std::next(victim).base());
        continue;  // retry the same sequence
      }
      plan.entries.push_back({&s, n});
      budget -= n;
      ++i;
    }
  };
  if (cfg.prefer_decode) schedule_running(true);

  // 2. Admit waiting sequences while slots, blocks for their first chunk, and budget allow.
  while (!waiting.empty() && static_cast<int>(running.size()) < cfg.max_seqs && budget > 0) {
    Sequence& s = *waiting.front();
    int n = std::min({s.uncached(), budget, cfg.prefill_chunk});
    // Keep one block of headroom per running sequence so admission does not starve decode.
    int64_t headroom = static_cast<int64_t>(running.size());
    if (cache.free_slots() == 0 ||
        cache.blocks_for(s.cached + n) + headroom > cache.free_blocks()) {
      break;
    }
    s.slot = cache.acquire_slot();
    cache.reserve(s.blocks, s.cached + n);
    running.push_back(std::move(waiting.front()));
    waiting.pop_front();
    plan.entries.push_back({running.back().get(), n});
    budget -= n;
  }

  // 3. Continue prefills (and decodes when prefill is preferred).
  schedule_running(false);
  if (!cfg.prefer_decode) schedule_running(true);
  return plan;
}

}  // namespace tokenmill
