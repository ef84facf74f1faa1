// SPDX-License-Identifier: Apache-2.0
#include "actors/worker/scheduler.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <random>

#include "actors/runtime/test_loop.h"
#include "common/error.h"

using namespace psched;

namespace {

// The gradients and ids of the tasks below: the scheduler counts their bytes and never reads
// them.
const std::vector<std::byte> kGradients(1 << 12);
const std::vector<uint64_t> kIds(1 << 10);

// A dense partition of `bytes` float32 both ways: its gradient up, its value back.
PartitionTask make_task(uint64_t id, int64_t priority, uint64_t bytes) {
  REQUIRE(bytes <= kGradients.size());
  REQUIRE(bytes % 4 == 0);
  PartitionTask task;
  task.id = id;
  task.priority = Priority(priority);
  task.partition().gradient = std::span(kGradients).first(bytes);
  task.partition().range = ElementRange{0, bytes / 4};
  task.sequence = 1000 - id;  // garbage: the scheduler must stamp its own arrival order
  return task;
}

// A table's push of `bytes` of float32 rows (one element a row), or a pull of as many.
PartitionTask make_rows_task(uint64_t id, int64_t priority, uint64_t bytes, bool push) {
  REQUIRE(bytes % 4 == 0);
  PartitionTask task = make_task(id, priority, 0);
  RowsRequest rows{
      .table = VariableId(0), .step = Step(1), .ids = std::span(kIds).first(bytes / 4)};
  rows.dim = 1;
  rows.push = push;
  if (push) rows.gradient = std::span(kGradients).first(bytes);
  task.request = rows;
  return task;
}

// Records every start and keeps each task's reports, so a test finishes tasks in the order it
// chooses. With `finish_inside_start` it instead reports each task finished from inside start().
class RecordingTransport : public PartitionTransport {
 public:
  struct Running {
    PartitionTask task;
    TaskReports* reports;
  };

  void start(PartitionTask task, TaskReports& reports) override {
    ++starting;
    max_starting = std::max(max_starting, starting);
    if (on_start) on_start(task);
    started.push_back(task);
    if (finish_inside_start)
      reports.finished(task.id, Landed{});
    else
      running.push_back(Running{task, &reports});
    --starting;
  }

  // Reports the receipt of running task `id`, which keeps running.
  void receipt(uint64_t id) {
    auto it = std::find_if(running.begin(), running.end(),
                           [id](const Running& r) { return r.task.id == id; });
    REQUIRE(it != running.end());
    it->reports->received(id);
  }

  // Reports running task `id` finished with `outcome` (on the loop, as LinkTransport does).
  void finish(uint64_t id, TaskOutcome outcome) {
    auto it = std::find_if(running.begin(), running.end(),
                           [id](const Running& r) { return r.task.id == id; });
    REQUIRE(it != running.end());
    TaskReports* reports = it->reports;
    running.erase(it);
    reports->finished(id, std::move(outcome));
  }

  uint64_t running_bytes() const {
    uint64_t sum = 0;
    for (const auto& r : running) sum += r.task.bytes();
    return sum;
  }

  std::vector<uint64_t> started_ids() const {
    std::vector<uint64_t> ids;
    for (const auto& t : started) ids.push_back(t.id);
    return ids;
  }

  std::vector<PartitionTask> started;
  std::vector<Running> running;
  bool finish_inside_start = false;
  std::function<void(const PartitionTask&)> on_start;  // runs before the start is recorded
  int starting = 0;                                    // start() calls running now
  int max_starting = 0;  // the most ever running at once (2: a start() inside another)
};

// One scheduler on an io_context polled by the test thread: deterministic, no threads.
struct SchedulerFixture {
  SchedulerFixture(SchedulePolicy policy, uint64_t credit)
      : scheduler(io.actors, policy, credit, transport,
                  [this](uint64_t id, std::exception_ptr error) {
                    CHECK(scheduler.on_loop());
                    done.emplace_back(id, error);
                    if (on_done) on_done(id);
                  }) {}

  void drain() { io.drain(); }
  void enqueue(std::vector<PartitionTask> tasks) {
    scheduler.enqueue(std::move(tasks));
    drain();
  }
  void finish(uint64_t id, TaskOutcome outcome = Landed{}) {
    transport.finish(id, std::move(outcome));
    drain();
  }
  void set_credit(uint64_t credit) {
    scheduler.set_credit(credit);
    drain();
  }
  SchedulerStats stats() {
    SchedulerStats out;
    bool replied = false;
    scheduler.stats([&](SchedulerStats s) {
      CHECK(scheduler.on_loop());
      out = s;
      replied = true;
    });
    drain();
    REQUIRE(replied);
    return out;
  }
  std::vector<uint64_t> done_ids() const {
    std::vector<uint64_t> ids;
    for (const auto& d : done) ids.push_back(d.first);
    return ids;
  }

  testing::TestLoop io;
  RecordingTransport transport;
  std::vector<std::pair<uint64_t, std::exception_ptr>> done;  // on_task_done calls, in order
  std::function<void(uint64_t)> on_done;                      // runs after each is recorded
  Scheduler scheduler;
};

using Ids = std::vector<uint64_t>;

}  // namespace

TEST_CASE("tasks start in priority order when the credit admits one at a time") {
  SchedulerFixture f(SchedulePolicy::priority, 100);
  f.enqueue({make_task(1, 5, 100), make_task(2, 3, 100), make_task(3, 9, 100), make_task(4, 1, 100),
             make_task(5, 3, 100)});
  CHECK(f.transport.started_ids() == Ids{4});
  for (uint64_t id : {4, 2, 5, 1}) f.finish(id);
  CHECK(f.transport.started_ids() == Ids{4, 2, 5, 1, 3});  // equal priority: arrival order
  f.finish(3);
  CHECK(f.done_ids() == Ids{4, 2, 5, 1, 3});
  SchedulerStats s = f.stats();
  CHECK(s.pull_bytes_in_flight == 0);
  CHECK(s.max_pull_bytes_in_flight == 100);
  CHECK(s.queued_tasks == 0);
  CHECK(s.started_tasks == 5);
  CHECK(s.finished_tasks == 5);
}

TEST_CASE("the fifo policy starts tasks in arrival order through the same code") {
  SchedulerFixture f(SchedulePolicy::fifo, 100);
  f.enqueue({make_task(1, 5, 100), make_task(2, 3, 100)});
  f.enqueue({make_task(3, 9, 100), make_task(4, 1, 100)});
  CHECK(f.stats().queued_tasks == 3);
  CHECK(f.stats().queued_by_priority ==
        std::map<Priority, uint64_t>{{Priority(1), 1}, {Priority(3), 1}, {Priority(9), 1}});
  CHECK(f.stats().credit_bytes == 100);
  for (uint64_t id : {1, 2, 3, 4}) f.finish(id);
  CHECK(f.transport.started_ids() == Ids{1, 2, 3, 4});
}

TEST_CASE("the scheduler stamps each task with its own arrival sequence") {
  SchedulerFixture f(SchedulePolicy::priority, 1000);
  f.enqueue({make_task(1, 0, 12), make_task(2, 0, 12)});
  f.enqueue({make_task(3, 0, 12)});
  REQUIRE(f.transport.started.size() == 3);
  for (uint64_t i = 0; i < 3; ++i) CHECK(f.transport.started[i].sequence == i);
}

TEST_CASE("several tasks start at once while they fit in the credit") {
  SchedulerFixture f(SchedulePolicy::priority, 100);
  f.enqueue({make_task(1, 0, 40), make_task(2, 1, 60), make_task(3, 2, 4)});
  CHECK(f.transport.started_ids() == Ids{1, 2});
  CHECK(f.stats().pull_bytes_in_flight == 100);
  f.finish(2);
  CHECK(f.transport.started_ids() == Ids{1, 2, 3});
  CHECK(f.stats().pull_bytes_in_flight == 44);
}

TEST_CASE("a task larger than the credit starts alone and only when nothing is in flight") {
  SchedulerFixture f(SchedulePolicy::priority, 100);
  f.enqueue({make_task(1, 5, 60)});
  f.enqueue({make_task(2, 0, 248)});
  CHECK(f.transport.started_ids() == Ids{1});  // waits for the credit to drain
  f.finish(1);
  CHECK(f.transport.started_ids() == Ids{1, 2});
  f.enqueue({make_task(3, 1, 12)});
  CHECK(f.transport.started_ids() == Ids{1, 2});  // 248 alone is over the credit already
  CHECK(f.stats().pull_bytes_in_flight == 248);
  f.finish(2);
  CHECK(f.transport.started_ids() == Ids{1, 2, 3});
  CHECK(f.stats().max_pull_bytes_in_flight == 248);
}

TEST_CASE("a smaller worse task never overtakes a better one waiting for credit") {
  SchedulerFixture f(SchedulePolicy::priority, 100);
  f.enqueue({make_task(1, 5, 80)});
  f.enqueue({make_task(2, 1, 52)});  // does not fit: waits
  f.enqueue({make_task(3, 9, 12)});  // would fit, but is worse than the waiting task
  CHECK(f.transport.started_ids() == Ids{1});
  CHECK(f.stats().queued_tasks == 2);
  f.finish(1);
  CHECK(f.transport.started_ids() == Ids{1, 2, 3});
}

TEST_CASE("a newly queued high-priority task goes before queued low-priority ones") {
  // ByteScheduler's case: backward produces layer L's big gradient first; layer 1's arrives
  // while L's partitions are still queued and must go next.
  SchedulerFixture f(SchedulePolicy::priority, 200);
  f.enqueue(
      {make_task(1, 10, 100), make_task(2, 10, 100), make_task(3, 10, 100), make_task(4, 10, 100)});
  CHECK(f.transport.started_ids() == Ids{1, 2});
  f.enqueue({make_task(5, 1, 100), make_task(6, 1, 100)});
  f.finish(1);
  CHECK(f.transport.started_ids() == Ids{1, 2, 5});
  f.finish(2);
  CHECK(f.transport.started_ids() == Ids{1, 2, 5, 6});
  f.finish(5);
  f.finish(6);
  CHECK(f.transport.started_ids() == Ids{1, 2, 5, 6, 3, 4});
}

TEST_CASE("under fifo a newly queued high-priority task waits behind earlier arrivals") {
  SchedulerFixture f(SchedulePolicy::fifo, 200);
  f.enqueue({make_task(1, 10, 100), make_task(2, 10, 100), make_task(3, 10, 100)});
  f.enqueue({make_task(5, 1, 100)});
  f.finish(1);
  CHECK(f.transport.started_ids() == Ids{1, 2, 3});
}

TEST_CASE("set_credit applies to future starts") {
  SchedulerFixture f(SchedulePolicy::priority, 100);
  f.enqueue({make_task(1, 0, 100), make_task(2, 1, 100), make_task(3, 2, 100), make_task(4, 3, 100),
             make_task(5, 4, 100)});
  CHECK(f.transport.started_ids() == Ids{1});

  // Widening starts more at once.
  f.set_credit(300);
  CHECK(f.transport.started_ids() == Ids{1, 2, 3});
  CHECK(f.stats().pull_bytes_in_flight == 300);

  // Narrowing keeps what is in flight and holds back new starts until it fits again.
  f.set_credit(150);
  f.finish(1);
  CHECK(f.transport.started_ids() == Ids{1, 2, 3});  // 200 in flight > 150
  f.finish(2);
  CHECK(f.transport.started_ids() == Ids{1, 2, 3});  // 100 + 100 > 150
  f.finish(3);
  CHECK(f.transport.started_ids() == Ids{1, 2, 3, 4});
  CHECK(f.stats().max_pull_bytes_in_flight == 300);
}

TEST_CASE("a transport that finishes synchronously inside start works") {
  SchedulerFixture f(SchedulePolicy::priority, 100);
  f.transport.finish_inside_start = true;
  std::vector<PartitionTask> tasks;
  for (uint64_t id = 1; id <= 12; ++id) tasks.push_back(make_task(id, (id * 7) % 5, 32));
  f.enqueue(tasks);

  Ids expected;
  std::stable_sort(tasks.begin(), tasks.end(),
                   [](const auto& a, const auto& b) { return a.priority < b.priority; });
  for (const auto& t : tasks) expected.push_back(t.id);
  CHECK(f.transport.started_ids() == expected);
  CHECK(f.done_ids() == expected);
  CHECK(f.transport.max_starting == 1);  // each start returned before the next began
  SchedulerStats s = f.stats();
  CHECK(s.pull_bytes_in_flight == 0);
  CHECK(s.max_pull_bytes_in_flight == 32);  // each finished inside its own start
  CHECK(s.finished_tasks == 12);
}

TEST_CASE("a completion inside start that enqueues more starts them in order, one at a time") {
  SchedulerFixture f(SchedulePolicy::priority, 100);
  f.transport.finish_inside_start = true;
  f.on_done = [&f](uint64_t id) {
    if (id <= 3) f.scheduler.enqueue({make_task(10 + id, 0, 60)});  // better than what waits
  };
  f.enqueue({make_task(1, 5, 60), make_task(2, 6, 60), make_task(3, 7, 60)});
  // Task 1 finishes inside its start; its completion queues 11, which goes before 2.
  CHECK(f.transport.started_ids() == Ids{1, 11, 2, 12, 3, 13});
  CHECK(f.done_ids() == Ids{1, 11, 2, 12, 3, 13});
  CHECK(f.transport.max_starting == 1);
  SchedulerStats s = f.stats();
  CHECK(s.pull_bytes_in_flight == 0);
  CHECK(s.queued_tasks == 0);
  CHECK(s.finished_tasks == 6);
}

TEST_CASE("a report runs on the loop at once: a receipt in sync mode starts the next task") {
  SchedulerFixture f(SchedulePolicy::priority, 100);
  f.scheduler.set_free_credit_on_receipt(true);
  f.enqueue({make_task(1, 1, 100), make_task(2, 2, 100)});
  CHECK(f.transport.started_ids() == Ids{1});
  f.transport.receipt(1);  // no drain: nothing waits for a later turn
  CHECK(f.transport.started_ids() == Ids{1, 2});
  f.transport.finish(1, Landed{});
  CHECK(f.done_ids() == Ids{1});
}

TEST_CASE("errors reach on_task_done and release the credit") {
  SchedulerFixture f(SchedulePolicy::priority, 100);
  f.enqueue({make_task(1, 0, 100), make_task(2, 1, 100)});
  f.finish(1, Error(ErrorCode::disconnected, "shard 0 went away"));
  REQUIRE(f.done.size() == 1);
  CHECK(f.done[0].first == 1);
  REQUIRE(f.done[0].second);
  CHECK_THROWS_WITH_AS(std::rethrow_exception(f.done[0].second), "shard 0 went away", Error);
  CHECK(f.transport.started_ids() == Ids{1, 2});
  f.finish(2);
  REQUIRE(f.done.size() == 2);
  CHECK_FALSE(f.done[1].second);
}

TEST_CASE("a transport that throws from start fails that task") {
  SchedulerFixture f(SchedulePolicy::priority, 100);
  f.transport.on_start = [](const PartitionTask& t) {
    if (t.id == 1) throw Error(ErrorCode::disconnected, "no connection to shard 0");
  };
  f.enqueue({make_task(1, 0, 100), make_task(2, 1, 100)});
  REQUIRE(f.done.size() == 1);
  CHECK(f.done[0].first == 1);
  CHECK(f.done[0].second);
  CHECK(f.transport.started_ids() == Ids{2});
  CHECK(f.stats().pull_bytes_in_flight == 100);
}

TEST_CASE("take_records returns each finished task once, with its timeline") {
  SchedulerFixture f(SchedulePolicy::priority, 100);
  f.enqueue({make_task(1, 3, 72), make_task(2, 2, 28)});
  f.finish(1);
  f.finish(2);
  std::vector<TaskRecord> records;
  f.scheduler.take_records([&](std::vector<TaskRecord> r) { records = std::move(r); });
  f.drain();
  REQUIRE(records.size() == 2);
  CHECK(records[0].task_id == 1);
  CHECK(records[0].priority == Priority(3));
  CHECK(records[0].bytes == 72);
  CHECK(records[1].task_id == 2);
  for (const auto& r : records) {
    CHECK(r.queued <= r.started);
    CHECK(r.started <= r.finished);
  }
  bool replied = false;
  f.scheduler.take_records([&](std::vector<TaskRecord> r) {
    CHECK(r.empty());
    replied = true;
  });
  f.drain();
  CHECK(replied);
}

TEST_CASE("bytes in flight never exceed the credit under a random workload") {
  SchedulePolicy policy = SchedulePolicy::priority;
  SUBCASE("priority") {
    policy = SchedulePolicy::priority;
  }
  SUBCASE("fifo") {
    policy = SchedulePolicy::fifo;
  }

  for (uint32_t seed = 1; seed <= 20; ++seed) {
    CAPTURE(seed);
    std::mt19937 rng(seed);
    auto uniform = [&rng](uint64_t lo, uint64_t hi) {
      return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
    };
    uint64_t credit = 1000, largest_credit = credit, largest_task = 0;
    SchedulerFixture f(policy, credit);

    // The test's own model of the queue: task -> arrival index.
    std::map<uint64_t, PartitionTask> waiting;
    std::map<uint64_t, uint64_t> arrival;
    // max_seen: the most in flight at once; after_last_start: in flight right after the
    // latest start (admitted under the credit of that moment; only finishes shrink it).
    uint64_t next_id = 1, arrivals = 0, max_seen = 0, after_last_start = 0;
    auto best_waiting = [&]() -> const PartitionTask& {
      auto better = [&](const auto& a, const auto& b) {
        if (policy == SchedulePolicy::priority && a.second.priority != b.second.priority)
          return a.second.priority < b.second.priority;
        return arrival[a.first] < arrival[b.first];
      };
      return std::min_element(waiting.begin(), waiting.end(), better)->second;
    };
    f.transport.on_start = [&](const PartitionTask& t) {
      uint64_t before = f.transport.running_bytes();
      CHECK((before == 0 || before + t.bytes() <= credit));
      REQUIRE(!waiting.empty());
      CHECK(t.id == best_waiting().id);  // strict order: the best waiting task, always
      CHECK(t.sequence == arrival[t.id]);
      waiting.erase(t.id);
      after_last_start = before + t.bytes();
      max_seen = std::max(max_seen, after_last_start);
    };
    auto check_state = [&] {
      SchedulerStats s = f.stats();
      CHECK(s.pull_bytes_in_flight == f.transport.running_bytes());
      // Over the current credit only by a lone task or by what a narrowing left in flight.
      CHECK((s.pull_bytes_in_flight <= std::max(credit, after_last_start) ||
             f.transport.running.size() == 1));
      CHECK(s.queued_tasks == waiting.size());
      if (!waiting.empty()) {  // work-conserving: the best waiting task really does not fit
        CHECK(s.pull_bytes_in_flight > 0);
        CHECK(s.pull_bytes_in_flight + best_waiting().bytes() > credit);
      }
    };

    for (int event = 0; event < 300 || !f.transport.running.empty(); ++event) {
      uint64_t dice = uniform(0, 99);
      if (event < 300 && (dice < 45 || f.transport.running.empty())) {
        std::vector<PartitionTask> batch;
        for (uint64_t n = uniform(1, 4); n > 0; --n) {
          uint64_t bytes = 4 * (uniform(0, 9) == 0 ? uniform(251, 625) : uniform(1, 150));
          largest_task = std::max(largest_task, bytes);
          PartitionTask t = make_task(next_id++, static_cast<int64_t>(uniform(0, 7)), bytes);
          waiting.emplace(t.id, t);
          arrival[t.id] = arrivals++;
          batch.push_back(t);
        }
        f.enqueue(std::move(batch));
      } else if (event < 300 && dice < 50) {
        credit = uniform(200, 2000);
        largest_credit = std::max(largest_credit, credit);
        f.set_credit(credit);
      } else {
        const auto& r = f.transport.running[uniform(0, f.transport.running.size() - 1)];
        TaskOutcome outcome = Landed{};
        if (uniform(0, 19) == 0) outcome = Error(ErrorCode::disconnected, "lost");
        f.finish(r.task.id, std::move(outcome));
      }
      check_state();
    }

    CHECK(waiting.empty());
    SchedulerStats s = f.stats();
    CHECK(s.started_tasks == next_id - 1);
    CHECK(s.finished_tasks == next_id - 1);
    CHECK(f.done.size() == next_id - 1);
    CHECK(s.max_pull_bytes_in_flight == max_seen);
    CHECK(s.max_pull_bytes_in_flight <= std::max(largest_credit, largest_task));
  }
}

TEST_CASE("a receipt keeps the credit unless credit is freed on receipt") {
  SchedulerFixture f(SchedulePolicy::priority, 100);
  f.enqueue({make_task(1, 1, 100), make_task(2, 2, 100)});
  f.transport.receipt(1);
  f.drain();
  CHECK(f.transport.started_ids() == Ids{1});
  f.finish(1);
  CHECK(f.transport.started_ids() == Ids{1, 2});
}

TEST_CASE("a task whose credit is freed at its receipt lets the next start and completes later") {
  SchedulerFixture f(SchedulePolicy::priority, 100);
  f.scheduler.set_free_credit_on_receipt(true);
  f.enqueue({make_task(1, 1, 100), make_task(2, 2, 100)});
  CHECK(f.transport.started_ids() == Ids{1});
  f.transport.receipt(1);
  f.drain();
  CHECK(f.transport.started_ids() == Ids{1, 2});
  CHECK(f.stats().pull_bytes_in_flight == 100);
  CHECK(f.done_ids().empty());
  f.transport.receipt(1);  // twice changes nothing
  f.finish(1);
  CHECK(f.done_ids() == Ids{1});
  CHECK(f.stats().pull_bytes_in_flight == 100);  // task 2 still holds its credit
  f.finish(2);
  CHECK(f.stats().pull_bytes_in_flight == 0);
}

TEST_CASE("a pull waiting for answer credit holds back no push, and a push no pull") {
  SchedulerFixture f(SchedulePolicy::priority, 100);
  f.enqueue({make_rows_task(1, 5, 100, false)});  // a prefetch: the pull window is full
  f.enqueue({make_rows_task(2, 1, 60, false)});   // waits for answer credit
  f.enqueue({make_rows_task(3, 9, 100, true)});   // worse, but its push window is free
  f.enqueue({make_rows_task(4, 0, 40, true)});    // waits: the push window is full
  f.enqueue({make_rows_task(5, 9, 40, false)});   // fits, but task 2 is better and waits
  CHECK(f.transport.started_ids() == Ids{1, 3});
  SchedulerStats s = f.stats();
  CHECK(s.push_bytes_in_flight == 100);
  CHECK(s.pull_bytes_in_flight == 100);
  f.finish(3);
  CHECK(f.transport.started_ids() == Ids{1, 3, 4});
  f.finish(1);
  CHECK(f.transport.started_ids() == Ids{1, 3, 4, 2, 5});
}

TEST_CASE("a dense partition draws on both windows and holds both back while it waits") {
  SchedulerFixture f(SchedulePolicy::priority, 100);
  f.enqueue({make_rows_task(1, 5, 100, false)});
  f.enqueue({make_task(2, 1, 40)});             // its answer does not fit: waits
  f.enqueue({make_rows_task(3, 9, 40, true)});  // a push it would fit, but 2 is better
  f.enqueue({make_rows_task(4, 9, 4, false)});  // and a pull
  CHECK(f.transport.started_ids() == Ids{1});
  f.finish(1);
  CHECK(f.transport.started_ids() == Ids{1, 2, 3, 4});
  SchedulerStats s = f.stats();
  CHECK(s.push_bytes_in_flight == 80);
  CHECK(s.pull_bytes_in_flight == 44);
  CHECK(s.max_pull_bytes_in_flight == 100);
}

TEST_CASE("push credit comes back at the receipt, pull credit when the answer lands") {
  SchedulerFixture f(SchedulePolicy::priority, 100);
  f.enqueue({make_task(1, 1, 100), make_rows_task(2, 2, 100, true), make_task(3, 3, 100)});
  CHECK(f.transport.started_ids() == Ids{1});
  f.transport.receipt(1);
  f.drain();
  CHECK(f.transport.started_ids() == Ids{1, 2});  // the push window is free again
  SchedulerStats s = f.stats();
  CHECK(s.push_bytes_in_flight == 100);
  CHECK(s.pull_bytes_in_flight == 100);  // task 1's answer is not back
  f.finish(2);
  CHECK(f.transport.started_ids() == Ids{1, 2});  // task 3 waits for task 1's answer credit
  f.finish(1);
  CHECK(f.transport.started_ids() == Ids{1, 2, 3});
}

TEST_CASE("two windows under a random mix of pushes, pulls and dense partitions") {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    CAPTURE(seed);
    std::mt19937 rng(seed);
    auto uniform = [&rng](uint64_t lo, uint64_t hi) {
      return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
    };
    const uint64_t credit = 400;
    const bool on_receipt = seed % 2 == 0;
    SchedulerFixture f(SchedulePolicy::priority, credit);
    f.scheduler.set_free_credit_on_receipt(on_receipt);

    // The test's model: tasks waiting in order of (priority, arrival), and the credit each
    // running task holds of each window.
    struct Waiting {
      PartitionTask task;
      uint64_t arrival;
    };
    std::vector<Waiting> waiting;
    std::map<uint64_t, std::pair<uint64_t, uint64_t>> held;  // id -> push, pull
    uint64_t next_id = 1, arrivals = 0;
    auto in_flight = [&](bool push) {
      uint64_t sum = 0;
      for (const auto& [id, h] : held) sum += push ? h.first : h.second;
      return sum;
    };
    auto fits = [&](uint64_t bytes, bool push) {
      return bytes == 0 || in_flight(push) == 0 || in_flight(push) + bytes <= credit;
    };
    // The task that should start next: walk the waiting tasks best first; one that does not fit
    // holds back the windows it draws on for every worse one.
    auto expected_next = [&]() -> std::optional<uint64_t> {
      std::vector<Waiting> order = waiting;
      std::sort(order.begin(), order.end(), [](const Waiting& a, const Waiting& b) {
        if (a.task.priority != b.task.priority) return a.task.priority < b.task.priority;
        return a.arrival < b.arrival;
      });
      bool push_back = false, pull_back = false;
      for (const auto& w : order) {
        const uint64_t up = w.task.push_bytes(), down = w.task.pull_bytes();
        if ((up > 0 && push_back) || (down > 0 && pull_back)) continue;
        if (fits(up, true) && fits(down, false)) return w.task.id;
        push_back |= up > 0;
        pull_back |= down > 0;
      }
      return std::nullopt;
    };
    f.transport.on_start = [&](const PartitionTask& t) {
      CHECK(expected_next() == std::optional<uint64_t>(t.id));
      std::erase_if(waiting, [&](const Waiting& w) { return w.task.id == t.id; });
      held[t.id] = {t.push_bytes(), t.pull_bytes()};
    };
    auto check_state = [&] {
      SchedulerStats s = f.stats();
      CHECK(s.push_bytes_in_flight == in_flight(true));
      CHECK(s.pull_bytes_in_flight == in_flight(false));
      CHECK(s.queued_tasks == waiting.size());
      CHECK_FALSE(expected_next().has_value());  // work-conserving: nothing that may start waits
    };

    for (int event = 0; event < 300 || !f.transport.running.empty(); ++event) {
      const uint64_t dice = uniform(0, 99);
      if (event < 300 && (dice < 45 || f.transport.running.empty())) {
        std::vector<PartitionTask> batch;
        for (uint64_t n = uniform(1, 4); n > 0; --n) {
          const uint64_t bytes = 4 * (uniform(0, 9) == 0 ? uniform(101, 250) : uniform(1, 75));
          const auto priority = static_cast<int64_t>(uniform(0, 7));
          const uint64_t kind = uniform(0, 2);
          PartitionTask t = kind == 0 ? make_task(next_id, priority, bytes)
                                      : make_rows_task(next_id, priority, bytes, kind == 1);
          ++next_id;
          waiting.push_back({t, arrivals++});
          batch.push_back(t);
        }
        f.enqueue(std::move(batch));
      } else if (dice < 65) {  // a receipt: the push's credit back (and the pull's, on_receipt)
        const auto& r = f.transport.running[uniform(0, f.transport.running.size() - 1)];
        held[r.task.id].first = 0;
        if (on_receipt) held[r.task.id].second = 0;
        f.transport.receipt(r.task.id);
        f.drain();
      } else {
        const uint64_t id = f.transport.running[uniform(0, f.transport.running.size() - 1)].task.id;
        held.erase(id);
        f.finish(id);
      }
      check_state();
    }
    CHECK(waiting.empty());
    CHECK(f.done.size() == next_id - 1);
  }
}
