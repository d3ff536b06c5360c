// Errors a request can end in, and their bodies in each API's error shape:
//   OpenAI     {"error": {"message", "type", "param", "code"}}
//   Anthropic  {"type": "error", "error": {"type", "message"}}
// Handlers throw ApiError; the HTTP layer catches it and writes the body for the route's API.
#pragma once

#include <string>

#include "util/error.h"

namespace tokenmill::server {

enum class ApiKind { kOpenAI, kAnthropic };

class ApiError : public Error {
 public:
  // status: HTTP status (400, 401, 404, 413, 429, 500, 503). param: the request field at fault
  // ("messages[2].content"), may be empty. code: OpenAI's machine-readable code, may be empty.
  ApiError(int status, std::string message, std::string param = {}, std::string code = {})
      : Error(message), status_(status), param_(std::move(param)), code_(std::move(code)) {}
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }

 private:
  int status_;
  std::string param_, code_;
};

// 400 with the field name in front of the message: "messages[0].role: ...".
template <typename... Args>
[[noreturn]] void bad_request(const std::string& param, fmt::format_string<Args...> f,
                              Args&&... args) {
  std::string msg = fmt::format(f, std::forward<Args>(args)...);
  throw ApiError(400, param.empty() ? msg : param + ": " + msg, param);
}

// The error type string each API uses for an HTTP status.
std::string openai_error_type(int status);
std::string anthropic_error_type(int status);
// Serialized error bodies.
std::string error_body(ApiKind api, int status, const std::string& message,
                       const std::string& param = {}, const std::string& code = {});
std::string error_body(ApiKind api, const ApiError& e);

}  // namespace tokenmill::server
