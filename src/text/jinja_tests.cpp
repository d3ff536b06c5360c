// jinja2's built-in tests (`x is defined`, `x is string`, ...).
#include <string_view>

#include "text/jinja_interp.h"
#include "text/jinja_parser.h"

namespace tokenmill::jinja {
namespace {

const Value& arg(CallArgs& a, const char* test) {
  if (a.pos.empty()) {
    if (!a.kw.empty()) return a.kw[0].second;
    rfail("test '{}' takes exactly one argument", test);
  }
  return a.pos[0];
}

bool t_defined(Interp&, const Value& v, CallArgs&) {
  return !v.is_undefined();
}
bool t_undefined(Interp&, const Value& v, CallArgs&) {
  return v.is_undefined();
}
bool t_none(Interp&, const Value& v, CallArgs&) {
  return v.is_none();
}
bool t_string(Interp&, const Value& v, CallArgs&) {
  return v.is_string();
}
bool t_mapping(Interp&, const Value& v, CallArgs&) {
  return v.is_dict();
}
bool t_number(Interp&, const Value& v, CallArgs&) {
  return v.is_number();
}
bool t_integer(Interp&, const Value& v, CallArgs&) {
  return v.is_int();
}
bool t_float(Interp&, const Value& v, CallArgs&) {
  return v.is_float();
}
bool t_boolean(Interp&, const Value& v, CallArgs&) {
  return v.is_bool();
}
bool t_true(Interp&, const Value& v, CallArgs&) {
  return v.is_bool() && v.as_bool();
}
bool t_false(Interp&, const Value& v, CallArgs&) {
  return v.is_bool() && !v.as_bool();
}
bool t_callable(Interp&, const Value& v, CallArgs&) {
  return v.is_func();
}
bool t_escaped(Interp&, const Value&, CallArgs&) {
  return false;
}
// Python: has __iter__ (undefined has one and iterates empty).
bool t_iterable(Interp&, const Value& v, CallArgs&) {
  return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
}
// Python: len() and __getitem__ work; generators have neither.
bool t_sequence(Interp&, const Value& v, CallArgs&) {
  return v.is_undefined() || v.is_string() || v.is_dict() ||
         (v.is_list() && v.list_obj().seq != SeqKind::Generator);
}
bool t_in(Interp& in, const Value& v, CallArgs& a) {
  return in.contains(arg(a, "in"), v);
}
bool t_eq(Interp& in, const Value& v, CallArgs& a) {
  return in.compare("==", v, arg(a, "eq"));
}
bool t_ne(Interp& in, const Value& v, CallArgs& a) {
  return in.compare("!=", v, arg(a, "ne"));
}
bool t_lt(Interp& in, const Value& v, CallArgs& a) {
  return in.compare("<", v, arg(a, "lt"));
}
bool t_le(Interp& in, const Value& v, CallArgs& a) {
  return in.compare("<=", v, arg(a, "le"));
}
bool t_gt(Interp& in, const Value& v, CallArgs& a) {
  return in.compare(">", v, arg(a, "gt"));
}
bool t_ge(Interp& in, const Value& v, CallArgs& a) {
  return in.compare(">=", v, arg(a, "ge"));
}
bool t_sameas(Interp&, const Value& v, CallArgs& a) {
  const Value& o = arg(a, "sameas");
  if (v.identity() || o.identity()) return v.identity() == o.identity();
  if (v.kind() != o.kind()) return false;
  return py_equal(v, o);
}
int64_t int_of(Interp& in, const Value& v, const char* test) {
  (void)in;
  v.require_defined();
  if (!(v.is_int() || v.is_bool()))
    rfail("test '{}' needs an integer, got {}", test, v.type_name());
  return v.int_value();
}
bool t_odd(Interp& in, const Value& v, CallArgs&) {
  return int_of(in, v, "odd") % 2 != 0;
}
bool t_even(Interp& in, const Value& v, CallArgs&) {
  return int_of(in, v, "even") % 2 == 0;
}
bool t_divisibleby(Interp& in, const Value& v, CallArgs& a) {
  int64_t d = int_of(in, arg(a, "divisibleby"), "divisibleby");
  if (d == 0) rfail("integer division or modulo by zero");
  if (d == -1) return true;
  return int_of(in, v, "divisibleby") % d == 0;
}
bool t_lower(Interp&, const Value& v, CallArgs&) {
  if (!v.is_string()) return false;
  bool cased = false;
  for (char32_t c : utf8_decode(v.str())) {
    if (py_upper(c) != c)
      cased = true;
    else if (py_lower(c) != c)
      return false;
  }
  return cased;
}
bool t_upper(Interp&, const Value& v, CallArgs&) {
  if (!v.is_string()) return false;
  bool cased = false;
  for (char32_t c : utf8_decode(v.str())) {
    if (py_lower(c) != c)
      cased = true;
    else if (py_upper(c) != c)
      return false;
  }
  return cased;
}
bool t_filter(Interp&, const Value& v, CallArgs&) {
  return v.is_string() && find_filter(v.str()) != nullptr;
}
bool t_test(Interp&, const Value& v, CallArgs&) {
  return v.is_string() && find_test(v.str()) != nullptr;
}

struct TestEntry {
  std::string_view name;
  TestFn fn;
};

constexpr TestEntry kTests[] = {
    {"defined", t_defined},
    {"undefined", t_undefined},
    {"none", t_none},
    {"string", t_string},
    {"mapping", t_mapping},
    {"number", t_number},
    {"integer", t_integer},
    {"float", t_float},
    {"boolean", t_boolean},
    {"true", t_true},
    {"false", t_false},
    {"callable", t_callable},
    {"escaped", t_escaped},
    {"iterable", t_iterable},
    {"sequence", t_sequence},
    {"in", t_in},
    {"eq", t_eq},
    {"equalto", t_eq},
    {"==", t_eq},
    {"ne", t_ne},
    {"!=", t_ne},
    {"lt", t_lt},
    {"lessthan", t_lt},
    {"<", t_lt},
    {"le", t_le},
    {"<=", t_le},
    {"gt", t_gt},
    {"greaterthan", t_gt},
    {">", t_gt},
    {"ge", t_ge},
    {">=", t_ge},
    {"sameas", t_sameas},
    {"odd", t_odd},
    {"even", t_even},
    {"divisibleby", t_divisibleby},
    {"lower", t_lower},
    {"upper", t_upper},
    {"filter", t_filter},
    {"test", t_test},
};

}  // namespace

TestFn find_test(std::string_view name) {
  for (const auto& t : kTests) {
    if (t.name == name) return t.fn;
  }
  return nullptr;
}

}  // namespace tokenmill::jinja
