#include "server/json_schema_constraint.h"

#include <algorithm>
#include <array>
#include <map>

#include "server/api_error.h"

namespace tokenmill::server {

using json = nlohmann::ordered_json;

namespace {

// Whitespace between tokens: small models otherwise pad JSON with spaces until max_tokens.
constexpr int kMaxWhitespace = 2;
// Digits in one number (integer and fraction parts), for the same reason.
constexpr uint64_t kMaxDigits = 20;
const char* const kSchemaParam = "response_format.json_schema.schema";

struct Node {
  enum T {
    kAny,
    kObject,
    kArray,
    kString,
    kNumber,
    kInteger,
    kBoolean,
    kNull,
    kAnyOf,
    kLiteral
  } t = kAny;
  std::vector<std::pair<std::string, const Node*>> props;  // name as JSON-escaped inner text
  uint64_t required = 0;                                   // bit i: props[i] is required
  const Node* additional = nullptr;                        // nullptr: no extra keys
  const Node* items = nullptr;
  int min_items = 0, max_items = -1;
  std::vector<std::string> enums;  // kString with enum: JSON-escaped inner texts
  std::vector<const Node*> options;
  std::string literal;  // kLiteral: the compact JSON text
};

// Owns the nodes of one compiled schema.
struct Grammar {
  std::vector<std::unique_ptr<Node>> nodes;
  std::map<std::string, Node*> refs;
  const json* root_schema = nullptr;
  const Node* root = nullptr;
  Node* make(Node::T t) {
    nodes.push_back(std::make_unique<Node>());
    Node* n = nodes.back().get();
    n->t = t;
    if (t == Node::kAny) {
      // An untyped value that turns out to be an object or array: any keys, any items.
      n->items = n;
      n->additional = n;
    }
    return n;
  }
};

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
      if (!props.is_object()) bad_request(kSchemaParam, "{}.properties must be an object", path);
      if (props.size() > 64)
        bad_request(kSchemaParam, "{}: at most 64 properties are supported", path);
      for (auto it = props.begin(); it != props.end(); ++it) {
        n->props.emplace_back(escaped_inner(it.key()),
                              compile(g, it.value(), path + ".properties." + it.key()));
      }
    }
    if (s.contains("required")) {
      if (!s["required"].is_array())
        bad_request(kSchemaParam, "{}.required must be an array", path);
      for (const auto& r : s["required"]) {
        if (!r.is_string()) bad_request(kSchemaParam, "{}.required must list strings", path);
        std::string k = escaped_inner(r.get<std::string>());
        auto it =
            std::find_if(n->props.begin(), n->props.end(), [&](auto& p) { return p.first == k; });
        if (it == n->props.end()) {
          bad_request(kSchemaParam, "{}.required names '{}', which is not in properties", path,
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
  bad_request(kSchemaParam, "{}.type: unknown type '{}'", path, type);
}

const Node* compile(Grammar& g, const json& s, const std::string& path) {
  if (s.is_boolean()) {
    if (!s.get<bool>()) bad_request(kSchemaParam, "{}: the schema false matches nothing", path);
    return g.make(Node::kAny);
  }
  if (!s.is_object()) bad_request(kSchemaParam, "{} must be an object", path);
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
    if (!ok) {
      bad_request(kSchemaParam,
                  "{}: the keyword '{}' is not supported for constrained decoding "
                  "(supported: {})",
                  path.empty() ? "(root)" : path, k, fmt::join(kKnown, ", "));
    }
  }
  if (s.contains("$ref")) {
    if (!s["$ref"].is_string()) bad_request(kSchemaParam, "{}.$ref must be a string", path);
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
      bad_request(kSchemaParam, "{}.$ref: cannot resolve '{}' (use #/$defs/NAME)", path, ref);
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
      bad_request(kSchemaParam, "{}.enum must be a non-empty array", path);
    return literal_any_of(s["enum"]);
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    if (s.contains(key)) {
      if (!s[key].is_array() || s[key].empty())
        bad_request(kSchemaParam, "{}.{} must be a non-empty array", path, key);
      Node* n = g.make(Node::kAnyOf);
      for (size_t i = 0; i < s[key].size(); ++i) {
        n->options.push_back(compile(g, s[key][i], fmt::format("{}.{}[{}]", path, key, i)));
      }
      return n;
    }
  }
  if (s.contains("allOf")) {
    if (!s["allOf"].is_array() || s["allOf"].size() != 1) {
      bad_request(kSchemaParam, "{}.allOf: only a single entry is supported", path);
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
      if (!x.is_string()) bad_request(kSchemaParam, "{}.type must list type names", path);
      n->options.push_back(compile_type(g, s, x.get<std::string>(), path));
    }
    return n;
  }
  bad_request(kSchemaParam, "{}.type must be a string or an array", path);
}

std::unique_ptr<Grammar> build_grammar(const json& schema, bool any_value) {
  auto g = std::make_unique<Grammar>();
  g->root_schema = &schema;
  if (any_value) {
    Node* n = g->make(Node::kObject);
    n->additional = g->make(Node::kAny);
    g->root = n;
  } else {
    g->root = compile(*g, schema, "");
  }
  return g;
}

// ---- The matcher: a set of stacks (several while anyOf alternatives are open). ----

enum Kind : uint8_t { kValue, kObject, kArray, kString, kNumber, kLiteral, kDone };

struct Frame {
  Kind kind = kValue;
  uint8_t phase = 0;
  uint8_t ws = 0;
  bool key = false;  // kString: an object key
  const Node* node = nullptr;
  uint64_t seen = 0;       // kObject: properties seen
  int32_t count = 0;       // kArray: items; kLiteral: position
  int32_t key_index = -1;  // kObject: property of the current key (-1 = additional)
  std::string buf;         // kString with enum or key: inner text so far
};
using Stack = std::vector<Frame>;

bool is_ws(uint8_t c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}
bool is_digit(uint8_t c) {
  return c >= '0' && c <= '9';
}
bool is_hex(uint8_t c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

class Matcher {
 public:
  explicit Matcher(const Node* root) {
    Frame f;
    f.node = root;
    stacks_.push_back(Stack{f});
  }
  bool alive() const { return !stacks_.empty(); }
  bool feed(uint8_t c) {
    std::vector<Stack> next;
    for (auto& s : stacks_) step(s, c, next);
    stacks_ = std::move(next);
    return !stacks_.empty();
  }
  bool feed(const std::string& bytes) {
    for (char ch : bytes) {
      if (!feed(uint8_t(ch))) return false;
    }
    return true;
  }
  // The value is complete (only whitespace may follow).
  bool complete() const {
    for (const auto& s : stacks_) {
      if (s.size() == 1 &&
          (s[0].kind == kDone || (s[0].kind == kNumber && number_accepting(s[0].phase)))) {
        return true;
      }
    }
    return false;
  }
  // Closed by a bracket or quote: nothing but whitespace can follow (numbers stay open).
  bool closed() const {
    return !stacks_.empty() && std::all_of(stacks_.begin(), stacks_.end(), [](const Stack& s) {
      return s.size() == 1 && s[0].kind == kDone;
    });
  }
  // Inside a free string (no enum, not a key) in every alternative: plain bytes stay valid.
  bool in_free_string() const {
    return stacks_.size() == 1 && stacks_[0].back().kind == kString && !stacks_[0].back().key &&
           stacks_[0].back().phase == 0 && stacks_[0].back().node->enums.empty();
  }

 private:
  static bool number_accepting(int phase) {
    return phase == 2 || phase == 3 || phase == 5 || phase == 8;
  }

  // The top value frame finished: tell its parent.
  static void value_done(Stack& s) {
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

  static void push_value(Stack& s, const Node* node) {
    Frame f;
    f.node = node;
    s.push_back(f);
  }

  // Candidate texts for the string frame on top: enum values, or the free keys of its object.
  static bool string_prefix_ok(const Stack& s, const std::string& buf, bool whole) {
    const Frame& f = s.back();
    auto match = [&](const std::string& cand) {
      return whole ? cand == buf
                   : cand.compare(0, buf.size(), buf) == 0 && cand.size() >= buf.size();
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

  void step(Stack& s, uint8_t c, std::vector<Stack>& out) {
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
            f.key = t == Node::kInteger;  // reused as "integer only"
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
        if (next >= 0 && is_digit(c) && ++f.seen > kMaxDigits) return;
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
          if (c == '\\') f.phase = 1;
        } else if (f.phase == 1) {
          if (c == 'u') {
            f.phase = 2;
          } else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' ||
                     c == 'r' || c == 't') {
            f.phase = 0;
          } else {
            return;
          }
        } else {
          if (!is_hex(c)) return;
          f.phase = f.phase == 5 ? 0 : f.phase + 1;
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

  std::vector<Stack> stacks_;
};

class JsonConstraint : public TokenConstraint {
 public:
  JsonConstraint(std::shared_ptr<const std::vector<std::string>> bytes,
                 const std::vector<uint8_t>& special, const std::vector<int32_t>& stop_ids,
                 std::unique_ptr<Grammar> grammar)
      : bytes_(std::move(bytes)),
        special_(special),
        stop_ids_(stop_ids),
        grammar_(std::move(grammar)),
        matcher_(grammar_->root) {
    plain_.resize(bytes_->size());
    for (size_t i = 0; i < bytes_->size(); ++i) {
      const std::string& b = (*bytes_)[i];
      plain_[i] = !b.empty() && std::none_of(b.begin(), b.end(), [](char ch) {
        return ch == '"' || ch == '\\' || uint8_t(ch) < 0x20;
      });
    }
  }

  void mask(std::vector<uint8_t>& allowed) override {
    std::array<uint8_t, 256> first{};
    for (int c = 0; c < 256; ++c) {
      Matcher m = matcher_;
      first[c] = m.feed(uint8_t(c));
    }
    const bool free_string = matcher_.in_free_string();
    const bool complete = matcher_.complete();
    const size_t n = std::min(allowed.size(), bytes_->size());
    for (size_t id = 0; id < n; ++id) {
      if (!allowed[id]) continue;
      const std::string& b = (*bytes_)[id];
      bool ok;
      if (id < special_.size() && special_[id]) {
        ok = false;
      } else if (b.empty() || !first[uint8_t(b[0])]) {
        ok = false;
      } else if (free_string && plain_[id]) {
        ok = true;
      } else {
        Matcher m = matcher_;
        ok = m.feed(b);
      }
      allowed[id] = ok;
    }
    for (size_t id = n; id < allowed.size(); ++id) allowed[id] = 0;
    for (int32_t s : stop_ids_) {
      if (s >= 0 && size_t(s) < allowed.size()) allowed[s] = complete;
    }
  }

  bool accept(int32_t token) override {
    if (std::find(stop_ids_.begin(), stop_ids_.end(), token) != stop_ids_.end()) return false;
    if (token >= 0 && size_t(token) < bytes_->size()) matcher_.feed((*bytes_)[token]);
    return !matcher_.closed() && matcher_.alive();
  }

 private:
  std::shared_ptr<const std::vector<std::string>> bytes_;
  std::vector<uint8_t> special_;
  std::vector<int32_t> stop_ids_;
  std::unique_ptr<Grammar> grammar_;
  Matcher matcher_;
  std::vector<uint8_t> plain_;
};

}  // namespace

void validate_json_schema(const json& schema) {
  build_grammar(schema, false);
}

std::shared_ptr<TokenConstraint> make_json_constraint(
    std::shared_ptr<const std::vector<std::string>> token_bytes,
    const std::vector<uint8_t>& special, const std::vector<int32_t>& stop_ids, const json& schema,
    bool any_value) {
  return std::make_shared<JsonConstraint>(std::move(token_bytes), special, stop_ids,
                                          build_grammar(schema, any_value));
}

bool json_schema_accepts(const json& schema, bool any_value, const std::string& text,
                         bool complete) {
  auto g = build_grammar(schema, any_value);
  Matcher m(g->root);
  if (!m.feed(text)) return false;
  return complete ? m.complete() : true;
}

}  // namespace tokenmill::server
