#include "text/tool_call_parser.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <utility>

#include "text/detokenizer.h"

namespace tokenmill {
namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view kClose = "</tool_call>";
constexpr std::string_view kFunction = "<function=";
constexpr std::string_view kFunctionEnd = "</function>";
constexpr std::string_view kParameter = "<parameter=";
constexpr std::string_view kParameterEnd = "</parameter>";
// Longest function or parameter name accepted; a longer "<function=..." without '>' is not markup.
constexpr size_t kMaxName = 256;

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

size_t skip_ws(std::string_view s, size_t i) {
  while (i < s.size() && is_ws(s[i])) ++i;
  return i;
}

std::string_view trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && is_ws(s[b])) ++b;
  while (e > b && is_ws(s[e - 1])) --e;
  return s.substr(b, e - b);
}

// True when `rest` is shorter than `tag` and could still grow into it.
bool could_become(std::string_view rest, std::string_view tag) {
  return rest.size() < tag.size() && tag.starts_with(rest);
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Canonical JSON Schema type for a schema "type" word, including the loose spellings tool
// definitions use in practice ("int", "float", "bool", "dict", "list", "str").
std::string canonical_type(std::string_view word) {
  const std::string t = lower(word);
  auto starts = [&](std::string_view p) { return std::string_view(t).starts_with(p); };
  if (starts("int") || starts("uint") || starts("long") || starts("short") || starts("unsigned")) {
    return "integer";
  }
  if (starts("num") || starts("float") || starts("double") || starts("decimal")) return "number";
  if (starts("bool")) return "boolean";
  if (t == "object" || t == "dict" || t == "map") return "object";
  if (t == "array" || t == "list" || t == "tuple") return "array";
  if (t == "null" || t == "none") return "null";
  return "string";
}

std::string type_of_value(const nlohmann::json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_object()) return "object";
  if (v.is_array()) return "array";
  return "string";
}

void collect_types(const nlohmann::json& schema, std::vector<std::string>& out, int depth = 0) {
  if (!schema.is_object() || depth > 8) return;
  if (auto it = schema.find("type"); it != schema.end()) {
    if (it->is_string()) out.push_back(canonical_type(it->get<std::string>()));
    if (it->is_array()) {
      for (const auto& t : *it) {
        if (t.is_string()) out.push_back(canonical_type(t.get<std::string>()));
      }
    }
  }
  for (const char* key : {"anyOf", "oneOf", "allOf"}) {
    if (auto it = schema.find(key); it != schema.end() && it->is_array()) {
      for (const auto& sub : *it) collect_types(sub, out, depth + 1);
    }
  }
  if (!out.empty()) return;
  if (auto it = schema.find("enum"); it != schema.end() && it->is_array()) {
    for (const auto& v : *it) out.push_back(type_of_value(v));
  } else if (auto c = schema.find("const"); c != schema.end()) {
    out.push_back(type_of_value(*c));
  } else if (schema.contains("properties")) {
    out.push_back("object");
  } else if (schema.contains("items")) {
    out.push_back("array");
  }
}

ojson parse_json(std::string_view text) {
  return ojson::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
}

}  // namespace

ToolSchemas::ToolSchemas(const nlohmann::json& tools) {
  if (!tools.is_array()) return;
  for (const auto& tool : tools) {
    if (!tool.is_object()) continue;
    const nlohmann::json* f = &tool;
    if (auto it = tool.find("function"); it != tool.end() && it->is_object()) f = &*it;
    auto name = f->find("name");
    if (name == f->end() || !name->is_string()) continue;
    const nlohmann::json* params = nullptr;
    for (const char* key : {"parameters", "input_schema"}) {
      if (auto it = f->find(key); it != f->end() && it->is_object()) {
        params = &*it;
        break;
      }
    }
    if (params == nullptr) continue;
    auto props = params->find("properties");
    if (props == params->end() || !props->is_object()) continue;
    properties_[name->get<std::string>()] = *props;
  }
}

const nlohmann::json* ToolSchemas::parameter(std::string_view tool, std::string_view param) const {
  auto it = properties_.find(tool);
  if (it == properties_.end()) return nullptr;
  auto p = it->second.find(std::string(param));
  return p == it->second.end() ? nullptr : &*p;
}

ojson type_parameter_value(std::string_view text, const nlohmann::json* schema) {
  std::vector<std::string> types;
  if (schema != nullptr) collect_types(*schema, types);
  auto has = [&](std::string_view t) {
    return std::find(types.begin(), types.end(), t) != types.end();
  };
  const std::string_view t = trim(text);
  if (has("null") && t == "null") return nullptr;
  if (has("integer")) {
    ojson v = parse_json(t);
    if (v.is_number_integer()) return v;
  }
  if (has("number")) {
    ojson v = parse_json(t);
    if (v.is_number()) return v;
  }
  if (has("boolean")) {
    const std::string l = lower(t);
    if (l == "true" || l == "false") return l == "true";
  }
  if (has("object") || has("array")) {
    ojson v = parse_json(t);
    if ((v.is_object() && has("object")) || (v.is_array() && has("array"))) return v;
  }
  return std::string(text);
}

std::string dump_json(const ojson& value) {
  return value.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

ToolCallParser::ToolCallParser(ToolCallFormat format, const ToolSchemas& schemas,
                               const std::string& id_prefix, int first_index)
    : format_(format), schemas_(schemas), id_prefix_(id_prefix), next_index_(first_index) {}

ToolCallParser::Status ToolCallParser::advance(std::string_view body,
                                               std::vector<OutputEvent>& out) {
  while (status_ == Status::kNeedMore) {
    bool progressed = false;
    switch (state_) {
      case State::kStart:
        progressed = step_start(body);
        break;
      case State::kJson:
        progressed = step_json(body, out);
        break;
      case State::kXmlFunction:
        progressed = step_xml_function(body, out);
        break;
      case State::kXmlBody:
        progressed = step_xml_body(body, out);
        break;
      case State::kXmlValue:
        progressed = step_xml_value(body, out);
        break;
      case State::kXmlAfter:
        progressed = step_xml_after(body);
        break;
      case State::kSkip:
        progressed = step_skip(body);
        break;
    }
    if (!progressed) break;
  }
  return status_;
}

bool ToolCallParser::step_start(std::string_view body) {
  pos_ = skip_ws(body, pos_);
  if (pos_ == body.size()) return false;
  const std::string_view rest = body.substr(pos_);
  ToolCallFormat f = format_;
  if (f == ToolCallFormat::kAuto) {
    if (rest.starts_with(kFunction)) {
      f = ToolCallFormat::kXml;
    } else if (could_become(rest, kFunction)) {
      return false;
    } else {
      f = ToolCallFormat::kJson;
    }
  }
  state_ = f == ToolCallFormat::kXml ? State::kXmlFunction : State::kJson;
  scan_ = pos_;
  return true;
}

bool ToolCallParser::step_json(std::string_view body, std::vector<OutputEvent>& out) {
  const size_t close = body.find(kClose, scan_);
  if (close == std::string_view::npos) {
    scan_ = std::max(pos_, body.size() >= kClose.size() ? body.size() - kClose.size() + 1 : 0);
    return false;
  }
  const std::string_view text = body.substr(pos_, close - pos_);
  pos_ = close + kClose.size();
  status_ = emit_json_calls(text, out) ? Status::kDone : Status::kMalformed;
  return true;
}

bool ToolCallParser::emit_json_calls(std::string_view text, std::vector<OutputEvent>& out) {
  const ojson j = parse_json(text);
  std::vector<const ojson*> calls;
  if (j.is_object()) calls.push_back(&j);
  if (j.is_array()) {
    for (const auto& c : j) calls.push_back(&c);
  }
  if (calls.empty()) return false;
  // Validate every call before emitting any, so a bad one cannot leave half a reply behind.
  std::vector<std::pair<std::string, std::string>> parsed;
  for (const ojson* c : calls) {
    if (!c->is_object()) return false;
    auto name = c->find("name");
    if (name == c->end() || !name->is_string() || name->get<std::string>().empty()) return false;
    auto args = c->find("arguments");
    if (args == c->end()) args = c->find("parameters");
    std::string args_text = "{}";
    if (args != c->end()) {
      if (args->is_string()) {
        const ojson inner = parse_json(args->get<std::string>());
        if (!inner.is_object()) return false;
        args_text = dump_json(inner);
      } else if (args->is_object()) {
        args_text = dump_json(*args);
      } else {
        return false;
      }
    }
    parsed.emplace_back(name->get<std::string>(), std::move(args_text));
  }
  for (auto& [name, args] : parsed) {
    begin_call(std::move(name), out);
    add_arguments(args, out);
    end_call(out);
  }
  return true;
}

bool ToolCallParser::step_xml_function(std::string_view body, std::vector<OutputEvent>& out) {
  const size_t i = skip_ws(body, pos_);
  const std::string_view rest = body.substr(i);
  pos_ = i;
  if (could_become(rest, kFunction)) return false;
  if (!rest.starts_with(kFunction)) {
    state_ = State::kSkip;
    return true;
  }
  const size_t gt = rest.find('>', kFunction.size());
  const std::string_view raw_name = rest.substr(
      kFunction.size(), gt == std::string_view::npos ? rest.npos : gt - kFunction.size());
  const bool bad =
      raw_name.find_first_of("<\n") != std::string_view::npos || raw_name.size() > kMaxName;
  if (gt == std::string_view::npos && !bad) return false;
  const std::string_view name = trim(raw_name);
  if (bad || name.empty()) {
    state_ = State::kSkip;
    return true;
  }
  pos_ = i + gt + 1;
  begin_call(detok::utf8_lossy(name), out);
  state_ = State::kXmlBody;
  return true;
}

bool ToolCallParser::step_xml_body(std::string_view body, std::vector<OutputEvent>& out) {
  const size_t i = skip_ws(body, pos_);
  pos_ = i;
  const std::string_view rest = body.substr(i);
  if (rest.empty()) return false;
  for (std::string_view tag : {kParameter, kFunctionEnd, kClose}) {
    if (could_become(rest, tag)) return false;
  }
  if (rest.starts_with(kParameter)) {
    // Decided from the name's own bytes, so any split of the text decides the same way.
    const size_t gt = rest.find('>', kParameter.size());
    const std::string_view raw = rest.substr(
        kParameter.size(), gt == std::string_view::npos ? rest.npos : gt - kParameter.size());
    const bool bad = raw.find_first_of("<\n") != std::string_view::npos || raw.size() > kMaxName;
    if (gt == std::string_view::npos && !bad) return false;
    if (!bad) {
      param_ = std::string(trim(raw));
      pos_ = i + gt + 1;
      scan_ = pos_;
      state_ = State::kXmlValue;
      return true;
    }
    // Not a parameter tag: skipped like other stray text below.
  }
  if (rest.starts_with(kFunctionEnd) || rest.starts_with(kClose)) {
    add_arguments(args_.empty() ? "{}" : "}", out);
    end_call(out);
    if (rest.starts_with(kClose)) {
      pos_ = i + kClose.size();
      status_ = Status::kDone;
    } else {
      pos_ = i + kFunctionEnd.size();
      state_ = State::kXmlAfter;
    }
    return true;
  }
  // Stray text between parameters carries no argument: skip to the next possible tag.
  const size_t lt = body.find('<', i + 1);
  pos_ = lt == std::string_view::npos ? body.size() : lt;
  return true;
}

bool ToolCallParser::step_xml_value(std::string_view body, std::vector<OutputEvent>& out) {
  // The value ends at "</parameter>"; when the model left that out, at the next parameter or the
  // end of the function / call. All terminators start with '<' and contain no other '<', so the
  // first complete one found is the earliest in the whole text, however it was split.
  static constexpr std::array<std::string_view, 4> kEnds = {kParameterEnd, kParameter, kFunctionEnd,
                                                            kClose};
  size_t lt = body.find('<', std::max(scan_, pos_));
  for (; lt != std::string_view::npos; lt = body.find('<', lt + 1)) {
    const std::string_view rest = body.substr(lt);
    std::string_view found;
    bool maybe = false;
    for (std::string_view e : kEnds) {
      if (rest.starts_with(e)) found = e;
      if (could_become(rest, e)) maybe = true;
    }
    if (maybe) {
      scan_ = lt;
      return false;
    }
    if (found.empty()) continue;
    std::string_view value = body.substr(pos_, lt - pos_);
    // The template writes "<parameter=p>\nVALUE\n</parameter>": strip exactly those newlines.
    if (value.starts_with('\n')) value.remove_prefix(1);
    if (value.ends_with('\n')) value.remove_suffix(1);
    const ojson typed = type_parameter_value(value, schemas_.parameter(open_.name, param_));
    std::string piece = args_.empty() ? "{" : ",";
    piece += dump_json(param_);
    piece += ':';
    piece += dump_json(typed);
    add_arguments(piece, out);
    pos_ = found == kParameterEnd ? lt + found.size() : lt;
    state_ = State::kXmlBody;
    return true;
  }
  scan_ = body.size();
  return false;
}

bool ToolCallParser::step_xml_after(std::string_view body) {
  const size_t i = skip_ws(body, pos_);
  pos_ = i;
  const std::string_view rest = body.substr(i);
  if (rest.empty() || could_become(rest, kClose) || could_become(rest, kFunction)) return false;
  if (rest.starts_with(kClose)) {
    pos_ = i + kClose.size();
    status_ = Status::kDone;
  } else if (rest.starts_with(kFunction)) {
    state_ = State::kXmlFunction;  // several functions in one <tool_call>: each is a call
  } else {
    const size_t lt = body.find('<', i + 1);
    pos_ = lt == std::string_view::npos ? body.size() : lt;
  }
  return true;
}

bool ToolCallParser::step_skip(std::string_view body) {
  const size_t close = body.find(kClose, std::max(scan_, pos_));
  if (close == std::string_view::npos) {
    scan_ = body.size() >= kClose.size() ? body.size() - kClose.size() + 1 : 0;
    return false;
  }
  pos_ = close + kClose.size();
  // Calls already emitted from this body stay; only a body with none is sent back as content.
  status_ = open_.tool_index >= 0 ? Status::kDone : Status::kMalformed;
  return true;
}

void ToolCallParser::begin_call(std::string name, std::vector<OutputEvent>& out) {
  open_ = OutputEvent{};
  open_.type = OutputEventType::kToolCallBegin;
  open_.tool_index = next_index_++;
  open_.id = id_prefix_ + std::to_string(open_.tool_index);
  open_.name = std::move(name);
  out.push_back(open_);
  call_open_ = true;
  args_.clear();
}

void ToolCallParser::add_arguments(std::string_view piece, std::vector<OutputEvent>& out) {
  args_ += piece;
  OutputEvent e;
  e.type = OutputEventType::kToolCallArguments;
  e.tool_index = open_.tool_index;
  e.text = std::string(piece);
  out.push_back(std::move(e));
}

void ToolCallParser::end_call(std::vector<OutputEvent>& out) {
  OutputEvent e = open_;
  e.type = OutputEventType::kToolCallEnd;
  e.text = args_;
  out.push_back(std::move(e));
  call_open_ = false;
}

OutputEvent ToolCallParser::abort_open_call() {
  OutputEvent e = open_;
  e.type = OutputEventType::kToolCallEnd;
  e.text = args_;
  e.complete = false;
  call_open_ = false;
  return e;
}

}  // namespace tokenmill
