// Mixture of experts. Prefill-sized batches (outside stream capture) group their rows by
// expert: the routing ids come to the host (one sync) and are counting-sorted by expert in slot
// order, so each expert's weights are read once per group of rows instead of once per slot.
// 4-bit experts (moe_chunks, from kChunkedSlotsPerExpertQ4 slots per expert on average): the
// rows in expert order are cut into chunks of up to 64 rows of one expert, and pieces of chunks
// run gather, prepare, one wide-GEMV launch for gate and up, silu_mul, prepare and one for down;
// the combine reads the down rows through each slot's position. Other formats (moe_grouped,
// from kGroupedSlotsPerExpert): each expert's tokens through its matrices in one linear call
// each, the down rows scattered back to slot order. (The slot-by-slot form took 265 ms per
// 35B-A3B layer at an 8k-token prompt.)
//
// The other batches take the simple device-side form: routing ids stay on the device (no host
// sync). For each (token, slot) pair s = t*k + j, gate and up GEMVs of expert ids[s] on x[t],
// silu(gate)*up, the down GEMV, then out[t] = sum_j weights[t, j] * down[s] in slot order.
// Each slot reads its expert's weights once (which the grouped form above avoids for many
// tokens). 4-bit experts take the tensor-core GEMV (gate and up in one launch) while the
// prepared activations fit its workspace; there a shared expert of the routed experts' shape
// and format is one more slot per token (no launches of its own), silu(gate)*up is computed
// while the down projection's input is prepared, and the combine adds the gated shared output.
// Any other shared expert runs after the routed ones (Backend::add_shared_expert).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv.h"

namespace tokenmill::cuda {
namespace {

// out[t] = sum_j w[t, j] * down[t * per_token + j] (+ sigmoid(gate_logit[t]) * the shared
// expert's row t * per_token + k when per_token > k), in the CPU backend's order. With `pos`,
// slot s's row of `down` is pos[s] (rows in expert order).
__global__ void moe_combine_kernel(const float* __restrict__ down, const float* __restrict__ w,
                                   int k, int per_token, const float* __restrict__ gate_logit,
                                   int64_t hidden, float* __restrict__ out,
                                   const int32_t* __restrict__ pos) {
  pdl_begin();
  const int64_t t = blockIdx.x;
  // Columns spread over blockIdx.y too: one token's row is a few KB, one block alone waited
  // k dependent-free but serialized loads per column step.
  for (int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; c < hidden;
       c += static_cast<int64_t>(gridDim.y) * blockDim.x) {
    float acc = 0.0f;
    if (pos != nullptr) {
      for (int j = 0; j < k; ++j) acc += w[t * k + j] * down[pos[t * k + j] * hidden + c];
    } else {
      const float* d = down + t * per_token * hidden + c;
      for (int j = 0; j < k; ++j) acc += w[t * k + j] * d[j * hidden];
      if (per_token > k) acc += d[k * hidden] * sigmoid_f(gate_logit[t]);
    }
    out[t * hidden + c] = acc;
  }
}

// dst[rows[i]] = src[i] for rows of `dim` floats (block i).
__global__ void scatter_rows_kernel(const float* __restrict__ src, int64_t dim,
                                    const int32_t* __restrict__ rows, float* __restrict__ dst) {
  pdl_begin();
  const int64_t i = blockIdx.x;
  const float* s = src + i * dim;
  float* d = dst + static_cast<int64_t>(rows[i]) * dim;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) d[c] = s[c];
}

// Average slots per expert from which 4-bit experts take the chunked form (moe_chunks: rows
// grouped by expert on the host, each expert's weights read once per 64 rows by the wide
// tensor-core GEMV, about 7 launches per piece of rows) instead of the slot kernels, which read
// an expert's weights once per slot. H200, 35B-A3B (8 of 256 experts), whole prefill, chunked
// against slots: 128 tokens 1,662 / 2,986 tok/s, 512 3,924 / 4,094, 1,024 5,319 / 4,258, 2,048
// 6,467 / 4,380: they cross between 16 and 32 slots per expert.
constexpr int64_t kChunkedSlotsPerExpertQ4 = 24;
// Other formats: the grouped form (moe_grouped: about 25 launches per expert through linear,
// 15 ms per 35B-A3B-shaped layer before any arithmetic) from 8 slots per expert; their per-slot
// SIMT GEMVs are slower per slot than the 4-bit slot kernels.
constexpr int64_t kGroupedSlotsPerExpert = 8;

}  // namespace
}  // namespace tokenmill::cuda

namespace tokenmill {

namespace {

void combine(const float* dn, const float* weights, int64_t n, int k, int per_token,
             const float* gate_logit, int64_t hidden, float* out, cudaStream_t st,
             const int32_t* pos = nullptr) {
  const dim3 grid(static_cast<unsigned>(n),
                  static_cast<unsigned>(std::min<int64_t>((hidden + 255) / 256, 65535)));
  cuda::launch_pdl(cuda::moe_combine_kernel, grid, 256, 0, st, dn, weights, k, per_token,
                   gate_logit, hidden, out, pos);
  TM_CUDA_LAUNCHED();
}

}  // namespace

void CudaBackend::moe_combine_into(const MoeRows& y, int64_t rows, int dim, float* out) {
  combine(y.rows, y.weights, rows, y.k, y.per_token, y.gate_logit, dim, out, stream_);
}

void CudaBackend::add_moe(float* x, const MoeRows& y, float* out, int64_t rows, int dim) {
  moe_combine_into(y, rows, dim, out);
  add(x, out, rows * dim);
}

void CudaBackend::moe(const float* x, int64_t n, int k, const int32_t* ids, const float* weights,
                      const Weight& gate, const Weight& up, const Weight& down,
                      const SharedExpert* shared, float* out, float* scratch) {
  moe_experts(x, n, k, ids, weights, gate, up, down, shared, out, scratch, nullptr);
}

void CudaBackend::moe_experts(const float* x, int64_t n, int k, const int32_t* ids,
                              const float* weights, const Weight& gate, const Weight& up,
                              const Weight& down, const SharedExpert* shared, float* out,
                              float* scratch, const cuda::Q4Act* prepared, MoeRows* defer,
                              const cuda::Q4Picks* picks) {
  if (defer != nullptr) *defer = MoeRows{};
  if (n <= 0) return;
  // Picks left by moe_block's front: the gate/up launch makes them when it takes all n rows;
  // any other path needs the ids first.
  const auto make_picks = [&] {
    if (picks == nullptr) return;
    topk_softmax(picks->logits, n, picks->experts, k, picks->renormalize, picks->ids,
                 picks->weights);
    if (picks->y != nullptr) add(picks->x, picks->y, picks->resid_floats);
    picks = nullptr;
  };
  const int64_t E = gate.experts, hidden = gate.cols, inter = gate.rows;
  TM_CUDA_REQUIRE(E > 0 && up.experts == E && down.experts == E,
                  "moe: gate, up and down must have the same number of experts");
  TM_CUDA_REQUIRE(
      up.rows == inter && up.cols == hidden && down.rows == hidden && down.cols == inter,
      "moe: expert shapes disagree (gate/up [inter, hidden], down [hidden, inter])");
  TM_CUDA_REQUIRE(k >= 1, "moe: k must be >= 1");
  const cuda::DevMat mg = cuda::make_devmat(gate, 0), mu = cuda::make_devmat(up, 0),
                     md = cuda::make_devmat(down, 0);
  const size_t ws = kGemvWorkspaceBytes;
  const bool q4 = cuda::q4_mma_eligible(mg) && cuda::q4_mma_eligible(mu) &&
                  cuda::q4_mma_eligible(md) && mg.group == mu.group && mg.sdtype == mu.sdtype &&
                  reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(scratch) % 16 == 0 && inter % 4 == 0;
  // The shared expert as slot k of each token: same shapes and formats as the routed experts.
  cuda::DevMat sg, su, sd;
  bool fuse_shared = false;
  if (q4 && shared != nullptr) {
    sg = cuda::make_devmat(*shared->gate, 0), su = cuda::make_devmat(*shared->up, 0),
    sd = cuda::make_devmat(*shared->down, 0);
    const auto same = [](const cuda::DevMat& a, const cuda::DevMat& b) {
      return cuda::q4_mma_eligible(a) && a.experts == 1 && a.rows == b.rows && a.cols == b.cols &&
             a.group == b.group && a.sdtype == b.sdtype;
    };
    fuse_shared = same(sg, mg) && same(su, mu) && same(sd, md);
  }
  const int64_t shared_inter = shared != nullptr ? shared->gate->rows : 0;
  const int64_t scratch_floats = moe_scratch_floats(n, k, inter, shared_inter, hidden);
  if (!q4 || n * k >= cuda::kChunkedSlotsPerExpertQ4 * E) make_picks();  // not the slot kernels
  if (q4 && n * k >= cuda::kChunkedSlotsPerExpertQ4 * E &&
      moe_chunks(x, n, k, ids, weights, mg, mu, md, out, scratch, scratch_floats)) {
    if (shared != nullptr) add_shared_expert(x, n, *shared, out, scratch);
    return;
  }
  if (!q4 && n * k >= cuda::kGroupedSlotsPerExpert * E &&
      moe_grouped(x, n, k, ids, weights, gate, up, down, out, scratch, scratch_floats)) {
    if (shared != nullptr) add_shared_expert(x, n, *shared, out, scratch);
    return;
  }
  const int per_token = k + (fuse_shared ? 1 : 0);
  // The 4-bit slot kernels take as many tokens at once as their activation workspace holds;
  // longer batches run in pieces of that many tokens (the cost is per slot, so pieces cost
  // nothing extra).
  int64_t piece = 0;
  if (q4) {
    piece = std::max<int64_t>(ws / (cuda::q4_act_bytes(1, hidden, mg.group) + 1024),
                              1);  // an upper bound, lowered until both fit
    piece = std::min(piece, n);
    while (piece > 0 && (cuda::q4_act_bytes(piece, hidden, mg.group) > ws ||
                         cuda::q4_act_bytes(piece * per_token, inter, md.group) > ws)) {
      piece = piece * 7 / 8;
    }
  }
  const bool fits = q4 && piece > 0;
  // Decode tokens in one piece whose slots' clusters fit one wave (on the 35B-A3B one token's
  // nine): the fused expert MLP.
  const bool fused_mlp = fits && piece >= n && n <= cuda::kQ4PickMaxTokens &&
                         n * per_token * cuda::kExpertMlpBlocks <= gemv_ws_.sm_count;
  fuse_shared = fuse_shared && fits;
  if (!fits || piece < n) make_picks();  // not in one piece
  if (fits) {
    for (int64_t t0 = 0; t0 < n; t0 += piece) {
      const int64_t m = std::min(piece, n - t0), slots = m * per_token;
      const int32_t* pids = ids + t0 * k;
      // scratch: gate out [slots, inter], up out [slots, inter], down out [slots, hidden].
      float* act = scratch;
      float* upo = act + slots * inter;
      float* dn = upo + slots * inter;
      cuda::Q4Slots gu_slots{pids, k, per_token, per_token};
      if (picks != nullptr) gu_slots.picks = *picks;  // one piece (else made above)
      cuda::GemvJobs gu;
      gu.m[0] = mg, gu.m[1] = mu, gu.m[2] = sg, gu.m[3] = su;
      gu.out[0] = act, gu.out[1] = upo;
      gu.count = 2;
      gu.shared_offset = fuse_shared ? 2 : 0;
      // x's digits as moe_block's fused front prepared them, when they are these rows' and in
      // this layout; else prepared here.
      const bool ready = prepared != nullptr && t0 == 0 && m == n && prepared->rows == n &&
                         prepared->group == mg.group && prepared->ld == 2 * hidden &&
                         prepared->operands == cuda::Q4Operands::kDigits;
      const cuda::Q4Act ax =
          ready ? *prepared
                : cuda::launch_q4_prepare(stream_, x + t0 * hidden, hidden, m, hidden, mg.group,
                                          cuda::Q4Operands::kDigits, gemv_ws_);
      if (fused_mlp && (shared == nullptr || fuse_shared) &&
          cuda::expert_mlp_takes(mg, mu, md, per_token, m)) {
        // One launch for the slots' whole MLPs (cuda_moe_mlp.cu).
        cuda::ExpertMlpArgs ea;
        ea.gate = mg, ea.up = mu, ea.down = md;
        if (fuse_shared) ea.shared_gate = sg, ea.shared_up = su, ea.shared_down = sd;
        ea.x = ax;
        ea.slots = gu_slots;
        ea.out = dn;
        cuda::launch_expert_mlp(stream_, ea, static_cast<int>(slots));
      } else {
        cuda::launch_q4_gemv(stream_, gu, ax, 1, gu_slots, slots, gemv_ws_);
        cuda::GemvJobs dj;
        dj.m[0] = md, dj.m[1] = sd;
        dj.out[0] = dn;
        dj.count = 1;
        dj.shared_offset = fuse_shared ? 1 : 0;
        const cuda::Q4Act aa = cuda::launch_q4_prepare(stream_, act, inter, slots, inter, md.group,
                                                       cuda::Q4Operands::kDigits, gemv_ws_, upo);
        // The ids came from the gate+up launch (Q4Picks) or before it, and the preparation runs
        // in between: the down projection may read them, and its weights, before its wait.
        cuda::launch_q4_gemv(stream_, dj, aa, 1, cuda::Q4Slots{pids, k, per_token, 1, true}, slots,
                             gemv_ws_);
      }
      // Decode rows in one piece with nothing added after: the combine may go to the next
      // block's norm (the rows stay in scratch until then).
      if (defer != nullptr && t0 == 0 && m == n && n <= cuda::kQ4DigitMaxRows &&
          (shared == nullptr || fuse_shared)) {
        *defer = MoeRows{dn, weights, fuse_shared ? shared->gate_logit : nullptr, k, per_token};
        continue;
      }
      combine(dn, weights + t0 * k, m, k, per_token,
              fuse_shared ? shared->gate_logit + t0 : nullptr, hidden, out + t0 * hidden, stream_);
    }
  } else {
    moe_routed_indexed(x, n, k, ids, weights, mg, mu, md, out, scratch);
  }
  if (shared != nullptr && !fuse_shared) add_shared_expert(x, n, *shared, out, scratch);
}

void CudaBackend::moe_routed_indexed(const float* x, int64_t n, int k, const int32_t* ids,
                                     const float* weights, const cuda::DevMat& mg,
                                     const cuda::DevMat& mu, const cuda::DevMat& md, float* out,
                                     float* scratch) {
  const int64_t hidden = mg.cols, inter = mg.rows, slots = n * k;
  float* act = scratch;
  float* upo = act + slots * inter;
  float* dn = upo + slots * inter;
  // Slots are launched in chunks of whole tokens (grid.y <= 65535).
  const int64_t chunk = 65535 / k * k;
  TM_CUDA_REQUIRE(chunk > 0, "moe: k must be <= 65535");
  for (int64_t s0 = 0; s0 < slots; s0 += chunk) {
    const int64_t cnt = slots - s0 < chunk ? slots - s0 : chunk;
    const float* xs = x + (s0 / k) * hidden;
    cuda::launch_gemv_indexed(stream_, mg, ids + s0, cnt, xs, hidden, k, act + s0 * inter, inter);
    cuda::launch_gemv_indexed(stream_, mu, ids + s0, cnt, xs, hidden, k, upo + s0 * inter, inter);
  }
  silu_mul(act, upo, act, slots * inter);
  for (int64_t s0 = 0; s0 < slots; s0 += chunk) {
    const int64_t cnt = slots - s0 < chunk ? slots - s0 : chunk;
    cuda::launch_gemv_indexed(stream_, md, ids + s0, cnt, act + s0 * inter, inter, 1,
                              dn + s0 * hidden, hidden);
  }
  combine(dn, weights, n, k, k, nullptr, hidden, out, stream_);
}

}  // namespace tokenmill

namespace tokenmill {

CudaBackend::ExpertOrder CudaBackend::expert_order(const int32_t* ids, int64_t slots, int64_t E) {
  std::vector<int32_t> h_ids(static_cast<size_t>(slots));
  download(h_ids.data(), ids, h_ids.size() * sizeof(int32_t));
  ExpertOrder o;
  o.start.assign(static_cast<size_t>(E) + 1, 0);
  for (int64_t s = 0; s < slots; ++s) {
    const int32_t e = h_ids[static_cast<size_t>(s)];
    if (e < 0 || e >= E) {
      const std::string msg = "moe: routing id " + std::to_string(e) + " of slot " +
                              std::to_string(s) + " is outside 0.." + std::to_string(E - 1);
      TM_CUDA_REQUIRE(false, msg.c_str());
    }
    ++o.start[static_cast<size_t>(e) + 1];
  }
  for (int64_t e = 0; e < E; ++e) o.start[e + 1] += o.start[e];
  o.slot_at.resize(static_cast<size_t>(slots));
  std::vector<int64_t> fill(o.start.begin(), o.start.end() - 1);
  for (int64_t s = 0; s < slots; ++s) {
    o.slot_at[static_cast<size_t>(fill[static_cast<size_t>(h_ids[static_cast<size_t>(s)])]++)] =
        static_cast<int32_t>(s);
  }
  return o;
}

bool CudaBackend::moe_grouped(const float* x, int64_t n, int k, const int32_t* ids,
                              const float* weights, const Weight& gate, const Weight& up,
                              const Weight& down, float* out, float* scratch,
                              int64_t scratch_floats) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  TM_CUDA(cudaStreamIsCapturing(stream_, &capture));
  if (capture != cudaStreamCaptureStatusNone) return false;  // no host sync inside a recording
  const int64_t E = gate.experts, hidden = gate.cols, inter = gate.rows, slots = n * k;
  // Scratch: down rows in slot order [slots, hidden], one expert's gathered rows [n, hidden]
  // (then its down output), its gate and up outputs [n, inter] each, then the token and slot
  // lists [slots] each (int32). Each part starts 16-byte aligned.
  const auto al4 = [](int64_t f) { return (f + 3) / 4 * 4; };
  const int64_t o_xg = al4(slots * hidden), o_g = o_xg + al4(n * hidden),
                o_u = o_g + al4(n * inter), o_idx = o_u + al4(n * inter),
                need = o_idx + al4(2 * slots);
  if (need > scratch_floats || slots > INT32_MAX || n > INT32_MAX) return false;
  float* dn = scratch;
  float* xg = scratch + o_xg;
  float* g = scratch + o_g;
  float* u = scratch + o_u;
  auto* d_tok = reinterpret_cast<int32_t*>(scratch + o_idx);
  int32_t* d_slot = d_tok + slots;

  const ExpertOrder order = expert_order(ids, slots, E);
  const std::vector<int64_t>& start = order.start;
  std::vector<int32_t> lists(static_cast<size_t>(2 * slots));
  for (int64_t at = 0; at < slots; ++at) {
    const int32_t s = order.slot_at[static_cast<size_t>(at)];
    lists[static_cast<size_t>(at)] = s / k;
    lists[static_cast<size_t>(slots + at)] = s;
  }
  upload(d_tok, lists.data(), lists.size() * sizeof(int32_t));

  for (int64_t e = 0; e < E; ++e) {
    const int64_t ne = start[e + 1] - start[e];
    if (ne == 0) continue;
    const int ei = static_cast<int>(e);
    gather_rows(x, static_cast<int>(hidden), d_tok + start[e], static_cast<int>(ne), xg);
    linear(xg, ne, gate, g, ei);
    linear(xg, ne, up, u, ei);
    silu_mul(g, u, g, ne * inter);
    linear(g, ne, down, xg, ei);
    cuda::launch_pdl(cuda::scatter_rows_kernel, static_cast<unsigned>(ne), 256, 0, stream_, xg,
                     hidden, d_slot + start[e], dn);
    TM_CUDA_LAUNCHED();
  }
  combine(dn, weights, n, k, k, nullptr, hidden, out, stream_);
  return true;
}

}  // namespace tokenmill

namespace tokenmill {

bool CudaBackend::moe_chunks(const float* x, int64_t n, int k, const int32_t* ids,
                             const float* weights, const cuda::DevMat& mg, const cuda::DevMat& mu,
                             const cuda::DevMat& md, float* out, float* scratch,
                             int64_t scratch_floats) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  TM_CUDA(cudaStreamIsCapturing(stream_, &capture));
  if (capture != cudaStreamCaptureStatusNone) return false;  // no host sync inside a recording
  const int64_t E = mg.experts, hidden = mg.cols, inter = mg.rows, slots = n * k;
  if (slots > INT32_MAX / 2) return false;
  constexpr int64_t kRows = cuda::kQ4GemvMaxRows;  // rows per chunk
  const int64_t max_chunks = slots / kRows + E;
  // Scratch: the down rows in expert order [slots, hidden]; the index lists (the token of each
  // row in expert order, each slot's row, the chunks); then one piece's gathered rows [P,
  // hidden] and its gate and up outputs [P, inter] each. Parts 16-byte aligned.
  const auto al4 = [](int64_t f) { return (f + 3) / 4 * 4; };
  const int64_t o_idx = al4(slots * hidden), o_piece = o_idx + al4(2 * slots) + 4 * max_chunks;
  const int64_t per_row = al4(hidden) + 2 * al4(inter);
  int64_t piece = (scratch_floats - o_piece) / per_row;
  // A piece's prepared activations fit the GEMV workspace (16 MB: about 1,900 rows of 2,048).
  // That also keeps them in L2, which the wide kernel rereads them from for every 16-row weight
  // tile: pieces of 8,192 rows (64 MB) made the 35B-A3B's 8k prefill 13% slower (measured).
  while (piece >= kRows && (cuda::q4_act_bytes(piece, hidden, mg.group) > gemv_ws_.act_bytes ||
                            cuda::q4_act_bytes(piece, inter, md.group) > gemv_ws_.act_bytes)) {
    piece = piece * 7 / 8;
  }
  if (piece < kRows) return false;
  const cuda::GemvWorkspace& ws = gemv_ws_;
  float* dn = scratch;
  auto* d_tok = reinterpret_cast<int32_t*>(scratch + o_idx);
  int32_t* d_pos = d_tok + slots;
  int32_t* d_chunks = reinterpret_cast<int32_t*>(scratch + o_idx + al4(2 * slots));
  float* xp = scratch + o_piece;
  float* gp = xp + piece * al4(hidden);
  float* upp = gp + piece * al4(inter);

  const ExpertOrder order = expert_order(ids, slots, E);
  const std::vector<int64_t>& start = order.start;
  // Host lists: token of each row in expert order, row of each slot, then the chunks.
  std::vector<int32_t> lists(static_cast<size_t>(o_piece - o_idx), 0);
  for (int64_t at = 0; at < slots; ++at) {
    const int32_t s = order.slot_at[static_cast<size_t>(at)];
    lists[static_cast<size_t>(at)] = s / k;
    lists[static_cast<size_t>(slots + s)] = static_cast<int32_t>(at);
  }
  // Chunks of up to kRows rows of one expert; pieces are runs of chunks of at most `piece`
  // rows, and a chunk's first row counts from its piece's first row.
  struct Piece {
    int64_t row0, rows, chunk0, chunks;
  };
  std::vector<Piece> pieces;
  int32_t* hc = lists.data() + al4(2 * slots);
  int64_t nc = 0;
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = start[e]; r < start[e + 1]; r += kRows) {
      const int64_t rows = std::min(kRows, start[e + 1] - r);
      if (pieces.empty() || pieces.back().rows + rows > piece) pieces.push_back({r, 0, nc, 0});
      Piece& p = pieces.back();
      hc[4 * nc] = static_cast<int32_t>(e);
      hc[4 * nc + 1] = static_cast<int32_t>(r - p.row0);
      hc[4 * nc + 2] = static_cast<int32_t>(rows);
      p.rows += rows;
      ++p.chunks;
      ++nc;
    }
  }
  upload(d_tok, lists.data(), (al4(2 * slots) + 4 * nc) * sizeof(int32_t));

  // The wgmma kernel where it runs (sm_90, groups 64 and 128), else the mma.sync one.
  const cuda::Q4Operands chunk_operands =
      cuda::q4_operands_for(cuda::kQ4GemvMaxRows, false, mg.group, ws);
  for (const Piece& p : pieces) {
    const int32_t* pc = d_chunks + 4 * p.chunk0;
    gather_rows(x, static_cast<int>(hidden), d_tok + p.row0, static_cast<int>(p.rows), xp);
    const cuda::Q4Act ax =
        cuda::launch_q4_prepare(stream_, xp, hidden, p.rows, hidden, mg.group, chunk_operands, ws);
    cuda::GemvJobs gu;
    gu.m[0] = mg, gu.m[1] = mu;
    gu.out[0] = gp, gu.out[1] = upp;
    gu.count = 2;
    cuda::launch_q4_gemv_chunks(stream_, gu, ax, pc, p.chunks, ws);
    silu_mul(gp, upp, gp, p.rows * inter);
    const cuda::Q4Act aa =
        cuda::launch_q4_prepare(stream_, gp, inter, p.rows, inter, md.group, chunk_operands, ws);
    cuda::GemvJobs dj;
    dj.m[0] = md;
    dj.out[0] = dn + p.row0 * hidden;
    dj.count = 1;
    cuda::launch_q4_gemv_chunks(stream_, dj, aa, pc, p.chunks, ws);
  }
  combine(dn, weights, n, k, k, nullptr, hidden, out, stream_, d_pos);
  return true;
}

}  // namespace tokenmill
