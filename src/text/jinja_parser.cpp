#include "text/jinja_parser.h"

#include <algorithm>
#include <initializer_list>

#include "text/jinja_lexer.h"
#include "util/error.h"

namespace tokenmill::jinja {
namespace {

std::string describe(const Token& t) {
  switch (t.type) {
    case Tok::Eof:
      return "end of template";
    case Tok::VarEnd:
      return "end of print statement";
    case Tok::BlockEnd:
      return "end of statement block";
    case Tok::VarBegin:
      return "begin of print statement";
    case Tok::BlockBegin:
      return "begin of statement block";
    case Tok::Data:
      return "template data";
    case Tok::String:
      return "string";
    case Tok::Int:
      return "integer";
    case Tok::Float:
      return "float";
    default:
      return t.text;
  }
}

class Parser {
 public:
  Parser(std::vector<Token> tokens, const std::string& name)
      : toks_(std::move(tokens)), name_(name) {}

  std::vector<Stmt> parse_template() {
    std::vector<Stmt> body = parse_body({});
    return body;
  }

 private:
  struct DepthGuard {
    explicit DepthGuard(Parser& p) : p_(p) {
      if (++p_.depth_ > kMaxParseDepth) {
        p_.error(p_.cur().line,
                 fmt::format("template nesting too deep (more than {} levels)", kMaxParseDepth));
      }
    }
    ~DepthGuard() { --p_.depth_; }
    Parser& p_;
  };

  [[noreturn]] void error(int line, const std::string& msg) const {
    fail("{}:{}: {}", name_, line, msg);
  }
  const Token& cur() const { return toks_[pos_]; }
  const Token& peek(size_t k = 1) const { return toks_[std::min(pos_ + k, toks_.size() - 1)]; }
  void next() {
    if (pos_ + 1 < toks_.size()) ++pos_;
  }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) {
      error(cur().line, fmt::format("expected token '{}', got '{}'", op, describe(cur())));
    }
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) {
      error(cur().line, fmt::format("expected token 'name', got '{}'", describe(cur())));
    }
    std::string n = cur().text;
    next();
    return n;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) {
      error(cur().line,
            fmt::format("expected token 'end of statement block', got '{}'", describe(cur())));
    }
    next();
  }

  ExprPtr make(ExprKind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // ---- statements -------------------------------------------------------------------------

  // Parses until a block tag named in `ends`; leaves the position on that tag name.
  std::vector<Stmt> parse_body(std::initializer_list<const char*> ends) {
    DepthGuard guard(*this);
    std::vector<Stmt> out;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::Eof) {
        if (ends.size() == 0) return out;
        std::string want;
        for (const char* e : ends) want += (want.empty() ? "'" : " or '") + std::string(e) + "'";
        error(t.line, fmt::format("Unexpected end of template. Jinja was looking for the following "
                                  "tags: {}. The innermost block that needs to be closed is '{}'.",
                                  want, block_stack_.empty() ? "" : block_stack_.back()));
      }
      if (t.type == Tok::Data) {
        Stmt s{StmtKind::Text, t.line};
        s.text = t.text;
        out.push_back(std::move(s));
        next();
      } else if (t.type == Tok::VarBegin) {
        Stmt s{StmtKind::Output, t.line};
        next();
        s.expr = parse_tuple(true);
        if (cur().type != Tok::VarEnd) {
          error(cur().line,
                fmt::format("expected token 'end of print statement', got '{}'", describe(cur())));
        }
        next();
        out.push_back(std::move(s));
      } else if (t.type == Tok::BlockBegin) {
        next();
        if (cur().type != Tok::Name) error(cur().line, "tag name expected");
        for (const char* e : ends) {
          if (cur().text == e) return out;
        }
        out.push_back(parse_statement());
      } else {
        error(t.line, fmt::format("unexpected '{}'", describe(t)));
      }
    }
  }

  // After parse_body stopped on `end`, consumes "end %}".
  void finish_block() {
    next();
    expect_block_end();
  }

  Stmt parse_statement() {
    const Token& t = cur();
    std::string tag = t.text;
    int line = t.line;
    next();
    if (tag == "if") return parse_if(line);
    if (tag == "for") return parse_for(line);
    if (tag == "set") return parse_set(line);
    if (tag == "macro") return parse_macro(line);
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) error(line, fmt::format("'{}' outside loop", tag));
      expect_block_end();
      return Stmt{tag == "break" ? StmtKind::Break : StmtKind::Continue, line};
    }
    if (tag == "generation") {
      Stmt s{StmtKind::Generation, line};
      expect_block_end();
      block_stack_.push_back(tag);
      s.body = parse_body({"endgeneration"});
      block_stack_.pop_back();
      finish_block();
      return s;
    }
    if (tag == "with") {
      Stmt s{StmtKind::With, line};
      while (cur().type != Tok::BlockEnd) {
        if (!s.params.empty()) expect_op(",");
        std::string n = expect_name();
        expect_op("=");
        s.params.emplace_back(n, parse_expression());
      }
      next();
      block_stack_.push_back(tag);
      s.body = parse_body({"endwith"});
      block_stack_.pop_back();
      finish_block();
      return s;
    }
    if (tag == "filter") {
      Stmt s{StmtKind::FilterBlock, line};
      s.filter = parse_filter_chain(parse_filter(make(ExprKind::BlockInput, line)));
      expect_block_end();
      block_stack_.push_back(tag);
      s.body = parse_body({"endfilter"});
      block_stack_.pop_back();
      finish_block();
      return s;
    }
    if (tag == "call" || tag == "include" || tag == "import" || tag == "from" || tag == "extends" ||
        tag == "block") {
      error(line, fmt::format("the '{}' tag is not supported by this chat-template engine", tag));
    }
    error(line, fmt::format("Encountered unknown tag '{}'.", tag));
  }

  Stmt parse_if(int line) {
    Stmt s{StmtKind::If, line};
    s.expr = parse_tuple(false);
    expect_block_end();
    block_stack_.push_back("if");
    s.body = parse_body({"elif", "else", "endif"});
    block_stack_.pop_back();
    if (is_name("elif")) {
      int l = cur().line;
      next();
      s.else_body.push_back(parse_if(l));
      return s;  // the nested if consumed endif
    }
    if (is_name("else")) {
      next();
      expect_block_end();
      block_stack_.push_back("if");
      s.else_body = parse_body({"endif"});
      block_stack_.pop_back();
    }
    finish_block();
    return s;
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> out;
    bool paren = skip_op("(");
    do {
      if (is_name("in") || is_op(")") || is_op("=")) break;
      out.push_back(expect_name());
    } while (skip_op(","));
    if (paren) expect_op(")");
    if (out.empty()) error(cur().line, "expected an assignment target");
    return out;
  }

  Stmt parse_for(int line) {
    Stmt s{StmtKind::For, line};
    s.targets = parse_targets();
    if (!skip_name("in"))
      error(cur().line, fmt::format("expected token 'in', got '{}'", describe(cur())));
    s.expr = parse_tuple(false, /*with_condexpr=*/false);
    if (skip_name("if")) s.cond = parse_expression();
    if (is_name("recursive")) error(cur().line, "recursive for loops are not supported");
    expect_block_end();
    block_stack_.push_back("for");
    ++loop_depth_;
    s.body = parse_body({"endfor", "else"});
    --loop_depth_;
    if (is_name("else")) {
      next();
      expect_block_end();
      s.else_body = parse_body({"endfor"});
    }
    block_stack_.pop_back();
    finish_block();
    return s;
  }

  Stmt parse_set(int line) {
    Stmt s{StmtKind::Set, line};
    if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == ".") {
      s.targets.push_back(expect_name());
      next();
      s.attr = expect_name();
      s.has_attr = true;
    } else {
      s.targets = parse_targets();
    }
    if (skip_op("=")) {
      s.expr = parse_tuple(false);
      expect_block_end();
      return s;
    }
    if (s.has_attr || s.targets.size() != 1) {
      error(cur().line, fmt::format("expected token '=', got '{}'", describe(cur())));
    }
    s.kind = StmtKind::SetBlock;
    if (is_op("|")) s.filter = parse_filter_chain(make(ExprKind::BlockInput, line));
    expect_block_end();
    block_stack_.push_back("set");
    int saved_loops = loop_depth_;
    s.body = parse_body({"endset"});
    loop_depth_ = saved_loops;
    block_stack_.pop_back();
    finish_block();
    return s;
  }

  Stmt parse_macro(int line) {
    Stmt s{StmtKind::Macro, line};
    s.text = expect_name();
    expect_op("(");
    while (!is_op(")")) {
      if (!s.params.empty()) expect_op(",");
      if (is_op(")")) break;
      std::string n = expect_name();
      ExprPtr def;
      if (skip_op("=")) {
        def = parse_expression();
      } else if (!s.params.empty() && s.params.back().second) {
        error(cur().line, "non-default argument follows default argument");
      }
      s.params.emplace_back(n, std::move(def));
    }
    next();
    expect_block_end();
    block_stack_.push_back("macro");
    int saved_loops = loop_depth_;
    loop_depth_ = 0;
    s.body = parse_body({"endmacro"});
    loop_depth_ = saved_loops;
    block_stack_.pop_back();
    finish_block();
    return s;
  }

  // ---- expressions ------------------------------------------------------------------------

  ExprPtr parse_tuple(bool allow_tuple, bool with_condexpr = true) {
    int line = cur().line;
    ExprPtr first = with_condexpr ? parse_expression() : parse_or();
    if (!is_op(",")) return first;
    auto tup = make(ExprKind::TupleLit, line);
    tup->literal = Value::none();
    tup->args.push_back(std::move(first));
    while (skip_op(",")) {
      if (cur().type == Tok::VarEnd || cur().type == Tok::BlockEnd || is_op(")")) break;
      if (!allow_tuple && is_name("if")) break;
      tup->args.push_back(with_condexpr ? parse_expression() : parse_or());
    }
    return tup;
  }

  ExprPtr parse_expression() {
    DepthGuard guard(*this);
    int line = cur().line;
    ExprPtr e = parse_or();
    while (is_name("if")) {
      next();
      auto c = make(ExprKind::CondExpr, line);
      ExprPtr cond = parse_or();
      ExprPtr other;
      if (skip_name("else")) other = parse_expression();
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(ExprKind k, ExprPtr a, ExprPtr b, int line, std::string op = "") {
    auto e = make(k, line);
    e->name = std::move(op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    int line = cur().line;
    ExprPtr e = parse_and();
    while (skip_name("or")) e = binary(ExprKind::Or, std::move(e), parse_and(), line);
    return e;
  }
  ExprPtr parse_and() {
    int line = cur().line;
    ExprPtr e = parse_not();
    while (skip_name("and")) e = binary(ExprKind::And, std::move(e), parse_not(), line);
    return e;
  }
  ExprPtr parse_not() {
    DepthGuard guard(*this);
    if (is_name("not")) {
      auto e = make(ExprKind::Not, cur().line);
      next();
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr e = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::Op &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
           cur().text == ">" || cur().text == ">=")) {
        op = cur().text;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
        op = "not in";
        next();
        next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(ExprKind::Compare, line);
        cmp->args.push_back(std::move(e));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(e);
  }
  ExprPtr parse_math1() {
    int line = cur().line;
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = cur().text;
      next();
      e = binary(ExprKind::Binary, std::move(e), parse_concat(), line, op);
    }
    return e;
  }
  ExprPtr parse_concat() {
    int line = cur().line;
    ExprPtr e = parse_math2();
    while (skip_op("~")) e = binary(ExprKind::Binary, std::move(e), parse_math2(), line, "~");
    return e;
  }
  ExprPtr parse_math2() {
    int line = cur().line;
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = cur().text;
      next();
      e = binary(ExprKind::Binary, std::move(e), parse_pow(), line, op);
    }
    return e;
  }
  ExprPtr parse_pow() {
    int line = cur().line;
    ExprPtr e = parse_unary(true);
    while (skip_op("**")) e = binary(ExprKind::Binary, std::move(e), parse_unary(true), line, "**");
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    int line = cur().line;
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = make(is_op("-") ? ExprKind::Neg : ExprKind::Pos, line);
      next();
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    int line = t.line;
    if (t.type == Tok::Name) {
      std::string n = t.text;
      next();
      auto e = make(ExprKind::Literal, line);
      if (n == "true" || n == "True") {
        e->literal = Value(true);
      } else if (n == "false" || n == "False") {
        e->literal = Value(false);
      } else if (n == "none" || n == "None") {
        e->literal = Value::none();
      } else {
        e->kind = ExprKind::Name;
        e->name = n;
      }
      return e;
    }
    if (t.type == Tok::String) {
      std::string s;
      while (cur().type == Tok::String) {
        s += cur().text;
        next();
      }
      auto e = make(ExprKind::Literal, line);
      e->literal = Value(std::move(s));
      return e;
    }
    if (t.type == Tok::Int || t.type == Tok::Float) {
      auto e = make(ExprKind::Literal, line);
      e->literal = t.type == Tok::Int ? Value(t.ival) : Value(t.fval);
      next();
      return e;
    }
    if (is_op("(")) {
      next();
      if (skip_op(")")) {
        auto e = make(ExprKind::TupleLit, line);
        return e;
      }
      ExprPtr inner = parse_tuple(true);
      bool trailing = false;
      if (inner->kind != ExprKind::TupleLit && is_op(",")) trailing = true;
      expect_op(")");
      (void)trailing;
      return inner;
    }
    if (is_op("[")) {
      next();
      auto e = make(ExprKind::ListLit, line);
      while (!is_op("]")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("]")) break;
        e->args.push_back(parse_expression());
      }
      next();
      return e;
    }
    if (is_op("{")) {
      next();
      auto e = make(ExprKind::DictLit, line);
      while (!is_op("}")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("}")) break;
        e->args.push_back(parse_expression());
        expect_op(":");
        e->args.push_back(parse_expression());
      }
      next();
      return e;
    }
    if (t.type == Tok::Op) error(line, fmt::format("unexpected '{}'", t.text));
    error(line, fmt::format("Expected an expression, got '{}'", describe(t)));
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      int line = cur().line;
      if (is_op(".")) {
        next();
        if (cur().type == Tok::Name) {
          auto g = make(ExprKind::GetAttr, line);
          g->name = cur().text;
          next();
          g->args.push_back(std::move(e));
          e = std::move(g);
        } else if (cur().type == Tok::Int) {
          auto g = make(ExprKind::GetItem, line);
          auto k = make(ExprKind::Literal, line);
          k->literal = Value(cur().ival);
          next();
          g->args.push_back(std::move(e));
          g->args.push_back(std::move(k));
          e = std::move(g);
        } else {
          error(line, "expected name or number");
        }
      } else if (is_op("[")) {
        next();
        auto g = make(ExprKind::GetItem, line);
        g->args.push_back(std::move(e));
        std::vector<ExprPtr> keys;
        do {
          if (is_op("]")) break;
          keys.push_back(parse_subscript());
        } while (skip_op(","));
        expect_op("]");
        if (keys.size() == 1) {
          g->args.push_back(std::move(keys[0]));
        } else {
          auto tup = make(ExprKind::TupleLit, line);
          tup->args = std::move(keys);
          g->args.push_back(std::move(tup));
        }
        e = std::move(g);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript() {
    int line = cur().line;
    ExprPtr start;
    if (!is_op(":")) {
      start = parse_expression();
      if (!is_op(":")) return start;
    }
    next();  // ':'
    auto s = make(ExprKind::Slice, line);
    ExprPtr stop, step;
    if (!is_op("]") && !is_op(",") && !is_op(":")) stop = parse_expression();
    if (skip_op(":")) {
      if (!is_op("]") && !is_op(",")) step = parse_expression();
    }
    s->args.push_back(std::move(start));
    s->args.push_back(std::move(stop));
    s->args.push_back(std::move(step));
    return s;
  }

  // Parses "(args)" into e's args (after the existing args[0..]) and kwargs.
  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) {
        expect_op(",");
        if (is_op(")")) break;
      }
      first = false;
      if (skip_op("*")) {
        e.star = parse_expression();
      } else if (skip_op("**")) {
        e.dstar = parse_expression();
      } else if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
        std::string k = cur().text;
        next();
        next();
        e.kwargs.emplace_back(k, parse_expression());
      } else {
        if (!e.kwargs.empty()) error(cur().line, "invalid syntax for function call expression");
        e.args.push_back(parse_expression());
      }
    }
    next();
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto c = make(ExprKind::Call, cur().line);
    c->args.push_back(std::move(callee));
    parse_call_args(*c);
    return c;
  }

  std::string parse_dotted_name() {
    std::string n = expect_name();
    while (is_op(".") && peek().type == Tok::Name) {
      next();
      n += "." + cur().text;
      next();
    }
    return n;
  }

  ExprPtr parse_filter(ExprPtr input) {
    int line = cur().line;
    auto f = make(ExprKind::Filter, line);
    f->name = parse_dotted_name();
    f->filter = find_filter(f->name);
    if (!f->filter) error(line, fmt::format("No filter named '{}'.", f->name));
    f->args.push_back(std::move(input));
    if (is_op("(")) parse_call_args(*f);
    return f;
  }

  ExprPtr parse_filter_chain(ExprPtr input) {
    while (skip_op("|")) input = parse_filter(std::move(input));
    return input;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (skip_op("|")) {
        e = parse_filter(std::move(e));
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_test(ExprPtr input) {
    int line = cur().line;
    next();  // 'is'
    auto t = make(ExprKind::Test, line);
    t->negated = skip_name("not");
    t->name = parse_dotted_name();
    t->test = find_test(t->name);
    if (!t->test) error(line, fmt::format("No test named '{}'.", t->name));
    t->args.push_back(std::move(input));
    const Token& c = cur();
    if (is_op("(")) {
      parse_call_args(*t);
    } else if ((c.type == Tok::Name || c.type == Tok::String || c.type == Tok::Int ||
                c.type == Tok::Float || is_op("[") || is_op("{")) &&
               !(is_name("else") || is_name("or") || is_name("and"))) {
      if (is_name("is")) error(line, "You cannot chain multiple tests with is");
      t->args.push_back(parse_postfix(parse_primary()));
    }
    return t;
  }

  std::vector<Token> toks_;
  const std::string& name_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::vector<std::string> block_stack_;
};

}  // namespace

std::shared_ptr<const Program> parse(std::string_view source, const std::string& source_name) {
  auto prog = std::make_shared<Program>();
  prog->name = source_name;
  Parser p(lex(source, source_name), prog->name);
  prog->body = p.parse_template();
  return prog;
}

}  // namespace tokenmill::jinja
