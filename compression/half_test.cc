// SPDX-License-Identifier: Apache-2.0
#include "compression/half.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <doctest/doctest.h>

namespace psched::half {
namespace {

// Plain references: the value each 16-bit pattern stands for, from the formats' definitions,
// and rounding to the nearest of them, ties to the even pattern.

double plain_fp16(uint16_t h) {
  int exponent = (h >> 10) & 0x1F;
  int mantissa = h & 0x3FF;
  double magnitude =
      exponent == 0 ? std::ldexp(mantissa, -24) : std::ldexp(1024 + mantissa, exponent - 25);
  if (exponent == 0x1F) magnitude = mantissa == 0 ? INFINITY : NAN;
  return (h & 0x8000) ? -magnitude : magnitude;
}

// The nearest of the finite positive patterns to `x` >= 0, ties to the even pattern; past the
// largest, the value 65536 (the next one with an unbounded exponent) stands for infinity.
uint16_t plain_round(double x, const std::vector<double>& values) {
  auto above = std::lower_bound(values.begin(), values.end(), x);
  if (above == values.end()) return x >= 65520.0 ? 0x7C00 : 0x7BFF;
  if (*above == x || above == values.begin()) return static_cast<uint16_t>(above - values.begin());
  uint16_t hi = static_cast<uint16_t>(above - values.begin()), lo = hi - 1;
  double to_lo = x - values[lo], to_hi = values[hi] - x;
  if (to_lo != to_hi) return to_lo < to_hi ? lo : hi;
  return (lo & 1) == 0 ? lo : hi;
}

uint16_t plain_to_fp16(float value, const std::vector<double>& positive) {
  uint16_t sign = std::signbit(value) ? 0x8000 : 0;
  double x = std::abs(static_cast<double>(value));
  if (x >= 65520.0) return sign | 0x7C00;
  return sign | plain_round(x, positive);
}

uint16_t plain_to_bf16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  uint32_t lo = bits & 0xFFFF0000u;
  double x = std::abs(static_cast<double>(value));
  double down = std::abs(static_cast<double>(std::bit_cast<float>(lo)));
  uint32_t hi_bits = lo + 0x10000u;
  // Past the largest finite bf16, 2^128 stands for infinity.
  double up = (hi_bits & 0x7F800000u) == 0x7F800000u
                  ? std::ldexp(1.0, 128)
                  : std::abs(static_cast<double>(std::bit_cast<float>(hi_bits)));
  if (x - down != up - x) return static_cast<uint16_t>((x - down < up - x ? lo : hi_bits) >> 16);
  return static_cast<uint16_t>((((lo >> 16) & 1) == 0 ? lo : hi_bits) >> 16);
}

std::vector<float> samples() {
  std::mt19937 random(7);
  std::vector<float> out = {0.0f,
                            -0.0f,
                            1.0f,
                            -1.0f,
                            65504.0f,
                            65519.996f,
                            65520.0f,
                            -65520.0f,
                            65536.0f,
                            1e-8f,
                            5.9604645e-8f /* 2^-24 */,
                            2.9802322e-8f /* 2^-25 */,
                            8.940697e-8f /* 3 * 2^-25 */,
                            6.1035156e-5f /* 2^-14 */,
                            6.1005354e-5f,
                            3.4028235e38f,
                            -3.4028235e38f,
                            1.0009766f,
                            1.00048828125f /* a tie */,
                            1.00146484375f /* a tie */,
                            1e-40f};
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 200000; ++i) {
    float f = std::bit_cast<float>(any_bits(random));
    if (std::isfinite(f)) out.push_back(f);
  }
  std::uniform_real_distribution<float> moderate(-70000.0f, 70000.0f);
  for (int i = 0; i < 100000; ++i) out.push_back(moderate(random));
  for (int e = -30; e < 17; ++e)
    for (int i = 0; i < 2000; ++i) out.push_back(std::ldexp(moderate(random) / 70000.0f, e));
  return out;
}

TEST_CASE("fp16 narrows to the nearest value, ties to even, overflow to infinity") {
  std::vector<double> positive;
  for (uint16_t h = 0; h < 0x7C00; ++h) positive.push_back(plain_fp16(h));
  for (float f : samples()) {
    INFO("value " << f);
    CHECK(to_fp16(f) == plain_to_fp16(f, positive));
  }
  CHECK(to_fp16(INFINITY) == 0x7C00);
  CHECK(to_fp16(-INFINITY) == 0xFC00);
  CHECK(std::isnan(from_fp16(to_fp16(NAN))));
}

TEST_CASE("fp16 widens every pattern to the value it stands for") {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    double plain = plain_fp16(static_cast<uint16_t>(h));
    INFO("pattern " << h);
    if (std::isnan(plain))
      CHECK(std::isnan(from_fp16(static_cast<uint16_t>(h))));
    else
      CHECK(static_cast<double>(from_fp16(static_cast<uint16_t>(h))) == plain);
  }
}

TEST_CASE("bf16 narrows to the nearest value, ties to even, and keeps float32's range") {
  for (float f : samples()) {
    INFO("value " << f);
    CHECK(to_bf16(f) == plain_to_bf16(f));
  }
  CHECK(from_bf16(to_bf16(1e30f)) == doctest::Approx(1e30f).epsilon(1.0 / 256));
  CHECK(to_bf16(INFINITY) == 0x7F80);
  CHECK(std::isnan(from_bf16(to_bf16(NAN))));
  CHECK(std::isnan(from_bf16(to_bf16(-std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("a 16-bit value widened and narrowed again is itself") {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    auto p = static_cast<uint16_t>(h);
    if (!std::isnan(from_fp16(p))) CHECK(to_fp16(from_fp16(p)) == p);
    if (!std::isnan(from_bf16(p))) CHECK(to_bf16(from_bf16(p)) == p);
  }
}

}  // namespace
}  // namespace psched::half
