// Scheduler: the worker-side actor that decides which partition goes next.
//
// One queue of partition tasks per worker and one credit window. A task starts when it is the
// best queued task (policy `priority`: lowest priority value, then arrival; policy `fifo`:
// arrival only) and its bytes fit in the credit left; the credit is held from the start until
// the transport reports the fresh value back (or, in sync mode, the push's receipt: see
// TaskCallbacks::credit_free). Bytes in flight never exceed credit_bytes, except
// that a single task larger than the whole credit starts alone when nothing is in flight.
// Strict order: a smaller task never overtakes a better one that is waiting for credit.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <queue>
#include <unordered_map>
#include <vector>

#include "actors/actor.h"
#include "actors/partition_task.h"
#include "config/deployment.h"

namespace psched {

// What happened to one task, for traces, the tuner and tests. Times are steady_clock.
struct TaskRecord {
  uint64_t task_id = 0;
  uint64_t start_index = 0;  // 0 for the first task this scheduler started, then 1, 2, ...
  Priority priority = 0;
  uint64_t bytes = 0;
  std::chrono::steady_clock::time_point queued, started, finished;
};

struct SchedulerStats {
  uint64_t credit_bytes = 0;         // the credit window now
  uint64_t bytes_in_flight = 0;      // credit held now: started tasks not yet finished
  uint64_t max_bytes_in_flight = 0;  // the most ever in flight at once
  uint64_t queued_tasks = 0;         // waiting now (enqueued, not yet started)
  uint64_t started_tasks = 0;        // ever started
  uint64_t finished_tasks = 0;       // ever finished (failures included)
  std::map<Priority, uint64_t> queued_by_priority;  // queued_tasks by task priority (no zeros)
};

class Scheduler : public Actor {
 public:
  static constexpr size_t kMaxRecords = 1 << 16;

  // Runs on the scheduler's strand when a task finished (fresh value written) or failed.
  using OnTaskDone = std::function<void(uint64_t task_id, std::exception_ptr)>;

  // `transport` outlives the scheduler.
  Scheduler(IoContext& io, SchedulePolicy policy, uint64_t credit_bytes,
            PartitionTransport& transport, OnTaskDone on_task_done);

  // Queues the tasks (all partitions of one push, say) and starts what the credit allows.
  // Each task's `sequence` is overwritten with the scheduler's arrival counter. Any thread.
  void enqueue(std::vector<PartitionTask> tasks);
  // Changes the credit window from now on (the tuner); tasks in flight keep their credit.
  void set_credit(uint64_t credit_bytes);
  // Calls `reply` on the strand with the current figures.
  void stats(std::function<void(SchedulerStats)> reply);
  // Calls `reply` on the strand with the records of tasks finished since the last call (the
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

  // Starts queued tasks, best first, while the best one fits the credit left. On strand.
  void start_ready();
  // Takes the credit and hands the task to the transport. On strand.
  void start(Queued queued);
  // Gives the task's credit back if it still holds it. Idempotent.
  void release_credit(uint64_t task_id);
  // The transport's `credit_free`, after the hop back onto the strand: releases, starts more.
  void free_credit(uint64_t task_id);
  // The transport's `done`, after the hop back onto the strand: frees the credit if still held.
  void finished(TaskRecord record, std::exception_ptr error);

  PartitionTransport& transport_;
  OnTaskDone on_task_done_;
  // Strand-owned state:
  uint64_t credit_bytes_;
  uint64_t next_sequence_ = 0;  // arrival counter, stamped on each task by enqueue
  std::priority_queue<Queued, std::vector<Queued>, Later> queue_;
  SchedulerStats stats_;
  std::unordered_map<uint64_t, uint64_t> credit_held_;  // task id -> bytes, while held
  std::deque<TaskRecord> records_;                      // the newest kMaxRecords finished tasks
};

}  // namespace psched
