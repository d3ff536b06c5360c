// Logging: a thin layer over spdlog so callers never include it directly (it stays out of .cu).
#pragma once

#include <spdlog/spdlog.h>

namespace tokenmill::log {

using spdlog::debug;
using spdlog::error;
using spdlog::info;
using spdlog::warn;

// Sends log lines to stderr (stdout carries command output, e.g. JSON). Call once at start-up.
void init();
// level: "debug", "info", "warn", "error", "off".
void set_level(const std::string& level);

}  // namespace tokenmill::log
