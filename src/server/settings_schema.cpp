#include "server/settings_schema.h"

#include <algorithm>

#include "server/request_json.h"
#include "util/error.h"

namespace tokenmill::server {

namespace {

using json = nlohmann::json;

// One open container while parsing, for duplicate-key detection and error paths.
struct Frame {
  bool is_object = true;
  std::set<std::string> keys;
  std::string key;   // the current key (objects)
  size_t index = 0;  // the current element (arrays)
};

std::string frames_path(const std::vector<Frame>& frames, size_t count) {
  std::string p;
  for (size_t i = 0; i < count; ++i) {
    if (frames[i].is_object) {
      if (!p.empty()) p += '.';
      p += frames[i].key;
    } else {
      p += fmt::format("[{}]", frames[i].index);
    }
  }
  return p;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

json parse_json_strict(const std::string& text, const std::string& file) {
  std::vector<Frame> frames;
  auto callback = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        frames.push_back(Frame{true, {}, "", 0});
        break;
      case json::parse_event_t::array_start:
        frames.push_back(Frame{false, {}, "", 0});
        break;
      case json::parse_event_t::key: {
        Frame& top = frames.back();
        std::string key = parsed.get<std::string>();
        if (!top.keys.insert(key).second) {
          std::string where = frames_path(frames, frames.size() - 1);
          fail("{}: {}: duplicate key '{}' (JSON keeps only the last one; remove one of them)",
               file, where.empty() ? "(top level)" : where, key);
        }
        top.key = key;
        break;
      }
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        frames.pop_back();
        if (!frames.empty() && !frames.back().is_object) frames.back().index++;
        break;
      case json::parse_event_t::value:
        if (!frames.empty() && !frames.back().is_object) frames.back().index++;
        break;
    }
    return true;
  };
  try {
    return json::parse(text, callback);
  } catch (const json::exception& e) {
    // nlohmann's message reads "[json.exception.parse_error.101] parse error at line L, column
    // C: ..." (or out_of_range.406 for a number past a double's range); keep the part after the
    // bracketed id.
    std::string msg = e.what();
    auto close = msg.find("] ");
    if (close != std::string::npos) msg = msg.substr(close + 2);
    fail("{}: invalid JSON: {}", file, msg);
  }
}

std::string closest_key(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::max<size_t>(2, word.size() / 3) + 1;
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

JsonReader::JsonReader(const json& value, std::string file, std::string path)
    : value_(&value), file_(std::move(file)), path_(std::move(path)) {
  if (!value.is_object()) {
    fail("{}: {}: must be an object, got {}", file_, path_.empty() ? "(top level)" : path_,
         json_type_name(value));
  }
}

std::string JsonReader::key_path(std::string_view key) const {
  return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
}

void JsonReader::error(std::string_view key, std::string_view reason) const {
  fail("{}: {}: {}", file_, key_path(key), reason);
}

const json* JsonReader::raw(std::string_view key) {
  known_.emplace(key);
  auto it = value_->find(std::string(key));
  return it == value_->end() ? nullptr : &*it;
}

std::optional<int64_t> JsonReader::integer(std::string_view key, int64_t min, int64_t max) {
  const json* v = raw(key);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) {
    error(key, fmt::format("must be an integer between {} and {}, got {}", min, max,
                           json_type_name(*v)));
  }
  int64_t x = v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)
                  ? INT64_MAX
                  : v->get<int64_t>();
  if (x < min || x > max) {
    error(key, fmt::format("must be between {} and {}, got {}", min, max, x));
  }
  return x;
}

std::optional<double> JsonReader::number(std::string_view key, double min, double max) {
  const json* v = raw(key);
  if (!v) return std::nullopt;
  if (!v->is_number()) {
    error(key,
          fmt::format("must be a number between {} and {}, got {}", min, max, json_type_name(*v)));
  }
  double x = v->get<double>();
  if (!(x >= min && x <= max))
    error(key, fmt::format("must be between {} and {}, got {}", min, max, x));
  return x;
}

std::optional<bool> JsonReader::boolean(std::string_view key) {
  const json* v = raw(key);
  if (!v) return std::nullopt;
  if (!v->is_boolean())
    error(key, fmt::format("must be true or false, got {}", json_type_name(*v)));
  return v->get<bool>();
}

std::optional<std::string> JsonReader::string(std::string_view key, bool allow_empty) {
  const json* v = raw(key);
  if (!v) return std::nullopt;
  if (!v->is_string()) error(key, fmt::format("must be a string, got {}", json_type_name(*v)));
  std::string s = v->get<std::string>();
  if (s.empty() && !allow_empty) error(key, "must not be empty");
  return s;
}

std::optional<std::string> JsonReader::one_of(std::string_view key,
                                              const std::vector<std::string>& choices) {
  auto s = string(key, true);
  if (!s) return s;
  if (std::find(choices.begin(), choices.end(), *s) == choices.end()) {
    error(key, fmt::format("must be one of {}, got '{}'", fmt::join(choices, ", "), *s));
  }
  return s;
}

std::optional<JsonReader> JsonReader::object(std::string_view key) {
  const json* v = raw(key);
  if (!v) return std::nullopt;
  if (!v->is_object()) error(key, fmt::format("must be an object, got {}", json_type_name(*v)));
  return JsonReader(*v, file_, key_path(key));
}

void JsonReader::finish() const {
  for (auto it = value_->begin(); it != value_->end(); ++it) {
    if (known_.count(it.key())) continue;
    std::vector<std::string> known(known_.begin(), known_.end());
    std::string hint = closest_key(it.key(), known);
    fail("{}: {}: unknown key{} (known keys here: {})", file_, key_path(it.key()),
         hint.empty() ? "" : fmt::format("; did you mean '{}'?", hint), fmt::join(known, ", "));
  }
}

}  // namespace tokenmill::server
