// SPDX-License-Identifier: Apache-2.0
#include "compression/codec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <random>
#include <utility>
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

// `halves` as the wire carries them: two bytes each, the low byte first.
std::vector<std::byte> little_endian(std::initializer_list<uint16_t> halves) {
  std::vector<std::byte> bytes;
  for (uint16_t h : halves) {
    bytes.push_back(static_cast<std::byte>(h & 0xFF));
    bytes.push_back(static_cast<std::byte>(h >> 8));
  }
  return bytes;
}

TEST_CASE("bf16 sends each float's top half, rounded to nearest, ties to even") {
  // 1.0f is 0x3F800000 and -2.5f 0xC0200000: their top halves. 3.14159f is 0x40490FD0: the
  // low half is under 0x8000, rounds down. 70000.0f is 0x4788B800: over, rounds up. 1 + 2^-8 is
  // 0x3F808000, a tie: 0x3F80 is even and stays. 1 + 3 * 2^-8 is 0x3F818000, a tie: 0x3F81 is
  // odd, up to 0x3F82; its negative likewise.
  std::vector<float> values = {1.0f,        -2.5f,       3.14159f,    70000.0f,
                               1.00390625f, 1.01171875f, -1.01171875f};
  CHECK(encoded(WireFormat::bf16, values) ==
        little_endian({0x3F80, 0xC020, 0x4049, 0x4789, 0x3F80, 0x3F82, 0xBF82}));
  // Widening is exact: 0x4789 is 1.0703125 * 2^16.
  CHECK(decoded<float>(WireFormat::bf16, little_endian({0x3F80, 0xC020, 0x4789})) ==
        std::vector<float>{1.0f, -2.5f, 70144.0f});
}

TEST_CASE("fp16 sends IEEE binary16, rounded to nearest, ties to even") {
  // 1.0 is 0x3C00. -2.5 is -1.25 * 2^1: sign, exponent 1 + 15, mantissa 0.25 * 1024 (0xC100).
  // 3.14159 is 1.5708 * 2^1: mantissa 584.49 rounds to 584 (0x4248). 1e-3 is 1.024 * 2^-10:
  // exponent 5, mantissa 24.58 rounds to 25 (0x1419). 1 + 2^-11 is a tie: 0x3C00 is even and
  // stays; 1 + 3 * 2^-11 goes up to 0x3C02, its negative to 0xBC02. 65519 rounds to 65504, the
  // largest finite (0x7BFF); 70000 is infinity (0x7C00). 2^-24 is the smallest subnormal
  // (0x0001); 1.5 * 2^-24 is a tie, to 2 units (0x0002).
  const float unit = std::ldexp(1.0f, -24);
  std::vector<float> values = {1.0f,           -2.5f,          3.14159f,        1e-3f,
                               1.00048828125f, 1.00146484375f, -1.00146484375f, 65519.0f,
                               70000.0f,       unit,           1.5f * unit};
  CHECK(encoded(WireFormat::fp16, values) ==
        little_endian({0x3C00, 0xC100, 0x4248, 0x1419, 0x3C00, 0x3C02, 0xBC02, 0x7BFF, 0x7C00,
                       0x0001, 0x0002}));
  CHECK(decoded<float>(WireFormat::fp16, little_endian({0x3C00, 0xC100, 0x7BFF, 0x7C00, 0x0001})) ==
        std::vector<float>{1.0f, -2.5f, 65504.0f, INFINITY, unit});
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

// The k indices a stable sort by magnitude, largest first, puts first, ascending.
std::vector<uint32_t> plain_topk(const std::vector<float>& values, uint64_t k) {
  std::vector<uint32_t> plain(values.size());
  for (uint32_t i = 0; i < plain.size(); ++i) plain[i] = i;
  std::stable_sort(plain.begin(), plain.end(), [&](uint32_t a, uint32_t b) {
    return std::abs(values[a]) > std::abs(values[b]);
  });
  plain.resize(k);
  std::sort(plain.begin(), plain.end());
  return plain;
}

std::vector<uint32_t> sent_indices(const std::vector<std::byte>& body) {
  std::vector<uint32_t> sent;
  for (uint32_t i = 0; i < at<uint32_t>(body, 4); ++i)
    sent.push_back(at<uint32_t>(body, 8 + 4 * i));
  return sent;
}

TEST_CASE("topk of partitions large enough to sample a threshold keeps exactly the k largest") {
  std::mt19937 random(11);
  std::normal_distribution<float> normal;
  std::cauchy_distribution<float> heavy;
  std::uniform_int_distribution<int> few(-4, 4);
  const std::vector<std::pair<const char*, std::function<float(size_t)>>> kinds = {
      {"normal", [&](size_t) { return normal(random); }},
      {"heavy-tailed", [&](size_t) { return heavy(random); }},
      {"many ties", [&](size_t) { return static_cast<float>(few(random)); }},
      {"ascending", [&](size_t i) { return static_cast<float>(i) * 1e-3f; }},
      {"periodic", [&](size_t i) { return i % 64 == 0 ? 10.0f + normal(random) : normal(random); }},
      // The sampled elements (every n/1024-th) large, the rest small: the threshold is an
      // overestimate, fewer than k reach it, and the selection falls back to every element.
      {"sample misled", [&](size_t i) { return i % 256 == 0 ? 1000.0f : normal(random); }}};
  for (const auto& entry : kinds)
    for (size_t n : {size_t{16384}, size_t{65536 + 13}, size_t{262144}})
      for (double fraction : {0.001, 0.01, 0.1}) {
        const char* kind = entry.first;  // a plain name: CAPTURE refers to it from a lambda
        const auto& draw = entry.second;
        CAPTURE(kind);
        CAPTURE(n);
        CAPTURE(fraction);
        std::vector<float> values(n);
        for (size_t i = 0; i < n; ++i) values[i] = draw(i);
        TopK topk{.fraction = fraction};
        auto body = encoded(WireFormat::topk, values, topk);
        CHECK(sent_indices(body) == plain_topk(values, topk.of(n)));
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

TEST_CASE(
    "a compression with a sparse pull format, a fraction outside (0, 1] or no ring is refused") {
  auto problem = [](const Compression& c) {
    return testing::refusal(ErrorCode::invalid_argument, [&] { check(c); });
  };
  Compression whole;
  whole.push = WireFormat::topk;
  whole.pull = WireFormat::bf16;
  whole.topk.fraction = 1;
  CHECK(problem(whole).empty());
  Compression deltas;
  deltas.pull = WireFormat::topk;
  CHECK(problem(deltas).empty());
  Compression sparse_pull;
  sparse_pull.pull = WireFormat::onebit;
  CHECK(problem(sparse_pull).find("pull format onebit is none a value travels in") !=
        std::string::npos);
  Compression sparse_full;
  sparse_full.pull_full = WireFormat::topk;
  CHECK(problem(sparse_full).find("pull_full format topk does not carry values") !=
        std::string::npos);
  for (double bad : {0.0, -0.5, 1.5}) {
    Compression c;
    c.topk.fraction = bad;
    CHECK(problem(c).find("topk_fraction") != std::string::npos);
    Compression d;
    d.pull_fraction = bad;
    CHECK(problem(d).find("pull_fraction") != std::string::npos);
  }
  Compression no_ring;
  no_ring.ring = 0;
  CHECK(problem(no_ring).find("ring 0 keeps no delta") != std::string::npos);
}

// encode_delta of `current` against `published` (float32), sending at most k.
struct Delta {
  std::vector<std::byte> body;
  std::vector<uint32_t> sent;
};
Delta delta_of(const std::vector<float>& current, std::vector<float>& published, uint64_t k) {
  Delta d;
  encode_delta(DType::float32, bytes_of(current), std::as_writable_bytes(std::span(published)), k,
               d.body, d.sent);
  return d;
}

TEST_CASE("a delta sends the elements that changed most, as their new values") {
  std::vector<float> published = {1, 2, 3, 4, 5, 6};
  std::vector<float> current = {1, 2.5, 3, 1, 5.25, 6.5};  // changes .5, -3, .25, .5
  Delta d = delta_of(current, published, 2);
  REQUIRE(d.body.size() == 8 + 2 * 8);
  CHECK(at<uint32_t>(d.body, 0) == 6);
  CHECK(at<uint32_t>(d.body, 4) == 2);
  CHECK(d.sent == std::vector<uint32_t>{1, 3});  // -3, then .5 of the tie at 1 and 5
  CHECK(at<float>(d.body, 16) == 2.5f);
  CHECK(at<float>(d.body, 20) == 1.0f);
  CHECK(published == std::vector<float>{1, 2.5, 3, 1, 5, 6});  // the rest still owed
  // Applying it writes the values it names and leaves the rest, twice as once.
  std::vector<float> copy = {1, 2, 3, 4, 5, 6};
  for (int twice = 0; twice < 2; ++twice) {
    apply_delta(DType::float32, d.body, std::as_writable_bytes(std::span(copy)));
    CHECK(copy == published);
  }
  // What is owed goes next; nothing changed sends nothing.
  Delta next = delta_of(current, published, 4);
  CHECK(next.sent == std::vector<uint32_t>{4, 5});
  CHECK(published == current);
  Delta none = delta_of(current, published, 4);
  CHECK(none.sent.empty());
  CHECK(none.body.size() == 8);
}

TEST_CASE("a large delta selects by a sampled threshold the same elements a sort would") {
  std::mt19937 random(7);
  std::normal_distribution<float> normal;
  const size_t n = 100000;
  std::vector<float> published(n), current(n);
  for (size_t i = 0; i < n; ++i) {
    published[i] = normal(random);
    current[i] = i % 3 == 0 ? published[i] : published[i] + 0.01f * normal(random);
  }
  std::vector<uint32_t> order;
  for (uint32_t i = 0; i < n; ++i)
    if (current[i] != published[i]) order.push_back(i);
  auto change = [&](uint32_t i) { return std::abs(current[i] - published[i]); };
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return change(a) > change(b); });
  std::vector<uint32_t> expected(order.begin(), order.begin() + 1000);
  std::sort(expected.begin(), expected.end());
  std::vector<float> before = published;
  Delta d = delta_of(current, published, 1000);
  CHECK(d.sent == expected);
  std::vector<float> copy = before;
  apply_delta(DType::float32, d.body, std::as_writable_bytes(std::span(copy)));
  CHECK(copy == published);
}

TEST_CASE("a union of deltas carries the newest values at every index any of them sent") {
  std::vector<float> published = {0, 0, 0, 0};
  std::vector<float> copy = published;
  std::vector<float> first = {1, 0, 0, 0}, second = {1, 0, 2, 0};
  delta_of(first, published, 1);
  delta_of(second, published, 1);
  std::vector<std::byte> both;
  encode_delta_at(DType::float32, bytes_of(published), std::vector<uint32_t>{0, 2}, both);
  apply_delta(DType::float32, both, std::as_writable_bytes(std::span(copy)));
  CHECK(copy == published);
}

TEST_CASE("a malformed delta, or one of another size, writes nothing") {
  std::vector<float> published = {0, 0, 0}, current = {1, 2, 3};
  Delta d = delta_of(current, published, 3);
  std::vector<float> copy(4, 9.f);
  std::string message = testing::refusal(ErrorCode::shape_mismatch, [&] {
    apply_delta(DType::float32, d.body, std::as_writable_bytes(std::span(copy)));
  });
  CHECK(message.find("a delta of 3 elements for a range of 4") != std::string::npos);
  CHECK(copy == std::vector<float>(4, 9.f));
  auto descending = d.body;
  std::memcpy(descending.data() + 12, descending.data() + 8, 4);
  std::vector<float> three(3, 9.f);
  message = testing::refusal(ErrorCode::invalid_argument, [&] {
    apply_delta(DType::float32, descending, std::as_writable_bytes(std::span(three)));
  });
  CHECK(message.find("malformed topk delta") != std::string::npos);
  CHECK(three == std::vector<float>(3, 9.f));
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

TEST_CASE("decodes_finite reads from the body what decoding would find") {
  std::mt19937 random(3);
  std::uniform_int_distribution<int> pick(0, 7);
  for (WireFormat format : kWireFormats) {
    for (float bad : {INFINITY, -INFINITY, NAN, 1e30f}) {
      if (format == WireFormat::topk && std::isnan(bad)) continue;  // selects no order of NaN
      std::vector<float> values = {1, -2, 3, 0.5, 7, -1, 2, 4};
      values[static_cast<size_t>(pick(random))] = bad;
      auto body = encoded(format, values, {.count = 8});
      std::vector<float> out = decoded<float>(format, body);
      CAPTURE(to_string(format));
      CAPTURE(bad);
      CHECK(decodes_finite(format, DType::float32, body) ==
            all_finite(DType::float32, bytes_of(out)));
    }
  }
}

TEST_CASE("all_finite finds an infinity or a NaN anywhere") {
  CHECK(all_finite(DType::float32, bytes_of(std::vector<float>{1, 2, 3})));
  CHECK_FALSE(all_finite(DType::float32, bytes_of(std::vector<float>{1, INFINITY, 3})));
  CHECK_FALSE(all_finite(DType::float64, bytes_of(std::vector<double>{1, 2, NAN})));
}

TEST_CASE("rows take a setting for every variable as they can: whole pushes, full-value pulls") {
  const Compression dense{.push = WireFormat::topk,
                          .pull = WireFormat::topk,
                          .min_bytes = 123,
                          .warmup_steps = 4,
                          .pull_full = WireFormat::fp16};
  const Compression rows = dense.for_rows();
  CHECK(rows.push == WireFormat::none);  // topk and onebit drop part of each gradient
  CHECK(rows.pull == WireFormat::fp16);  // a delta pull's full values
  CHECK(rows.min_bytes == 123);
  CHECK(rows.warmup_steps == 4);
  CHECK(Compression{.push = WireFormat::onebit}.for_rows().push == WireFormat::none);
  const Compression bf16{.push = WireFormat::bf16, .pull = WireFormat::bf16};
  CHECK(bf16.for_rows() == bf16);  // what rows can carry stays
  const Compression fp16{.push = WireFormat::fp16, .pull = WireFormat::none};
  CHECK(fp16.for_rows() == fp16);
}

}  // namespace
}  // namespace psched
