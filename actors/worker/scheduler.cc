// SPDX-License-Identifier: Apache-2.0
#include "actors/worker/scheduler.h"

#include <algorithm>
#include <utility>

#include <kj/common.h>

#include "common/check.h"

namespace psched {

namespace {

using Clock = std::chrono::steady_clock;

// True when `bytes` of a task may go in a window now: they fit in the credit left, or nothing
// is in flight in it (a task larger than the whole credit goes alone). Written without
// `in_flight + bytes` so that no sum can wrap.
bool fits_window(uint64_t bytes, uint64_t in_flight, uint64_t credit) {
  if (bytes == 0 || in_flight == 0) return true;
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
      policy_(policy),
      credit_bytes_(credit_bytes),
      lanes_{{decltype(lanes_)::value_type(Later{policy}),
              decltype(lanes_)::value_type(Later{policy}),
              decltype(lanes_)::value_type(Later{policy})}} {}

Scheduler::Lane Scheduler::lane_of(const PartitionTask& task) {
  if (task.pull_bytes() == 0) return kPushes;
  return task.push_bytes() == 0 ? kPulls : kBoth;
}

void Scheduler::enqueue(std::vector<PartitionTask> tasks) {
  dispatch([this, tasks = std::move(tasks)]() mutable {
    auto now = Clock::now();
    for (auto& task : tasks) {
      task.sequence = next_sequence_++;
      ++stats_.queued_by_priority[task.priority];
      const Lane lane = lane_of(task);
      lanes_[lane].push(Queued{std::move(task), now});
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
    now.push_bytes_in_flight = push_window_.in_flight;
    now.pull_bytes_in_flight = pull_window_.in_flight;
    now.max_push_bytes_in_flight = push_window_.max_in_flight;
    now.max_pull_bytes_in_flight = pull_window_.max_in_flight;
    now.queued_tasks = 0;
    for (const auto& lane : lanes_) now.queued_tasks += lane.size();
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
  while (std::optional<Lane> lane = next_lane()) {
    Queued best = lanes_[*lane].top();
    lanes_[*lane].pop();
    admit(best);
    launch(std::move(best.task));
  }
}

std::optional<Scheduler::Lane> Scheduler::next_lane() const {
  bool push_held_back = false, pull_held_back = false;
  std::array<bool, kLanes> looked{};
  for (;;) {
    std::optional<Lane> best;
    for (uint8_t l = 0; l < kLanes; ++l) {
      const auto lane = static_cast<Lane>(l);
      if (looked[lane] || lanes_[lane].empty()) continue;
      if ((push_held_back && draws_push(lane)) || (pull_held_back && draws_pull(lane))) continue;
      if (!best || Later{policy_}(lanes_[*best].top(), lanes_[lane].top())) best = lane;
    }
    if (!best || fits(lanes_[*best].top().task)) return best;
    looked[*best] = true;
    push_held_back |= draws_push(*best);
    pull_held_back |= draws_pull(*best);
  }
}

bool Scheduler::fits(const PartitionTask& task) const {
  return fits_window(task.push_bytes(), push_window_.in_flight, credit_bytes_) &&
         fits_window(task.pull_bytes(), pull_window_.in_flight, credit_bytes_);
}

void Scheduler::admit(const Queued& queued) {
  const PartitionTask& task = queued.task;
  auto same_priority = stats_.queued_by_priority.find(task.priority);
  if (--same_priority->second == 0) stats_.queued_by_priority.erase(same_priority);
  InFlight started{.record = {}, .push_held = task.push_bytes(), .pull_held = task.pull_bytes()};
  for (auto [window, bytes] :
       {std::pair{&push_window_, started.push_held}, std::pair{&pull_window_, started.pull_held}}) {
    window->in_flight += bytes;
    window->max_in_flight = std::max(window->max_in_flight, window->in_flight);
  }
  ++stats_.started_tasks;
  started.record = TaskRecord{.task_id = task.id,
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
  in_flight_.emplace(task.id, started);
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

void Scheduler::release(Window& window, uint64_t& held) {
  PSCHED_REQUIRE(held <= window.in_flight, held, window.in_flight);
  window.in_flight -= held;
  held = 0;
}

void Scheduler::received(uint64_t task_id) {
  PSCHED_REQUIRE(on_loop(), task_id);
  auto it = in_flight_.find(task_id);
  if (it == in_flight_.end()) return;
  InFlight& task = it->second;
  task.record.receipt = Clock::now();
  const uint64_t held = task.push_held + task.pull_held;
  release(push_window_, task.push_held);
  if (free_credit_on_receipt_) release(pull_window_, task.pull_held);
  if (task.push_held + task.pull_held != held) start_ready();
}

void Scheduler::finished(uint64_t task_id, TaskOutcome outcome) {
  PSCHED_REQUIRE(on_loop(), task_id);
  auto it = in_flight_.find(task_id);
  if (it == in_flight_.end()) return;  // reported twice: the first report counted
  release(push_window_, it->second.push_held);
  release(pull_window_, it->second.pull_held);
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
