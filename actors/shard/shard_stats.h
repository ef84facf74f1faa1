// SPDX-License-Identifier: Apache-2.0
// What a shard counts and shows operators (VariableShard::stats, ::variables; the operator view,
// server/shard_report.h). Copies: reading never touches the live counters, which only the
// shard's loop updates. The StepMachine (actors/shard/step_machine.h) fills in what it keeps.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/histogram.h"
#include "common/placement.h"
#include "common/types.h"

namespace psched {

// A request a shard failed, kept for operators (VariableShard keeps the newest few).
struct RecentError {
  std::chrono::system_clock::time_point time;
  ErrorCode code;
  std::string message;
};

// A worker as a sync or bounded shard sees it (VariableShard::stats).
struct MemberStatus {
  uint32_t worker = 0;
  bool member = false;
  Step joined_at;  // the first step it takes part in (Step(): no member)
  uint32_t connections = 0;
  Step pushed;             // the newest step it pushed here (any variable)
  uint64_t lag_steps = 0;  // steps between the newest any worker pushed here and `pushed`
};

// Payload bytes of one direction.
struct WireBytes {
  uint64_t raw = 0;
  uint64_t sent = 0;
};

// One embedding table's share on a shard (actors/shard/row_table.h).
struct TableStats {
  std::string name;
  uint64_t rows = 0;             // rows stored (updated at least once)
  uint64_t bytes = 0;            // what the table holds: arena chunks and index
  uint64_t payload_bytes = 0;    // of which rows' values and optimizer state
  uint64_t rows_created = 0;     // rows first stored so far (again after an eviction)
  uint64_t rows_pushed = 0;      // rows of accepted pushes (each worker's, each step)
  uint64_t rows_pulled = 0;      // rows answered to pulls
  uint64_t max_rows = 0;         // its bound on this shard (0: none; TableSpec::max_rows)
  uint64_t rows_evicted = 0;     // least recently updated rows evicted at max_rows
  uint64_t updates_dropped = 0;  // row updates before their admission (TableSpec::admit_after)
};

struct DeltaPullStats {
  uint64_t deltas = 0;     // polls answered with a delta
  uint64_t full = 0;       // delta polls answered with full values (no version to go from)
  uint64_t published = 0;  // deltas published
  uint64_t held_bytes = 0;
};

// What a serving shard serves (VariableShard::serve): one checkpoint of a job, read-only.
struct ServedVersion {
  std::filesystem::path checkpoint;
  uint64_t generation = 0;    // the checkpoint's, in the job's sequence for this shard
  int64_t written_at_ns = 0;  // when the job wrote it (wall clock)
  int64_t loaded_at_ns = 0;   // when this shard began to serve it (wall clock)
  uint64_t step = 0;          // the newest step any variable or table had complete in it
};

// Counters a shard keeps; read with VariableShard::stats.
struct ShardStats {
  // The job and where its rows and variables live (common/slot_map.h): the slot map's epoch,
  // its shard count and the slots this shard owns.
  uint64_t job = 0;
  uint64_t slot_epoch = 0;
  uint32_t slot_shards = 0;
  uint32_t slots_owned = 0;
  uint64_t variables = 0;       // dense variable parts hosted
  uint64_t tables = 0;          // embedding tables hosted (each shard holds rows of every one)
  uint64_t bytes_received = 0;  // gradient payload bytes accepted
  uint64_t bytes_sent = 0;      // value bytes answered to polls and pulls
  uint64_t partitions_applied = 0;
  uint64_t pushes_rejected = 0;
  uint64_t pushes_duplicate = 0;  // retries of received partitions, acknowledged not applied
  uint64_t checkpoints_written = 0;
  // Waits for members behind that passed sync.timeout_seconds: sync steps, bounded mode's held
  // polls.
  uint64_t sync_timeouts = 0;
  uint64_t pushes_late = 0;  // pushes of a step completed without their worker (dropped)
  // Sync membership (actors/shard/membership.h): members now, joins and leaves so far, and
  // element ranges applied from fewer gradients than the job has workers.
  uint64_t members = 0;
  uint64_t joins = 0;
  uint64_t leaves = 0;
  uint64_t short_handed_ranges = 0;
  // Polls held: bounded mode's, for a member s - staleness behind; sync's, for the step before
  // their own. Pushes held (sync): of the step after the one under way, until that one closed.
  uint64_t polls_held = 0;
  uint64_t pushes_held = 0;
  std::vector<MemberStatus> workers;  // sync, bounded: every worker of the job, by id
  uint64_t polls_waiting = 0;
  // Payload bytes on the wire, pushes in and values out, as the variable's dtype carries them
  // (raw) and as they travelled (sent; smaller when compressed, compression/codec.h).
  WireBytes push_wire;
  WireBytes pull_wire;
  // Delta pulls (actors/shard/value_deltas.h): polls answered with a delta and with full
  // values, deltas published, and the bytes the published copies hold.
  DeltaPullStats delta_pulls;
  Histogram apply_seconds;      // per accepted push: validating and applying (or summing) it
  Histogram poll_wait_seconds;  // per answered poll: from its arrival to its answer
  std::array<uint64_t, kErrorCodeCount> errors{};  // failed requests, indexed by ErrorCode
  std::vector<RecentError> recent_errors;          // the newest kRecentErrors, oldest first
  std::vector<TableStats> table_stats;             // by registration
  uint64_t table_bytes_limit = 0;  // limits.max_table_bytes: all tables together (0: none)
  // A serving shard's (VariableShard::serve): the version it serves, the versions it loaded
  // (the first included) and the reloads it refused (serving the one it had).
  std::optional<ServedVersion> served;
  uint64_t versions_loaded = 0;
  uint64_t reloads_refused = 0;
};

// One hosted variable part and its progress; read with VariableShard::variables.
struct VariableStatus {
  std::string name;
  ElementRange part;
  Step step;  // the newest complete step (async: of the furthest worker)
};

}  // namespace psched
