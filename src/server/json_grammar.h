// The JSON-schema grammar behind constrained decoding: a schema compiled to Nodes, and a
// byte-level pushdown Matcher over them (a set of stacks, several while anyOf alternatives are
// open). Used by json_schema_constraint (response_format) and tool_call_constraint (tool
// arguments). Internal to server/ (includes nlohmann/json). Supported subset: see
// json_schema_constraint.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

namespace tokenmill::server::json_grammar {

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

struct SchemaOptions {
  std::string param = "response_format.json_schema.schema";  // names the schema in 400s
  // Lenient (tool parameters): keywords outside the subset are ignored instead of rejected, as
  // are unknown type names and required names missing from properties; the output then obeys
  // the rest of the schema. Strict (response_format): they are 400s.
  bool lenient = false;
};

// Owns the nodes of one compiled schema.
struct Grammar {
  std::vector<std::unique_ptr<Node>> nodes;
  std::map<std::string, Node*> refs;
  SchemaOptions options;
  const nlohmann::ordered_json* root_schema = nullptr;  // while compiling ($ref targets)
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

// Compiles `schema` (any_value: any JSON object, the schema is ignored). Throws ApiError 400
// (param options.param) for schemas outside the subset.
std::unique_ptr<Grammar> build_grammar(const nlohmann::ordered_json& schema, bool any_value,
                                       const SchemaOptions& options = {});

// Whether `bytes` may follow inside a free JSON string at a character boundary and leave it at
// one: no quote, backslash or control byte, and whole UTF-8 characters (what the constraints
// let through without stepping the matcher).
bool json_string_run(const std::string& bytes);

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

  bool operator==(const Frame&) const = default;
  auto operator<=>(const Frame& o) const {
    return std::tie(kind, phase, ws, key, node, seen, count, key_index, buf) <=>
           std::tie(o.kind, o.phase, o.ws, o.key, o.node, o.seen, o.count, o.key_index, o.buf);
  }
};
using Stack = std::vector<Frame>;

// Live parses a Matcher keeps at most. Alternatives that stay open (anyOf options of objects
// or arrays nested in each other) can multiply them with every level; past this many the rest
// are dropped, which only narrows what may come (each kept parse is a valid one), so a request's
// schema cannot make every byte cost exponential time.
inline constexpr size_t kMaxParses = 256;

class Matcher {
 public:
  explicit Matcher(const Node* root) {
    Frame f;
    f.node = root;
    stacks_.push_back(Stack{f});
  }
  bool alive() const { return !stacks_.empty(); }
  size_t parses() const { return stacks_.size(); }  // live parses (at most kMaxParses)
  bool feed(uint8_t c) {
    std::vector<Stack> next;
    for (auto& s : stacks_) step(s, c, next);
    stacks_ = std::move(next);
    if (stacks_.size() > 1) prune(stacks_);
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
  static void value_done(Stack& s);
  static void push_value(Stack& s, const Node* node);
  // Candidate texts for the string frame on top: enum values, or the free keys of its object.
  static bool string_prefix_ok(const Stack& s, const std::string& buf, bool whole);
  void step(Stack& s, uint8_t c, std::vector<Stack>& out);
  // Identical parses (alternatives that reached the same state) once; at most kMaxParses.
  static void prune(std::vector<Stack>& stacks);

  std::vector<Stack> stacks_;
};

}  // namespace tokenmill::server::json_grammar
