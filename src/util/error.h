// Errors: one exception type whose message says what failed, where, and what to do.
// User-facing failures (bad files, bad requests, bad settings) throw tokenmill::Error; the CLI
// prints "error: <message>" and exits non-zero, the server turns it into a 4xx/5xx body. Internal
// invariants use TM_CHECK, which also throws (never assert: it vanishes under NDEBUG).
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace tokenmill {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace tokenmill

#define TM_CHECK(cond, ...)                                                                      \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      throw ::tokenmill::Error(::fmt::format("internal check failed at {}:{}: {}: {}", __FILE__, \
                                             __LINE__, #cond, ::fmt::format(__VA_ARGS__)));      \
    }                                                                                            \
  } while (0)
