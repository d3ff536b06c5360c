#include "server/json_schema_constraint.h"

#include <algorithm>
#include <array>

#include "server/json_grammar.h"

namespace tokenmill::server {

using json = nlohmann::ordered_json;
using json_grammar::Grammar;
using json_grammar::Matcher;

namespace {

class JsonConstraint : public TokenConstraint {
 public:
  JsonConstraint(std::shared_ptr<const std::vector<std::string>> bytes,
                 const std::vector<uint8_t>& special, const std::vector<int32_t>& stop_ids,
                 std::unique_ptr<Grammar> grammar)
      : bytes_(std::move(bytes)),
        special_(special),
        stop_ids_(stop_ids),
        grammar_(std::move(grammar)),
        matcher_(grammar_->root) {
    plain_.resize(bytes_->size());
    for (size_t i = 0; i < bytes_->size(); ++i)
      plain_[i] = json_grammar::json_string_run((*bytes_)[i]);
  }

  void mask(std::vector<uint8_t>& allowed) override {
    std::array<uint8_t, 256> first{};
    for (int c = 0; c < 256; ++c) {
      Matcher m = matcher_;
      first[c] = m.feed(uint8_t(c));
    }
    const bool free_string = matcher_.in_free_string();
    const bool complete = matcher_.complete();
    const size_t n = std::min(allowed.size(), bytes_->size());
    for (size_t id = 0; id < n; ++id) {
      if (!allowed[id]) continue;
      const std::string& b = (*bytes_)[id];
      bool ok;
      if (id < special_.size() && special_[id]) {
        ok = false;
      } else if (b.empty() || !first[uint8_t(b[0])]) {
        ok = false;
      } else if (free_string && plain_[id]) {
        ok = true;
      } else {
        Matcher m = matcher_;
        ok = m.feed(b);
      }
      allowed[id] = ok;
    }
    for (size_t id = n; id < allowed.size(); ++id) allowed[id] = 0;
    for (int32_t s : stop_ids_) {
      if (s >= 0 && size_t(s) < allowed.size()) allowed[s] = complete;
    }
  }

  bool accept(int32_t token) override {
    if (std::find(stop_ids_.begin(), stop_ids_.end(), token) != stop_ids_.end()) return false;
    if (token >= 0 && size_t(token) < bytes_->size()) matcher_.feed((*bytes_)[token]);
    return !matcher_.closed() && matcher_.alive();
  }

 private:
  std::shared_ptr<const std::vector<std::string>> bytes_;
  std::vector<uint8_t> special_;
  std::vector<int32_t> stop_ids_;
  std::unique_ptr<Grammar> grammar_;
  Matcher matcher_;
  std::vector<uint8_t> plain_;
};

}  // namespace

void validate_json_schema(const json& schema) {
  json_grammar::build_grammar(schema, false);
}

std::shared_ptr<TokenConstraint> make_json_constraint(
    std::shared_ptr<const std::vector<std::string>> token_bytes,
    const std::vector<uint8_t>& special, const std::vector<int32_t>& stop_ids, const json& schema,
    bool any_value) {
  return std::make_shared<JsonConstraint>(std::move(token_bytes), special, stop_ids,
                                          json_grammar::build_grammar(schema, any_value));
}

bool json_schema_accepts(const json& schema, bool any_value, const std::string& text,
                         bool complete) {
  auto g = json_grammar::build_grammar(schema, any_value);
  Matcher m(g->root);
  if (!m.feed(text)) return false;
  return complete ? m.complete() : true;
}

}  // namespace tokenmill::server
