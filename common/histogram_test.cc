// SPDX-License-Identifier: Apache-2.0
#include "common/histogram.h"

#include <doctest/doctest.h>

namespace psched {

TEST_CASE("a histogram counts a value in the first bucket whose bound is not below it") {
  static constexpr std::array<double, 3> kBounds = {1, 2, 5};
  Histogram h(kBounds);
  for (double v : {0.5, 1.0, 1.5, 5.0, 7.0}) h.observe(v);
  CHECK(h.cumulative_counts() == std::vector<uint64_t>{2, 3, 4, 5});
  CHECK(h.count() == 5);
  CHECK(h.sum() == doctest::Approx(15.0));
}

TEST_CASE("a copy of a histogram is a snapshot the original's updates do not change") {
  Histogram live;
  live.observe(0.002);
  Histogram snapshot = live;
  live.observe(0.002);
  CHECK(snapshot.count() == 1);
  CHECK(live.count() == 2);
}

}  // namespace psched
