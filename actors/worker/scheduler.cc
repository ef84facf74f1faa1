// SPDX-License-Identifier: Apache-2.0
#include "actors/worker/scheduler.h"

#include <algorithm>
#include <utility>

#include <kj/common.h>

#include "common/check.h"

namespace psched {

namespace {

using Clock = std::chrono::steady_clock;

// True when a task of `bytes` may start now: it fits in the credit left, or nothing is in
// flight (a task larger than the whole credit goes alone). Written without `in_flight + bytes`
// so that no sum can wrap.
bool fits(uint64_t bytes, uint64_t in_flight, uint64_t credit) {
  if (in_flight == 0) return true;
  return in_flight <= credit && bytes <= credit - in_flight;
}

}  // namespace

bool Scheduler::Later::operator()(const Queued& a, const Queued& b) const {
  if (policy == SchedulePolicy::priority && a.task.priority != b.task.priority)
    return a.task.priority > b.task.priority;
  return a.task.sequence > b.task.sequence;
}

Scheduler::Scheduler(ActorLoop& loop, SchedulePolicy policy, uint64_t credit_bytes,
                     PartitionTransport& transport, OnTaskDone on_task_done)
    : Actor(loop),
      transport_(transport),
      on_task_done_(std::move(on_task_done)),
      credit_bytes_(credit_bytes),
      queue_(Later{policy}) {}

void Scheduler::enqueue(std::vector<PartitionTask> tasks) {
  dispatch([this, tasks = std::move(tasks)]() mutable {
    auto now = Clock::now();
    for (auto& task : tasks) {
      task.sequence = next_sequence_++;
      ++stats_.queued_by_priority[task.priority];
      queue_.push(Queued{std::move(task), now});
    }
    start_ready();
  });
}

void Scheduler::set_credit(uint64_t credit_bytes) {
  dispatch([this, credit_bytes] {
    credit_bytes_ = credit_bytes;
    start_ready();
  });
}

uint64_t Scheduler::reserve_task_ids(uint64_t count) {
  PSCHED_REQUIRE(on_loop(), count);
  const uint64_t first = next_task_id_;
  next_task_id_ += count;
  return first;
}

void Scheduler::set_free_credit_on_receipt(bool on_receipt) {
  dispatch([this, on_receipt] { free_credit_on_receipt_ = on_receipt; });
}

void Scheduler::stats(std::function<void(SchedulerStats)> reply) {
  dispatch([this, reply = std::move(reply)] {
    SchedulerStats now = stats_;
    now.credit_bytes = credit_bytes_;
    now.queued_tasks = queue_.size();
    reply(now);
  });
}

void Scheduler::take_records(std::function<void(std::vector<TaskRecord>)> reply) {
  dispatch([this, reply = std::move(reply)] {
    std::vector<TaskRecord> taken(records_.begin(), records_.end());
    records_.clear();
    reply(std::move(taken));
  });
}

void Scheduler::start_ready() {
  if (starting_) return;  // the one running further up the stack goes on
  starting_ = true;
  KJ_DEFER(starting_ = false);
  while (!queue_.empty() &&
         fits(queue_.top().task.bytes(), stats_.bytes_in_flight, credit_bytes_)) {
    Queued best = queue_.top();
    queue_.pop();
    admit(best);
    launch(std::move(best.task));
  }
}

void Scheduler::admit(const Queued& queued) {
  const PartitionTask& task = queued.task;
  auto same_priority = stats_.queued_by_priority.find(task.priority);
  if (--same_priority->second == 0) stats_.queued_by_priority.erase(same_priority);
  stats_.bytes_in_flight += task.bytes();
  stats_.max_bytes_in_flight = std::max(stats_.max_bytes_in_flight, stats_.bytes_in_flight);
  ++stats_.started_tasks;
  TaskRecord record{.task_id = task.id,
                    .start_index = stats_.started_tasks - 1,
                    .priority = task.priority,
                    .bytes = task.bytes(),
                    .format = task.format(),
                    .value_format = task.value_format(),
                    .shard = task.shard,
                    .range = task.range(),
                    .queued = queued.queued,
                    .started = Clock::now(),
                    .receipt = {},
                    .applied = {},
                    .finished = {}};
  in_flight_.emplace(task.id, InFlight{record, true});
}

void Scheduler::launch(PartitionTask task) {
  uint64_t id = task.id;
  try {
    transport_.start(std::move(task), *this);
  } catch (...) {
    // A transport that throws instead of reporting failed the task; finished() ignores a second
    // report of a task it already had.
    finished(id, caught());
  }
}

void Scheduler::release_credit(InFlight& task) {
  if (!task.holds_credit) return;
  PSCHED_REQUIRE(task.record.bytes <= stats_.bytes_in_flight, task.record.task_id,
                 task.record.bytes, stats_.bytes_in_flight);
  stats_.bytes_in_flight -= task.record.bytes;
  task.holds_credit = false;
}

void Scheduler::received(uint64_t task_id) {
  PSCHED_REQUIRE(on_loop(), task_id);
  auto it = in_flight_.find(task_id);
  if (it == in_flight_.end()) return;
  it->second.record.receipt = Clock::now();
  if (!free_credit_on_receipt_) return;
  release_credit(it->second);
  start_ready();
}

void Scheduler::finished(uint64_t task_id, TaskOutcome outcome) {
  PSCHED_REQUIRE(on_loop(), task_id);
  auto it = in_flight_.find(task_id);
  if (it == in_flight_.end()) return;  // reported twice: the first report counted
  release_credit(it->second);
  TaskRecord record = it->second.record;
  in_flight_.erase(it);
  ++stats_.finished_tasks;
  record.finished = Clock::now();
  if (outcome && outcome->applied_at_ns != 0) {
    auto wall_now = std::chrono::system_clock::now().time_since_epoch();
    auto applied_at = std::chrono::nanoseconds(outcome->applied_at_ns);
    record.applied = record.finished - (wall_now - applied_at);
  }
  if (records_.size() == kMaxRecords) records_.pop_front();
  records_.push_back(record);
  if (on_task_done_)
    on_task_done_(task_id, outcome ? nullptr : std::make_exception_ptr(outcome.error()));
  start_ready();
}

}  // namespace psched
