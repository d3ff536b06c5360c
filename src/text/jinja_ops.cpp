// Operators, attribute / item access and slicing with Python + jinja2 sandbox semantics.
#include <cmath>
#include <limits>

#include "text/jinja_interp.h"

namespace tokenmill::jinja {
namespace {

Value undefined_attr(const Value& obj, const std::string& name) {
  return Value::undefined(fmt::format("{} has no attribute {}", py_str_repr(obj.object_type_repr()),
                                      py_str_repr(name)));
}

Value undefined_item(const Value& obj, const Value& key) {
  if (key.is_string()) return undefined_attr(obj, key.str());
  return Value::undefined(
      fmt::format("{} has no element {}", py_str_repr(obj.object_type_repr()), py_repr(key)));
}

[[noreturn]] void bad_operands(const std::string& op, const Value& a, const Value& b) {
  if (a.is_string() && op == "+") {
    rfail("can only concatenate str (not \"{}\") to str", b.type_name());
  }
  if (a.is_list() && a.list_obj().seq != SeqKind::Generator && op == "+") {
    rfail("can only concatenate {} (not \"{}\") to {}", a.type_name(), b.type_name(),
          a.type_name());
  }
  rfail("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name());
}

[[noreturn]] void overflow() {
  rfail("integer overflow (values beyond 64 bits are not supported)");
}
int64_t add_i(int64_t x, int64_t y) {
  int64_t r = 0;
  if (__builtin_add_overflow(x, y, &r)) overflow();
  return r;
}
int64_t sub_i(int64_t x, int64_t y) {
  int64_t r = 0;
  if (__builtin_sub_overflow(x, y, &r)) overflow();
  return r;
}
int64_t mul_i(int64_t x, int64_t y) {
  int64_t r = 0;
  if (__builtin_mul_overflow(x, y, &r)) overflow();
  return r;
}

double py_fmod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

Value repeat(Interp& in, const Value& seq, int64_t n) {
  if (n <= 0) {
    if (seq.is_string()) return Value(std::string());
    return Value::list({}, seq.list_obj().seq);
  }
  if (seq.is_string()) {
    in.check_size(seq.str().size() * static_cast<size_t>(std::min<int64_t>(n, 1LL << 40)));
    std::string out;
    out.reserve(seq.str().size() * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return Value(std::move(out));
  }
  size_t total = seq.items().size() * static_cast<size_t>(std::min<int64_t>(n, 1LL << 40));
  in.check_size(total * 8);
  in.charge(total);
  std::vector<Value> out;
  out.reserve(total);
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  return Value::list(std::move(out), seq.list_obj().seq);
}

bool is_seq(const Value& v) {
  return v.is_list() && v.list_obj().seq != SeqKind::Generator;
}

}  // namespace

Value Interp::getattr(const Value& obj, const std::string& name) {
  obj.require_defined();
  Value m;
  if (builtin_method(*this, obj, name, m)) return m;
  if (obj.is_dict()) {
    const Value* v = obj.dict_obj().find(std::string_view(name));
    return v ? *v : undefined_attr(obj, name);
  }
  if (obj.is_namespace()) {
    const Value* v = obj.ns_obj().attrs.find(std::string_view(name));
    return v ? *v : undefined_attr(obj, name);
  }
  return undefined_attr(obj, name);
}

Value Interp::getitem(const Value& obj, const Value& key) {
  obj.require_defined();
  if (obj.is_dict()) {
    if (const Value* v = obj.dict_obj().find(key)) return *v;
  } else if ((is_seq(obj) || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.int_value();
    if (obj.is_string()) {
      std::u32string cps = utf8_decode(obj.str());
      auto n = static_cast<int64_t>(cps.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n)
        return Value(utf8_encode(std::u32string_view(&cps[static_cast<size_t>(i)], 1)));
    } else {
      auto n = static_cast<int64_t>(obj.items().size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.items()[static_cast<size_t>(i)];
    }
    return undefined_item(obj, key);
  }
  // jinja2's sandbox falls back to getattr for string keys (x['items'] -> the method).
  if (key.is_string()) {
    Value m;
    if (builtin_method(*this, obj, key.str(), m)) return m;
    if (obj.is_namespace()) {
      if (const Value* v = obj.ns_obj().attrs.find(std::string_view(key.str()))) return *v;
    }
  }
  return undefined_item(obj, key);
}

Value Interp::slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  obj.require_defined();
  auto index = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none()) return std::nullopt;
    if (!(v.is_int() || v.is_bool())) {
      rfail("slice indices must be integers or None or have an __index__ method ({})", what);
    }
    return v.int_value();
  };
  if (!(is_seq(obj) || obj.is_string())) {
    return Value::undefined(fmt::format("{} has no element slice({}, {}, {})",
                                        py_str_repr(obj.object_type_repr()), py_repr(start),
                                        py_repr(stop), py_repr(step)));
  }
  std::optional<int64_t> a = index(start, "start"), b = index(stop, "stop"),
                         c = index(step, "step");
  int64_t st = c.value_or(1);
  if (st == 0) rfail("slice step cannot be zero");
  std::u32string cps;
  int64_t n = 0;
  if (obj.is_string()) {
    cps = utf8_decode(obj.str());
    n = static_cast<int64_t>(cps.size());
  } else {
    n = static_cast<int64_t>(obj.items().size());
  }
  // CPython's PySlice_AdjustIndices.
  auto adjust = [&](std::optional<int64_t> v, int64_t def) {
    if (!v) return def;
    int64_t x = *v;
    if (x < 0) {
      x = x < -n ? (st < 0 ? -1 : 0) : x + n;
    } else if (x >= n) {
      x = st < 0 ? n - 1 : n;
    }
    return x;
  };
  int64_t lo = adjust(a, st > 0 ? 0 : n - 1);
  int64_t hi = adjust(b, st > 0 ? n : -1);
  std::vector<int64_t> picks;
  if (st > 0) {
    for (int64_t i = lo; i < hi; i += st) picks.push_back(i);
  } else {
    for (int64_t i = lo; i > hi; i += st) picks.push_back(i);
  }
  charge(picks.size());
  if (obj.is_string()) {
    std::u32string out;
    for (int64_t i : picks) out.push_back(cps[static_cast<size_t>(i)]);
    return Value(utf8_encode(out));
  }
  std::vector<Value> out;
  out.reserve(picks.size());
  for (int64_t i : picks) out.push_back(obj.items()[static_cast<size_t>(i)]);
  return Value::list(std::move(out), obj.list_obj().seq);
}

Value Interp::binop(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string s = py_str(a);
    std::string t = py_str(b);
    check_size(s.size() + t.size());
    return Value(s + t);
  }
  a.require_defined();
  b.require_defined();
  const bool nums = a.is_number() && b.is_number();
  const bool ints = nums && !a.is_float() && !b.is_float();
  if (op == "+") {
    if (ints) return Value(add_i(a.int_value(), b.int_value()));
    if (nums) return Value(a.num_value() + b.num_value());
    if (a.is_string() && b.is_string()) {
      check_size(a.str().size() + b.str().size());
      return Value(a.str() + b.str());
    }
    if (is_seq(a) && is_seq(b) && a.list_obj().seq == b.list_obj().seq) {
      charge(a.items().size() + b.items().size());
      std::vector<Value> out = a.items();
      out.insert(out.end(), b.items().begin(), b.items().end());
      return Value::list(std::move(out), a.list_obj().seq);
    }
    bad_operands(op, a, b);
  }
  if (op == "-") {
    if (ints) return Value(sub_i(a.int_value(), b.int_value()));
    if (nums) return Value(a.num_value() - b.num_value());
    bad_operands(op, a, b);
  }
  if (op == "*") {
    if (ints) return Value(mul_i(a.int_value(), b.int_value()));
    if (nums) return Value(a.num_value() * b.num_value());
    bool a_int = a.is_int() || a.is_bool();
    bool b_int = b.is_int() || b.is_bool();
    if ((a.is_string() || is_seq(a)) && b_int) return repeat(*this, a, b.int_value());
    if ((b.is_string() || is_seq(b)) && a_int) return repeat(*this, b, a.int_value());
    bad_operands(op, a, b);
  }
  if (op == "/") {
    if (!nums) bad_operands(op, a, b);
    if (b.num_value() == 0) rfail("division by zero");
    return Value(a.num_value() / b.num_value());
  }
  if (op == "//") {
    if (!nums) bad_operands(op, a, b);
    if (ints) {
      int64_t x = a.int_value(), y = b.int_value();
      if (y == 0) rfail("integer division or modulo by zero");
      if (x == std::numeric_limits<int64_t>::min() && y == -1) overflow();
      int64_t q = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
      return Value(q);
    }
    if (b.num_value() == 0) rfail("float floor division by zero");
    return Value(std::floor(a.num_value() / b.num_value()));
  }
  if (op == "%") {
    if (a.is_string()) return Value(percent_format(a.str(), b));
    if (!nums) bad_operands(op, a, b);
    if (ints) {
      int64_t x = a.int_value(), y = b.int_value();
      if (y == 0) rfail("integer division or modulo by zero");
      if (y == -1) return Value(int64_t{0});
      int64_t m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value(m);
    }
    if (b.num_value() == 0) rfail("float modulo");
    return Value(py_fmod(a.num_value(), b.num_value()));
  }
  if (op == "**") {
    if (!nums) bad_operands(op, a, b);
    if (ints && b.int_value() >= 0) {
      int64_t base = a.int_value(), e = b.int_value(), acc = 1;
      while (e > 0) {
        if (e & 1) acc = mul_i(acc, base);
        e >>= 1;
        if (e > 0) base = mul_i(base, base);
      }
      return Value(acc);
    }
    if (a.num_value() == 0 && b.num_value() < 0) {
      rfail("0.0 cannot be raised to a negative power");
    }
    double p = std::pow(a.num_value(), b.num_value());
    if (std::isnan(p) && !std::isnan(a.num_value()) && !std::isnan(b.num_value())) {
      rfail("complex results are not supported");
    }
    return Value(p);
  }
  rfail("unknown operator '{}'", op);
}

bool Interp::contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::Undefined:
      return false;
    case Kind::String:
      if (!item.is_string()) {
        rfail("'in <string>' requires string as left operand, not {}", item.type_name());
      }
      return container.str().find(item.str()) != std::string::npos;
    case Kind::List:
      charge(container.items().size());
      for (const Value& v : container.items()) {
        if (py_equal(v, item)) return true;
      }
      return false;
    case Kind::Dict:
      return container.dict_obj().find(item) != nullptr;
    default:
      rfail("argument of type '{}' is not iterable", container.type_name());
  }
}

bool Interp::compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return py_equal(a, b);
  if (op == "!=") return !py_equal(a, b);
  if (op == "in") return contains(b, a);
  if (op == "not in") return !contains(b, a);
  a.require_defined();
  b.require_defined();
  if (op == "<") return py_less(a, b);
  if (op == ">") return py_less(b, a);
  if (op == "<=") return py_less(a, b) || (!py_less(b, a) && py_equal(a, b));
  if (op == ">=") return py_less(b, a) || (!py_less(a, b) && py_equal(a, b));
  rfail("unknown comparison '{}'", op);
}

// ---- argument binding ------------------------------------------------------------------------

Params::Params(const char* func, CallArgs& args, std::initializer_list<const char*> names)
    : func_(func), args_(args), names_(names) {
  for (const auto& kw : args_.kw) {
    bool found = false;
    for (size_t i = 0; i < names_.size(); ++i) {
      if (kw.first == names_[i]) {
        if (i < args_.pos.size())
          rfail("{}() got multiple values for argument '{}'", func_, kw.first);
        found = true;
      }
    }
    if (!found) rfail("{}() got an unexpected keyword argument '{}'", func_, kw.first);
  }
}

const Value* Params::get(size_t i) const {
  if (i < args_.pos.size()) return &args_.pos[i];
  for (const auto& kw : args_.kw) {
    if (i < names_.size() && kw.first == names_[i]) return &kw.second;
  }
  return nullptr;
}

size_t Params::extra_positional() const {
  return args_.pos.size() > names_.size() ? args_.pos.size() - names_.size() : 0;
}

// ---- printf-style formatting -----------------------------------------------------------------

std::string percent_format(const std::string& fmt, const Value& args) {
  std::vector<Value> list;
  const DictObj* mapping = args.is_dict() ? &args.dict_obj() : nullptr;
  if (args.is_list() && args.list_obj().seq == SeqKind::Tuple) {
    list = args.items();
  } else {
    list.push_back(args);
  }
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) rfail("incomplete format");
    const Value* arg = nullptr;
    if (fmt[i] == '(') {
      size_t close = fmt.find(')', i);
      if (close == std::string::npos || !mapping) rfail("format requires a mapping");
      arg = mapping->find(std::string_view(fmt).substr(i + 1, close - i - 1));
      if (!arg) rfail("KeyError: {}", py_str_repr(fmt.substr(i + 1, close - i - 1)));
      i = close + 1;
    }
    std::string spec;
    while (i < fmt.size() &&
           std::string_view("-+ #0123456789.").find(fmt[i]) != std::string_view::npos) {
      spec += fmt[i++];
    }
    if (i >= fmt.size()) rfail("incomplete format");
    char conv = fmt[i];
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (!arg) {
      if (next >= list.size()) rfail("not enough arguments for format string");
      arg = &list[next++];
    }
    if (spec.size() > 16) rfail("format specifier too long");
    switch (conv) {
      case 's': {
        std::string v = py_str(*arg);
        size_t width = 0;
        for (char ch : spec) {
          if (ch >= '0' && ch <= '9') width = width * 10 + static_cast<size_t>(ch - '0');
          if (ch == '.') break;
        }
        size_t len = utf8_length(v);
        std::string pad = width > len ? std::string(width - len, ' ') : std::string();
        out += spec.find('-') != std::string::npos ? v + pad : pad + v;
        break;
      }
      case 'r':
        out += py_repr(*arg);
        break;
      case 'd':
      case 'i':
        if (!arg->is_number())
          rfail("%{} format: a real number is required, not {}", conv, arg->type_name());
        out += std::to_string(arg->is_float() ? static_cast<int64_t>(std::trunc(arg->as_float()))
                                              : arg->int_value());
        break;
      case 'f':
      case 'e':
      case 'g': {
        if (!arg->is_number()) rfail("must be real number, not {}", arg->type_name());
        char buf[128];
        std::string f = "%" + spec + conv;
        std::snprintf(buf, sizeof(buf), f.c_str(), arg->num_value());
        out += buf;
        break;
      }
      default:
        rfail("unsupported format character '{}'", conv);
    }
  }
  if (!mapping && next < list.size()) rfail("not all arguments converted during string formatting");
  return out;
}

}  // namespace tokenmill::jinja
