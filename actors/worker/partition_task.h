// SPDX-License-Identifier: Apache-2.0
// One partition of one gradient push, as the worker-side actors pass it around, and the
// transport that carries it to a shard and brings the fresh value back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <vector>

#include "common/dtype.h"
#include "common/placement.h"
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

// Called once per task, from any thread, with null or the failure (a psched::Error).
using TaskDone = std::function<void(std::exception_ptr)>;

// What a transport reports about one task, from any thread.
struct TaskCallbacks {
  // The shard acknowledged the push (validated, and applied or accumulated). At most once,
  // before `done`; never when the push failed. The scheduler may free the task's credit here
  // (sync mode: see Scheduler::set_free_credit_on_receipt).
  std::function<void()> receipt;
  // The shard's wall clock (ns since the Unix epoch) when it found the fresh value ready, for
  // traces. At most once, before `done`; optional for transports.
  std::function<void(int64_t applied_at_ns)> applied;
  // The fresh value is in place (null) or the task failed. Exactly once.
  TaskDone done;
};

class PartitionTransport {
 public:
  virtual ~PartitionTransport() = default;
  // Pushes the task's gradient to its shard and polls the range's fresh value for its step
  // into task.fresh_value, reporting through `callbacks`. The task's pointers stay valid until
  // its `done` runs.
  virtual void start(PartitionTask task, TaskCallbacks callbacks) = 0;
};

}  // namespace psched
