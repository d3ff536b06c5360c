// Read-only memory-mapped file. Weights are read straight from the page cache: the CPU backend
// never copies a checkpoint into its own buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tokenmill {

class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(
      const std::string& path);  // throws tokenmill::Error naming the path on failure
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void reset();
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace tokenmill
