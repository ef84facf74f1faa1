// SPDX-License-Identifier: Apache-2.0
#include "actors/shard/row_index.h"

#include <algorithm>
#include <cstdlib>
#include <new>
#include <utility>

#include "common/check.h"

namespace psched {
namespace {

// The smallest table the index allocates, in entries.
constexpr uint64_t kMinEntries = 16;

// The fewest entries, a power of two, that hold `ids` ids.
uint64_t entries_for(uint64_t ids, uint64_t from) {
  uint64_t capacity = std::max(from, kMinEntries);
  while (ids > capacity / 4 * 3) capacity *= 2;
  return capacity;
}

}  // namespace

void RowIndex::Free::operator()(Entry* entries) const {
  std::free(entries);
}

uint64_t RowIndex::bytes_holding(uint64_t ids) const {
  if (fits(ids, capacity())) return bytes_held();
  return entries_for(ids, 2 * capacity()) * sizeof(Entry);
}

void RowIndex::insert(uint64_t id, uint32_t slot) {
  PSCHED_REQUIRE(slot != kNone, id);
  if (!fits(size_ + 1, capacity())) rehash(entries_for(size_ + 1, 2 * capacity()));
  Entry* entries = table_.get();
  uint64_t at = hash(id) & mask_;
  for (; entries[at].slot != kNone; at = (at + 1) & mask_) PSCHED_REQUIRE(entries[at].id != id, id);
  entries[at] = {id, slot, 0};
  ++size_;
}

bool RowIndex::erase(uint64_t id) {
  if (!table_) return false;
  Entry* entries = table_.get();
  uint64_t hole = hash(id) & mask_;
  for (; entries[hole].id != id || entries[hole].slot == kNone; hole = (hole + 1) & mask_)
    if (entries[hole].slot == kNone) return false;
  // Each entry after the hole, up to the first empty one, moves into it unless its home (where
  // its probe starts) is after the hole, cyclically: a lookup starting there never passes it.
  for (uint64_t at = (hole + 1) & mask_; entries[at].slot != kNone; at = (at + 1) & mask_) {
    const uint64_t home = hash(entries[at].id) & mask_;
    if (((at - home) & mask_) >= ((at - hole) & mask_)) {
      entries[hole] = entries[at];
      hole = at;
    }
  }
  entries[hole].slot = kNone;
  --size_;
  return true;
}

void RowIndex::reserve(uint64_t ids) {
  if (!fits(ids, capacity())) rehash(entries_for(ids, capacity()));
}

void RowIndex::rehash(uint64_t entries) {
  PSCHED_REQUIRE(fits(size_, entries) && (entries & (entries - 1)) == 0, size_, entries);
  const size_t bytes = entries * sizeof(Entry);
  void* memory = std::aligned_alloc(64, bytes);  // an entry never straddles two cache lines
  if (!memory) throw std::bad_alloc();
  std::unique_ptr<Entry[], Free> table(static_cast<Entry*>(memory));
  for (uint64_t k = 0; k < entries; ++k) table[k] = {0, kNone, 0};
  const uint64_t mask = entries - 1;
  for (uint64_t k = 0; k < capacity(); ++k) {
    const Entry& entry = table_[k];
    if (entry.slot == kNone) continue;
    uint64_t at = hash(entry.id) & mask;
    while (table[at].slot != kNone) at = (at + 1) & mask;
    table[at] = entry;
  }
  table_ = std::move(table);
  mask_ = mask;
}

void RowIndex::swap(RowIndex& other) noexcept {
  std::swap(table_, other.table_);
  std::swap(mask_, other.mask_);
  std::swap(size_, other.size_);
}

}  // namespace psched
