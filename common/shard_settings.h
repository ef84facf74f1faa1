// SPDX-License-Identifier: Apache-2.0
// ShardSettings: what one shard is told at start (psched-server builds them from the
// deployment file), read by the shard actor and by its durability.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string_view>
#include <vector>

#include "common/policies.h"
#include "common/table_config.h"
#include "common/types.h"

namespace psched {

struct ShardSettings {
  ShardId id;
  Mode mode = Mode::async;
  uint32_t workers = 1;
  uint64_t max_variables = 1 << 20;
  // Checkpoints and the update log (actors/durability/shard_store.h) go here; empty: nothing
  // persists.
  std::filesystem::path checkpoint_directory;
  bool update_log = true;  // log every accepted update between checkpoints
  StepConfig steps;        // sync, bounded: how steps wait for the job's members
  // restore() goes on past a damaged or missing update log (losing what it held) instead of
  // refusing to start: psched-server --accept-log-loss.
  bool accept_log_loss = false;
  // Bytes all of the shard's tables may hold (limits.max_table_bytes; 0: no limit): a push that
  // would store rows beyond it is refused.
  uint64_t max_table_bytes = 0;
  std::vector<TableConfig> tables;  // the deployment's tables: section
  // The deployment's shard count: a job that starts with no checkpoint places its rows and
  // variables on them by SlotMap::even(shards); a checkpoint's map must be on as many.
  uint32_t shards = 1;
  // Who this job is, when it starts with no checkpoint (after that, the checkpoint's): kept in
  // every checkpoint, so a set of checkpoints from two jobs is told apart (psched reshard).
  uint64_t job = 0;
  // A serving shard's (psched-server --serve): the directory of the job's checkpoints it
  // serves read-only (VariableShard::serve); empty: a shard that trains.
  std::filesystem::path serve_directory;

  // How the steps of the job's dense variables wait (`mode:`, `staleness:`).
  StepRule dense_rule() const { return {mode, steps.staleness}; }
  // How the steps of table `name` wait: its tables: entry's rule, else table_mode:, else the
  // dense variables'.
  StepRule table_rule(std::string_view name) const {
    for (const TableConfig& table : tables)
      if (table.name == name && table.rule) return *table.rule;
    return steps.tables.value_or(dense_rule());
  }
};

}  // namespace psched
