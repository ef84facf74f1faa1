// SPDX-License-Identifier: Apache-2.0
#include "actors/shard/variable_shard.h"

#include <optional>
#include <vector>

#include <doctest/doctest.h>

#include "actors/runtime/test_loop.h"
#include "actors/shard/shard_test_support.h"
#include "common/error.h"

using namespace psched;
using psched::testing::Answered;
using psched::testing::bytes_of;
using psched::testing::Receipted;

namespace {

struct ShardFixture {
  testing::TestLoop io;
  VariableShard shard{io.actors, ShardSettings{ShardId(0), Mode::async, 2, 4}};

  void drain() { io.drain(); }

  VariableId add(const std::string& name, std::vector<float> init, bool* created = nullptr) {
    VariableSpec spec;
    spec.name = name;
    spec.shape = {init.size()};
    spec.optimizer.lr = 1.0;
    std::optional<Result<VariableShard::Registration>> registered;
    shard.register_variable(spec, {0, init.size()}, std::as_bytes(std::span(init)),
                            [&](const Result<VariableShard::Registration>& r) { registered = r; });
    drain();
    REQUIRE(registered);
    if (!*registered) throw registered->error();
    if (created) *created = (*registered)->created;
    return (*registered)->id;
  }
  // Worker `worker`'s push of `g` to `id` at `step`, drained; its receipt.
  Receipted push(uint32_t worker, VariableId id, Step step, const std::vector<float>& g) {
    Receipted receipt;
    shard.push({WorkerId(worker), id, step, {0, g.size()}, DType::float32, bytes_of(g)},
               receipt.reply());
    drain();
    return receipt;
  }
  std::vector<float> value(VariableId id, uint64_t n) {
    Answered pulled;
    shard.pull(id, {0, n}, pulled.reply());
    drain();
    REQUIRE(pulled.value);
    return *pulled.value;
  }
  ShardStats stats() {
    ShardStats out;
    shard.stats([&](ShardStats s) { out = std::move(s); });
    drain();
    return out;
  }
};

}  // namespace

TEST_CASE("registering the same spec twice is a no-op that keeps the value") {
  ShardFixture f;
  bool created = false;
  VariableId a = f.add("w", {1, 2}, &created);
  CHECK(created);
  VariableId b = f.add("w", {9, 9}, &created);
  CHECK_FALSE(created);
  CHECK(a == b);
  CHECK(f.value(a, 2) == std::vector<float>{1, 2});
}

TEST_CASE("a different spec under a registered name is a spec conflict") {
  ShardFixture f;
  f.add("w", {1, 2});
  CHECK_THROWS_WITH_AS(f.add("w", {1, 2, 3}), doctest::Contains("registered with a different spec"),
                       Error);
}

TEST_CASE("the shard refuses variables beyond its configured count") {
  ShardFixture f;
  for (int i = 0; i < 4; ++i) f.add("v" + std::to_string(i), {0});
  CHECK_THROWS_WITH_AS(f.add("v4", {0}), doctest::Contains("configured limit"), Error);
}

TEST_CASE("a poll waits for the worker's own push and then returns the fresh value") {
  ShardFixture f;
  VariableId id = f.add("w", {1, 2});
  Answered answer;
  f.shard.poll({WorkerId(0), id, Step(1), {0, 2}, PollTicket(1)}, answer.reply());
  f.drain();
  CHECK_FALSE(answer.done());
  CHECK(f.push(1, id, Step(1), {1, 1}).taken());
  CHECK_FALSE(answer.done());  // async: another worker's update does not release worker 0's poll
  CHECK(f.push(0, id, Step(1), {1, 1}).taken());
  REQUIRE(answer.answers == 1);
  REQUIRE(answer.value);
  CHECK(answer.step == Step(1));
  CHECK(*answer.value == std::vector<float>{-1, 0});
}

TEST_CASE("a poll for an applied step returns at once, with that step's value") {
  ShardFixture f;
  VariableId id = f.add("w", {1});
  REQUIRE(f.push(0, id, Step(1), {1}).taken());
  Answered answer;
  f.shard.poll({WorkerId(0), id, Step(1), {0, 1}, PollTicket(1)}, answer.reply());
  f.drain();
  REQUIRE(answer.value);
  CHECK(answer.step == Step(1));
  CHECK(*answer.value == std::vector<float>{0});
}

TEST_CASE("a push_poll is one call: its value once applied, or only its refusal") {
  ShardFixture f;
  VariableId id = f.add("w", {1, 2});
  std::vector<float> g{1, 1};
  Receipted receipt;
  Answered answer;
  f.shard.push_poll({WorkerId(0), id, Step(1), {0, 2}, DType::float32, bytes_of(g)}, PollTicket(1),
                    receipt.reply(), answer.reply());
  f.drain();
  CHECK(receipt.taken());
  REQUIRE(answer.value);
  CHECK(answer.step == Step(1));
  CHECK(*answer.value == std::vector<float>{0, 1});
  // A refused push: its receipt says why, and no poll is filed for it.
  Receipted refused;
  Answered never;
  f.shard.push_poll({WorkerId(0), id, Step(3), {0, 2}, DType::float32, bytes_of(g)}, PollTicket(2),
                    refused.reply(), never.reply());
  f.drain();
  REQUIRE(refused.refusal);
  CHECK(refused.refusal->code() == ErrorCode::step_from_future);
  CHECK_FALSE(never.done());
  CHECK(f.stats().polls_waiting == 0);
  CHECK(f.value(id, 2) == std::vector<float>{0, 1});
}

TEST_CASE("requests naming an unknown variable fail with unknown_variable") {
  ShardFixture f;
  Receipted receipt = f.push(0, VariableId(3), Step(1), {1});
  REQUIRE(receipt.refusal);
  CHECK(receipt.refusal->code() == ErrorCode::unknown_variable);
  CHECK(std::string(receipt.refusal->what()).find("no variable or table with id 3") !=
        std::string::npos);
  Answered polled, pulled;
  f.shard.poll({WorkerId(0), VariableId(3), Step(1), {0, 1}, PollTicket(1)}, polled.reply());
  f.shard.pull(VariableId(3), {0, 1}, pulled.reply());
  f.drain();
  REQUIRE(polled.refusal);
  CHECK(polled.refusal->code() == ErrorCode::unknown_variable);
  REQUIRE(pulled.refusal);
  CHECK(pulled.refusal->code() == ErrorCode::unknown_variable);
}

TEST_CASE("shutting down fails the waiting polls as disconnected") {
  ShardFixture f;
  VariableId id = f.add("w", {1});
  Answered answer;
  f.shard.poll({WorkerId(0), id, Step(1), {0, 1}, PollTicket(1)}, answer.reply());
  f.drain();
  bool done = false;
  f.shard.shut_down([&] { done = true; });
  f.drain();
  CHECK(done);
  REQUIRE(answer.answers == 1);
  REQUIRE(answer.refusal);
  CHECK(answer.refusal->code() == ErrorCode::disconnected);
}

TEST_CASE("a withdrawn poll is forgotten unanswered and a later apply finds nothing") {
  ShardFixture f;
  VariableId id = f.add("w", {1});
  Answered answer;
  f.shard.poll({WorkerId(0), id, Step(1), {0, 1}, PollTicket(7)}, answer.reply());
  f.drain();
  CHECK(f.stats().polls_waiting == 1);
  f.shard.withdraw_poll(PollTicket(7));
  f.shard.withdraw_poll(PollTicket(7));  // twice is harmless
  CHECK(f.push(0, id, Step(1), {1}).taken());
  CHECK_FALSE(answer.done());
  CHECK(f.stats().polls_waiting == 0);
}

TEST_CASE("the shard's stats count applies, poll waits and failed requests by code") {
  ShardFixture f;
  VariableId id = f.add("w", {0, 0});
  Answered answer;
  f.shard.poll({WorkerId(0), id, Step(1), {0, 2}, PollTicket(1)}, answer.reply());
  CHECK(f.push(0, id, Step(1), {1, 1}).taken());
  CHECK(f.push(0, id, Step(3), {1, 1}).refusal);
  CHECK(answer.value);
  f.shard.report_error(Error(ErrorCode::bad_token, "wrong token"));
  ShardStats stats;
  std::vector<VariableStatus> variables;
  f.shard.stats([&](ShardStats s) { stats = std::move(s); });
  f.shard.variables(10, [&](std::vector<VariableStatus> v) { variables = std::move(v); });
  f.drain();
  CHECK(stats.apply_seconds.count() == 1);
  CHECK(stats.partitions_applied == 1);
  CHECK(stats.bytes_received == 8);
  CHECK(stats.bytes_sent == 8);
  CHECK(stats.pushes_rejected == 1);
  CHECK(stats.poll_wait_seconds.count() == 1);
  CHECK(stats.errors[static_cast<size_t>(ErrorCode::step_from_future)] == 1);
  CHECK(stats.errors[static_cast<size_t>(ErrorCode::bad_token)] == 1);
  REQUIRE(stats.recent_errors.size() == 2);
  CHECK(stats.recent_errors[1].message == "wrong token");
  REQUIRE(variables.size() == 1);
  CHECK(variables[0].name == "w");
  CHECK(variables[0].step == Step(1));
}

namespace {

// Three sync workers; worker 2 never pushes.
struct SyncTimeoutFixture {
  testing::TestLoop io;
  VariableShard shard;
  VariableId id;

  explicit SyncTimeoutFixture(TimeoutAction action)
      : shard(io.actors,
              ShardSettings{ShardId(0), Mode::sync, 3, 4, {}, true, StepConfig{10, action}}) {
    VariableSpec spec;
    spec.name = "w";
    spec.shape = {2};
    spec.optimizer.lr = 1.0;
    std::vector<float> init{0, 0};
    shard.register_variable(spec, {0, 2}, std::as_bytes(std::span(init)),
                            [&](const Result<VariableShard::Registration>& r) { id = r->id; });
    drain();
  }
  void drain() { io.drain(); }
  void push(uint32_t worker, Step step, std::vector<float> g) {
    Receipted receipt;
    shard.push({WorkerId(worker), id, step, {0, 2}, DType::float32, bytes_of(g)}, receipt.reply());
    drain();
    REQUIRE(receipt.taken());
  }
  std::vector<float> value() {
    Answered pulled;
    shard.pull(id, {0, 2}, pulled.reply());
    drain();
    REQUIRE(pulled.value);
    return *pulled.value;
  }
  ShardStats stats() {
    ShardStats out;
    shard.stats([&](ShardStats s) { out = s; });
    drain();
    return out;
  }
};

}  // namespace

TEST_CASE("a sync step past its timeout fails its polls naming the missing worker") {
  SyncTimeoutFixture f(TimeoutAction::fail);
  f.push(0, Step(1), {1, 1});
  f.push(1, Step(1), {3, 3});
  Answered answer;
  f.shard.poll({WorkerId(0), f.id, Step(1), {0, 2}, PollTicket(1)}, answer.reply());
  f.drain();
  auto start = std::chrono::steady_clock::now();
  f.shard.enforce_deadlines(start + std::chrono::seconds(5));  // not yet overdue
  f.drain();
  CHECK_FALSE(answer.done());
  f.shard.enforce_deadlines(start + std::chrono::seconds(11));
  f.drain();
  REQUIRE(answer.refusal);
  CHECK(answer.refusal->code() == ErrorCode::sync_timeout);
  CHECK(std::string(answer.refusal->what()).find("worker(s) 2") != std::string::npos);
  CHECK(f.stats().sync_timeouts == 1);
  CHECK(f.stats().errors[static_cast<size_t>(ErrorCode::sync_timeout)] == 1);
  // The step still completes when the missing worker comes back.
  f.push(2, Step(1), {5, 5});
  CHECK(f.value() == std::vector<float>{-3, -3});
}

TEST_CASE("a sync step past its timeout proceeds with the mean of the workers that pushed") {
  SyncTimeoutFixture f(TimeoutAction::proceed);
  f.push(0, Step(1), {1, 1});
  f.push(1, Step(1), {3, 3});
  Answered answer;
  f.shard.poll({WorkerId(0), f.id, Step(1), {0, 2}, PollTicket(1)}, answer.reply());
  f.drain();
  f.shard.enforce_deadlines(std::chrono::steady_clock::now() + std::chrono::seconds(11));
  f.drain();
  REQUIRE(answer.value);
  CHECK(answer.step == Step(1));
  CHECK(*answer.value == std::vector<float>{-2, -2});
  // The missing worker's late push is acknowledged, counted and dropped; step 2 goes on.
  f.push(2, Step(1), {5, 5});
  CHECK(f.stats().pushes_late == 1);
  for (uint32_t w = 0; w < 3; ++w) f.push(w, Step(2), {3, 3});
  CHECK(f.value() == std::vector<float>{-5, -5});
}

TEST_CASE(
    "async: a worker resumes after its last step, and a shard that hosts nothing has no say") {
  ShardFixture f;
  auto join = [&f](uint32_t worker) {
    std::optional<Result<Step>> from;
    f.shard.join(WorkerId(worker), Step(1), [&](const Result<Step>& r) { from = r; });
    f.drain();
    REQUIRE(from);
    return from->value();
  };
  CHECK(join(0) == Step());  // the slot map may give a shard no dense variable
  const VariableId w = f.add("w", {0, 0});
  CHECK(join(0) == Step(1));
  CHECK(f.push(0, w, Step(1), {1, 1}).taken());
  CHECK(f.push(0, w, Step(2), {1, 1}).taken());
  CHECK(join(0) == Step(3));
  CHECK(join(1) == Step(1));
}
