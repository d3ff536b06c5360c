#include "util/log.h"

#include "util/error.h"

namespace tokenmill::log {

void set_level(const std::string& level) {
  auto l = spdlog::level::from_str(level);
  if (l == spdlog::level::off && level != "off") {
    fail("unknown log level '{}': use debug, info, warn, error or off", level);
  }
  spdlog::set_level(l);
}

}  // namespace tokenmill::log
