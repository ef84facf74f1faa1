// SPDX-License-Identifier: Apache-2.0
// The operator view of one shard: a snapshot of its state and the two ways it is read, the
// Prometheus text of GET /metrics and the JSON of GET /status (which the dashboard and
// `psched status` read). Pure functions of the snapshot.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/shard/variable_shard.h"
#include "config/deployment.h"

namespace psched {

struct ShardSnapshot {
  ShardId id;
  ShardStats stats;
  std::vector<VariableStatus> variables;  // the first kStatusVariables (only for /status)
  uint64_t connections = 0;               // open RPC connections
  double uptime_seconds = 0;              // of the process
};

// /status lists at most this many variable parts (a shard may hold a million).
inline constexpr size_t kStatusVariables = 1000;

// The Prometheus text exposition of `snapshot` (every sample labelled shard="<id>").
std::string shard_metrics_text(const ShardSnapshot& snapshot);

// The /membership document: sync steps' ranges applied short-handed, who gave each.
nlohmann::json short_handed_json(const std::vector<ShortHanded>& records);

// The /status document: the snapshot's figures, the deployment's summary and the variables.
nlohmann::json shard_status_json(const ShardSnapshot& snapshot, const DeploymentConfig& config);

}  // namespace psched
