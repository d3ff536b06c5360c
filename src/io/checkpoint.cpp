#include "io/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "util/error.h"
#include "util/file_text.h"
#include "util/log.h"

namespace tokenmill {

namespace fs = std::filesystem;

namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";

bool starts_with(const std::string& s, std::string_view p) {
  return s.rfind(p, 0) == 0;
}

bool is_vision(const std::string& n) {
  return starts_with(n, "model.visual.") || starts_with(n, "visual.") ||
         starts_with(n, "vision_tower") || starts_with(n, "model.vision_tower");
}

const char* layout_prefix(Checkpoint::Layout l) {
  switch (l) {
    case Checkpoint::Layout::kHfVL:
      return "model.language_model.";
    case Checkpoint::Layout::kCausalLM:
      return "model.";
    case Checkpoint::Layout::kMlx:
      return "language_model.model.";
  }
  return "";
}

// The layout a (non-vision) name belongs to, if its prefix says so.
std::optional<Checkpoint::Layout> layout_of(const std::string& n) {
  if (starts_with(n, "language_model.model.")) return Checkpoint::Layout::kMlx;
  if (starts_with(n, "model.language_model.")) return Checkpoint::Layout::kHfVL;
  if (starts_with(n, "model.")) return Checkpoint::Layout::kCausalLM;
  return std::nullopt;
}

// The shards to open: the index's weight_map values, else every *.safetensors file (sorted).
// `expected` receives the index's name -> shard map, to check against the files.
std::vector<std::string> shard_names(const std::string& dir,
                                     std::vector<std::pair<std::string, std::string>>* expected) {
  std::vector<std::string> names;
  const fs::path index = fs::path(dir) / kIndexName;
  if (fs::exists(index)) {
    const std::string text = read_text_file(index.string());
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      fail("{}: not valid JSON ({})", index.string(), e.what());
    }
    auto wm = j.is_object() ? j.find("weight_map") : j.end();
    if (!j.is_object() || wm == j.end() || !wm->is_object()) {
      fail("{}: missing the 'weight_map' object (tensor name -> shard file)", index.string());
    }
    std::set<std::string> seen;
    for (const auto& [tensor, shard] : wm->items()) {
      if (!shard.is_string()) {
        fail("{}: weight_map['{}'] is not a file name", index.string(), tensor);
      }
      const std::string& s = shard.get_ref<const std::string&>();
      if (s.empty() || s.find('/') != std::string::npos || s == "..") {
        fail("{}: weight_map['{}'] = '{}' is not a file name in the model directory",
             index.string(), tensor, s);
      }
      expected->emplace_back(tensor, s);
      if (seen.insert(s).second) names.push_back(s);
    }
    std::sort(names.begin(), names.end());
    if (names.empty()) fail("{}: weight_map is empty", index.string());
    return names;
  }
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".safetensors" && !e.is_directory()) {
      names.push_back(e.path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  if (names.empty()) {
    fail("{}: no *.safetensors files (and no {}); is this a model directory?", dir, kIndexName);
  }
  return names;
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const char* layout_name(Checkpoint::Layout l) {
  switch (l) {
    case Checkpoint::Layout::kHfVL:
      return "hf-vl";
    case Checkpoint::Layout::kCausalLM:
      return "causal-lm";
    case Checkpoint::Layout::kMlx:
      return "mlx";
  }
  return "?";
}

Checkpoint Checkpoint::open(const std::string& dir_in) {
  Checkpoint c;
  c.dir_ = dir_in;
  while (c.dir_.size() > 1 && c.dir_.back() == '/') c.dir_.pop_back();
  const std::string& dir = c.dir_;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail("{}: not a directory (expected a model directory)", dir);
  const fs::path config = fs::path(dir) / "config.json";
  if (!fs::exists(config, ec)) {
    fail("{}: no config.json; a model directory holds config.json and *.safetensors files", dir);
  }
  c.config_ = load_model_config(config.string());

  std::vector<std::pair<std::string, std::string>> expected;
  for (const std::string& name : shard_names(dir, &expected)) {
    std::string path = (fs::path(dir) / name).string();
    if (!fs::exists(path, ec)) {
      fail("{}: listed in {} but missing; the download is incomplete", path, kIndexName);
    }
    c.files_.push_back(SafetensorsFile::open(path));
    c.shard_paths_.push_back(path);
  }
  for (const auto& [tensor, shard] : expected) {
    const SafetensorsFile* f = nullptr;
    for (const auto& file : c.files_) {
      if (fs::path(file.path()).filename() == shard) f = &file;
    }
    if (f == nullptr || f->find(tensor) == nullptr) {
      fail(
          "{}: {} places tensor '{}' in {} but that file does not hold it; the download is "
          "incomplete or the index is stale",
          dir, kIndexName, tensor, shard);
    }
  }

  // Layout: every non-vision name with a layout prefix must agree.
  std::optional<Layout> layout;
  std::string first_name;
  for (const auto& f : c.files_) {
    for (const auto& t : f.tensors()) {
      if (is_vision(t.name)) continue;
      std::optional<Layout> l = layout_of(t.name);
      if (!l) continue;
      if (!layout) {
        layout = l;
        first_name = t.name;
      } else if (*l != *layout) {
        fail("{}: tensor names mix layouts: '{}' ({}) and '{}' ({}); one checkpoint must use one",
             dir, first_name, layout_name(*layout), t.name, layout_name(*l));
      }
    }
    if (auto it = f.metadata().find("format"); it != f.metadata().end() && it->second == "mlx") {
      c.norms_plus_one_ = true;
    }
  }
  if (!layout) {
    fail(
        "{}: no text-model tensors found (expected names starting with "
        "'model.language_model.', 'model.' or 'language_model.model.')",
        dir);
  }
  c.layout_ = *layout;
  if (c.layout_ == Layout::kMlx) c.norms_plus_one_ = true;

  for (const auto& f : c.files_) c.add_tensors(f);
  c.used_.assign(c.tensors_.size(), 0);
  if (c.vision_count_ > 0) {
    log::info("{}: skipping {} vision tensors (text-only inference)", dir, c.vision_count_);
  }
  return c;
}

void Checkpoint::add_tensors(const SafetensorsFile& f) {
  for (const auto& t : f.tensors()) {
    if (is_vision(t.name)) {
      ++vision_count_;
      continue;
    }
    TensorInfo info;
    info.name = t.name;
    info.file = f.path();
    info.dtype = t.dtype;
    info.shape = t.shape;
    info.data = t.data;
    info.nbytes = t.nbytes();
    add_tensor(std::move(info));
  }
}

void Checkpoint::add_tensor(TensorInfo info) {
  const std::string prefix = layout_prefix(layout_);
  const std::string& name = info.name;
  if (starts_with(name, prefix)) {
    info.canonical = name.substr(prefix.size());
  } else if (starts_with(name, "language_model.lm_head.")) {
    info.canonical = name.substr(std::string_view("language_model.").size());
  } else if (layout_ == Layout::kMlx && starts_with(name, "language_model.mtp.")) {
    info.canonical = name.substr(std::string_view("language_model.").size());
  } else {
    info.canonical = name;  // lm_head.*, mtp.* and unrecognised names
  }
  info.mtp = starts_with(info.canonical, "mtp.");
  auto [it, inserted] = by_canonical_.emplace(info.canonical, tensors_.size());
  if (!inserted) {
    const TensorInfo& other = tensors_[it->second];
    if (other.name == name) {
      fail("{}: tensor '{}' appears in both {} and {}; one checkpoint holds each tensor once", dir_,
           name, other.file, info.file);
    }
    fail("{}: tensors '{}' ({}) and '{}' ({}) are the same tensor under two names", dir_,
         other.name, other.file, name, info.file);
  }
  if (info.mtp) {
    ++mtp_count_;
    mtp_bytes_ += static_cast<int64_t>(info.nbytes);
  } else {
    text_bytes_ += static_cast<int64_t>(info.nbytes);
  }
  tensors_.push_back(std::move(info));
}

Checkpoint Checkpoint::in_memory(const std::string& label, ModelConfig config, Layout layout,
                                 bool norms_stored_plus_one, std::vector<TensorInfo> tensors,
                                 std::vector<std::vector<uint8_t>> owned) {
  Checkpoint c;
  c.dir_ = label;
  c.config_ = std::move(config);
  c.layout_ = layout;
  c.norms_plus_one_ = norms_stored_plus_one || layout == Layout::kMlx;
  c.owned_ = std::move(owned);
  for (TensorInfo& t : tensors) {
    if (t.file.empty()) t.file = label;
    c.add_tensor(std::move(t));
  }
  c.used_.assign(c.tensors_.size(), 0);
  return c;
}

void Checkpoint::release(const TensorInfo& t) const {
  for (const SafetensorsFile& f : files_) {
    if (f.mapping().contains(t.data)) return f.mapping().release(t.data, t.nbytes);
  }
}

const TensorInfo* Checkpoint::find(const std::string& canonical) const {
  auto it = by_canonical_.find(canonical);
  return it == by_canonical_.end() ? nullptr : &tensors_[it->second];
}

std::string Checkpoint::file_name_for(const std::string& canonical) const {
  if (const TensorInfo* t = find(canonical)) return t->name;
  if (starts_with(canonical, "mtp.")) return canonical;
  if (starts_with(canonical, "lm_head.")) {
    return layout_ == Layout::kMlx ? "language_model." + canonical : canonical;
  }
  return layout_prefix(layout_) + canonical;
}

const TensorInfo& Checkpoint::get(const std::string& canonical) const {
  const TensorInfo* t = find(canonical);
  if (t == nullptr) {
    fail(
        "{}: tensor '{}' not found (layout {}, looked for canonical name '{}'); the checkpoint "
        "does not match its config.json or is incomplete",
        dir_, file_name_for(canonical), layout_name(layout_), canonical);
  }
  return *t;
}

std::string Checkpoint::module_path_in_file(const std::string& canonical_module) const {
  std::string w = file_name_for(canonical_module + ".weight");
  return w.substr(0, w.size() - std::string_view(".weight").size());
}

void Checkpoint::mark_used(const std::string& canonical) {
  auto it = by_canonical_.find(canonical);
  if (it != by_canonical_.end()) used_[it->second] = 1;
}

std::vector<std::string> Checkpoint::unused_tensors() const {
  std::vector<std::string> out;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (!used_[i] && !tensors_[i].mtp) out.push_back(tensors_[i].name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace tokenmill
