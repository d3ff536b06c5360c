// Jinja lexer with the whitespace rules of Hugging Face's environment: trim_blocks=True (drop the
// first newline after a block or comment tag), lstrip_blocks=True (drop spaces and tabs before a
// block or comment tag that starts its line), `-` / `+` whitespace control on tags,
// keep_trailing_newline=False (one trailing newline of the source is dropped), newlines
// normalised to "\n", {% raw %} blocks, and Python string-literal escapes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tokenmill::jinja {

enum class Tok : uint8_t {
  Data,
  VarBegin,
  VarEnd,
  BlockBegin,
  BlockEnd,
  Name,
  String,
  Int,
  Float,
  Op,
  Eof
};

struct Token {
  Tok type;
  int line;
  std::string text;  // data, name, operator, or the decoded string literal
  int64_t ival = 0;
  double fval = 0;
};

// Throws tokenmill::Error "<source_name>:<line>: <message>".
std::vector<Token> lex(std::string_view source, const std::string& source_name);

}  // namespace tokenmill::jinja
