// The CUDA backend's public face: plain C++, no CUDA headers (app/ and tests include it).
#pragma once

#include <memory>

#include "backend/backend.h"

namespace tokenmill {

// Number of visible CUDA devices; 0 when there is none or the driver is missing.
int cuda_device_count();

// Arithmetic of the prefill matmuls on the tensor cores: the GEMM (linear with more rows than
// the GEMV kernels take) and the prefill attention's two products.
//   kExact: operands that F16 would round are split into F16 hi + lo parts, two or three
//           tensor-core passes; prefill agrees with decode and the CPU to F32 rounding.
//   kFast:  one F16 pass (about 11 significant bits per operand, like the BF16/F16 prefill of
//           other engines), a third of the tensor-core work of kExact.
enum class PrefillPrecision { kExact, kFast };

// Arithmetic of the 4-bit GEMV for 17-64 rows on Hopper (decode batches of that many sequences,
// speculative verify steps that wide):
//   kExact: the weights' digits exact in F16, the activations as F16 hi + lo, each group's
//           scale and bias applied in F32; agrees with smaller batches and the CPU to F32
//           rounding.
//   kFast:  the weights dequantized to F16 (digit * scale + bias, rounded once) times the
//           activations' F16 hi parts, one pass accumulated in F32 (about 11 significant bits
//           per operand, like engines that compute in F16); batches of 17-64 rows then differ
//           from smaller ones by that rounding.
enum class BatchPrecision { kExact, kFast };

// A backend running every op on CUDA device `device` on its own stream. Throws
// tokenmill::Error when the device cannot be used. l2_prefetch: each bf16/8-bit decode GEMV
// pulls the start of the next one's weights into L2 (off only to measure what it gives).
std::unique_ptr<Backend> make_cuda_backend(
    int device = 0, PrefillPrecision prefill_precision = PrefillPrecision::kExact,
    bool l2_prefetch = true, BatchPrecision batch_precision = BatchPrecision::kExact);

}  // namespace tokenmill
