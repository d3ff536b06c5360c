#include "io/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "util/error.h"

namespace tokenmill {

namespace {

using json = nlohmann::json;

uint64_t read_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Parses the header JSON, recording object keys that repeat within one object (nlohmann keeps
// the last silently; the reference rejects them).
json parse_header_json(const char* begin, const char* end, const std::string& src) {
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto cb = [&](int /*depth*/, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (ev == json::parse_event_t::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (ev == json::parse_event_t::key && !open_objects.empty() && duplicate.empty()) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!open_objects.back().insert(k).second) duplicate = k;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(begin, end, cb);
  } catch (const json::exception& e) {
    fail("{}: the safetensors header is not valid JSON ({}); the file is corrupt", src, e.what());
  }
  if (!duplicate.empty()) {
    fail("{}: the safetensors header names '{}' twice; the file is corrupt", src, duplicate);
  }
  return j;
}

void parse_shape(const json& v, const std::string& src, const std::string& name,
                 SafetensorsTensor* t) {
  if (!v.is_array()) fail("{}: tensor '{}': 'shape' is not an array", src, name);
  for (const auto& d : v) {
    if (!d.is_number_integer()) {
      fail("{}: tensor '{}': shape entry {} is not an integer", src, name, d.dump());
    }
    if (!d.is_number_unsigned()) {
      fail("{}: tensor '{}': shape entry {} is negative", src, name, d.dump());
    }
    uint64_t u = d.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) {
      fail("{}: tensor '{}': shape entry {} is too large", src, name, u);
    }
    t->shape.push_back(static_cast<int64_t>(u));
  }
}

void parse_offsets(const json& v, const std::string& src, const std::string& name,
                   size_t buffer_size, SafetensorsTensor* t) {
  if (!v.is_array() || v.size() != 2 || !v[0].is_number_unsigned() || !v[1].is_number_unsigned()) {
    fail("{}: tensor '{}': 'data_offsets' must be two non-negative integers [begin, end], got {}",
         src, name, v.dump());
  }
  uint64_t b = v[0].get<uint64_t>(), e = v[1].get<uint64_t>();
  if (b > e) fail("{}: tensor '{}': data_offsets [{}, {}] end before they begin", src, name, b, e);
  if (e > buffer_size) {
    fail(
        "{}: tensor '{}': data_offsets [{}, {}] reach past the data buffer ({} bytes); the file "
        "is truncated or corrupt",
        src, name, b, e, buffer_size);
  }
  t->begin = static_cast<size_t>(b);
  t->end = static_cast<size_t>(e);
}

SafetensorsTensor parse_tensor(const std::string& name, const json& v, const std::string& src,
                               size_t buffer_size) {
  if (!v.is_object()) fail("{}: tensor '{}': entry is not a JSON object", src, name);
  SafetensorsTensor t;
  t.name = name;
  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string()) fail("{}: tensor '{}': missing string 'dtype'", src, name);
  if (!parse_dtype(dt->get_ref<const std::string&>(), &t.dtype)) {
    fail(
        "{}: tensor '{}': unknown dtype '{}' (known: F64 F32 F16 BF16 F8_E4M3 F8_E5M2 F8_E8M0 "
        "I64 I32 I16 I8 U64 U32 U16 U8 BOOL)",
        src, name, dt->get_ref<const std::string&>());
  }
  auto sh = v.find("shape");
  if (sh == v.end()) fail("{}: tensor '{}': missing 'shape'", src, name);
  parse_shape(*sh, src, name, &t);
  auto off = v.find("data_offsets");
  if (off == v.end()) fail("{}: tensor '{}': missing 'data_offsets'", src, name);
  parse_offsets(*off, src, name, buffer_size, &t);

  // Expected size = prod(shape) * dtype size, without overflow.
  uint64_t n = dtype_size(t.dtype);
  for (int64_t d : t.shape) {
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) {
      fail("{}: tensor '{}': shape {} overflows", src, name, sh->dump());
    }
  }
  if (n != t.nbytes()) {
    fail("{}: tensor '{}': {} {} needs {} bytes but data_offsets [{}, {}] hold {}", src, name,
         dtype_name(t.dtype), sh->dump(), n, t.begin, t.end, t.nbytes());
  }
  return t;
}

void parse_metadata(const json& v, const std::string& src,
                    std::map<std::string, std::string>* out) {
  if (!v.is_object()) fail("{}: '__metadata__' is not a JSON object", src);
  for (const auto& [k, val] : v.items()) {
    if (!val.is_string()) {
      fail("{}: '__metadata__' entry '{}' is not a string (got {})", src, k, val.dump());
    }
    (*out)[k] = val.get<std::string>();
  }
}

}  // namespace

int64_t SafetensorsTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsHeader parse_safetensors(const uint8_t* data, size_t size, const std::string& src) {
  if (size < 8) {
    fail(
        "{}: {} bytes is too short for a safetensors file (needs an 8-byte header length); the "
        "file is truncated",
        src, size);
  }
  uint64_t n = read_le64(data);
  if (n > kSafetensorsMaxHeader) {
    fail(
        "{}: safetensors header length {} exceeds the limit of {} bytes; not a safetensors file "
        "or corrupt",
        src, n, kSafetensorsMaxHeader);
  }
  if (n > size - 8) {
    fail(
        "{}: safetensors header length {} reaches past the end of the file ({} bytes); the file "
        "is truncated",
        src, n, size);
  }
  const char* hb = reinterpret_cast<const char*>(data + 8);
  if (n == 0 || hb[0] != '{') {
    fail("{}: the safetensors header does not start with '{{'; not a safetensors file", src);
  }
  json j = parse_header_json(hb, hb + n, src);
  if (!j.is_object()) fail("{}: the safetensors header is not a JSON object", src);

  SafetensorsHeader h;
  h.data_start = 8 + static_cast<size_t>(n);
  const size_t buffer_size = size - h.data_start;
  for (const auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      parse_metadata(v, src, &h.metadata);
      continue;
    }
    h.tensors.push_back(parse_tensor(name, v, src, buffer_size));
  }

  // The tensors must tile the buffer exactly: sorted by offset, each starts where the previous
  // ended, and the last one ends at the end of the file.
  std::sort(h.tensors.begin(), h.tensors.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  size_t expected = 0;
  const SafetensorsTensor* prev = nullptr;
  for (auto& t : h.tensors) {
    if (t.begin < expected) {
      fail("{}: tensors '{}' [{}, {}) and '{}' [{}, {}) overlap; the file is corrupt", src,
           prev->name, prev->begin, prev->end, t.name, t.begin, t.end);
    }
    if (t.begin > expected) {
      fail(
          "{}: bytes [{}, {}) of the data buffer belong to no tensor (gap before '{}'); the file "
          "is corrupt",
          src, expected, t.begin, t.name);
    }
    expected = t.end;
    t.data = data + h.data_start + t.begin;
    prev = &t;
  }
  if (expected != buffer_size) {
    fail(
        "{}: the last {} bytes of the file belong to no tensor (data ends at {} of {}); the file "
        "is corrupt",
        src, buffer_size - expected, expected, buffer_size);
  }
  return h;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.file_ = MappedFile(path);
  f.header_ = parse_safetensors(f.file_.data(), f.file_.size(), path);
  for (size_t i = 0; i < f.header_.tensors.size(); ++i) f.index_[f.header_.tensors[i].name] = i;
  return f;
}

const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<const TensorToWrite*> order;
  std::set<std::string> names;
  for (const auto& t : tensors) {
    uint64_t n = dtype_size(t.dtype);
    for (int64_t d : t.shape) {
      if (d < 0) fail("{}: cannot write tensor '{}': negative dimension {}", path, t.name, d);
      n *= static_cast<uint64_t>(d);
    }
    if (n != t.nbytes) {
      fail("{}: cannot write tensor '{}': {} with {} elements needs {} bytes, got {}", path, t.name,
           dtype_name(t.dtype), n / dtype_size(t.dtype), n, t.nbytes);
    }
    if (t.data == nullptr && t.nbytes > 0 && !t.generate) {
      fail("{}: cannot write tensor '{}': it has neither data nor a generator", path, t.name);
    }
    if (t.name == "__metadata__" || !names.insert(t.name).second) {
      fail("{}: cannot write tensor '{}': the name is reserved or used twice", path, t.name);
    }
    order.push_back(&t);
  }
  std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    size_t sa = dtype_size(a->dtype), sb = dtype_size(b->dtype);
    return sa != sb ? sa > sb : a->name < b->name;
  });

  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  size_t off = 0;
  for (const auto* t : order) {
    h[t->name] = {{"dtype", dtype_name(t->dtype)},
                  {"shape", t->shape},
                  {"data_offsets", {off, off + t->nbytes}}};
    off += t->nbytes;
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');

  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) fail("{}: cannot create: {}", tmp, std::strerror(errno));
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(header.size() >> (8 * i));
  bool ok = std::fwrite(len, 1, 8, f) == 8 &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size();
  std::vector<uint8_t> piece;  // generated tensors go through it, kPiece bytes at a time
  constexpr size_t kPiece = size_t{64} << 20;
  for (size_t i = 0; ok && i < order.size(); ++i) {
    const TensorToWrite& t = *order[i];
    if (t.nbytes == 0) continue;
    if (t.data != nullptr) {
      ok = std::fwrite(t.data, 1, t.nbytes, f) == t.nbytes;
      continue;
    }
    piece.resize(std::min(kPiece, t.nbytes));
    for (size_t at = 0; ok && at < t.nbytes; at += kPiece) {
      const size_t n = std::min(kPiece, t.nbytes - at);
      t.generate(piece.data(), at, n);
      ok = std::fwrite(piece.data(), 1, n, f) == n;
    }
  }
  int err = errno;
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    std::remove(tmp.c_str());
    fail("{}: write failed: {} (is the disk full?)", tmp, std::strerror(err));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    std::remove(tmp.c_str());
    fail("{}: cannot rename {} over it: {}", path, tmp, std::strerror(err));
  }
}

}  // namespace tokenmill
