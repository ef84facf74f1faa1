// SPDX-License-Identifier: Apache-2.0
#include "common/slot_map.h"

#include <algorithm>
#include <limits>

#include "common/error.h"
#include "common/placement.h"

namespace psched {

SlotMap::SlotMap(uint64_t epoch, uint32_t shards, std::vector<uint32_t> owners)
    : epoch_(epoch), shards_(shards), owners_(std::move(owners)) {
  if (shards == 0 || shards > std::numeric_limits<uint16_t>::max() || owners_.size() != kSlots)
    fail(ErrorCode::invalid_argument,
         "a slot map of {} slots on {} shards (it needs {} slots, 1 "
         "to 65535 shards)",
         owners_.size(), shards, kSlots);
  std::vector<uint32_t> held(shards);
  for (uint32_t slot = 0; slot < kSlots; ++slot) {
    if (owners_[slot] >= shards)
      fail(ErrorCode::invalid_argument, "slot {} is owned by shard {} of a map on {} shards", slot,
           owners_[slot], shards);
    ++held[owners_[slot]];
  }
  for (uint32_t shard = 0; shard < shards; ++shard)
    if (held[shard] == 0)
      fail(ErrorCode::invalid_argument, "shard {} of a slot map on {} shards owns no slot", shard,
           shards);
}

SlotMap SlotMap::even(uint32_t shards) {
  if (shards == 0 || shards > kSlots)
    fail(ErrorCode::invalid_argument, "a slot map on {} shards (1 to {})", shards, kSlots);
  std::vector<uint32_t> owners(kSlots);
  for (uint32_t slot = 0; slot < kSlots; ++slot)
    owners[slot] = static_cast<uint32_t>(uint64_t{slot} * shards / kSlots);
  return SlotMap(1, shards, std::move(owners));
}

SlotMap SlotMap::rebalanced(uint32_t shards) const {
  if (shards == 0 || shards > kSlots)
    fail(ErrorCode::invalid_argument, "a slot map on {} shards (1 to {})", shards, kSlots);
  // Shard i's share: kSlots / shards, and one more for the first kSlots % shards.
  auto share = [shards](uint32_t shard) { return kSlots / shards + (shard < kSlots % shards); };
  std::vector<uint32_t> owners = owners_, held(shards);
  std::vector<uint32_t> loose;  // slots whose owner goes or holds more than its share
  for (uint32_t slot = 0; slot < kSlots; ++slot) {
    const uint32_t owner = owners[slot];
    if (owner < shards && held[owner] < share(owner))
      ++held[owner];
    else
      loose.push_back(slot);
  }
  auto next = loose.begin();
  for (uint32_t shard = 0; shard < shards; ++shard)
    for (; held[shard] < share(shard); ++held[shard]) owners[*next++] = shard;
  return SlotMap(epoch_ + 1, shards, std::move(owners));
}

uint32_t SlotMap::slots_of(uint32_t shard) const {
  return static_cast<uint32_t>(std::count(owners_.begin(), owners_.end(), shard));
}

uint32_t SlotMap::moved_to(const SlotMap& other) const {
  uint32_t moved = 0;
  for (uint32_t slot = 0; slot < kSlots; ++slot) moved += owners_[slot] != other.owners_[slot];
  return moved;
}

void SlotMap::encode(ByteWriter& out) const {
  out.put(epoch_);
  out.put(shards_);
  for (uint32_t owner : owners_) out.put(static_cast<uint16_t>(owner));
}

SlotMap SlotMap::decode(ByteReader& in) {
  const auto epoch = in.get<uint64_t>();
  const auto shards = in.get<uint32_t>();
  std::vector<uint32_t> owners(kSlots);
  for (uint32_t& owner : owners) owner = in.get<uint16_t>();
  try {
    return SlotMap(epoch, shards, std::move(owners));
  } catch (const Error& e) {
    fail(ErrorCode::corrupt_checkpoint, "{}: {}", in.what(), e.what());
  }
}

uint32_t name_slot(std::string_view name) {
  return static_cast<uint32_t>(mix64(stable_hash(name)) >> (64 - SlotMap::kSlotBits));
}

}  // namespace psched
