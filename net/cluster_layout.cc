// SPDX-License-Identifier: Apache-2.0
#include "net/cluster_layout.h"

#include <fmt/format.h>

#include "common/error.h"

namespace psched {
namespace {

// The first field in which `b` differs from `a`, or null; the shards' addresses only when
// `addresses` (a shard restarted elsewhere changes its own).
const char* first_difference(const ClusterLayout& a, const ClusterLayout& b,
                             bool addresses = true) {
  if (a.mode != b.mode) return "mode";
  if (a.workers != b.workers) return "workers";
  if (a.split_bytes != b.split_bytes) return "split_bytes";
  if (a.max_message_bytes != b.max_message_bytes) return "limits.max_message_bytes";
  if (!(a.default_optimizer == b.default_optimizer)) return "optimizer";
  if (a.shard_addresses.size() != b.shard_addresses.size() ||
      (addresses && a.shard_addresses != b.shard_addresses))
    return "shards";
  return nullptr;
}

// What differs in the state the shards were restored with, or null.
const char* state_difference(const ClusterLayout& a, const ClusterLayout& b) {
  if (a.job != b.job) return "job";
  if (!(a.slot_map == b.slot_map)) return "slot map";
  return nullptr;
}

}  // namespace

void check_same_cluster(const std::vector<ClusterLayout>& layouts) {
  for (size_t i = 1; i < layouts.size(); ++i)
    if (const char* field = first_difference(layouts[0], layouts[i], /*addresses=*/false))
      fail(ErrorCode::bad_config,
           "shard {} and shard 0 disagree on '{}': they were started from different "
           "deployment files",
           i, field);
  for (size_t i = 1; i < layouts.size(); ++i)
    if (const char* field = state_difference(layouts[0], layouts[i]))
      fail(ErrorCode::bad_config,
           "shard {} and shard 0 disagree on the {} (epochs {} and {}): they were restored from "
           "checkpoints of different jobs or placements, or started with different "
           "`psched-server --job` names",
           i, field, layouts[i].slot_map.epoch(), layouts[0].slot_map.epoch());
}

std::string shard_change(const ClusterLayout& before, const ClusterLayout& after) {
  auto describe = [](const ClusterLayout& l) {
    return fmt::format("shard {} of job {:016x} (slot map epoch {} on {} shards)",
                       l.shard_index.value, l.job, l.slot_map.epoch(), l.slot_map.shards());
  };
  if (before.shard_index != after.shard_index || state_difference(before, after))
    return fmt::format(
        "it came back as {}, not {} that this worker places its variables and "
        "rows by",
        describe(after), describe(before));
  if (const char* field = first_difference(before, after, /*addresses=*/false))
    return fmt::format("it came back with another '{}': restarted from another deployment file",
                       field);
  return {};
}

}  // namespace psched
