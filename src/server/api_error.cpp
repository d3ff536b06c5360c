#include "server/api_error.h"

#include <nlohmann/json.hpp>

namespace tokenmill::server {

std::string openai_error_type(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 429:
      return "rate_limit_error";
    case 500:
      return "server_error";
    case 503:
      return "server_error";
    default:
      return "invalid_request_error";
  }
}

std::string anthropic_error_type(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 500:
      return "api_error";
    case 503:
      return "overloaded_error";
    default:
      return "invalid_request_error";
  }
}

std::string error_body(ApiKind api, int status, const std::string& message,
                       const std::string& param, const std::string& code) {
  nlohmann::ordered_json j;
  if (api == ApiKind::kAnthropic) {
    j = {{"type", "error"},
         {"error", {{"type", anthropic_error_type(status)}, {"message", message}}}};
  } else {
    j = {{"error",
          {{"message", message},
           {"type", openai_error_type(status)},
           {"param",
            param.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(param)},
           {"code",
            code.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(code)}}}};
  }
  // Messages may quote invalid bytes from the request: replace them rather than throw.
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::string error_body(ApiKind api, const ApiError& e) {
  return error_body(api, e.status(), e.what(), e.param(), e.code());
}

}  // namespace tokenmill::server
