#include "util/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include "util/error.h"

namespace tokenmill::log {

void init() {
  auto logger = spdlog::stderr_color_mt("tokenmill");
  logger->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::warn);
}

void set_level(const std::string& level) {
  auto l = spdlog::level::from_str(level);
  if (l == spdlog::level::off && level != "off") {
    fail("unknown log level '{}': use debug, info, warn, error or off", level);
  }
  spdlog::set_level(l);
}

}  // namespace tokenmill::log
