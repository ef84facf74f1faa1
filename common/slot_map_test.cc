// SPDX-License-Identifier: Apache-2.0
#include "common/slot_map.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>

#include "common/error.h"

using namespace psched;

namespace {

// The least share of slots (or rows) that must change owner from `from` to `to` shards with
// every shard holding an equal share: |to - from| / max(from, to).
double least_moved(uint32_t from, uint32_t to) {
  return static_cast<double>(std::max(from, to) - std::min(from, to)) / std::max(from, to);
}

// Rows of one table, by the owner of their slot.
std::vector<uint32_t> owners_of_rows(const SlotMap& map, uint64_t rows) {
  std::vector<uint32_t> owners;
  for (uint64_t id = 0; id < rows; ++id) owners.push_back(map.owner(row_slot(0x5EED, id)));
  return owners;
}

}  // namespace

TEST_CASE("a new job's map gives every shard a near-equal run of slots") {
  for (uint32_t shards : {1u, 2u, 3u, 7u, 4096u}) {
    const SlotMap map = SlotMap::even(shards);
    CHECK(map.epoch() == 1);
    CHECK(map.shards() == shards);
    for (uint32_t shard = 0; shard < shards; ++shard) {
      CHECK(map.slots_of(shard) >= SlotMap::kSlots / shards);
      CHECK(map.slots_of(shard) <= SlotMap::kSlots / shards + 1);
    }
  }
}

TEST_CASE("changing the shard count moves within 1.1x the least share of slots and of rows") {
  const std::pair<uint32_t, uint32_t> changes[] = {{2, 3}, {3, 2}, {2, 4}, {4, 3}, {1, 2}, {5, 1}};
  for (const auto& change : changes) {
    const uint32_t from = change.first, to = change.second;
    CAPTURE(from);
    CAPTURE(to);
    const SlotMap before = SlotMap::even(from), after = before.rebalanced(to);
    CHECK(after.epoch() == 2);
    CHECK(after.shards() == to);
    const double slots = static_cast<double>(before.moved_to(after)) / SlotMap::kSlots;
    CHECK(slots >= least_moved(from, to) * 0.999);
    CHECK(slots <= least_moved(from, to) * 1.1);
    const auto rows_before = owners_of_rows(before, 200'000);
    const auto rows_after = owners_of_rows(after, 200'000);
    uint64_t moved = 0;
    for (size_t k = 0; k < rows_before.size(); ++k) moved += rows_before[k] != rows_after[k];
    CHECK(static_cast<double>(moved) / rows_before.size() <= least_moved(from, to) * 1.1);
    for (uint32_t shard = 0; shard < to; ++shard) {
      CHECK(after.slots_of(shard) >= SlotMap::kSlots / to);
      CHECK(after.slots_of(shard) <= SlotMap::kSlots / to + 1);
    }
  }
}

TEST_CASE("a map changed twice still moves only what each change must") {
  const SlotMap two = SlotMap::even(2), three = two.rebalanced(3), four = three.rebalanced(4);
  CHECK(four.epoch() == 3);
  CHECK(static_cast<double>(three.moved_to(four)) / SlotMap::kSlots <= least_moved(3, 4) * 1.1);
  CHECK(three.rebalanced(3).moved_to(three) == 0);  // the same count moves nothing
}

TEST_CASE("a map and its epoch read back as written") {
  const SlotMap map = SlotMap::even(3).rebalanced(5).rebalanced(2);
  ByteWriter out;
  map.encode(out);
  ByteReader in(out.bytes(), "test map");
  const SlotMap back = SlotMap::decode(in);
  CHECK(in.done());
  CHECK(back == map);
  CHECK(back.epoch() == 3);
}

TEST_CASE("a map that cannot be is refused naming what is wrong") {
  std::vector<uint32_t> owners(SlotMap::kSlots, 0);
  owners[7] = 3;
  CHECK_THROWS_WITH_AS(SlotMap(1, 2, owners), "slot 7 is owned by shard 3 of a map on 2 shards",
                       Error);
  CHECK_THROWS_WITH_AS(SlotMap(1, 2, std::vector<uint32_t>(SlotMap::kSlots, 0)),
                       "shard 1 of a slot map on 2 shards owns no slot", Error);
  ByteWriter out;
  out.put<uint64_t>(1);
  out.put<uint32_t>(2);
  for (uint32_t slot = 0; slot < SlotMap::kSlots; ++slot) out.put<uint16_t>(slot == 9 ? 5 : 0);
  ByteReader in(out.bytes(), "checkpoint x");
  CHECK_THROWS_WITH_AS(SlotMap::decode(in),
                       "checkpoint x: slot 9 is owned by shard 5 of a map on 2 shards", Error);
  CHECK_THROWS_AS(SlotMap::even(0), Error);
}
