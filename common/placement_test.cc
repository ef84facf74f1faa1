// SPDX-License-Identifier: Apache-2.0
#include "common/placement.h"

#include <doctest/doctest.h>

using namespace psched;

TEST_CASE("a small variable lives whole on the shard that owns its name's slot") {
  const SlotMap map = SlotMap::even(3);
  auto parts = place_variable("fc1/w", 100, 4, map, 1024);
  REQUIRE(parts.size() == 1);
  CHECK(parts[0].range == ElementRange{0, 100});
  CHECK(parts[0].shard.value == map.owner(name_slot("fc1/w")));
  CHECK(place_variable("fc1/w", 100, 4, map, 1024) == parts);
}

TEST_CASE("a small variable moves only when its name's slot does") {
  const SlotMap two = SlotMap::even(2), three = two.rebalanced(3);
  uint32_t moved = 0, names = 3000;
  for (uint32_t k = 0; k < names; ++k) {
    const std::string name = "layer" + std::to_string(k) + "/w";
    const ShardId before = place_variable(name, 10, 4, two, 1024)[0].shard;
    const ShardId after = place_variable(name, 10, 4, three, 1024)[0].shard;
    CHECK((before == after) == (two.owner(name_slot(name)) == three.owner(name_slot(name))));
    moved += before != after;
  }
  CHECK(moved <= names / 3 * 1.1);
}

TEST_CASE("a large variable is split into contiguous near-equal ranges over all shards") {
  auto parts = place_variable("emb", 10, 4, SlotMap::even(3), 8);
  REQUIRE(parts.size() == 3);
  CHECK(parts[0].range == ElementRange{0, 4});
  CHECK(parts[1].range == ElementRange{4, 7});
  CHECK(parts[2].range == ElementRange{7, 10});
  for (uint32_t i = 0; i < 3; ++i) {
    CHECK(parts[i].shard.value == i);
    CHECK(split_range(10, 3, i) == parts[i].range);
  }
}

TEST_CASE("a variable with fewer elements than shards is not split") {
  CHECK(place_variable("b", 2, 4, SlotMap::even(3), 1).size() == 1);
}
