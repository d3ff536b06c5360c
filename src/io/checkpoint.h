// Checkpoint: a model directory (config.json + safetensors shards), mapped and indexed by
// canonical tensor name.
//
// Shards: the files named by model.safetensors.index.json's weight_map when it exists, else every
// *.safetensors file in the directory. All are memory-mapped and validated (io/safetensors.h).
//
// Name layouts (detected from the names; a mix is an error):
//   kHfVL      model.language_model.<x>     (Hugging Face Qwen3_5ForConditionalGeneration)
//   kCausalLM  model.<x>                    (Qwen3_5ForCausalLM / Qwen3-Next / mlx-lm text)
//   kMlx       language_model.model.<x>     (mlx-vlm conversions)
// Canonical names drop that prefix: "embed_tokens.weight", "layers.3.mlp.up_proj.weight". The
// head is "lm_head.<x>" (file: lm_head.<x> or language_model.lm_head.<x>), MTP tensors keep their
// unprefixed "mtp.<x>" names. Vision tensors (model.visual.*, visual.*, vision_tower*) are
// counted and skipped. Names that match no rule keep their file name as canonical name.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "io/model_config.h"
#include "io/safetensors.h"
#include "tensor/dtype.h"

namespace tokenmill {

struct TensorInfo {
  std::string name;  // as in the file
  std::string file;  // path of the shard holding it
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  // Into the mapped shard (or in-memory bytes); valid while the Checkpoint lives. nullptr only
  // for a Checkpoint::in_memory tensor to be filled with random values.
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  std::string canonical;  // name without the layout prefix
  bool mtp = false;       // part of the MTP module ("mtp.*")
  int64_t numel() const;
};

class Checkpoint {
 public:
  enum class Layout { kHfVL, kCausalLM, kMlx };

  // Throws tokenmill::Error: no config.json, unsupported config, no safetensors files, a corrupt
  // or truncated shard, an index naming a missing file or tensor, duplicate or mixed names.
  static Checkpoint open(const std::string& dir);

  // A checkpoint built in memory (dummy weights for the benchmark): `tensors` are named as in
  // `layout`'s files; their data point into `owned` (kept alive here) or are nullptr for
  // tensors the loader fills with random values on the device (see WeightStore).
  static Checkpoint in_memory(const std::string& label, ModelConfig config, Layout layout,
                              bool norms_stored_plus_one, std::vector<TensorInfo> tensors,
                              std::vector<std::vector<uint8_t>> owned);

  Checkpoint(Checkpoint&&) = default;
  Checkpoint& operator=(Checkpoint&&) = default;
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  const ModelConfig& config() const { return config_; }
  const std::string& dir() const { return dir_; }
  Layout layout() const { return layout_; }
  // MLX checkpoints store 1+w for the zero-centred RMSNorm weights (layer norms, final norm,
  // q_norm/k_norm, MTP norms); HF checkpoints store w. True for the kMlx layout or when a shard's
  // __metadata__ says format "mlx".
  bool norms_stored_plus_one() const { return norms_plus_one_; }

  const TensorInfo* find(const std::string& canonical) const;  // nullptr when absent
  // Throws "<dir>: tensor '<file name>' not found (layout ..., looked for ...)".
  const TensorInfo& get(const std::string& canonical) const;
  // The module path as the file spells it ("layers.0.mlp.gate" -> for kMlx
  // "language_model.model.layers.0.mlp.gate"): the key for ModelConfig::quant_for().
  std::string module_path_in_file(const std::string& canonical_module) const;
  // The name a canonical tensor has (or would have) in this layout's files.
  std::string file_name_for(const std::string& canonical) const;

  // Binding bookkeeping: tensors never marked are reported by unused_tensors() (names as in the
  // file, sorted; MTP and vision tensors excluded). Marking an absent name does nothing.
  void mark_used(const std::string& canonical);
  std::vector<std::string> unused_tensors() const;

  // Drops the resident pages of t's bytes from the files' mappings (util/mmap.h: read again from
  // the file if touched): for a loader that has copied t into a backend's memory. Nothing for
  // in-memory tensors.
  void release(const TensorInfo& t) const;

  // Every text-model and MTP tensor (vision tensors excluded), in file then offset order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::vector<std::string>& shard_paths() const { return shard_paths_; }
  size_t mtp_tensor_count() const { return mtp_count_; }
  size_t vision_tensor_count() const { return vision_count_; }
  int64_t total_bytes() const { return text_bytes_; }  // text-model tensors, MTP excluded
  int64_t mtp_bytes() const { return mtp_bytes_; }

 private:
  Checkpoint() = default;
  void add_tensors(const SafetensorsFile& f);
  void add_tensor(TensorInfo info);  // derives canonical name and MTP flag, indexes it

  std::string dir_;
  ModelConfig config_;
  Layout layout_ = Layout::kHfVL;
  bool norms_plus_one_ = false;
  std::vector<SafetensorsFile> files_;
  std::vector<std::string> shard_paths_;
  std::vector<TensorInfo> tensors_;
  std::vector<std::vector<uint8_t>> owned_;  // bytes of in-memory tensors
  std::vector<uint8_t> used_;                // parallel to tensors_
  std::unordered_map<std::string, size_t> by_canonical_;
  size_t mtp_count_ = 0, vision_count_ = 0;
  int64_t text_bytes_ = 0, mtp_bytes_ = 0;
};

const char* layout_name(Checkpoint::Layout l);  // "hf-vl", "causal-lm", "mlx"

}  // namespace tokenmill
