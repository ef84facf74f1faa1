// One partition of one gradient push, as the worker-side actors pass it around, and the
// transport that carries it to a shard and brings the fresh value back.
#pragma once

#include <cstddef>
#include <exception>
#include <functional>

#include "common/dtype.h"
#include "common/placement.h"
#include "common/types.h"

namespace psched {

struct PartitionTask {
  uint64_t id = 0;        // unique within a worker; assigned by GradientPusher
  Priority priority = 0;  // the variable's priority; lower goes first
  uint64_t sequence = 0;  // arrival order: fifo order and the tie-break within a priority
  uint64_t bytes = 0;     // payload bytes; what counts against the credit window

  ShardId shard;              // where the partition goes
  VariableId shard_variable;  // the id that shard gave the variable
  Step step = 0;
  ElementRange range;  // elements of the whole variable this partition covers
  DType dtype = DType::float32;
  // The range's gradient bytes. Owner: the trainer, alive until its push completes.
  const std::byte* gradient = nullptr;
  // Where the range's fresh value is written. Owner: the trainer (its parameter memory).
  std::byte* fresh_value = nullptr;
};

// Called once per task, from any thread, with null or the failure (a psched::Error).
using TaskDone = std::function<void(std::exception_ptr)>;

// What a transport reports about one task, from any thread.
struct TaskCallbacks {
  // The partition no longer needs its credit although its fresh value is not back yet. Sync
  // mode calls it on the push's receipt: a poll there waits for every worker, and credit held
  // through it would let two workers each hold the credit the other needs to send what the
  // other waits for. At most once, before `done`; when never called, `done` frees the credit.
  std::function<void()> credit_free;
  // The fresh value is in place (null) or the task failed. Exactly once.
  TaskDone done;
};

class PartitionTransport {
 public:
  virtual ~PartitionTransport() = default;
  // Pushes the partition's gradient to its shard and polls the range's fresh value for
  // `task.step` into task.fresh_value, reporting through `callbacks`. The task's pointers stay
  // valid until `callbacks.done` runs.
  virtual void start(const PartitionTask& task, TaskCallbacks callbacks) = 0;
};

}  // namespace psched
