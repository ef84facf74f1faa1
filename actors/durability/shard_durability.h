// SPDX-License-Identifier: Apache-2.0
// ShardDurability: what lets a VariableShard survive a restart. It owns the shard's files
// (actors/durability/shard_store.h: checkpoints and update logs), appends a record of each accepted
// update before the shard acknowledges it, encodes checkpoints, and on restore hands the shard
// the newest checkpoint's variables and the updates logged after it.
//
// Owner and threads: each VariableShard owns one and calls it directly on the shard's loop,
// the only thread that touches it, with one exception: checkpoint() encodes the shard's state
// on the loop, then its writer thread writes the file (ShardStore::write_checkpoint, the one
// store call made off the loop) while the loop appends to the newer log, and the outcome is
// posted back to the loop.
#pragma once

#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "actors/durability/shard_store.h"
#include "actors/runtime/actor.h"
#include "actors/shard/shard_request.h"
#include "actors/shard/shard_stats.h"
#include "actors/shard/table_spec.h"
#include "actors/shard/variable_spec.h"
#include "common/asio.h"
#include "common/byte_codec.h"
#include "common/placement.h"
#include "common/shard_settings.h"
#include "common/slot_map.h"
#include "common/types.h"

namespace psched {

// What VariableShard::restore found and did.
struct RestoreReport {
  std::filesystem::path checkpoint;  // the checkpoint loaded; empty when none was found
  uint64_t variables = 0;            // variable parts held after restoring
  uint64_t tables = 0;               // embedding tables held after restoring
  uint64_t replayed = 0;             // logged updates re-applied after the checkpoint
  std::vector<std::string> skipped;  // corrupt checkpoints and torn log records, with reasons
  std::string lost;  // with accept_log_loss: the damage gone past and the updates it lost
  std::filesystem::path written;  // the fresh checkpoint written after restoring
};

// What every checkpoint's payload starts with: whose state it is. The shard's variables follow
// (State::save_variables).
struct CheckpointHeader {
  ShardId shard;
  Mode mode = Mode::async;
  uint32_t workers = 1;
  uint64_t job = 0;  // ShardSettings::job, kept from the job's first start on
  SlotMap map;       // the job's placement (common/slot_map.h); map.shards() is the job's
  uint64_t generation = 0;
  int64_t written_at_ns = 0;  // wall clock

  void encode(ByteWriter& out) const;
  // Throws Error(corrupt_checkpoint) naming `in` when it is no header.
  static CheckpointHeader decode(ByteReader& in);
};

class ShardDurability {
 public:
  // Where a checkpoint's table rows go as they are encoded: `rows` at `offset` of its rows.
  using RowsEmit = std::function<void(uint64_t offset, std::vector<std::byte> rows)>;
  // Encoded row chunks a checkpoint lets wait for the writer at once: what it holds of the
  // tables beside them (a chunk is RowTable::kRowsPerChunk rows).
  static constexpr size_t kChunksInFlight = 4;

  // The shard's side, called on its loop: its variables, encoded and decoded, and the updates
  // a log replays, applied as when they were first accepted (and, while restoring, not logged).
  class State {
   public:
    // Writes the membership, the count of variables, then each variable (a table: without its
    // rows, which freeze_rows() streams).
    virtual void save_variables(ByteWriter& out) const = 0;
    // Freezes every table's rows as they are, for a checkpoint that streams them: each
    // table's at its offset after the previous one's, in id order. `emit` gets the rows a
    // chunk at a time, from save_rows() or from an update about to change a row not emitted
    // yet. Returns their bytes. Called right after save_variables, in the same turn.
    virtual uint64_t freeze_rows(RowsEmit emit) = 0;
    // Emits the next chunk of frozen rows; false when none is left.
    virtual bool save_rows() = 0;
    // Reads what save_variables wrote into the shard, which holds no variables yet, the
    // tables' rows from `rows`.
    virtual void load_variables(ByteReader& in, ByteSource& rows) = 0;
    virtual void replay_register(VariableSpec& spec, ElementRange part,
                                 std::span<const std::byte> initial) = 0;
    virtual void replay_register_table(TableSpec& spec) = 0;
    // A logged push, of either kind; what it borrows lives until the call returns.
    virtual void replay_push(const Push& push) = 0;
    // A sync step completed without its missing workers; `record` names the log record.
    virtual void replay_timeout(VariableId id, Step step, const std::string& record) = 0;
    // A worker joined the job from step `from`, or left it (actors/shard/membership.h).
    virtual void replay_join(WorkerId worker, Step from, const std::string& record) = 0;
    virtual void replay_leave(WorkerId worker, const std::string& record) = 0;

   protected:
    ~State() = default;
  };

  // `settings` and `state` (the owning shard's) outlive this.
  ShardDurability(ActorLoop& loop, const ShardSettings& settings, State& state);
  ~ShardDurability();

  // Append a record of an accepted update to the update log, when one is being written;
  // throw Error(io_error) when it cannot be (the update must then be refused). On the loop.
  void log_register(const VariableSpec& spec, ElementRange part,
                    std::span<const std::byte> initial);
  void log_register_table(const TableSpec& spec);
  void log_push(const Push& push);
  void log_timeout(VariableId id, Step step);
  void log_join(WorkerId worker, Step from);
  void log_leave(WorkerId worker);

  // Loads the newest valid checkpoint into the state and replays the logs after it, then
  // writes a fresh checkpoint and starts a new log (VariableShard::restore says what throws),
  // saying in `report` what it did; when it throws, `report` holds what it found until then.
  // On the loop, once, before serving; report.variables and tables are the caller's to fill.
  void restore(RestoreReport& report);
  // The newest valid checkpoint of shard settings.id in settings.serve_directory (a serving
  // shard's), checksum checked, rows left in the file. Throws Error(bad_config) naming the
  // directory when it is missing or holds no valid checkpoint of this shard. Any thread.
  static ShardStore::Checkpoint newest_served(const ShardSettings& settings);
  // A serving shard's load: `found` (newest_served's) into the state, which holds nothing yet,
  // read-only: no update log is replayed and nothing is written. The mode and worker count the
  // job was trained with must be the settings' (a serving shard takes them from the checkpoint
  // it starts on: ShardHost; a later one of another is refused as its membership cannot be
  // read). Throws Error(bad_config) when the checkpoint's job is on another number of shards,
  // Error(corrupt_checkpoint) naming the file when it cannot be read. Unlike the rest, callable
  // off the loop while no other thread uses the state (a load beside the one served).
  ServedVersion load_served(const ShardStore::Checkpoint& found);

  // Takes a checkpoint of the state now and starts a new update log; the writer thread writes
  // the file, then `done` runs on the loop with its path (not if this is gone by then). The
  // tables' rows are encoded a chunk per turn of the loop, at most kChunksInFlight waiting for
  // the writer, while updates go on (State::freeze_rows). A checkpoint asked for while one is
  // being written is taken when it is done, so they are written in the order asked. Throws
  // when restore() has not run. On the loop.
  void checkpoint(std::function<void(std::exception_ptr, std::filesystem::path)> done);

  // The job this shard serves and its slot map: the settings' (job, SlotMap::even(shards)) until
  // restore() reads a checkpoint's. On the loop.
  uint64_t job() const { return job_; }
  const SlotMap& slot_map() const { return map_; }

 private:
  // Re-applies one logged record. On the loop.
  void replay(ByteReader& record);
  void replay_push(ByteReader& record);
  // Decodes a checkpoint's payload into the state. On the loop.
  void load(ByteReader& in, ByteSource& rows);
  // Reads the header of the checkpoint in `in`, checks that it is this shard's of a job on the
  // deployment's shard count (and, unless `serving`, in its mode with its workers), and takes
  // its job and map.
  CheckpointHeader take_header(ByteReader& in, bool serving);
  // The state, encoded with this shard's header. On the loop.
  std::vector<std::byte> snapshot();
  // The next generation's snapshot, with its update log started. On the loop.
  std::vector<std::byte> begin_checkpoint();
  void append(ByteWriter& record);
  using Done = std::function<void(std::exception_ptr, std::filesystem::path)>;
  // The checkpoint being written: its file (on the writer thread) and what the loop tracks.
  struct Stream;
  void start_checkpoint(Done done);
  // Hands `rows` to the writer thread; its completion comes back to the loop (pump).
  void write_rows(uint64_t offset, std::vector<std::byte> rows);
  // Encodes chunks while fewer than kChunksInFlight wait; once all are written, finishes the
  // file. On the loop.
  void pump();
  void finish_checkpoint();
  // Writes a whole checkpoint now, on the loop (restore(), before serving).
  std::filesystem::path checkpoint_now();

  ActorLoop& loop_;
  const ShardSettings& settings_;
  State& state_;
  std::unique_ptr<ShardStore> store_;  // after restore()
  uint64_t generation_ = 0;            // of the newest checkpoint taken
  uint64_t job_;
  SlotMap map_;
  // Expires with this: a checkpoint's outcome, posted back from the writer thread, may reach
  // the loop after the shard went.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  std::shared_ptr<Stream> stream_;  // the checkpoint being written, if any
  std::vector<Done> waiting_;       // checkpoints asked for while it is
  // Writes checkpoint files, one after another; started by the first checkpoint(). Last: it
  // joins first, while the store lives.
  std::unique_ptr<boost::asio::thread_pool> writer_;
};

}  // namespace psched
