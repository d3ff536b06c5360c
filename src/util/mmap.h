// Read-only memory-mapped file: checkpoints are read through one, and each backend copies the
// weights into its own memory (Backend::upload_weight).
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

  // Drops this process's resident pages that lie wholly inside [p, p + n) (a range of this
  // mapping); touched again, they are read from the file. A loader calls it once it has copied a
  // tensor elsewhere, so the weights are not held twice.
  void release(const void* p, size_t n) const;
  bool contains(const void* p) const {
    const auto* b = static_cast<const uint8_t*>(p);
    return data_ != nullptr && b >= data_ && b < data_ + size_;
  }

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
