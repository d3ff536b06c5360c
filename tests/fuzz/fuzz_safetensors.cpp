// libFuzzer target: the safetensors header parser and validator on arbitrary bytes. Only
// tokenmill::Error may escape parse_safetensors; a crash, sanitizer report or any other
// exception is a bug. An accepted file must be tiled exactly by its tensors, all inside the input.
#include <cstddef>
#include <cstdint>
#include <optional>

#include "io/safetensors.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::optional<tokenmill::SafetensorsHeader> h;
  try {
    h = tokenmill::parse_safetensors(data, size, "fuzz.safetensors");
  } catch (const tokenmill::Error&) {
    return 0;  // rejected with a message: the expected outcome for most inputs
  }
  size_t next = h->data_start;
  for (const auto& t : h->tensors) {
    if (t.data != data + next ||
        t.nbytes() != static_cast<size_t>(t.numel()) * dtype_size(t.dtype)) {
      __builtin_trap();
    }
    next += t.nbytes();
  }
  if (next != size) __builtin_trap();
  return 0;
}
