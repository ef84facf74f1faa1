// SPDX-License-Identifier: Apache-2.0
#include "compression/codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <doctest/doctest.h>

#include "common/error.h"
#include "common/error_test_support.h"
#include "compression/half.h"

namespace psched {
namespace {

template <typename T>
std::span<const std::byte> bytes_of(const std::vector<T>& v) {
  return std::as_bytes(std::span(v));
}

template <typename T>
std::vector<T> decoded(WireFormat format, std::span<const std::byte> body) {
  DType dtype = sizeof(T) == 4 ? DType::float32 : DType::float64;
  std::vector<T> out(decoded_elements(format, dtype, body));
  decode(format, dtype, body, std::as_writable_bytes(std::span(out)));
  return out;
}

template <typename T>
std::vector<std::byte> encoded(WireFormat format, const std::vector<T>& values, TopK topk = {}) {
  std::vector<std::byte> body;
  encode(format, sizeof(T) == 4 ? DType::float32 : DType::float64, bytes_of(values), topk, body);
  return body;
}

template <typename T>
T at(const std::vector<std::byte>& body, size_t offset) {
  T value;
  std::memcpy(&value, body.data() + offset, sizeof(T));
  return value;
}

TEST_CASE("bf16 and fp16 bodies hold two bytes an element, each value narrowed") {
  std::vector<float> values = {1.0f, -2.5f, 3.14159f, 70000.0f, 1e-3f};
  auto bf16 = encoded(WireFormat::bf16, values);
  auto fp16 = encoded(WireFormat::fp16, values);
  REQUIRE(bf16.size() == 10);
  REQUIRE(fp16.size() == 10);
  for (size_t i = 0; i < values.size(); ++i) {
    CHECK(at<uint16_t>(bf16, 2 * i) == half::to_bf16(values[i]));
    CHECK(at<uint16_t>(fp16, 2 * i) == half::to_fp16(values[i]));
  }
  auto wide = decoded<float>(WireFormat::fp16, fp16);
  CHECK(wide[0] == 1.0f);
  CHECK(std::isinf(wide[3]));  // over fp16's range
  CHECK(decoded<float>(WireFormat::bf16, bf16)[3] == half::from_bf16(half::to_bf16(70000.0f)));
}

TEST_CASE("float64 values narrow through float32 and widen exactly") {
  std::vector<double> values = {0.1, -1e-300, 1e300};
  auto wide = decoded<double>(WireFormat::bf16, encoded(WireFormat::bf16, values));
  CHECK(wide[0] == static_cast<double>(half::from_bf16(half::to_bf16(0.1f))));
  CHECK(wide[1] == 0.0);
  CHECK(std::isinf(wide[2]));
}

TEST_CASE("topk sends the largest magnitudes, ties to the lower index, indices ascending") {
  std::vector<float> values = {0.5f, -3.0f, 2.0f, 3.0f, -2.0f, 0.0f, 2.0f};
  auto body = encoded(WireFormat::topk, values, {.count = 4});
  REQUIRE(body.size() == 8 + 4 * 8);
  CHECK(at<uint32_t>(body, 0) == 7);
  CHECK(at<uint32_t>(body, 4) == 4);
  // |-3| and |3|, then the first two of the three 2s: indices 2 and 4, not 6.
  std::vector<uint32_t> indices;
  for (size_t i = 0; i < 4; ++i) indices.push_back(at<uint32_t>(body, 8 + 4 * i));
  CHECK(indices == std::vector<uint32_t>{1, 2, 3, 4});
  CHECK(decoded<float>(WireFormat::topk, body) ==
        std::vector<float>{0.0f, -3.0f, 2.0f, 3.0f, -2.0f, 0.0f, 0.0f});
}

TEST_CASE("topk keeps what a plain sort by magnitude, then index, keeps first") {
  std::mt19937 random(9);
  std::uniform_int_distribution<int> few(-4, 4);  // many ties
  for (int round = 0; round < 200; ++round) {
    std::vector<float> values(1 + round * 7);
    for (float& v : values) v = static_cast<float>(few(random)) / 2;
    TopK topk{.fraction = 0.1 + 0.004 * round};
    std::vector<uint32_t> plain(values.size());
    for (uint32_t i = 0; i < plain.size(); ++i) plain[i] = i;
    std::stable_sort(plain.begin(), plain.end(), [&](uint32_t a, uint32_t b) {
      return std::abs(values[a]) > std::abs(values[b]);
    });
    plain.resize(topk.of(values.size()));
    std::sort(plain.begin(), plain.end());
    auto body = encoded(WireFormat::topk, values, topk);
    std::vector<uint32_t> sent;
    for (size_t i = 0; i < plain.size(); ++i) sent.push_back(at<uint32_t>(body, 8 + 4 * i));
    CHECK(sent == plain);
  }
}

TEST_CASE("topk's fraction rounds up, and sends at least one element and at most all") {
  CHECK(TopK{.fraction = 0.01}.of(1000) == 10);
  CHECK(TopK{.fraction = 0.01}.of(1001) == 11);
  CHECK(TopK{.fraction = 0.01}.of(5) == 1);
  CHECK(TopK{.fraction = 0.0}.of(5) == 1);
  CHECK(TopK{.count = 9}.of(5) == 5);
  CHECK(TopK{}.of(0) == 0);
  CHECK(decoded<float>(WireFormat::topk, encoded(WireFormat::topk, std::vector<float>{})).empty());
}

TEST_CASE("onebit sends each sign and the mean magnitude") {
  std::vector<double> values = {1.0, -2.0, 0.0, 4.0, -1.0, 0.5, -0.5, 3.0, -6.0};
  auto body = encoded(WireFormat::onebit, values);
  REQUIRE(body.size() == 4 + 8 + 2);
  CHECK(at<uint32_t>(body, 0) == 9);
  CHECK(at<double>(body, 4) == 18.0 / 9);
  CHECK(at<uint8_t>(body, 12) == 0b01010010);  // elements 1, 4, 6 negative
  CHECK(at<uint8_t>(body, 13) == 0b1);         // element 8
  CHECK(decoded<double>(WireFormat::onebit, body) ==
        std::vector<double>{2, -2, 2, 2, -2, 2, -2, 2, -2});
}

TEST_CASE("a compression with a sparse pull format or a fraction outside (0, 1] is refused") {
  auto problem = [](const Compression& c) {
    return testing::refusal(ErrorCode::invalid_argument, [&] { check(c); });
  };
  Compression whole;
  whole.push = WireFormat::topk;
  whole.pull = WireFormat::bf16;
  whole.topk.fraction = 1;
  CHECK(problem(whole).empty());
  Compression sparse_pull;
  sparse_pull.pull = WireFormat::topk;
  CHECK(problem(sparse_pull).find("pull format topk does not carry values") != std::string::npos);
  for (double bad : {0.0, -0.5, 1.5}) {
    Compression c;
    c.topk.fraction = bad;
    CHECK(problem(c).find("is not a fraction in (0, 1]") != std::string::npos);
  }
}

TEST_CASE("a malformed body is refused naming what is wrong") {
  auto refused = [](WireFormat format, std::vector<std::byte> body, const char* says) {
    std::string message = testing::refusal(ErrorCode::invalid_argument,
                                           [&] { decoded_elements(format, DType::float32, body); });
    CHECK_MESSAGE(message.find(says) != std::string::npos, "refused with '" << message << "'");
  };
  auto topk = encoded(WireFormat::topk, std::vector<float>{1, 5, 3}, {.count = 2});
  refused(WireFormat::topk, {topk.begin(), topk.end() - 1}, "bytes where 2 values");
  auto out_of_range = topk;
  std::memset(out_of_range.data() + 12, 0xFF, 4);
  refused(WireFormat::topk, out_of_range, "index 4294967295 of 3 elements");
  auto descending = topk;
  std::memcpy(descending.data() + 12, descending.data() + 8, 4);
  refused(WireFormat::topk, descending, "must ascend");
  auto too_many = topk;
  too_many[0] = std::byte{1};
  refused(WireFormat::topk, too_many, "2 values for 1 elements");
  refused(WireFormat::topk, {std::byte{1}}, "under the 8");
  auto onebit = encoded(WireFormat::onebit, std::vector<float>{1, -1, 2});
  onebit.push_back(std::byte{0});
  refused(WireFormat::onebit, onebit, "3 elements take 9");
  refused(WireFormat::bf16, std::vector<std::byte>(3), "not whole 16-bit values");
  refused(WireFormat::none, std::vector<std::byte>(6), "not whole float32 elements");
}

TEST_CASE("all_finite finds an infinity or a NaN anywhere") {
  CHECK(all_finite(DType::float32, bytes_of(std::vector<float>{1, 2, 3})));
  CHECK_FALSE(all_finite(DType::float32, bytes_of(std::vector<float>{1, INFINITY, 3})));
  CHECK_FALSE(all_finite(DType::float64, bytes_of(std::vector<double>{1, 2, NAN})));
}

}  // namespace
}  // namespace psched
