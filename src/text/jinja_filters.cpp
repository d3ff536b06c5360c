// jinja2's built-in filters (the ones chat templates use) plus HF's tojson override.
// Autoescape is off in HF's environment, so safe/escape produce plain strings.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string_view>

#include "text/jinja_interp.h"
#include "text/jinja_parser.h"
#include "util/escape.h"

namespace tokenmill::jinja {
namespace {

std::vector<std::string> attribute_parts(const Value& attr) {
  std::vector<std::string> parts;
  if (attr.is_none() || attr.is_undefined()) return parts;
  if (!attr.is_string()) return {"\x01" + py_str(attr)};  // integer attribute, see get_path
  std::string s = attr.str();
  size_t b = 0;
  while (true) {
    size_t e = s.find('.', b);
    parts.push_back(s.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  return parts;
}

// make_attrgetter: dotted path, all-digit parts looked up as integers.
Value get_path(Interp& in, Value item, const std::vector<std::string>& parts, const Value* def) {
  for (const std::string& p : parts) {
    bool digits =
        !p.empty() && std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!p.empty() && p[0] == '\x01') {
      item =
          in.getitem(item, Value(static_cast<int64_t>(std::strtoll(p.c_str() + 1, nullptr, 10))));
    } else if (digits && p.size() < 18) {
      item = in.getitem(item, Value(static_cast<int64_t>(std::stoll(p))));
    } else {
      item = in.getitem(item, Value(p));
    }
    if (def && !def->is_none() && item.is_undefined()) item = *def;
  }
  return item;
}

Value lower_if_str(const Value& v) {
  if (!v.is_string()) return v;
  std::u32string c = utf8_decode(v.str());
  for (char32_t& ch : c) ch = py_lower(ch);
  return Value(utf8_encode(c));
}

std::vector<Value> items_of(Interp& in, const Value& v) {
  std::vector<Value> items = iterate(v);
  in.charge(items.size());
  return items;
}

Value f_abs(Interp&, const Value& v, CallArgs& a) {
  Params p("abs", a, {});
  v.require_defined();
  if (v.is_float()) return Value(std::fabs(v.as_float()));
  if (v.is_int() || v.is_bool()) {
    int64_t x = v.int_value();
    if (x == INT64_MIN) rfail("integer overflow");
    return Value(x < 0 ? -x : x);
  }
  rfail("bad operand type for abs(): '{}'", v.type_name());
}

// Python getattr only (methods), never dict keys: jinja2's do_attr.
Value f_attr(Interp& in, const Value& v, CallArgs& a) {
  Params p("attr", a, {"name"});
  if (!p.get(0)) rfail("attr() missing required argument 'name'");
  std::string name = py_str(*p.get(0));
  v.require_defined();
  Value m;
  if (builtin_method(in, v, name, m)) return m;
  if (v.is_namespace()) {
    if (const Value* x = v.ns_obj().attrs.find(std::string_view(name))) return *x;
  }
  return Value::undefined(
      fmt::format("{} has no attribute {}", py_str_repr(v.object_type_repr()), py_str_repr(name)));
}

Value f_capitalize(Interp&, const Value& v, CallArgs& a) {
  Params p("capitalize", a, {});
  std::u32string c = utf8_decode(py_str(v));
  for (size_t i = 0; i < c.size(); ++i) c[i] = i == 0 ? py_upper(c[i]) : py_lower(c[i]);
  return Value(utf8_encode(c));
}

Value f_center(Interp& in, const Value& v, CallArgs& a) {
  Params p("center", a, {"width"});
  int64_t width = p.get(0) ? p.get(0)->int_value() : 80;
  std::string s = py_str(v);
  auto len = static_cast<int64_t>(utf8_length(s));
  if (width <= len) return Value(s);
  in.check_size(static_cast<size_t>(width));
  int64_t total = width - len;
  // CPython: left = total/2 + (total & width & 1)
  int64_t left = total / 2 + (total & width & 1);
  return Value(std::string(static_cast<size_t>(left), ' ') + s +
               std::string(static_cast<size_t>(total - left), ' '));
}

Value f_default(Interp&, const Value& v, CallArgs& a) {
  Params p("default", a, {"default_value", "boolean"});
  bool boolean = p.get(1) && p.get(1)->truthy();
  if (v.is_undefined() || (boolean && !v.truthy())) return p.get_or(0, Value(""));
  return v;
}

Value f_dictsort(Interp& in, const Value& v, CallArgs& a) {
  Params p("dictsort", a, {"case_sensitive", "by", "reverse"});
  v.require_defined();
  if (!v.is_dict()) rfail("'{}' object has no attribute 'items'", v.type_name());
  bool cs = p.get(0) && p.get(0)->truthy();
  std::string by = p.get(1) && p.get(1)->is_string() ? p.get(1)->str() : "key";
  if (by != "key" && by != "value") rfail("You can only sort by either \"key\" or \"value\"");
  bool rev = p.get(2) && p.get(2)->truthy();
  std::vector<std::pair<Value, Value>> items = v.dict_obj().items;
  in.charge(items.size() * 4);
  auto key = [&](const std::pair<Value, Value>& kv) {
    const Value& x = by == "key" ? kv.first : kv.second;
    return cs ? x : lower_if_str(x);
  };
  std::stable_sort(items.begin(), items.end(), [&](const auto& x, const auto& y) {
    return rev ? py_less(key(y), key(x)) : py_less(key(x), key(y));
  });
  std::vector<Value> out;
  for (auto& kv : items) out.push_back(Value::list({kv.first, kv.second}, SeqKind::Tuple));
  return Value::list(std::move(out));
}

Value f_escape(Interp&, const Value& v, CallArgs& a) {
  Params p("escape", a, {});
  return Value(html_escape(py_str(v)));
}

Value f_first(Interp&, const Value& v, CallArgs& a) {
  Params p("first", a, {});
  std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value f_last(Interp&, const Value& v, CallArgs& a) {
  Params p("last", a, {});
  if (v.is_list() && v.list_obj().seq == SeqKind::Generator) {
    rfail("'generator' object is not reversible");
  }
  std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

// Python float(str): decimal literals, inf/nan, surrounding whitespace, underscores between digits.
bool parse_py_float(const std::string& s, double& out) {
  std::string t;
  for (char c : s) {
    if (c != '_') t += c;
  }
  size_t b = t.find_first_not_of(" \t\n\r\f\v");
  size_t e = t.find_last_not_of(" \t\n\r\f\v");
  if (b == std::string::npos) return false;
  t = t.substr(b, e - b + 1);
  if (t.find_first_not_of("0123456789+-.eEinfatyINFATY") != std::string::npos) return false;
  char* end = nullptr;
  out = std::strtod(t.c_str(), &end);
  return end == t.c_str() + t.size();
}

Value f_float(Interp&, const Value& v, CallArgs& a) {
  Params p("float", a, {"default"});
  Value def = p.get_or(0, Value(0.0));
  if (v.is_number()) return Value(v.num_value());
  if (v.is_string()) {
    double d = 0;
    return parse_py_float(v.str(), d) ? Value(d) : def;
  }
  return def;
}

Value f_int(Interp&, const Value& v, CallArgs& a) {
  Params p("int", a, {"default", "base"});
  Value def = p.get_or(0, Value(int64_t{0}));
  int64_t base = p.get(1) ? p.get(1)->int_value() : 10;
  if (v.is_int() || v.is_bool()) return Value(v.int_value());
  auto from_double = [&](double d) -> Value {
    if (std::isnan(d) || std::isinf(d)) return def;
    if (d >= 9.2e18 || d <= -9.2e18)
      rfail("integer overflow (values beyond 64 bits are not supported)");
    return Value(static_cast<int64_t>(std::trunc(d)));
  };
  if (v.is_float()) return from_double(v.as_float());
  if (v.is_string()) {
    std::string t;
    for (char c : v.str()) {
      if (c != '_') t += c;
    }
    size_t b = t.find_first_not_of(" \t\n\r\f\v");
    size_t e = t.find_last_not_of(" \t\n\r\f\v");
    if (b != std::string::npos) {
      t = t.substr(b, e - b + 1);
      std::string body = t;
      bool neg = false;
      if (!body.empty() && (body[0] == '+' || body[0] == '-')) {
        neg = body[0] == '-';
        body = body.substr(1);
      }
      int bs = static_cast<int>(base);
      if (body.size() > 2 && body[0] == '0') {
        char k = static_cast<char>(body[1] | 32);
        int pb = k == 'x' ? 16 : k == 'o' ? 8 : k == 'b' ? 2 : 0;
        if (pb && (bs == pb || bs == 0)) {
          bs = pb;
          body = body.substr(2);
        }
      }
      if (bs == 0) bs = 10;
      if (bs >= 2 && bs <= 36 && !body.empty()) {
        int64_t acc = 0;
        bool ok = true;
        for (char c : body) {
          int d = (c >= '0' && c <= '9')                 ? c - '0'
                  : ((c | 32) >= 'a' && (c | 32) <= 'z') ? (c | 32) - 'a' + 10
                                                         : 99;
          if (d >= bs || __builtin_mul_overflow(acc, bs, &acc) ||
              __builtin_add_overflow(acc, d, &acc)) {
            ok = false;
            break;
          }
        }
        if (ok) return Value(neg ? -acc : acc);
      }
    }
    double d = 0;
    if (parse_py_float(v.str(), d)) return from_double(d);
  }
  return def;
}

Value f_indent(Interp& in, const Value& v, CallArgs& a) {
  Params p("indent", a, {"width", "first", "blank"});
  v.require_defined();
  std::string ind;
  const Value* w = p.get(0);
  if (w && w->is_string()) {
    ind = w->str();
  } else {
    int64_t n = w ? w->int_value() : 4;
    if (n > 0) {
      in.check_size(static_cast<size_t>(n));
      ind = std::string(static_cast<size_t>(n), ' ');
    }
  }
  bool first = p.get(1) && p.get(1)->truthy();
  bool blank = p.get(2) && p.get(2)->truthy();
  std::string s = py_str(v) + "\n";
  std::vector<std::string> lines;  // str.splitlines on \n, \r\n, \r
  size_t b = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\n' || s[i] == '\r') {
      lines.push_back(s.substr(b, i - b));
      if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
      b = i + 1;
    }
  }
  if (b < s.size()) lines.push_back(s.substr(b));
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += "\n";
    if (i > 0 && (blank || !lines[i].empty())) out += ind;
    out += lines[i];
    in.check_size(out.size());
  }
  if (first) out = ind + out;
  return Value(out);
}

Value f_items(Interp& in, const Value& v, CallArgs& a) {
  Params p("items", a, {});
  if (v.is_undefined()) return Value::list({}, SeqKind::Generator);
  if (!v.is_dict()) rfail("Can only get item pairs from a mapping.");
  std::vector<Value> out;
  in.charge(v.dict_obj().items.size());
  for (const auto& kv : v.dict_obj().items)
    out.push_back(Value::list({kv.first, kv.second}, SeqKind::Tuple));
  return Value::list(std::move(out), SeqKind::Generator);
}

Value f_join(Interp& in, const Value& v, CallArgs& a) {
  Params p("join", a, {"d", "attribute"});
  std::string sep = p.get(0) ? py_str(*p.get(0)) : "";
  std::vector<std::string> parts = {};
  std::vector<std::string> attr =
      p.get(1) ? attribute_parts(*p.get(1)) : std::vector<std::string>{};
  std::string out;
  bool first = true;
  for (const Value& item : items_of(in, v)) {
    if (!first) out += sep;
    first = false;
    out += py_str(attr.empty() ? item : get_path(in, item, attr, nullptr));
    in.check_size(out.size());
  }
  return Value(out);
}

Value f_length(Interp&, const Value& v, CallArgs& a) {
  Params p("length", a, {});
  return Value(py_len(v));
}

Value f_list(Interp& in, const Value& v, CallArgs& a) {
  Params p("list", a, {});
  return Value::list(items_of(in, v));
}

Value f_lower(Interp&, const Value& v, CallArgs& a) {
  Params p("lower", a, {});
  return lower_if_str(Value(py_str(v)));
}

Value f_upper(Interp&, const Value& v, CallArgs& a) {
  Params p("upper", a, {});
  std::u32string c = utf8_decode(py_str(v));
  for (char32_t& ch : c) ch = py_upper(ch);
  return Value(utf8_encode(c));
}

Value f_map(Interp& in, const Value& v, CallArgs& a) {
  std::vector<Value> out;
  std::vector<Value> items = items_of(in, v);
  if (a.pos.empty() && !a.kw.empty() && a.kw[0].first == "attribute") {
    Value def = Value::none();
    std::vector<std::string> parts;
    for (const auto& kw : a.kw) {
      if (kw.first == "attribute") {
        parts = attribute_parts(kw.second);
      } else if (kw.first == "default") {
        def = kw.second;
      } else {
        rfail("Unexpected keyword argument {}", py_str_repr(kw.first));
      }
    }
    for (const Value& item : items) out.push_back(get_path(in, item, parts, &def));
  } else {
    if (a.pos.empty()) rfail("map requires a filter argument");
    if (!a.pos[0].is_string()) rfail("map filter name must be a string");
    std::string name = a.pos[0].str();
    CallArgs rest;
    rest.pos.assign(a.pos.begin() + 1, a.pos.end());
    rest.kw = a.kw;
    for (const Value& item : items) {
      CallArgs copy = rest;
      out.push_back(in.apply_filter(name, item, copy));
    }
  }
  return Value::list(std::move(out), SeqKind::Generator);
}

Value select_impl(Interp& in, const Value& v, CallArgs& a, bool attr, bool keep) {
  size_t off = 0;
  std::vector<std::string> parts;
  if (attr) {
    if (a.pos.empty()) rfail("Missing parameter for attribute name");
    parts = attribute_parts(a.pos[0]);
    off = 1;
  }
  std::string test;
  bool has_test = a.pos.size() > off;
  if (has_test) {
    if (!a.pos[off].is_string()) rfail("test name must be a string");
    test = a.pos[off].str();
  }
  CallArgs rest;
  if (has_test) rest.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(off) + 1, a.pos.end());
  rest.kw = a.kw;
  std::vector<Value> out;
  for (const Value& item : items_of(in, v)) {
    Value x = attr ? get_path(in, item, parts, nullptr) : item;
    bool r;
    if (has_test) {
      CallArgs copy = rest;
      r = in.apply_test(test, x, copy);
    } else {
      r = x.truthy();
    }
    if (r == keep) out.push_back(item);
  }
  return Value::list(std::move(out), SeqKind::Generator);
}

Value f_select(Interp& in, const Value& v, CallArgs& a) {
  return select_impl(in, v, a, false, true);
}
Value f_reject(Interp& in, const Value& v, CallArgs& a) {
  return select_impl(in, v, a, false, false);
}
Value f_selectattr(Interp& in, const Value& v, CallArgs& a) {
  return select_impl(in, v, a, true, true);
}
Value f_rejectattr(Interp& in, const Value& v, CallArgs& a) {
  return select_impl(in, v, a, true, false);
}

Value min_max(Interp& in, const Value& v, CallArgs& a, bool want_max) {
  Params p(want_max ? "max" : "min", a, {"case_sensitive", "attribute"});
  std::vector<Value> items = items_of(in, v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  bool cs = p.get(0) && p.get(0)->truthy();
  std::vector<std::string> parts =
      p.get(1) ? attribute_parts(*p.get(1)) : std::vector<std::string>{};
  auto key = [&](const Value& x) {
    Value k = parts.empty() ? x : get_path(in, x, parts, nullptr);
    return cs ? k : lower_if_str(k);
  };
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    bool better = want_max ? py_less(key(items[best]), key(items[i]))
                           : py_less(key(items[i]), key(items[best]));
    if (better) best = i;
  }
  return items[best];
}

Value f_max(Interp& in, const Value& v, CallArgs& a) {
  return min_max(in, v, a, true);
}
Value f_min(Interp& in, const Value& v, CallArgs& a) {
  return min_max(in, v, a, false);
}

Value f_replace(Interp& in, const Value& v, CallArgs& a) {
  Params p("replace", a, {"old", "new", "count"});
  if (!p.get(0) || !p.get(1)) rfail("replace() missing required arguments 'old' and 'new'");
  Value s(py_str(v));
  Value method = in.getattr(s, "replace");
  CallArgs ca;
  ca.pos = {Value(py_str(*p.get(0))), Value(py_str(*p.get(1)))};
  if (p.get(2) && !p.get(2)->is_none()) ca.pos.push_back(*p.get(2));
  return in.call(method, ca);
}

Value f_reverse(Interp& in, const Value& v, CallArgs& a) {
  Params p("reverse", a, {});
  if (v.is_string()) {
    std::u32string c = utf8_decode(v.str());
    std::reverse(c.begin(), c.end());
    return Value(utf8_encode(c));
  }
  std::vector<Value> items = items_of(in, v);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items), SeqKind::Generator);
}

Value f_round(Interp&, const Value& v, CallArgs& a) {
  Params p("round", a, {"precision", "method"});
  int64_t prec = p.get(0) ? p.get(0)->int_value() : 0;
  std::string method = p.get(1) && p.get(1)->is_string() ? p.get(1)->str() : "common";
  if (method != "common" && method != "ceil" && method != "floor") {
    rfail("method must be common, ceil or floor");
  }
  v.require_defined();
  if (!v.is_number()) rfail("type {} doesn't define __round__ method", v.type_name());
  if (prec < -300 || prec > 300) rfail("round() precision out of range");
  if (method == "common") {
    if (!v.is_float()) return Value(v.int_value());  // round(int, n) stays an int for n >= 0
    double d = v.as_float();
    if (std::isnan(d) || std::isinf(d) || prec < 0) {
      double s = std::pow(10.0, static_cast<double>(prec));
      return Value(std::nearbyint(d * s) / s);
    }
    // printf rounds the exact binary value half-to-even, as CPython's round() does.
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(prec), d);
    return Value(std::strtod(buf, nullptr));
  }
  double s = std::pow(10.0, static_cast<double>(prec));
  double x = v.num_value() * s;
  return Value((method == "ceil" ? std::ceil(x) : std::floor(x)) / s);
}

Value f_safe(Interp&, const Value& v, CallArgs& a) {
  Params p("safe", a, {});
  return Value(py_str(v));
}

Value f_sort(Interp& in, const Value& v, CallArgs& a) {
  Params p("sort", a, {"reverse", "case_sensitive", "attribute"});
  bool rev = p.get(0) && p.get(0)->truthy();
  bool cs = p.get(1) && p.get(1)->truthy();
  std::vector<std::vector<std::string>> attrs;
  if (p.get(2) && p.get(2)->is_string()) {
    std::string s = p.get(2)->str();
    size_t b = 0;
    while (true) {
      size_t e = s.find(',', b);
      attrs.push_back(
          attribute_parts(Value(s.substr(b, e == std::string::npos ? std::string::npos : e - b))));
      if (e == std::string::npos) break;
      b = e + 1;
    }
  } else if (p.get(2) && !p.get(2)->is_none()) {
    attrs.push_back(attribute_parts(*p.get(2)));
  }
  std::vector<Value> items = items_of(in, v);
  std::vector<Value> keys;
  keys.reserve(items.size());
  for (const Value& item : items) {
    if (attrs.empty()) {
      keys.push_back(cs ? item : lower_if_str(item));
    } else {
      std::vector<Value> k;
      for (const auto& parts : attrs) {
        Value x = get_path(in, item, parts, nullptr);
        k.push_back(cs ? x : lower_if_str(x));
      }
      keys.push_back(attrs.size() == 1 ? k[0] : Value::list(std::move(k)));
    }
  }
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  in.charge(items.size() * 8);
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return rev ? py_less(keys[y], keys[x]) : py_less(keys[x], keys[y]);
  });
  std::vector<Value> out;
  out.reserve(items.size());
  for (size_t i : order) out.push_back(items[i]);
  return Value::list(std::move(out));
}

Value f_string(Interp&, const Value& v, CallArgs& a) {
  Params p("string", a, {});
  return Value(py_str(v));
}

Value f_sum(Interp& in, const Value& v, CallArgs& a) {
  Params p("sum", a, {"attribute", "start"});
  std::vector<std::string> parts =
      p.get(0) ? attribute_parts(*p.get(0)) : std::vector<std::string>{};
  Value acc = p.get_or(1, Value(int64_t{0}));
  for (const Value& item : items_of(in, v)) {
    acc = in.binop("+", acc, parts.empty() ? item : get_path(in, item, parts, nullptr));
  }
  return acc;
}

Value f_title(Interp&, const Value& v, CallArgs& a) {
  Params p("title", a, {});
  // jinja2 splits on runs of [-\s({[<] and capitalizes each piece.
  std::u32string c = utf8_decode(py_str(v));
  auto sep = [](char32_t ch) {
    return ch == '-' || ch == '(' || ch == '{' || ch == '[' || ch == '<' || py_isspace(ch);
  };
  bool start = true;
  for (char32_t& ch : c) {
    if (sep(ch)) {
      start = true;
    } else {
      ch = start ? py_upper(ch) : py_lower(ch);
      start = false;
    }
  }
  return Value(utf8_encode(c));
}

Value f_tojson(Interp&, const Value& v, CallArgs& a) {
  Params p("tojson", a, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonDumpOptions o;
  o.ensure_ascii = p.get(0) && p.get(0)->truthy();
  const Value* ind = p.get(1);
  if (ind && !ind->is_none()) {
    o.has_indent = true;
    if (ind->is_string()) {
      o.indent_str = ind->str();
    } else if (ind->is_int() || ind->is_bool()) {
      int64_t n = ind->int_value();
      if (n > 1024) rfail("tojson indent too large");
      o.indent_str = std::string(static_cast<size_t>(std::max<int64_t>(n, 0)), ' ');
    } else {
      rfail("indent must be an int or a string, not {}", ind->type_name());
    }
    o.item_sep = ",";
  }
  const Value* seps = p.get(2);
  if (seps && !seps->is_none()) {
    if (!seps->is_list() || seps->items().size() != 2 || !seps->items()[0].is_string() ||
        !seps->items()[1].is_string()) {
      rfail("separators must be a pair of strings");
    }
    o.item_sep = seps->items()[0].str();
    o.key_sep = seps->items()[1].str();
  }
  o.sort_keys = p.get(3) && p.get(3)->truthy();
  return Value(json_dumps(v, o));
}

Value f_trim(Interp& in, const Value& v, CallArgs& a) {
  Params p("trim", a, {"chars"});
  Value s(py_str(v));
  Value m = in.getattr(s, "strip");
  CallArgs ca;
  if (p.get(0)) ca.pos.push_back(*p.get(0));
  return in.call(m, ca);
}

Value f_unique(Interp& in, const Value& v, CallArgs& a) {
  Params p("unique", a, {"case_sensitive", "attribute"});
  bool cs = p.get(0) && p.get(0)->truthy();
  std::vector<std::string> parts =
      p.get(1) ? attribute_parts(*p.get(1)) : std::vector<std::string>{};
  std::vector<Value> out, seen;
  std::vector<Value> items = items_of(in, v);
  in.charge(items.size() * items.size() / 16);
  for (const Value& item : items) {
    Value k = parts.empty() ? item : get_path(in, item, parts, nullptr);
    if (!cs) k = lower_if_str(k);
    bool dup =
        std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return py_equal(s, k); });
    if (!dup) {
      seen.push_back(k);
      out.push_back(item);
    }
  }
  return Value::list(std::move(out), SeqKind::Generator);
}

Value f_wordcount(Interp&, const Value& v, CallArgs& a) {
  Params p("wordcount", a, {});
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : utf8_decode(py_str(v))) {
    bool w = py_is_word_char(c);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value(n);
}

Value f_format(Interp&, const Value& v, CallArgs& a) {
  if (!a.kw.empty() && !a.pos.empty())
    rfail("can't handle positional and keyword arguments at the same time");
  if (!a.kw.empty()) {
    auto d = std::make_shared<DictObj>();
    for (auto& kw : a.kw) d->set(Value(kw.first), kw.second);
    return Value(percent_format(py_str(v), Value(std::move(d))));
  }
  return Value(percent_format(py_str(v), Value::list(a.pos, SeqKind::Tuple)));
}

struct FilterEntry {
  std::string_view name;
  FilterFn fn;
};

constexpr FilterEntry kFilters[] = {
    {"abs", f_abs},
    {"attr", f_attr},
    {"capitalize", f_capitalize},
    {"center", f_center},
    {"count", f_length},
    {"d", f_default},
    {"default", f_default},
    {"dictsort", f_dictsort},
    {"e", f_escape},
    {"escape", f_escape},
    {"first", f_first},
    {"float", f_float},
    {"forceescape", f_escape},
    {"format", f_format},
    {"indent", f_indent},
    {"int", f_int},
    {"items", f_items},
    {"join", f_join},
    {"last", f_last},
    {"length", f_length},
    {"list", f_list},
    {"lower", f_lower},
    {"map", f_map},
    {"max", f_max},
    {"min", f_min},
    {"reject", f_reject},
    {"rejectattr", f_rejectattr},
    {"replace", f_replace},
    {"reverse", f_reverse},
    {"round", f_round},
    {"safe", f_safe},
    {"select", f_select},
    {"selectattr", f_selectattr},
    {"sort", f_sort},
    {"string", f_string},
    {"sum", f_sum},
    {"title", f_title},
    {"tojson", f_tojson},
    {"trim", f_trim},
    {"unique", f_unique},
    {"upper", f_upper},
    {"wordcount", f_wordcount},
};

}  // namespace

FilterFn find_filter(std::string_view name) {
  for (const auto& f : kFilters) {
    if (f.name == name) return f.fn;
  }
  return nullptr;
}

}  // namespace tokenmill::jinja
