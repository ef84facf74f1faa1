// SPDX-License-Identifier: Apache-2.0
// Per-partition timelines (Scheduler's TaskRecords) as Chrome trace-event JSON, the format
// Perfetto (ui.perfetto.dev) and chrome://tracing open.
//
// Each worker is a process; each partition a slice from queued to fresh value back (its args:
// task, priority, bytes, ...), on the first track ("lane") free at its start, with nested
// slices for its phases:
//   queued       waiting in the scheduler (priority order, credit window)
//   to applied   sent, received, applied on the shard (and, in sync mode, waiting for the
//                other workers' pushes); ends at the shard's answer time
//   value back   the fresh value travelling back and written into the trainer's memory
// and an instant event at the push's receipt. Where the shard's answer time is unknown the
// two middle phases are one, "in flight".
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/worker/scheduler_report.h"

namespace psched {

struct TracedWorker {
  std::string name;  // shown as the process name, e.g. "priority / worker 0"
  std::vector<TaskRecord> records;
  std::chrono::steady_clock::time_point epoch;  // the worker's time 0 in the trace
};

// The trace-event document; times are microseconds since each worker's epoch.
nlohmann::json chrome_trace(const std::vector<TracedWorker>& workers);

}  // namespace psched
