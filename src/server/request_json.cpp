#include "server/request_json.h"

#include <cmath>

#include "server/api_error.h"

namespace tokenmill::server {

using json = nlohmann::ordered_json;

json parse_body(const std::string& body) {
  if (body.empty()) bad_request("", "the request body is empty: send a JSON object");
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    // parse_error, and out_of_range for a number past a double's range ("1e999").
    std::string msg = e.what();
    auto close = msg.find("] ");
    if (close != std::string::npos) msg = msg.substr(close + 2);
    // "; last read: '...'" may quote the invalid bytes themselves: drop it.
    if (auto lr = msg.find("; last read"); lr != std::string::npos) msg = msg.substr(0, lr);
    if (msg.find("UTF-8") != std::string::npos || msg.find("utf-8") != std::string::npos) {
      bad_request("", "the request body is not valid UTF-8 ({})", msg);
    }
    bad_request("", "the request body is not valid JSON: {}", msg);
  }
  if (!j.is_object())
    bad_request("", "the request body must be a JSON object, got {}", json_type_name(j));
  return j;
}

const json* Fields::get(const std::string& key) const {
  auto it = obj_.find(key);
  if (it == obj_.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<double> Fields::number(const std::string& key, double min, double max,
                                     bool min_exclusive) const {
  const json* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad_request(name(key), "must be a number, got {}", json_type_name(*v));
  double x = v->get<double>();
  if (!std::isfinite(x) || x < min || x > max || (min_exclusive && x == min)) {
    bad_request(name(key), "must be {} {} and at most {}, got {}",
                min_exclusive ? "above" : "at least", min, max, x);
  }
  return x;
}

std::optional<int64_t> Fields::integer(const std::string& key, int64_t min, int64_t max) const {
  const json* v = get(key);
  if (!v) return std::nullopt;
  int64_t x = 0;
  if (v->is_number_unsigned()) {
    uint64_t u = v->get<uint64_t>();
    x = u > uint64_t(INT64_MAX) ? INT64_MAX : int64_t(u);
  } else if (v->is_number_integer()) {
    x = v->get<int64_t>();
  } else if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() &&
             std::fabs(v->get<double>()) < 9e15) {
    x = int64_t(v->get<double>());  // 5.0 is accepted as 5, as JavaScript clients send it
  } else {
    bad_request(name(key), "must be an integer, got {}", json_type_name(*v));
  }
  if (x < min || x > max) bad_request(name(key), "must be between {} and {}, got {}", min, max, x);
  return x;
}

std::optional<bool> Fields::boolean(const std::string& key) const {
  const json* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad_request(name(key), "must be true or false, got {}", json_type_name(*v));
  return v->get<bool>();
}

std::optional<std::string> Fields::string(const std::string& key) const {
  const json* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_string()) bad_request(name(key), "must be a string, got {}", json_type_name(*v));
  return v->get<std::string>();
}

std::vector<std::string> Fields::strings(const std::string& key, size_t max_items) const {
  const json* v = get(key);
  std::vector<std::string> out;
  if (!v) return out;
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    for (size_t i = 0; i < v->size(); ++i) {
      if (!(*v)[i].is_string()) {
        bad_request(fmt::format("{}[{}]", name(key), i), "must be a string, got {}",
                    json_type_name((*v)[i]));
      }
      out.push_back((*v)[i].get<std::string>());
    }
  } else {
    bad_request(name(key), "must be a string or an array of strings, got {}", json_type_name(*v));
  }
  if (out.size() > max_items) {
    bad_request(name(key), "has {} entries; at most {} are allowed", out.size(), max_items);
  }
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].empty()) bad_request(fmt::format("{}[{}]", name(key), i), "must not be empty");
  }
  return out;
}

const json* Fields::object(const std::string& key) const {
  const json* v = get(key);
  if (v && !v->is_object()) bad_request(name(key), "must be an object, got {}", json_type_name(*v));
  return v;
}

const json* Fields::array(const std::string& key) const {
  const json* v = get(key);
  if (v && !v->is_array()) bad_request(name(key), "must be an array, got {}", json_type_name(*v));
  return v;
}

}  // namespace tokenmill::server
