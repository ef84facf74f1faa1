// SPDX-License-Identifier: Apache-2.0
#include "actors/shard/variable_shard.h"

#include <optional>
#include <vector>

#include <doctest/doctest.h>

#include "actors/runtime/test_loop.h"
#include "common/error.h"

using namespace psched;

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
    std::optional<VariableId> id;
    std::optional<Error> error;
    shard.register_variable(spec, {0, init.size()}, std::as_bytes(std::span(init)),
                            [&](const Error* e, VariableId v, bool c) {
                              if (e) error = *e;
                              id = v;
                              if (created) *created = c;
                            });
    drain();
    if (error) throw *error;
    return *id;
  }
};

std::vector<float> floats(const FreshValue* v) {
  REQUIRE(v != nullptr);
  std::vector<float> out(v->bytes() / 4);
  v->read_into(reinterpret_cast<std::byte*>(out.data()));
  return out;
}

}  // namespace

TEST_CASE("registering the same spec twice is a no-op that keeps the value") {
  ShardFixture f;
  bool created = false;
  VariableId a = f.add("w", {1, 2}, &created);
  CHECK(created);
  VariableId b = f.add("w", {9, 9}, &created);
  CHECK_FALSE(created);
  CHECK(a == b);
  std::vector<float> got;
  f.shard.pull(a, {0, 2}, [&](const Error*, const FreshValue* v) { got = floats(v); });
  f.drain();
  CHECK(got == std::vector<float>{1, 2});
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
  std::optional<std::vector<float>> answer;
  f.shard.poll(WorkerId(0), id, Step(1), {0, 2}, PollTicket(1),
               [&](const Error* e, const FreshValue* v) {
                 REQUIRE(!e);
                 CHECK(v->step() == Step(1));
                 answer = floats(v);
               });
  f.drain();
  CHECK_FALSE(answer);
  std::vector<float> g{1, 1};
  std::optional<Error> other_worker_error;
  f.shard.push(WorkerId(1), id, Step(1), {0, 2}, DType::float32, std::as_bytes(std::span(g)),
               PushedGradient::whole, [&](const Error* e) {
                 if (e) other_worker_error = *e;
               });
  f.drain();
  CHECK_FALSE(answer);  // async: another worker's update does not release worker 0's poll
  f.shard.push(WorkerId(0), id, Step(1), {0, 2}, DType::float32, std::as_bytes(std::span(g)),
               PushedGradient::whole, [](const Error* e) { REQUIRE(!e); });
  f.drain();
  REQUIRE(answer);
  CHECK(*answer == std::vector<float>{-1, 0});
}

TEST_CASE("a poll for an applied step returns at once") {
  ShardFixture f;
  VariableId id = f.add("w", {1});
  std::vector<float> g{1};
  f.shard.push(WorkerId(0), id, Step(1), {0, 1}, DType::float32, std::as_bytes(std::span(g)),
               PushedGradient::whole, [](const Error*) {});
  f.drain();
  bool answered = false;
  f.shard.poll(WorkerId(0), id, Step(1), {0, 1}, PollTicket(1),
               [&](const Error* e, const FreshValue*) { answered = !e; });
  f.drain();
  CHECK(answered);
}

TEST_CASE("requests naming an unknown variable fail with unknown_variable") {
  ShardFixture f;
  std::vector<float> g{1};
  std::optional<Error> error;
  f.shard.push(WorkerId(0), VariableId(3), Step(1), {0, 1}, DType::float32,
               std::as_bytes(std::span(g)), PushedGradient::whole, [&](const Error* e) {
                 if (e) error = *e;
               });
  f.drain();
  REQUIRE(error);
  CHECK_THROWS_WITH_AS(throw *error, doctest::Contains("no variable with id 3"), Error);
}

TEST_CASE("shutting down fails the waiting polls") {
  ShardFixture f;
  VariableId id = f.add("w", {1});
  std::optional<Error> error;
  f.shard.poll(WorkerId(0), id, Step(1), {0, 1}, PollTicket(1),
               [&](const Error* e, const FreshValue*) {
                 if (e) error = *e;
               });
  f.drain();
  f.shard.shut_down([] {});
  f.drain();
  CHECK(error);
}

TEST_CASE("a withdrawn poll is forgotten unanswered and a later apply finds nothing") {
  ShardFixture f;
  VariableId id = f.add("w", {1});
  int answers = 0;
  f.shard.poll(WorkerId(0), id, Step(1), {0, 1}, PollTicket(7),
               [&](const Error*, const FreshValue*) { ++answers; });
  f.drain();
  ShardStats stats;
  f.shard.stats([&](ShardStats s) { stats = s; });
  f.drain();
  CHECK(stats.polls_waiting == 1);
  f.shard.withdraw_poll(PollTicket(7));
  f.shard.withdraw_poll(PollTicket(7));  // twice is harmless
  std::vector<float> g{1};
  f.shard.push(WorkerId(0), id, Step(1), {0, 1}, DType::float32, std::as_bytes(std::span(g)),
               PushedGradient::whole, [](const Error*) {});
  f.shard.stats([&](ShardStats s) { stats = s; });
  f.drain();
  CHECK(answers == 0);
  CHECK(stats.polls_waiting == 0);
}

TEST_CASE("the shard's stats count applies, poll waits and failed requests by code") {
  ShardFixture f;
  VariableId id = f.add("w", {0, 0});
  f.shard.poll(WorkerId(0), id, Step(1), {0, 2}, PollTicket(1), [](auto...) {});
  std::vector<float> g{1, 1};
  f.shard.push(WorkerId(0), id, Step(1), {0, 2}, DType::float32, std::as_bytes(std::span(g)),
               PushedGradient::whole, [](const Error*) {});
  f.shard.push(WorkerId(0), id, Step(3), {0, 2}, DType::float32, std::as_bytes(std::span(g)),
               PushedGradient::whole, [](const Error*) {});
  f.shard.report_error(Error(ErrorCode::bad_token, "wrong token"));
  ShardStats stats;
  std::vector<VariableStatus> variables;
  f.shard.stats([&](ShardStats s) { stats = std::move(s); });
  f.shard.variables(10, [&](std::vector<VariableStatus> v) { variables = std::move(v); });
  f.drain();
  CHECK(stats.apply_seconds.count() == 1);
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

  explicit SyncTimeoutFixture(SyncTimeoutAction action)
      : shard(io.actors,
              ShardSettings{ShardId(0), Mode::sync, 3, 4, {}, true, SyncConfig{10, action}}) {
    VariableSpec spec;
    spec.name = "w";
    spec.shape = {2};
    spec.optimizer.lr = 1.0;
    std::vector<float> init{0, 0};
    shard.register_variable(spec, {0, 2}, std::as_bytes(std::span(init)),
                            [&](const Error*, VariableId v, bool) { id = v; });
    drain();
  }
  void drain() { io.drain(); }
  void push(uint32_t worker, Step step, std::vector<float> g) {
    shard.push(WorkerId(worker), id, step, {0, 2}, DType::float32, std::as_bytes(std::span(g)),
               PushedGradient::whole, [](const Error* e) {
                 if (e) throw *e;
               });
    drain();
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
  SyncTimeoutFixture f(SyncTimeoutAction::fail);
  f.push(0, Step(1), {1, 1});
  f.push(1, Step(1), {3, 3});
  std::optional<Error> answer;
  f.shard.poll(WorkerId(0), f.id, Step(1), {0, 2}, PollTicket(1),
               [&](const Error* e, const FreshValue*) {
                 if (e) answer = *e;
               });
  f.drain();
  auto start = std::chrono::steady_clock::now();
  f.shard.enforce_deadlines(start + std::chrono::seconds(5));  // not yet overdue
  f.drain();
  CHECK_FALSE(answer);
  f.shard.enforce_deadlines(start + std::chrono::seconds(11));
  f.drain();
  REQUIRE(answer);
  CHECK(answer->code() == ErrorCode::sync_timeout);
  CHECK(std::string(answer->what()).find("worker(s) 2") != std::string::npos);
  CHECK(f.stats().sync_timeouts == 1);
  // The step still completes when the missing worker comes back.
  f.push(2, Step(1), {5, 5});
  std::vector<float> value;
  f.shard.pull(f.id, {0, 2}, [&](const Error*, const FreshValue* v) { value = floats(v); });
  f.drain();
  CHECK(value == std::vector<float>{-3, -3});
}

TEST_CASE("a sync step past its timeout proceeds with the mean of the workers that pushed") {
  SyncTimeoutFixture f(SyncTimeoutAction::proceed);
  f.push(0, Step(1), {1, 1});
  f.push(1, Step(1), {3, 3});
  std::optional<std::vector<float>> answer;
  f.shard.poll(WorkerId(0), f.id, Step(1), {0, 2}, PollTicket(1),
               [&](const Error* e, const FreshValue* v) {
                 if (!e) answer = floats(v);
               });
  f.drain();
  f.shard.enforce_deadlines(std::chrono::steady_clock::now() + std::chrono::seconds(11));
  f.drain();
  REQUIRE(answer);
  CHECK(*answer == std::vector<float>{-2, -2});
  // The missing worker's late push is acknowledged, counted and dropped; step 2 goes on.
  f.push(2, Step(1), {5, 5});
  CHECK(f.stats().pushes_late == 1);
  for (uint32_t w = 0; w < 3; ++w) f.push(w, Step(2), {3, 3});
  std::vector<float> value;
  f.shard.pull(f.id, {0, 2}, [&](const Error*, const FreshValue* v) { value = floats(v); });
  f.drain();
  CHECK(value == std::vector<float>{-5, -5});
}
