// SPDX-License-Identifier: Apache-2.0
#include "common/placement.h"

#include <algorithm>

#include "common/check.h"

namespace psched {

uint64_t stable_hash(std::string_view text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

ElementRange split_range(uint64_t elements, uint32_t shards, uint32_t shard) {
  const uint64_t base = elements / shards, extra = elements % shards;
  const uint64_t begin = shard * base + std::min<uint64_t>(shard, extra);
  return {begin, begin + base + (shard < extra ? 1 : 0)};
}

std::vector<ShardPart> place_variable(std::string_view name, uint64_t elements,
                                      uint64_t element_bytes, const SlotMap& map,
                                      uint64_t split_bytes) {
  PSCHED_REQUIRE(!map.empty(), map.shards());
  const uint32_t shards = map.shards();
  if (elements * element_bytes <= split_bytes || shards == 1 || elements < shards)
    return {{ShardId(map.owner(name_slot(name))), {0, elements}}};
  std::vector<ShardPart> parts;
  for (uint32_t s = 0; s < shards; ++s)
    parts.push_back({ShardId(s), split_range(elements, shards, s)});
  return parts;
}

}  // namespace psched
