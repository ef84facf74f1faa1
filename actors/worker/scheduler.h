// SPDX-License-Identifier: Apache-2.0
// Scheduler: the worker-side actor that decides which partition goes next.
//
// One order of partition tasks per worker and two credit windows, one a direction: the bytes a
// task sends (its push: a gradient, a table's rows) and the bytes it receives (its answer: a
// fresh value, pulled rows) each count against a window of credit_bytes, since links carry both
// directions at once. A dense partition draws on both, a table's push on the push window only,
// a pull of rows (a prefetch) on the pull window only: a pull waiting for answers never holds
// back a push, nor a push a pull. A task starts when it is the best queued task among those it
// may start (policy `priority`: lowest priority value, then arrival; policy `fifo`: arrival
// only) and its bytes fit in the credit left of every window it draws on; a task larger than a
// whole window starts alone in it when nothing of that direction is in flight. Strict order: a
// task that does not fit holds back every worse task that draws on a window it draws on, so a
// smaller task never overtakes a better one in a direction they share. Push credit is held from
// the start until the shard acknowledges the push (its bytes are off the link), pull credit
// until the transport reports the answer landed (or the push's receipt, in sync mode: see
// set_free_credit_on_receipt). Each task goes to the transport alone.
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

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <optional>
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
  // Changes both credit windows from now on (the tuner); tasks in flight keep their credit.
  void set_credit(uint64_t credit_bytes);
  // With true (sync mode), a task's pull credit is freed at its push's receipt too rather than
  // when its fresh value is back: a sync poll waits for every worker, and credit held through it
  // would let two workers each hold the credit the other needs to send what the other waits for.
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
  // The windows a task draws on, as a lane of the queue: tasks of one lane draw on the same
  // windows, so only a lane's best task may start next, and the best of the three lanes' best
  // is the best task of all.
  enum Lane : uint8_t { kPushes, kPulls, kBoth, kLanes };
  static Lane lane_of(const PartitionTask& task);
  static bool draws_push(Lane lane) { return lane != kPulls; }
  static bool draws_pull(Lane lane) { return lane != kPushes; }

  // A credit window's use.
  struct Window {
    uint64_t in_flight = 0;
    uint64_t max_in_flight = 0;
  };
  // A started task: its timeline so far, and the credit it still holds of each window.
  struct InFlight {
    TaskRecord record;
    uint64_t push_held = 0;
    uint64_t pull_held = 0;
  };

  // Starts queued tasks, best first, while the best one that may start fits its windows.
  // Returns at once when it is already running further up the stack (see "Re-entrancy" above).
  // On the loop.
  void start_ready();
  // The lane whose best task starts next: the best head of the lanes not held back, when it
  // fits; a head that does not fit holds back every lane drawing on a window it draws on.
  std::optional<Lane> next_lane() const;
  // Whether `task` fits the credit left of every window it draws on.
  bool fits(const PartitionTask& task) const;
  // Takes the task's credit and records its start.
  void admit(const Queued& queued);
  // Hands an admitted task to the transport; a transport that throws failed it.
  void launch(PartitionTask task);
  // Gives back the credit `held` of `window`. Idempotent.
  void release(Window& window, uint64_t& held);
  // TaskReports, called by the transport on the loop. A report of a task that is not in flight
  // (reported finished already) is ignored. A receipt frees the push credit (and the pull
  // credit in sync mode).
  void received(uint64_t task_id) override;
  // Frees the credit still held, records the task and tells on_task_done.
  void finished(uint64_t task_id, TaskOutcome outcome) override;

  PartitionTransport& transport_;
  OnTaskDone on_task_done_;
  const SchedulePolicy policy_;
  // Loop-owned state:
  uint64_t credit_bytes_;  // each window's
  bool free_credit_on_receipt_ = false;
  bool starting_ = false;       // start_ready() is running
  uint64_t next_sequence_ = 0;  // arrival counter, stamped on each task by enqueue
  uint64_t next_task_id_ = 1;   // reserve_task_ids
  std::array<std::priority_queue<Queued, std::vector<Queued>, Later>, kLanes> lanes_;
  Window push_window_, pull_window_;
  SchedulerStats stats_;
  std::unordered_map<uint64_t, InFlight> in_flight_;  // task id -> started, not finished
  std::deque<TaskRecord> records_;                    // the newest kMaxRecords finished tasks
};

}  // namespace psched
