// Prefill GEMM (more than kGemvMaxRows activation rows) on tensor cores through cuBLAS: F16
// operands, F32 accumulation and output.
//
// The weight is dequantized (any format) to F16 in row slabs of a fixed workspace (256 MiB), so
// no full-precision copy of the model exists; the activations are scaled by one power of two
// that puts their largest magnitude in [2^14, 2^15) (F16 range; the GEMM's alpha, read from
// device memory, undoes it). Both operands are split into hi + lo F16 parts where F16 alone
// would round them: activations always, weights when they are F32 or affine (s*q + b; BF16 and
// F16 weights are exact in F16). The product is hi*hi + hi*lo (+ lo*hi), computed as one GEMM
// over the parts laid side by side along K (weights [hi hi lo], activations [hi lo hi]) so that
// they sum in one F32 accumulator: about 22 significant bits per operand, so prefill agrees
// with decode and with the CPU to F32 rounding. (One F16 GEMM was measured 5-15x the golden
// tolerance off on quantized models whose logits are large: 2^-12 relative error per weight is
// not small there.) PrefillPrecision::kFast (--prefill-precision fast) is the hi parts alone,
// for those who trade the agreement for speed; with BF16 weights it is "zero parts": cuBLAS
// reads the weights in place and the activations are rounded to BF16 (as other engines' BF16
// prefill), which saves the weight conversion (a read and a write of every weight byte, 3.5% of
// a bf16 8k prefill); the dense MLP block then keeps its gate and up in BF16 too (mlp_block).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <type_traits>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_common.cuh"

namespace tokenmill::cuda {
namespace {

#define TM_CUBLAS(expr)                                                            \
  do {                                                                             \
    const cublasStatus_t tm_st = (expr);                                           \
    TM_CUDA_REQUIRE(tm_st == CUBLAS_STATUS_SUCCESS, "cuBLAS call failed: " #expr); \
  } while (0)

__device__ __forceinline__ uint32_t pack_half2(__half a, __half b) {
  return static_cast<uint32_t>(__half_as_ushort(a)) |
         (static_cast<uint32_t>(__half_as_ushort(b)) << 16);
}

// Eight weights w of one row as F16 parts at `at` (kGemmParts): hi = f16(w) in the first
// m.cols halves of the row, again in the second when parts > 1 (hi2), and the remainders
// f16(w - hi) in the third when parts == 3 (lo).
__device__ __forceinline__ void store_parts8(const float (&w)[8], __half* out, __half* hi2,
                                             __half* lo, int64_t at) {
  uint32_t ph[4], pl[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const __half h0 = __float2half_rn(w[2 * k]), h1 = __float2half_rn(w[2 * k + 1]);
    ph[k] = pack_half2(h0, h1);
    pl[k] = pack_half2(__float2half_rn(w[2 * k] - __half2float(h0)),
                       __float2half_rn(w[2 * k + 1] - __half2float(h1)));
  }
  *reinterpret_cast<uint4*>(out + at) = make_uint4(ph[0], ph[1], ph[2], ph[3]);
  if (hi2) *reinterpret_cast<uint4*>(hi2 + at) = make_uint4(ph[0], ph[1], ph[2], ph[3]);
  if (lo) *reinterpret_cast<uint4*>(lo + at) = make_uint4(pl[0], pl[1], pl[2], pl[3]);
}

// Rows [r0, r0 + rows) of m as F16 rows of ld = parts * m.cols halves (store_parts8); thread i
// converts 8 values (or fewer at the end of an odd-width row).
__global__ void dequant_f16_kernel(DevMat m, int64_t r0, int64_t rows, int parts,
                                   __half* __restrict__ out) {
  const int64_t per_row = (m.cols + 7) / 8;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * per_row) return;
  const int64_t r = r0 + i / per_row, j = (i % per_row) * 8;
  const uint8_t* row = m.data + r * m.row_bytes;
  const int64_t at = (r - r0) * m.cols * parts + j;
  __half* const hi2 = parts > 1 ? out + m.cols : nullptr;
  __half* const lo = parts > 2 ? out + 2 * m.cols : nullptr;
  if (m.chunks8 && j + 8 <= m.cols && m.cols % 8 == 0) {
    float w[8];
    load8(m, row, r, j, w);
    store_parts8(w, out, hi2, lo, at);
  } else {
    for (int64_t k = j; k < j + 8 && k < m.cols; ++k) {
      const float v = load1(m, row, r, k);
      const __half h = __float2half_rn(v);
      out[at + k - j] = h;
      if (hi2) hi2[at + k - j] = h;
      if (lo) lo[at + k - j] = __float2half_rn(v - __half2float(h));
    }
  }
}

// The same for a 4-bit matrix in the tile layout (m.tiled; r0 a multiple of 16): a warp per
// (16-row tile, group) block of 64W words (W = group / 32). Each lane loads its 2W words in
// 16-byte pieces, the warp stages them in shared memory, then writes in row order: store j
// gives lane l word q = 32 j + l, row q / 4W, so 4W lanes write one row's group as contiguous
// 16-byte pieces. load8 read one word of one row at a time (half of each sector it touched):
// 155 us for a 17408 x 5120 slab, 1.4 TB/s; reading whole lanes and writing them back from
// registers half-filled the write sectors instead (177 us; S29).
constexpr int kDequantWarps = 8;
template <int W>
__global__ void __launch_bounds__(32 * kDequantWarps)
    dequant_q4_tiled_f16_kernel(DevMat m, int64_t r0, int64_t rows, int parts,
                                __half* __restrict__ out) {
  __shared__ uint32_t staged[kDequantWarps][64 * W];
  __shared__ float sb[kDequantWarps][32];  // the block's (scale, bias) pairs, tiled_sb's order
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t blk = static_cast<int64_t>(blockIdx.x) * kDequantWarps + warp;
  const int64_t tiles = (rows + 15) / 16;
  if (blk >= tiles * m.groups) return;
  const int64_t tile = blk / m.groups, gi = blk - tile * m.groups;
  const int64_t block = (r0 / 16 + tile) * m.groups + gi;  // in the whole matrix
  const uint32_t* src = reinterpret_cast<const uint32_t*>(m.data) + block * 64 * W;
  uint32_t* const mine = staged[warp];
  if constexpr (W == 1) {
    reinterpret_cast<uint2*>(mine)[lane] = reinterpret_cast<const uint2*>(src)[lane];
  } else {
#pragma unroll
    for (int k = 0; k < W / 2; ++k) {
      reinterpret_cast<uint4*>(mine)[lane * (W / 2) + k] =
          reinterpret_cast<const uint4*>(src)[lane * (W / 2) + k];
    }
  }
  sb[warp][lane] = load_sb(m.sdtype, m.scales, block * 32 + lane);
  __syncwarp();
  __half* const hi2 = parts > 1 ? out + m.cols : nullptr;
  __half* const lo = parts > 2 ? out + 2 * m.cols : nullptr;
#pragma unroll
  for (int j = 0; j < 2 * W; ++j) {
    const int q = 32 * j + lane, rr = q / (4 * W), word = q % (4 * W);
    const int64_t r = tile * 16 + rr;  // in the slab
    if (r >= rows) continue;
    // tiled_word's index within the block, and tiled_sb's.
    const uint32_t v = mine[((rr & 7) * 4 + word / W) * (2 * W) + (rr >> 3) * W + word % W];
    const int si = (rr & 7) * 4 + (rr >> 3) * 2;
    const float s = sb[warp][si], bias = sb[warp][si + 1];
    float w[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = s * static_cast<float>((v >> (4 * i)) & 15u) + bias;
    store_parts8(w, out, hi2, lo, r * m.cols * parts + gi * m.group + word * 8);
  }
}

// The largest |v| over n values into max_bits (atomicMax), v = x (OP 0), silu(x) * y written
// to out (OP 1: the gated MLP's down-projection input) or x * sigmoid(y) written to x (OP 2:
// gated attention's output), so a gate and the GEMM's scale cost one pass over the values.
template <int OP>
__device__ __forceinline__ float gate_value(float x, float y) {
  if constexpr (OP == 1) return silu_f(x) * y;
  if constexpr (OP == 2) return x * sigmoid_f(y);
  return x;
}
template <int OP>
__global__ void abs_max_kernel(float* x, const float* __restrict__ y, float* out, int64_t n,
                               unsigned* __restrict__ max_bits) {
  __shared__ float red[32];
  float m = 0.0f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = gate_value<OP>(x[i], OP ? y[i] : 0.0f);
    if constexpr (OP == 1) out[i] = v;
    if constexpr (OP == 2) x[i] = v;
    m = fmaxf(m, fabsf(v));
  }
  m = block_max(m, red);
  // Non-negative floats order like their bit patterns.
  if (threadIdx.x == 0) atomicMax(max_bits, __float_as_uint(m));
}
// The same over n4 float4s (x, y, out 16-byte aligned), kUnroll of them loaded before any is
// used: the scalar loop kept one or two 4-byte loads in flight a thread, and the SiLU gate of
// an 8k-token MLP (three 570 MB streams) ran at 1.7 TB/s (S29).
template <int OP>
__global__ void abs_max_vec_kernel(float4* x, const float4* __restrict__ y, float4* out, int64_t n4,
                                   unsigned* __restrict__ max_bits) {
  constexpr int kUnroll = 4;
  __shared__ float red[32];
  float m = 0.0f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i0 < n4;
       i0 += kUnroll * stride) {
    float4 a[kUnroll], b[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = i0 + u * stride;
      if (i < n4) {
        a[u] = x[i];
        if constexpr (OP != 0) b[u] = y[i];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = i0 + u * stride;
      if (i >= n4) break;
      float4 v = a[u];
      if constexpr (OP != 0) {
        v = make_float4(gate_value<OP>(v.x, b[u].x), gate_value<OP>(v.y, b[u].y),
                        gate_value<OP>(v.z, b[u].z), gate_value<OP>(v.w, b[u].w));
      }
      if constexpr (OP == 1) out[i] = v;
      if constexpr (OP == 2) x[i] = v;
      m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
  }
  m = block_max(m, red);
  if (threadIdx.x == 0) atomicMax(max_bits, __float_as_uint(m));
}

__device__ __forceinline__ int act_exponent(unsigned max_bits) {
  const float m = __uint_as_float(max_bits);
  return m > 0.0f && m <= FLT_MAX ? min(max(14 - ilogbf(m), -126), 126) : 0;
}

// The F16 parts of x * 2^e (x: n rows of K) as rows of parts * K halves, the partners of the
// weight rows of dequant_f16_kernel: hi = f16(x 2^e), then lo = f16(x 2^e - hi) when parts > 1,
// then hi again when parts == 3; consts[0] = 2^-e (the GEMM's alpha). Block (bx, by): values
// [bx * V * blockDim, ...) of rows by, by + gridDim.y, ..., V a thread (4: K a multiple of 4).
template <int V>
__global__ void split_f16_kernel(const float* __restrict__ x, int64_t n, int64_t K, int parts,
                                 const unsigned* __restrict__ max_bits, __half* __restrict__ out,
                                 float* __restrict__ consts) {
  const int e = act_exponent(*max_bits);
  const float f = ldexpf(1.0f, e);
  const int64_t j = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (blockIdx.y == 0 && j == 0) consts[0] = ldexpf(1.0f, -e);
  if (j >= K) return;
  for (int64_t r = blockIdx.y; r < n; r += gridDim.y) {
    float v[V];
    if constexpr (V == 4) {
      const float4 q = *reinterpret_cast<const float4*>(x + r * K + j);
      v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else {
      v[0] = x[r * K + j];
    }
    __half h[V], l[V];
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float s = v[i] * f;
      h[i] = __float2half_rn(s);
      l[i] = __float2half_rn(s - __half2float(h[i]));
    }
    __half* const row = out + r * (K * parts) + j;
    if constexpr (V == 4) {
      const uint2 hv = make_uint2(pack_half2(h[0], h[1]), pack_half2(h[2], h[3]));
      *reinterpret_cast<uint2*>(row) = hv;
      if (parts > 1)
        *reinterpret_cast<uint2*>(row + K) =
            make_uint2(pack_half2(l[0], l[1]), pack_half2(l[2], l[3]));
      if (parts > 2) *reinterpret_cast<uint2*>(row + 2 * K) = hv;
    } else {
      row[0] = h[0];
      if (parts > 1) row[K] = l[0];
      if (parts > 2) row[2 * K] = h[0];
    }
  }
}

// BF16 activations for BF16 weights read in place (fast mode, gemm_parts 0): out[i] =
// bf16(gate_value(x[i], y[i])) over n values, unscaled (BF16 has F32's range), and consts[0] = 1
// (the GEMM's alpha). One pass where the F16 form takes three: the gate writing F32 and finding
// the scale, then the split reading it back. V = 4: n a multiple of 4, x, y 16-byte aligned;
// kUnroll of them loaded before any is used (abs_max_vec_kernel's reason).
template <int OP, int V>
__global__ void to_bf16_kernel(const float* __restrict__ x, const float* __restrict__ y, int64_t n,
                               __nv_bfloat16* __restrict__ out, float* __restrict__ consts) {
  constexpr int kUnroll = 4;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x, items = n / V;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (first == 0) consts[0] = 1.0f;
  for (int64_t i0 = first; i0 < items; i0 += kUnroll * stride) {
    float a[kUnroll][V], b[kUnroll][V];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = i0 + u * stride;
      if (i >= items) break;
      if constexpr (V == 4) {
        const float4 xa = reinterpret_cast<const float4*>(x)[i];
        a[u][0] = xa.x, a[u][1] = xa.y, a[u][2] = xa.z, a[u][3] = xa.w;
        if constexpr (OP != 0) {
          const float4 yb = reinterpret_cast<const float4*>(y)[i];
          b[u][0] = yb.x, b[u][1] = yb.y, b[u][2] = yb.z, b[u][3] = yb.w;
        }
      } else {
        a[u][0] = x[i];
        if constexpr (OP != 0) b[u][0] = y[i];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = i0 + u * stride;
      if (i >= items) break;
      float v[V];
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = gate_value<OP>(a[u][k], OP != 0 ? b[u][k] : 0.0f);
      if constexpr (V == 4) {
        const __nv_bfloat162 lo = __floats2bfloat162_rn(v[0], v[1]);
        const __nv_bfloat162 hi = __floats2bfloat162_rn(v[2], v[3]);
        reinterpret_cast<uint2*>(out)[i] = make_uint2(*reinterpret_cast<const uint32_t*>(&lo),
                                                      *reinterpret_cast<const uint32_t*>(&hi));
      } else {
        out[i] = __float2bfloat16_rn(v[0]);
      }
    }
  }
}

// out[i] = bf16(silu(gate[i]) * up[i]) over n8 runs of 8 BF16 values (16-byte aligned), and
// consts[0] = 1 (the down GEMM's alpha): the dense MLP's gate in fast mode, its F32 form
// (to_bf16_kernel's OP 1) reading twice the bytes. kUnroll runs loaded before any is used.
__global__ void silu_mul_bf16_kernel(const uint4* __restrict__ gate, const uint4* __restrict__ up,
                                     int64_t n8, uint4* __restrict__ out,
                                     float* __restrict__ consts) {
  constexpr int kUnroll = 4;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (first == 0) consts[0] = 1.0f;
  for (int64_t i0 = first; i0 < n8; i0 += kUnroll * stride) {
    uint4 a[kUnroll], b[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = i0 + u * stride;
      if (i < n8) a[u] = gate[i], b[u] = up[i];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = i0 + u * stride;
      if (i >= n8) break;
      const auto* ga = reinterpret_cast<const __nv_bfloat162*>(&a[u]);
      const auto* ub = reinterpret_cast<const __nv_bfloat162*>(&b[u]);
      uint4 o;
      auto* op = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 g = __bfloat1622float2(ga[k]), v = __bfloat1622float2(ub[k]);
        op[k] = __floats2bfloat162_rn(silu_f(g.x) * v.x, silu_f(g.y) * v.y);
      }
      out[i] = o;
    }
  }
}

}  // namespace
}  // namespace tokenmill::cuda

namespace tokenmill {

namespace {
constexpr int kGemmMaxBitsSlot = 2;  // gemm_consts_[2]: the bits of the split's abs max

// Calls run(std::integral_constant<int, OP>) for a gate op of gemm_abs_max's numbering (0 none,
// 1 SiLU, 2 sigmoid): the kernels take it as a template parameter.
template <class Run>
void with_gate_op(int op, Run&& run) {
  if (op == 1) {
    run(std::integral_constant<int, 1>{});
  } else if (op == 2) {
    run(std::integral_constant<int, 2>{});
  } else {
    run(std::integral_constant<int, 0>{});
  }
}
}  // namespace

void CudaBackend::init_gemm() {
  cublasHandle_t h = nullptr;
  TM_CUBLAS(cublasCreate(&h));
  cublas_ = h;
  TM_CUBLAS(cublasSetStream(h, stream_));
  TM_CUBLAS(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_DEVICE));
  gemm_consts_ = static_cast<float*>(alloc(256));
  owned_.push_back(gemm_consts_);
  // alpha (2^-e, written by the split), beta 0, the activations' largest |x| (kGemmMaxBitsSlot).
  const float init[3] = {1.0f, 0.0f, 0.0f};
  TM_CUDA(cudaMemcpy(gemm_consts_, init, sizeof init, cudaMemcpyHostToDevice));
  gemm_w_ = alloc(kGemmSlabBytes);
  owned_.push_back(gemm_w_);
  // A workspace of our own: cuBLAS must not allocate while a decode step is being recorded.
  void* ws = alloc(kCublasWorkspaceBytes);
  owned_.push_back(ws);
  TM_CUBLAS(cublasSetWorkspace(h, ws, kCublasWorkspaceBytes));
  gemm_x_ = alloc(kGemmInitialXBytes);
  gemm_x_bytes_ = kGemmInitialXBytes;
}

void CudaBackend::destroy_gemm() {
  if (cublas_) cublasDestroy(static_cast<cublasHandle_t>(cublas_));
  cublas_ = nullptr;
  if (gemm_x_) cudaFree(gemm_x_);
  gemm_x_ = nullptr;
  if (gdn_ws_) cudaFree(gdn_ws_);
  gdn_ws_ = nullptr;
  if (kv16_) cudaFree(kv16_);
  kv16_ = nullptr;
}

size_t CudaBackend::gemm_x_bytes(int64_t n, int64_t cols) const {
  const int parts = prefill_precision_ == PrefillPrecision::kFast ? 1 : kGemmParts;
  return static_cast<size_t>(n * cols) * parts * sizeof(__half);  // BF16's size is F16's
}

int CudaBackend::gemm_parts(const cuda::DevMat& m) const {
  // kFast: 0 for BF16 weights (read in place, BF16 activations), else the hi parts only (one
  // pass, F16 rounding of both operands). kExact: BF16 and F16 weights are exact in F16: hi*hi
  // + hi*lo. Others: hi*hi + hi*lo + lo*hi.
  const bool exact_in_f16 = m.bits == 0 && m.dtype != cuda::kF32;
  if (prefill_precision_ == PrefillPrecision::kFast) {
    const bool bf16_in_place = m.bits == 0 && m.dtype == cuda::kBF16 && m.row_bytes == 2 * m.cols &&
                               m.cols % 8 == 0 && reinterpret_cast<uintptr_t>(m.data) % 16 == 0;
    return bf16_in_place ? 0 : 1;
  }
  return exact_in_f16 ? 2 : 3;
}

void CudaBackend::gemm_abs_max(int op, float* x, const float* y, float* out, int64_t elems) {
  auto* max_bits = reinterpret_cast<unsigned*>(gemm_consts_ + kGemmMaxBitsSlot);
  TM_CUDA(cudaMemsetAsync(max_bits, 0, sizeof(unsigned), stream_));
  const int threads = 256;
  const auto al = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec = elems % 4 == 0 && al(x) && al(y) && al(out);
  const int64_t items = vec ? elems / 4 : elems;
  const auto grid = static_cast<unsigned>(std::min<int64_t>((items + threads - 1) / threads, 1024));
  const auto run = [&](auto op_tag) {
    constexpr int kOp = decltype(op_tag)::value;
    if (vec) {
      cuda::abs_max_vec_kernel<kOp><<<grid, threads, 0, stream_>>>(
          reinterpret_cast<float4*>(x), reinterpret_cast<const float4*>(y),
          reinterpret_cast<float4*>(out), items, max_bits);
    } else {
      cuda::abs_max_kernel<kOp><<<grid, threads, 0, stream_>>>(x, y, out, items, max_bits);
    }
  };
  with_gate_op(op, run);
  TM_CUDA_LAUNCHED();
}

void* CudaBackend::gemm_bf16_input(int64_t n, int64_t K) {
  return grow_workspace(&gemm_x_, &gemm_x_bytes_,
                        static_cast<size_t>(n * K) * sizeof(__nv_bfloat16), "prefill GEMM");
}

void CudaBackend::gemm_to_bf16(int op, const float* x, const float* y, int64_t n, int64_t K) {
  auto* out = static_cast<__nv_bfloat16*>(gemm_bf16_input(n, K));
  const int threads = 256;
  const int64_t elems = n * K;
  const auto al = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec = elems % 4 == 0 && al(x) && (y == nullptr || al(y));
  const int64_t items = vec ? elems / 4 : elems;
  const auto grid = static_cast<unsigned>(
      std::clamp<int64_t>((items + threads - 1) / threads, 1, 4 * int64_t{gemv_ws_.sm_count}));
  const auto run = [&](auto op_tag) {
    constexpr int kOp = decltype(op_tag)::value;
    if (vec) {
      cuda::to_bf16_kernel<kOp, 4><<<grid, threads, 0, stream_>>>(x, y, elems, out, gemm_consts_);
    } else {
      cuda::to_bf16_kernel<kOp, 1><<<grid, threads, 0, stream_>>>(x, y, elems, out, gemm_consts_);
    }
  };
  with_gate_op(op, run);
  TM_CUDA_LAUNCHED();
}

void CudaBackend::gemm_gate_split(int op, float* x, const float* y, float* act, int64_t n,
                                  int64_t K, int parts) {
  if (parts == 0) {
    gemm_to_bf16(op, x, y, n, K);
    return;
  }
  gemm_abs_max(op, x, y, act, n * K);
  gemm_split(op == 1 ? act : x, n, K, parts, true);
}

void CudaBackend::gemm_split(const float* x, int64_t n, int64_t K, int parts, bool max_done) {
  if (parts == 0) {
    gemm_to_bf16(0, x, nullptr, n, K);
    return;
  }
  grow_workspace(&gemm_x_, &gemm_x_bytes_, static_cast<size_t>(n * K * parts) * sizeof(__half),
                 "prefill GEMM");

  auto* max_bits = reinterpret_cast<unsigned*>(gemm_consts_ + kGemmMaxBitsSlot);
  const int threads = 256;
  if (!max_done) gemm_abs_max(0, const_cast<float*>(x), nullptr, nullptr, n * K);
  auto* xs = static_cast<__half*>(gemm_x_);
  const bool vec = K % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const dim3 grid(cuda::blocks_for(vec ? K / 4 : K, threads),
                  static_cast<unsigned>(std::min<int64_t>(n, 65535)));
  if (vec) {
    cuda::split_f16_kernel<4>
        <<<grid, threads, 0, stream_>>>(x, n, K, parts, max_bits, xs, gemm_consts_);
  } else {
    cuda::split_f16_kernel<1>
        <<<grid, threads, 0, stream_>>>(x, n, K, parts, max_bits, xs, gemm_consts_);
  }
  TM_CUDA_LAUNCHED();
}

void CudaBackend::gemm(const float* x, int64_t n, const cuda::DevMat& m, float* out) {
  const int parts = gemm_parts(m);
  gemm_split(x, n, m.cols, parts);
  gemm_split_done(n, m, parts, parts, out);
}

void CudaBackend::gemm_bf16_product(int64_t n, const cuda::DevMat& m, void* out16) {
  auto* h = static_cast<cublasHandle_t>(cublas_);
  const int rows = static_cast<int>(m.rows), ik = static_cast<int>(m.cols);
  TM_CUBLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, rows, static_cast<int>(n), ik, gemm_consts_,
                         m.data, CUDA_R_16BF, ik, gemm_x_, CUDA_R_16BF, ik, gemm_consts_ + 1, out16,
                         CUDA_R_16BF, rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void CudaBackend::gemm_silu_mul_bf16(const void* gate16, const void* up16, int64_t n, int64_t K) {
  auto* out = gemm_bf16_input(n, K);
  const int threads = 256;
  const int64_t n8 = n * K / 8;
  const auto grid = static_cast<unsigned>(
      std::clamp<int64_t>((n8 + threads - 1) / threads, 1, 4 * int64_t{gemv_ws_.sm_count}));
  cuda::silu_mul_bf16_kernel<<<grid, threads, 0, stream_>>>(static_cast<const uint4*>(gate16),
                                                            static_cast<const uint4*>(up16), n8,
                                                            static_cast<uint4*>(out), gemm_consts_);
  TM_CUDA_LAUNCHED();
}

// Fast mode with BF16 weights read in place (gemm_parts 0 for all three matrices): the norm
// writes only the gate and up GEMMs' BF16 activations (h in F32 is nobody's input here), gate
// and up come out of their GEMMs as BF16 (into the scratch's gate and up rows), and one pass
// makes the down GEMM's BF16 activations of them. The op-by-op form wrote and read gate and up
// in F32 (1.14 GB a 27B layer at 8k tokens) only to round their product to BF16. Anything else
// takes the default.
void CudaBackend::mlp_block(float* x, const float* y, int64_t n, int hidden,
                            const MlpBlockWeights& b, const MlpBlockScratch& s, float* out) {
  const auto al = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (gemm_rows(n) && !b.gate->experts && !b.up->experts && !b.down->experts && al(s.gate) &&
      al(s.up)) {
    const cuda::DevMat g = cuda::make_devmat(*b.gate, 0), u = cuda::make_devmat(*b.up, 0),
                       d = cuda::make_devmat(*b.down, 0);
    if (gemm_parts(g) == 0 && gemm_parts(u) == 0 && gemm_parts(d) == 0 && g.cols == hidden &&
        u.cols == hidden && u.rows == g.rows && d.cols == g.rows && g.rows % 8 == 0 &&
        launch_rmsnorm(x, y, b.norm, nullptr, n, hidden, b.eps, true)) {
      gemm_bf16_product(n, g, s.gate);
      gemm_bf16_product(n, u, s.up);
      gemm_silu_mul_bf16(s.gate, s.up, n, g.rows);
      gemm_split_done(n, d, 0, 0, out);
      return;
    }
  }
  Backend::mlp_block(x, y, n, hidden, b, s, out);
}

// One GEMM over K' = parts * K: out^T [rows, n] = [W_hi W_hi W_lo] [x_hi; x_lo; x_hi] (F16
// operands, F32 accumulation), so the two or three products of the split sum in one
// accumulator and one pass over the output. The activations were split into split_parts >=
// parts (a prefix of the parts is the split with fewer). split_parts == 0 (every matrix sharing
// the split is BF16 in fast mode): BF16 activations times the weights as they are.
void CudaBackend::gemm_split_done(int64_t n, const cuda::DevMat& m, int parts, int split_parts,
                                  float* out) {
  auto* xs = static_cast<__half*>(gemm_x_);
  auto* h = static_cast<cublasHandle_t>(cublas_);
  if (split_parts == 0) {  // BF16 activations: the BF16 weights in place, one GEMM
    const int rows = static_cast<int>(m.rows), ik = static_cast<int>(m.cols);
    TM_CUBLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, rows, static_cast<int>(n), ik, gemm_consts_,
                           m.data, CUDA_R_16BF, ik, xs, CUDA_R_16BF, ik, gemm_consts_ + 1, out,
                           CUDA_R_32F, rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return;
  }
  parts = std::max(parts, 1);  // a BF16 weight beside others that needed F16 activations
  const int64_t K = m.cols, kp = K * parts;
  const int threads = 256;
  // Slabs of equal rows (a multiple of 16), as few as the workspace allows: a short last slab
  // is a GEMM of a fraction of a wave.
  const int64_t most = static_cast<int64_t>(kGemmSlabBytes / sizeof(__half)) / kp / 16 * 16;
  TM_CUDA_REQUIRE(most >= 16, "linear: rows too wide for the GEMM workspace");
  const int64_t slabs = (m.rows + most - 1) / most;
  const int64_t slab = ((m.rows + slabs - 1) / slabs + 15) / 16 * 16;
  auto* w = static_cast<__half*>(gemm_w_);
  const int ik = static_cast<int>(kp), in = static_cast<int>(n), ld_out = static_cast<int>(m.rows);
  const int ldx = static_cast<int>(K * split_parts);
  for (int64_t r0 = 0; r0 < m.rows; r0 += slab) {
    const int64_t rows = std::min(slab, m.rows - r0);
    if (m.tiled) {
      const int64_t blocks = (rows + 15) / 16 * m.groups;
      const auto grid =
          static_cast<unsigned>((blocks + cuda::kDequantWarps - 1) / cuda::kDequantWarps);
      const int t = 32 * cuda::kDequantWarps;
      if (m.group == 32) {
        cuda::dequant_q4_tiled_f16_kernel<1><<<grid, t, 0, stream_>>>(m, r0, rows, parts, w);
      } else if (m.group == 64) {
        cuda::dequant_q4_tiled_f16_kernel<2><<<grid, t, 0, stream_>>>(m, r0, rows, parts, w);
      } else {
        cuda::dequant_q4_tiled_f16_kernel<4><<<grid, t, 0, stream_>>>(m, r0, rows, parts, w);
      }
    } else {
      const int64_t items = rows * ((K + 7) / 8);
      cuda::dequant_f16_kernel<<<cuda::blocks_for(items, threads), threads, 0, stream_>>>(
          m, r0, rows, parts, w);
    }
    TM_CUDA_LAUNCHED();
    // Column-major view: out^T [rows, n] (ld m.rows) = W' [K', rows]^T * x' [K', n].
    TM_CUBLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), in, ik,
                           gemm_consts_, w, CUDA_R_16F, ik, xs, CUDA_R_16F, ldx, gemm_consts_ + 1,
                           out + r0, CUDA_R_32F, ld_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
}

}  // namespace tokenmill
