// SPDX-License-Identifier: Apache-2.0
// Scheduler: the worker-side actor that decides which partition goes next.
//
// One queue of partition tasks per worker and one credit window. A task starts when it is the
// best queued task (policy `priority`: lowest priority value, then arrival; policy `fifo`:
// arrival only) and its bytes fit in the credit left; the credit is held from the start until
// the transport reports the fresh value back (or the push's receipt, in sync mode: see
// set_free_credit_on_receipt). Bytes in flight never exceed credit_bytes, except that a single
// task larger than the whole credit starts alone when nothing is in flight. Strict order: a
// smaller task never overtakes a better one that is waiting for credit. Each task goes to the
// transport alone.
//
// Threads: enqueue() and the other public methods may be called from any thread (they hop onto
// the loop when called elsewhere). The transport lives on the same loop and reports to the
// scheduler directly (TaskReports: received, finished), with no hop and no closure per task,
// in a later turn or from inside its start().
//
// Re-entrancy: a report from inside start() runs in the middle of start_ready(), which is
// handing out tasks. The report frees the task's credit, records it and tells on_task_done (which
// may enqueue more) at once; the queue is only ever taken from by start_ready(), which keeps
// nothing that points into the queue across start() and re-reads the best task and the credit
// after each. A start_ready() called while one runs further up the stack (from a report or a
// nested enqueue) returns at once: the running one goes on with what changed. So tasks start in
// order, and a transport that finishes every task inside start() runs a queue of any length
// with no nesting.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <queue>
#include <unordered_map>
#include <vector>

#include "actors/runtime/actor.h"
#include "actors/worker/partition_task.h"
#include "actors/worker/scheduler_report.h"
#include "common/policies.h"

namespace psched {

class Scheduler : public Actor, private TaskReports {
 public:
  static constexpr size_t kMaxRecords = 1 << 16;

  // Runs on the scheduler's loop when a task finished (fresh value written) or failed; may be
  // inside the transport's start() and may enqueue.
  using OnTaskDone = std::function<void(uint64_t task_id, std::exception_ptr)>;

  // `transport` outlives the scheduler.
  Scheduler(ActorLoop& loop, SchedulePolicy policy, uint64_t credit_bytes,
            PartitionTransport& transport, OnTaskDone on_task_done);

  // Queues the tasks (all partitions of one push, say) and starts what the credit allows.
  // Each task's `sequence` is overwritten with the scheduler's arrival counter. Any thread.
  void enqueue(std::vector<PartitionTask> tasks);
  // The first of `count` task ids no task of this scheduler has had, for the producers that
  // queue tasks (GradientPusher, TableStepper) to name theirs before they enqueue them. On the
  // loop.
  uint64_t reserve_task_ids(uint64_t count);
  // Changes the credit window from now on (the tuner); tasks in flight keep their credit.
  void set_credit(uint64_t credit_bytes);
  // With true (sync mode), a task's credit is freed at its push's receipt rather than when its
  // fresh value is back: a sync poll waits for every worker, and credit held through it would
  // let two workers each hold the credit the other needs to send what the other waits for.
  void set_free_credit_on_receipt(bool on_receipt);
  // Calls `reply` on the loop with the current figures.
  void stats(std::function<void(SchedulerStats)> reply);
  // Calls `reply` on the loop with the records of tasks finished since the last call (the
  // newest kMaxRecords of them: a scheduler nobody reads keeps bounded memory).
  void take_records(std::function<void(std::vector<TaskRecord>)> reply);

 private:
  struct Queued {
    PartitionTask task;
    std::chrono::steady_clock::time_point queued;
  };
  struct Later {  // heap order: true when a should go after b
    SchedulePolicy policy;
    bool operator()(const Queued& a, const Queued& b) const;
  };

  // A started task: its timeline so far, and whether it still holds its credit.
  struct InFlight {
    TaskRecord record;
    bool holds_credit = true;
  };

  // Starts queued tasks, best first, while the best one fits the credit left. Returns at once
  // when it is already running further up the stack (see "Re-entrancy" above). On the loop.
  void start_ready();
  // Takes the task's credit and records its start.
  void admit(const Queued& queued);
  // Hands an admitted task to the transport; a transport that throws failed it.
  void launch(PartitionTask task);
  // Gives the task's credit back if it still holds it. Idempotent.
  void release_credit(InFlight& task);
  // TaskReports, called by the transport on the loop. A report of a task that is not in flight
  // (reported finished already) is ignored.
  void received(uint64_t task_id) override;
  // Frees the credit if still held, records the task and tells on_task_done.
  void finished(uint64_t task_id, TaskOutcome outcome) override;

  PartitionTransport& transport_;
  OnTaskDone on_task_done_;
  // Loop-owned state:
  uint64_t credit_bytes_;
  bool free_credit_on_receipt_ = false;
  bool starting_ = false;       // start_ready() is running
  uint64_t next_sequence_ = 0;  // arrival counter, stamped on each task by enqueue
  uint64_t next_task_id_ = 1;   // reserve_task_ids
  std::priority_queue<Queued, std::vector<Queued>, Later> queue_;
  SchedulerStats stats_;
  std::unordered_map<uint64_t, InFlight> in_flight_;  // task id -> started, not finished
  std::deque<TaskRecord> records_;                    // the newest kMaxRecords finished tasks
};

}  // namespace psched
