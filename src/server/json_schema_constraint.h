// Grammar-constrained decoding for response_format json_object / json_schema: a pushdown JSON
// validator over the schema subset below, driven byte by byte. mask() forbids every token whose
// bytes cannot continue a document that is valid so far; end-of-generation tokens are allowed
// only once the value is complete, and accept() returns false when a top-level object, array or
// string closes, so the engine stops there.
//
// Schema subset: type (one or a list) object (properties, required, additionalProperties bool or
// schema; absent = any extra key allowed), array (items, minItems, maxItems), string (enum),
// number, integer, boolean, null; enum and const of any JSON values; anyOf / oneOf; allOf with
// one entry; $ref to #/$defs/... or #/definitions/... (recursion allowed). Annotations (title,
// description, default, examples, format, $schema, $id) are ignored; other keywords that
// restrict values (pattern, minimum, ...) are rejected, so an output never silently misses them.
// Whitespace is limited to 2 bytes in a row and numbers to 20 digits, so a model cannot pad
// a document until max_tokens. Strings are well-formed UTF-8 with valid UTF-16 escapes (strict
// parsers accept every document). A $ref or anyOf that leads back to itself with no value in
// between is rejected, and at most json_grammar::kMaxParses parses stay open, so no schema makes
// a byte cost more than that.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/request.h"

namespace tokenmill::server {

// Throws ApiError 400 (param response_format.json_schema.schema) when the schema uses
// something outside the subset.
void validate_json_schema(const nlohmann::ordered_json& schema);

// token_bytes[id]: the bytes of token id; special[id] = 1 for special added tokens (never
// allowed, except stop ids at the end). any_value: json_object mode (any JSON object).
std::shared_ptr<TokenConstraint> make_json_constraint(
    std::shared_ptr<const std::vector<std::string>> token_bytes,
    const std::vector<uint8_t>& special, const std::vector<int32_t>& stop_ids,
    const nlohmann::ordered_json& schema, bool any_value);

// For tests: whether `text` is accepted as a complete document (complete = true) or as a valid
// prefix (complete = false) under the schema.
bool json_schema_accepts(const nlohmann::ordered_json& schema, bool any_value,
                         const std::string& text, bool complete);

}  // namespace tokenmill::server
