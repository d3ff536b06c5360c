// libFuzzer target: parse + render arbitrary template text against a fixed chat context.
// Contract: only tokenmill::Error may escape (no crash, no other exception, no sanitizer report),
// and rendering is bounded by RenderLimits (steps, output bytes, macro depth) so no input hangs.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "text/jinja.h"
#include "util/error.h"

namespace {

const nlohmann::ordered_json& context() {
  static const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "sys"},
      {"role": "user", "content": [{"type": "text", "text": "hi"}]},
      {"role": "assistant", "content": null, "reasoning_content": "r",
       "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": [1, 2.5, true]}}}]},
      {"role": "tool", "content": "{\"x\": 1}"}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "documents": null, "add_generation_prompt": true, "bos_token": "<s>", "enable_thinking": false
  })");
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;
  std::string src(reinterpret_cast<const char*>(data), size);
  tokenmill::jinja::RenderOptions opts;
  opts.limits.max_steps = 200'000;
  opts.limits.max_output = 1 << 20;
  opts.limits.max_call_depth = 32;
  opts.now_unix = 1741944413;
  try {
    auto t = tokenmill::jinja::Template::parse(src, "fuzz");
    (void)t.render(context(), opts);
  } catch (const tokenmill::Error&) {
    // expected for malformed templates and runtime errors
  }
  return 0;
}
