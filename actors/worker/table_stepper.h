// SPDX-License-Identifier: Apache-2.0
// TableStepper: a worker's steps of its embedding tables, beside the GradientPusher that steps
// its dense variables, over the same Scheduler (one queue, one credit window).
//
// A table's rows live on every shard, each row on the shard row_shard() gives it
// (actors/shard/table_spec.h). A step's push goes to every shard with the rows of the step it
// holds, none even (a sync step closes only once every member pushed it there); a pull goes to
// the shards holding rows it asks for. The stepper groups a call's ids by shard once, with no
// index (the caller gives ids as it has them: Python's torch.unique already made them unique),
// makes each shard's share a task of its own kind (RowsRequest) at the table's priority, a
// prefetch below every task that is not one, and lands pulled rows in the caller's memory where
// they belong straight from the answer, with no buffer in between. It keeps the orders the
// shards rely on, with no round trip of its own:
// - a shard takes a worker's step s of a table after its step s - 1 (sync: the job's, which
//   other workers may still be pushing). The stepper sends a shard the push of step s once that
//   shard has received this worker's step s - 1; a sync shard holds a push that comes while the
//   step before is open and takes it when that step closes (actors/shard/step_machine.h). So a
//   push is never more than one step ahead of its shard, and the held one's receipt, not a
//   request of its own, says when the next may go.
// - a pull goes once every push of the table made before it was received (or failed): it
//   waits for no push queued behind it and so cannot hold the credit that push needs.
//
// Owner and threads: the Worker (client/worker.h) owns it; it lives on the scheduler's loop, and
// every method runs there. Route the scheduler's reports of finished tasks to task_done().
#pragma once

#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "actors/shard/table_spec.h"
#include "actors/worker/partition_task.h"
#include "actors/worker/scheduler.h"
#include "actors/worker/variable_handle.h"
#include "compression/wire_format.h"

namespace psched {

class TableStepper {
 public:
  // Runs once, on the loop, with null or the first failure among the call's shard tasks.
  using Done = std::function<void(std::exception_ptr)>;
  // What a prefetch adds to its table's priority (lower is more urgent): more than any
  // registration gives, so the current step's pushes and pulls go first.
  static constexpr int64_t kPrefetchPriority = int64_t{1} << 40;

  // `scheduler` outlives the stepper; its tables' rows live on `shards` shards, where the job's
  // slot map puts them (set_map, before the first table is added).
  TableStepper(Scheduler& scheduler, uint32_t shards);
  // The job's slot map (common/slot_map.h), from the shards' cluster layout; on `shards` shards.
  void set_map(SlotMap map);

  // A table registered on every shard: `ids` its id there, by shard. Its rows travel in
  // `compression`'s push and pull formats (none, bf16 or fp16; Compression::for_rows) when the
  // table (spec.bytes(), not a request's rows) is at least min_bytes, as a dense variable's
  // partitions do when the variable is; a push of a step below warmup_steps goes whole.
  void add(TableHandle handle, TableSpec spec, std::vector<VariableId> ids,
           Compression compression);
  // The table's spec; throws Error(invalid_argument) for a handle never added.
  const TableSpec& spec(TableHandle handle) const;

  // This worker's step `step` of the table: `ids` with one gradient row each in `gradients`,
  // read before the call returns. Each id once (the shard sums a repeated id's rows: one update
  // a row a step). `done` runs at every shard's receipt, or with the first refusal.
  void push(TableHandle handle, Step step, std::span<const uint64_t> ids,
            std::span<const std::byte> gradients, Done done);
  // The rows `ids` (repeats allowed) into `out`, row k at row k of `out` (ids.size() rows, alive
  // with `ids` until `done` runs), once `after`'s update of them is applied (sync: the job's;
  // async: this worker's; Step(): at once). A `prefetch` (the rows of a step still to come)
  // goes below every task that is not one. A size mismatch throws Error(shape_mismatch).
  void pull(TableHandle handle, Step after, std::span<const uint64_t> ids, std::span<std::byte> out,
            bool prefetch, Done done);

  // The scheduler's report of a finished task; false when it is not one of the stepper's.
  bool task_done(uint64_t task_id, std::exception_ptr error);

  // One shard's share of a call: the positions in the caller's ids (and rows) of the ids the
  // shard holds, in the caller's order. Exposed for tests.
  static std::vector<std::vector<uint32_t>> by_shard(uint64_t key, std::span<const uint64_t> ids,
                                                     const SlotMap& map);

 private:
  // A call (push or pull) under way: its shard tasks left, its first failure, its caller.
  struct Call {
    uint32_t tasks_left = 0;
    std::exception_ptr first_error;
    Done done;
  };
  // A registered table, and the order its calls keep.
  struct Table {
    TableSpec spec;
    uint64_t key = 0;             // table_key(spec.name), which places its rows
    std::vector<VariableId> ids;  // by shard
    Compression compression;
    // By shard: whether a push awaits its receipt, and the pushes queued behind it.
    std::vector<bool> pushing;
    std::vector<std::deque<PartitionTask>> queued;
    uint64_t pushes = 0;    // pushes made
    uint64_t received = 0;  // pushes every shard received (or refused); they end in order
    // Pulls waiting for the pushes made before them: the count they wait for, and their start.
    std::deque<std::pair<uint64_t, std::function<void()>>> pulls;
  };
  // What a task of the stepper's is part of.
  struct TaskOf {
    TableHandle table;
    uint64_t call;
    uint32_t shard;
    bool push;
  };

  Table& table(TableHandle handle);
  // A new call of `tasks` shard tasks ending in `done`; its id.
  uint64_t begin_call(uint32_t tasks, Done done);
  // One shard's task of a push: the rows of `rows` (positions in `ids`, `gradients`), in the
  // table's push format for `step`.
  PartitionTask push_task(const Table& table, uint32_t shard, Step step,
                          std::span<const uint64_t> ids, std::span<const std::byte> gradients,
                          const std::vector<uint32_t>& rows) const;
  // One shard's task of a pull of the rows at `rows` of `ids` into `out`.
  PartitionTask pull_task(const Table& table, uint32_t shard, Step after,
                          std::span<const uint64_t> ids, std::span<std::byte> out,
                          std::vector<uint32_t> rows, Priority priority) const;
  // Gives the tasks their ids, notes what they are part of and queues them.
  void schedule(TableHandle handle, uint64_t call, bool push, std::vector<PartitionTask> tasks);
  // A push's task to `shard` is over: the next push queued for the shard goes.
  void next_push(TableHandle handle, uint32_t shard);
  // The table's push `number` ended on every shard (pushes end in the order made, each shard
  // taking them one after the other): the pulls that waited for it go.
  void pushed(TableHandle handle, uint64_t number);
  // Counts a task of `call` done; runs its caller once all are.
  void end_task(uint64_t call, std::exception_ptr error);

  Scheduler& scheduler_;
  uint32_t shards_;
  SlotMap map_;
  std::unordered_map<uint32_t, Table> tables_;  // by handle
  uint64_t next_call_ = 1;
  std::unordered_map<uint64_t, Call> calls_;    // by call id
  std::unordered_map<uint64_t, TaskOf> tasks_;  // by task id
  struct PushCall {
    TableHandle table;
    uint64_t number;  // of the table's pushes, from 1
  };
  std::unordered_map<uint64_t, PushCall> push_of_call_;  // by call id
};

}  // namespace psched
