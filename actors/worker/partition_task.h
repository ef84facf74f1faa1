// SPDX-License-Identifier: Apache-2.0
// One partition of one gradient push, as the worker-side actors pass it around, and the
// transport that carries it to a shard and brings the fresh value back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/dtype.h"
#include "common/placement.h"
#include "common/result.h"
#include "common/types.h"
#include "compression/wire_format.h"

namespace psched {

struct PartitionTask {
  uint64_t id = 0;        // unique within a worker; assigned by GradientPusher
  Priority priority;      // the variable's priority; lower goes first
  uint64_t sequence = 0;  // arrival order: fifo order and the tie-break within a priority
  uint64_t bytes = 0;     // payload bytes on the wire; what counts against the credit window

  ShardId shard;              // where the partition goes
  VariableId shard_variable;  // the id that shard gave the variable
  Step step;
  ElementRange range;  // elements of the whole variable this partition covers
  DType dtype = DType::float32;
  WireFormat format = WireFormat::none;        // of `gradient`
  WireFormat value_format = WireFormat::none;  // the fresh value travels in
  // The range's gradient, `bytes` long. Owner: the trainer, alive until its push completes;
  // or, compressed, `encoded`.
  const std::byte* gradient = nullptr;
  std::shared_ptr<const std::vector<std::byte>> encoded{};
  // Where the range's fresh value is written. Owner: the trainer (its parameter memory).
  std::byte* fresh_value = nullptr;
};

// A task whose fresh value is in place: when the shard found it ready, on the shard's wall clock
// (ns since the Unix epoch, for traces; 0 when the transport does not know).
struct Landed {
  int64_t applied_at_ns = 0;
};

// What became of a task: its value landed, or the Error that failed it.
using TaskOutcome = Result<Landed>;

// Where a transport reports what becomes of the tasks it carries: the scheduler. A transport
// lives on the scheduler's loop and calls these there, directly (no hop), in a later turn or
// synchronously from inside start(); never from another thread.
class TaskReports {
 public:
  // The shard acknowledged task `task_id`'s push (validated, and applied or accumulated). At
  // most once, before finished(); never when the push failed. The scheduler may free the task's
  // credit here (sync mode: see Scheduler::set_free_credit_on_receipt).
  virtual void received(uint64_t task_id) = 0;
  // Task `task_id` is over: its fresh value is in place, or it failed. Exactly once.
  virtual void finished(uint64_t task_id, TaskOutcome outcome) = 0;

 protected:
  ~TaskReports() = default;
};

class PartitionTransport {
 public:
  virtual ~PartitionTransport() = default;
  // Pushes the task's gradient to its shard and polls the range's fresh value for its step
  // into task.fresh_value, reporting to `reports` (which outlives the task's last report).
  // The task's pointers stay valid until it is finished.
  virtual void start(PartitionTask task, TaskReports& reports) = 0;
};

}  // namespace psched
