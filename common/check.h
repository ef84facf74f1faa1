// SPDX-License-Identifier: Apache-2.0
// PSCHED_REQUIRE(cond, values...): for bugs and broken preconditions. Throws std::logic_error
// naming the file, the line, the condition and the values given, e.g.
//   PSCHED_REQUIRE(a == b, a, b)  ->  "actors/shard.cc:42: require failed: a == b; a = 14; b = 72"
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace psched::detail {

inline void append_values(std::string&, const char*) {}

template <typename T, typename... Rest>
void append_values(std::string& out, const char* names, const T& value, const Rest&... rest) {
  std::string_view all(names);
  size_t comma = all.find(',');
  std::string_view name = all.substr(0, comma);
  while (!name.empty() && name.front() == ' ') name.remove_prefix(1);
  fmt::format_to(std::back_inserter(out), "; {} = {}", name, value);
  if constexpr (sizeof...(rest) > 0) append_values(out, names + comma + 1, rest...);
}

template <typename... Values>
[[noreturn]] void require_failed(const char* file, int line, const char* condition,
                                 const char* names, const Values&... values) {
  std::string message = fmt::format("{}:{}: require failed: {}", file, line, condition);
  append_values(message, names, values...);
  throw std::logic_error(message);
}

}  // namespace psched::detail

#define PSCHED_REQUIRE(condition, ...)                                           \
  do {                                                                           \
    if (!(condition))                                                            \
      ::psched::detail::require_failed(__FILE__, __LINE__, #condition,           \
                                       #__VA_ARGS__ __VA_OPT__(, ) __VA_ARGS__); \
  } while (false)
