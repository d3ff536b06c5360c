#include "server/tool_call_constraint.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <string_view>

#include "server/api_error.h"
#include "server/json_grammar.h"

namespace tokenmill::server {

using json = nlohmann::ordered_json;
using json_grammar::Matcher;
using json_grammar::Node;

namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kXmlCallOpen = "<tool_call>\n<function=";
constexpr std::string_view kJsonCallOpen = "<tool_call>\n";
constexpr std::string_view kParamOpen = "<parameter=";
constexpr std::string_view kParamClose = "</parameter>";
constexpr std::string_view kParamCloseNl = "</parameter>\n";
constexpr std::string_view kFunctionClose = "</function>\n</tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kNewline = "\n";
// The tags that end an XML parameter value in the output parser (tool_call_parser.cpp). All
// start with '<' and hold no other '<'.
constexpr std::array<std::string_view, 4> kValueEnds = {kParamClose, kParamOpen, "</function>",
                                                        kCallClose};
constexpr std::array<std::string_view, 1> kThinkEnds = {kThinkClose};
constexpr std::array<std::string_view, 1> kCallEnds = {kCallClose};
constexpr size_t kMaxFreeName = 64;  // free parameter names: bytes
constexpr int kMaxFreeParams = 32;   // free parameter names: parameters per call

// Where a literal or a completed choice leads.
enum class Next : uint8_t {
  kReasoning,
  kCallStart,
  kFuncName,
  kJsonBody,
  kParamName,
  kValue,
  kParamOrEnd,
  kAfterCall
};

enum class Phase : uint8_t {
  kLiteral,     // lit[pos..], then `next`
  kReasoning,   // free text up to "</think>"
  kAfterThink,  // at most two '\n', then a call
  kFuncName,    // buf: a prefix of a tool's NAME + ">\n"
  kParamName,   // buf: a prefix of an unseen property's P + ">\n" (free names: name bytes)
  kValueRaw,    // free text up to "</parameter>"
  kValueEnum,   // buf: a prefix of one of the parameter's choices
  kValueJson,   // json: the value; "</parameter>" once it is complete
  kJsonBody,    // json: the call object; "</tool_call>" once it is complete
  kAfterCall,   // end of generation, or "\n" and another call
  kEnd,         // end of generation only
};

// Tracks the tail of a text that could still grow into one of `tags`. Returns the tag that `c`
// completes, or "" when none.
std::string_view track(std::string& pending, uint8_t c, std::span<const std::string_view> tags) {
  if (c == '<') {
    pending.assign(1, '<');
    return {};
  }
  if (pending.empty()) return {};
  pending.push_back(char(c));
  bool prefix = false;
  for (std::string_view t : tags) {
    if (t == pending) {
      pending.clear();
      return t;
    }
    prefix = prefix || t.starts_with(pending);
  }
  if (!prefix) pending.clear();
  return {};
}

// Adds `c` to `buf` among candidates (nullptr = not offered). Returns the index of the candidate
// that buf now equals, -1 while buf is a proper prefix of one, -2 when it matches none. No
// candidate is a prefix of another (each ends in a terminator that no candidate holds earlier).
template <typename F>
int choose(std::string& buf, uint8_t c, size_t n, F candidate) {
  buf.push_back(char(c));
  bool open = false;
  for (size_t i = 0; i < n; ++i) {
    const std::string* s = candidate(i);
    if (!s || s->size() < buf.size() || s->compare(0, buf.size(), buf) != 0) continue;
    if (s->size() == buf.size()) return int(i);
    open = true;
  }
  return open ? -1 : -2;
}

bool free_name_byte(uint8_t c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-' || c == '.';
}

bool holds_tag(std::string_view s) {
  return std::any_of(kValueEnds.begin(), kValueEnds.end(),
                     [&](std::string_view t) { return s.find(t) != std::string_view::npos; });
}

std::string unescape(const std::string& inner) {
  return json::parse("\"" + inner + "\"").get<std::string>();
}

// A tool's parameters schema as an object schema: anything that is not plainly one (no schema,
// a top-level anyOf / $ref / enum, another type) becomes {"type": "object"} (any arguments).
json object_schema(const json* params) {
  if (!params || !params->is_object()) return {{"type", "object"}};
  for (const char* k : {"anyOf", "oneOf", "allOf", "$ref", "enum", "const", "not"}) {
    if (params->contains(k)) return {{"type", "object"}};
  }
  if (params->contains("type") && (*params)["type"] != "object") return {{"type", "object"}};
  json s = *params;
  s["type"] = "object";
  return s;
}

}  // namespace

class ToolCallGrammar {
 public:
  struct State {
    Phase phase = Phase::kLiteral;
    Next next = Next::kCallStart;  // kLiteral
    uint16_t pos = 0;              // kLiteral
    std::string_view lit;          // kLiteral
    int16_t tool = -1, param = -1;
    uint8_t count = 0;  // kAfterThink: newlines; free names: parameters given
    uint64_t seen = 0;  // properties given
    std::string buf;    // choice so far, or the tail that may become a tag
    std::optional<Matcher> json;
  };

  struct Param {
    enum class Mode : uint8_t { kRaw, kEnum, kJson } mode = Mode::kRaw;
    std::string choice;                // P + ">\n"; empty: never offered (unusable name)
    std::vector<std::string> choices;  // kEnum: VALUE + "\n</parameter>\n" (after "P>\n")
    const Node* node = nullptr;        // kJson
  };
  struct Tool {
    std::vector<Param> params;
    uint64_t required = 0;
    bool free_names = false;
  };

  ToolCallGrammarSpec spec;
  std::vector<Tool> tools;
  std::vector<std::string> func_choices;  // NAME + ">\n"
  std::vector<std::unique_ptr<json_grammar::Grammar>> grammars;
  const Node* json_root = nullptr;  // JSON format: anyOf over the tools' call objects

  std::vector<State> initial() const {
    std::vector<State> out;
    State s;
    switch (spec.reasoning) {
      case ToolCallGrammarSpec::Reasoning::kOpen:
        enter(Next::kReasoning, s, out);
        break;
      case ToolCallGrammarSpec::Reasoning::kOptional:
        out.push_back(literal(s, kThinkOpen, Next::kReasoning));
        enter(Next::kCallStart, s, out);
        break;
      case ToolCallGrammarSpec::Reasoning::kNone:
        enter(Next::kCallStart, s, out);
        break;
    }
    return out;
  }

  static bool can_end(const State& s) {
    return s.phase == Phase::kAfterCall || s.phase == Phase::kEnd;
  }

  void feed(std::vector<State>& states, uint8_t c) const {
    std::vector<State> next;
    for (auto& s : states) step(std::move(s), c, next);
    states = std::move(next);
  }
  // out = the states after `c` from `in` (in is left as it was).
  void feed_into(const std::vector<State>& in, uint8_t c, std::vector<State>& out) const {
    out.clear();
    for (const auto& s : in) step(s, c, out);
  }

 private:
  static State literal(State s, std::string_view text, Next next, uint16_t pos = 0) {
    s.phase = Phase::kLiteral;
    s.lit = text;
    s.pos = pos;
    s.next = next;
    return s;
  }

  void enter(Next n, State s, std::vector<State>& out) const {
    s.buf.clear();
    switch (n) {
      case Next::kReasoning:
        s.phase = Phase::kReasoning;
        break;
      case Next::kCallStart:
        s.tool = s.param = -1;
        s.json.reset();
        s = spec.format == ToolCallFormat::kJson ? literal(s, kJsonCallOpen, Next::kJsonBody)
                                                 : literal(s, kXmlCallOpen, Next::kFuncName);
        break;
      case Next::kFuncName:
        s.phase = Phase::kFuncName;
        break;
      case Next::kJsonBody:
        s.phase = Phase::kJsonBody;
        s.json.emplace(json_root);
        break;
      case Next::kParamName:
        s.phase = Phase::kParamName;
        break;
      case Next::kValue: {
        const Param* p = s.param >= 0 ? &tools[s.tool].params[s.param] : nullptr;
        if (p && p->mode == Param::Mode::kJson) {
          s.phase = Phase::kValueJson;
          s.json.emplace(p->node);
        } else {
          s.phase = p && p->mode == Param::Mode::kEnum ? Phase::kValueEnum : Phase::kValueRaw;
        }
        break;
      }
      case Next::kParamOrEnd: {
        s.json.reset();
        const Tool& t = tools[s.tool];
        bool more = t.free_names && s.count < kMaxFreeParams;
        for (size_t i = 0; i < t.params.size() && !more; ++i) {
          more = !(s.seen >> i & 1) && !t.params[i].choice.empty();
        }
        if (more) out.push_back(literal(s, kParamOpen, Next::kParamName));
        if ((s.seen & t.required) == t.required) {
          out.push_back(literal(s, kFunctionClose, Next::kAfterCall));
        }
        return;
      }
      case Next::kAfterCall:
        s.json.reset();
        s.phase = spec.parallel ? Phase::kAfterCall : Phase::kEnd;
        break;
    }
    out.push_back(std::move(s));
  }

  void step(State s, uint8_t c, std::vector<State>& out) const {
    switch (s.phase) {
      case Phase::kLiteral:
        if (uint8_t(s.lit[s.pos]) != c) return;
        if (++s.pos == s.lit.size()) {
          enter(s.next, std::move(s), out);
        } else {
          out.push_back(std::move(s));
        }
        return;
      case Phase::kReasoning:
        if (!track(s.buf, c, kThinkEnds).empty()) {
          s.phase = Phase::kAfterThink;
          s.count = 0;
        }
        out.push_back(std::move(s));
        return;
      case Phase::kAfterThink: {
        if (c == '\n' && s.count < 2) {
          s.count++;
          out.push_back(std::move(s));
          return;
        }
        std::vector<State> starts;
        enter(Next::kCallStart, std::move(s), starts);
        for (auto& x : starts) step(std::move(x), c, out);
        return;
      }
      case Phase::kFuncName: {
        int r = choose(s.buf, c, func_choices.size(), [&](size_t i) { return &func_choices[i]; });
        if (r == -2) return;
        if (r >= 0) {
          s.tool = int16_t(r);
          s.seen = 0;
          s.count = 0;
          enter(Next::kParamOrEnd, std::move(s), out);
          return;
        }
        out.push_back(std::move(s));
        return;
      }
      case Phase::kParamName: {
        const Tool& t = tools[s.tool];
        if (t.free_names) {
          if (c == '>' && !s.buf.empty()) {
            s.param = -1;
            s.count++;
            out.push_back(literal(std::move(s), kNewline, Next::kValue));
          } else if (free_name_byte(c) && s.buf.size() < kMaxFreeName) {
            s.buf.push_back(char(c));
            out.push_back(std::move(s));
          }
          return;
        }
        int r = choose(s.buf, c, t.params.size(), [&](size_t i) {
          const Param& p = t.params[i];
          return (s.seen >> i & 1) || p.choice.empty() ? nullptr : &p.choice;
        });
        if (r == -2) return;
        if (r >= 0) {
          s.param = int16_t(r);
          s.seen |= uint64_t(1) << r;
          enter(Next::kValue, std::move(s), out);
          return;
        }
        out.push_back(std::move(s));
        return;
      }
      case Phase::kValueRaw: {
        std::string_view tag = track(s.buf, c, kValueEnds);
        if (tag == kParamClose) {
          out.push_back(literal(std::move(s), kNewline, Next::kParamOrEnd));
        } else if (tag.empty()) {
          out.push_back(std::move(s));
        }
        return;
      }
      case Phase::kValueEnum: {
        const auto& choices = tools[s.tool].params[s.param].choices;
        int r = choose(s.buf, c, choices.size(), [&](size_t i) { return &choices[i]; });
        if (r == -2) return;
        if (r >= 0) {
          enter(Next::kParamOrEnd, std::move(s), out);
          return;
        }
        out.push_back(std::move(s));
        return;
      }
      case Phase::kValueJson:
      case Phase::kJsonBody: {
        const bool body = s.phase == Phase::kJsonBody;
        if (c == '<' && s.json->complete()) {
          out.push_back(body ? literal(std::move(s), kCallClose, Next::kAfterCall, 1)
                             : literal(std::move(s), kParamCloseNl, Next::kParamOrEnd, 1));
          return;
        }
        if (!s.json->feed(c)) return;
        if (!track(s.buf, c,
                   body ? std::span<const std::string_view>(kCallEnds)
                        : std::span<const std::string_view>(kValueEnds))
                 .empty()) {
          return;  // a tag inside a JSON string would end the call early
        }
        out.push_back(std::move(s));
        return;
      }
      case Phase::kAfterCall:
        if (c != '\n') return;
        enter(Next::kCallStart, std::move(s), out);
        return;
      case Phase::kEnd:
        return;
    }
  }
};

namespace {

using Param = ToolCallGrammar::Param;

// How an XML parameter value is written: raw text when its schema admits strings, else JSON.
void classify(const Node* n, int depth, bool& free_text, bool& other,
              std::vector<std::string>& raws) {
  if (depth > 16) {
    free_text = true;
    return;
  }
  switch (n->t) {
    case Node::kAny:
      free_text = true;
      return;
    case Node::kString:
      if (n->enums.empty()) {
        free_text = true;
      } else {
        for (const auto& e : n->enums) raws.push_back(unescape(e));
      }
      return;
    case Node::kLiteral:
      raws.push_back(n->literal);
      return;
    case Node::kAnyOf:
      for (const Node* o : n->options) classify(o, depth + 1, free_text, other, raws);
      return;
    default:
      other = true;
      return;
  }
}

Param make_param(const std::string& name, const Node* node) {
  Param p;
  if (!name.empty() && name.find_first_of("<>\n") == std::string::npos) p.choice = name + ">\n";
  bool free_text = false, other = false;
  std::vector<std::string> raws;  // listed values: a string's raw text, another value's JSON
  classify(node, 0, free_text, other, raws);
  if (other && raws.empty() && !free_text) {
    p.mode = Param::Mode::kJson;  // no string admitted: a JSON value of the schema
    p.node = node;
    return p;
  }
  p.mode = Param::Mode::kRaw;  // strings admitted (or listed values mixed with a type): raw text
  if (free_text || other) return p;
  std::set<std::string> uniq;
  for (const auto& r : raws) {
    if (holds_tag(r) || r.find('\n') != std::string::npos) continue;
    if (uniq.insert(r).second) p.choices.push_back(r + "\n</parameter>\n");
  }
  // Only listed values: exactly one of them (none usable: free text rather than no value).
  if (!p.choices.empty()) p.mode = Param::Mode::kEnum;
  return p;
}

}  // namespace

std::shared_ptr<const ToolCallGrammar> compile_tool_call_grammar(const ToolCallGrammarSpec& spec) {
  auto g = std::make_shared<ToolCallGrammar>();
  g->spec = spec;
  if (spec.tools.empty()) throw ApiError(400, "tool_choice needs at least one tool", "tools");
  auto json_any = std::make_unique<json_grammar::Grammar>();
  Node* any_call = json_any->make(Node::kAnyOf);
  for (size_t i = 0; i < spec.tools.size(); ++i) {
    const json& fn = spec.tools[i]["function"];
    const std::string name = fn["name"].get<std::string>();
    const json* params = fn.contains("parameters") ? &fn["parameters"] : nullptr;
    json_grammar::SchemaOptions opts;
    opts.lenient = true;
    opts.param = i < spec.schema_params.size() ? spec.schema_params[i]
                                               : fmt::format("tools[{}].function.parameters", i);
    json schema = object_schema(params);
    g->func_choices.push_back(name + ">\n");
    ToolCallGrammar::Tool tool;
    if (spec.format == ToolCallFormat::kJson) {
      json call = {{"type", "object"},
                   {"properties", {{"name", {{"const", name}}}, {"arguments", schema}}},
                   {"required", {"name", "arguments"}},
                   {"additionalProperties", false}};
      for (const char* defs : {"$defs", "definitions"}) {
        if (schema.contains(defs)) call[defs] = schema[defs];
      }
      g->grammars.push_back(json_grammar::build_grammar(call, false, opts));
      any_call->options.push_back(g->grammars.back()->root);
    } else {
      g->grammars.push_back(json_grammar::build_grammar(schema, false, opts));
      const Node* root = g->grammars.back()->root;  // an object node (object_schema)
      tool.free_names = root->props.empty() && root->additional != nullptr;
      for (size_t k = 0; k < root->props.size(); ++k) {
        Param p = make_param(unescape(root->props[k].first), root->props[k].second);
        if ((root->required >> k & 1) && !p.choice.empty()) tool.required |= uint64_t(1) << k;
        tool.params.push_back(std::move(p));
      }
    }
    g->tools.push_back(std::move(tool));
  }
  g->json_root = any_call->options.size() == 1 ? any_call->options[0] : any_call;
  g->grammars.push_back(std::move(json_any));
  return g;
}

namespace {

class ToolCallConstraint final : public TokenConstraint {
 public:
  ToolCallConstraint(std::shared_ptr<const ToolCallGrammar> grammar,
                     std::shared_ptr<const std::vector<std::string>> bytes,
                     std::shared_ptr<const TokenOrder> order, const std::vector<uint8_t>& special,
                     const std::vector<int32_t>& stop_ids)
      : g_(std::move(grammar)),
        bytes_(std::move(bytes)),
        order_(order ? std::move(order) : sort_tokens(*bytes_)),
        special_(special),
        stop_ids_(stop_ids),
        states_(g_->initial()) {
    // Per token: 1 = no '<' (cannot start or finish a tag), 2 = also a plain JSON string byte run.
    kind_.resize(bytes_->size());
    for (size_t i = 0; i < bytes_->size(); ++i) {
      const std::string& b = (*bytes_)[i];
      if (b.empty() || b.find('<') != std::string::npos) continue;
      kind_[i] = json_grammar::json_string_run(b) ? 2 : 1;
    }
  }

  void mask(std::vector<uint8_t>& allowed) override {
    bool end_ok = false, all_reasoning = true;
    for (const auto& s : states_) {
      end_ok = end_ok || ToolCallGrammar::can_end(s);
      all_reasoning = all_reasoning && s.phase == Phase::kReasoning;
    }
    const auto& spec = g_->spec;
    if (all_reasoning && spec.reasoning_budget >= 0 && spec.think_end_token >= 0 &&
        reasoning_tokens_ >= spec.reasoning_budget) {
      // The budget is spent: only </think> may come (as the engine forces it elsewhere).
      for (size_t id = 0; id < allowed.size(); ++id) {
        allowed[id] = int32_t(id) == spec.think_end_token;
      }
      return;
    }
    // Free text with no tag begun: a token without '<' keeps it free text.
    int fast = 0;  // minimum token kind that is allowed without simulation (0: none)
    if (states_.size() == 1 && states_[0].buf.empty()) {
      const auto& s = states_[0];
      if (s.phase == Phase::kReasoning || s.phase == Phase::kValueRaw) fast = 1;
      if ((s.phase == Phase::kValueJson || s.phase == Phase::kJsonBody) &&
          s.json->in_free_string()) {
        fast = 2;
      }
    }
    // Tokens in byte order, like a trie: levels_[k] holds the states after the first k bytes of
    // the current token, valid for k <= valid; a prefix that died at depth `dead` kills every
    // following token that shares it.
    const auto& bytes = *bytes_;
    const auto& ids = order_->ids;
    const auto& lcp = order_->lcp;
    if (levels_.empty()) levels_.resize(1);
    levels_[0] = states_;
    size_t valid = 0, dead = SIZE_MAX;
    for (size_t i = 0; i < ids.size(); ++i) {
      const size_t id = size_t(ids[i]);
      if (id >= allowed.size()) continue;
      valid = std::min<size_t>(valid, lcp[i]);
      if (dead <= lcp[i]) {
        allowed[id] = 0;
        continue;
      }
      dead = SIZE_MAX;
      const std::string& b = bytes[id];
      if (!allowed[id]) continue;
      if ((id < special_.size() && special_[id]) || b.empty()) {
        allowed[id] = 0;
        continue;
      }
      if (fast && kind_[id] >= fast) continue;  // stays allowed
      bool ok = true;
      for (size_t k = valid; k < b.size(); ++k) {
        if (levels_.size() < k + 2) levels_.resize(k + 2);
        g_->feed_into(levels_[k], uint8_t(b[k]), levels_[k + 1]);
        valid = k + 1;
        if (levels_[k + 1].empty()) {
          dead = k + 1;
          ok = false;
          break;
        }
      }
      allowed[id] = ok;
    }
    for (size_t id = bytes.size(); id < allowed.size(); ++id) allowed[id] = 0;
    for (int32_t s : stop_ids_) {
      if (s >= 0 && size_t(s) < allowed.size()) allowed[s] = end_ok;
    }
  }

  bool accept(int32_t token) override {
    if (std::find(stop_ids_.begin(), stop_ids_.end(), token) != stop_ids_.end()) return false;
    bool reasoning = std::any_of(states_.begin(), states_.end(),
                                 [](const auto& s) { return s.phase == Phase::kReasoning; });
    if (token >= 0 && size_t(token) < bytes_->size()) {
      for (char ch : (*bytes_)[token]) g_->feed(states_, uint8_t(ch));
    }
    if (reasoning) reasoning_tokens_++;
    return std::any_of(states_.begin(), states_.end(),
                       [](const auto& s) { return s.phase != Phase::kEnd; });
  }

 private:
  std::shared_ptr<const ToolCallGrammar> g_;
  std::shared_ptr<const std::vector<std::string>> bytes_;
  std::shared_ptr<const TokenOrder> order_;
  std::vector<uint8_t> special_;
  std::vector<int32_t> stop_ids_;
  std::vector<ToolCallGrammar::State> states_;
  std::vector<std::vector<ToolCallGrammar::State>> levels_;  // mask() scratch
  std::vector<uint8_t> kind_;
  int reasoning_tokens_ = 0;
};

}  // namespace

std::shared_ptr<const TokenOrder> sort_tokens(const std::vector<std::string>& token_bytes) {
  auto o = std::make_shared<TokenOrder>();
  o->ids.resize(token_bytes.size());
  for (size_t i = 0; i < token_bytes.size(); ++i) o->ids[i] = int32_t(i);
  std::sort(o->ids.begin(), o->ids.end(),
            [&](int32_t a, int32_t b) { return token_bytes[a] < token_bytes[b]; });
  o->lcp.assign(o->ids.size(), 0);
  for (size_t i = 1; i < o->ids.size(); ++i) {
    const std::string& a = token_bytes[o->ids[i - 1]];
    const std::string& b = token_bytes[o->ids[i]];
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    o->lcp[i] = uint32_t(n);
  }
  return o;
}

std::shared_ptr<TokenConstraint> make_tool_call_constraint(
    std::shared_ptr<const ToolCallGrammar> grammar,
    std::shared_ptr<const std::vector<std::string>> token_bytes,
    std::shared_ptr<const TokenOrder> order, const std::vector<uint8_t>& special,
    const std::vector<int32_t>& stop_ids) {
  return std::make_shared<ToolCallConstraint>(std::move(grammar), std::move(token_bytes),
                                              std::move(order), special, stop_ids);
}

bool tool_call_grammar_accepts(const ToolCallGrammar& grammar, const std::string& text,
                               bool complete) {
  auto states = grammar.initial();
  for (char ch : text) {
    grammar.feed(states, uint8_t(ch));
    if (states.empty()) return false;
  }
  if (!complete) return true;
  return std::any_of(states.begin(), states.end(),
                     [](const auto& s) { return ToolCallGrammar::can_end(s); });
}

}  // namespace tokenmill::server
