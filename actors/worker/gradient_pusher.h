// SPDX-License-Identifier: Apache-2.0
// GradientPusher: the trainer's entry point on the worker side.
//
// Takes the gradient of a variable at a step, cuts it into partitions of at most
// partition_bytes (never across a shard boundary, always whole elements), hands them to the
// Scheduler, and completes the trainer's wait when every partition's fresh value is back in
// the trainer's parameter memory.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "actors/runtime/actor.h"
#include "actors/worker/autotuner.h"
#include "actors/worker/iteration_timer.h"
#include "actors/worker/partition_task.h"
#include "actors/worker/scheduler.h"
#include "actors/worker/variable_handle.h"
#include "compression/wire_format.h"

namespace psched {

// One shard's part of a registered variable, with the id that shard gave it.
struct PlacedPart {
  ShardId shard;
  VariableId shard_variable;
  ElementRange range;
};

// How a registered variable maps onto shards, and where its fresh values land.
struct VariablePlan {
  std::string name;
  Priority priority;
  DType dtype = DType::float32;
  uint64_t elements = 0;
  std::vector<PlacedPart> parts;  // in element order, covering [0, elements)
  // The trainer's parameter memory (elements * element_bytes(dtype) bytes). Fresh values are
  // written here. Owner: the trainer, alive while the variable is registered.
  std::byte* value = nullptr;
  // How its gradients and fresh values travel (compression/wire_format.h).
  Compression compression{};
};

class GradientPusher : public Actor {
 public:
  // Runs on the pusher's loop with null or the first failure among the partitions.
  using PushDone = std::function<void(std::exception_ptr)>;

  // `scheduler` outlives the pusher; route its task completions to task_done(). The pusher runs
  // on the scheduler's loop, so handing tasks over and taking completions back costs no hop.
  GradientPusher(Scheduler& scheduler, uint64_t partition_bytes);

  // Registers (or replaces, with nothing held back by error feedback) the plan of `handle`.
  // Checks on the caller's thread that the parts cover [0, plan.elements) contiguously
  // (PSCHED_REQUIRE).
  void add_variable(VariableHandle handle, VariablePlan plan);
  // Cuts and queues the push. `gradient` is the whole variable's gradient (elements *
  // element_bytes bytes, else done gets shape_mismatch); the caller keeps it alive until `done`
  // runs. An unregistered handle fails
  // with Error(unknown_variable); a variable of 0 elements completes at once.
  void push(VariableHandle handle, Step step, std::span<const std::byte> gradient, PushDone done);
  // The variable's memory no longer holds what delta pulls left there (a pull overwrote it):
  // its next polls ask for the values whole.
  void forget_versions(VariableHandle handle);
  // Changes the partition size for pushes from now on.
  void set_partition_bytes(uint64_t bytes);
  // Tunes partition_bytes and the scheduler's credit from now on (actors/worker/autotuner.h),
  // starting from `start`. An iteration ends where the first push of a new step arrives.
  void enable_autotune(TuningPoint start, AutotunerOptions options = {});
  // Calls `reply` on the loop with the tuner's state.
  void tuning(std::function<void(TuningState)> reply);
  // The scheduler's report for one task (any thread).
  void task_done(uint64_t task_id, std::exception_ptr error);

  // Cuts [0, plan.elements) into tasks (exposed for tests): each part of the plan, in order,
  // into consecutive chunks of at most max(1, partition_bytes / element_bytes) whole elements,
  // never across a part boundary. Ids start at `first_id` and count up; `sequence` is left 0
  // (the scheduler stamps arrival order). Requires the parts to cover [0, plan.elements)
  // contiguously, and `gradient` and `plan.value` to be non-null unless the variable is empty.
  static std::vector<PartitionTask> cut(const VariablePlan& plan, Step step,
                                        const std::byte* gradient, uint64_t partition_bytes,
                                        uint64_t first_id);

 private:
  struct PendingPush {
    uint64_t tasks_left = 0;
    std::exception_ptr first_error;
    PushDone done;
  };

  // A push of `step` arrived: feeds the tuner the iteration it ends, if it ends one.
  void observe_step(Step step);
  // Encodes each task's gradient as the variable's compression says for `step`, adding what
  // earlier steps' lossy pushes owe the same elements (compression/error_feedback.h), and
  // makes its poll a delta poll where the compression pulls deltas.
  void compress(VariableHandle handle, const VariablePlan& plan, Step step,
                std::vector<PartitionTask>& tasks);
  // `request`'s poll as a delta poll of `plan`'s at `step`.
  void ask_delta(VariableHandle handle, const VariablePlan& plan, Step step,
                 PartitionRequest& request);

  Scheduler& scheduler_;
  // Loop-owned state:
  uint64_t partition_bytes_;
  uint64_t next_push_id_ = 1;
  std::unordered_map<VariableHandle, VariablePlan> variables_;
  // What lossy pushes have not sent yet, per variable (elements of its dtype, all of them).
  std::unordered_map<VariableHandle, std::vector<std::byte>> residuals_;
  std::vector<std::byte> scratch_;
  // Delta pulls: the version of each partition (by its range) the trainer's memory holds, per
  // variable; 0 for none. Entries stay while the pusher lives (requests point at them).
  std::unordered_map<VariableHandle, std::map<std::pair<uint64_t, uint64_t>, uint64_t>> versions_;
  std::unordered_map<uint64_t, uint64_t> push_of_task_;  // task id -> push id
  std::unordered_map<uint64_t, PendingPush> pushes_;     // push id -> progress
  // Autotuning (when enabled): the tuner and the iterations it is fed.
  std::optional<Autotuner> tuner_;
  IterationTimer iteration_timer_;
  uint64_t iterations_ = 0;
  uint64_t converged_after_ = 0;
};

}  // namespace psched
