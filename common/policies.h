// SPDX-License-Identifier: Apache-2.0
// The choices a deployment makes that the actors act on: how a job aggregates (Mode), how a
// worker orders its partitions (SchedulePolicy), and how a shard's steps wait for the job's
// members in sync and bounded modes (StepConfig). The deployment file sets them
// (config/deployment.h); the actors only read them.
#pragma once

#include <cstdint>
#include <optional>

namespace psched {

enum class Mode {
  async,    ///< each push applied on arrival; a worker's poll waits for its own update
  sync,     ///< a shard applies the mean of all workers' step-s gradients once (BSP)
  bounded,  ///< applied as async, but a poll for step s also waits until every member pushed
            ///< step s - staleness (StepConfig::staleness)
};

constexpr const char* to_string(Mode mode) {
  return mode == Mode::sync ? "sync" : mode == Mode::bounded ? "bounded" : "async";
}

enum class SchedulePolicy {
  priority,  ///< lowest priority value first, partitioned, credit-limited (default)
  fifo,      ///< arrival order through the same code path (the benchmark baseline)
};

// How one variable's steps wait: its mode and, bounded, its staleness. A job's dense variables
// follow its `mode:` and `staleness:`; its tables may run a looser rule of their own
// (`table_mode:`, or `mode:` and `staleness:` in a `tables:` entry), as Persia's hybrid runs
// the embeddings asynchronous beside synchronous dense layers.
struct StepRule {
  Mode mode = Mode::async;
  uint64_t staleness = 1;  // bounded: steps a worker may run ahead of the slowest member
  bool operator==(const StepRule&) const = default;
};

// How strict a mode is: async < bounded < sync. A table's rule may be no stricter than its
// job's mode (the job's membership is what a stricter rule would wait on).
constexpr int strictness(Mode mode) {
  return mode == Mode::async ? 0 : mode == Mode::bounded ? 1 : 2;
}

// What a wait for members behind does once it has lasted StepConfig::timeout_seconds.
enum class TimeoutAction {
  fail,     ///< the polls waiting fail with [sync_timeout] naming the members behind
  proceed,  ///< sync: the step is applied with the mean of the workers that pushed (late pushes
            ///< of it are acknowledged and dropped, counted); bounded: the poll waits for its
            ///< own update only
};

// How a shard's steps wait for the job's members, sync and bounded modes alike (the YAML's
// `sync:` section and `staleness:`; the StepMachine, actors/shard/step_machine.h): who the
// members are (actors/shard/membership.h), how long a wait for those behind may last, and how
// far ahead bounded mode lets a worker run.
struct StepConfig {
  // From a sync step's first push on a variable part, or from when a bounded poll was held;
  // 0: no timeout.
  double timeout_seconds = 0;
  TimeoutAction on_timeout = TimeoutAction::fail;
  // Steps apply only while this many workers are members; 0: all of the job's workers.
  uint32_t min_workers = 0;
  // A worker stops being a member this long after its last connection to a shard closed;
  // 0: never (the job waits for it, up to timeout_seconds).
  double lease_seconds = 0;
  // mode: bounded: how many steps a worker may run ahead of the slowest member (`staleness:`).
  uint64_t staleness = 1;
  // Every table's rule where its `tables:` entry gives none (`table_mode:`); none: the job's.
  std::optional<StepRule> tables;
  bool operator==(const StepConfig&) const = default;
};

// How a worker carries its pushes and polls to a shard (`data_path:`): over a data stream
// beside each RPC connection (frames, no per-call RPC objects), or as Cap'n Proto calls (the
// protocol the design started from, what a client in another language speaks first).
enum class DataPathKind {
  stream,  ///< the default
  calls,
};

}  // namespace psched
