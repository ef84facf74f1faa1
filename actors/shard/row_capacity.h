// SPDX-License-Identifier: Apache-2.0
// RowCapacity: what bounds one shard's rows of a table (TableSpec::max_rows, admit_after), kept
// by its RowTable (actors/shard/row_table.h).
//
// - Eviction: the stored rows in the order of their last update, least recent first, as a
//   list through their slots (8 bytes a row). A table at max_rows that must store a new row
//   evicts the least recently updated one: its slot, value and optimizer state go to the new
//   row, and the evicted row, touched again, starts from its initial value.
// - Admission: a row not stored is stored from its admit_after-th update on; until then its
//   updates are dropped (counted) and it reads as its initial value. The updates of rows not
//   stored are counted in a count-min sketch (two hashes, saturating 8-bit counters, conservative
//   update) of fixed size whatever the ids: an id may be admitted early when both its counters
//   are shared with hotter ids, never late.
//
// Deterministic: the same updates in the same order evict and admit the same rows, so a shard
// restored from a checkpoint (which holds the list and the sketch) and its update log (which
// holds the updates) ends where it was. A plain value type on the shard's loop.
#pragma once

#include <cstdint>
#include <vector>

#include "actors/shard/table_spec.h"
#include "common/byte_codec.h"

namespace psched {

class RowCapacity {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;
  // The most admit_after a table may ask (the sketch's counters saturate above it).
  static constexpr uint32_t kMaxAdmitAfter = 255;

  // Sized for `spec`: the sketch only with admit_after > 1, counters for about 8 times the
  // rows the table may store (max_rows, else num_embeddings; 2^12 to 2^24 a hash).
  explicit RowCapacity(const TableSpec& spec);

  // Whether a new row must evict one first: max_rows set and `rows` stored.
  bool full(uint64_t rows) const { return max_rows_ != 0 && rows >= max_rows_; }
  // Whether row `id`, not stored, is stored at this update (its admit_after-th); counts it.
  bool admit(uint64_t id);
  // The row in `slot` was stored (a new slot) or updated: it becomes the most recent.
  void added(uint32_t slot);
  void touched(uint32_t slot) {  // inline: a table without max_rows pays one test a row
    if (tracks_order() && slot != newest_) make_newest(slot);
  }
  // The least recently updated row's slot (kNone when none is stored): the one to evict.
  uint32_t oldest() const { return oldest_; }
  // Counts an eviction.
  void evicted() { ++evicted_; }

  uint64_t evictions() const { return evicted_; }
  uint64_t dropped() const { return dropped_; }  // updates of rows not admitted
  uint64_t bytes_held() const;

  // psched reshard, which places the rows of old shards' tables anew on this one:
  // The stored rows' slots, least recently updated first.
  std::vector<uint32_t> order() const;
  // Takes, counter by counter, the larger of this sketch's count and `other`'s (a table of the
  // same spec): an id's updates were counted on the one shard that held it, so the larger count
  // admits no id later than that shard would have (earlier, where counters are shared).
  void merge_sketch(const RowCapacity& other);
  // Adds evictions and dropped updates to the counts.
  void count(uint64_t evicted, uint64_t dropped) {
    evicted_ += evicted;
    dropped_ += dropped;
  }

  // The list (slots least recent first, `rows` of them), the sketch and the counts, and back:
  // load() rebuilds them for a table whose `rows` stored rows kept their slots.
  void save(ByteWriter& out, uint64_t rows) const;
  void load(ByteReader& in, uint64_t rows);

 private:
  bool tracks_order() const { return max_rows_ != 0; }
  void make_newest(uint32_t slot);
  void unlink(uint32_t slot);
  void link_newest(uint32_t slot);
  // The sketch's two counters of `id`.
  std::pair<uint64_t, uint64_t> counters(uint64_t id) const;

  uint64_t max_rows_;
  uint32_t admit_after_;
  std::vector<uint32_t> older_, newer_;  // by slot: its neighbours in the list (kNone at ends)
  uint32_t oldest_ = kNone, newest_ = kNone;
  uint64_t mask_ = 0;            // a hash's counters - 1 (a power of two - 1)
  std::vector<uint8_t> sketch_;  // two hashes' counters, one after the other
  uint64_t evicted_ = 0, dropped_ = 0;
};

}  // namespace psched
