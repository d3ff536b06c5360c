// Recursive-descent parser for the Jinja subset chat templates use (jinja2 3.1 grammar and
// operator precedence). Unknown filters and tests are rejected here, as jinja2 does at compile
// time.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "text/jinja_ast.h"

namespace tokenmill::jinja {

// Nesting limit for blocks and expressions, so hostile input cannot exhaust the stack.
inline constexpr int kMaxParseDepth = 128;

// Throws tokenmill::Error "<source_name>:<line>: <message>".
std::shared_ptr<const Program> parse(std::string_view source, const std::string& source_name);

// Filter and test tables (jinja_filters.cpp, jinja_tests.cpp); nullptr when unknown.
FilterFn find_filter(std::string_view name);
TestFn find_test(std::string_view name);

}  // namespace tokenmill::jinja
