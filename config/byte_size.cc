// SPDX-License-Identifier: Apache-2.0
#include "config/byte_size.h"

#include <array>
#include <charconv>
#include <utility>

#include <fmt/format.h>

namespace psched {
namespace {

struct ByteUnit {
  std::string_view name;
  uint64_t bytes;
};

constexpr std::array<ByteUnit, 10> kUnits = {{
    {"B", 1},
    {"KiB", uint64_t{1} << 10},
    {"MiB", uint64_t{1} << 20},
    {"GiB", uint64_t{1} << 30},
    {"TiB", uint64_t{1} << 40},
    {"KB", 1000},
    {"kB", 1000},
    {"MB", 1000'000},
    {"GB", 1000'000'000},
    {"TB", 1000'000'000'000},
}};

std::optional<uint64_t> unit_bytes(std::string_view name) {
  if (name.empty()) return 1;
  for (const ByteUnit& unit : kUnits) {
    if (unit.name == name) return unit.bytes;
  }
  return std::nullopt;
}

}  // namespace

std::optional<uint64_t> parse_byte_size(std::string_view text) {
  uint64_t count = 0;
  const char* end = text.data() + text.size();
  auto [rest, ec] = std::from_chars(text.data(), end, count);
  if (ec != std::errc() || rest == text.data()) return std::nullopt;
  std::string_view unit(rest, end - rest);
  if (unit.starts_with(' ')) unit.remove_prefix(1);
  std::optional<uint64_t> scale = unit_bytes(unit);
  if (!scale || (unit.empty() && rest != end)) return std::nullopt;  // "12 " has no unit
  if (count > UINT64_MAX / *scale) return std::nullopt;
  return count * *scale;
}

std::string format_byte_size(uint64_t bytes) {
  // Largest binary unit that divides exactly (kUnits[4] is TiB, [1] is KiB).
  for (int i = 4; i >= 1; --i) {
    if (bytes != 0 && bytes % kUnits[i].bytes == 0) {
      return fmt::format("{}{}", bytes / kUnits[i].bytes, kUnits[i].name);
    }
  }
  return fmt::format("{}B", bytes);
}

}  // namespace psched
