// SPDX-License-Identifier: Apache-2.0
// The two 16-bit float formats of the wire, narrowed with round-to-nearest-even (as IEEE 754's
// default and every GPU's conversion instruction) and widened exactly. A NaN stays a NaN.
//   bf16: the top half of a binary32; keeps float32's range, so only NaN and overflow at
//         FLT_MAX's edge become special.
//   fp16: IEEE binary16; magnitudes from 65520 up become infinity, below 2^-24 zero (with
//         subnormals in between).
// Doubles narrow through float (two roundings: a double within a hair of a tie between two
// 16-bit neighbours may land on the other one; either is within one 16-bit step).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace psched::half {

inline uint16_t to_bf16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  if (std::isnan(value)) return static_cast<uint16_t>((bits >> 16) | 0x0040);  // stays quiet
  uint32_t lowest_kept = (bits >> 16) & 1;
  return static_cast<uint16_t>((bits + 0x7FFF + lowest_kept) >> 16);
}

inline float from_bf16(uint16_t value) {
  return std::bit_cast<float>(static_cast<uint32_t>(value) << 16);
}

inline uint16_t to_fp16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  uint32_t magnitude = bits & 0x7FFFFFFF;
  if (magnitude > 0x7F800000) return sign | 0x7E00;   // NaN
  if (magnitude >= 0x477FF000) return sign | 0x7C00;  // 65520 and up: infinity
  if (magnitude >= 0x38800000) {                      // 2^-14 and up: a normal half
    uint32_t lowest_kept = (magnitude >> 13) & 1;
    // Exponent bias 127 -> 15 (minus 112 << 23), then round to nearest, ties to even.
    magnitude += 0xC8000000u + 0xFFF + lowest_kept;
    return sign | static_cast<uint16_t>(magnitude >> 13);
  }
  // A subnormal half counts units of 2^-24; scaling by 2^24 is exact, nearbyint rounds to even.
  float units = std::bit_cast<float>(magnitude) * 16777216.0f;
  return sign | static_cast<uint16_t>(std::nearbyint(units));
}

inline float from_fp16(uint16_t value) {
  uint32_t sign = static_cast<uint32_t>(value & 0x8000) << 16;
  uint32_t exponent = (value >> 10) & 0x1F;
  uint32_t mantissa = value & 0x3FF;
  if (exponent == 0x1F) return std::bit_cast<float>(sign | 0x7F800000 | (mantissa << 13));
  if (exponent == 0) {
    float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

}  // namespace psched::half
