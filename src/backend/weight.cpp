#include "backend/backend.h"

namespace tokenmill {

size_t Weight::bytes_per_matrix() const {
  if (!quantized()) return static_cast<size_t>(rows * cols) * dtype_size(dtype);
  size_t packed = static_cast<size_t>(rows) * static_cast<size_t>(cols * bits / 32) * 4;
  size_t groups = static_cast<size_t>(rows) * static_cast<size_t>(cols / group);
  return packed + 2 * groups * dtype_size(scale_dtype);
}

}  // namespace tokenmill
