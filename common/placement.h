// SPDX-License-Identifier: Apache-2.0
// Placement of dense variables on shards, through the job's slot map (common/slot_map.h), which
// the shards hand to workers with the cluster layout: a worker places a variable from its name,
// its size, the map and the split threshold, independent of registration order.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "common/slot_map.h"
#include "common/types.h"

namespace psched {

// Half-open range of elements [begin, end) within a variable.
struct ElementRange {
  uint64_t begin = 0;
  uint64_t end = 0;

  uint64_t size() const { return end - begin; }
  bool contains(const ElementRange& r) const { return begin <= r.begin && r.end <= end; }
  bool operator==(const ElementRange&) const = default;
};

// One shard's part of a variable.
struct ShardPart {
  ShardId shard;
  ElementRange range;
  bool operator==(const ShardPart&) const = default;
};

// Variables of at most `split_bytes` (and those with fewer elements than shards) live whole on
// the shard that owns the slot of their name (name_slot); larger ones are cut into
// `map.shards()` contiguous ranges of near-equal size (shard i holds the i-th range). Returned
// parts are in element order and cover [0, elements). `map` is not empty.
std::vector<ShardPart> place_variable(std::string_view name, uint64_t elements,
                                      uint64_t element_bytes, const SlotMap& map,
                                      uint64_t split_bytes);
// The near-equal cut of a split variable's `elements` over `shards`: shard i's range.
ElementRange split_range(uint64_t elements, uint32_t shards, uint32_t shard);

// 64-bit FNV-1a: stable across processes and builds (std::hash is not).
uint64_t stable_hash(std::string_view text);

}  // namespace psched
