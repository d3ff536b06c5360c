#include "text/jinja.h"

#include "text/jinja_parser.h"

namespace tokenmill::jinja {

Template Template::parse(std::string_view source, const std::string& source_name) {
  Template t;
  t.program_ = jinja::parse(source, source_name);
  return t;
}

std::string Template::render(const nlohmann::ordered_json& context,
                             const RenderOptions& options) const {
  TM_CHECK(program_ != nullptr, "render() on an empty Template");
  if (!context.is_object() && !context.is_null()) {
    fail("{}: the template context must be a JSON object, got {}", program_->name,
         context.type_name());
  }
  std::vector<std::pair<std::string, Value>> vars;
  try {
    if (context.is_object()) {
      for (auto it = context.begin(); it != context.end(); ++it) {
        vars.emplace_back(it.key(), Value::from_json(it.value()));
      }
    }
  } catch (const RuntimeError& e) {
    fail("{}: bad template context: {}", program_->name, e.what());
  }
  // The output is mostly the context's text plus the template's: reserve about that much.
  size_t hint = 4096;
  if (context.is_object()) {
    std::vector<const nlohmann::ordered_json*> stack = {&context};
    while (!stack.empty()) {
      const auto* j = stack.back();
      stack.pop_back();
      if (j->is_string()) {
        hint += j->get_ref<const std::string&>().size();
      } else if (j->is_structured()) {
        for (const auto& e : *j) stack.push_back(&e);
      }
    }
  }
  Interp interp(*program_, options);
  return interp.render(vars, hint * 2);
}

const std::string& Template::source_name() const {
  TM_CHECK(program_ != nullptr, "source_name() on an empty Template");
  return program_->name;
}

}  // namespace tokenmill::jinja
