// The MoE block's expert MLPs for one decode token in one launch (CudaBackend::moe_block): slot
// s (a routed expert, or the shared one) is one cluster of kBlocks blocks that runs that expert's
// whole MLP. Block b of a cluster takes gate rows and up rows of the same indices (so it makes
// its own silu(gate) * up), sends those values to every block of the cluster through distributed
// shared memory, and after one cluster barrier each block makes the digits of the whole
// intermediate row and runs its share of the down projection's rows. The down rows go to
// out[slot] as the slot GEMVs write them (the combine, deferred to the next norm or not, reads
// them there).
//
// Why: the slot form takes three launches a MoE layer (gate and up over every slot, the down
// projection's input preparation, the down projection), each spread over the whole chip with
// stream-K fixups, so a layer's 15.6 MB (35B-A3B) took about 16.5 us on an H100 where its bytes
// take 4.7. Here a slot's dependencies stay inside its cluster.
//
// Arithmetic: the digit GEMV's (Q4DigitDot: 8-bit digits, integer mma, F32 per group); a tile's
// groups are split between kSplit warps whose partial sums are added in warp order, so the
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

// The staged form's shared memory (bytes, 16-byte aligned parts): this block's gate tiles and
// their scales, its up tiles and scales, its down tiles and scales, each part copied whole by the
// copy engine as soon as the slot's expert is known.
struct MlpStage {
  uint32_t tile, tile_sc, dtile, dtile_sc;  // one gate (up) tile's data and scales; a down tile's
  uint32_t gate, gate_sc, up, up_sc, down, down_sc, bytes;
  __host__ __device__ MlpStage(int64_t inter, int64_t hidden, int group, int scale_bytes) {
    const int64_t tiles_b = inter / kBlocks / 16, down_tiles_b = hidden / 16 / kBlocks;
    tile = static_cast<uint32_t>(hidden / group * 8 * group);
    tile_sc = static_cast<uint32_t>(hidden / group * 32 * scale_bytes);
    dtile = static_cast<uint32_t>(inter / group * 8 * group);
    dtile_sc = static_cast<uint32_t>(inter / group * 32 * scale_bytes);
    gate = 0;
    gate_sc = gate + static_cast<uint32_t>(tiles_b) * tile;
    up = gate_sc + static_cast<uint32_t>(tiles_b) * tile_sc;
    up_sc = up + static_cast<uint32_t>(tiles_b) * tile;
    down = up_sc + static_cast<uint32_t>(tiles_b) * tile_sc;
    down_sc = down + static_cast<uint32_t>(down_tiles_b) * dtile;
    bytes = down_sc + static_cast<uint32_t>(down_tiles_b) * dtile_sc;
  }
};

// U: groups per buffer (the slot GEMV's: 2 at group 64, 1 at 128). kStaged: the block's whole
// share of the slot's weights is copied into shared memory at once (every byte in flight, then
// the products read shared memory); else the products stream it from global memory, with
// kPrefetch its bytes first asked of L2.
// kCopy (kStaged): 0 one bulk copy a part by one thread; 1 bulk copies of at most 16 KB spread
// over warp 0's lanes; 2 cp.async of 16 bytes by every thread (A/B while measured).
template <int G, int ST, int U, bool kPrefetch, bool kStaged, int kCopy = 0>
__global__ void __cluster_dims__(kBlocks, 1, 1) __launch_bounds__(kThreads, 1)
    moe_expert_mlp_kernel(ExpertMlpArgs a) {
  constexpr int kSB = ST == kF32 ? 4 : 2;
  extern __shared__ __align__(128) uint8_t stage[];
  __shared__ float gu[2][kExpertMlpMaxInter / kBlocks];  // this block's gate and up values
  __shared__ float h[kExpertMlpMaxInter];                // silu(gate) * up, the whole row
  __shared__ uint2 hd[4 * kExpertMlpMaxInter / 8];       // h's digit planes, inter / 8 words each
  __shared__ float2 hs[kExpertMlpMaxInter / 32];         // h's {2^-e, sum} per group
  __shared__ float part[kWarps][64];                     // split partial sums (2 a lane)
  __shared__ uint64_t bars[2];                           // kStaged: gate and up, down
  cg::cluster_group cl = cg::this_cluster();
  const int rank = static_cast<int>(cl.block_rank());
  const int slot = static_cast<int>(blockIdx.y);
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, t = lane & 3;
  const uint32_t bar_gu = static_cast<uint32_t>(__cvta_generic_to_shared(&bars[0]));
  const uint32_t bar_d = bar_gu + 8;
  if (kStaged && threadIdx.x == 0) {
    mbar_init(bar_gu, 1);
    mbar_init(bar_d, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  const Q4Slots& sl = a.slots;
  pdl_begin();
  const int32_t* ids = sl.ids;
  if (sl.picks.logits != nullptr) {
    ids = q4_make_picks(sl, static_cast<int64_t>(slot) * kBlocks + rank,
                        static_cast<int64_t>(gridDim.y) * kBlocks);
  } else if (kStaged) {
    __syncthreads();  // the mbarriers' initialization
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
  // Where the products read this block's weights: the matrices themselves (tile rank * tiles_b
  // on), or their copies in shared memory (tile 0 on).
  int64_t gate_tile0 = int64_t{rank} * tiles_b, down_tile0 = int64_t{rank} * down_tiles_b;
  if constexpr (kStaged) {
    const MlpStage L(inter, hidden, G, kSB);
    const uint32_t s0 = static_cast<uint32_t>(__cvta_generic_to_shared(stage));
    // The six parts: {shared offset, source, bytes}; the first four (gate and up) complete
    // bar_gu, the last two (down) bar_d.
    struct Part {
      uint32_t dst;
      const uint8_t* src;
      uint32_t bytes;
    };
    const uint32_t gbytes = static_cast<uint32_t>(tiles_b) * L.tile,
                   gsbytes = static_cast<uint32_t>(tiles_b) * L.tile_sc,
                   dbytes = static_cast<uint32_t>(down_tiles_b) * L.dtile,
                   dsbytes = static_cast<uint32_t>(down_tiles_b) * L.dtile_sc;
    const Part parts[6] = {{L.gate, mg.data + gate_tile0 * L.tile, gbytes},
                           {L.gate_sc, mg.scales + gate_tile0 * L.tile_sc, gsbytes},
                           {L.up, mu.data + gate_tile0 * L.tile, gbytes},
                           {L.up_sc, mu.scales + gate_tile0 * L.tile_sc, gsbytes},
                           {L.down, md.data + down_tile0 * L.dtile, dbytes},
                           {L.down_sc, md.scales + down_tile0 * L.dtile_sc, dsbytes}};
    if constexpr (kCopy == 2) {
      if (!bad) {
#pragma unroll
        for (int pi = 0; pi < 6; ++pi) {
          for (uint32_t i = threadIdx.x; i < parts[pi].bytes / 16; i += kThreads) {
            cp_async16(s0 + parts[pi].dst + 16 * i, parts[pi].src + 16 * i);
          }
          if (pi == 3 || pi == 5) cp_async_commit();
        }
      } else {
        cp_async_commit();
        cp_async_commit();
      }
    } else if (warp == 0) {
      if (lane == 0) {
        if (bad) {
          mbar_arrive(bar_gu);
          mbar_arrive(bar_d);
        } else {
          mbar_expect(bar_gu, 2 * (gbytes + gsbytes));
          mbar_expect(bar_d, dbytes + dsbytes);
        }
      }
      __syncwarp();
      if (!bad) {
        constexpr uint32_t kPiece = kCopy == 1 ? 16384 : 0xffffffffu;
        int n = 0;  // pieces so far, dealt round the lanes
        for (int pi = 0; pi < 6; ++pi) {
          const uint32_t bar = pi < 4 ? bar_gu : bar_d;
          for (uint32_t off = 0; off < parts[pi].bytes; off += kPiece, ++n) {
            if (n % 32 == lane) {
              bulk_copy_g2s(s0 + parts[pi].dst + off, parts[pi].src + off,
                            min(kPiece, parts[pi].bytes - off), bar);
            }
          }
        }
      }
    }
    mg.data = stage + L.gate, mg.scales = stage + L.gate_sc;
    mu.data = stage + L.up, mu.scales = stage + L.up_sc;
    md.data = stage + L.down, md.scales = stage + L.down_sc;
    gate_tile0 = down_tile0 = 0;
    if constexpr (kCopy == 2) {
      cp_async_wait<1>();
      __syncthreads();
    } else {
      mbar_wait(bar_gu, 0);
    }
  } else if (kPrefetch && warp == 0 && !bad) {
    // This block's weights towards L2 now, so the loads below find most of them there.
    const auto prefetch = [&](const DevMat& m, int64_t tile0, int tiles, int lane_id) {
      const int64_t groups = m.cols / G;
      const int64_t data = groups * 8 * G, scales = groups * 32 * kSB;
      if (lane == lane_id) {
        L2PrefetchPart{reinterpret_cast<const char*>(m.data + tile0 * data),
                       static_cast<uint32_t>(tiles * data)}
            .issue();
      } else if (lane == lane_id + 1) {
        L2PrefetchPart{reinterpret_cast<const char*>(m.scales + tile0 * scales),
                       static_cast<uint32_t>(tiles * scales)}
            .issue();
      }
    };
    prefetch(mg, gate_tile0, tiles_b, 0);
    prefetch(mu, gate_tile0, tiles_b, 2);
    prefetch(md, down_tile0, down_tiles_b, 4);
  }

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
      Q4DigitDot<G, 1, U, ST, false, kStaged>(q, a.x, (piece + 1) * per).run(piece * per, tot);
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
  // silu(gate) * up of this block's rows into every block's h.
  for (int i = static_cast<int>(threadIdx.x); i < rows_b * kBlocks; i += kThreads) {
    const int r = i % rows_b, dst = i / rows_b;
    const float v = silu_f(gu[0][r]) * gu[1][r];
    cl.map_shared_rank(h, dst)[rank * rows_b + r] = v;
  }
  cl.sync();
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
  if constexpr (kStaged) {
    if constexpr (kCopy == 2) {
      cp_async_wait<0>();
      __syncthreads();
    } else {
      mbar_wait(bar_d, 0);
    }
  }
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
      Q4DigitDot<G, 1, U, ST, true, kStaged>(q, hact, dgroups).run(0, tot);
    }
    const float weight = (t & 1) ? 1.0f : 65536.0f;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float v = tot[0][hh] * weight;
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      if (t == 0) out[dj * 16 + g + 8 * hh] = v;
    }
  }
  // No block leaves while others may still write into its h (they all passed cl.sync()).
}

template <int G, int ST>
void launch_variant(cudaStream_t st, const ExpertMlpArgs& a, int slots) {
  const dim3 grid(kBlocks, static_cast<unsigned>(slots));
  constexpr int kU = G == 128 ? 1 : 2;
  // The staged form where the block's share fits next to the kernel's static shared memory.
  const MlpStage L(a.gate.rows, a.gate.cols, G, ST == kF32 ? 4 : 2);
  const int variant = a.variant;
  const auto staged = variant == 4   ? moe_expert_mlp_kernel<G, ST, kU, false, true, 1>
                      : variant == 5 ? moe_expert_mlp_kernel<G, ST, kU, false, true, 2>
                                     : moe_expert_mlp_kernel<G, ST, kU, false, true, 0>;
  cudaFuncAttributes attr{};
  TM_CUDA(cudaFuncGetAttributes(&attr, staged));
  int device = 0, optin = 0;
  TM_CUDA(cudaGetDevice(&device));
  TM_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const bool fits =
      static_cast<size_t>(L.bytes) + attr.sharedSizeBytes <= static_cast<size_t>(optin);
  if ((variant == 0 || variant == 4 || variant == 5) && fits) {
    TM_CUDA(cudaFuncSetAttribute(staged, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(L.bytes)));
    launch_pdl(staged, grid, dim3(kThreads), L.bytes, st, a);
  } else if (variant == 1) {
    launch_pdl(moe_expert_mlp_kernel<G, ST, kU, false, false>, grid, dim3(kThreads), 0, st, a);
  } else if (variant == 2) {
    launch_pdl(moe_expert_mlp_kernel<G, ST, 2 * kU, true, false>, grid, dim3(kThreads), 0, st, a);
  } else {
    launch_pdl(moe_expert_mlp_kernel<G, ST, kU, true, false>, grid, dim3(kThreads), 0, st, a);
  }
}

template <int G>
void launch_scale(cudaStream_t st, const ExpertMlpArgs& a, int slots) {
  switch (a.gate.sdtype) {
    case kBF16:
      launch_variant<G, kBF16>(st, a, slots);
      break;
    case kF16:
      launch_variant<G, kF16>(st, a, slots);
      break;
    default:
      launch_variant<G, kF32>(st, a, slots);
  }
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
