// The tree-walking interpreter behind jinja::Template (jinja.h). Internal: filters, tests and
// methods (jinja_filters.cpp, jinja_tests.cpp, jinja_ops.cpp) call back into it.
//
// Scoping follows jinja2: a for-loop iteration, a macro call and a with-block open a scope;
// if-blocks do not; `set` writes to the innermost scope, so values set inside a loop vanish after
// it (templates carry state out through namespace()). Macros see the template's top-level scope.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/jinja_ast.h"
#include "text/jinja_value.h"

namespace tokenmill::jinja {

struct RenderLimits {
  uint64_t max_steps = 20'000'000;  // expression evaluations + loop iterations + items processed
  size_t max_output = 16u << 20;    // bytes of output and of any one string built
  int max_call_depth = 64;          // nested macro calls
};

struct RenderOptions {
  RenderLimits limits;
  // Seconds since the Unix epoch that strftime_now() formats (as UTC); unset: the current local
  // time, as transformers does.
  std::optional<int64_t> now_unix;
};

struct Scope {
  std::unordered_map<std::string, Value> vars;
  Scope* parent = nullptr;
};

class Interp {
 public:
  Interp(const Program& program, const RenderOptions& options);

  // Renders with the given variables; throws tokenmill::Error "<source>:<line>: <message>".
  // size_hint: expected output bytes (reserved up front).
  std::string render(const std::vector<std::pair<std::string, Value>>& vars, size_t size_hint = 0);

  // ---- used by filters, tests and methods ----
  Value call(const Value& fn, CallArgs& args);
  Value getattr(const Value& obj, const std::string& name);
  Value getitem(const Value& obj, const Value& key);
  Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
  Value binop(const std::string& op, const Value& a, const Value& b);
  bool compare(const std::string& op, const Value& a, const Value& b);
  bool contains(const Value& container, const Value& item);
  Value apply_filter(const std::string& name, const Value& input, CallArgs& args);
  bool apply_test(const std::string& name, const Value& input, CallArgs& args);
  // Charges work against max_steps; raises when the budget is spent.
  void charge(uint64_t n = 1);
  // Raises when a string of n bytes would exceed max_output.
  void check_size(size_t n) const;
  const RenderOptions& options() const { return opts_; }

 private:
  enum class Flow { Normal, Break, Continue };

  Flow exec(const std::vector<Stmt>& body);
  Flow exec_stmt(const Stmt& s);
  void exec_for(const Stmt& s, Flow& flow);
  void exec_set(const Stmt& s);
  std::string capture(const std::vector<Stmt>& body);
  void emit(std::string_view s);
  void assign(const std::vector<std::string>& targets, const Value& v);
  Value eval(const Expr& e);
  Value eval_inner(const Expr& e);
  void eval_args(const Expr& e, size_t first, CallArgs& out);
  Value lookup(const std::string& name);
  Value builtin(const std::string& name);
  Value call_macro(const Stmt& macro, CallArgs& args);

  const Program& program_;
  RenderOptions opts_;
  Scope globals_;
  Scope* root_ = nullptr;
  Scope* scope_ = nullptr;
  std::string* out_ = nullptr;
  size_t total_out_ = 0;
  size_t size_hint_ = 0;
  uint64_t steps_ = 0;
  int call_depth_ = 0;
  int line_ = 0;
  std::vector<Value> block_input_;  // stack of captured bodies for BlockInput
};

// Type-specific attribute lookup (methods of str / dict / list), jinja_methods.cpp.
// Returns true and sets out when `name` is an attribute of obj's Python type.
bool builtin_method(Interp& in, const Value& obj, const std::string& name, Value& out);

// Argument binding for builtins: positional-or-keyword parameters by name.
class Params {
 public:
  Params(const char* func, CallArgs& args, std::initializer_list<const char*> names);
  const Value* get(size_t i) const;  // nullptr when not given
  Value get_or(size_t i, Value def) const {
    const Value* v = get(i);
    return v ? *v : std::move(def);
  }
  size_t extra_positional() const;  // positional args beyond the named ones
  const Value& positional(size_t i) const { return args_.pos[i]; }

 private:
  const char* func_;
  CallArgs& args_;
  std::vector<const char*> names_;
};

// Python-style formatting: str % args and str.format(...).
std::string percent_format(const std::string& fmt, const Value& args);

}  // namespace tokenmill::jinja
