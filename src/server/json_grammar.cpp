#include "server/json_grammar.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "server/api_error.h"
#include "text/unicode_utf8.h"

namespace tokenmill::server::json_grammar {

using json = nlohmann::ordered_json;

namespace {

// Whitespace between tokens: small models otherwise pad JSON with spaces until max_tokens.
constexpr int kMaxWhitespace = 2;
// Digits in one number (integer and fraction parts), for the same reason.
constexpr uint64_t kMaxDigits = 20;
// Digits of an "integer": 18 always fit a 64-bit integer, so parsers keep it an integer (a
// longer one becomes a float in nlohmann and in tool-call argument typing).
constexpr uint64_t kMaxIntegerDigits = 18;

std::string escaped_inner(const std::string& s) {
  std::string d = json(s).dump();
  return d.substr(1, d.size() - 2);
}

const Node* compile(Grammar& g, const json& s, const std::string& path);

const Node* compile_type(Grammar& g, const json& s, const std::string& type,
                         const std::string& path) {
  if (type == "object") {
    Node* n = g.make(Node::kObject);
    n->additional = g.make(Node::kAny);
    if (s.contains("properties")) {
      const json& props = s["properties"];
      if (!props.is_object()) bad_request(g.options.param, "{}.properties must be an object", path);
      if (props.size() > 64)
        bad_request(g.options.param, "{}: at most 64 properties are supported", path);
      for (auto it = props.begin(); it != props.end(); ++it) {
        n->props.emplace_back(escaped_inner(it.key()),
                              compile(g, it.value(), path + ".properties." + it.key()));
      }
    }
    if (s.contains("required")) {
      if (!s["required"].is_array())
        bad_request(g.options.param, "{}.required must be an array", path);
      for (const auto& r : s["required"]) {
        if (!r.is_string()) bad_request(g.options.param, "{}.required must list strings", path);
        std::string k = escaped_inner(r.get<std::string>());
        auto it =
            std::find_if(n->props.begin(), n->props.end(), [&](auto& p) { return p.first == k; });
        if (it == n->props.end() && g.options.lenient) continue;
        if (it == n->props.end()) {
          bad_request(g.options.param, "{}.required names '{}', which is not in properties", path,
                      r.get<std::string>());
        }
        n->required |= uint64_t(1) << (it - n->props.begin());
      }
    }
    if (s.contains("additionalProperties")) {
      const json& a = s["additionalProperties"];
      if (a.is_boolean()) {
        n->additional = a.get<bool>() ? g.make(Node::kAny) : nullptr;
      } else {
        n->additional = compile(g, a, path + ".additionalProperties");
      }
    }
    return n;
  }
  if (type == "array") {
    Node* n = g.make(Node::kArray);
    n->items = s.contains("items") ? compile(g, s["items"], path + ".items") : g.make(Node::kAny);
    if (s.contains("minItems")) n->min_items = s["minItems"].get<int>();
    if (s.contains("maxItems")) n->max_items = s["maxItems"].get<int>();
    return n;
  }
  if (type == "string") return g.make(Node::kString);
  if (type == "number") return g.make(Node::kNumber);
  if (type == "integer") return g.make(Node::kInteger);
  if (type == "boolean") return g.make(Node::kBoolean);
  if (type == "null") return g.make(Node::kNull);
  if (g.options.lenient) return g.make(Node::kAny);
  bad_request(g.options.param, "{}.type: unknown type '{}'", path, type);
}

const Node* compile(Grammar& g, const json& s, const std::string& path) {
  if (s.is_boolean()) {
    if (!s.get<bool>()) bad_request(g.options.param, "{}: the schema false matches nothing", path);
    return g.make(Node::kAny);
  }
  if (!s.is_object()) bad_request(g.options.param, "{} must be an object", path);
  static const char* const kIgnored[] = {
      "title", "description", "default", "examples",   "format",   "$schema",   "$id",
      "$defs", "definitions", "strict",  "deprecated", "readOnly", "writeOnly", "$comment"};
  static const char* const kKnown[] = {"type",  "properties", "required", "additionalProperties",
                                       "items", "minItems",   "maxItems", "enum",
                                       "const", "anyOf",      "oneOf",    "allOf",
                                       "$ref"};
  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string& k = it.key();
    bool ok =
        std::any_of(std::begin(kIgnored), std::end(kIgnored),
                    [&](const char* x) { return k == x; }) ||
        std::any_of(std::begin(kKnown), std::end(kKnown), [&](const char* x) { return k == x; });
    if (!ok && !g.options.lenient) {
      bad_request(g.options.param,
                  "{}: the keyword '{}' is not supported for constrained decoding "
                  "(supported: {})",
                  path.empty() ? "(root)" : path, k, fmt::join(kKnown, ", "));
    }
  }
  if (s.contains("$ref")) {
    if (!s["$ref"].is_string()) bad_request(g.options.param, "{}.$ref must be a string", path);
    std::string ref = s["$ref"].get<std::string>();
    auto it = g.refs.find(ref);
    if (it != g.refs.end()) return it->second;
    const json* target = nullptr;
    for (const std::string prefix : {"#/$defs/", "#/definitions/"}) {
      if (ref.rfind(prefix, 0) != 0) continue;
      std::string section = prefix.substr(2, prefix.size() - 3);  // "$defs" / "definitions"
      auto defs = g.root_schema->find(section);
      if (defs == g.root_schema->end() || !defs->is_object()) continue;
      auto def = defs->find(ref.substr(prefix.size()));
      if (def != defs->end()) target = &*def;
    }
    if (ref == "#") target = g.root_schema;
    if (!target)
      bad_request(g.options.param, "{}.$ref: cannot resolve '{}' (use #/$defs/NAME)", path, ref);
    // Placeholder first, so recursive references find it.
    Node* slot = g.make(Node::kAnyOf);
    g.refs[ref] = slot;
    slot->options.push_back(compile(g, *target, ref));
    return slot;
  }
  auto literal_any_of = [&](const json& values) {
    Node* n = g.make(Node::kAnyOf);
    for (const auto& v : values) {
      if (v.is_string()) {
        Node* sn = g.make(Node::kString);
        sn->enums.push_back(escaped_inner(v.get<std::string>()));
        n->options.push_back(sn);
      } else {
        Node* l = g.make(Node::kLiteral);
        l->literal = v.dump();
        n->options.push_back(l);
      }
    }
    return n;
  };
  if (s.contains("const")) return literal_any_of(json::array({s["const"]}));
  if (s.contains("enum")) {
    if (!s["enum"].is_array() || s["enum"].empty())
      bad_request(g.options.param, "{}.enum must be a non-empty array", path);
    return literal_any_of(s["enum"]);
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    if (s.contains(key)) {
      if (!s[key].is_array() || s[key].empty())
        bad_request(g.options.param, "{}.{} must be a non-empty array", path, key);
      Node* n = g.make(Node::kAnyOf);
      for (size_t i = 0; i < s[key].size(); ++i) {
        n->options.push_back(compile(g, s[key][i], fmt::format("{}.{}[{}]", path, key, i)));
      }
      return n;
    }
  }
  if (s.contains("allOf")) {
    // Lenient: the first entry is enforced (a necessary condition), the rest is not.
    if (!s["allOf"].is_array() || s["allOf"].empty() ||
        (s["allOf"].size() != 1 && !g.options.lenient)) {
      bad_request(g.options.param, "{}.allOf: only a single entry is supported", path);
    }
    return compile(g, s["allOf"][0], path + ".allOf[0]");
  }
  if (!s.contains("type")) {
    if (s.contains("properties")) return compile_type(g, s, "object", path);
    if (s.contains("items")) return compile_type(g, s, "array", path);
    return g.make(Node::kAny);
  }
  const json& t = s["type"];
  if (t.is_string()) return compile_type(g, s, t.get<std::string>(), path);
  if (t.is_array()) {
    Node* n = g.make(Node::kAnyOf);
    for (const auto& x : t) {
      if (!x.is_string()) bad_request(g.options.param, "{}.type must list type names", path);
      n->options.push_back(compile_type(g, s, x.get<std::string>(), path));
    }
    return n;
  }
  bad_request(g.options.param, "{}.type must be a string or an array", path);
}

bool is_ws(uint8_t c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}
bool is_digit(uint8_t c) {
  return c >= '0' && c <= '9';
}
bool is_hex(uint8_t c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// A string frame's phases (Frame::phase). Strings stay valid UTF-8 and their escapes valid
// UTF-16: a strict parser (nlohmann, serde_json) must accept every document the grammar completes.
enum StringPhase : uint8_t {
  kStrChar = 0,  // at a character boundary
  kStrEscape,    // after '\'
  kStrHex1,      // \u, then its 4 hex digits (kStrHex1..kStrHex4)
  kStrHex2,
  kStrHex3,
  kStrHex4,
  kStrHighD,  // \uD (a surrogate if the next digit is 8-F)
  kStrHigh3,  // \uD8..\uDB: two more digits, then the low surrogate's \uDC00..\uDFFF
  kStrHigh4,
  kStrLowSlash,
  kStrLowU,
  kStrLowD,
  kStrLowC,  // \uD, then C..F
  kStrLow3,
  kStrLow4,
  kStrCont1,    // UTF-8: one continuation byte (80..BF) left
  kStrCont2,    // two left, the first 80..BF
  kStrCont2E0,  // after E0: the first A0..BF (no overlong forms)
  kStrCont2ED,  // after ED: the first 80..9F (no surrogates)
  kStrCont3,    // three left, the first 80..BF
  kStrCont3F0,  // after F0: the first 90..BF
  kStrCont3F4,  // after F4: the first 80..8F (nothing past U+10FFFF)
};

// The phase after UTF-8 lead byte c (>= 0x80) at a character boundary; kStrChar for a byte no
// character starts with.
uint8_t utf8_lead_phase(uint8_t c) {
  if (c >= 0xC2 && c <= 0xDF) return kStrCont1;
  if (c == 0xE0) return kStrCont2E0;
  if (c == 0xED) return kStrCont2ED;
  if (c >= 0xE1 && c <= 0xEF) return kStrCont2;
  if (c == 0xF0) return kStrCont3F0;
  if (c >= 0xF1 && c <= 0xF3) return kStrCont3;
  if (c == 0xF4) return kStrCont3F4;
  return kStrChar;
}

// UTF-8 continuation phases (kStrCont1..kStrCont3F4, in order): the range the byte must fall in
// and the phase after it.
struct ByteRange {
  uint8_t lo, hi, next;
};
constexpr ByteRange kContinuation[] = {
    {0x80, 0xBF, kStrChar},  {0x80, 0xBF, kStrCont1}, {0xA0, 0xBF, kStrCont1},
    {0x80, 0x9F, kStrCont1}, {0x80, 0xBF, kStrCont2}, {0x90, 0xBF, kStrCont2},
    {0x80, 0x8F, kStrCont2},
};

// The phase after byte c inside a string at `phase` (not kStrChar), or -1 when c cannot come.
int string_step(uint8_t phase, uint8_t c) {
  if (phase >= kStrCont1) {
    const ByteRange& r = kContinuation[phase - kStrCont1];
    return c >= r.lo && c <= r.hi ? r.next : -1;
  }
  const bool hex = is_hex(c);
  const auto in = [c](char lo, char hi) {  // a hex digit range, either case
    return (c >= lo && c <= hi) || (c >= (lo | 0x20) && c <= (hi | 0x20));
  };
  switch (phase) {
    case kStrEscape:
      if (c == 'u') return kStrHex1;
      return c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' ||
                     c == 't'
                 ? kStrChar
                 : -1;
    case kStrHex1:
      return in('D', 'D') ? kStrHighD : hex ? kStrHex2 : -1;
    case kStrHighD:  // \uD8..\uDB: a high surrogate; \uDC..\uDF alone is never valid
      return in('8', '9') || in('A', 'B') ? kStrHigh3 : hex && !in('C', 'F') ? kStrHex3 : -1;
    case kStrLowSlash:
      return c == '\\' ? kStrLowU : -1;
    case kStrLowU:
      return c == 'u' ? kStrLowD : -1;
    case kStrLowD:
      return in('D', 'D') ? kStrLowC : -1;
    case kStrLowC:
      return in('C', 'F') ? kStrLow3 : -1;
    default:  // the other hex digits of an escape
      if (!hex) return -1;
      return phase == kStrHex2    ? kStrHex3
             : phase == kStrHigh3 ? kStrHigh4
             : phase == kStrHigh4 ? kStrLowSlash
             : phase == kStrLow3  ? kStrLow4
             : phase == kStrHex3  ? kStrHex4
                                  : kStrChar;  // kStrHex4, kStrLow4
  }
}

// Each anyOf's options become the distinct non-anyOf nodes they lead to (nested anyOf
// flattened): the matcher then expands one level, where a $defs chain of 20 anyOf pairs (1.3 KB
// of schema) cost 2^20 expansions a byte. A cycle of alternatives alone (a $ref to itself, "#"
// from the root, or anyOf options that lead back to their own anyOf) is refused: the matcher
// expands alternatives before it reads a byte, so it recursed until the stack overflowed (found
// by tests/fuzz/fuzz_json_schema.cpp). Every other cycle passes through an object or array,
// which reads a byte first.
void flatten_alternatives(Grammar& g) {
  std::map<const Node*, std::vector<const Node*>> leaves;
  std::set<const Node*> open;  // anyOf nodes whose leaves are being gathered
  std::function<const std::vector<const Node*>&(const Node*)> leaves_of =
      [&](const Node* n) -> const std::vector<const Node*>& {
    if (auto it = leaves.find(n); it != leaves.end()) return it->second;
    if (!open.insert(n).second) {
      bad_request(g.options.param,
                  "a $ref or anyOf leads back to itself with no value in between (no document "
                  "can match it): refer to a definition that is an object, array or value");
    }
    std::vector<const Node*> out;
    for (const Node* o : n->options) {
      const std::vector<const Node*> sub =
          o->t == Node::kAnyOf ? leaves_of(o) : std::vector<const Node*>{o};
      for (const Node* l : sub) {
        if (std::find(out.begin(), out.end(), l) == out.end()) out.push_back(l);
      }
    }
    open.erase(n);
    return leaves[n] = std::move(out);
  };
  for (const auto& n : g.nodes) {
    if (n->t == Node::kAnyOf) leaves_of(n.get());
  }
  for (const auto& n : g.nodes) {
    if (n->t == Node::kAnyOf) n->options = leaves[n.get()];
  }
}

}  // namespace

bool json_string_run(const std::string& bytes) {
  return !bytes.empty() && std::none_of(bytes.begin(), bytes.end(), [](char ch) {
    return ch == '"' || ch == '\\' || uint8_t(ch) < 0x20;
  }) && text::is_valid_utf8(bytes);
}

std::unique_ptr<Grammar> build_grammar(const json& schema, bool any_value,
                                       const SchemaOptions& options) {
  auto g = std::make_unique<Grammar>();
  g->options = options;
  g->root_schema = &schema;
  if (any_value) {
    Node* n = g->make(Node::kObject);
    n->additional = g->make(Node::kAny);
    g->root = n;
  } else {
    g->root = compile(*g, schema, "");
    flatten_alternatives(*g);
  }
  g->root_schema = nullptr;
  return g;
}

// ---- The matcher ----

void Matcher::prune(std::vector<Stack>& stacks) {
  // The first of equal parses, in the order the schema's alternatives produced them (not by
  // their nodes' addresses), so the parses kept past kMaxParses are the same every run.
  std::vector<size_t> order(stacks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return stacks[a] < stacks[b]; });
  std::vector<uint8_t> keep(stacks.size(), 1);
  for (size_t i = 1; i < order.size(); ++i) {
    if (stacks[order[i]] == stacks[order[i - 1]]) keep[order[i]] = 0;
  }
  std::vector<Stack> kept;
  for (size_t i = 0; i < stacks.size() && kept.size() < kMaxParses; ++i) {
    if (keep[i]) kept.push_back(std::move(stacks[i]));
  }
  stacks = std::move(kept);
}

// The top value frame finished: tell its parent.
void Matcher::value_done(Stack& s) {
  s.pop_back();
  if (s.empty()) {
    Frame d;
    d.kind = kDone;
    s.push_back(d);
    return;
  }
  Frame& p = s.back();
  if (p.kind == kObject) p.phase = 3;
  if (p.kind == kArray) {
    p.count++;
    p.phase = 3;
  }
}

void Matcher::push_value(Stack& s, const Node* node) {
  Frame f;
  f.node = node;
  s.push_back(f);
}

// Candidate texts for the string frame on top: enum values, or the free keys of its object.
bool Matcher::string_prefix_ok(const Stack& s, const std::string& buf, bool whole) {
  const Frame& f = s.back();
  auto match = [&](const std::string& cand) {
    return whole ? cand == buf : cand.compare(0, buf.size(), buf) == 0 && cand.size() >= buf.size();
  };
  if (f.key) {
    const Frame& obj = s[s.size() - 2];
    if (obj.node->additional) return true;
    for (size_t i = 0; i < obj.node->props.size(); ++i) {
      if (!(obj.seen >> i & 1) && match(obj.node->props[i].first)) return true;
    }
    return false;
  }
  if (f.node->enums.empty()) return true;
  return std::any_of(f.node->enums.begin(), f.node->enums.end(), match);
}

void Matcher::step(Stack& s, uint8_t c, std::vector<Stack>& out) {
  Frame& f = s.back();
  switch (f.kind) {
    case kDone:
      if (is_ws(c) && f.ws < kMaxWhitespace) {
        f.ws++;
        out.push_back(std::move(s));
      }
      return;
    case kValue: {
      if (is_ws(c)) {
        if (f.ws < kMaxWhitespace) {
          f.ws++;
          out.push_back(std::move(s));
        }
        return;
      }
      const Node* n = f.node;
      if (n->t == Node::kAnyOf) {
        for (const Node* o : n->options) {
          Stack copy = s;
          copy.back().node = o;
          step(copy, c, out);
        }
        return;
      }
      Node::T t = n->t;
      if (t == Node::kAny) {
        t = c == '{'                  ? Node::kObject
            : c == '['                ? Node::kArray
            : c == '"'                ? Node::kString
            : c == '-' || is_digit(c) ? Node::kNumber
            : c == 't' || c == 'f'    ? Node::kBoolean
                                      : Node::kNull;
      }
      f.ws = 0;
      switch (t) {
        case Node::kObject:
          if (c != '{') return;
          f.kind = kObject;
          f.phase = 0;
          break;
        case Node::kArray:
          if (c != '[') return;
          f.kind = kArray;
          f.phase = 0;
          break;
        case Node::kString:
          if (c != '"') return;
          f.kind = kString;
          f.phase = 0;
          break;
        case Node::kNumber:
        case Node::kInteger:
          if (c != '-' && !is_digit(c)) return;
          f.kind = kNumber;
          f.phase = c == '-' ? 1 : c == '0' ? 2 : 3;
          f.key = t == Node::kInteger;   // reused as "integer only"
          f.seen = is_digit(c) ? 1 : 0;  // digits so far
          break;
        case Node::kBoolean:
        case Node::kNull:
        case Node::kLiteral: {
          f.kind = kLiteral;
          if (n->t == Node::kLiteral) {
            f.buf = n->literal;
          } else {
            f.buf = t == Node::kNull ? "null" : c == 't' ? "true" : "false";
          }
          if (uint8_t(f.buf[0]) != c) return;
          f.count = 1;
          if (f.count == int32_t(f.buf.size())) value_done(s);
          break;
        }
        default:
          return;
      }
      out.push_back(std::move(s));
      return;
    }
    case kLiteral:
      if (f.count < int32_t(f.buf.size()) && uint8_t(f.buf[f.count]) == c) {
        if (++f.count == int32_t(f.buf.size())) value_done(s);
        out.push_back(std::move(s));
      }
      return;
    case kNumber: {
      bool integer = f.key;
      uint8_t ph = f.phase;
      int next = -1;
      if (is_digit(c)) {
        next = ph == 1              ? (c == '0' ? 2 : 3)
               : ph == 3            ? 3
               : ph == 4 || ph == 5 ? 5
               : ph >= 6            ? 8
                                    : -1;
      } else if (c == '.' && !integer && (ph == 2 || ph == 3)) {
        next = 4;
      } else if ((c == 'e' || c == 'E') && !integer && (ph == 2 || ph == 3 || ph == 5)) {
        next = 6;
      } else if ((c == '+' || c == '-') && ph == 6) {
        next = 7;
      }
      // At most two exponent digits: larger exponents overflow doubles, and parsers reject them.
      if (next == 8) {
        if (ph != 8) f.count = 0;
        if (++f.count > 2) return;
      }
      if (next >= 0 && is_digit(c) && ++f.seen > (integer ? kMaxIntegerDigits : kMaxDigits)) {
        return;
      }
      if (next >= 0) {
        f.phase = uint8_t(next);
        out.push_back(std::move(s));
        return;
      }
      if (!number_accepting(ph)) return;
      value_done(s);
      step(s, c, out);
      return;
    }
    case kString: {
      bool track = f.key || !f.node->enums.empty();
      if (f.phase == 0) {
        if (c == '"') {
          if (track && !string_prefix_ok(s, f.buf, true)) return;
          if (f.key) {
            std::string key = std::move(f.buf);
            s.pop_back();
            Frame& obj = s.back();
            obj.key_index = -1;
            for (size_t i = 0; i < obj.node->props.size(); ++i) {
              if (obj.node->props[i].first == key) obj.key_index = int32_t(i);
            }
            if (obj.key_index >= 0) {
              if (obj.seen >> obj.key_index & 1) return;  // duplicate key
              obj.seen |= uint64_t(1) << obj.key_index;
            } else if (!obj.node->additional) {
              return;
            }
            obj.phase = 1;
          } else {
            value_done(s);
          }
          out.push_back(std::move(s));
          return;
        }
        if (c < 0x20) return;
        if (c == '\\') {
          f.phase = kStrEscape;
        } else if (c >= 0x80) {
          f.phase = utf8_lead_phase(c);
          if (f.phase == kStrChar) return;  // not a UTF-8 lead byte
        }
      } else {
        const int next = string_step(f.phase, c);
        if (next < 0) return;
        f.phase = uint8_t(next);
      }
      if (track) {
        f.buf.push_back(char(c));
        if (!string_prefix_ok(s, f.buf, false)) return;
      }
      out.push_back(std::move(s));
      return;
    }
    case kObject: {
      if (is_ws(c)) {
        if (f.ws < kMaxWhitespace) {
          f.ws++;
          out.push_back(std::move(s));
        }
        return;
      }
      f.ws = 0;
      const Node* n = f.node;
      bool all_required = (f.seen & n->required) == n->required;
      if ((f.phase == 0 || f.phase == 4) && c == '"') {
        Frame k;
        k.kind = kString;
        k.key = true;
        k.node = n;
        s.push_back(k);
        out.push_back(std::move(s));
      } else if ((f.phase == 0 || f.phase == 3) && c == '}') {
        if (!all_required) return;
        value_done(s);
        out.push_back(std::move(s));
      } else if (f.phase == 1 && c == ':') {
        f.phase = 2;
        const Node* v = f.key_index >= 0 ? n->props[f.key_index].second : n->additional;
        push_value(s, v);
        out.push_back(std::move(s));
      } else if (f.phase == 3 && c == ',') {
        bool more = n->additional != nullptr;
        for (size_t i = 0; i < n->props.size() && !more; ++i) more = !(f.seen >> i & 1);
        if (!more) return;
        f.phase = 4;
        out.push_back(std::move(s));
      }
      return;
    }
    case kArray: {
      if (is_ws(c)) {
        if (f.ws < kMaxWhitespace) {
          f.ws++;
          out.push_back(std::move(s));
        }
        return;
      }
      f.ws = 0;
      const Node* n = f.node;
      if ((f.phase == 0 || f.phase == 3) && c == ']') {
        if (f.count < n->min_items) return;
        value_done(s);
        out.push_back(std::move(s));
      } else if (f.phase == 3 && c == ',') {
        if (n->max_items >= 0 && f.count >= n->max_items) return;
        f.phase = 4;
        push_value(s, n->items);
        out.push_back(std::move(s));
      } else if (f.phase == 0) {
        if (n->max_items == 0) return;
        f.phase = 4;
        push_value(s, n->items);
        step(s, c, out);
      }
      return;
    }
  }
}

}  // namespace tokenmill::server::json_grammar
