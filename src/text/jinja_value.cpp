#include "text/jinja_value.h"

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

namespace tokenmill::jinja {

const Value* DictObj::find(const Value& key) const {
  for (const auto& kv : items) {
    if (py_equal(kv.first, key)) return &kv.second;
  }
  return nullptr;
}

const Value* DictObj::find(std::string_view key) const {
  for (const auto& kv : items) {
    if (kv.first.is_string() && kv.first.str() == key) return &kv.second;
  }
  return nullptr;
}

void DictObj::set(Value key, Value value) {
  int d = std::max(key.depth(), value.depth()) + 1;
  if (d > kMaxValueDepth) rfail("values nested more than {} levels deep", kMaxValueDepth);
  depth = std::max(depth, d);
  has_ns = has_ns || key.has_namespace() || value.has_namespace();
  for (auto& kv : items) {
    if (py_equal(kv.first, key)) {
      kv.second = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

Value Value::list(std::vector<Value> items, SeqKind seq) {
  auto l = std::make_shared<ListObj>();
  for (const auto& v : items) {
    l->depth = std::max(l->depth, v.depth() + 1);
    l->has_ns = l->has_ns || v.has_namespace();
  }
  if (l->depth > kMaxValueDepth) rfail("values nested more than {} levels deep", kMaxValueDepth);
  l->items = std::move(items);
  l->seq = seq;
  return Value(std::move(l));
}

int Value::depth() const {
  switch (kind_) {
    case Kind::List:
      return list_obj().depth;
    case Kind::Dict:
      return dict_obj().depth;
    case Kind::Namespace:
      return ns_obj().attrs.depth;
    default:
      return 0;
  }
}

bool Value::has_namespace() const {
  switch (kind_) {
    case Kind::List:
      return list_obj().has_ns;
    case Kind::Dict:
      return dict_obj().has_ns;
    case Kind::Namespace:
      return true;
    default:
      return false;
  }
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Value(static_cast<int64_t>(u));
      }
      return Value(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto d = std::make_shared<DictObj>();
      d->items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) {
        Value v = from_json(it.value());
        d->depth = std::max(d->depth, v.depth() + 1);
        d->items.emplace_back(Value(it.key()), std::move(v));
      }
      if (d->depth > kMaxValueDepth)
        rfail("values nested more than {} levels deep", kMaxValueDepth);
      return Value(std::move(d));
    }
    default:
      return none();  // binary / discarded: not produced by JSON parsing
  }
}

double Value::num_value() const {
  switch (kind_) {
    case Kind::Bool:
      return as_bool() ? 1.0 : 0.0;
    case Kind::Int:
      return static_cast<double>(as_int());
    case Kind::Float:
      return as_float();
    default:
      rfail("expected a number, got {}", type_name());
  }
}

const void* Value::identity() const {
  switch (kind_) {
    case Kind::List:
      return std::get<std::shared_ptr<ListObj>>(v_).get();
    case Kind::Dict:
      return std::get<std::shared_ptr<DictObj>>(v_).get();
    case Kind::Func:
      return std::get<std::shared_ptr<FuncObj>>(v_).get();
    case Kind::Namespace:
      return std::get<std::shared_ptr<NamespaceObj>>(v_).get();
    default:
      return nullptr;
  }
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None:
      return false;
    case Kind::Bool:
      return as_bool();
    case Kind::Int:
      return as_int() != 0;
    case Kind::Float:
      return as_float() != 0.0;
    case Kind::String:
      return !str().empty();
    case Kind::List:
      return list_obj().seq == SeqKind::Generator || !items().empty();
    case Kind::Dict:
      return !dict_obj().items.empty();
    default:
      return true;
  }
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined:
      return "Undefined";
    case Kind::None:
      return "NoneType";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::Float:
      return "float";
    case Kind::String:
      return "str";
    case Kind::List:
      switch (list_obj().seq) {
        case SeqKind::List:
          return "list";
        case SeqKind::Tuple:
          return "tuple";
        default:
          return "generator";
      }
    case Kind::Dict:
      return "dict";
    case Kind::Func:
      return "function";
    case Kind::Namespace:
      return ns_obj().is_loop ? "LoopContext" : "Namespace";
  }
  return "object";
}

std::string Value::object_type_repr() const {
  if (kind_ == Kind::None) return "None";
  if (kind_ == Kind::Undefined) return "jinja2.runtime.Undefined object";
  if (kind_ == Kind::Namespace) {
    return ns_obj().is_loop ? "jinja2.runtime.LoopContext object" : "jinja2.utils.Namespace object";
  }
  return type_name() + " object";
}

namespace {

int type_rank(const Value& v) {
  return v.is_number() ? 0 : static_cast<int>(v.kind()) + 1;
}

bool seq_equal(const Value& a, const Value& b) {
  const auto& x = a.items();
  const auto& y = b.items();
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!py_equal(x[i], y[i])) return false;
  }
  return true;
}

}  // namespace

bool py_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.num_value() == b.num_value();
    return a.int_value() == b.int_value();
  }
  if (type_rank(a) != type_rank(b)) return false;
  switch (a.kind()) {
    case Kind::Undefined:
    case Kind::None:
      return true;
    case Kind::String:
      return a.str() == b.str();
    case Kind::List:
      if (a.list_obj().seq != b.list_obj().seq) return false;
      if (a.list_obj().seq == SeqKind::Generator) return a.identity() == b.identity();
      return seq_equal(a, b);
    case Kind::Dict: {
      const auto& x = a.dict_obj().items;
      if (x.size() != b.dict_obj().items.size()) return false;
      for (const auto& kv : x) {
        const Value* o = b.dict_obj().find(kv.first);
        if (!o || !py_equal(kv.second, *o)) return false;
      }
      return true;
    }
    default:
      return a.identity() == b.identity();
  }
}

bool py_less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.num_value() < b.num_value();
    return a.int_value() < b.int_value();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();
  if (a.is_list() && b.is_list() && a.list_obj().seq == b.list_obj().seq &&
      a.list_obj().seq != SeqKind::Generator) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!py_equal(x[i], y[i])) return py_less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  rfail("'<' not supported between instances of '{}' and '{}'", a.type_name(), b.type_name());
}

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  // sci: [-]D[.DDD]e(+|-)XX
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t epos = sci.find('e');
  std::string mant = sci.substr(0, epos);
  int exp = std::stoi(sci.substr(epos + 1));
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits.push_back(c);
  }
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    // Python's repr switches to exponent form below 1e-4 (exp < -4) and from 1e16.
    if (exp < 0) {
      out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(exp) + 1) + "." +
             digits.substr(static_cast<size_t>(exp) + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  out += exp < 0 ? "e-" : "e+";
  int ax = exp < 0 ? -exp : exp;
  if (ax < 10) out += "0";
  out += std::to_string(ax);
  return out;
}

std::string py_str_repr(std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos;
  bool has_double = s.find('"') != std::string_view::npos;
  char q = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, q);
  for (char32_t c : utf8_decode(s)) {
    if (c == static_cast<char32_t>(q) || c == U'\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == U'\n') {
      out += "\\n";
    } else if (c == U'\r') {
      out += "\\r";
    } else if (c == U'\t') {
      out += "\\t";
    } else if (c >= 0xDC80 && c <= 0xDCFF) {
      out += fmt::format("\\udc{:02x}", static_cast<unsigned>(c - 0xDC00));
    } else if (c < 0x20 || c == 0x7f || (c >= 0x80 && !py_isprintable(c))) {
      if (c <= 0xff) {
        out += fmt::format("\\x{:02x}", static_cast<unsigned>(c));
      } else if (c <= 0xffff) {
        out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
      } else {
        out += fmt::format("\\U{:08x}", static_cast<unsigned>(c));
      }
    } else {
      utf8_append(out, c);
    }
  }
  out += q;
  return out;
}

namespace {

void repr_into(std::string& out, const Value& v) {
  if (v.is_string()) {
    out += py_str_repr(v.str());
  } else {
    out += py_str(v);
  }
}

}  // namespace

std::string py_str(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined:
      return "";
    case Kind::None:
      return "None";
    case Kind::Bool:
      return v.as_bool() ? "True" : "False";
    case Kind::Int:
      return std::to_string(v.as_int());
    case Kind::Float:
      return py_float_repr(v.as_float());
    case Kind::String:
      return v.str();
    case Kind::List: {
      const auto& l = v.list_obj();
      if (l.seq == SeqKind::Generator) return "<generator object>";
      std::string out = l.seq == SeqKind::Tuple ? "(" : "[";
      for (size_t i = 0; i < l.items.size(); ++i) {
        if (i) out += ", ";
        repr_into(out, l.items[i]);
      }
      if (l.seq == SeqKind::Tuple && l.items.size() == 1) out += ",";
      out += l.seq == SeqKind::Tuple ? ")" : "]";
      return out;
    }
    case Kind::Dict: {
      std::string out = "{";
      bool first = true;
      for (const auto& kv : v.dict_obj().items) {
        if (!first) out += ", ";
        first = false;
        repr_into(out, kv.first);
        out += ": ";
        repr_into(out, kv.second);
      }
      return out + "}";
    }
    case Kind::Func:
      return "<function " + v.func_obj().name + ">";
    case Kind::Namespace: {
      if (v.ns_obj().is_loop) return "<LoopContext>";
      Value d(std::make_shared<DictObj>(v.ns_obj().attrs));
      return "<Namespace " + py_str(d) + ">";
    }
  }
  return "";
}

std::string py_repr(const Value& v) {
  std::string out;
  repr_into(out, v);
  return out;
}

namespace {

void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  for (char32_t c : utf8_decode(s)) {
    switch (c) {
      case U'"':
        out += "\\\"";
        break;
      case U'\\':
        out += "\\\\";
        break;
      case U'\n':
        out += "\\n";
        break;
      case U'\r':
        out += "\\r";
        break;
      case U'\t':
        out += "\\t";
        break;
      case U'\b':
        out += "\\b";
        break;
      case U'\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || (ensure_ascii && c >= 0x7f)) {
          if (c > 0xffff) {
            char32_t v = c - 0x10000;
            out += fmt::format("\\u{:04x}\\u{:04x}", static_cast<unsigned>(0xD800 + (v >> 10)),
                               static_cast<unsigned>(0xDC00 + (v & 0x3ff)));
          } else {
            out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
          }
        } else {
          utf8_append(out, c);
        }
    }
  }
  out += '"';
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
  return py_float_repr(d);
}

void dump(std::string& out, const Value& v, const JsonDumpOptions& o, int level) {
  if (level > 512) rfail("maximum recursion depth exceeded while encoding a JSON object");
  auto newline = [&](int lvl) {
    out += '\n';
    for (int i = 0; i < lvl; ++i) out += o.indent_str;
  };
  switch (v.kind()) {
    case Kind::None:
      out += "null";
      return;
    case Kind::Bool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Kind::Int:
      out += std::to_string(v.as_int());
      return;
    case Kind::Float:
      out += json_float(v.as_float());
      return;
    case Kind::String:
      json_string(out, v.str(), o.ensure_ascii);
      return;
    case Kind::List: {
      if (v.list_obj().seq == SeqKind::Generator) break;
      const auto& items = v.items();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += o.item_sep;
        if (o.has_indent) newline(level + 1);
        dump(out, items[i], o, level + 1);
      }
      if (o.has_indent) newline(level);
      out += ']';
      return;
    }
    case Kind::Dict: {
      std::vector<std::pair<Value, Value>> items = v.dict_obj().items;
      if (items.empty()) {
        out += "{}";
        return;
      }
      if (o.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto& a, const auto& b) { return py_less(a.first, b.first); });
      }
      out += '{';
      bool first = true;
      for (const auto& kv : items) {
        if (!first) out += o.item_sep;
        first = false;
        if (o.has_indent) newline(level + 1);
        const Value& k = kv.first;
        if (k.is_string()) {
          json_string(out, k.str(), o.ensure_ascii);
        } else if (k.is_bool()) {
          out += k.as_bool() ? "\"true\"" : "\"false\"";
        } else if (k.is_int()) {
          out += "\"" + std::to_string(k.as_int()) + "\"";
        } else if (k.is_float()) {
          out += "\"" + json_float(k.as_float()) + "\"";
        } else if (k.is_none()) {
          out += "\"null\"";
        } else {
          rfail("keys must be str, int, float, bool or None, not {}", k.type_name());
        }
        out += o.key_sep;
        dump(out, kv.second, o, level + 1);
      }
      if (o.has_indent) newline(level);
      out += '}';
      return;
    }
    default:
      break;
  }
  rfail("Object of type {} is not JSON serializable", v.type_name());
}

}  // namespace

std::string json_dumps(const Value& v, const JsonDumpOptions& opt) {
  std::string out;
  dump(out, v, opt, 0);
  return out;
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined:
      return {};
    case Kind::String: {
      std::vector<Value> out;
      std::u32string cps = utf8_decode(v.str());
      out.reserve(cps.size());
      for (char32_t c : cps) out.emplace_back(utf8_encode(std::u32string_view(&c, 1)));
      return out;
    }
    case Kind::List:
      return v.items();
    case Kind::Dict: {
      std::vector<Value> out;
      out.reserve(v.dict_obj().items.size());
      for (const auto& kv : v.dict_obj().items) out.push_back(kv.first);
      return out;
    }
    default:
      rfail("'{}' object is not iterable", v.type_name());
  }
}

int64_t py_len(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined:
      return 0;
    case Kind::String:
      return static_cast<int64_t>(utf8_length(v.str()));
    case Kind::List:
      if (v.list_obj().seq == SeqKind::Generator) break;
      return static_cast<int64_t>(v.items().size());
    case Kind::Dict:
      return static_cast<int64_t>(v.dict_obj().items.size());
    default:
      break;
  }
  rfail("object of type '{}' has no len()", v.type_name());
}

// ---- UTF-8 and character classes ------------------------------------------------------------

char32_t utf8_next(std::string_view s, size_t& i) {
  auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) {
    ++i;
    return b;
  }
  utf8proc_int32_t cp = -1;
  utf8proc_ssize_t n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                        static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
  if (n <= 0 || cp < 0) {
    ++i;
    return 0xDC00 + b;  // surrogateescape
  }
  i += static_cast<size_t>(n);
  return static_cast<char32_t>(cp);
}

std::u32string utf8_decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) out.push_back(utf8_next(s, i));
  return out;
}

void utf8_append(std::string& out, char32_t c) {
  if (c >= 0xDC80 && c <= 0xDCFF) {
    out.push_back(static_cast<char>(c - 0xDC00));
    return;
  }
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string utf8_encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) utf8_append(out, c);
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0, i = 0;
  while (i < s.size()) {
    utf8_next(s, i);
    ++n;
  }
  return n;
}

namespace {
utf8proc_category_t category(char32_t c) {
  if (c > 0x10FFFF) return UTF8PROC_CATEGORY_CN;
  return utf8proc_category(static_cast<utf8proc_int32_t>(c));
}
}  // namespace

bool py_isspace(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f);
  return c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 ||
         c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

char32_t py_upper(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return c;
  return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c)));
}

char32_t py_lower(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return c;
  return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
}

bool py_isalpha(char32_t c) {
  if (c < 0x80) return (c | 32) >= 'a' && (c | 32) <= 'z';
  auto k = category(c);
  return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT ||
         k == UTF8PROC_CATEGORY_LM || k == UTF8PROC_CATEGORY_LO;
}

bool py_isdigit(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return category(c) == UTF8PROC_CATEGORY_ND;
}

bool py_isalnum(char32_t c) {
  if (py_isalpha(c)) return true;
  auto k = category(c);
  return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

bool py_is_word_char(char32_t c) {
  return c == '_' || py_isalnum(c);
}

bool py_isprintable(char32_t c) {
  if (c == ' ') return true;
  auto k = category(c);
  return !(k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CS ||
           k == UTF8PROC_CATEGORY_CO || k == UTF8PROC_CATEGORY_CN || k == UTF8PROC_CATEGORY_ZL ||
           k == UTF8PROC_CATEGORY_ZP || k == UTF8PROC_CATEGORY_ZS);
}

}  // namespace tokenmill::jinja
