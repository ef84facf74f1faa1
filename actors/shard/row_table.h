// SPDX-License-Identifier: Apache-2.0
// RowTable: one shard's rows of an embedding table, the second kind of variable beside the dense
// Variable (actors/shard/variable.h; both are HostedKinds, actors/shard/hosted_kind.h). Owned by
// its shard, on the shard's loop.
//
// Rows live in arenas of fixed-size chunks (value and optimizer state of a row side by side, so
// an update touches one place; a chunk is never moved, so the table grows without copying what
// it holds), and an index maps a row's id to its slot. A row is stored from its first update on;
// until then it is its initial value (TableSpec::init), a function of the table's seed and the
// id alone, computed when it is read. So a pull of rows nobody trained costs no memory, and
// every shard, whatever their number, gives a row the same first value.
//
// The index is RowIndex (actors/shard/row_index.h), an open-addressing table whose entry holds
// an id and its slot together, so that finding a row waits on one cache line at random, not the
// two of abseil's flat_hash_map (control byte, then slot), which it replaced for the update rate
// at about the same memory (row_index.h gives both). abseil's map was chosen before over
// tsl::robin_map and std::unordered_map (`build/bench/psched-row-index-bench`, 10 million ids:
// 28.5 bytes an id against robin_map's 40.3 at load factor 0.9 and 80.5 at its default 0.5, and
// unordered_map's 41.7), memory per row being the binding limit (a row of dim 16 in float32 is
// 64 bytes); RowIndex takes 26.8 there.
//
// When an update applies is not the table's to decide: its shard's StepMachine says (as for a
// Variable), with a StepTrack of one unit, [0, 1): a worker pushes each step of the table once to
// every shard, with the rows of it that it touched there, so a step's units all complete with
// that one push and finer units would gain nothing. The table checks ids and widths, gathers a
// sync step's row sums, and applies the optimizer to the rows the machine's StepUpdate says
// apply.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include <absl/container/flat_hash_map.h>

#include "actors/shard/hosted_kind.h"
#include "actors/shard/row_capacity.h"
#include "actors/shard/row_index.h"
#include "actors/shard/step_track.h"
#include "actors/shard/table_spec.h"
#include "common/aligned_buffer.h"
#include "common/byte_codec.h"
#include "common/table_config.h"

namespace psched {

class RowTable final : public HostedKind {
 public:
  // Rows per arena chunk: large enough that a chunk's bookkeeping is nothing beside it, small
  // enough that a table's last chunk wastes little.
  static constexpr uint32_t kRowsPerChunk = 4096;

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

  // HostedKind. check_push: ids below the table's rows, rows of its dtype and width (check_rows).
  // check_poll: ids below its rows. Both cover the one unit, [0, 1). take: an update not gathered
  // (async, bounded) applies the push's rows at once as update `update.t`; gathered (sync), they
  // are added to the step's sums, and when the push completes the step every row gathered is
  // applied as the mean of the gradients pushed (a worker that pushed without a row counts as
  // zero for it: DDP's mean of sparse gradients). read: the poll's rows, one after another.
  KindTag tag() const override { return KindTag::table; }
  const std::string& name() const override { return spec_.name; }
  Priority priority() const override { return spec_.priority; }
  DType dtype() const override { return spec_.dtype; }
  ElementRange extent() const override { return kUnit; }
  StepRule step_rule(const ShardSettings& settings) const override {
    return settings.table_rule(spec_.name);
  }
  ElementRange check_push(const Push& push) const override;
  ElementRange check_poll(const char* what, const Poll& poll) const override;
  void take(const StepUpdate& update, const Push& push) override;
  void apply_gathered(const StepUpdate& update) override;
  uint64_t answer_bytes(const Poll& poll) const override;
  void read(const Poll& poll, std::span<std::byte> out) const override;
  uint64_t stored_bytes() const override { return bytes_held(); }
  uint64_t growth_bytes(const Push& push) const override { return growth_bytes(push.ids); }
  void count_push(const Push& push) override { rows_pushed_ += push.ids.size(); }
  void count_answer(const Poll& poll) override { rows_pulled_ += poll.ids.size(); }
  void report(ShardStats& stats) const override;

  // Throws unless every one of `ids` names a row of the table (offset_out_of_range naming the
  // table and the id) and `bytes` are ids.size() rows of `dtype`, the table's (dtype_mismatch,
  // shape_mismatch); `what` names the request ("push", "pull").
  void check_rows(const char* what, std::span<const uint64_t> ids, DType dtype,
                  uint64_t bytes) const;

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

  // A checkpoint streams the table (actors/durability/shard_durability.h): save_head() writes
  // the spec, its capacity and its state and the count of rows stored now, freeze() keeps those
  // rows as they are for the stream, and save_chunk() encodes them a chunk at a time, each row
  // its id then its value and state, for `emit`; an update about to change a frozen row whose
  // chunk is not encoded yet keeps that row's value and state as they were first, for its
  // chunk. So the stream holds every row as at the freeze while updates go on; what it costs
  // beside the table is the rows updated before their chunk went (one row's bytes each), and no
  // pause longer than a chunk's encoding.
  void save_head(ByteWriter& out) const override;
  // Freezes the rows stored now, their bytes in the stream at `base` on; returns their bytes.
  // Requires no freeze under way.
  uint64_t freeze(uint64_t base, Emit emit) override;
  // Encodes the next frozen chunk not encoded yet and hands it to `emit`; false when none is
  // left (the freeze is over).
  bool save_chunk() override;
  // The table save_head() wrote in `head`, its rows read from `rows` as save_chunk encoded them.
  // Throws Error(corrupt_checkpoint) naming `head` when what it reads is malformed or could not
  // have been written.
  static RowTable restore(ByteReader& head, ByteSource& rows);
  // The sums a sync step in progress gathered so far, and back (beside its track's progress in
  // a checkpoint, as a Variable's sums are).
  void save_sums(ByteWriter& out) const override;
  void load_sums(ByteReader& in) override;
  // The spec and row count save_head() wrote (and the capacity's state), checked; `rows` gets
  // the count. Its rows are not read: restore() does, or psched reshard streams them.
  static RowTable restore_head(ByteReader& in, uint64_t& rows);
  // A head as save_head() writes it, for a table of `spec` whose `rows` rows stream after the
  // payload and whose capacity is `capacity` (psched reshard, which places rows anew).
  static void save_head(ByteWriter& out, const TableSpec& spec, uint64_t rows,
                        const RowCapacity& capacity);
  // Bytes of one row in a checkpoint's stream: its id, then its value and optimizer state.
  uint64_t record_bytes() const { return sizeof(uint64_t) + block_bytes_; }

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
  // update_all where no slot_of can evict (the batch cannot reach max_rows), in two passes, so
  // that each waits on one kind of miss at a time, many in flight: first every update's slot,
  // each index entry asked for kIndexAhead lookups before it is read; then the rows in blocks of
  // kUpdateBlock, every cache line of a block's rows asked for while the block before updates.
  void update_ahead(std::span<const RowUpdate> updates, const optim::RowStep& step);
  static constexpr size_t kIndexAhead = 32;
  static constexpr size_t kUpdateBlock = 16;
  // Asks for the cache lines of the row in `slot` (value and state), to be written, and of its
  // `gradient` (a row of the dtype), to be read.
  void ask_row(uint32_t slot, const std::byte* gradient) const;
  // One update each of `updates` (at most kUpdateBlock), the row of updates[k] in slots[k]
  // (RowCapacity::kNone: not admitted yet, its update dropped), each row kept first where a
  // checkpoint stream still needs it as it was (keep_frozen).
  void update(std::span<const RowUpdate> updates, std::span<const uint32_t> slots,
              const optim::RowStep& step);
  // The unit a step of the table covers (its StepTrack's extent).
  static constexpr ElementRange kUnit{0, 1};
  // A sync step's gradient sums: each row gathered so far, in the order first met.
  struct StepSums {
    absl::flat_hash_map<uint64_t, uint32_t> position;  // id -> row of `sums`
    std::vector<uint64_t> ids;                         // by row of `sums`
    std::vector<std::byte> sums;
  };
  // Adds `ids`' `gradients` into the step's sums.
  void gather(std::span<const uint64_t> ids, std::span<const std::byte> gradients);
  // Applies each row gathered as its sum over `gradients` pushes (update `t`), in id order, and
  // forgets the sums.
  void apply_sums(uint32_t gradients, uint64_t t);

  TableSpec spec_;
  uint64_t state_elements_;  // per row (optim::row_state_elements)
  uint64_t block_bytes_;     // per row: value and state
  std::vector<AlignedBuffer> chunks_;
  RowIndex index_;             // id -> slot
  std::vector<uint64_t> ids_;  // slot -> id
  RowCapacity capacity_;       // max_rows, admit_after
  std::optional<Freeze> freeze_;
  StepSums gathered_;         // sync: of the step in progress
  uint64_t rows_pushed_ = 0;  // rows of accepted pushes (each worker's, each step)
  uint64_t rows_pulled_ = 0;  // rows answered
};

}  // namespace psched
