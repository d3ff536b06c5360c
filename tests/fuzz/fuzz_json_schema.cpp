// libFuzzer target: structured output (json_schema_constraint). The input is a schema, a zero
// byte and a document; byte 0's low bit picks json_object mode (any object, schema ignored).
// validate_json_schema may only throw tokenmill::Error; for a schema it accepts, the grammar
// must be consistent: a document accepted as complete is valid JSON, and each of its prefixes
// is accepted as a prefix (the engine masks token by token, so a complete document the prefix
// check refused could never be produced, and one it produced must parse).
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/json_schema_constraint.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool any_value = (data[0] & 1) != 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t cut = rest.find('\0');
  const std::string schema_text = rest.substr(0, cut);
  const std::string doc = cut == std::string::npos ? std::string() : rest.substr(cut + 1);
  nlohmann::ordered_json schema = nlohmann::ordered_json::object();
  if (!any_value) {
    schema = nlohmann::ordered_json::parse(schema_text, nullptr, /*allow_exceptions=*/false);
    if (schema.is_discarded()) return 0;
    try {
      tokenmill::server::validate_json_schema(schema);
    } catch (const tokenmill::Error&) {
      return 0;  // outside the subset: a 400
    }
  }
  bool complete = false;
  try {
    complete = tokenmill::server::json_schema_accepts(schema, any_value, doc, true);
  } catch (const tokenmill::Error&) {
    return 0;  // a schema the grammar builder still refuses (a 400 as well)
  }
  if (!complete) return 0;
  if (!nlohmann::ordered_json::accept(doc)) __builtin_trap();
  if (doc.size() <= 512) {
    for (size_t n = 0; n <= doc.size(); ++n) {
      if (!tokenmill::server::json_schema_accepts(schema, any_value, doc.substr(0, n), false)) {
        __builtin_trap();
      }
    }
  }
  return 0;
}
