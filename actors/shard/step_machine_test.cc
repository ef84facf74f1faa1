// SPDX-License-Identifier: Apache-2.0
// The StepMachine on its own: no variable values, a Host that writes down what it is asked, and
// times chosen by the test. Whole shards (values, replies): variable_shard_test.cc and
// membership_test.cc.
#include "actors/shard/step_machine.h"

#include <optional>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "actors/runtime/test_loop.h"
#include "common/error.h"
#include "common/error_test_support.h"

using namespace psched;
using psched::testing::code_of;

namespace {

using Clock = StepMachine::Clock;

Clock::time_point at(int seconds) {
  return Clock::time_point(std::chrono::seconds(seconds));
}

// Writes down every call; refuses to log a leave while `refuse_leave` is set.
struct RecordingHost final : StepMachine::Host {
  std::vector<std::string> calls;
  bool refuse_leave = false;

  void apply_gathered(VariableId id, const StepUpdate& update) override {
    std::vector<std::string> pieces;
    for (const StepPiece& p : update.pieces)
      pieces.push_back(fmt::format("[{},{})x{}", p.range.begin, p.range.end, p.pushers));
    calls.push_back(fmt::format("apply v{} s{} {}{}", id.value, update.step, fmt::join(pieces, " "),
                                update.closes ? " closes" : ""));
  }
  void log_push(const Push&) override {}
  void log_join(WorkerId worker, Step from) override {
    calls.push_back(fmt::format("log join w{} s{}", worker.value, from));
  }
  void log_leave(WorkerId worker) override {
    if (refuse_leave) throw Error(ErrorCode::io_error, "disk full");
    calls.push_back(fmt::format("log leave w{}", worker.value));
  }
  void log_timeout(VariableId id, Step step) override {
    calls.push_back(fmt::format("log timeout v{} s{}", id.value, step));
  }
  void count_error(const Error& error) override {
    calls.push_back(fmt::format("error [{}] {}", to_string(error.code()), error.what()));
  }
  // The calls since the last take.
  std::vector<std::string> take() { return std::exchange(calls, {}); }
};

// A kind that keeps nothing: what the machine decides is all these tests look at.
struct NoKind final : HostedKind {
  const std::string name_ = "w";
  KindTag tag() const override { return KindTag::variable; }
  const std::string& name() const override { return name_; }
  Priority priority() const override { return Priority(0); }
  DType dtype() const override { return DType::float32; }
  ElementRange extent() const override { return {0, 4}; }
  StepRule step_rule(const ShardSettings& settings) const override { return settings.dense_rule(); }
  ElementRange check_push(const Push& push) const override { return push.range; }
  ElementRange check_poll(const char*, const Poll& poll) const override { return poll.range; }
  void take(const StepUpdate&, const Push&) override {}
  void apply_gathered(const StepUpdate&) override {}
  uint64_t answer_bytes(const Poll&) const override { return 0; }
  void read(const Poll&, std::span<std::byte>) const override {}
  void report(ShardStats&) const override {}
  void save_head(ByteWriter&) const override {}
  void save_sums(ByteWriter&) const override {}
  void load_sums(ByteReader&) override {}
};

// A push of `range` of "w" (or of `variable`) as the shard hands it to the machine.
Push push_of(uint32_t worker, Step step, ElementRange range, VariableId variable = VariableId(0)) {
  return {WorkerId(worker), variable, step, range, DType::float32, {}};
}

// What `steps` said of `push`, taken at once (not held); throws its refusal.
StepMachine::Admission taken(StepMachine& steps, HostedKind& kind, const Push& push,
                             ElementRange range, Clock::time_point now) {
  std::optional<Result<StepMachine::Admission>> outcome;
  steps.take(kind, push, range, now, [&](const Result<StepMachine::Admission>& a, bool held) {
    CHECK_FALSE(held);
    outcome = a;
  });
  REQUIRE(outcome);
  if (!*outcome) throw outcome->error();
  return **outcome;
}

// What a poll was answered with: "ok" or the refusal's code, once.
struct PollAnswer {
  std::vector<std::string> got;
  StepMachine::Answer answer() {
    return [this](const Result<>& r) {
      got.push_back(r ? "ok" : std::string(to_string(r.error().code())));
    };
  }
  bool answered() const { return !got.empty(); }
};

// A shard's step machine over one variable "w" of 4 elements, three workers; with `table`, a
// second variable "t" of one unit under that rule (a table beside the dense variable).
struct Fixture {
  testing::TestLoop io;
  ShardSettings settings;
  RecordingHost host;
  NoKind kind;
  std::optional<StepMachine> steps;
  const VariableId w{0};
  const VariableId t{1};
  uint64_t next_ticket = 1;

  explicit Fixture(Mode mode, StepConfig sync = {}, std::optional<StepRule> table = {}) {
    settings.mode = mode;
    settings.workers = 3;
    settings.steps = sync;
    steps.emplace(io.actors, settings, host);
    steps->add("w", {0, 4}, settings.dense_rule());
    if (table) steps->add("t", {0, 1}, *table);
  }
  // A push and a poll of the table "t".
  StepMachine::Admission push_t(uint32_t worker, Step step, int seconds = 0) {
    return taken(*steps, kind, push_of(worker, step, {0, 1}, t), {0, 1}, at(seconds));
  }
  void poll_t(uint32_t worker, Step step, PollAnswer& answer, int seconds = 0) {
    steps->poll({WorkerId(worker), t, step, {0, 1}, PollTicket(next_ticket++)}, answer.answer(),
                at(seconds));
  }
  // A push as the shard takes it; what the machine said it was (throws its refusal).
  StepMachine::Admission push(uint32_t worker, Step step, ElementRange range = {0, 4},
                              int seconds = 0) {
    return taken(*steps, kind, push_of(worker, step, range), range, at(seconds));
  }
  void poll(uint32_t worker, Step step, PollAnswer& answer, int seconds = 0) {
    steps->poll({WorkerId(worker), w, step, {0, 4}, PollTicket(next_ticket++)}, answer.answer(),
                at(seconds));
  }
  ShardStats report() const {
    ShardStats stats;
    steps->report(stats);
    return stats;
  }
};

}  // namespace

TEST_CASE("async: a poll waits for its own worker's update only, and nothing times out") {
  Fixture f(Mode::async, {.timeout_seconds = 10});
  PollAnswer mine;
  f.poll(0, Step(1), mine);
  f.push(1, Step(1));
  CHECK_FALSE(mine.answered());
  f.push(0, Step(1), {0, 2});
  CHECK_FALSE(mine.answered());
  f.push(0, Step(1), {2, 4});
  CHECK(mine.got == std::vector<std::string>{"ok"});
  CHECK(f.steps->track(f.w).applied_step(WorkerId(0)) == Step(1));
  CHECK(f.push(0, Step(1), {2, 4}) == StepMachine::Admission::duplicate);
  f.steps->enforce(at(1000));
  CHECK(f.host.take().empty());
  CHECK(f.report().sync_timeouts == 0);
  CHECK(f.steps->join(WorkerId(0), Step(), at(0)) == Step(2));  // where each left off
  CHECK(f.steps->join(WorkerId(2), Step(), at(0)) == Step(1));
}

TEST_CASE("sync: a poll is answered when every member's push of the range is in") {
  Fixture f(Mode::sync);
  PollAnswer poll;
  f.poll(0, Step(1), poll);
  f.push(0, Step(1));
  f.push(1, Step(1));
  CHECK_FALSE(poll.answered());
  CHECK(f.steps->track(f.w).missing_workers() == std::vector<uint32_t>{2});
  f.push(2, Step(1), {0, 2});
  CHECK_FALSE(poll.answered());
  f.push(2, Step(1), {2, 4});
  CHECK(poll.got == std::vector<std::string>{"ok"});
  CHECK(f.report().partitions_applied == 2);
  // The next step is open to pushes; one two steps ahead is refused.
  CHECK(code_of([&] { f.push(0, Step(4)); }) == ErrorCode::step_from_future);
  CHECK(f.push(0, Step(2)) == StepMachine::Admission::fresh);
}

TEST_CASE("sync: a push of the step after the one under way is held, taken as that one closes") {
  Fixture f(Mode::sync, {.timeout_seconds = 10, .on_timeout = TimeoutAction::fail});
  std::vector<std::string> outcomes;
  auto hold = [&](uint32_t worker, uint64_t step) {
    f.steps->take(f.kind, push_of(worker, Step(step), {0, 4}), {0, 4}, at(0),
                  [&outcomes, worker, step](const Result<StepMachine::Admission>& a, bool held) {
                    outcomes.push_back(fmt::format("w{} s{} {}{}", worker, step,
                                                   a ? "taken" : to_string(a.error().code()),
                                                   held ? " held" : ""));
                  });
  };
  f.push(0, Step(1));
  hold(0, 2);  // worker 0 is on to step 2 while step 1 waits for workers 1 and 2
  CHECK(outcomes.empty());
  CHECK(f.report().pushes_held == 1);
  PollAnswer step2;
  f.poll(0, Step(2), step2);  // held as well
  f.push(1, Step(1));
  CHECK(outcomes.empty());
  f.push(2, Step(1));  // step 1 closes: the held push is taken, as step 2's first
  CHECK(outcomes == std::vector<std::string>{"w0 s2 taken held"});
  CHECK(f.steps->track(f.w).missing_workers() == std::vector<uint32_t>{1, 2});
  f.push(1, Step(2));
  hold(2, 2);  // step 2 is under way: taken at once
  CHECK(outcomes.back() == "w2 s2 taken");
  CHECK(step2.got == std::vector<std::string>{"ok"});
  // A step that times out (fail) fails the pushes held for the step after it; a stopping
  // shard fails the rest.
  f.push(0, Step(3), {0, 4}, 100);
  hold(0, 4);
  f.steps->enforce(at(111));
  CHECK(outcomes.back() == "w0 s4 sync_timeout held");
  hold(0, 4);
  f.steps->fail_all(Error(ErrorCode::disconnected, "stopping"));
  CHECK(outcomes.back() == "w0 s4 disconnected held");
  CHECK(outcomes.size() == 4);
}

TEST_CASE("sync: a poll for the step after the one under way is held until that one closes") {
  Fixture f(Mode::sync, {.timeout_seconds = 10, .on_timeout = TimeoutAction::fail});
  f.push(0, Step(1));
  PollAnswer prefetch;
  f.poll(0, Step(2), prefetch);  // a prefetch of step 3's rows, step 1 still open
  CHECK_FALSE(prefetch.answered());
  CHECK(f.report().polls_held == 1);
  CHECK(f.report().polls_waiting == 0);
  CHECK(code_of([&] { f.poll(0, Step(3), prefetch); }) == ErrorCode::step_from_future);
  f.push(1, Step(1));
  f.push(2, Step(1));  // step 1 closes: the poll waits for step 2 as any other
  CHECK_FALSE(prefetch.answered());
  CHECK(f.report().polls_waiting == 1);
  for (uint32_t w = 0; w < 3; ++w) f.push(w, Step(2));
  CHECK(prefetch.got == std::vector<std::string>{"ok"});
  // A step that times out (fail) fails the held polls for the step after it too.
  f.push(0, Step(3), {0, 4}, 100);
  PollAnswer behind;
  f.poll(0, Step(4), behind, 100);
  f.steps->enforce(at(111));
  CHECK(behind.got == std::vector<std::string>{"sync_timeout"});
}

TEST_CASE("sync: a step overdue fails its polls each time, timed from its first push") {
  Fixture f(Mode::sync, {.timeout_seconds = 10, .on_timeout = TimeoutAction::fail});
  f.push(0, Step(1), {0, 4}, 100);
  f.push(1, Step(1), {0, 4}, 103);
  PollAnswer poll;
  f.poll(0, Step(1), poll, 104);
  f.steps->enforce(at(109));
  CHECK(f.host.take().empty());
  f.steps->enforce(at(110));
  CHECK(f.host.take() ==
        std::vector<std::string>{"error [sync_timeout] step 1 of variable 'w' on shard 0 waited "
                                 "10.0 s for worker(s) 2"});
  CHECK(poll.got == std::vector<std::string>{"sync_timeout"});
  f.steps->enforce(at(119));  // timed afresh from the first timeout
  CHECK(f.host.take().empty());
  f.steps->enforce(at(120));
  CHECK(f.host.take().size() == 1);
  CHECK(f.report().sync_timeouts == 2);
  f.push(2, Step(1), {0, 4}, 121);  // the step completes: nothing left to time
  f.steps->enforce(at(1000));
  CHECK(f.host.take().empty());
}

TEST_CASE("sync: a step overdue proceeds without its missing workers, whose pushes are late") {
  Fixture f(Mode::sync, {.timeout_seconds = 10, .on_timeout = TimeoutAction::proceed});
  f.push(0, Step(1), {0, 4}, 100);
  f.push(1, Step(1), {0, 2}, 100);
  PollAnswer poll;
  f.poll(1, Step(1), poll, 100);
  f.steps->enforce(at(111));
  std::vector<std::string> calls = f.host.take();
  REQUIRE(calls.size() == 3);
  CHECK(calls[0].find("applied without them (their pushes of it are dropped)") !=
        std::string::npos);
  CHECK(calls[1] == "log timeout v0 s1");  // logged before it is applied
  CHECK(calls[2] == "apply v0 s1 [0,2)x2 [2,4)x1 closes");
  CHECK(poll.got == std::vector<std::string>{"ok"});
  CHECK(f.steps->track(f.w).applied_step(kAllWorkers) == Step(1));
  CHECK(f.push(2, Step(1)) == StepMachine::Admission::late);
  CHECK(f.push(0, Step(1)) == StepMachine::Admission::duplicate);  // a plain retry
  CHECK(f.report().pushes_late == 1);
  CHECK(f.report().short_handed_ranges == 2);
  auto records = f.steps->short_handed(10);
  REQUIRE(records.size() == 2);
  CHECK(records[1].range == ElementRange{2, 4});
  CHECK(records[1].workers == std::vector<uint32_t>{0});
}

TEST_CASE("a member whose lease ended leaves, logged first; the step applies what it has") {
  Fixture f(Mode::sync, {.min_workers = 1, .lease_seconds = 3});
  for (uint32_t w = 0; w < 3; ++w) f.steps->connected(WorkerId(w));
  f.push(0, Step(1));
  f.push(1, Step(1));
  PollAnswer poll;
  f.poll(0, Step(1), poll);
  f.steps->disconnected(WorkerId(2), at(10));
  f.steps->enforce(at(12));
  CHECK(f.host.take().empty());
  f.steps->enforce(at(13));
  CHECK(f.host.take() == std::vector<std::string>{"log leave w2", "apply v0 s1 [0,4)x2 closes"});
  CHECK(poll.got == std::vector<std::string>{"ok"});
  CHECK(f.report().members == 2);
  CHECK(f.report().leaves == 1);
  // Its restarted process joins at the first step no variable has begun.
  CHECK(f.steps->join(WorkerId(2), Step(1), at(14)) == Step(2));
  CHECK(f.host.take() == std::vector<std::string>{"log join w2 s2"});
  CHECK(f.report().workers[2].joined_at == Step(2));
}

TEST_CASE("a leave that cannot be logged changes nothing and is counted") {
  Fixture f(Mode::sync, {.lease_seconds = 1});
  f.steps->connected(WorkerId(1));
  f.steps->disconnected(WorkerId(1), at(0));
  f.host.refuse_leave = true;
  f.steps->enforce(at(5));
  std::vector<std::string> calls = f.host.take();
  REQUIRE(calls.size() == 1);
  CHECK(calls[0] == "error [io_error] disk full");
  CHECK(f.report().members == 3);
  CHECK(f.report().leaves == 0);
}

TEST_CASE("bounded: a poll is held until every member pushed step - staleness") {
  Fixture f(Mode::bounded, {.staleness = 1});
  for (uint32_t w = 0; w < 2; ++w) f.push(w, Step(1));
  f.push(0, Step(2));
  PollAnswer held;
  f.poll(0, Step(2), held);  // needs worker 2's step 1
  CHECK_FALSE(held.answered());
  CHECK(f.report().polls_held == 1);
  CHECK(f.report().polls_waiting == 0);
  f.push(2, Step(1));
  CHECK(held.got == std::vector<std::string>{"ok"});  // its own update was in already
}

TEST_CASE("bounded: a held poll overdue fails naming who is behind, or proceeds") {
  for (TimeoutAction action : {TimeoutAction::fail, TimeoutAction::proceed}) {
    CAPTURE(action == TimeoutAction::fail);
    Fixture f(Mode::bounded, {.timeout_seconds = 5, .on_timeout = action, .staleness = 1});
    for (uint32_t w = 0; w < 2; ++w) f.push(w, Step(1));
    PollAnswer held;
    f.poll(1, Step(2), held, 100);  // worker 1's own step 2 is not in yet either
    f.steps->enforce(at(104));
    CHECK_FALSE(held.answered());
    f.steps->enforce(at(105));
    std::vector<std::string> calls = f.host.take();
    REQUIRE(calls.size() == 1);
    CHECK(calls[0].find("worker(s) 2 to push step 1 (staleness 1)") != std::string::npos);
    CHECK(f.report().sync_timeouts == 1);
    if (action == TimeoutAction::fail) {
      CHECK(held.got == std::vector<std::string>{"sync_timeout"});
      continue;
    }
    CHECK_FALSE(held.answered());  // waits for its own update now, not for worker 2
    CHECK(f.report().polls_waiting == 1);
    f.push(1, Step(2));
    CHECK(held.got == std::vector<std::string>{"ok"});
  }
}

TEST_CASE("withdrawn and shut-down polls: a held one is forgotten, the rest fail once") {
  Fixture f(Mode::bounded, {.staleness = 0});
  PollAnswer held, withdrawn;
  f.poll(0, Step(1), held);
  f.poll(1, Step(1), withdrawn);
  f.steps->withdraw(PollTicket(2));
  f.steps->fail_all(Error(ErrorCode::disconnected, "stopping"));
  CHECK(held.got == std::vector<std::string>{"disconnected"});
  CHECK(withdrawn.got.empty());
  for (uint32_t w = 0; w < 3; ++w) f.push(w, Step(1));
  CHECK(held.got.size() == 1);
}

TEST_CASE("joins: declared workers keep step 1, ids beyond the job are refused") {
  Fixture f(Mode::sync);
  CHECK(f.steps->join(WorkerId(1), Step(1), at(0)) == Step(1));
  CHECK(f.host.take().empty());  // nothing changed: nothing logged
  CHECK(code_of([&] { f.steps->join(WorkerId(3), Step(1), at(0)); }) ==
        ErrorCode::invalid_argument);
}

TEST_CASE("the membership and its record survive a save and a load") {
  Fixture f(Mode::sync, {.timeout_seconds = 1,
                         .on_timeout = TimeoutAction::proceed,
                         .min_workers = 1,
                         .lease_seconds = 1});
  f.push(0, Step(1), {0, 4}, 0);
  f.steps->enforce(at(2));  // step 1 closes with worker 0 alone
  f.steps->connected(WorkerId(2));
  f.steps->disconnected(WorkerId(2), at(2));
  f.steps->enforce(at(4));  // worker 2 leaves
  ByteWriter out;
  f.steps->save(out);
  f.steps->track(f.w).save(out);

  RecordingHost host;
  StepMachine g(f.io.actors, f.settings, host);  // a restarted shard's
  g.add("w", {0, 4}, f.settings.dense_rule());
  ByteReader in(out.bytes(), "saved");
  g.load(in);
  g.load_track(f.w, in);
  CHECK(in.done());
  ShardStats was = f.report(), now;
  g.report(now);
  CHECK(now.members == 2);
  CHECK(now.leaves == 1);
  CHECK(now.leaves == was.leaves);
  CHECK(now.short_handed_ranges == was.short_handed_ranges);
  CHECK(g.short_handed(10).size() == 1);
  CHECK(g.track(f.w).applied_step(kAllWorkers) == Step(1));
  CHECK(code_of([&] {
          taken(g, f.kind, push_of(2, Step(2), {0, 4}), {0, 4}, at(5));
        }) == ErrorCode::not_a_member);
}

TEST_CASE("hybrid: a bounded table in a sync job applies on arrival within its staleness") {
  Fixture f(Mode::sync, {.timeout_seconds = 10}, StepRule{.mode = Mode::bounded, .staleness = 1});
  PollAnswer dense;
  f.poll(0, Step(1), dense);
  f.push(0, Step(1));
  CHECK_FALSE(dense.answered());  // the dense variable waits for every member
  CHECK(f.push_t(0, Step(1)) == StepMachine::Admission::fresh);
  PollAnswer row1;
  f.poll_t(0, Step(1), row1);
  CHECK(row1.got == std::vector<std::string>{"ok"});  // its own update, applied on arrival
  f.push_t(0, Step(2));  // not held, as a sync variable's step after the open one would be
  CHECK(f.report().pushes_held == 0);
  PollAnswer row3;
  f.poll_t(0, Step(3), row3);  // needs every member's step 2 (staleness 1)
  CHECK_FALSE(row3.answered());
  CHECK(f.report().polls_held == 1);
  for (uint32_t w = 1; w < 3; ++w) {
    f.push_t(w, Step(1));
    f.push_t(w, Step(2));
  }
  CHECK_FALSE(row3.answered());  // held no more; waits for its own step 3
  f.push_t(0, Step(3));
  CHECK(row3.got == std::vector<std::string>{"ok"});
  CHECK_FALSE(dense.answered());  // the table's steps never close a dense one
  f.push(1, Step(1));
  f.push(2, Step(1));
  CHECK(dense.got == std::vector<std::string>{"ok"});
}

TEST_CASE("hybrid: a table's held poll times out by its own staleness, a sync step by its own") {
  Fixture f(Mode::sync, {.timeout_seconds = 5}, StepRule{.mode = Mode::bounded, .staleness = 2});
  f.push_t(0, Step(1), 100);
  f.push_t(0, Step(2), 100);
  PollAnswer row;
  f.poll_t(0, Step(3), row, 100);  // workers 1 and 2 have not pushed step 1
  f.push(0, Step(1), {0, 4}, 100);
  PollAnswer ahead;
  f.poll(0, Step(2), ahead, 100);  // the dense step after the open one: held
  f.steps->enforce(at(105));
  CHECK(row.got == std::vector<std::string>{"sync_timeout"});
  CHECK(ahead.got == std::vector<std::string>{"sync_timeout"});  // with dense step 1
  std::vector<std::string> calls = f.host.take();
  REQUIRE(calls.size() == 2);
  CHECK(calls[0].find("variable 'w'") != std::string::npos);
  CHECK(calls[1].find("worker(s) 1, 2 to push step 1 (staleness 2)") != std::string::npos);
}

TEST_CASE("hybrid: a dense poll held before its step began waits on, whatever the tables do") {
  // Held polls time out by the bounded tables' rule only: a sync poll held for the step after
  // one that has no push here yet waits for that step, which has no timer yet.
  Fixture f(Mode::sync, {.timeout_seconds = 5}, StepRule{.mode = Mode::bounded, .staleness = 2});
  PollAnswer early;
  f.poll(0, Step(2), early, 100);
  f.steps->enforce(at(200));
  CHECK_FALSE(early.answered());
}

TEST_CASE("hybrid: an async table in a sync job answers a poll at its own update") {
  Fixture f(Mode::sync, {}, StepRule{.mode = Mode::async});
  for (uint64_t step = 1; step <= 3; ++step) f.push_t(0, Step(step));
  PollAnswer row;
  f.poll_t(0, Step(3), row);
  CHECK(row.got == std::vector<std::string>{"ok"});
  PollAnswer other;
  f.poll_t(1, Step(1), other);
  CHECK_FALSE(other.answered());
  f.push_t(1, Step(1));
  CHECK(other.got == std::vector<std::string>{"ok"});
}

TEST_CASE("a variable's rule may not be stricter than its job's mode") {
  CHECK(code_of([] { Fixture f(Mode::async, {}, StepRule{.mode = Mode::bounded}); }) ==
        ErrorCode::bad_config);
  CHECK(code_of([] { Fixture f(Mode::bounded, {}, StepRule{.mode = Mode::sync}); }) ==
        ErrorCode::bad_config);
}
