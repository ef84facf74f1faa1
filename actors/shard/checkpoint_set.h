// SPDX-License-Identifier: Apache-2.0
// A stopped job's checkpoints, one a shard, read and checked as one whole: what `psched reshard`
// places anew (actors/shard/reshard.h) and `psched export` writes out (actors/shard/export.h).
//
// Each shard's newest checkpoint is read whole but for its tables' rows, which stay in the file
// and are streamed from it a chunk at a time (for_each_row): the dense variables and the tables'
// heads are in memory, as a shard holds them when it checkpoints; the rows never are.
//
// A shard whose newest checkpoint does not hold all it acknowledged (updates logged after it:
// the shard was killed, or stopped before it could checkpoint; a log damaged or missing; a newer
// checkpoint corrupt) is first restored as its server's start restores it
// (VariableShard::restore: the newest valid checkpoint, the logs after it replayed, a torn last
// record dropped), under the job's deployment settings (CheckpointSetOptions::replay), into a
// fresh checkpoint in CheckpointSetOptions::scratch, which is then read as above. The job's files
// are not changed: the restore works on links to their checkpoints and copies of their logs. It
// holds that one shard in memory, as its server does; the rows read later still stream.
//
// What read_checkpoint_set refuses, each with an Error(bad_config) that starts with the tool's
// name and names the file or shard and what is wrong: no directory, a directory that is none or
// holds no shard's checkpoint, a shard missing or with checkpoints in two directories, a shard of
// another count, checkpoints of two jobs (job identity, mode, workers or slot map differ), shards
// whose memberships differ (job_machine), a shard that needs a replay when no replay settings
// are given, or settings not of the job's deployment (another mode, workers or shard count). A
// damaged log is refused as a start of its server refuses it (Error(corrupt_checkpoint) naming
// the file and the byte) unless replay->accept_log_loss. gather_kinds refuses a checkpoint taken
// inside a step and parts or heads that do not fit together. A damaged file throws
// Error(corrupt_checkpoint) naming it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "actors/durability/file_io.h"
#include "actors/durability/shard_durability.h"
#include "actors/durability/shard_store.h"
#include "actors/shard/row_table.h"
#include "actors/shard/variable.h"
#include "common/shard_settings.h"

namespace psched {

// One kind a shard hosted, read from its checkpoint: a dense variable's part whole, a table's
// head (its rows stay in the file), and the records of its steps and sums as saved.
struct SavedKind {
  std::unique_ptr<Variable> variable;
  std::unique_ptr<RowTable> table;
  uint64_t rows = 0;     // a table's rows in its shard's stream
  uint64_t rows_at = 0;  // where they start in that stream (bytes)
  std::vector<std::byte> track, sums;
  bool between_steps = true;  // its track's: no step part-way
  Step step;                  // its track's newest complete step (StepTrack::latest_step)

  const std::string& name() const { return variable ? variable->name() : table->name(); }
};

// One shard's newest checkpoint: its file, header, step machine record and kinds.
struct SavedShard {
  ShardStore::Checkpoint checkpoint;
  // What messages call it: its checkpoint's file, or for one restored from its logs (whose
  // file is a scratch one), the old checkpoint and logs it was restored from.
  std::string name;
  CheckpointHeader header;
  std::vector<std::byte> machine;  // StepMachine::save's record
  std::vector<std::byte> members;  // its membership's, the record's first bytes
  std::vector<SavedKind> kinds;
};

// How read_checkpoint_set reads a set: from where, for which tool, and the replay of a shard's
// logs.
struct CheckpointSetOptions {
  std::vector<std::filesystem::path> dirs;  // directories holding the job's checkpoints and logs
  // "reshard", "export": starts every message and names what to run once the operator has made
  // the set whole.
  std::string_view tool;
  // The settings the job's servers ran with (config/deployment.h shard_settings of its
  // deployment file, any shard's: the id and checkpoint directory are set per shard), under
  // which a shard's logged updates are replayed: its mode, workers and shard count must be the
  // checkpoints'; its step rules (staleness, table_mode, tables:, min_workers) decide how a
  // replayed push applies, as at the server's start. Its accept_log_loss goes on past a damaged
  // or missing log, losing the updates it held (psched-server --accept-log-loss). The replay
  // runs on the CPU (a shard's device: is not opened). Absent: a shard that needs a replay is
  // refused.
  std::optional<ShardSettings> replay;
  std::string replay_source;  // names `replay` in messages ("--from-config deployment.yaml")
  // Where shards restored from their logs are written, shard-<id>/ each (made when one is; the
  // caller removes it once the set's files are no longer read).
  std::filesystem::path scratch;
};

// A shard restored from its checkpoint and logs before it was read.
struct ShardReplay {
  uint32_t shard = 0;
  std::filesystem::path checkpoint;  // the old checkpoint it started from
  uint64_t updates = 0;              // logged updates replayed
  std::vector<std::string> dropped;  // torn last records dropped (never acknowledged)
  std::string lost;                  // with accept_log_loss: the damage gone past, what it lost
};

// The newest checkpoint of every shard in options.dirs, shard 0 first, restored from its logs
// first where it needs it (each such shard added to `replayed`), checked to be one job's whole
// set (the header's list of refusals).
std::vector<SavedShard> read_checkpoint_set(const CheckpointSetOptions& options,
                                            std::vector<ShardReplay>& replayed);

// The job's step machine record, as a shard of it restarted on a new placement starts from:
// shard 0's, with the job's membership merged from every shard's (Membership::save: the
// workers, then each one's step it joined from and whether it pushed since). The steps must
// agree (else a worker joined or left between the checkpoints: Error(bad_config)); a worker
// pushed since it joined where any shard saw it push (a shard holding nothing of what it pushes
// never does), so a restarted trainer joins at the job's step.
std::vector<std::byte> job_machine(const std::vector<SavedShard>& shards, std::string_view tool);

// The job's kinds, gathered from its shards: a dense variable's parts by name (in element
// order), a table's heads by name (one a shard, shard 0's first), each name in the order first
// met. The pointers point into the shards given to gather_kinds, which must outlive this.
struct SavedKinds {
  std::vector<std::string> dense_names, table_names;
  std::map<std::string, std::vector<const SavedKind*>> dense, tables;
};

// Gathers `shards`' kinds; throws Error(bad_config) naming the file and the kind when a
// checkpoint was taken inside a step (a step part-way on a variable or table, or the parts of
// a variable at different steps), when a variable's parts do not cover it once in one spec, or
// when a table is not on every shard in one spec and one step.
SavedKinds gather_kinds(const std::vector<SavedShard>& shards, std::string_view tool);

// A stored row's id: the first 8 bytes of its record (RowTable::record_bytes()).
inline uint64_t saved_row_id(std::span<const std::byte> record) {
  uint64_t id = 0;
  std::memcpy(&id, record.data(), sizeof id);
  return id;
}

// Calls `each(table, shard, slot, record)` with every stored row of `shards` (its index in
// kinds.table_names, the shard, its place in that shard's stream of the table, and its record:
// the id, then its value and optimizer state), shard by shard and each shard's tables in its
// order, reading the files in order through FileSource's buffer of 1 MiB: what the rows cost in
// memory whatever their number.
template <typename Each>
void for_each_row(const std::vector<SavedShard>& shards, const SavedKinds& kinds,
                  const Each& each) {
  for (uint32_t s = 0; s < shards.size(); ++s) {
    const ShardStore::Checkpoint& c = shards[s].checkpoint;
    FileSource rows(c.file, c.rows_offset, c.rows_bytes);
    std::vector<std::byte> row;
    for (const SavedKind& kind : shards[s].kinds) {
      if (!kind.table) continue;
      const auto table = static_cast<size_t>(
          std::find(kinds.table_names.begin(), kinds.table_names.end(), kind.name()) -
          kinds.table_names.begin());
      row.resize(kind.table->record_bytes());
      for (uint64_t slot = 0; slot < kind.rows; ++slot) {
        rows.read(row);
        each(table, s, static_cast<uint32_t>(slot), std::span<const std::byte>(row));
      }
    }
  }
}

}  // namespace psched
