// SPDX-License-Identifier: Apache-2.0
#include "common/placement.h"

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

std::vector<ShardPart> place_variable(std::string_view name, uint64_t elements,
                                      uint64_t element_bytes, uint32_t shard_count,
                                      uint64_t split_bytes) {
  PSCHED_REQUIRE(shard_count > 0, shard_count);
  if (elements * element_bytes <= split_bytes || shard_count == 1 || elements < shard_count) {
    return {{ShardId(static_cast<uint32_t>(stable_hash(name) % shard_count)), {0, elements}}};
  }
  std::vector<ShardPart> parts;
  uint64_t base = elements / shard_count, extra = elements % shard_count, begin = 0;
  for (uint32_t s = 0; s < shard_count; ++s) {
    uint64_t size = base + (s < extra ? 1 : 0);
    parts.push_back({ShardId(s), {begin, begin + size}});
    begin += size;
  }
  return parts;
}

}  // namespace psched
