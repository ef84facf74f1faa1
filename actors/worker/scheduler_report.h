// SPDX-License-Identifier: Apache-2.0
// What a Scheduler (actors/worker/scheduler.h) reports: the timeline of each finished task and its
// running figures. KJ-free, so client/client.h can hand them to trainers and traces.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>

#include "common/placement.h"
#include "common/types.h"
#include "compression/wire_format.h"

namespace psched {

// What happened to one task, for traces, the tuner and tests. Times are steady_clock.
struct TaskRecord {
  uint64_t task_id = 0;
  uint64_t start_index = 0;  // 0 for the first task this scheduler started, then 1, 2, ...
  Priority priority;
  uint64_t bytes = 0;                          // on the wire, in `format`
  WireFormat format = WireFormat::none;        // of the gradient
  WireFormat value_format = WireFormat::none;  // the fresh value came back in
  ShardId shard;
  ElementRange range;
  std::chrono::steady_clock::time_point queued, started;
  // The shard acknowledged the push; unset (epoch) when it did not.
  std::chrono::steady_clock::time_point receipt;
  // When the shard found the fresh value ready, from its wall clock moved onto this steady
  // clock (exact on one machine, off by the clock skew across machines); unset when unknown.
  std::chrono::steady_clock::time_point applied;
  std::chrono::steady_clock::time_point finished;
};

struct SchedulerStats {
  uint64_t credit_bytes = 0;  // each credit window now (one a direction)
  // Credit held now of each window (started tasks: pushes not yet acknowledged, answers not yet
  // landed), and the most ever held at once.
  uint64_t push_bytes_in_flight = 0;
  uint64_t pull_bytes_in_flight = 0;
  uint64_t max_push_bytes_in_flight = 0;
  uint64_t max_pull_bytes_in_flight = 0;
  uint64_t queued_tasks = 0;                        // waiting now (enqueued, not yet started)
  uint64_t started_tasks = 0;                       // ever started
  uint64_t finished_tasks = 0;                      // ever finished (failures included)
  std::map<Priority, uint64_t> queued_by_priority;  // queued_tasks by task priority (no zeros)
};

}  // namespace psched
