// Values of the Jinja engine: a variant over Python's types as chat templates see them
// (undefined, none, bool, int, float, str, list/tuple/generator, ordered dict, callable,
// namespace). Semantics follow CPython + jinja2: truthiness, equality (1 == 1.0 == True), ordering,
// str() and repr() formatting, and HF's tojson (json.dumps with ensure_ascii=False).
//
// Containers are shared and immutable once built (HF renders in an ImmutableSandboxedEnvironment:
// list.append, dict.update, ... are unsafe there), except namespaces, whose attributes
// `{% set ns.x = ... %}` assigns. Strings are UTF-8; Python's per-character operations (len,
// slicing, indexing, upper/lower) work on code points (see jinja_unicode helpers below).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "util/error.h"

namespace tokenmill::jinja {

class Value;
class Interp;

// A runtime failure without location; the interpreter prefixes "<source>:<line>: ".
class RuntimeError : public Error {
 public:
  explicit RuntimeError(const std::string& m) : Error(m) {}
};
template <typename... Args>
[[noreturn]] void rfail(fmt::format_string<Args...> f, Args&&... args) {
  throw RuntimeError(fmt::format(f, std::forward<Args>(args)...));
}

enum class Kind : uint8_t {
  Undefined,
  None,
  Bool,
  Int,
  Float,
  String,
  List,
  Dict,
  Func,
  Namespace
};
// How a sequence behaves in Python: list, tuple, or a one-shot iterator (map, select, reverse...),
// which has no len(), is always truthy and cannot be indexed.
enum class SeqKind : uint8_t { List, Tuple, Generator };

// Containers nested deeper than this are rejected, so destruction and printing (recursive) stay
// within the stack whatever a template builds.
inline constexpr int kMaxValueDepth = 200;

struct ListObj {
  std::vector<Value> items;
  SeqKind seq = SeqKind::List;
  int depth = 1;        // 1 + deepest child container
  bool has_ns = false;  // holds a namespace somewhere (namespaces may not hold those: no cycles)
};

// Insertion-ordered mapping with Python key equality; linear lookup (template dicts are small).
struct DictObj {
  std::vector<std::pair<Value, Value>> items;
  int depth = 1;  // 1 + deepest child container (see kMaxValueDepth)
  bool has_ns = false;
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(Value key, Value value);
};

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

using NativeFn = std::function<Value(Interp&, CallArgs&)>;
struct FuncObj {
  std::string name;
  NativeFn fn;
};

// jinja2's namespace() object (mutable) and the read-only `loop` object share this shape.
struct NamespaceObj {
  DictObj attrs;
  bool is_loop = false;
};

class Value {
 public:
  Value() : kind_(Kind::Undefined), v_(std::string()) {}
  static Value undefined(std::string hint) {
    Value v;
    v.v_ = std::move(hint);
    return v;
  }
  static Value none() {
    Value v;
    v.kind_ = Kind::None;
    v.v_ = std::monostate();
    return v;
  }
  Value(bool b) : kind_(Kind::Bool), v_(b) {}  // NOLINT: implicit by design
  Value(int64_t i) : kind_(Kind::Int), v_(i) {}
  Value(int i) : kind_(Kind::Int), v_(static_cast<int64_t>(i)) {}
  Value(double f) : kind_(Kind::Float), v_(f) {}
  Value(std::string s) : kind_(Kind::String), v_(std::move(s)) {}
  Value(const char* s) : kind_(Kind::String), v_(std::string(s)) {}
  Value(std::shared_ptr<ListObj> l) : kind_(Kind::List), v_(std::move(l)) {}
  Value(std::shared_ptr<DictObj> d) : kind_(Kind::Dict), v_(std::move(d)) {}
  Value(std::shared_ptr<FuncObj> f) : kind_(Kind::Func), v_(std::move(f)) {}
  Value(std::shared_ptr<NamespaceObj> n) : kind_(Kind::Namespace), v_(std::move(n)) {}

  // Builds a list; raises when nesting would exceed kMaxValueDepth.
  static Value list(std::vector<Value> items, SeqKind seq = SeqKind::List);
  static Value dict() { return Value(std::make_shared<DictObj>()); }
  static Value func(std::string name, NativeFn fn) {
    return Value(std::make_shared<FuncObj>(FuncObj{std::move(name), std::move(fn)}));
  }
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_float() const { return kind_ == Kind::Float; }
  bool is_number() const {
    return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool;
  }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_list() const { return kind_ == Kind::List; }
  bool is_dict() const { return kind_ == Kind::Dict; }
  bool is_func() const { return kind_ == Kind::Func; }
  bool is_namespace() const { return kind_ == Kind::Namespace; }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_float() const { return std::get<double>(v_); }
  // Integer view of int or bool (Python's bool is an int).
  // Raises a Python-style TypeError for other types.
  int64_t int_value() const {
    if (kind_ == Kind::Bool) return as_bool() ? 1 : 0;
    if (kind_ != Kind::Int) rfail("'{}' object cannot be interpreted as an integer", type_name());
    return as_int();
  }
  // Float view of int, bool or float.
  double num_value() const;
  const std::string& str() const { return std::get<std::string>(v_); }  // String only
  const std::string& undefined_hint() const { return std::get<std::string>(v_); }
  const ListObj& list_obj() const { return *std::get<std::shared_ptr<ListObj>>(v_); }
  const std::vector<Value>& items() const { return list_obj().items; }
  const DictObj& dict_obj() const { return *std::get<std::shared_ptr<DictObj>>(v_); }
  const FuncObj& func_obj() const { return *std::get<std::shared_ptr<FuncObj>>(v_); }
  NamespaceObj& ns_obj() const { return *std::get<std::shared_ptr<NamespaceObj>>(v_); }
  const void* identity() const;
  int depth() const;  // container nesting depth, 0 for scalars
  bool has_namespace()
      const;  // is or contains a namespace / loop object  // container pointer, for `is sameas`

  bool truthy() const;
  // Python type name as used in error messages: "str", "dict", "NoneType", ...
  std::string type_name() const;
  // jinja2's object_type_repr: "dict object", "None", ...
  std::string object_type_repr() const;
  // Raises the undefined's error (jinja2's UndefinedError) when this is undefined.
  void require_defined() const {
    if (kind_ == Kind::Undefined) throw RuntimeError(undefined_hint());
  }

 private:
  Kind kind_;
  std::variant<std::monostate, bool, int64_t, double, std::string, std::shared_ptr<ListObj>,
               std::shared_ptr<DictObj>, std::shared_ptr<FuncObj>, std::shared_ptr<NamespaceObj>>
      v_;
};

// Python semantics.
bool py_equal(const Value& a, const Value& b);
// a < b as Python's `<`; raises TypeError-like RuntimeError for unorderable types.
bool py_less(const Value& a, const Value& b);
std::string py_str(const Value& v);   // str(v); undefined -> ""
std::string py_repr(const Value& v);  // repr(v)
std::string py_float_repr(double d);
std::string py_str_repr(std::string_view s);

struct JsonDumpOptions {
  int indent = -1;  // < 0: no indent (None)
  std::string indent_str;
  bool has_indent = false;
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool ensure_ascii = false;
  bool sort_keys = false;
};
// json.dumps(v, ...) as Python writes it; raises for values JSON cannot hold.
std::string json_dumps(const Value& v, const JsonDumpOptions& opt);

// Iterates like Python's iter(): list items, dict keys, string characters; undefined is empty.
std::vector<Value> iterate(const Value& v);
// len(v); raises for values without a length.
int64_t py_len(const Value& v);

// UTF-8 <-> code points. Invalid bytes map to U+DC80+byte (surrogateescape) and back, so any
// byte string round-trips.
std::u32string utf8_decode(std::string_view s);
// Decodes the code point at s[i] (i < s.size()) and advances i past it.
char32_t utf8_next(std::string_view s, size_t& i);
std::string utf8_encode(std::u32string_view s);
void utf8_append(std::string& out, char32_t c);
size_t utf8_length(std::string_view s);
bool py_isspace(char32_t c);
char32_t py_upper(char32_t c);
char32_t py_lower(char32_t c);
bool py_isalpha(char32_t c);
bool py_isdigit(char32_t c);
bool py_isalnum(char32_t c);
bool py_is_word_char(char32_t c);  // regex \w
bool py_isprintable(char32_t c);

}  // namespace tokenmill::jinja
