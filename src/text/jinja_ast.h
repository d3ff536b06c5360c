// Syntax tree of a parsed Jinja template. Nodes carry their source line for error messages.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja_value.h"

namespace tokenmill::jinja {

using FilterFn = Value (*)(Interp&, const Value& input, CallArgs& args);
using TestFn = bool (*)(Interp&, const Value& input, CallArgs& args);

enum class ExprKind : uint8_t {
  Literal,     // literal
  Name,        // name
  ListLit,     // args
  TupleLit,    // args
  DictLit,     // args: key0, value0, key1, value1, ...
  GetAttr,     // args[0].name
  GetItem,     // args[0][args[1]]
  Slice,       // args[0..2]: start, stop, step (null when omitted)
  Call,        // args[0](args[1..], kwargs, *star, **dstar)
  Filter,      // args[0] | name(args[1..], kwargs)
  Test,        // args[0] is [not] name(args[1..], kwargs)
  Neg,         // -args[0]
  Pos,         // +args[0]
  Not,         // not args[0]
  And,         // args[0] and args[1]
  Or,          // args[0] or args[1]
  Binary,      // args[0] <name> args[1]; name in + - * / // % ** ~
  Compare,     // args[0] ops[0] args[1] ops[1] args[2] ...
  CondExpr,    // args[0] if args[1] else args[2] (args[2] null: undefined)
  BlockInput,  // the captured body of {% set x | f %} / {% filter f %}
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind;
  int line = 0;
  std::string name;
  Value literal;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  ExprPtr star, dstar;
  std::vector<std::string> ops;
  bool negated = false;
  FilterFn filter = nullptr;  // resolved at parse time, as jinja2 does
  TestFn test = nullptr;
};

enum class StmtKind : uint8_t {
  Text,      // text
  Output,    // {{ expr }}
  If,        // expr, body, else_body (elif nests an If in else_body)
  For,       // targets in expr [if cond], body, else_body
  Set,       // targets (or targets[0].attr when attr set) = expr
  SetBlock,  // {% set targets[0] [| filter] %}body{% endset %}
  Macro,     // text = name, params, body
  Break,
  Continue,
  Generation,   // HF's {% generation %}: renders its body
  With,         // params = assignments, body
  FilterBlock,  // filter applied to body
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr cond;
  ExprPtr filter;
  std::vector<std::string> targets;
  std::string attr;
  bool has_attr = false;
  std::vector<std::pair<std::string, ExprPtr>> params;
  std::vector<Stmt> body, else_body;
};

struct Program {
  std::string name;
  std::vector<Stmt> body;
};

}  // namespace tokenmill::jinja
