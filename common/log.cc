// SPDX-License-Identifier: Apache-2.0
#include "common/log.h"

#include <unistd.h>

#include <atomic>
#include <chrono>

#include <fmt/chrono.h>

namespace psched {
namespace {

std::atomic<LogLevel> min_level{LogLevel::info};

constexpr std::string_view level_name(LogLevel level) {
  switch (level) {
    case LogLevel::debug:
      return "debug";
    case LogLevel::info:
      return "info";
    case LogLevel::warn:
      return "warn";
    case LogLevel::error:
      return "error";
  }
  return "?";
}

}  // namespace

void set_log_level(LogLevel level) {
  min_level = level;
}

void log_line(LogLevel level, std::string_view message) {
  if (level < min_level.load()) return;
  auto now = std::chrono::floor<std::chrono::milliseconds>(std::chrono::system_clock::now());
  std::string line = fmt::format("{:%FT%T}Z {:5} {}\n", now, level_name(level), message);
  (void)!::write(STDERR_FILENO, line.data(), line.size());
}

}  // namespace psched
