// Methods of str, dict and list as templates call them (x.startswith(...), d.items(), ...).
// Mutating methods are "unsafe" in HF's ImmutableSandboxedEnvironment: looking them up yields an
// undefined that raises jinja2's SecurityError message when called.
#include <algorithm>

#include "text/jinja_interp.h"

namespace tokenmill::jinja {
namespace {

std::u32string strip_set(const Value* chars) {
  if (!chars || chars->is_none()) return {};
  if (!chars->is_string()) rfail("strip arg must be None or str");
  return utf8_decode(chars->str());
}

// str.strip/lstrip/rstrip. Works on bytes at the ends (no whole-string decode): ASCII bytes are
// always their own code point, so only a non-ASCII last character needs a full decode.
std::string do_strip(const std::string& s, const Value* chars, bool left, bool right) {
  std::u32string set = strip_set(chars);
  bool ws = !chars || chars->is_none();
  auto strip_it = [&](char32_t ch) {
    return ws ? py_isspace(ch) : set.find(ch) != std::u32string::npos;
  };
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e) {
      size_t next = b;
      if (!strip_it(utf8_next(s, next))) break;
      b = next;
    }
  }
  if (right) {
    while (e > b) {
      auto last = static_cast<unsigned char>(s[e - 1]);
      if (last >= 0x80) {
        std::u32string c = utf8_decode(std::string_view(s).substr(b, e - b));
        size_t n = c.size();
        while (n > 0 && strip_it(c[n - 1])) --n;
        return utf8_encode(std::u32string_view(c).substr(0, n));
      }
      if (!strip_it(last)) break;
      --e;
    }
  }
  return s.substr(b, e - b);
}

int64_t opt_int(const Value* v, int64_t def) {
  if (!v || v->is_none()) return def;
  if (!(v->is_int() || v->is_bool())) {
    rfail("slice indices must be integers or None or have an __index__ method");
  }
  return v->int_value();
}

// Resolves Python's optional [start, end) arguments against a length.
void bounds(const Value* a, const Value* b, int64_t n, int64_t& lo, int64_t& hi) {
  lo = opt_int(a, 0);
  hi = opt_int(b, n);
  if (lo < 0) lo = std::max<int64_t>(0, lo + n);
  if (hi < 0) hi = std::max<int64_t>(0, hi + n);
  lo = std::min(lo, n);
  hi = std::min(hi, n);
}

Value split(Interp& in, const std::string& s, const Value* sepv, const Value* maxv,
            bool from_right) {
  int64_t maxsplit = opt_int(maxv, -1);
  std::vector<Value> parts;
  if (!sepv || sepv->is_none()) {
    std::u32string c = utf8_decode(s);
    std::vector<std::u32string> words;
    if (!from_right) {
      size_t i = 0;
      while (i < c.size()) {
        while (i < c.size() && py_isspace(c[i])) ++i;
        if (i >= c.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          size_t e = c.size();
          while (e > i && py_isspace(c[e - 1])) --e;
          words.push_back(c.substr(i, e - i));
          break;
        }
        size_t j = i;
        while (j < c.size() && !py_isspace(c[j])) ++j;
        words.push_back(c.substr(i, j - i));
        i = j;
      }
    } else {
      size_t i = c.size();
      while (i > 0) {
        while (i > 0 && py_isspace(c[i - 1])) --i;
        if (i == 0) break;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          size_t b = 0;
          while (b < i && py_isspace(c[b])) ++b;
          words.push_back(c.substr(b, i - b));
          break;
        }
        size_t j = i;
        while (j > 0 && !py_isspace(c[j - 1])) --j;
        words.push_back(c.substr(j, i - j));
        i = j;
      }
      std::reverse(words.begin(), words.end());
    }
    for (auto& w : words) parts.emplace_back(utf8_encode(w));
  } else {
    if (!sepv->is_string()) rfail("must be str or None, not {}", sepv->type_name());
    const std::string& sep = sepv->str();
    if (sep.empty()) rfail("empty separator");
    if (!from_right) {
      size_t pos = 0;
      while (true) {
        size_t f = (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit)
                       ? std::string::npos
                       : s.find(sep, pos);
        if (f == std::string::npos) {
          parts.emplace_back(s.substr(pos));
          break;
        }
        parts.emplace_back(s.substr(pos, f - pos));
        pos = f + sep.size();
      }
    } else {
      size_t end = s.size();
      while (true) {
        size_t f = std::string::npos;
        if (!(maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) &&
            end >= sep.size()) {
          f = s.rfind(sep, end - sep.size());
        }
        if (f == std::string::npos) {
          parts.emplace_back(s.substr(0, end));
          break;
        }
        parts.emplace_back(s.substr(f + sep.size(), end - f - sep.size()));
        end = f;
      }
      std::reverse(parts.begin(), parts.end());
    }
  }
  in.charge(parts.size());
  return Value::list(std::move(parts));
}

bool is_ascii(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char ch) { return (ch & 0x80) == 0; });
}

bool affix_match(const std::string& s, const Value& affix, const Value* a, const Value* b,
                 bool prefix) {
  // Fast path: ASCII affixes without bounds compare bytes (an ASCII byte is always one code
  // point, so byte and code-point matching agree).
  if ((!a || a->is_none()) && (!b || b->is_none()) && affix.is_string() && is_ascii(affix.str())) {
    const std::string& f = affix.str();
    if (f.size() > s.size()) return false;
    return prefix ? s.compare(0, f.size(), f) == 0
                  : s.compare(s.size() - f.size(), f.size(), f) == 0;
  }
  std::u32string c = utf8_decode(s);
  int64_t lo = 0, hi = 0;
  bounds(a, b, static_cast<int64_t>(c.size()), lo, hi);
  if (a && !a->is_none() && opt_int(a, 0) > static_cast<int64_t>(c.size())) return false;
  std::u32string sub =
      hi > lo ? c.substr(static_cast<size_t>(lo), static_cast<size_t>(hi - lo)) : U"";
  auto one = [&](const Value& x) {
    if (!x.is_string()) {
      rfail("{} first arg must be str or a tuple of str, not {}",
            prefix ? "startswith" : "endswith", x.type_name());
    }
    std::u32string f = utf8_decode(x.str());
    if (f.size() > sub.size()) return false;
    return prefix ? sub.compare(0, f.size(), f) == 0
                  : sub.compare(sub.size() - f.size(), f.size(), f) == 0;
  };
  if (affix.is_list() && affix.list_obj().seq == SeqKind::Tuple) {
    return std::any_of(affix.items().begin(), affix.items().end(), one);
  }
  return one(affix);
}

std::string py_title(const std::string& s) {
  std::u32string c = utf8_decode(s);
  bool prev_cased = false;
  for (char32_t& ch : c) {
    bool cased = py_upper(ch) != ch || py_lower(ch) != ch;
    if (cased) {
      ch = prev_cased ? py_lower(ch) : py_upper(ch);
      prev_cased = true;
    } else {
      prev_cased = false;
    }
  }
  return utf8_encode(c);
}

std::string map_chars(const std::string& s, char32_t (*f)(char32_t)) {
  std::u32string c = utf8_decode(s);
  for (char32_t& ch : c) ch = f(ch);
  return utf8_encode(c);
}

std::string str_format(Interp& in, const std::string& f, CallArgs& a) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    char c = f[i];
    if (c == '}') {
      if (i + 1 < f.size() && f[i + 1] == '}')
        ++i;
      else
        rfail("Single '}}' encountered in format string");
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < f.size() && f[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    size_t close = f.find('}', i);
    if (close == std::string::npos) rfail("Single '{{' encountered in format string");
    std::string field = f.substr(i + 1, close - i - 1);
    i = close;
    std::string conv, spec;
    if (size_t p = field.find(':'); p != std::string::npos) {
      spec = field.substr(p + 1);
      field = field.substr(0, p);
    }
    if (size_t p = field.find('!'); p != std::string::npos) {
      conv = field.substr(p + 1);
      field = field.substr(0, p);
    }
    Value v;
    if (field.empty()) {
      if (auto_idx >= a.pos.size())
        rfail("Replacement index {} out of range for positional args tuple", auto_idx);
      v = a.pos[auto_idx++];
    } else if (std::all_of(field.begin(), field.end(),
                           [](char ch) { return ch >= '0' && ch <= '9'; })) {
      size_t k = field.size() > 9 ? a.pos.size() : std::stoul(field);
      if (k >= a.pos.size())
        rfail("Replacement index {} out of range for positional args tuple", field);
      v = a.pos[k];
    } else {
      bool found = false;
      for (const auto& kw : a.kw) {
        if (kw.first == field) {
          v = kw.second;
          found = true;
        }
      }
      if (!found) rfail("KeyError: {}", py_str_repr(field));
    }
    if (!spec.empty()) rfail("format specifications in str.format are not supported ('{}')", spec);
    std::string piece = conv == "r" ? py_repr(v) : py_str(v);
    in.check_size(out.size() + piece.size());
    out += piece;
  }
  return out;
}

using Method = Value (*)(Interp&, const Value& self, CallArgs&);

Value bind_method(const Value& self, const std::string& name, Method m) {
  return Value::func(name, [self, m](Interp& in, CallArgs& a) { return m(in, self, a); });
}

Value unsafe(const Value& obj, const std::string& name) {
  return Value::undefined(fmt::format("access to attribute {} of {} object is unsafe.",
                                      py_str_repr(name), py_str_repr(obj.type_name())));
}

#define TM_STR_METHOD(NAME, BODY)                                                          \
  if (name == NAME) {                                                                      \
    out = bind_method(obj, name, [](Interp& in, const Value& self, CallArgs& a) -> Value { \
      (void)in;                                                                            \
      (void)a;                                                                             \
      const std::string& s = self.str();                                                   \
      BODY                                                                                 \
    });                                                                                    \
    return true;                                                                           \
  }

bool str_method(const Value& obj, const std::string& name, Value& out) {
  TM_STR_METHOD("upper", {
    Params p("upper", a, {});
    return Value(map_chars(s, py_upper));
  })
  TM_STR_METHOD("lower", {
    Params p("lower", a, {});
    return Value(map_chars(s, py_lower));
  })
  TM_STR_METHOD("title", {
    Params p("title", a, {});
    return Value(py_title(s));
  })
  TM_STR_METHOD("capitalize", {
    Params p("capitalize", a, {});
    std::u32string c = utf8_decode(s);
    for (size_t i = 0; i < c.size(); ++i) c[i] = i == 0 ? py_upper(c[i]) : py_lower(c[i]);
    return Value(utf8_encode(c));
  })
  TM_STR_METHOD("strip", {
    Params p("strip", a, {"chars"});
    return Value(do_strip(s, p.get(0), true, true));
  })
  TM_STR_METHOD("lstrip", {
    Params p("lstrip", a, {"chars"});
    return Value(do_strip(s, p.get(0), true, false));
  })
  TM_STR_METHOD("rstrip", {
    Params p("rstrip", a, {"chars"});
    return Value(do_strip(s, p.get(0), false, true));
  })
  TM_STR_METHOD("startswith", {
    Params p("startswith", a, {"prefix", "start", "end"});
    if (!p.get(0)) rfail("startswith() takes at least 1 argument (0 given)");
    return Value(affix_match(s, *p.get(0), p.get(1), p.get(2), true));
  })
  TM_STR_METHOD("endswith", {
    Params p("endswith", a, {"suffix", "start", "end"});
    if (!p.get(0)) rfail("endswith() takes at least 1 argument (0 given)");
    return Value(affix_match(s, *p.get(0), p.get(1), p.get(2), false));
  })
  TM_STR_METHOD("split", {
    Params p("split", a, {"sep", "maxsplit"});
    return split(in, s, p.get(0), p.get(1), false);
  })
  TM_STR_METHOD("rsplit", {
    Params p("rsplit", a, {"sep", "maxsplit"});
    return split(in, s, p.get(0), p.get(1), true);
  })
  TM_STR_METHOD("replace", {
    Params p("replace", a, {"old", "new", "count"});
    if (!p.get(0) || !p.get(1) || !p.get(0)->is_string() || !p.get(1)->is_string()) {
      rfail("replace() arguments must be str");
    }
    const std::string& from = p.get(0)->str();
    const std::string& to = p.get(1)->str();
    int64_t count = opt_int(p.get(2), -1);
    std::string r;
    if (from.empty()) {
      std::u32string c = utf8_decode(s);
      int64_t done = 0;
      for (size_t i = 0; i <= c.size(); ++i) {
        if (count < 0 || done < count) {
          r += to;
          ++done;
        }
        if (i < c.size()) utf8_append(r, c[i]);
        in.check_size(r.size());
      }
      return Value(r);
    }
    size_t pos = 0;
    int64_t done = 0;
    while (count < 0 || done < count) {
      size_t f = s.find(from, pos);
      if (f == std::string::npos) break;
      r.append(s, pos, f - pos);
      r += to;
      in.check_size(r.size());
      pos = f + from.size();
      ++done;
    }
    r.append(s, pos, std::string::npos);
    return Value(r);
  })
  for (const char* fname : {"find", "rfind", "index", "rindex", "count"}) {
    if (name != fname) continue;
    std::string which = fname;
    out = Value::func(name, [self = obj, which](Interp&, CallArgs& a) -> Value {
      Params p(which.c_str(), a, {"sub", "start", "end"});
      if (!p.get(0) || !p.get(0)->is_string())
        rfail("must be str, not {}", p.get(0) ? p.get(0)->type_name() : "nothing");
      std::u32string c = utf8_decode(self.str());
      std::u32string sub = utf8_decode(p.get(0)->str());
      int64_t lo = 0, hi = 0;
      bounds(p.get(1), p.get(2), static_cast<int64_t>(c.size()), lo, hi);
      std::u32string_view hay =
          hi >= lo
              ? std::u32string_view(c).substr(static_cast<size_t>(lo), static_cast<size_t>(hi - lo))
              : std::u32string_view();
      if (which == "count") {
        if (hi < lo) return Value(int64_t{0});
        if (sub.empty()) return Value(static_cast<int64_t>(hay.size() + 1));
        int64_t n = 0;
        for (size_t i = hay.find(sub); i != std::u32string_view::npos;
             i = hay.find(sub, i + sub.size()))
          ++n;
        return Value(n);
      }
      size_t f = std::u32string_view::npos;
      if (hi >= lo) f = (which[0] == 'r') ? hay.rfind(sub) : hay.find(sub);
      if (f == std::u32string_view::npos) {
        if (which == "index" || which == "rindex") rfail("substring not found");
        return Value(int64_t{-1});
      }
      return Value(static_cast<int64_t>(f) + lo);
    });
    return true;
  }
  TM_STR_METHOD("join", {
    Params p("join", a, {"iterable"});
    if (!p.get(0)) rfail("join() takes exactly one argument (0 given)");
    std::string r;
    bool first = true;
    for (const Value& v : iterate(*p.get(0))) {
      if (!v.is_string()) rfail("sequence item: expected str instance, {} found", v.type_name());
      if (!first) r += s;
      first = false;
      r += v.str();
      in.check_size(r.size());
    }
    return Value(r);
  })
  TM_STR_METHOD("format", { return Value(str_format(in, s, a)); })
  TM_STR_METHOD("isdigit", {
    std::u32string c = utf8_decode(s);
    return Value(!c.empty() && std::all_of(c.begin(), c.end(), py_isdigit));
  })
  TM_STR_METHOD("isalpha", {
    std::u32string c = utf8_decode(s);
    return Value(!c.empty() && std::all_of(c.begin(), c.end(), py_isalpha));
  })
  TM_STR_METHOD("isalnum", {
    std::u32string c = utf8_decode(s);
    return Value(!c.empty() && std::all_of(c.begin(), c.end(), py_isalnum));
  })
  TM_STR_METHOD("isspace", {
    std::u32string c = utf8_decode(s);
    return Value(!c.empty() && std::all_of(c.begin(), c.end(), py_isspace));
  })
  TM_STR_METHOD("islower", {
    std::u32string c = utf8_decode(s);
    bool cased = false;
    for (char32_t ch : c) {
      if (py_upper(ch) != ch)
        cased = true;
      else if (py_lower(ch) != ch)
        return Value(false);
    }
    return Value(cased);
  })
  TM_STR_METHOD("isupper", {
    std::u32string c = utf8_decode(s);
    bool cased = false;
    for (char32_t ch : c) {
      if (py_lower(ch) != ch)
        cased = true;
      else if (py_upper(ch) != ch)
        return Value(false);
    }
    return Value(cased);
  })
  TM_STR_METHOD("removeprefix", {
    Params p("removeprefix", a, {"prefix"});
    if (!p.get(0) || !p.get(0)->is_string()) rfail("removeprefix() argument must be str");
    const std::string& x = p.get(0)->str();
    return Value(s.compare(0, x.size(), x) == 0 ? s.substr(x.size()) : s);
  })
  TM_STR_METHOD("removesuffix", {
    Params p("removesuffix", a, {"suffix"});
    if (!p.get(0) || !p.get(0)->is_string()) rfail("removesuffix() argument must be str");
    const std::string& x = p.get(0)->str();
    bool ends =
        !x.empty() && s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
    return Value(ends ? s.substr(0, s.size() - x.size()) : s);
  })
  TM_STR_METHOD("splitlines", {
    Params p("splitlines", a, {"keepends"});
    bool keep = p.get(0) && p.get(0)->truthy();
    std::vector<Value> lines;
    size_t b = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '\n' || s[i] == '\r') {
        size_t e = i;
        if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
        lines.emplace_back(s.substr(b, (keep ? i + 1 : e) - b));
        b = i + 1;
      }
    }
    if (b < s.size()) lines.emplace_back(s.substr(b));
    return Value::list(std::move(lines));
  })
  return false;
}

#undef TM_STR_METHOD

Value dict_items(Interp& in, const Value& self, CallArgs& a) {
  Params p("items", a, {});
  std::vector<Value> out;
  in.charge(self.dict_obj().items.size());
  for (const auto& kv : self.dict_obj().items)
    out.push_back(Value::list({kv.first, kv.second}, SeqKind::Tuple));
  return Value::list(std::move(out));
}

}  // namespace

bool builtin_method(Interp&, const Value& obj, const std::string& name, Value& out) {
  if (obj.is_string()) return str_method(obj, name, out);
  if (obj.is_dict()) {
    if (name == "items") {
      out = bind_method(obj, name, dict_items);
    } else if (name == "keys" || name == "values") {
      bool keys = name == "keys";
      out = Value::func(name, [self = obj, keys](Interp& in, CallArgs& a) {
        Params p(keys ? "keys" : "values", a, {});
        std::vector<Value> r;
        in.charge(self.dict_obj().items.size());
        for (const auto& kv : self.dict_obj().items) r.push_back(keys ? kv.first : kv.second);
        return Value::list(std::move(r));
      });
    } else if (name == "get") {
      out = bind_method(obj, name, [](Interp&, const Value& self, CallArgs& a) -> Value {
        Params p("get", a, {"key", "default"});
        if (!p.get(0)) rfail("get expected at least 1 argument, got 0");
        const Value* v = self.dict_obj().find(*p.get(0));
        return v ? *v : p.get_or(1, Value::none());
      });
    } else if (name == "copy") {
      out = bind_method(obj, name, [](Interp&, const Value& self, CallArgs&) -> Value {
        return Value(std::make_shared<DictObj>(self.dict_obj()));
      });
    } else if (name == "clear" || name == "pop" || name == "popitem" || name == "setdefault" ||
               name == "update" || name == "fromkeys") {
      out = unsafe(obj, name);
    } else {
      return false;
    }
    return true;
  }
  if (obj.is_list() && obj.list_obj().seq != SeqKind::Generator) {
    bool is_list = obj.list_obj().seq == SeqKind::List;
    if (name == "count" || name == "index") {
      bool count = name == "count";
      out = Value::func(name, [self = obj, count](Interp& in, CallArgs& a) -> Value {
        Params p(count ? "count" : "index", a, {"value"});
        if (!p.get(0))
          rfail("{}() takes exactly one argument (0 given)", count ? "count" : "index");
        in.charge(self.items().size());
        int64_t n = 0;
        for (size_t i = 0; i < self.items().size(); ++i) {
          if (py_equal(self.items()[i], *p.get(0))) {
            if (!count) return Value(static_cast<int64_t>(i));
            ++n;
          }
        }
        if (!count) rfail("{} is not in list", py_repr(*p.get(0)));
        return Value(n);
      });
      return true;
    }
    if (is_list && (name == "append" || name == "extend" || name == "insert" || name == "pop" ||
                    name == "remove" || name == "reverse" || name == "sort" || name == "clear")) {
      out = unsafe(obj, name);
      return true;
    }
    if (is_list && name == "copy") {
      out = bind_method(obj, name, [](Interp&, const Value& self, CallArgs&) -> Value {
        return Value::list(self.items());
      });
      return true;
    }
  }
  return false;
}

}  // namespace tokenmill::jinja
