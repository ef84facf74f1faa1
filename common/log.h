// SPDX-License-Identifier: Apache-2.0
// Logging: fmt with compile-time-checked format strings, to stderr, one line per message with
// a UTC timestamp and the level. Thread-safe (one write per line).
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace psched {

enum class LogLevel { debug, info, warn, error };

// Messages below `level` are dropped (default: info).
void set_log_level(LogLevel level);
void log_line(LogLevel level, std::string_view message);

template <typename... Args>
void log_info(fmt::format_string<Args...> format, Args&&... args) {
  log_line(LogLevel::info, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> format, Args&&... args) {
  log_line(LogLevel::warn, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void log_error(fmt::format_string<Args...> format, Args&&... args) {
  log_line(LogLevel::error, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace psched
