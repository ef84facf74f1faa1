// SPDX-License-Identifier: Apache-2.0
#include "apps/environment_index.h"

#include <charconv>
#include <cstdlib>

#include "common/error.h"

namespace psched {

namespace {

constexpr std::string_view kExpected =
    "expected a number, or a name ending in -N such as a StatefulSet pod's name";

// The digits after the last '-' that follows a name, or the whole value ("-1" has no name).
std::string_view index_digits(std::string_view value) {
  size_t dash = value.rfind('-');
  return dash == std::string_view::npos || dash == 0 ? value : value.substr(dash + 1);
}

}  // namespace

uint32_t parse_environment_index(std::string_view name, std::string_view value) {
  std::string_view digits = index_digits(value);
  uint32_t index = 0;
  auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  if (digits.empty() || error != std::errc() || end != digits.data() + digits.size())
    fail(ErrorCode::bad_config, "{}={:?} holds no index ({})", name, value, kExpected);
  return index;
}

std::optional<uint32_t> optional_environment_index(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (!value) return std::nullopt;
  return parse_environment_index(name, value);
}

uint32_t environment_index(const std::string& name, std::string_view what) {
  std::optional<uint32_t> index = optional_environment_index(name);
  if (!index)
    fail(ErrorCode::bad_config, "{}: the environment has no {} ({})", what, name, kExpected);
  return *index;
}

}  // namespace psched
