// The CUDA backend's public face: plain C++, no CUDA headers (app/ and tests include it).
#pragma once

#include <memory>

#include "backend/backend.h"

namespace tokenmill {

// Number of visible CUDA devices; 0 when there is none or the driver is missing.
int cuda_device_count();

// A backend running every op on CUDA device `device` on its own stream. Throws
// tokenmill::Error when the device cannot be used.
std::unique_ptr<Backend> make_cuda_backend(int device = 0);

}  // namespace tokenmill
