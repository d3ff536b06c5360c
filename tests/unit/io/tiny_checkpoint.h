// Test helpers: temporary directories and tiny Qwen3.5-shaped checkpoints written with
// write_safetensors, in any of the three name layouts, dense or MoE, float or MLX-quantized.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "tensor/dtype.h"
#include "util/error.h"

namespace tokenmill::testing {

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

enum class Experts { kFusedHf, kPerExpert, kSwitchMlp };

struct TinySpec {
  Checkpoint::Layout layout = Checkpoint::Layout::kHfVL;
  bool moe = false;
  Experts experts = Experts::kFusedHf;
  bool quantized = false;  // MLX affine, 4 bits, group 32, router/shared gate at 8 bits
  bool tied = false;
  bool mtp = true;
  bool vision = true;
  int shards = 1;  // > 1 writes model-0000k-of-0000n.safetensors and an index.json
  bool nested_config = true;
};

// Sizes of the tiny model (fixed): 4 layers LLLF, hidden 64, vocab 96.
struct TinySizes {
  static constexpr int64_t kVocab = 96, kHidden = 64, kInter = 128, kLayers = 4;
  static constexpr int64_t kHeads = 2, kKvHeads = 1, kHeadDim = 32;
  static constexpr int64_t kHk = 1, kHv = 2, kDk = 16, kDv = 16, kConv = 4;
  static constexpr int64_t kExperts = 4, kTopK = 2, kMoeInter = 32, kSharedInter = 64;
};

// The config.json document for `spec`.
nlohmann::json tiny_config(const TinySpec& spec);

// One tensor of the tiny model: canonical name, dtype, shape (already quantized when it is).
struct TinyTensor {
  std::string canonical;
  DType dtype;
  std::vector<int64_t> shape;
};
std::vector<TinyTensor> tiny_tensors(const TinySpec& spec);

// The file name of a canonical tensor in `layout`.
std::string tiny_file_name(Checkpoint::Layout layout, const std::string& canonical);

// Writes config.json and the safetensors shard(s) into `dir` (random bytes as data).
void write_tiny_checkpoint(const std::string& dir, const TinySpec& spec);

// Writes raw bytes to a file.
void write_bytes(const std::string& path, const std::string& bytes);
std::string read_bytes(const std::string& path);

// Runs fn, expects tokenmill::Error whose message contains every one of `parts`.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts);

}  // namespace tokenmill::testing
