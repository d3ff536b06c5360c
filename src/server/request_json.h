// Typed access to API request bodies: every getter names the field on failure (400 with the
// field path as `param`). Internal to server/.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace tokenmill::server {

// Parses a request body: malformed JSON, invalid UTF-8 and non-object bodies give 400.
nlohmann::ordered_json parse_body(const std::string& body);

// "an integer", "a string", ... for messages (any nlohmann JSON type: requests keep key order,
// settings files do not).
template <class Json>
const char* json_type_name(const Json& v) {
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_null()) return "null";
  if (v.is_array()) return "an array";
  return "an object";
}

// Getters over a JSON object `obj`; `path` prefixes field names in messages ("" = top level).
// A null value counts as absent, as the APIs treat it.
class Fields {
 public:
  Fields(const nlohmann::ordered_json& obj, std::string path) : obj_(obj), path_(std::move(path)) {}
  std::string name(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  const nlohmann::ordered_json* get(const std::string& key) const;
  std::optional<double> number(const std::string& key, double min, double max,
                               bool min_exclusive = false) const;
  std::optional<int64_t> integer(const std::string& key, int64_t min, int64_t max) const;
  std::optional<bool> boolean(const std::string& key) const;
  std::optional<std::string> string(const std::string& key) const;
  // A string or an array of strings (stop sequences); at most `max_items`.
  std::vector<std::string> strings(const std::string& key, size_t max_items) const;
  const nlohmann::ordered_json* object(const std::string& key) const;
  const nlohmann::ordered_json* array(const std::string& key) const;

 private:
  const nlohmann::ordered_json& obj_;
  std::string path_;
};

}  // namespace tokenmill::server
