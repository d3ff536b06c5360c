// Mixture of experts, the simple device-side form: routing ids stay on the device (no host
// sync). For each (token, slot) pair s = t*k + j, gate and up GEMVs of expert ids[s] on x[t],
// silu(gate)*up, the down GEMV, then out[t] = sum_j weights[t, j] * down[s] in slot order.
// Each slot reads its expert's weights once (a sorted grouped GEMM is the faster form for
// prefill). 4-bit experts take the tensor-core GEMV (gate and up in one launch) while the
// prepared activations fit its workspace.
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv.h"

namespace tokenmill::cuda {
namespace {

__global__ void moe_combine_kernel(const float* __restrict__ down, const float* __restrict__ w,
                                   int k, int64_t hidden, float* __restrict__ out) {
  pdl_begin();
  const int64_t t = blockIdx.x;
  // Columns spread over blockIdx.y too: one token's row is a few KB, one block alone waited
  // k dependent-free but serialized loads per column step.
  for (int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; c < hidden;
       c += static_cast<int64_t>(gridDim.y) * blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) acc += w[t * k + j] * down[(t * k + j) * hidden + c];
    out[t * hidden + c] = acc;
  }
}

}  // namespace
}  // namespace tokenmill::cuda

namespace tokenmill {

namespace {

void combine(const float* dn, const float* weights, int64_t n, int k, int64_t hidden, float* out,
             cudaStream_t st) {
  const dim3 grid(static_cast<unsigned>(n),
                  static_cast<unsigned>(std::min<int64_t>((hidden + 255) / 256, 65535)));
  cuda::launch_pdl(cuda::moe_combine_kernel, grid, 256, 0, st, dn, weights, k, hidden, out);
  TM_CUDA_LAUNCHED();
}

}  // namespace

void CudaBackend::moe(const float* x, int64_t n, int k, const int32_t* ids, const float* weights,
                      const Weight& gate, const Weight& up, const Weight& down, float* out,
                      float* scratch) {
  if (n <= 0) return;
  const int64_t E = gate.experts, hidden = gate.cols, inter = gate.rows, slots = n * k;
  TM_CUDA_REQUIRE(E > 0 && up.experts == E && down.experts == E,
                  "moe: gate, up and down must have the same number of experts");
  TM_CUDA_REQUIRE(
      up.rows == inter && up.cols == hidden && down.rows == hidden && down.cols == inter,
      "moe: expert shapes disagree (gate/up [inter, hidden], down [hidden, inter])");
  TM_CUDA_REQUIRE(k >= 1, "moe: k must be >= 1");
  const cuda::DevMat mg = cuda::make_devmat(gate, 0), mu = cuda::make_devmat(up, 0),
                     md = cuda::make_devmat(down, 0);
  // scratch: act [slots, inter] (gate, then silu(gate)*up), upo [slots, inter],
  // dn [slots, hidden].
  float* act = scratch;
  float* upo = act + slots * inter;
  float* dn = upo + slots * inter;
  const size_t ws = kGemvWorkspaceBytes;
  if (cuda::q4_mma_eligible(mg) && cuda::q4_mma_eligible(mu) && cuda::q4_mma_eligible(md) &&
      mg.group == mu.group && mg.sdtype == mu.sdtype &&
      cuda::q4_act_bytes(n, hidden, mg.group) <= ws &&
      cuda::q4_act_bytes(slots, inter, md.group) <= ws &&
      reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(scratch) % 16 == 0 &&
      inter % 4 == 0) {
    cuda::GemvJobs gu;
    gu.m[0] = mg, gu.m[1] = mu;
    gu.out[0] = act, gu.out[1] = upo;
    gu.count = 2;
    const cuda::Q4Act ax = cuda::launch_q4_prepare(stream_, x, hidden, n, hidden, mg.group,
                                                   cuda::Q4Operands::kDigits, gemv_ws_);
    cuda::launch_q4_gemv(stream_, gu, ax, 1, ids, slots, k, gemv_ws_);
    silu_mul(act, upo, act, slots * inter);
    cuda::GemvJobs dj;
    dj.m[0] = md;
    dj.out[0] = dn;
    dj.count = 1;
    const cuda::Q4Act aa = cuda::launch_q4_prepare(stream_, act, inter, slots, inter, md.group,
                                                   cuda::Q4Operands::kDigits, gemv_ws_);
    cuda::launch_q4_gemv(stream_, dj, aa, 1, ids, slots, 1, gemv_ws_);
    combine(dn, weights, n, k, hidden, out, stream_);
    return;
  }
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
  combine(dn, weights, n, k, hidden, out, stream_);
}

}  // namespace tokenmill
