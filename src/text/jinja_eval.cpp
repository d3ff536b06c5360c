// Statement execution and expression evaluation.
#include <algorithm>
#include <ctime>

#include "text/jinja_interp.h"
#include "text/jinja_parser.h"

namespace tokenmill::jinja {
namespace {

// Restores the output buffer and scope pointers when a capture ends (normally or by throw).
template <typename T>
struct Restore {
  T& ref;
  T saved;
  explicit Restore(T& r) : ref(r), saved(r) {}
  ~Restore() { ref = saved; }
};

Value make_range(CallArgs& a) {
  if (!a.kw.empty()) rfail("range() takes no keyword arguments");
  if (a.pos.empty() || a.pos.size() > 3) {
    rfail("range expected at least 1 argument, got {}", a.pos.size());
  }
  int64_t v[3] = {0, 0, 1};
  for (size_t i = 0; i < a.pos.size(); ++i) {
    const Value& x = a.pos[i];
    if (!(x.is_int() || x.is_bool())) {
      rfail("'{}' object cannot be interpreted as an integer", x.type_name());
    }
  }
  if (a.pos.size() == 1) {
    v[1] = a.pos[0].int_value();
  } else {
    v[0] = a.pos[0].int_value();
    v[1] = a.pos[1].int_value();
    if (a.pos.size() == 3) v[2] = a.pos[2].int_value();
  }
  if (v[2] == 0) rfail("range() arg 3 must not be zero");
  // Sandbox limit (jinja2.sandbox.MAX_RANGE). The unsigned difference is exact (< 2^64).
  uint64_t len = 0;
  if (v[2] > 0 && v[1] > v[0]) {
    uint64_t span = static_cast<uint64_t>(v[1]) - static_cast<uint64_t>(v[0]);
    auto st = static_cast<uint64_t>(v[2]);
    len = span / st + (span % st != 0);
  } else if (v[2] < 0 && v[1] < v[0]) {
    uint64_t span = static_cast<uint64_t>(v[0]) - static_cast<uint64_t>(v[1]);
    uint64_t st = static_cast<uint64_t>(-(v[2] + 1)) + 1;
    len = span / st + (span % st != 0);
  }
  if (len > 100000) {
    rfail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  }
  std::vector<Value> out;
  out.reserve(static_cast<size_t>(len));
  for (uint64_t i = 0; i < len; ++i) out.emplace_back(v[0] + static_cast<int64_t>(i) * v[2]);
  return Value::list(std::move(out));
}

Value make_dict(CallArgs& a, const char* what) {
  auto d = std::make_shared<DictObj>();
  if (a.pos.size() > 1) rfail("{} expected at most 1 argument, got {}", what, a.pos.size());
  if (!a.pos.empty()) {
    const Value& src = a.pos[0];
    if (src.is_dict()) {
      for (const auto& kv : src.dict_obj().items) d->set(kv.first, kv.second);
    } else if (src.is_namespace()) {
      for (const auto& kv : src.ns_obj().attrs.items) d->set(kv.first, kv.second);
    } else {
      for (const Value& item : iterate(src)) {
        if (!item.is_list() || item.list_obj().seq == SeqKind::Generator ||
            item.items().size() != 2) {
          rfail("dictionary update sequence element has wrong length or type");
        }
        d->set(item.items()[0], item.items()[1]);
      }
    }
  }
  for (auto& kv : a.kw) d->set(Value(kv.first), kv.second);
  return Value(std::move(d));
}

std::string strftime_now(const std::string& fmt, const RenderOptions& opts) {
  if (fmt.size() > 1024) rfail("strftime_now: format string too long");
  std::tm tm{};
  if (opts.now_unix) {
    std::time_t t = static_cast<std::time_t>(*opts.now_unix);
    gmtime_r(&t, &tm);
  } else {
    std::time_t t = std::time(nullptr);
    localtime_r(&t, &tm);
  }
  if (fmt.empty()) return "";
  std::string buf(fmt.size() * 16 + 64, '\0');
  size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
  buf.resize(n);
  return buf;
}

}  // namespace

Interp::Interp(const Program& program, const RenderOptions& options)
    : program_(program), opts_(options) {
  auto& g = globals_.vars;
  g["range"] = Value::func("range", [](Interp&, CallArgs& a) { return make_range(a); });
  g["dict"] = Value::func("dict", [](Interp&, CallArgs& a) { return make_dict(a, "dict"); });
  g["namespace"] = Value::func("namespace", [](Interp&, CallArgs& a) {
    Value d = make_dict(a, "namespace");
    if (d.has_namespace()) rfail("a namespace cannot hold another namespace or loop object");
    auto ns = std::make_shared<NamespaceObj>();
    ns->attrs = d.dict_obj();
    return Value(std::move(ns));
  });
  g["raise_exception"] = Value::func("raise_exception", [](Interp&, CallArgs& a) -> Value {
    Params p("raise_exception", a, {"message"});
    const Value* m = p.get(0);
    if (!m) rfail("raise_exception() missing 1 required positional argument: 'message'");
    throw RuntimeError(py_str(*m));
  });
  g["strftime_now"] = Value::func("strftime_now", [](Interp& in, CallArgs& a) {
    Params p("strftime_now", a, {"format"});
    const Value* f = p.get(0);
    if (!f) rfail("strftime_now() missing 1 required positional argument: 'format'");
    if (!f->is_string()) rfail("strftime() argument 1 must be str, not {}", f->type_name());
    return Value(strftime_now(f->str(), in.options()));
  });
}

std::string Interp::render(const std::vector<std::pair<std::string, Value>>& vars,
                           size_t size_hint) {
  size_hint_ = size_hint;
  Scope root;
  root.parent = &globals_;
  for (const auto& kv : vars) root.vars[kv.first] = kv.second;
  root_ = &root;
  scope_ = &root;
  std::string out;
  // Reserve once: growing a large buffer step by step costs more in page faults than in copying.
  out.reserve(std::min(opts_.limits.max_output, size_hint_));
  out_ = &out;
  try {
    exec(program_.body);
  } catch (const RuntimeError& e) {
    fail("{}:{}: {}", program_.name, line_, e.what());
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    fail("{}:{}: {}", program_.name, line_, e.what());
  }
  return out;
}

void Interp::charge(uint64_t n) {
  steps_ += n;
  if (steps_ > opts_.limits.max_steps) {
    rfail("rendering took more than {} steps; the template loops too long for its input",
          opts_.limits.max_steps);
  }
}

void Interp::check_size(size_t n) const {
  if (n > opts_.limits.max_output) {
    rfail("a string or the output would exceed {} bytes", opts_.limits.max_output);
  }
}

void Interp::emit(std::string_view s) {
  total_out_ += s.size();
  check_size(total_out_);
  out_->append(s);
}

Interp::Flow Interp::exec(const std::vector<Stmt>& body) {
  for (const Stmt& s : body) {
    Flow f = exec_stmt(s);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

std::string Interp::capture(const std::vector<Stmt>& body) {
  std::string buf;
  Restore<std::string*> r(out_);
  out_ = &buf;
  exec(body);
  return buf;
}

Interp::Flow Interp::exec_stmt(const Stmt& s) {
  line_ = s.line;
  charge(1);
  switch (s.kind) {
    case StmtKind::Text:
      emit(s.text);
      return Flow::Normal;
    case StmtKind::Output: {
      Value v = eval(*s.expr);
      emit(py_str(v));
      return Flow::Normal;
    }
    case StmtKind::If:
      return eval(*s.expr).truthy() ? exec(s.body) : exec(s.else_body);
    case StmtKind::For: {
      Flow f = Flow::Normal;
      exec_for(s, f);
      return f;
    }
    case StmtKind::Set:
    case StmtKind::SetBlock:
      exec_set(s);
      return Flow::Normal;
    case StmtKind::Macro: {
      const Stmt* def = &s;
      scope_->vars[s.text] =
          Value::func(s.text, [def](Interp& in, CallArgs& a) { return in.call_macro(*def, a); });
      return Flow::Normal;
    }
    case StmtKind::Break:
      return Flow::Break;
    case StmtKind::Continue:
      return Flow::Continue;
    case StmtKind::Generation:
      return exec(s.body);
    case StmtKind::With: {
      Scope inner;
      inner.parent = scope_;
      for (const auto& p : s.params) inner.vars[p.first] = eval(*p.second);
      Restore<Scope*> r(scope_);
      scope_ = &inner;
      return exec(s.body);
    }
    case StmtKind::FilterBlock: {
      block_input_.push_back(Value(capture(s.body)));
      Value v = eval(*s.filter);
      block_input_.pop_back();
      emit(py_str(v));
      return Flow::Normal;
    }
  }
  return Flow::Normal;
}

void Interp::assign(const std::vector<std::string>& targets, const Value& v) {
  if (targets.size() == 1) {
    scope_->vars[targets[0]] = v;
    return;
  }
  if (!(v.is_list() || v.is_string() || v.is_dict())) {
    rfail("cannot unpack non-iterable {} object", v.type_name());
  }
  std::vector<Value> items = iterate(v);
  if (items.size() > targets.size())
    rfail("too many values to unpack (expected {})", targets.size());
  if (items.size() < targets.size()) {
    rfail("not enough values to unpack (expected {}, got {})", targets.size(), items.size());
  }
  for (size_t i = 0; i < targets.size(); ++i) scope_->vars[targets[i]] = items[i];
}

void Interp::exec_set(const Stmt& s) {
  Value v;
  if (s.kind == StmtKind::SetBlock) {
    std::string body = capture(s.body);
    if (s.filter) {
      block_input_.push_back(Value(std::move(body)));
      v = eval(*s.filter);
      block_input_.pop_back();
    } else {
      v = Value(std::move(body));
    }
  } else {
    v = eval(*s.expr);
  }
  if (!s.has_attr) {
    assign(s.targets, v);
    return;
  }
  Value target = lookup(s.targets[0]);
  if (!target.is_namespace() || target.ns_obj().is_loop) {
    rfail("cannot assign attribute on non-namespace object");
  }
  if (v.has_namespace()) rfail("a namespace cannot hold another namespace or loop object");
  target.ns_obj().attrs.set(Value(s.attr), v);
}

void Interp::exec_for(const Stmt& s, Flow& flow) {
  Value seq = eval(*s.expr);
  std::vector<Value> items = iterate(seq);
  if (s.cond) {
    std::vector<Value> kept;
    Scope inner;
    inner.parent = scope_;
    Restore<Scope*> r(scope_);
    scope_ = &inner;
    for (const Value& item : items) {
      charge(1);
      assign(s.targets, item);
      if (eval(*s.cond).truthy()) kept.push_back(item);
    }
    items = std::move(kept);
  }
  const size_t n = items.size();
  if (n == 0) {
    flow = exec(s.else_body);
    return;
  }
  Restore<Scope*> r(scope_);
  Scope* outer = scope_;
  for (size_t i = 0; i < n; ++i) {
    charge(1);
    Scope inner;
    inner.parent = outer;
    scope_ = &inner;
    auto loop = std::make_shared<NamespaceObj>();
    loop->is_loop = true;
    auto& a = loop->attrs.items;
    auto idx = static_cast<int64_t>(i);
    auto len = static_cast<int64_t>(n);
    a.reserve(12);
    a.emplace_back(Value("index"), Value(idx + 1));
    a.emplace_back(Value("index0"), Value(idx));
    a.emplace_back(Value("revindex"), Value(len - idx));
    a.emplace_back(Value("revindex0"), Value(len - idx - 1));
    a.emplace_back(Value("first"), Value(i == 0));
    a.emplace_back(Value("last"), Value(i + 1 == n));
    a.emplace_back(Value("length"), Value(len));
    a.emplace_back(Value("previtem"),
                   i > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
    a.emplace_back(Value("nextitem"),
                   i + 1 < n ? items[i + 1] : Value::undefined("there is no next item"));
    a.emplace_back(Value("depth"), Value(1));
    a.emplace_back(Value("depth0"), Value(0));
    a.emplace_back(Value("cycle"), Value::func("cycle", [idx](Interp&, CallArgs& c) {
                     if (c.pos.empty()) rfail("no items for cycling given");
                     return c.pos[static_cast<size_t>(idx) % c.pos.size()];
                   }));
    inner.vars["loop"] = Value(std::move(loop));
    assign(s.targets, items[i]);
    Flow f = exec(s.body);
    if (f == Flow::Break) break;
  }
  flow = Flow::Normal;
}

Value Interp::call_macro(const Stmt& m, CallArgs& args) {
  if (call_depth_ >= opts_.limits.max_call_depth) {
    rfail("maximum macro recursion depth ({}) exceeded", opts_.limits.max_call_depth);
  }
  if (args.pos.size() > m.params.size()) {
    rfail("macro '{}' takes not more than {} argument(s)", m.text, m.params.size());
  }
  Scope inner;
  inner.parent = root_;
  Restore<Scope*> rs(scope_);
  scope_ = &inner;
  for (const auto& kw : args.kw) {
    bool known = std::any_of(m.params.begin(), m.params.end(),
                             [&](const auto& p) { return p.first == kw.first; });
    if (!known) rfail("macro '{}' takes no keyword argument '{}'", m.text, kw.first);
  }
  for (size_t i = 0; i < m.params.size(); ++i) {
    const auto& p = m.params[i];
    const Value* given = i < args.pos.size() ? &args.pos[i] : nullptr;
    for (const auto& kw : args.kw) {
      if (kw.first == p.first) {
        if (given) rfail("macro '{}' got multiple values for argument '{}'", m.text, p.first);
        given = &kw.second;
      }
    }
    if (given) {
      inner.vars[p.first] = *given;
    } else if (p.second) {
      inner.vars[p.first] = eval(*p.second);
    } else {
      inner.vars[p.first] =
          Value::undefined(fmt::format("parameter '{}' was not provided", p.first));
    }
  }
  ++call_depth_;
  int saved_line = line_;
  std::string body;
  try {
    body = capture(m.body);
  } catch (...) {
    --call_depth_;
    throw;
  }
  --call_depth_;
  line_ = saved_line;
  return Value(std::move(body));
}

Value Interp::lookup(const std::string& name) {
  for (Scope* s = scope_; s; s = s->parent) {
    auto it = s->vars.find(name);
    if (it != s->vars.end()) return it->second;
  }
  return Value::undefined(fmt::format("'{}' is undefined", name));
}

Value Interp::call(const Value& fn, CallArgs& args) {
  fn.require_defined();
  if (!fn.is_func()) rfail("'{}' object is not callable", fn.type_name());
  charge(1);
  return fn.func_obj().fn(*this, args);
}

Value Interp::apply_filter(const std::string& name, const Value& input, CallArgs& args) {
  FilterFn f = find_filter(name);
  if (!f) rfail("No filter named '{}'.", name);
  return f(*this, input, args);
}

bool Interp::apply_test(const std::string& name, const Value& input, CallArgs& args) {
  TestFn t = find_test(name);
  if (!t) rfail("No test named '{}'.", name);
  return t(*this, input, args);
}

void Interp::eval_args(const Expr& e, size_t first, CallArgs& out) {
  for (size_t i = first; i < e.args.size(); ++i) out.pos.push_back(eval(*e.args[i]));
  if (e.star) {
    for (Value& v : iterate(eval(*e.star))) out.pos.push_back(std::move(v));
  }
  for (const auto& kw : e.kwargs) out.kw.emplace_back(kw.first, eval(*kw.second));
  if (e.dstar) {
    Value d = eval(*e.dstar);
    if (!d.is_dict()) rfail("argument after ** must be a mapping, not {}", d.type_name());
    for (const auto& kv : d.dict_obj().items) {
      if (!kv.first.is_string()) rfail("keywords must be strings");
      out.kw.emplace_back(kv.first.str(), kv.second);
    }
  }
}

Value Interp::eval(const Expr& e) {
  int saved = line_;
  line_ = e.line;
  charge(1);
  Value v = eval_inner(e);
  line_ = saved;
  return v;
}

Value Interp::eval_inner(const Expr& e) {
  switch (e.kind) {
    case ExprKind::Literal:
      return e.literal;
    case ExprKind::Name:
      return lookup(e.name);
    case ExprKind::ListLit:
    case ExprKind::TupleLit: {
      std::vector<Value> items;
      items.reserve(e.args.size());
      for (const auto& a : e.args) items.push_back(eval(*a));
      return Value::list(std::move(items),
                         e.kind == ExprKind::ListLit ? SeqKind::List : SeqKind::Tuple);
    }
    case ExprKind::DictLit: {
      auto d = std::make_shared<DictObj>();
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        Value k = eval(*e.args[i]);
        if (k.is_list() || k.is_dict() || k.is_namespace()) {
          if (!(k.is_list() && k.list_obj().seq == SeqKind::Tuple)) {
            rfail("unhashable type: '{}'", k.type_name());
          }
        }
        d->set(std::move(k), eval(*e.args[i + 1]));
      }
      return Value(std::move(d));
    }
    case ExprKind::GetAttr:
      return getattr(eval(*e.args[0]), e.name);
    case ExprKind::GetItem: {
      Value obj = eval(*e.args[0]);
      const Expr& k = *e.args[1];
      if (k.kind == ExprKind::Slice) {
        auto part = [&](size_t i) { return k.args[i] ? eval(*k.args[i]) : Value::none(); };
        Value a = part(0), b = part(1), c = part(2);
        return slice(obj, a, b, c);
      }
      return getitem(obj, eval(k));
    }
    case ExprKind::Slice:
      rfail("a slice is only valid inside []");
    case ExprKind::Call: {
      Value fn = eval(*e.args[0]);
      CallArgs ca;
      eval_args(e, 1, ca);
      return call(fn, ca);
    }
    case ExprKind::Filter: {
      Value input = eval(*e.args[0]);
      CallArgs ca;
      eval_args(e, 1, ca);
      return e.filter(*this, input, ca);
    }
    case ExprKind::Test: {
      Value input = eval(*e.args[0]);
      CallArgs ca;
      eval_args(e, 1, ca);
      return Value(e.test(*this, input, ca) != e.negated);
    }
    case ExprKind::Neg:
    case ExprKind::Pos: {
      Value v = eval(*e.args[0]);
      v.require_defined();
      const char* op = e.kind == ExprKind::Neg ? "-" : "+";
      if (!v.is_number()) rfail("bad operand type for unary {}: '{}'", op, v.type_name());
      if (e.kind == ExprKind::Pos) return v.is_bool() ? Value(v.int_value()) : v;
      if (v.is_float()) return Value(-v.as_float());
      int64_t r = 0;
      if (__builtin_sub_overflow(int64_t{0}, v.int_value(), &r)) rfail("integer overflow");
      return Value(r);
    }
    case ExprKind::Not:
      return Value(!eval(*e.args[0]).truthy());
    case ExprKind::And: {
      Value a = eval(*e.args[0]);
      return a.truthy() ? eval(*e.args[1]) : a;
    }
    case ExprKind::Or: {
      Value a = eval(*e.args[0]);
      return a.truthy() ? a : eval(*e.args[1]);
    }
    case ExprKind::Binary: {
      Value a = eval(*e.args[0]);
      Value b = eval(*e.args[1]);
      return binop(e.name, a, b);
    }
    case ExprKind::Compare: {
      Value left = eval(*e.args[0]);
      for (size_t i = 0; i < e.ops.size(); ++i) {
        Value right = eval(*e.args[i + 1]);
        if (!compare(e.ops[i], left, right)) return Value(false);
        left = std::move(right);
      }
      return Value(true);
    }
    case ExprKind::CondExpr:
      if (eval(*e.args[1]).truthy()) return eval(*e.args[0]);
      if (e.args[2]) return eval(*e.args[2]);
      return Value::undefined(fmt::format(
          "the inline if-expression on line {} evaluated to false and no else section was defined.",
          e.line));
    case ExprKind::BlockInput:
      TM_CHECK(!block_input_.empty(), "block input outside a filter block");
      return block_input_.back();
  }
  return Value();
}

}  // namespace tokenmill::jinja
