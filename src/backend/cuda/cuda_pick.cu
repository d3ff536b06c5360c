// Backend::pick_tokens on the device: the argmax of every row (argmax_rows), then, for rows
// with a sampled pick, util/token_pick.h's draw next to the logits, so a sampled decode step
// downloads one id per row and can overlap the next one like a greedy step.
//
// A sampled row's top k (k <= kPickMaxTopK) by (logit desc, id asc) is found in two levels:
// the row is cut into chunks of kPickChunk columns, one block each; a block selects its chunk's
// top k from its keys in shared memory by radix select (four 8-bit passes over order-preserving
// 32-bit keys) and leaves them, in column order, in the workspace; the row's last block (a
// ticket) merges the chunks' candidates the same way (they arrive in column order, so ties at
// the k-th value go to the lower id as on the host), sorts the k by rank and makes the draw in
// one thread with the host's arithmetic: F32 x = (logit - max) * (1 / T) and exp(x), double
// sums in the same order, r = u * z. Only the exponentials' last bits can differ from the host.
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <climits>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_common.cuh"

namespace tokenmill::cuda {
namespace {

constexpr int kPickThreads = 256;
constexpr int kPickChunk = 8192;  // columns one block selects from (32 KB of keys)
constexpr int kPickMaxBlocks = 64;
constexpr int kPickMergeCap = 4096;  // candidates a row's last block merges (blocks x k)
constexpr int kPickMaxTopK = 128;
constexpr int kPickMaxRows = 64;  // rows one launch samples (the workspace's rows)
// Shared-memory keys are padded by one word per 32 so that a thread walking its own contiguous
// run (the ordered compaction) hits a different bank from its neighbours.
constexpr int kPickKeysPadded = kPickChunk + kPickChunk / 32;
__device__ __forceinline__ int pidx(int i) {
  return i + (i >> 5);
}

// 0 for NaN and -inf (never candidates); otherwise increasing with the value, -0 as +0 (they
// tie as logits, and ties go to the lower id).
__device__ __forceinline__ uint32_t order_key(float v) {
  if (!(v > -INFINITY)) return 0;
  if (v == 0.0f) v = 0.0f;
  const uint32_t b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

struct PickWs {
  uint32_t* keys;    // [kPickMaxRows, kPickMergeCap] block b's candidates at b * k
  int32_t* ids;      // [kPickMaxRows, kPickMergeCap]
  int32_t* counts;   // [kPickMaxRows, kPickMaxBlocks] candidates block b left
  int32_t* tickets;  // [kPickMaxRows] blocks of the row done; zero at rest
};

using PickScan = cub::BlockScan<int, kPickThreads>;

struct PickShared {
  uint32_t keys[kPickKeysPadded];  // a chunk's keys; in the merge keys then ids, halves
  int hist[256];
  PickScan::TempStorage scan;
  uint32_t top_keys[kPickMaxTopK];
  int32_t top_ids[kPickMaxTopK];
  uint32_t sorted_keys[kPickMaxTopK];
  int32_t sorted_ids[kPickMaxTopK];
  float e[kPickMaxTopK];
  int offsets[kPickMaxBlocks + 1];
  int digit, rem, bin_count, is_short;
  bool last;
};

// Adds 1 to hist[bin] for each active lane, one atomic per distinct bin in the warp (logits
// share their top bits, so plain atomics would serialize on a few bins).
__device__ __forceinline__ void hist_add(int* hist, uint32_t bin, bool active) {
  const unsigned act = __ballot_sync(0xffffffffu, active);
  if (!active) return;
  const unsigned peers = __match_any_sync(act, bin);
  if (__ffs(peers) - 1 == static_cast<int>(threadIdx.x & 31)) atomicAdd(&hist[bin], __popc(peers));
}

// The k-th largest nonzero key of keys[pidx(0..n)): take every key above `key` and the first
// `need` (in index order) equal to it. Fewer than k nonzero keys: key 0, need 0 (take them all).
struct Kth {
  uint32_t key;
  int need;
};
__device__ Kth select_kth(PickShared& sh, const uint32_t* keys, int n, int k) {
  uint32_t prefix = 0, mask = 0;
  int rem = k;
  const int rounds = (n + kPickThreads - 1) / kPickThreads;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += kPickThreads) sh.hist[i] = 0;
    __syncthreads();
    for (int m = 0; m < rounds; ++m) {
      const int i = m * kPickThreads + static_cast<int>(threadIdx.x);
      const uint32_t key = i < n ? keys[pidx(i)] : 0;
      hist_add(sh.hist, (key >> shift) & 0xffu, key != 0 && (key & mask) == prefix);
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane l holds bins 255 - 8l .. 248 - 8l, highest first.
      const int lane = static_cast<int>(threadIdx.x);
      int c[8], sum = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) sum += c[j] = sh.hist[255 - 8 * lane - j];
      int incl = sum;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      const int total = __shfl_sync(0xffffffffu, incl, 31);
      if (lane == 0) sh.is_short = total < rem;
      int acc = incl - sum;
      if (acc < rem && rem <= incl) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (acc + c[j] >= rem) {
            sh.digit = 255 - 8 * lane - j;
            sh.rem = rem - acc;
            sh.bin_count = c[j];
            break;
          }
          acc += c[j];
        }
      }
    }
    __syncthreads();
    if (sh.is_short) return Kth{0, 0};  // only in the first pass: fewer than k keys at all
    prefix |= static_cast<uint32_t>(sh.digit) << shift;
    mask |= 0xffu << shift;
    rem = sh.rem;
    __syncthreads();  // sh.digit / sh.rem are rewritten by the next pass
  }
  return Kth{prefix, rem};
}

// Writes the keys Kth selects from keys[pidx(0..n)) and their ids (first_id + index) to
// out_keys / out_ids in index order; returns how many (all threads).
__device__ int compact_selected(PickShared& sh, const uint32_t* keys, const int32_t* ids, int n,
                                int first_id, Kth kth, uint32_t* out_keys, int32_t* out_ids) {
  const int per = (n + kPickThreads - 1) / kPickThreads;
  const int begin = min(n, static_cast<int>(threadIdx.x) * per), end = min(n, begin + per);
  int eq = 0;
  for (int i = begin; i < end; ++i) eq += kth.need > 0 && keys[pidx(i)] == kth.key;
  int eq_before = 0, total = 0;
  PickScan(sh.scan).ExclusiveSum(eq, eq_before);
  __syncthreads();
  int sel = 0, r = eq_before;
  for (int i = begin; i < end; ++i) {
    const uint32_t key = keys[pidx(i)];
    const bool is_eq = kth.need > 0 && key == kth.key;
    sel += key > kth.key || (is_eq && r < kth.need);
    r += is_eq;
  }
  int pos = 0;
  PickScan(sh.scan).ExclusiveSum(sel, pos, total);
  __syncthreads();
  r = eq_before;
  for (int i = begin; i < end; ++i) {
    const uint32_t key = keys[pidx(i)];
    const bool is_eq = kth.need > 0 && key == kth.key;
    if (key > kth.key || (is_eq && r < kth.need)) {
      out_keys[pos] = key;
      out_ids[pos] = ids != nullptr ? ids[pidx(i)] : first_id + i;
      ++pos;
    }
    r += is_eq;
  }
  return total;
}

// grid (chunks, rows); rows whose pick is greedy keep argmax_rows' id.
__global__ void __launch_bounds__(kPickThreads)
    pick_sampled_kernel(const float* __restrict__ x, int cols, const TokenPick* __restrict__ picks,
                        int32_t* __restrict__ out, PickWs ws) {
  pdl_begin();
  __shared__ PickShared sh;
  const int r = static_cast<int>(blockIdx.y), chunk = static_cast<int>(blockIdx.x);
  const int chunks = static_cast<int>(gridDim.x);
  const TokenPick p = picks[r];
  if (p.temperature <= 0.0f) return;
  const int k = p.top_k;
  const float* row = x + static_cast<int64_t>(r) * cols;
  const int c0 = chunk * kPickChunk, n = min(cols - c0, kPickChunk);
  for (int i = threadIdx.x; i < n; i += kPickThreads) sh.keys[pidx(i)] = order_key(row[c0 + i]);
  __syncthreads();
  const Kth local = select_kth(sh, sh.keys, n, k);
  uint32_t* wkeys = ws.keys + static_cast<int64_t>(r) * kPickMergeCap;
  int32_t* wids = ws.ids + static_cast<int64_t>(r) * kPickMergeCap;
  const int count =
      compact_selected(sh, sh.keys, nullptr, n, c0, local, wkeys + chunk * k, wids + chunk * k);
  __threadfence();  // every thread's candidates are visible before the ticket counts them
  __syncthreads();
  if (threadIdx.x == 0) {
    ws.counts[r * kPickMaxBlocks + chunk] = count;
    __threadfence();
    sh.last = atomicAdd(&ws.tickets[r], 1) == chunks - 1;
  }
  __syncthreads();
  if (!sh.last) return;
  __threadfence();
  // The merge: the chunks' candidates, in column order, into shared memory.
  if (threadIdx.x == 0) {
    int at = 0;
    for (int b = 0; b < chunks; ++b) {
      sh.offsets[b] = at;
      at += __ldcg(&ws.counts[r * kPickMaxBlocks + b]);
    }
    sh.offsets[chunks] = at;
    ws.tickets[r] = 0;
  }
  __syncthreads();
  uint32_t* mkeys = sh.keys;
  int32_t* mids = reinterpret_cast<int32_t*>(sh.keys + kPickKeysPadded / 2);
  for (int b = 0; b < chunks; ++b) {
    const int at = sh.offsets[b], cnt = sh.offsets[b + 1] - at;
    for (int i = threadIdx.x; i < cnt; i += kPickThreads) {
      mkeys[pidx(at + i)] = __ldcg(&wkeys[b * k + i]);
      mids[pidx(at + i)] = __ldcg(&wids[b * k + i]);
    }
  }
  __syncthreads();
  const int m = sh.offsets[chunks];
  const Kth top = select_kth(sh, mkeys, m, k);
  const int kept = compact_selected(sh, mkeys, mids, m, 0, top, sh.top_keys, sh.top_ids);
  __syncthreads();
  // Rank sort by (logit desc, id asc): the candidates are distinct ids.
  const int t = static_cast<int>(threadIdx.x);
  if (t < kept) {
    const uint32_t kt = sh.top_keys[t];
    const int32_t it = sh.top_ids[t];
    int rank = 0;
    for (int j = 0; j < kept; ++j) {
      const uint32_t kj = sh.top_keys[j];
      rank += kj > kt || (kj == kt && sh.top_ids[j] < it);
    }
    sh.sorted_keys[rank] = kt;
    sh.sorted_ids[rank] = it;
  }
  __syncthreads();
  if (t < kept) {
    const float inv_t = 1.0f / p.temperature;
    const float mx = key_value(sh.sorted_keys[0]);
    sh.e[t] = expf((key_value(sh.sorted_keys[t]) - mx) * inv_t);
  }
  __syncthreads();
  if (t != 0) return;
  // The host's walk (util/token_pick.cpp): zero probabilities and min-p end the list (it is in
  // descending order), then the top-p prefix, then the draw.
  int len = 0;
  while (len < kept && sh.e[len] > 0.0f && !(p.min_p > 0.0f && sh.e[len] < p.min_p)) ++len;
  if (len == 0) return;  // no token has a probability: the argmax stands
  if (p.top_p < 1.0f) {
    double sum = 0, acc = 0;
    for (int i = 0; i < len; ++i) sum += sh.e[i];
    int keep = 0;
    while (keep < len) {
      acc += sh.e[keep++];
      if (acc >= p.top_p * sum) break;
    }
    len = keep;
  }
  double z = 0;
  for (int i = 0; i < len; ++i) z += sh.e[i];
  const double target = p.u * z;
  double acc = 0;
  int32_t id = sh.sorted_ids[len - 1];
  for (int i = 0; i < len; ++i) {
    acc += sh.e[i];
    if (target < acc) {
      id = sh.sorted_ids[i];
      break;
    }
  }
  out[r] = id;
}

// util/token_pick.h's penalized_logit (the same operations: IEEE division, one fma).
__device__ __forceinline__ float penalized(float l, const TokenPenalties& p, int output_count) {
  if (p.repetition != 1.0f) l = l > 0.0f ? l / p.repetition : l * p.repetition;
  if (output_count > 0) l -= fmaf(p.frequency, static_cast<float>(output_count), p.presence);
  return l;
}

// Block per row: its entries name distinct tokens, so each logit is written once; the pending
// token (the row's newest output, picked on the device) adds one occurrence to its entry or
// becomes one.
__global__ void penalize_rows_kernel(float* x, int cols, const PenaltyRow* __restrict__ rows,
                                     const PenaltyEntry* __restrict__ entries,
                                     const int32_t* __restrict__ tokens) {
  pdl_begin();
  __shared__ int seen;
  const PenaltyRow pr = rows[blockIdx.x];
  float* row = x + static_cast<int64_t>(blockIdx.x) * cols;
  const int32_t pending = pr.pending_at >= 0 ? tokens[pr.pending_at] : -1;
  if (threadIdx.x == 0) seen = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < pr.count; i += blockDim.x) {
    const PenaltyEntry e = entries[pr.first + i];
    if (e.token < 0 || e.token >= cols) continue;
    const bool is_pending = e.token == pending;
    if (is_pending) seen = 1;
    row[e.token] = penalized(row[e.token], pr.penalties, e.output_count + (is_pending ? 1 : 0));
  }
  __syncthreads();
  if (threadIdx.x == 0 && !seen && pending >= 0 && pending < cols) {
    row[pending] = penalized(row[pending], pr.penalties, 1);
  }
}

constexpr int64_t kPenaltyMaxRows = 1024;
constexpr int64_t kPenaltyMaxEntries = int64_t{1} << 20;  // 8 MB

}  // namespace

// The workspace: candidates' keys and ids, counts, tickets (zero at rest), the picks, then the
// penalties' rows and entries.
size_t pick_workspace_bytes() {
  return static_cast<size_t>(kPickMaxRows) * (2 * kPickMergeCap + kPickMaxBlocks + 1) * 4 +
         static_cast<size_t>(kPickMaxRows) * sizeof(TokenPick) +
         static_cast<size_t>(kPenaltyMaxRows) * sizeof(PenaltyRow) +
         static_cast<size_t>(kPenaltyMaxEntries) * sizeof(PenaltyEntry);
}

int64_t penalty_max_entries() {
  return kPenaltyMaxEntries;
}

bool pick_supported(const TokenPick& p, int64_t cols) {
  if (p.greedy()) return true;
  const int64_t chunks = (cols + kPickChunk - 1) / kPickChunk;
  return p.top_k >= 1 && p.top_k < cols && p.top_k <= kPickMaxTopK && chunks <= kPickMaxBlocks &&
         chunks * p.top_k <= kPickMergeCap && p.temperature < INFINITY;
}

}  // namespace tokenmill::cuda

namespace tokenmill {

bool CudaBackend::can_pick(const TokenPick& pick, int64_t cols) const {
  return cuda::pick_supported(pick, cols);
}

int64_t CudaBackend::max_penalty_entries() const {
  return cuda::penalty_max_entries();
}

void CudaBackend::penalize_rows(float* x, int64_t n_rows, int64_t cols, const PenaltyRow* rows,
                                const PenaltyEntry* entries, int64_t n_entries,
                                const int32_t* tokens) {
  TM_CUDA_REQUIRE(n_entries >= 0 && n_entries <= cuda::kPenaltyMaxEntries && cols <= INT32_MAX,
                  "penalize_rows: more entries than max_penalty_entries()");
  if (n_rows <= 0) return;
  auto* dev_rows = reinterpret_cast<PenaltyRow*>(
      static_cast<char*>(pick_ws_) + cuda::pick_workspace_bytes() -
      cuda::kPenaltyMaxEntries * sizeof(PenaltyEntry) - cuda::kPenaltyMaxRows * sizeof(PenaltyRow));
  auto* dev_entries = reinterpret_cast<PenaltyEntry*>(dev_rows + cuda::kPenaltyMaxRows);
  for (int64_t r = 0; r < n_rows; ++r) {
    TM_CUDA_REQUIRE(rows[r].first >= 0 && rows[r].count >= 0 &&
                        rows[r].first + int64_t{rows[r].count} <= n_entries,
                    "penalize_rows: a row names entries outside the list");
  }
  if (n_entries > 0) {
    upload(dev_entries, entries, static_cast<size_t>(n_entries) * sizeof(PenaltyEntry));
  }
  for (int64_t r0 = 0; r0 < n_rows; r0 += cuda::kPenaltyMaxRows) {
    const int64_t n = std::min(cuda::kPenaltyMaxRows, n_rows - r0);
    upload(dev_rows, rows + r0, static_cast<size_t>(n) * sizeof(PenaltyRow));
    cuda::launch_pdl(cuda::penalize_rows_kernel, dim3(static_cast<unsigned>(n)), dim3(256), 0,
                     stream_, x + r0 * cols, static_cast<int>(cols),
                     static_cast<const PenaltyRow*>(dev_rows),
                     static_cast<const PenaltyEntry*>(dev_entries), tokens);
    TM_CUDA_LAUNCHED();
  }
}

void CudaBackend::pick_tokens(const float* x, int64_t rows, int64_t cols, const TokenPick* picks,
                              int32_t* out) {
  if (rows <= 0) return;
  argmax_rows(x, rows, cols, out);
  using cuda::kPickMaxRows;
  // The workspace: candidates' keys and ids, counts, tickets (zero at rest), then the picks.
  auto* keys = static_cast<uint32_t*>(pick_ws_);
  auto* ids = reinterpret_cast<int32_t*>(keys + kPickMaxRows * cuda::kPickMergeCap);
  int32_t* counts = ids + kPickMaxRows * cuda::kPickMergeCap;
  int32_t* tickets = counts + kPickMaxRows * cuda::kPickMaxBlocks;
  auto* dev_picks = reinterpret_cast<TokenPick*>(tickets + kPickMaxRows);
  const cuda::PickWs ws{keys, ids, counts, tickets};
  const auto chunks = static_cast<unsigned>((cols + cuda::kPickChunk - 1) / cuda::kPickChunk);
  for (int64_t r0 = 0; r0 < rows; r0 += kPickMaxRows) {
    const int64_t n = std::min<int64_t>(kPickMaxRows, rows - r0);
    bool sampled = false;
    for (int64_t r = r0; r < r0 + n; ++r) {
      TM_CUDA_REQUIRE(can_pick(picks[r], cols), "pick_tokens: a pick can_pick refuses");
      sampled |= !picks[r].greedy();
    }
    if (!sampled) continue;
    upload(dev_picks, picks + r0, static_cast<size_t>(n) * sizeof(TokenPick));
    cuda::launch_pdl(cuda::pick_sampled_kernel, dim3(chunks, static_cast<unsigned>(n)),
                     dim3(cuda::kPickThreads), 0, stream_, x + r0 * cols, static_cast<int>(cols),
                     static_cast<const TokenPick*>(dev_picks), out + r0, ws);
    TM_CUDA_LAUNCHED();
  }
}

}  // namespace tokenmill
