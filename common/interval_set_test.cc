// SPDX-License-Identifier: Apache-2.0
#include "common/interval_set.h"

#include <random>
#include <vector>

#include <doctest/doctest.h>

using namespace psched;

TEST_CASE("touching ranges merge into one") {
  IntervalSet s;
  s.add({0, 4});
  s.add({8, 12});
  s.add({4, 8});
  REQUIRE(s.ranges().size() == 1);
  CHECK(s.ranges()[0] == ElementRange{0, 12});
  CHECK(s.size() == 12);
  CHECK(s.contains({2, 10}));
  CHECK_FALSE(s.contains({10, 13}));
}

TEST_CASE("subtracting the middle of a range leaves both ends") {
  IntervalSet s;
  s.add({0, 10});
  s.subtract({3, 5});
  CHECK(s.ranges() == std::vector<ElementRange>{{0, 3}, {5, 10}});
  CHECK(s.size() == 8);
  CHECK_FALSE(s.overlaps({3, 5}));
  CHECK(s.overlaps({4, 6}));
}

TEST_CASE("the set agrees with a bitmap under random adds and subtracts") {
  std::mt19937 rng(7);
  IntervalSet s, other;
  std::vector<bool> bits(200), other_bits(200);
  for (int i = 0; i < 2000; ++i) {
    uint64_t a = rng() % 200, b = rng() % 200;
    ElementRange r{std::min(a, b), std::max(a, b)};
    bool add = rng() % 3 != 0;
    auto& set = (i % 2) ? s : other;
    auto& bitmap = (i % 2) ? bits : other_bits;
    add ? set.add(r) : set.subtract(r);
    for (uint64_t k = r.begin; k < r.end; ++k) bitmap[k] = add;
  }
  IntervalSet both = s.intersect(other);
  uint64_t count = 0, both_count = 0;
  for (uint64_t k = 0; k < 200; ++k) {
    CHECK(s.contains({k, k + 1}) == bits[k]);
    CHECK(both.contains({k, k + 1}) == (bits[k] && other_bits[k]));
    count += bits[k];
    both_count += bits[k] && other_bits[k];
  }
  CHECK(s.size() == count);
  CHECK(both.size() == both_count);
  for (const IntervalSet* set : {&s, &other, &both}) {
    const std::vector<ElementRange>& ranges = set->ranges();
    for (size_t i = 0; i < ranges.size(); ++i) {
      CHECK(ranges[i].begin < ranges[i].end);
      if (i > 0) CHECK(ranges[i - 1].end < ranges[i].begin);  // sorted, apart, not touching
    }
  }
}
