// CudaBackend::linear and embed. n <= kGemvMaxRows activation rows (4-bit: kQ4GemvMaxRows): the
// fast GEMVs of cuda_gemv.cu / cuda_gemv_q4.cu, or here a warp per weight row for the other formats
// (decode is bound by weight bandwidth; each weight byte is read once for all n rows). Larger n:
// the tensor-core GEMM of cuda_gemm.cu.
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv.h"
#include "tensor/affine.h"

namespace tokenmill::cuda {

DevMat make_devmat(const Weight& w, int expert) {
  TM_CUDA_REQUIRE(w.data != nullptr && w.rows > 0 && w.cols > 0, "linear on an empty weight");
  const int64_t count = w.experts > 0 ? w.experts : 1;
  TM_CUDA_REQUIRE(expert >= 0 && expert < count, "expert index outside the weight's experts");
  DevMat m;
  m.rows = w.rows;
  m.cols = w.cols;
  m.experts = count;
  m.bits = w.bits;
  m.group = w.group;
  if (!w.quantized()) {
    TM_CUDA_REQUIRE(w.dtype == DType::F32 || w.dtype == DType::BF16 || w.dtype == DType::F16,
                    "float weight must be F32, F16 or BF16");
    m.dtype = w.dtype == DType::F32 ? kF32 : w.dtype == DType::F16 ? kF16 : kBF16;
    m.row_bytes = w.cols * static_cast<int64_t>(dtype_size(w.dtype));
    m.data_stride = m.rows * m.row_bytes;
    m.chunks8 = w.cols % 8 == 0 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0;
  } else {
    affine::check_layout(w.bits, w.group, w.cols, "affine weight");
    TM_CUDA_REQUIRE(
        w.scale_dtype == DType::F32 || w.scale_dtype == DType::BF16 || w.scale_dtype == DType::F16,
        "affine scales must be F32, F16 or BF16");
    const bool tiled = w.packing == kQ4TilePacking;
    TM_CUDA_REQUIRE(w.packing == 0 || (tiled && w.bits == 4),
                    "affine weight in a packing this backend did not make");
    TM_CUDA_REQUIRE(w.scales != nullptr && (tiled || w.biases != nullptr),
                    "affine weight without scales/biases");
    TM_CUDA_REQUIRE(reinterpret_cast<uintptr_t>(w.data) % 8 == 0,
                    "affine weight data must be 8-byte aligned (upload it with upload_weight)");
    m.sdtype = w.scale_dtype == DType::F32 ? kF32 : w.scale_dtype == DType::F16 ? kF16 : kBF16;
    m.row_bytes = affine::words_per_row(w.cols, w.bits) * 4;
    m.groups = w.cols / w.group;
    // Tiles pad the rows to a multiple of 16; scales and biases share one array there.
    const int64_t stored_rows = tiled ? (m.rows + 15) / 16 * 16 : m.rows;
    m.data_stride = stored_rows * m.row_bytes;
    m.sb_stride =
        stored_rows * m.groups * static_cast<int64_t>(dtype_size(w.scale_dtype)) * (tiled ? 2 : 1);
    m.chunks8 = true;
    m.tiled = tiled;
  }
  m.data = static_cast<const uint8_t*>(w.data) + expert * m.data_stride;
  if (m.bits) {
    m.scales = static_cast<const uint8_t*>(w.scales) + expert * m.sb_stride;
    m.biases = m.tiled ? nullptr : static_cast<const uint8_t*>(w.biases) + expert * m.sb_stride;
  }
  return m;
}

}  // namespace tokenmill::cuda

namespace tokenmill {

Weight CudaBackend::pack_weight(const Weight& w) {
  if (!cuda::q4_tile_packable(w)) return w;
  // Load time: one pass over the weight at device bandwidth (27B at 4 bits: ~15 GB, a few ms
  // of kernel time per matrix).
  Weight t = w;
  void* data = alloc(cuda::q4_tile_data_bytes(w));
  owned_.push_back(data);
  void* scales = alloc(cuda::q4_tile_scale_bytes(w));
  owned_.push_back(scales);
  cuda::launch_q4_pack(stream_, w, data, scales);
  TM_CUDA(cudaStreamSynchronize(stream_));  // the caller may free w's buffers next
  t.data = data;
  t.scales = scales;
  t.biases = nullptr;
  t.packing = cuda::kQ4TilePacking;
  return t;
}

}  // namespace tokenmill

namespace tokenmill::cuda {

namespace {

constexpr int kGemvWarps = 8;  // weight rows per GEMV block

// Dot of weight row r with x (one activation row), partial per lane.
__device__ __forceinline__ float row_dot_partial(const DevMat& m, int64_t r, const float* x) {
  const int lane = threadIdx.x & 31;
  const uint8_t* row = m.data + r * m.row_bytes;
  float acc = 0.0f;
  if (m.chunks8) {
    for (int64_t j = lane * 8; j < m.cols; j += 256) {
      float w[8];
      load8(m, row, r, j, w);
#pragma unroll
      for (int u = 0; u < 8; ++u) acc += w[u] * x[j + u];
    }
  } else {
    for (int64_t j = lane; j < m.cols; j += 32) acc += load1(m, row, r, j) * x[j];
  }
  return acc;
}

// out[i, r] = W[r, :] . x[i, :] for i < n <= N; one warp per weight row r.
template <int N>
__global__ void gemv_kernel(DevMat m, const float* __restrict__ x, int64_t ldx, int n,
                            float* __restrict__ out, int64_t ldo) {
  pdl_begin();
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5);
  if (r >= m.rows) return;
  const int lane = threadIdx.x & 31;
  const uint8_t* row = m.data + r * m.row_bytes;
  float acc[N];
#pragma unroll
  for (int i = 0; i < N; ++i) acc[i] = 0.0f;
  if (m.chunks8) {
    for (int64_t j = lane * 8; j < m.cols; j += 256) {
      float w[8];
      load8(m, row, r, j, w);
#pragma unroll
      for (int i = 0; i < N; ++i) {
        if (i < n) {
          const float* xi = x + i * ldx + j;
          float s = 0.0f;
#pragma unroll
          for (int u = 0; u < 8; ++u) s += w[u] * xi[u];
          acc[i] += s;
        }
      }
    }
  } else {
    for (int64_t j = lane; j < m.cols; j += 32) {
      const float w = load1(m, row, r, j);
#pragma unroll
      for (int i = 0; i < N; ++i) {
        if (i < n) acc[i] += w * x[i * ldx + j];
      }
    }
  }
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if (i < n) {
      const float s = warp_sum(acc[i]);
      if (lane == 0) out[i * ldo + r] = s;
    }
  }
}

// Slot s: out[s, r] = W_{ids[s]}[r, :] . x[s / x_div, :]. An expert id outside the weight
// writes NaN (the router never produces one; NaN makes a corrupted id visible).
__global__ void gemv_indexed_kernel(DevMat m, const int32_t* __restrict__ ids,
                                    const float* __restrict__ x, int64_t ldx, int64_t x_div,
                                    float* __restrict__ out, int64_t ldo) {
  pdl_begin();
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5);
  if (r >= m.rows) return;
  const int64_t s = blockIdx.y;
  const int e = ids[s];
  float v;
  if (e < 0 || e >= m.experts) {
    v = __int_as_float(0x7fc00000);
  } else {
    v = warp_sum(row_dot_partial(at_expert(m, e), r, x + (s / x_div) * ldx));
  }
  if ((threadIdx.x & 31) == 0) out[s * ldo + r] = v;
}

// out[i, :] = row ids[i] of the table, dequantized; an id outside the table writes NaN. Block
// (i, y) writes columns [y * blockDim.x, (y + 1) * blockDim.x) of row i, one value a thread: the
// table's row is cold in L2, and one block looping over a 5,120-wide row waited a DRAM round
// trip per pass (15 us on the H200, the first kernel of every decode step).
__global__ void embed_kernel(DevMat m, const int32_t* __restrict__ ids, float* __restrict__ out) {
  const int64_t i = blockIdx.x;
  const int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (j >= m.cols) return;
  const int id = ids[i];
  out[i * m.cols + j] = id < 0 || id >= m.rows
                            ? __int_as_float(0x7fc00000)
                            : load1(m, m.data + static_cast<int64_t>(id) * m.row_bytes, id, j);
}

}  // namespace

void launch_gemv_indexed(cudaStream_t st, const DevMat& m, const int32_t* ids, int64_t slots,
                         const float* x, int64_t ldx, int64_t x_div, float* out, int64_t ldo) {
  if (slots <= 0) return;
  TM_CUDA_REQUIRE(slots <= 65535, "moe: more than 65535 token-expert slots in one call");
  const dim3 grid(blocks_for(m.rows, kGemvWarps), static_cast<unsigned>(slots));
  launch_pdl(gemv_indexed_kernel, grid, kGemvWarps * 32, 0, st, m, ids, x, ldx, x_div, out, ldo);
  TM_CUDA_LAUNCHED();
}

}  // namespace tokenmill::cuda

namespace tokenmill {

using cuda::DevMat;

namespace {
// The fast GEMV for `m` at n rows, or kNone (the 4-bit kernel also needs its prepared
// activations to fit the workspace).
cuda::GemvKind fast_kind(const DevMat& m, int64_t n, size_t ws_bytes) {
  const cuda::GemvKind kind = cuda::fast_gemv_kind(m);
  if (kind == cuda::GemvKind::kQ4 && cuda::q4_act_bytes(n, m.cols, m.group) > ws_bytes) {
    return cuda::GemvKind::kNone;
  }
  return kind;
}
// Activation rows up to which the fast GEMV of `kind` runs (each weight byte read once for all
// rows); above, the GEMM.
int64_t gemv_max_rows(cuda::GemvKind kind) {
  return kind == cuda::GemvKind::kQ4 ? cuda::kQ4GemvMaxRows : CudaBackend::kGemvMaxRows;
}
}  // namespace

// Not for the 4-bit GEMVs: on the H200 (27B q4g64 batch 1) the entry's load at the end of each
// warp's range cost 1.5% and the prefetch gave back 0.5% (docs/PERFORMANCE.md, S20 notes).
void CudaBackend::chain_gemv(cuda::GemvJobs& jobs) {
  cuda::L2Region r[cuda::kL2PrefetchRegions];
  int count = 0;
  const auto add = [&](const void* p, int64_t bytes) {
    if (p != nullptr && bytes > 0 && count < cuda::kL2PrefetchRegions) {
      r[count++] = {p, static_cast<uint64_t>(bytes)};
    }
  };
  for (int j = 0; j < jobs.count; ++j) add(jobs.m[j].data, jobs.m[j].data_stride);
  for (int j = 0; j < jobs.count; ++j) {
    add(jobs.m[j].scales, jobs.m[j].sb_stride);
    add(jobs.m[j].biases, jobs.m[j].sb_stride);
  }
  jobs.next = l2_chain_.attach(r, count, stream_, recording_);
}

void CudaBackend::linear(const float* x, int64_t n, const Weight& w, float* out, int expert) {
  if (n <= 0) return;
  const DevMat m = cuda::make_devmat(w, expert);
  const int64_t ldx = m.cols, ldo = m.rows;
  if (const cuda::GemvKind kind =
          n <= cuda::kQ4GemvMaxRows ? fast_kind(m, n, kGemvWorkspaceBytes) : cuda::GemvKind::kNone;
      kind != cuda::GemvKind::kNone && n <= gemv_max_rows(kind) &&
      reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    cuda::GemvJobs jobs;
    jobs.m[0] = m;
    jobs.out[0] = out;
    jobs.count = 1;
    if (kind != cuda::GemvKind::kQ4) chain_gemv(jobs);
    cuda::launch_gemv_fast(stream_, kind, jobs, x, ldx, static_cast<int>(n), gemv_ws_);
    return;
  }
  if (n <= kGemvMaxRows) {
    const unsigned grid = cuda::blocks_for(m.rows, cuda::kGemvWarps);
    const int threads = cuda::kGemvWarps * 32;
    const int ni = static_cast<int>(n);
    if (n == 1) {
      cuda::launch_pdl(cuda::gemv_kernel<1>, grid, threads, 0, stream_, m, x, ldx, ni, out, ldo);
    } else if (n <= 4) {
      cuda::launch_pdl(cuda::gemv_kernel<4>, grid, threads, 0, stream_, m, x, ldx, ni, out, ldo);
    } else {
      cuda::launch_pdl(cuda::gemv_kernel<16>, grid, threads, 0, stream_, m, x, ldx, ni, out, ldo);
    }
    TM_CUDA_LAUNCHED();
    return;
  }
  gemm(x, n, m, out);
}

// Decode rows: the norm's kernel also writes h's digits for the 4-bit matrices of the first 4-bit
// matrix's group size and scale type (one GEMV launch per 4 of them), so they need no
// preparation kernel; the other matrices read h through linear_multi.
void CudaBackend::rmsnorm_linear_multi(float* x, const float* y, const float* w, float* h,
                                       bool keep_h, int64_t rows, int dim, float eps,
                                       const Weight* const* ws, float* const* outs, int count) {
  rmsnorm_linear_multi_impl(x, y, nullptr, nullptr, w, h, keep_h, rows, dim, eps, ws, outs, count);
}

void CudaBackend::rmsnorm_linear_multi_moe(float* x, const MoeRows& y, float* out, const float* w,
                                           float* h, bool keep_h, int64_t rows, int dim, float eps,
                                           const Weight* const* ws, float* const* outs, int count) {
  rmsnorm_linear_multi_impl(x, out, &y, out, w, h, keep_h, rows, dim, eps, ws, outs, count);
}

void CudaBackend::rmsnorm_linear_multi_impl(float* x, const float* y, const MoeRows* moe,
                                            float* moe_out, const float* w, float* h, bool keep_h,
                                            int64_t rows, int dim, float eps,
                                            const Weight* const* ws, float* const* outs,
                                            int count) {
  const auto al = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  int q4[16];
  int nq = 0;
  DevMat first;
  if (rows >= 1 && rows <= cuda::kQ4DigitMaxRows && dim % 8 == 0 && dim / 8 <= 1024 &&
      count <= 16 && al(x) && al(y) && al(w) && al(h) &&
      (moe == nullptr || (al(moe->rows) && dim / 8 <= cuda::kCombineMaxWords))) {
    for (int i = 0; i < count; ++i) {
      const DevMat m = cuda::make_devmat(*ws[i], 0);
      if (ws[i]->experts || m.cols != dim ||
          fast_kind(m, rows, kGemvWorkspaceBytes) != cuda::GemvKind::kQ4) {
        continue;
      }
      if (nq > 0 && (m.group != first.group || m.sdtype != first.sdtype)) continue;
      if (nq == 0) first = m;
      q4[nq++] = i;
    }
  }
  if (nq == 0) {
    if (moe != nullptr) moe_combine_into(*moe, rows, dim, moe_out);  // y is moe_out
    if (!norm_into_bf16_gemms(x, y, w, keep_h ? h : nullptr, rows, dim, eps, ws, outs, count)) {
      Backend::rmsnorm_linear_multi(x, y, w, h, keep_h, rows, dim, eps, ws, outs, count);
    }
    return;
  }
  const cuda::Q4Act act =
      cuda::q4_act_layout(rows, dim, first.group, cuda::Q4Operands::kDigits, gemv_ws_);
  // A deferred MoE output is combined by the norm's kernel itself (one launch less a layer).
  cuda::CombineRows cr;
  if (moe != nullptr) cr = {moe->rows, moe->weights, moe->gate_logit, moe->k, moe->per_token};
  cuda::launch_rmsnorm_q4d(stream_, x, moe != nullptr ? nullptr : y, w, h, rows, dim, eps, act, cr);
  for (int b = 0; b < nq; b += cuda::kMaxGemvJobs) {
    cuda::GemvJobs jobs;
    for (int c = b; c < nq && c < b + cuda::kMaxGemvJobs; ++c) {
      jobs.m[jobs.count] = cuda::make_devmat(*ws[q4[c]], 0);
      jobs.out[jobs.count] = outs[q4[c]];
      ++jobs.count;
    }
    cuda::launch_q4_gemv(stream_, jobs, act, static_cast<int>(rows), cuda::Q4Slots{}, 0, gemv_ws_);
  }
  // The rest (other formats or group sizes) after the 4-bit launches: a preparation of theirs
  // rewrites the workspace only once those have finished (every kernel waits for the one before).
  const Weight* rest[16];
  float* rest_out[16];
  int nr = 0;
  for (int i = 0, k = 0; i < count; ++i) {
    if (k < nq && q4[k] == i) {
      ++k;
      continue;
    }
    rest[nr] = ws[i];
    rest_out[nr++] = outs[i];
  }
  if (nr > 0) linear_multi(h, rows, rest, rest_out, nr);
}

// Prefill rows whose matrices all take BF16 activations (gemm_parts 0: fast mode, BF16 weights
// in place): the norm's kernel writes them (and h in F32 unless h is null), then one GEMM per
// matrix. False (nothing launched) otherwise.
bool CudaBackend::norm_into_bf16_gemms(float* x, const float* y, const float* w, float* h,
                                       int64_t rows, int dim, float eps, const Weight* const* ws,
                                       float* const* outs, int count) {
  if (!gemm_rows(rows) || count > 16) return false;
  DevMat ms[16];
  for (int i = 0; i < count; ++i) {
    if (ws[i]->experts) return false;
    ms[i] = cuda::make_devmat(*ws[i], 0);
    if (ms[i].cols != dim || gemm_parts(ms[i]) != 0) return false;
  }
  if (!launch_rmsnorm(x, y, w, h, rows, dim, eps, true)) return false;
  for (int i = 0; i < count; ++i) gemm_split_done(rows, ms[i], 0, 0, outs[i]);
  return true;
}

// 4-bit decode rows: the gated norm's kernel writes the digits (rmsnorm_gated_q4d_kernel).
void CudaBackend::rmsnorm_gated_linear(const float* o, const float* z, const float* norm_w,
                                       float* normed, int64_t n, int heads, int dim, float eps,
                                       const Weight& w, float* out) {
  const auto al = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const int64_t K = int64_t{heads} * dim;
  const int lanes = dim / 8;  // words per head: whole aligned runs of lanes
  if (n >= 1 && n <= cuda::kQ4DigitMaxRows && !w.experts && dim % 8 == 0 && lanes <= 32 &&
      (lanes & (lanes - 1)) == 0 && K / 8 <= 1024 && al(o) && al(z) && al(norm_w) && al(normed)) {
    const DevMat m = cuda::make_devmat(w, 0);
    if (q4_digit_gemv_takes(m, n, K, K)) {
      const cuda::Q4Act act =
          cuda::q4_act_layout(n, K, m.group, cuda::Q4Operands::kDigits, gemv_ws_);
      cuda::launch_rmsnorm_gated_q4d(stream_, o, z, norm_w, normed, n, heads, dim, eps, act);
      q4_gemv_prepared(m, act, n, out);
      return;
    }
  }
  // Prefill into a BF16 GEMM (fast mode): the gated norm's kernel writes its activations.
  if (gemm_rows(n) && !w.experts) {
    const DevMat m = cuda::make_devmat(w, 0);
    if (m.cols == K && gemm_parts(m) == 0 &&
        launch_rmsnorm_gated(o, z, norm_w, normed, n * heads, dim, eps, true)) {
      gemm_split_done(n, m, 0, 0, out);
      return;
    }
  }
  Backend::rmsnorm_gated_linear(o, z, norm_w, normed, n, heads, dim, eps, w, out);
}

// 4-bit decode rows whose input is a product of two rows: the digit GEMV's preparation computes
// it (silu(x) * y or x * sigmoid(y)), no kernel of its own. False when the fast path does not
// apply (the caller then runs the ops one by one).
bool CudaBackend::gated_q4_linear(const float* x, const float* y, bool sigmoid_gate, int64_t n,
                                  const Weight& w, float* out) {
  if (n < 1 || n > cuda::kQ4DigitMaxRows || w.experts) return false;
  const DevMat m = cuda::make_devmat(w, 0);
  if (fast_kind(m, n, kGemvWorkspaceBytes) != cuda::GemvKind::kQ4 ||
      reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(y) % 16 != 0 ||
      m.cols % 4 != 0) {
    return false;
  }
  const cuda::Q4Act a = cuda::launch_q4_prepare(
      stream_, x, m.cols, n, m.cols, m.group, cuda::Q4Operands::kDigits, gemv_ws_, y, sigmoid_gate);
  q4_gemv_prepared(m, a, n, out);
  return true;
}

bool CudaBackend::q4_digit_gemv_takes(const cuda::DevMat& m, int64_t n, int64_t K,
                                      int64_t unit) const {
  return n >= 1 && n <= cuda::kQ4DigitMaxRows && m.cols == K &&
         fast_kind(m, n, kGemvWorkspaceBytes) == cuda::GemvKind::kQ4 && unit % m.group == 0;
}

void CudaBackend::q4_gemv_prepared(const cuda::DevMat& m, const cuda::Q4Act& act, int64_t n,
                                   float* out) {
  cuda::GemvJobs jobs;
  jobs.m[0] = m;
  jobs.out[0] = out;
  jobs.count = 1;
  cuda::launch_q4_gemv(stream_, jobs, act, static_cast<int>(n), cuda::Q4Slots{}, 0, gemv_ws_);
}

bool CudaBackend::gemm_rows(int64_t n) const {
  return n > cuda::kQ4GemvMaxRows && n > kGemvMaxRows;
}

// Prefill (the GEMM path): the gate's pass also finds the GEMM's activation scale.
void CudaBackend::silu_mul_linear(const float* gate, const float* up, int64_t n, const Weight& w,
                                  float* out, float* act) {
  if (gemm_rows(n) && !w.experts) {
    const DevMat m = cuda::make_devmat(w, 0);
    const int parts = gemm_parts(m);
    gemm_gate_split(1, const_cast<float*>(gate), up, act, n, m.cols, parts);
    gemm_split_done(n, m, parts, parts, out);
  } else if (!gated_q4_linear(gate, up, false, n, w, out)) {
    Backend::silu_mul_linear(gate, up, n, w, out, act);
  }
}

void CudaBackend::sigmoid_mul_linear(float* x, const float* gate, int64_t n, const Weight& w,
                                     float* out) {
  if (gemm_rows(n) && !w.experts) {
    const DevMat m = cuda::make_devmat(w, 0);
    const int parts = gemm_parts(m);
    gemm_gate_split(2, x, gate, nullptr, n, m.cols, parts);
    gemm_split_done(n, m, parts, parts, out);
  } else if (!gated_q4_linear(x, gate, true, n, w, out)) {
    Backend::sigmoid_mul_linear(x, gate, n, w, out);
  }
}

void CudaBackend::linear_multi(const float* x, int64_t n, const Weight* const* ws,
                               float* const* outs, int count) {
  if (n <= 0 || count <= 0) return;
  // One launch per group of matrices that share a fast kernel, input width, group size and scale
  // type (e.g. a MoE layer's bf16 router and shared gate, and its 4-bit shared gate and up);
  // anything without a fast kernel at this n goes through linear().
  TM_CUDA_REQUIRE(count <= 16, "linear_multi: at most 16 matrices");
  if (gemm_rows(n)) {
    // Prefill: every matrix takes the GEMM (as linear() would), all from one split of x into
    // the most F16 parts any of them needs.
    DevMat ms[16];
    int parts = 0;
    bool same_width = true;
    for (int i = 0; i < count; ++i) {
      ms[i] = cuda::make_devmat(*ws[i], 0);
      same_width = same_width && ms[i].cols == ms[0].cols;
      parts = std::max(parts, gemm_parts(ms[i]));
    }
    if (same_width) {
      gemm_split(x, n, ms[0].cols, parts);
      for (int i = 0; i < count; ++i) gemm_split_done(n, ms[i], gemm_parts(ms[i]), parts, outs[i]);
      return;
    }
  }
  const bool aligned = n <= cuda::kQ4GemvMaxRows && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  bool done[16] = {};
  for (int i = 0; i < count; ++i) {
    if (done[i]) continue;
    const DevMat mi = cuda::make_devmat(*ws[i], 0);
    const cuda::GemvKind kind =
        aligned ? fast_kind(mi, n, kGemvWorkspaceBytes) : cuda::GemvKind::kNone;
    if (kind == cuda::GemvKind::kNone || n > gemv_max_rows(kind)) {
      linear(x, n, *ws[i], outs[i]);
      done[i] = true;
      continue;
    }
    cuda::GemvJobs jobs;
    for (int j = i; j < count && jobs.count < cuda::kMaxGemvJobs; ++j) {
      if (done[j]) continue;
      const DevMat m = j == i ? mi : cuda::make_devmat(*ws[j], 0);
      if (j != i && (fast_kind(m, n, kGemvWorkspaceBytes) != kind || m.cols != mi.cols ||
                     m.group != mi.group || m.sdtype != mi.sdtype)) {
        continue;
      }
      jobs.m[jobs.count] = m;
      jobs.out[jobs.count] = outs[j];
      ++jobs.count;
      done[j] = true;
    }
    if (kind != cuda::GemvKind::kQ4) chain_gemv(jobs);
    cuda::launch_gemv_fast(stream_, kind, jobs, x, mi.cols, static_cast<int>(n), gemv_ws_);
  }
}

// Token ids are validated by the model before the forward; on the device an id outside the
// vocabulary yields a NaN row instead of a read outside the table.
void CudaBackend::embed(const Weight& table, const int32_t* ids, int n, float* out) {
  if (n <= 0) return;
  const DevMat m = cuda::make_devmat(table, 0);
  constexpr int kThreads = 256;
  const dim3 grid(static_cast<unsigned>(n), cuda::blocks_for(m.cols, kThreads));
  cuda::embed_kernel<<<grid, kThreads, 0, stream_>>>(m, ids, out);
  TM_CUDA_LAUNCHED();
}

}  // namespace tokenmill
