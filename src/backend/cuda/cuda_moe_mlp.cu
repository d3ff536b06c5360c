// The MoE block's expert MLPs for one decode token in one launch (CudaBackend::moe_block): slot
// s (a routed expert, or the shared one) is one cluster of kBlocks blocks that runs that expert's
// whole MLP. Block b of a cluster takes gate rows and up rows of the same indices (so it makes
// its own silu(gate) * up), pushes those values into every block of the cluster by asynchronous
// stores counted on the receivers' mbarriers, and once its mbarrier has the whole intermediate
// row each block makes its digits and runs its share of the down projection's rows. No cluster
// barrier: a block leaves as soon as its rows are done, and the next launch's blocks take its
// multiprocessor (+1.0% a token, H100, S49). The down rows go to out[slot] as the slot GEMVs
// write them (the combine, deferred to the next norm or not, reads them there).
//
// Why: the slot form takes three launches a MoE layer (gate and up over every slot, the down
// projection's input preparation, the down projection), each spread over the whole chip with
// stream-K fixups, so a layer's 15.6 MB (35B-A3B) took about 16.5 us on an H100 where its bytes
// take 4.7. Here a slot's dependencies stay inside its cluster. Measured (H200, 35B-A3B q4g64,
// batch 1): 14.2 us a layer against the slot form's 14.9, +1.1% a token. Its time is two
// dependent cold bursts (gate and up, then down) on 72 of 132 multiprocessors, which deeper
// loads do not shorten: PERFORMANCE.md (S47) has the forms tried (the block's whole share
// copied into shared memory first, L2 prefetches) and the read probe behind that.
//
// Arithmetic: the digit GEMV's (Q4DigitDot: 8-bit digits, integer mma, F32 per group); a tile's
// groups are split between `split` warps whose partial sums are added in warp order, so the
// result is the slot GEMVs' to F32 rounding (their split points differ).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv.h"
#include "backend/cuda/cuda_gemv_q4.cuh"
#include "backend/cuda/cuda_gemv_q4d.cuh"

namespace tokenmill::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kBlocks = kExpertMlpBlocks;
constexpr int kWarps = 16;  // warps a block
constexpr int kThreads = 32 * kWarps;

// U: groups per buffer (the slot GEMV's: 2 at group 64, 1 at 128).
template <int G, int ST, int U>
__global__ void __cluster_dims__(kBlocks, 1, 1) __launch_bounds__(kThreads, 1)
    moe_expert_mlp_kernel(ExpertMlpArgs a) {
  __shared__ float gu[2][kExpertMlpMaxInter / kBlocks];  // this block's gate and up values
  __shared__ float h[kExpertMlpMaxInter];                // silu(gate) * up, the whole row
  __shared__ uint2 hd[4 * kExpertMlpMaxInter / 8];       // h's digit planes, inter / 8 words each
  __shared__ float2 hs[kExpertMlpMaxInter / 32];         // h's {2^-e, sum} per group
  __shared__ float part[kWarps][64];                     // split partial sums (2 a lane)
  __shared__ uint64_t hbar;                              // h's bytes, from every block
  cg::cluster_group cl = cg::this_cluster();
  const int rank = static_cast<int>(cl.block_rank());
  const int slot = static_cast<int>(blockIdx.y);
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, t = lane & 3;
  const Q4Slots& sl = a.slots;
  if (threadIdx.x == 0) {  // the slot's intermediate row (a routed expert's or the shared one's)
    const bool routed = slot % sl.per_token < sl.k;
    mbar_init(smem_addr(&hbar), 1);
    mbar_expect(smem_addr(&hbar),
                static_cast<uint32_t>((routed ? a.gate.rows : a.shared_gate.rows) * sizeof(float)));
    fence_mbarrier_init();
  }
  __syncwarp();
  cluster_arrive_relaxed();
  pdl_begin();
  const int32_t* ids = sl.ids;
  if (sl.picks.logits != nullptr) {
    ids = q4_make_picks(sl, static_cast<int64_t>(slot) * kBlocks + rank,
                        static_cast<int64_t>(gridDim.y) * kBlocks);
  }
  // The slot's matrices.
  const int token = slot / sl.per_token, j = slot - token * sl.per_token;
  DevMat mg = a.shared_gate, mu = a.shared_up, md = a.shared_down;
  bool bad = false;
  if (j < sl.k) {
    const int e = ids[token * sl.k + j];
    bad = e < 0 || e >= a.gate.experts;  // the router never produces one; make it visible
    mg = at_expert(a.gate, bad ? 0 : e);
    mu = at_expert(a.up, bad ? 0 : e);
    md = at_expert(a.down, bad ? 0 : e);
  }
  const int inter = static_cast<int>(mg.rows), hidden = static_cast<int>(md.rows);
  const int rows_b = inter / kBlocks, tiles_b = rows_b / 16;  // gate (and up) rows a block
  const int down_tiles_b = hidden / 16 / kBlocks;
  const int64_t gate_tile0 = int64_t{rank} * tiles_b, down_tile0 = int64_t{rank} * down_tiles_b;

  // Gate and up: 2 tiles_b tile jobs over the warps, `split` warps a job, each a share of the
  // groups; the first warp of a job adds the others' partials in order.
  const int jobs = 2 * tiles_b, split = kWarps / jobs;
  const int job = warp / split, piece = warp - job * split;
  {
    const bool up = job >= tiles_b;
    const int jt = up ? job - tiles_b : job;
    const int groups = static_cast<int>(mg.cols / G), per = groups / split;
    float tot[1][2];
    if (bad) {
      tot[0][0] = tot[0][1] = __int_as_float(0x7fc00000);
    } else {
      const Q4Tile q{up ? mu : mg, nullptr, (gate_tile0 + jt) * 16, token, 1, false};
      Q4DigitDot<G, 1, U, ST>(q, a.x, (piece + 1) * per).run(piece * per, tot);
    }
    if (piece > 0) {
      part[warp][2 * lane] = tot[0][0];
      part[warp][2 * lane + 1] = tot[0][1];
    }
    __syncthreads();
    if (piece == 0) {
      for (int p = 1; p < split; ++p) {
        tot[0][0] += part[warp + p][2 * lane];
        tot[0][1] += part[warp + p][2 * lane + 1];
      }
      // Lane pair (2i, 2i + 1) holds digits (0, 1) and (2, 3) of the row (slot GEMV's epilogue).
      const float weight = (t & 1) ? 1.0f : 65536.0f;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float v = tot[0][hh] * weight;
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        if (t == 0) gu[up ? 1 : 0][jt * 16 + g + 8 * hh] = v;
      }
    }
  }
  __syncthreads();
  // silu(gate) * up of this block's rows into every block's h (the cluster's mbarriers were
  // initialized long before: the wait returns at once).
  cluster_wait();
  for (int i = static_cast<int>(threadIdx.x); i < rows_b * kBlocks; i += kThreads) {
    const int r = i % rows_b;
    const uint32_t dst = static_cast<uint32_t>(i / rows_b);
    const float v = silu_f(gu[0][r]) * gu[1][r];
    st_async_cluster(cluster_addr(smem_addr(&h[rank * rows_b + r]), dst), v,
                     cluster_addr(smem_addr(&hbar), dst));
  }
  mbar_wait_cluster(smem_addr(&hbar), 0);
  // h's digits (the down projection's input), every block the whole row.
  const int words = inter / 8;
  for (int w0 = warp * 32; w0 < words; w0 += kThreads) {
    const int wi = w0 + lane;
    const bool live = wi < words;
    float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    if (live) {
      const float* p = h + 8 * wi;
      const float nib[8] = {p[0], p[2], p[4], p[6], p[1], p[3], p[5], p[7]};  // nibble order
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = nib[i];
    }
    const Q4dWord dw = q4d_word(v, G);
    if (live) {
#pragma unroll
      for (int d = 0; d < 4; ++d) hd[d * words + wi] = dw.dw[d];
      if (wi % (G / 8) == 0) hs[wi / (G / 8)] = dw.sums;
    }
  }
  __syncthreads();
  // The down projection: this block's tiles, a warp each.
  Q4Act hact;
  hact.x = reinterpret_cast<__half*>(hd);
  hact.sums = reinterpret_cast<float*>(&hs[0]);
  hact.group = G;
  const int dgroups = inter / G;
  float* out = a.out + static_cast<int64_t>(slot) * hidden + int64_t{rank} * down_tiles_b * 16;
  for (int dj = warp; dj < down_tiles_b; dj += kWarps) {
    float tot[1][2];
    if (bad) {
      tot[0][0] = tot[0][1] = __int_as_float(0x7fc00000);
    } else {
      const Q4Tile q{md, nullptr, (down_tile0 + dj) * 16, 0, 1, false};
      Q4DigitDot<G, 1, U, ST, true>(q, hact, dgroups).run(0, tot);
    }
    const float weight = (t & 1) ? 1.0f : 65536.0f;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float v = tot[0][hh] * weight;
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      if (t == 0) out[dj * 16 + g + 8 * hh] = v;
    }
  }
  // No block leaves while others may still write into its h: it waited for all of h.
}

template <int G, int ST>
void launch_form(cudaStream_t st, const ExpertMlpArgs& a, int slots) {
  constexpr int kU = G == 128 ? 1 : 2;
  launch_pdl(moe_expert_mlp_kernel<G, ST, kU>, dim3(kBlocks, static_cast<unsigned>(slots)),
             dim3(kThreads), 0, st, a);
}

template <int G>
void launch_scale(cudaStream_t st, const ExpertMlpArgs& a, int slots) {
  with_scale_type(a.gate.sdtype,
                  [&](auto sd) { launch_form<G, decltype(sd)::value>(st, a, slots); });
}

}  // namespace

bool expert_mlp_takes(const DevMat& gate, const DevMat& up, const DevMat& down, int per_token,
                      int64_t tokens) {
  const int64_t inter = gate.rows, hidden = gate.cols;
  const auto same = [&](const DevMat& m) {
    return m.group == gate.group && m.sdtype == gate.sdtype;
  };
  return tokens >= 1 && tokens * per_token <= 65535 && (gate.group == 64 || gate.group == 128) &&
         same(up) && same(down) && up.rows == inter && up.cols == hidden && down.rows == hidden &&
         down.cols == inter && inter <= kExpertMlpMaxInter && inter % (16 * kBlocks) == 0 &&
         kWarps % (2 * (inter / 16 / kBlocks)) == 0 &&
         (hidden / gate.group) % (kWarps / (2 * (inter / 16 / kBlocks))) == 0 &&
         hidden % (16 * kBlocks) == 0 && inter % gate.group == 0;
}

void launch_expert_mlp(cudaStream_t st, const ExpertMlpArgs& a, int slots) {
  if (a.gate.group == 64) {
    launch_scale<64>(st, a, slots);
  } else {
    launch_scale<128>(st, a, slots);
  }
  TM_CUDA_LAUNCHED();
}

}  // namespace tokenmill::cuda
