// Internal to backend/cuda, .cu files only: weight views and loaders (float formats and MLX
// affine bit streams), reductions, and index helpers shared by the kernels.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_l2_prefetch.h"

namespace tokenmill::cuda {

enum : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

// Calls f(std::integral_constant<int, ST>{}) with a matrix's scale dtype code as a compile-time
// constant (kBF16, kF16; anything else kF32), for launchers templated on it.
template <class F>
void with_scale_type(int sdtype, F&& f) {
  switch (sdtype) {
    case kBF16:
      f(std::integral_constant<int, kBF16>{});
      break;
    case kF16:
      f(std::integral_constant<int, kF16>{});
      break;
    default:
      f(std::integral_constant<int, kF32>{});
  }
}

// One matrix of a Weight in device memory, with the strides to step to another expert.
struct DevMat {
  const uint8_t* data = nullptr;
  const uint8_t* scales = nullptr;  // [rows, groups] of sdtype (affine)
  const uint8_t* biases = nullptr;
  int64_t rows = 0, cols = 0;
  int64_t row_bytes = 0;    // bytes of one row of data
  int64_t groups = 0;       // cols / group (affine)
  int64_t data_stride = 0;  // bytes from one expert's data to the next
  int64_t sb_stride = 0;    // bytes from one expert's scales (biases) to the next
  int64_t experts = 1;
  int bits = 0;  // 0 = float
  int group = 0;
  int dtype = kF32;    // float weights
  int sdtype = kBF16;  // affine scales and biases
  // Whether rows can be read in aligned 8-element chunks (load8): always for affine; for float
  // weights when cols % 8 == 0 and the base is 16-byte aligned.
  bool chunks8 = false;
  // 4-bit data and scales in the tile layout of cuda_q4_pack.cu (kQ4TilePacking): `row_bytes`
  // is then only the logical size of a row, `biases` is null (they sit next to the scales), and
  // elements are found with tiled_word / tiled_sb.
  bool tiled = false;
};

// The Weight::packing value of the 4-bit tile layout.
constexpr int kQ4TilePacking = 1;

// Word (8 values) j/8 of row r in the tile layout: 16-row tiles x groups, 32 lanes x 2W words
// per block (W = group/32); lane g*4+t holds words [t*W, t*W+W) of rows g and g+8.
__device__ __forceinline__ uint32_t tiled_word(const DevMat& m, int64_t r, int64_t j) {
  const int W = m.group / 32;
  const int rr = static_cast<int>(r & 15), word = static_cast<int>((j % m.group) >> 3);
  const int64_t block = (r >> 4) * m.groups + j / m.group;
  const int64_t idx = (block * 32 + (rr & 7) * 4 + word / W) * (2 * W) + (rr >> 3) * W + word % W;
  return reinterpret_cast<const uint32_t*>(m.data)[idx];
}
// Index (in scale elements) of row r's scale for column j in the tile layout; its bias is next.
__device__ __forceinline__ int64_t tiled_sb(const DevMat& m, int64_t r, int64_t j) {
  const int rr = static_cast<int>(r & 15);
  return (((r >> 4) * m.groups + j / m.group) * 8 + (rr & 7)) * 4 + (rr >> 3) * 2;
}

// Validates `w` (throws tokenmill::Error) and describes matrix `expert` of it.
DevMat make_devmat(const Weight& w, int expert);

__device__ __forceinline__ float bf16_bits_to_f32(uint32_t h) {
  return __uint_as_float(h << 16);
}

__device__ __forceinline__ float load_sb(int t, const uint8_t* p, int64_t i) {
  if (t == kBF16) return bf16_bits_to_f32(reinterpret_cast<const uint16_t*>(p)[i]);
  if (t == kF32) return reinterpret_cast<const float*>(p)[i];
  return __half2float(reinterpret_cast<const __half*>(p)[i]);
}

// Element j of row r (row = m.data + r * m.row_bytes), dequantized. Affine values may straddle
// bytes: at most two bytes are read (bits <= 8), never past the element's last byte.
__device__ __forceinline__ float load1(const DevMat& m, const uint8_t* row, int64_t r, int64_t j) {
  if (m.bits == 0) {
    if (m.dtype == kBF16) return bf16_bits_to_f32(reinterpret_cast<const uint16_t*>(row)[j]);
    if (m.dtype == kF16) return __half2float(reinterpret_cast<const __half*>(row)[j]);
    return reinterpret_cast<const float*>(row)[j];
  }
  if (m.tiled) {
    const uint32_t q = (tiled_word(m, r, j) >> (4 * (j & 7))) & 15u;
    const int64_t s = tiled_sb(m, r, j);
    return load_sb(m.sdtype, m.scales, s) * static_cast<float>(q) +
           load_sb(m.sdtype, m.scales, s + 1);
  }
  const int b = m.bits;
  const int64_t off = j * b;
  const int sh = static_cast<int>(off & 7);
  uint32_t v = row[off >> 3];
  if (sh + b > 8) v |= static_cast<uint32_t>(row[(off >> 3) + 1]) << 8;
  const uint32_t q = (v >> sh) & ((1u << b) - 1u);
  const int64_t g = r * m.groups + j / m.group;
  return load_sb(m.sdtype, m.scales, g) * static_cast<float>(q) + load_sb(m.sdtype, m.biases, g);
}

// Elements j..j+7 of row r (j a multiple of 8; m.chunks8). For affine, 8 elements are exactly
// `bits` bytes starting at byte (j/8)*bits, and lie in one group (group >= 32).
__device__ __forceinline__ void load8(const DevMat& m, const uint8_t* row, int64_t r, int64_t j,
                                      float* w) {
  if (m.bits == 0) {
    if (m.dtype == kF32) {
      const float4* p = reinterpret_cast<const float4*>(row + j * 4);
      const float4 a = p[0], c = p[1];
      w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = c.x, w[5] = c.y, w[6] = c.z,
      w[7] = c.w;
      return;
    }
    const uint4 u = *reinterpret_cast<const uint4*>(row + j * 2);
    const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (m.dtype == kBF16) {
        w[2 * i] = bf16_bits_to_f32(words[i] & 0xffffu);
        w[2 * i + 1] = bf16_bits_to_f32(words[i] >> 16);
      } else {
        w[2 * i] = __half2float(__ushort_as_half(static_cast<unsigned short>(words[i] & 0xffffu)));
        w[2 * i + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(words[i] >> 16)));
      }
    }
    return;
  }
  if (m.tiled) {
    const uint32_t v = tiled_word(m, r, j);
    const int64_t si = tiled_sb(m, r, j);
    const float s = load_sb(m.sdtype, m.scales, si), bias = load_sb(m.sdtype, m.scales, si + 1);
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = s * static_cast<float>((v >> (4 * i)) & 15u) + bias;
    return;
  }
  const int b = m.bits;
  const uint8_t* p = row + (j >> 3) * b;
  uint64_t v = 0;
  if (b == 4) {
    v = *reinterpret_cast<const uint32_t*>(p);
  } else if (b == 8) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    v = static_cast<uint64_t>(u.x) | (static_cast<uint64_t>(u.y) << 32);
  } else if (b == 2) {
    v = *reinterpret_cast<const uint16_t*>(p);
  } else {
    for (int i = 0; i < b; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  }
  const int64_t g = r * m.groups + j / m.group;
  const float s = load_sb(m.sdtype, m.scales, g), bias = load_sb(m.sdtype, m.biases, g);
  const uint64_t mask = (1u << b) - 1u;
#pragma unroll
  for (int i = 0; i < 8; ++i) w[i] = s * static_cast<float>((v >> (i * b)) & mask) + bias;
}

__device__ __forceinline__ DevMat at_expert(DevMat m, int64_t e) {
  m.data += e * m.data_stride;
  if (m.bits) {
    m.scales += e * m.sb_stride;
    if (m.biases != nullptr) m.biases += e * m.sb_stride;
  }
  return m;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// A reduction over the block (blockDim.x a multiple of 32, <= 1024) with `warp_op` (warp_sum,
// warp_max; 0 must be its identity for the values given); every thread gets the result. `red`
// is 32 floats of shared memory; the call contains barriers (all threads must call).
template <float (*warp_op)(float)>
__device__ __forceinline__ float block_reduce(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_op(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  return warp_op(lane < nw ? red[lane] : 0.0f);
}
__device__ __forceinline__ float block_sum(float v, float* red) {
  return block_reduce<warp_sum>(v, red);
}
// Of non-negative values.
__device__ __forceinline__ float block_max(float v, float* red) {
  return block_reduce<warp_max>(v, red);
}

// Tile b of the tiles of `tile_rows` rows numbered sequence by sequence (each sequence's from its
// first row): its sequence, first row and the sequence's end; s = -1 past the last tile (a grid
// sized as an upper bound, n_rows / tile_rows + n_seqs).
struct SeqTile {
  int s = -1, t0 = 0, t_end = 0;
};
__device__ __forceinline__ SeqTile seq_tile(const int32_t* cu, int n_seqs, int b, int tile_rows) {
  SeqTile r;
  for (int i = 0; i < n_seqs; ++i) {
    const int lo = cu[i], hi = cu[i + 1];
    const int nt = (hi - lo + tile_rows - 1) / tile_rows;
    if (b < nt) {
      r.s = i, r.t0 = lo + b * tile_rows, r.t_end = hi;
      break;
    }
    b -= nt;
  }
  return r;
}

// Sequence owning token row t: the s with cu[s] <= t < cu[s+1] (binary search), or -1.
__device__ __forceinline__ int seq_of(const int32_t* cu, int n_seqs, int t) {
  int lo = 0, hi = n_seqs;  // invariant: cu[lo] <= t < cu[hi] when t is covered
  if (t < cu[0] || t >= cu[n_seqs]) return -1;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (cu[mid] <= t) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

__device__ __forceinline__ float silu_f(float x) {
  return x / (1.0f + expf(-x));
}
__device__ __forceinline__ float sigmoid_f(float x) {
  return 1.0f / (1.0f + expf(-x));
}

// d += a * b on the tensor cores: one m16n8k16 tile, F16 operands (a: 4 registers of the row-major
// 16x16 A fragment, b: 2 of the column-major 16x8 B fragment), F32 accumulators.
__device__ __forceinline__ void mma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The same with BF16 operands.
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Four 8x8 16-bit matrices from shared memory (a cvta address per lane: row l % 8 of matrix
// l / 8); the _trans form hands each thread the transposed fragment.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// cp.async groups: commit the copies issued so far as one group; wait until at most N of this
// thread's committed groups are still in flight (its copies of the others have landed).
// The shared-memory address of a generic pointer into shared memory (what cp.async, ldmatrix
// and the bulk copies take).
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// cp.async of 16 bytes (4 with cp_async4) from global memory to shared address dst; with
// src_bytes, the bytes past src_bytes are zeros.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
// One arrival on the mbarrier at `bar` once all of this thread's earlier cp.asyncs have landed
// (counted in the mbarrier's init count: no pending arrival is added for it).
__device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// mbarriers (sm_90): `count` arrivals complete a phase, together with the bytes announced by
// mbar_expect arriving through bulk copies. Addresses are shared-memory (cvta) addresses.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// One arrival that also announces `bytes` more to come by bulk copies in this phase.
__device__ __forceinline__ void mbar_expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// The spin on phase %1 of the mbarrier at %0; `sem`: the try_wait's qualifiers before .shared.
#define TM_MBAR_WAIT_LOOP(sem)                               \
  "{\n.reg .pred p;\nWAIT_%=:\nmbarrier.try_wait.parity" sem \
  ".shared::cta.b64 p, [%0], "                               \
  "%1;\n@!p bra WAIT_%=;\n}\n"
// Returns once the phase of the given parity has completed (its writes are then visible).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(TM_MBAR_WAIT_LOOP("")::"r"(bar), "r"(parity) : "memory");
}
// Distributed shared memory without cluster barriers on the data's path (sm_90): a block
// announces its mbarriers once (cluster_arrive_relaxed after their init and
// fence_mbarrier_init), a sender waits for that (cluster_wait, long done by then) and pushes
// values by st_async_cluster, each counted as completed bytes on the receiver's mbarrier, which
// the receiver waits for with mbar_wait_cluster. Senders wait for nothing and may exit; every
// block receiving anything waits for it, so none exits while a store into it is in flight.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_relaxed() {  // whole warps
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {  // whole warps
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// The shared::cluster address of this block's shared address `addr` in cluster block `rank`.
__device__ __forceinline__ uint32_t cluster_addr(uint32_t addr, uint32_t rank) {
  uint32_t out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(addr), "r"(rank));
  return out;
}
// 4 bytes to `raddr`, completing 4 bytes of the mbarrier at `rbar` (shared::cluster addresses
// of the same block).
__device__ __forceinline__ void st_async_cluster(uint32_t raddr, float v, uint32_t rbar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(raddr),
      "r"(__float_as_uint(v)), "r"(rbar)
      : "memory");
}
// One arrival on another block's mbarrier (a shared::cluster address), ordered after this
// thread's earlier memory operations.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t rbar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(rbar)
               : "memory");
}
// mbar_wait for a phase completed from other blocks: their writes are visible once it returns.
__device__ __forceinline__ void mbar_wait_cluster(uint32_t bar, uint32_t parity) {
  asm volatile(TM_MBAR_WAIT_LOOP(".acquire.cluster")::"r"(bar), "r"(parity) : "memory");
}
// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared memory by the
// copy engine, completing on the mbarrier `bar`.
__device__ __forceinline__ void bulk_copy_g2s(uint32_t dst, const void* src, uint32_t bytes,
                                              uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

// The end of both top-k forms: with k <= 32, lane j holds pick j (my_id, my_w) and writes it,
// renormalized by the picked total when asked; with more, lane 0 wrote each pick as it came and
// only renormalizes here.
__device__ __forceinline__ void topk_write_picks(int k, bool renormalize, int lane, int my_id,
                                                 float my_w, float picked, int32_t* ids,
                                                 float* weights) {
  if (k <= 32) {
    if (lane < k) {
      ids[lane] = my_id;
      weights[lane] = renormalize ? my_w / picked : my_w;
    }
  } else if (renormalize && lane == 0) {
    for (int j = 0; j < k; ++j) weights[j] /= picked;
  }
}

// The MoE router's rule for one row, by one warp: p (shared memory, `experts` floats) holds the
// logits and is overwritten. Softmax over all experts, then k passes taking the highest
// probability, the lower index on ties (the CPU's rule); weights renormalised to sum to 1 when
// `renormalize`. Lane i holds experts i, i+32, ...; up to 32 picks stay in the lanes (lane j
// keeps pick j) and are written at the end. (A single thread did this serially: about 20k
// dependent instructions, tens of microseconds per MoE layer at 256 experts; lane 0 writing
// each pick and reading all k back cost k dependent L2 round trips.)
__device__ __forceinline__ void topk_softmax_warp(float* p, int experts, int k, bool renormalize,
                                                  int32_t* ids, float* weights) {
  const int lane = threadIdx.x & 31;
  float m = -INFINITY;
  for (int x = lane; x < experts; x += 32) m = fmaxf(m, p[x]);
  m = warp_max(m);
  float sum = 0.0f;
  for (int x = lane; x < experts; x += 32) sum += (p[x] = expf(p[x] - m));
  sum = warp_sum(sum);
  for (int x = lane; x < experts; x += 32) p[x] /= sum;
  __syncwarp();
  float picked = 0.0f;
  int my_id = -1;
  float my_w = 0.0f;
  for (int j = 0; j < k; ++j) {
    // This lane's best candidate, then the warp's (value, index) maximum.
    float bv = -1.0f;
    int bx = -1;
    for (int x = lane; x < experts; x += 32) {
      if (p[x] >= 0.0f && (bx < 0 || p[x] > bv)) bv = p[x], bx = x;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int ox = __shfl_xor_sync(0xffffffffu, bx, o);
      if (ox >= 0 && (bx < 0 || ov > bv || (ov == bv && ox < bx))) bv = ov, bx = ox;
    }
    if (k <= 32) {
      if (lane == j) my_id = bx, my_w = bx >= 0 ? bv : NAN;
    } else if (lane == 0) {
      ids[j] = bx;
      weights[j] = bx >= 0 ? bv : NAN;
    }
    picked += bv;
    if (bx >= 0 && bx % 32 == lane) p[bx] = -1.0f;  // taken
    __syncwarp();
  }
  topk_write_picks(k, renormalize, lane, my_id, my_w, picked, ids, weights);
}

// topk_softmax_warp's rule with the logits in registers, for experts <= 32 * kPer: lane i holds
// logits[i + 32 * u] in v[u] (-inf past `experts`). Each pick is two warp reductions in
// hardware (redux.sync): the largest probability (non-negative floats order as their bits) and
// the lowest expert index holding it, where the shared-memory form took ten dependent shuffles
// and a pass over shared memory per pick (about 3 us of a decode step's MoE layer at k = 8).
template <int kPer>
__device__ __forceinline__ void topk_softmax_warp_regs(const float (&v)[kPer], int experts, int k,
                                                       bool renormalize, int32_t* ids,
                                                       float* weights) {
  const int lane = threadIdx.x & 31;
  float m = -INFINITY;
#pragma unroll
  for (int u = 0; u < kPer; ++u) m = fmaxf(m, v[u]);
  m = warp_max(m);
  float p[kPer], sum = 0.0f;
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    p[u] = lane + 32 * u < experts ? expf(v[u] - m) : 0.0f;
    sum += p[u];
  }
  sum = warp_sum(sum);
  uint32_t open = 0;  // bit u: expert lane + 32u exists and is not picked yet
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    p[u] /= sum;
    if (lane + 32 * u < experts) open |= 1u << u;
  }
  float picked = 0.0f, my_w = 0.0f;
  int my_id = -1;
  for (int j = 0; j < k; ++j) {
    float bv = 0.0f;
    int bu = -1;
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      if ((open >> u & 1u) && (bu < 0 || p[u] > bv)) bv = p[u], bu = u;
    }
    // Keys 1 + the bits of the lane's best (0: none), so a probability of 0 still ranks.
    const uint32_t key = bu >= 0 ? __float_as_uint(bv) + 1u : 0u;
    const uint32_t best = __reduce_max_sync(0xffffffffu, key);
    const uint32_t id = __reduce_min_sync(
        0xffffffffu, key == best && bu >= 0 ? static_cast<uint32_t>(lane + 32 * bu) : ~0u);
    const bool found = best > 0u;
    const float w = found ? __uint_as_float(best - 1u) : NAN;
    if (found && static_cast<int>(id % 32) == lane) open &= ~(1u << (id / 32));
    if (k <= 32) {
      if (lane == j) my_id = found ? static_cast<int>(id) : -1, my_w = w;
    } else if (lane == 0) {
      ids[j] = found ? static_cast<int>(id) : -1;
      weights[j] = w;
    }
    picked += found ? w : 0.0f;
  }
  topk_write_picks(k, renormalize, lane, my_id, my_w, picked, ids, weights);
}

// Programmatic dependent launch (Hopper): a kernel started with launch_pdl() may begin
// while the kernel before it in the stream still runs, once that kernel called
// allow_dependent_launch() (or its blocks finished). Before it touches anything the earlier
// kernel writes it must call wait_for_previous_grid(), which returns when that kernel has
// completed and its writes are visible; reads of constant data (weights) may come before.
__device__ __forceinline__ void wait_for_previous_grid() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}
__device__ __forceinline__ void allow_dependent_launch() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// The first statement of every kernel launched with launch_pdl: wait for the kernel before it
// (its writes, and its reads of what this kernel overwrites, are then done), then let the next
// kernel be scheduled. Decode steps are ~1,300 small dependent kernels: each launch latency now
// overlaps the kernel before it instead of following it.
//
// The order matters: letting the next kernel be scheduled before the wait (so a chain of
// kernels could be resident ahead of the one running) measured slower on every decode shape
// (27B 4-bit batch 1 152.0 -> 138.1 tok/s, bf16 70.8 -> 61.2) and broke two CUDA tests.
__device__ __forceinline__ void pdl_begin() {
  wait_for_previous_grid();
  allow_dependent_launch();
}

// Block `block` of `blocks` asks L2 for its share of each span (lanes 0-2 of the calling warp,
// one span each; the shares are 16-byte multiples, so a span's last bytes below 16 stay out).
__device__ __forceinline__ void l2_prefetch_spans(const L2Spans& s, int64_t block, int64_t blocks) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < 3; ++i) {
    if (lane == i && i < s.count) {
      const uint64_t n = s.bytes[i];
      const uint64_t chunk = (n / static_cast<uint64_t>(blocks) + 15) & ~uint64_t{15};
      const uint64_t start = static_cast<uint64_t>(block) * chunk;
      if (start < n) {
        const uint64_t len = (chunk < n - start ? chunk : n - start) & ~uint64_t{15};
        if (len >= 16) {
          asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(
                           static_cast<const char*>(s.ptr[i]) + start),
                       "r"(static_cast<uint32_t>(len)));
        }
      }
    }
  }
}

// The spans of matrix m (one expert's, or the whole of a plain matrix).
inline L2Spans l2_spans_of(const DevMat& m) {
  L2Spans s;
  const auto add = [&](const void* p, int64_t bytes) {
    if (p != nullptr && bytes > 0) {
      s.ptr[s.count] = p;
      s.bytes[s.count] = static_cast<uint64_t>(bytes);
      ++s.count;
    }
  };
  add(m.data, m.data_stride);
  add(m.scales, m.sb_stride);
  add(m.biases, m.sb_stride);
  return s;
}

// A launch with programmatic stream serialization (captured into CUDA graphs as a programmatic
// edge). After a non-kernel operation, or a kernel that never calls allow_dependent_launch(), it
// starts as an ordinary launch would. cluster > 1: blocks in clusters of that many along x.
template <typename... Params, typename... Args>
void launch_pdl_clusters(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                         cudaStream_t st, int cluster, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  attr[1].id = cudaLaunchAttributeClusterDimension;
  attr[1].val.clusterDim.x = static_cast<unsigned>(cluster);
  attr[1].val.clusterDim.y = 1;
  attr[1].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = cluster > 1 ? 2 : 1;
  TM_CUDA(cudaLaunchKernelEx(&cfg, kernel, args...));
}
template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                Args... args) {
  launch_pdl_clusters(kernel, grid, block, smem, st, 1, args...);
}

// The CPU's F32 inverse rotary frequencies (computed on the host with std::pow, so large
// positions round exactly as there), passed to kernels by value. rot_dim <= 1024.
struct RopeFreqs {
  float inv[512];
};
inline RopeFreqs rope_freqs(float theta, int rot_dim) {
  RopeFreqs f{};
  for (int i = 0; i < rot_dim / 2; ++i) {
    f.inv[i] = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(rot_dim));
  }
  return f;
}

inline unsigned blocks_for(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

// GEMV of one activation row per (output row, slot): slot s multiplies x row s / x_div by
// matrix ids[s] of m (ids in device memory). out[s * ldo + r]. Used by moe().
void launch_gemv_indexed(cudaStream_t st, const DevMat& m, const int32_t* ids, int64_t slots,
                         const float* x, int64_t ldx, int64_t x_div, float* out, int64_t ldo);

}  // namespace tokenmill::cuda
