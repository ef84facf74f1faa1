// SPDX-License-Identifier: Apache-2.0
#include "common/placement.h"

#include <doctest/doctest.h>

using namespace psched;

TEST_CASE("a small variable lives whole on one shard chosen by its name") {
  auto parts = place_variable("fc1/w", 100, 4, 3, 1024);
  REQUIRE(parts.size() == 1);
  CHECK(parts[0].range == ElementRange{0, 100});
  CHECK(parts[0].shard.value == stable_hash("fc1/w") % 3);
  CHECK(place_variable("fc1/w", 100, 4, 3, 1024) == parts);
}

TEST_CASE("a large variable is split into contiguous near-equal ranges over all shards") {
  auto parts = place_variable("emb", 10, 4, 3, 8);
  REQUIRE(parts.size() == 3);
  CHECK(parts[0].range == ElementRange{0, 4});
  CHECK(parts[1].range == ElementRange{4, 7});
  CHECK(parts[2].range == ElementRange{7, 10});
  for (uint32_t i = 0; i < 3; ++i) CHECK(parts[i].shard.value == i);
}

TEST_CASE("a variable with fewer elements than shards is not split") {
  CHECK(place_variable("b", 2, 4, 3, 1).size() == 1);
}
