#include "actors/scheduler.h"

#include <algorithm>
#include <utility>

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

Scheduler::Scheduler(IoContext& io, SchedulePolicy policy, uint64_t credit_bytes,
                     PartitionTransport& transport, OnTaskDone on_task_done)
    : Actor(io),
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
  // The transport may finish a task synchronously inside start(); its completion is posted, so
  // the queue only changes here (or in a nested enqueue, which leaves it consistent). Nothing
  // that points into the queue is kept across start().
  while (!queue_.empty()) {
    if (!fits(queue_.top().task.bytes, stats_.bytes_in_flight, credit_bytes_)) return;
    Queued best = queue_.top();
    queue_.pop();
    auto same_priority = stats_.queued_by_priority.find(best.task.priority);
    if (--same_priority->second == 0) stats_.queued_by_priority.erase(same_priority);
    start(std::move(best));
  }
}

void Scheduler::start(Queued queued) {
  const PartitionTask& task = queued.task;
  stats_.bytes_in_flight += task.bytes;
  stats_.max_bytes_in_flight = std::max(stats_.max_bytes_in_flight, stats_.bytes_in_flight);
  ++stats_.started_tasks;
  TaskRecord record{
      task.id, stats_.started_tasks - 1, task.priority, task.bytes, queued.queued, Clock::now(),
      {}};
  credit_held_.emplace(task.id, task.bytes);
  // The callbacks may run on any thread, even inside start(): always hop, never run inline.
  auto done = [this, record](std::exception_ptr error) {
    post([this, record, error] { finished(record, error); });
  };
  auto credit_free = [this, id = task.id] { post([this, id] { free_credit(id); }); };
  try {
    transport_.start(task, {credit_free, done});
  } catch (...) {
    // A transport that throws instead of calling `done` failed the task.
    done(std::current_exception());
  }
}

void Scheduler::release_credit(uint64_t task_id) {
  auto held = credit_held_.find(task_id);
  if (held == credit_held_.end()) return;
  PSCHED_REQUIRE(held->second <= stats_.bytes_in_flight, task_id, held->second,
                 stats_.bytes_in_flight);
  stats_.bytes_in_flight -= held->second;
  credit_held_.erase(held);
}

void Scheduler::free_credit(uint64_t task_id) {
  release_credit(task_id);
  start_ready();
}

void Scheduler::finished(TaskRecord record, std::exception_ptr error) {
  uint64_t task_id = record.task_id;
  release_credit(task_id);
  ++stats_.finished_tasks;
  record.finished = Clock::now();
  if (records_.size() == kMaxRecords) records_.pop_front();
  records_.push_back(record);
  if (on_task_done_) on_task_done_(task_id, error);
  start_ready();
}

}  // namespace psched
