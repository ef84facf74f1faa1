// SPDX-License-Identifier: Apache-2.0
// RowTable: one shard's rows of an embedding table, the second kind of variable beside the dense
// Variable (actors/shard/variable.h). A plain value type owned by its shard, on the shard's loop.
//
// Rows live in arenas of fixed-size chunks (value and optimizer state of a row side by side, so
// an update touches one place; a chunk is never moved, so the table grows without copying what
// it holds), and an index maps a row's id to its slot. A row is stored from its first update on;
// until then it is its initial value (TableSpec::init), a function of the table's seed and the
// id alone, computed when it is read. So a pull of rows nobody trained costs no memory, and
// every shard, whatever their number, gives a row the same first value.
//
// The index is abseil's flat_hash_map (Debian's libabsl-dev), chosen by measurement over
// tsl::robin_map and std::unordered_map (`build/bench/psched-row-index-bench`, 10 million ids):
// 28.5 bytes an id against robin_map's 40.3 at load factor 0.9 and 80.5 at its default 0.5, and
// unordered_map's 41.7; robin_map looks ids up faster (41-55 million a second against 23 on one
// core of this machine), but 23 million is far more than a shard's rows per second can use,
// while memory per row is the binding limit (a row of dim 16 in float32 is 64 bytes).
//
// When an update applies is not the table's to decide: its shard's StepMachine says (as for a
// Variable), with a StepTrack whose unit is a part of the table (TableSpec::parts): a worker
// pushes every part of every step once, with the rows of it that it touched. The table checks
// ids and widths, gathers a sync step's row sums part by part, and applies the optimizer to the
// rows the machine's StepUpdate says apply.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include <absl/container/flat_hash_map.h>

#include "actors/shard/row_capacity.h"
#include "actors/shard/step_track.h"
#include "actors/shard/table_spec.h"
#include "common/aligned_buffer.h"
#include "common/byte_codec.h"
#include "common/table_config.h"

namespace psched {

class RowTable {
 public:
  // Rows per arena chunk: large enough that a chunk's bookkeeping is nothing beside it, small
  // enough that a table's last chunk wastes little.
  static constexpr uint32_t kRowsPerChunk = 4096;
  // The most parts a table's step may have (TableSpec::parts).
  static constexpr uint32_t kMaxParts = 1 << 16;

  // Throws Error(invalid_argument) naming what is wrong when `spec` cannot make a table: a dtype
  // other than float32 and float64, no rows or no elements per row, an optimizer setting out of
  // range (optim::validate_row), an init whose bounds cannot be.
  static void check_spec(const TableSpec& spec);
  // Applies the deployment's entry for the table (`tables:`) to a registration's `spec`: its
  // max_rows and admit_after where the registration gives none; throws spec_conflict naming
  // the field when its dim, optimizer or init differ from the registration's.
  static void declare(TableSpec& spec, const TableConfig& declared);
  // A table holding no rows yet; `spec` passed check_spec.
  explicit RowTable(TableSpec spec);

  const TableSpec& spec() const { return spec_; }

  // Throws unless every one of `ids` names a row of the table (offset_out_of_range naming the
  // table and the id) and `bytes` are ids.size() rows of `dtype`, the table's (dtype_mismatch,
  // shape_mismatch); `what` names the request ("push", "pull").
  void check_rows(const char* what, std::span<const uint64_t> ids, DType dtype,
                  uint64_t bytes) const;
  // check_rows for a push of part `part`: also that the part is one of the table's and that each
  // id is in it (invalid_argument naming the id and both parts).
  void check_part(uint32_t part, std::span<const uint64_t> ids, DType dtype, uint64_t bytes) const;

  // One part's share of a push (check_rows passed): its ids, each with its gradient row.
  struct PartRows {
    uint32_t part;
    std::span<const uint64_t> ids;
    std::span<const std::byte> gradients;
  };
  // A push's `ids` and `gradients` grouped by part, every part of the table once (empty where
  // the push has no row of it), each part's rows in the order given. The groups view `ids`
  // and `gradients` for a table of one part, else copies kept in `ids_kept` and `kept`.
  std::vector<PartRows> by_part(std::span<const uint64_t> ids, std::span<const std::byte> gradients,
                                std::vector<uint64_t>& ids_kept,
                                std::vector<std::byte>& kept) const;
  // The parts a pull of `ids` waits for: the smallest range of parts holding them all; every
  // part for no ids (a pull of no rows waits for the table's whole step on the shard).
  ElementRange parts_of(std::span<const uint64_t> ids) const;

  // Carries out what the step machine decided for an accepted push of part `part` (the track's
  // unit [part, part + 1)): `ids` with `gradients`, passed by check_part. Not gathered (async,
  // bounded): applied at once as update `update.t`. Gathered (sync): added to the part's sums,
  // and when the push completes the part, every row gathered for it is applied as the mean of
  // the gradients pushed into the part (a worker that pushed the part without a row counts as
  // zero for it: DDP's mean of sparse gradients).
  void take(const StepUpdate& update, uint32_t part, std::span<const uint64_t> ids,
            std::span<const std::byte> gradients);
  // Applies the mean gathered for each of `update`'s complete pieces (parts) that any worker
  // pushed (a membership change or a timeout completed them); the rest stay as they are.
  void apply_gathered(const StepUpdate& update);
  // Update `t` (the table's step) of the rows `ids` from `gradients`, one row each in id order
  // as given, passed by check_rows; the gradients of an id given more than once are summed
  // first (torch's coalesce), so each row gets one update.
  void apply(std::span<const uint64_t> ids, std::span<const std::byte> gradients, uint64_t t);
  // Each of `ids`' current value (its initial value while never updated), one row each into
  // `out` (ids.size() rows), passed by check_rows.
  void read(std::span<const uint64_t> ids, std::span<std::byte> out) const;
  // The initial value of row `id` into `out` (spec().row_bytes()).
  void initial_row(uint64_t id, std::span<std::byte> out) const;

  // Rows stored (updated at least once; not evicted since).
  uint64_t rows() const { return index_.size(); }
  // Its bound and what it evicted and dropped (actors/shard/row_capacity.h).
  const RowCapacity& capacity() const { return capacity_; }
  // About how many bytes bytes_held() grows by when the rows of `ids` not stored yet are
  // stored (their arena chunks, index and order slots; none past max_rows, which evicts).
  uint64_t growth_bytes(std::span<const uint64_t> ids) const;
  // Bytes the table holds: its arena chunks and its index's slots (not the spec's few).
  uint64_t bytes_held() const;
  // Bytes of the stored rows' values and optimizer state: what bytes_held() is the cost of.
  uint64_t payload_bytes() const { return rows() * block_bytes_; }

  // Everything the table holds (spec, capacity, each stored row's id, value and optimizer
  // state), so that restore() rebuilds an equal table. restore throws Error(corrupt_checkpoint)
  // naming `in` when what it reads is malformed or could not have been written. `capacity`:
  // the head holds the capacity and its state (ShardStore::kCapacityFormat on; before, none).
  void save(ByteWriter& out) const;
  static RowTable restore(ByteReader& in, bool capacity = true);

  // A checkpoint that streams the table (actors/durability/shard_durability.h): save_head()
  // writes the spec and the count of rows stored now, freeze() keeps those rows as they are for
  // the stream, and save_chunk() encodes them a chunk at a time, each row its id then its value
  // and state, for `emit`; an update about to change a frozen row whose chunk is not encoded
  // yet keeps that row's value and state as they were first, for its chunk. So the stream
  // holds every row as at the freeze while updates go on; what it costs beside the table is
  // the rows updated before their chunk went (one row's bytes each), and no pause longer than
  // a chunk's encoding.
  using Emit = std::function<void(uint64_t offset, std::vector<std::byte> rows)>;
  void save_head(ByteWriter& out) const;
  // Freezes the rows stored now, their bytes in the stream at `base` on; returns their bytes.
  // Requires no freeze under way.
  uint64_t freeze(uint64_t base, Emit emit);
  // Encodes the next frozen chunk not encoded yet and hands it to `emit`; false when none is
  // left (the freeze is over).
  bool save_chunk();
  // The table save_head() wrote in `head`, its rows read from `rows` as save_chunk encoded them.
  static RowTable restore(ByteReader& head, ByteSource& rows, bool capacity = true);
  // The sums a sync step in progress gathered so far, part by part, and back (beside its
  // track's progress in a checkpoint, as a Variable's sums are).
  void save_sums(ByteWriter& out) const;
  void load_sums(ByteReader& in);

 private:
  // The value then the optimizer state of the row in `slot`.
  std::byte* block(uint32_t slot);
  const std::byte* block(uint32_t slot) const;
  // The slot of row `id`, the most recently updated now; made (and filled with the row's
  // initial value and state, evicting the least recently updated row at max_rows) when it was
  // not stored yet; RowCapacity::kNone when not admitted (its update is dropped).
  uint32_t slot_of(uint64_t id);
  // A new slot for row `id` (not stored yet), its memory not filled in.
  uint32_t new_slot(uint64_t id);
  // The spec and row count save_head() wrote (and the capacity's state), checked; `rows` gets
  // the count.
  static RowTable restore_head(ByteReader& in, uint64_t& rows, bool capacity);
  // Encodes frozen chunk `chunk` for the stream (its rows kept as they were where an update
  // came first) and marks it done.
  void save_frozen(uint32_t chunk);
  // Keeps frozen row `slot`'s id, value and state as they are, before an update or an eviction
  // changes them: keep_frozen when the stream still needs them, keep_before always.
  void keep_frozen(uint32_t slot);
  void keep_before(uint32_t slot);
  // A kept row's record in Freeze::before: its slot (u32) and id (u64), then value and state.
  static constexpr size_t kKeptHead = sizeof(uint32_t) + sizeof(uint64_t);
  // A checkpoint stream under way (freeze): what is frozen and what is encoded already.
  struct Freeze {
    uint32_t rows = 0;  // slots below are frozen
    uint64_t base = 0;
    Emit emit;
    std::vector<bool> saved;  // by chunk
    uint32_t next = 0;        // the first chunk save_chunk() looks at
    std::vector<bool> kept;   // by slot: its value and state as at the freeze are in `before`
    // By chunk: rows an update or eviction changed before the chunk went, each its slot (u32)
    // then its id, value and state as at the freeze.
    std::vector<std::vector<std::byte>> before;
  };
  // A row's update: its id and its gradient (a row of the dtype).
  struct RowUpdate {
    uint64_t id;
    const std::byte* gradient;
  };
  // The updates in order, with the step's scalars (optim::row_step, once a step); a row not
  // admitted (slot_of) drops its update.
  void update_all(std::span<const RowUpdate> updates, const optim::RowStep& step);
  static constexpr size_t kUpdateBlock = 16;  // rows whose slots update_all finds ahead
  // One update of the row in `slot`.
  void update(uint32_t slot, const std::byte* gradient, const optim::RowStep& step);
  // A sync step's gradient sums of one part: each row gathered so far, in the order first met.
  struct PartSums {
    absl::flat_hash_map<uint64_t, uint32_t> position;  // id -> row of `sums`
    std::vector<uint64_t> ids;                         // by row of `sums`
    std::vector<std::byte> sums;
  };
  // Adds `ids`' `gradients` into the sums of part `part`.
  void gather(uint32_t part, std::span<const uint64_t> ids, std::span<const std::byte> gradients);
  // Applies each row gathered for part `part` as its sum over `gradients` pushes (update `t`), in
  // id order, and forgets the sums.
  void apply_part(uint32_t part, uint32_t gradients, uint64_t t);

  TableSpec spec_;
  uint64_t state_elements_;  // per row (optim::row_state_elements)
  uint64_t block_bytes_;     // per row: value and state
  std::vector<AlignedBuffer> chunks_;
  absl::flat_hash_map<uint64_t, uint32_t> index_;  // id -> slot
  std::vector<uint64_t> ids_;                      // slot -> id
  RowCapacity capacity_;                           // max_rows, admit_after
  std::optional<Freeze> freeze_;
  std::vector<PartSums> gathered_;  // sync: by part, of the step in progress
};

}  // namespace psched
