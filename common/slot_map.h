// SPDX-License-Identifier: Apache-2.0
// SlotMap: where a job's rows and small dense variables live. Every row (by a mix of its
// table's key and its id) and every small dense variable (by a hash of its name) falls in one of
// kSlots hash slots, fixed for the life of a job; the map says which shard owns each slot. It
// is versioned (an epoch) and part of the deployment's state: a shard makes the first one
// (even(), epoch 1) when its job starts, keeps it in every checkpoint, and hands it to workers
// on connect (ClusterLayout), so workers and shards route by the one map and never recompute it
// from a shard count on their own. Changing the shard count is a new map made from the old one
// (rebalanced(), epoch + 1) that moves only the slots that must move: `psched reshard`
// (actors/durability/reshard.h) writes it with the checkpoints it places.
//
// Why slots and not jump consistent hashing: both move the minimum when a job grows from N to
// N + 1 shards, but jump hashing moves only when the last shard comes or goes and fixes which
// keys go where; a map can move any shard's slots, can say where a slot is while it moves, and
// is what an operator reads (docs/architecture.md, "Placement").
//
// A plain value type; ids of shards are below shards().
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "common/byte_codec.h"

namespace psched {

class SlotMap {
 public:
  // Redis Cluster's choice is 16,384; 4,096 keeps a shard's share within 1/4096 of its ideal
  // up to hundreds of shards and the map 16 KiB on the wire.
  static constexpr uint32_t kSlots = 4096;
  static constexpr uint32_t kSlotBits = 12;
  static_assert(1u << kSlotBits == kSlots);

  // No map: no shard owns anything (epoch 0). What a layout holds before it was read.
  SlotMap() = default;
  // `owners[s]` owns slot s. Throws Error(invalid_argument) naming the slot unless there are
  // kSlots owners, every one below `shards` (at least 1), and every shard owns a slot.
  SlotMap(uint64_t epoch, uint32_t shards, std::vector<uint32_t> owners);

  // A new job's map on `shards` shards, epoch 1: shard i owns the i-th of `shards` contiguous
  // runs of slots of near-equal length.
  static SlotMap even(uint32_t shards);
  // The map on `shards` shards (at least 1) that moves the fewest slots from this one, epoch +
  // 1: every shard ends with kSlots / shards slots or one more; a shard that stays keeps its
  // slots up to its share, and the slots of shards that go or over their share go, lowest
  // first, to the shards under theirs, lowest shard first.
  SlotMap rebalanced(uint32_t shards) const;

  uint64_t epoch() const { return epoch_; }
  uint32_t shards() const { return shards_; }
  bool empty() const { return owners_.empty(); }
  uint32_t owner(uint32_t slot) const { return owners_[slot]; }
  std::span<const uint32_t> owners() const { return owners_; }
  // Slots `shard` owns.
  uint32_t slots_of(uint32_t shard) const;
  // Slots whose owner differs in `other` (same kSlots).
  uint32_t moved_to(const SlotMap& other) const;

  bool operator==(const SlotMap&) const = default;

  // Epoch, shard count, then each slot's owner as 16 bits (shards fit 65,535).
  void encode(ByteWriter& out) const;
  // Throws Error(corrupt_checkpoint) naming `in` when what it reads is no map.
  static SlotMap decode(ByteReader& in);

 private:
  uint64_t epoch_ = 0;
  uint32_t shards_ = 0;
  std::vector<uint32_t> owners_;  // by slot
};

// SplitMix64's step: a bijection of 64-bit words whose outputs for consecutive inputs look
// independent (Steele, Lea, Flood 2014). What spreads rows over slots (and a row's first values
// over its elements, actors/shard/row_table.cc).
constexpr uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The slot of row `id` of the table whose key is `key` (table_key, actors/shard/table_spec.h):
// the top bits of a mix of both, so every table spreads over every slot, hot ids too.
constexpr uint32_t row_slot(uint64_t key, uint64_t id) {
  return static_cast<uint32_t>(mix64(key ^ mix64(id)) >> (64 - SlotMap::kSlotBits));
}
// The slot of a dense variable placed whole, from its name's stable hash
// (common/placement.h).
uint32_t name_slot(std::string_view name);

}  // namespace psched
