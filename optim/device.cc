// SPDX-License-Identifier: Apache-2.0
// DeviceSpec's text form; the same in builds with and without CUDA.
#include "optim/device.h"

#include <charconv>

#include <fmt/format.h>

namespace psched::optim {

std::string to_string(const DeviceSpec& device) {
  if (device.kind == DeviceSpec::Kind::cpu) return "cpu";
  return fmt::format("cuda:{}", device.ordinal);
}

bool parse_device(std::string_view text, DeviceSpec& out) {
  if (text == "cpu") {
    out = DeviceSpec{};
    return true;
  }
  constexpr std::string_view kCuda = "cuda:";
  if (!text.starts_with(kCuda)) return false;
  std::string_view number = text.substr(kCuda.size());
  uint32_t ordinal = 0;
  const char* end = number.data() + number.size();
  auto [rest, ec] = std::from_chars(number.data(), end, ordinal);
  if (number.empty() || ec != std::errc() || rest != end) return false;
  out = DeviceSpec{DeviceSpec::Kind::cuda, ordinal};
  return true;
}

}  // namespace psched::optim
