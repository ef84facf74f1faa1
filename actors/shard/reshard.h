// SPDX-License-Identifier: Apache-2.0
// reshard: a job's checkpoints and update logs written by N shards, placed anew on M (`psched
// reshard`, apps/psched_cli.cc). The job's slot map (common/slot_map.h) is rebalanced to M
// shards (epoch + 1, the fewest slots moved) and every shard's state goes where the new map
// puts it:
//
//   rows            each row, its value and optimizer state, to the owner of its slot, streamed a
//                   chunk at a time from the old checkpoints' files into the new ones (two passes:
//                   one counts each new shard's rows, one copies them), so a table larger than
//                   the tool's memory is fine
//   dense variables a whole one (up to split_bytes) to the owner of its name's slot; a split one
//                   cut again over the M shards, each new range's values and optimizer state
//                   copied from the old ranges it overlaps (held in memory, as a shard holds
//                   them when it checkpoints)
//   steps           each variable's and table's step record, and the job's membership, as the
//                   old shards held them (they agree between steps; a set that does not is
//                   refused), except that a worker pushed since it joined where any old shard
//                   saw it push (one holding nothing it pushes never does)
//   capacity        a table's admission sketch: each counter the largest of the old shards'
//                   (an id was counted on the one shard that held it, so none is admitted later
//                   than there); its eviction order: the old shards' orders merged by rank (the
//                   order among one old shard's rows kept; they kept no common clock), the least
//                   recent rows beyond max_rows on a new shard evicted; the job's eviction and
//                   drop counts on new shard 0
//   logs            a shard whose newest checkpoint does not hold all it acknowledged (updates
//                   logged after it: the shard was killed, or stopped before it could
//                   checkpoint; a log damaged or missing; a newer checkpoint corrupt) is first
//                   restored as its server's start restores it (VariableShard::restore: the
//                   newest valid checkpoint, the logs after it replayed, a torn last record
//                   dropped), under the job's deployment settings (ReshardOptions::replay),
//                   into a fresh checkpoint in `to`.reshard-partial/restored/, which is then
//                   placed as above. The old shards' files are not changed: the restore works
//                   on links to their checkpoints and copies of their logs. It holds that one
//                   shard in memory, as its server does; the placing still streams.
//
// What it refuses, each with an Error naming the file or shard and what is wrong, writing
// nothing: a set with a shard missing or with two checkpoints of one shard, a directory that
// holds no shard's checkpoint, checkpoints of two jobs (their job identity, mode, workers or
// slot maps differ), shards whose memberships differ, updates logged after a shard's checkpoint
// when no replay settings are given (or settings not of the job's deployment: another mode,
// workers or shard count), a log damaged or missing (naming the file and the byte, as a start
// of the server would, unless replay->accept_log_loss), a checkpoint taken inside a step (a
// step part-way on a variable or table, or the parts of a variable at different steps), and a
// `to` that exists. The new shards' files are written into `to`.reshard-partial and renamed to
// `to` once all are whole, so a failure leaves nothing at `to`.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "actors/shard/checkpoint_set.h"
#include "common/shard_settings.h"
#include "common/slot_map.h"

namespace psched {

struct ReshardOptions {
  std::vector<std::filesystem::path> from;  // directories holding the old shards' files
  std::filesystem::path to;                 // the new shards' checkpoint directory (new)
  uint32_t shards = 0;                      // M
  // The new deployment's split_bytes: which dense variables are split. 0: each variable split
  // or whole as the old shards held it (what a deployment that keeps its split_bytes does; a
  // job on one shard held all whole, so then the default split_bytes, 4 MiB, decides).
  uint64_t split_bytes = 0;
  // The settings the job's servers ran with, under which a shard's logged updates are replayed
  // (CheckpointSetOptions::replay, actors/shard/checkpoint_set.h). Absent: a shard that needs a
  // replay (updates logged after its checkpoint, a log damaged or missing, a newer checkpoint
  // corrupt) is refused.
  std::optional<ShardSettings> replay;
  std::string replay_source;  // names `replay` in messages ("--from-config deployment.yaml")
};

struct ReshardReport {
  uint32_t from_shards = 0;
  SlotMap map;               // the new one
  uint32_t slots_moved = 0;  // slots whose owner changed
  uint64_t variables = 0;    // dense variables placed
  uint64_t tables = 0;
  uint64_t rows = 0;          // rows placed
  uint64_t rows_moved = 0;    // of them, rows whose shard changed
  uint64_t row_bytes = 0;     // bytes of rows read (ids, values and state)
  uint64_t rows_evicted = 0;  // rows over a table's max_rows on a new shard, left out
  std::vector<std::filesystem::path> written;  // the new checkpoints, shard 0 first
  std::vector<ShardReplay> replayed;           // the old shards restored from their logs
};

// Places the job whose checkpoints and logs are in `options.from` on `options.shards` shards,
// writing generation 1 of each new shard's checkpoint into `options.to`. Throws Error
// (bad_config for a set that cannot be placed, corrupt_checkpoint for a damaged file or log,
// io_error when writing fails) and leaves `options.to` absent then.
ReshardReport reshard(const ReshardOptions& options);

}  // namespace psched
