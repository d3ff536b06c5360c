#include "app/backend_select.h"

#include <CLI/CLI.hpp>
#include <cstdio>

#include "backend/cpu/cpu_backend.h"
#include "cache/cache_manager.h"
#ifdef TM_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "util/error.h"

namespace tokenmill::app {

void add_device_options(CLI::App& cmd, DeviceOptions& opt) {
  cmd.add_option("--device", opt.device, "cpu, cuda or auto")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  cmd.add_option("--threads", opt.threads, "CPU threads (0 = all)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 16));
  cmd.add_option("--prefill-precision", opt.prefill_precision,
                 "CUDA prefill matmuls (linear layers, attention, the delta rule's chunks): exact "
                 "(F32-accurate, agrees with decode and the CPU) or fast (one F16 or TF32 pass: "
                 "about 11 significant bits, a third of the tensor-core work)")
      ->check(CLI::IsMember({"exact", "fast"}))
      ->capture_default_str();
  cmd.add_option("--batch-precision", opt.batch_precision,
                 "CUDA 4-bit matmuls of 17-64 rows on Hopper (decode batches that size, wide "
                 "verify steps): exact (F32-accurate, agrees with smaller batches and the CPU) or "
                 "fast (weights dequantized to F16 times F16 activations in one pass: about 11 "
                 "significant bits, half the tensor-core work and no per-group epilogue)")
      ->check(CLI::IsMember({"exact", "fast"}))
      ->capture_default_str();
}

void add_kv_dtype_option(CLI::App& cmd, std::string& kv_dtype) {
  cmd.add_option("--kv-dtype", kv_dtype,
                 "KV cache elements: f32 (exact), bf16 (half the memory and decode reads) or "
                 "auto (bf16 on CUDA, f32 on the CPU)")
      ->check(CLI::IsMember({"auto", "f32", "bf16"}))
      ->capture_default_str();
}

DType kv_dtype_of(const std::string& kv_dtype, const Backend& backend) {
  if (kv_dtype == "auto") {
    return !is_cpu_backend(backend) && backend.supports_kv_dtype(DType::BF16) ? DType::BF16
                                                                              : DType::F32;
  }
  DType d = DType::F32;
  if (!parse_kv_dtype(kv_dtype, &d)) {
    fail("--kv-dtype must be auto, f32 or bf16, got '{}'", kv_dtype);
  }
  return d;
}

BackendHandle make_backend(const DeviceOptions& opt) {
  BackendHandle h;
  h.pool = std::make_unique<ThreadPool>(opt.threads);
#ifdef TM_HAVE_CUDA
  if (opt.device == "cuda" || (opt.device == "auto" && cuda_device_count() > 0)) {
    h.backend = make_cuda_backend(
        0, opt.prefill_precision == "fast" ? PrefillPrecision::kFast : PrefillPrecision::kExact,
        opt.l2_prefetch,
        opt.batch_precision == "fast" ? BatchPrecision::kFast : BatchPrecision::kExact);
    if (opt.batch_precision == "fast" && !h.backend->precision_modes().batch_fast) {
      std::fprintf(stderr,
                   "note: --batch-precision fast needs a Hopper (sm_90) GPU; %s runs the exact "
                   "kernels\n",
                   h.backend->name().c_str());
    }
    return h;
  }
#else
  if (opt.device == "cuda") {
    fail(
        "--device cuda: this build has no CUDA backend (configure with -DTM_CUDA=ON where nvcc "
        "exists); use --device cpu");
  }
#endif
  for (const auto& [name, value] : {std::pair{"--prefill-precision", &opt.prefill_precision},
                                    std::pair{"--batch-precision", &opt.batch_precision}}) {
    if (*value == "fast") {
      std::fprintf(stderr,
                   "note: %s fast has no effect on the CPU backend, which computes in F32\n", name);
    }
  }
  h.backend = make_cpu_backend(*h.pool);
  return h;
}

bool is_cpu_backend(const Backend& backend) {
  return backend.name().rfind("cpu", 0) == 0;
}

}  // namespace tokenmill::app
