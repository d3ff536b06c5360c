// Jinja template engine for Hugging Face chat templates: renders what transformers'
// apply_chat_template renders (jinja2 3.1 ImmutableSandboxedEnvironment with trim_blocks,
// lstrip_blocks, loopcontrols, HF's tojson / raise_exception / strftime_now and the
// {% generation %} tag), byte for byte. See docs/TESTING.md "Chat templates" for how this is
// checked against Python's jinja2.
//
// Known differences from jinja2 (none used by HF chat templates): no template inheritance,
// include/import, call blocks or recursive loops; `|safe`/`|escape` give plain strings, so adding
// them to other strings does not HTML-escape the other operand as jinja2's Markup would;
// integers are 64-bit (overflow raises); a namespace may not hold namespaces (no cycles).
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <string_view>

#include "text/jinja_interp.h"

namespace tokenmill::jinja {

struct Program;

class Template {
 public:
  // Parses; throws tokenmill::Error "<source_name>:<line>: <message>" on syntax errors.
  static Template parse(std::string_view source, const std::string& source_name);

  // Renders with the top-level keys of `context` (a JSON object) as variables; JSON null becomes
  // Python None. Throws tokenmill::Error "<source_name>:<line>: <message>" on runtime errors,
  // including raise_exception(msg) (message = msg) and exceeded RenderLimits.
  std::string render(const nlohmann::ordered_json& context,
                     const RenderOptions& options = {}) const;

  const std::string& source_name() const;

 private:
  std::shared_ptr<const Program> program_;
};

}  // namespace tokenmill::jinja
