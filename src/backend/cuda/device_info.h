// Device query for `tokenmill version` and bench: plain C++ interface, no CUDA headers.
#pragma once

#include <string>

namespace tokenmill::cuda {

// One line per visible GPU ("0: NVIDIA H200, 139.8 GiB, sm_90, 132 SMs"), or the reason none is.
std::string describe_devices();

}  // namespace tokenmill::cuda
