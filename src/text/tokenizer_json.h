// Checked accessors for tokenizer.json fields: each throws tokenmill::Error naming the file and
// the key path ("where") instead of letting nlohmann's type errors escape.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "text/unicode_regex.h"
#include "util/error.h"

namespace tokenmill::text {

inline const nlohmann::json& json_field(const nlohmann::json& j, const char* key,
                                        const std::string& where) {
  if (!j.is_object()) fail("{}: expected a JSON object", where);
  auto it = j.find(key);
  if (it == j.end()) fail("{}: missing field \"{}\"", where, key);
  return *it;
}

inline std::string json_string(const nlohmann::json& j, const char* key, const std::string& where) {
  const auto& v = json_field(j, key, where);
  if (!v.is_string()) fail("{}.{}: expected a string", where, key);
  return v.get<std::string>();
}

inline bool json_bool(const nlohmann::json& j, const char* key, bool dflt,
                      const std::string& where) {
  if (!j.is_object()) fail("{}: expected a JSON object", where);
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) fail("{}.{}: expected true or false", where, key);
  return it->get<bool>();
}

inline const nlohmann::json& json_array(const nlohmann::json& j, const char* key,
                                        const std::string& where) {
  const auto& v = json_field(j, key, where);
  if (!v.is_array()) fail("{}.{}: expected an array", where, key);
  return v;
}

// {"pattern": {"String": "..."}} or {"pattern": {"Regex": "..."}}.
inline Regex json_pattern(const nlohmann::json& j, const std::string& where) {
  const auto& p = json_field(j, "pattern", where);
  const std::string w = where + ".pattern";
  if (p.is_object() && p.contains("String")) return Regex(json_string(p, "String", w), true, w);
  if (p.is_object() && p.contains("Regex")) return Regex(json_string(p, "Regex", w), false, w);
  fail("{}: expected {{\"String\": ...}} or {{\"Regex\": ...}}", w);
}

}  // namespace tokenmill::text
