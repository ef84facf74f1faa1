// SPDX-License-Identifier: Apache-2.0
// The cluster layout a shard returns on connect: what a worker needs to place variables and
// size its messages.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/slot_map.h"
#include "common/types.h"
#include "config/deployment.h"

namespace psched {

struct ClusterLayout {
  ShardId shard_index;                       // the shard that answered
  std::vector<std::string> shard_addresses;  // all shards, in config order
  uint64_t split_bytes = 0;
  Mode mode = Mode::async;
  uint32_t workers = 1;
  uint64_t max_message_bytes = 0;
  optim::OptimizerSpec default_optimizer;
  uint64_t job = 0;
  SlotMap slot_map;  // where rows and variables live (common/slot_map.h)
};

// Throws Error(bad_config) unless every shard describes the same cluster as shard 0 (mode,
// workers, split threshold, message limit, default optimizer, number of shards, job and slot
// map; not their addresses, which a shard restarted elsewhere lists anew):
// shards started from different deployment files, or restored from checkpoints of different
// jobs or placements, would place and aggregate variables differently.
void check_same_cluster(const std::vector<ClusterLayout>& layouts);

// Why the shard that answered a reconnection is not the one that answered the first connection
// (`before`): another shard index, job, slot map or deployment (a server restarted from another
// job's checkpoints, or on another placement, at the same address); empty when it is the same.
// The shards' addresses may differ: a shard restarted on another node lists its new one.
// A worker must not register again there: it routes rows and places variables by `before`.
std::string shard_change(const ClusterLayout& before, const ClusterLayout& after);

}  // namespace psched
