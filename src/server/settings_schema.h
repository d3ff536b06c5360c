// Strict reading of JSON settings files: every value is read through a JsonReader that knows the
// file and key path, checks type and range, and remembers which keys were read so that finish()
// can reject unknown ones. Every error names file, key path and reason. Internal to server/
// (includes nlohmann/json): only settings*.cpp include it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace tokenmill::server {

// Parses JSON text strictly: syntax errors give line and column, and a key that appears twice in
// one object is an error (the usual parsers keep the last one silently, dropping the first).
nlohmann::json parse_json_strict(const std::string& text, const std::string& file);

// The closest of `candidates` to `word` by edit distance, or "" when none is close.
std::string closest_key(std::string_view word, const std::vector<std::string>& candidates);

class JsonReader {
 public:
  // `value` must outlive the reader. Fails unless it is an object.
  JsonReader(const nlohmann::json& value, std::string file, std::string path);

  const std::string& file() const { return file_; }
  const std::string& path() const { return path_; }
  // "path.key" (or "key" at the top level).
  std::string key_path(std::string_view key) const;
  [[noreturn]] void error(std::string_view key, std::string_view reason) const;

  bool has(std::string_view key) const { return value_->contains(std::string(key)); }
  // Each getter returns nullopt when the key is absent and fails on a wrong type or range.
  std::optional<int64_t> integer(std::string_view key, int64_t min, int64_t max);
  std::optional<double> number(std::string_view key, double min, double max);
  std::optional<bool> boolean(std::string_view key);
  std::optional<std::string> string(std::string_view key, bool allow_empty = false);
  std::optional<std::string> one_of(std::string_view key, const std::vector<std::string>& choices);
  std::optional<JsonReader> object(std::string_view key);
  // Marks the key as known and returns its raw value (nullptr when absent).
  const nlohmann::json* raw(std::string_view key);

  // Fails on the first key that no getter asked for, suggesting the closest known key.
  void finish() const;

 private:
  const nlohmann::json* value_;
  std::string file_, path_;
  std::set<std::string, std::less<>> known_;
};

}  // namespace tokenmill::server
