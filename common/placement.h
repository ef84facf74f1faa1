// SPDX-License-Identifier: Apache-2.0
// Deterministic placement of variables on shards. Client and server compute it from the same
// inputs (name, size, shard count, split threshold from the cluster layout), so they agree
// without a coordinator and independent of registration order.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

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

// Variables of at most `split_bytes` live whole on the shard picked by a stable hash of the name;
// larger ones are cut into `shard_count` contiguous ranges of near-equal size (shard i holds
// the i-th range). Returned parts are in element order and cover [0, elements).
std::vector<ShardPart> place_variable(std::string_view name, uint64_t elements,
                                      uint64_t element_bytes, uint32_t shard_count,
                                      uint64_t split_bytes);

// 64-bit FNV-1a: stable across processes and builds (std::hash is not).
uint64_t stable_hash(std::string_view text);

}  // namespace psched
