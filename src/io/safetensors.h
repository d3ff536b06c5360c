// safetensors files: a validated reader over a memory-mapped file, and a writer.
//
// Layout (huggingface/safetensors): 8-byte little-endian header length N, N bytes of UTF-8 JSON
// (an object: name -> {dtype, shape, data_offsets [begin, end)}, plus an optional
// "__metadata__" string map), then the data buffer. Offsets are relative to the buffer start
// (file offset 8 + N). The reader rejects anything the reference implementation rejects:
// N > 100,000,000 or past the end of the file, a header that is not a JSON object, unknown dtypes,
// negative or non-integer shapes, offsets outside the buffer, sizes that disagree with
// shape * dtype size, overlapping tensors, bytes that belong to no tensor (gaps, trailing bytes),
// and duplicate names. Every error names the file (and the tensor) and says what is wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensor/dtype.h"
#include "util/mmap.h"

namespace tokenmill {

// The largest header the reader accepts, as the reference implementation does.
inline constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  size_t begin = 0, end = 0;      // [begin, end) within the data buffer
  const uint8_t* data = nullptr;  // buffer start + begin (points into the parsed bytes)
  size_t nbytes() const { return end - begin; }
  int64_t numel() const;
};

// The parsed header of one file. Tensors are ordered by data offset.
struct SafetensorsHeader {
  std::vector<SafetensorsTensor> tensors;
  std::map<std::string, std::string> metadata;
  size_t data_start = 0;  // file offset of the data buffer (8 + N)
};

// Parses and validates bytes [data, data + size) of a whole safetensors file. `source_name`
// (normally the path) appears in every error message. Throws tokenmill::Error only.
SafetensorsHeader parse_safetensors(const uint8_t* data, size_t size,
                                    const std::string& source_name);

// One mapped and validated file. Tensor data pointers stay valid while the object lives (moving
// it keeps the mapping and the pointers).
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::string& path);  // throws tokenmill::Error

  const std::string& path() const { return file_.path(); }
  const std::vector<SafetensorsTensor>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const SafetensorsTensor* find(const std::string& name) const;  // nullptr when absent
  size_t file_size() const { return file_.size(); }
  const MappedFile& mapping() const { return file_; }

 private:
  MappedFile file_;
  SafetensorsHeader header_;
  std::unordered_map<std::string, size_t> index_;
};

// A tensor to write: `data` points at nbytes = prod(shape) * dtype_size(dtype) bytes (checked),
// or, with `data` null, `generate` writes them piece by piece as the file is written (so a
// tensor larger than memory can be written): generate(dst, offset, n) fills dst with bytes
// [offset, offset + n) of the tensor; offset and n are multiples of the element size.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
  std::function<void(uint8_t* dst, size_t offset, size_t n)> generate;
};

// Writes a safetensors file readable by the reference implementation: the header is padded with
// spaces to a multiple of 8 bytes, and tensors are laid out by decreasing dtype size (then name)
// so every tensor is aligned to its element size. Writes `path`.tmp and renames it over `path`.
// Throws tokenmill::Error naming the path or the tensor.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace tokenmill
