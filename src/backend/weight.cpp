#include "backend/backend.h"

#include <algorithm>

namespace tokenmill {

void release_replaced(Backend& backend, const Weight& before, const Weight& after,
                      std::vector<void*>& owned) {
  for (const void* p : {before.data, before.scales, before.biases}) {
    if (p == nullptr || p == after.data || p == after.scales || p == after.biases) continue;
    auto it = std::find(owned.begin(), owned.end(), p);
    if (it != owned.end()) {
      backend.free(*it);
      owned.erase(it);
    }
  }
}

size_t Weight::bytes_per_matrix() const {
  if (!quantized()) return static_cast<size_t>(rows * cols) * dtype_size(dtype);
  size_t packed = static_cast<size_t>(rows) * static_cast<size_t>(cols * bits / 32) * 4;
  size_t groups = static_cast<size_t>(rows) * static_cast<size_t>(cols / group);
  return packed + 2 * groups * dtype_size(scale_dtype);
}

}  // namespace tokenmill
