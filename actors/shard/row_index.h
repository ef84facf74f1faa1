// SPDX-License-Identifier: Apache-2.0
// RowIndex: a row table's (actors/shard/row_table.h) map from a row's id (any 64-bit value) to
// its slot, an open-addressing hash table with linear probing whose entry holds the id and the
// slot together, 16 bytes, four to a cache line. So a lookup of an id the table holds reads one
// line, the one its hash points at, nearly always, and a caller that knows which ids come next
// asks for that line ahead (prefetch): the lookup then finds it in cache.
//
// Why not abseil's flat_hash_map, which the table used before: it keeps its control bytes apart
// from its slots, so each lookup waits on two lines at random, and a table's update is bound by
// such waits, the row's own lines being the others (`psched-row-table-bench --sweep`,
// docs/embeddings.md#memory). Memory is about the same: abseil's slot of an id and a slot is 16
// bytes too (the pair's alignment) beside its control byte, at most 7/8 full; this index is at most
// 3/4 full (linear probing's probes grow fast past that), so 21.3 to 42.7 bytes an id against
// abseil's 19.4 to 38.9. `build/bench/psched-row-index-bench` (10 million random ids, this
// machine, one run): 26.8 bytes an id against abseil's 28.5 (both tables 2^24 entries), 20.2
// million lookups a second one after another against 9.8 (wall time: the machine is shared).
//
// An entry is empty when its slot is kNone (so every id can be a key); erase shifts the entries
// after it back (no tombstones), so a lookup stops at the first empty entry. Not thread-safe:
// one owner (the table's shard loop).
#pragma once

#include <cstdint>
#include <memory>

namespace psched {

class RowIndex {
 public:
  // No slot: what find() gives for an id the index does not hold, and a slot it cannot hold.
  static constexpr uint32_t kNone = UINT32_MAX;

  // Holds nothing and no memory (as does an index moved from).
  RowIndex() = default;
  RowIndex(RowIndex&& other) noexcept { swap(other); }
  RowIndex& operator=(RowIndex&& other) noexcept {
    RowIndex(std::move(other)).swap(*this);
    return *this;
  }

  // Ids held.
  uint64_t size() const { return size_; }
  // Entries (a power of two, or 0): size() stays at most 3/4 of it.
  uint64_t capacity() const { return table_ ? mask_ + 1 : 0; }
  // The bytes of the entries, what the index holds.
  uint64_t bytes_held() const { return capacity() * sizeof(Entry); }
  // What bytes_held() becomes once `ids` ids are held (as many or more than now), growing as
  // insert() would.
  uint64_t bytes_holding(uint64_t ids) const;

  // The slot of `id`, kNone when it is not held.
  uint32_t find(uint64_t id) const {
    for (uint64_t at = hash(id) & mask_;; at = (at + 1) & mask_) {
      const Entry& entry = entries()[at];
      if (entry.id == id && entry.slot != kNone) return entry.slot;
      if (entry.slot == kNone) return kNone;
    }
  }
  bool contains(uint64_t id) const { return find(id) != kNone; }
  // Asks for the cache line a find(id) reads first.
  void prefetch(uint64_t id) const { __builtin_prefetch(&entries()[hash(id) & mask_]); }

  // Maps `id`, not held, to `slot` (not kNone); doubles the entries first past 3/4 full.
  void insert(uint64_t id, uint32_t slot);
  // Forgets `id`; false when it was not held.
  bool erase(uint64_t id);
  // Room for `ids` ids without growing.
  void reserve(uint64_t ids);

 private:
  struct Entry {
    uint64_t id;
    uint32_t slot;  // kNone: empty
    uint32_t unused;
  };
  static_assert(sizeof(Entry) == 16);
  struct Free {
    void operator()(Entry* entries) const;
  };
  // The entries a find reads when none are allocated: one, empty.
  static constexpr Entry kNoEntries[1] = {{0, kNone, 0}};

  // MurmurHash3's 64-bit finalizer: every bit of the id moves the low bits, which pick the
  // entry (ids in a run, or a shard's share of them, spread evenly).
  static uint64_t hash(uint64_t id) {
    id = (id ^ (id >> 33)) * 0xFF51AFD7ED558CCDull;
    id = (id ^ (id >> 33)) * 0xC4CEB9FE1A85EC53ull;
    return id ^ (id >> 33);
  }
  const Entry* entries() const { return table_ ? table_.get() : kNoEntries; }
  // Whether `ids` ids fit in `capacity` entries.
  static bool fits(uint64_t ids, uint64_t capacity) { return ids <= capacity / 4 * 3; }
  // Moves every entry into a new table of `entries` entries (a power of two that fits them).
  void rehash(uint64_t entries);
  void swap(RowIndex& other) noexcept;

  std::unique_ptr<Entry[], Free> table_;
  uint64_t mask_ = 0;  // capacity() - 1 (0 with no entries: every find reads kNoEntries[0])
  uint64_t size_ = 0;
};

}  // namespace psched
