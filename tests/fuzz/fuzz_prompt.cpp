// libFuzzer target: a chat request to its prompt, as the server renders it. Byte 0 picks the API
// (bit 0: OpenAI chat or Anthropic messages) and enable_thinking (bit 1); the rest is the request
// body. A body the parsers accept is rendered with the Qwen3.5 chat template
// (tests/fixtures/templates/qwen35.jinja; $TM_SOURCE_DIR, else the current directory, is the
// repository root). Only tokenmill::Error may escape (a 400); a prompt must be well-formed UTF-8
// (the request was), or its tokens would not be the text's.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "server/anthropic_request.h"
#include "server/openai_request.h"
#include "server/prompt.h"
#include "server/request_json.h"
#include "text/chat_template.h"
#include "text/unicode_utf8.h"
#include "util/error.h"

namespace {

const tokenmill::ChatTemplate& qwen35() {
  // Loaded once per fuzzing process.
  static const tokenmill::ChatTemplate tmpl = [] {
    const char* root = std::getenv("TM_SOURCE_DIR");
    const std::string path =
        std::string(root != nullptr ? root : ".") + "/tests/fixtures/templates/qwen35.jinja";
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    if (ss.str().empty()) std::abort();  // the template was not found: fix TM_SOURCE_DIR
    return tokenmill::ChatTemplate::from_string(ss.str(), path);
  }();
  return tmpl;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  tokenmill::server::ServedModel model;
  model.name = "demo";
  model.chat_template = &qwen35();
  std::string prompt;
  try {
    const nlohmann::ordered_json j = tokenmill::server::parse_body(body);
    const tokenmill::server::RequestLimits limits;
    const tokenmill::server::GenerationPlan plan =
        (data[0] & 1) ? tokenmill::server::parse_anthropic_messages(j, limits)
                      : tokenmill::server::parse_openai_chat(j, limits);
    prompt = tokenmill::server::render_chat_prompt(model, plan, (data[0] & 2) != 0);
  } catch (const tokenmill::Error&) {
    return 0;  // a 400
  }
  if (!tokenmill::text::is_valid_utf8(prompt)) __builtin_trap();
  return 0;
}
