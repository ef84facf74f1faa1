// SPDX-License-Identifier: Apache-2.0
// SyncTimeouts on its own, against recording Actions and chosen times. Whole shards timing out
// with real polls: actors/shard/variable_shard_test.cc.
#include "actors/shard/sync_timeouts.h"

#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include "actors/shard/variable_shard.h"
#include "common/error.h"

using namespace psched;

namespace {

// Writes down every action it is asked for; completes steps for real, as the shard does.
struct RecordingActions final : SyncTimeouts::Actions {
  std::vector<Variable>& variables;
  std::vector<std::string> calls;

  explicit RecordingActions(std::vector<Variable>& v) : variables(v) {}
  void count_error(const Error& error) override {
    CHECK(error.code() == ErrorCode::sync_timeout);
    calls.push_back(fmt::format("error {}", error.what()));
  }
  void fail_polls(VariableId id, Step step, const Error&) override {
    calls.push_back(fmt::format("fail v{} s{}", id.value, step));
  }
  void complete_without_missing(VariableId id, Step step) override {
    variables[id.value].complete_step_without_missing();
    calls.push_back(fmt::format("complete v{} s{}", id.value, step));
  }
};

SyncTimeouts::Clock::time_point at(int seconds) {
  return SyncTimeouts::Clock::time_point(std::chrono::seconds(seconds));
}

// One variable of two elements on a sync shard of three workers with a 10 s timeout.
struct Fixture {
  ShardSettings settings;
  std::vector<Variable> variables;
  RecordingActions actions{variables};
  SyncTimeouts timeouts{settings, actions};
  const std::vector<float> grad{1, 1};

  explicit Fixture(SyncTimeoutAction action, Mode mode = Mode::sync) {
    settings.mode = mode;
    settings.workers = 3;
    settings.sync = {.timeout_seconds = 10, .on_timeout = action};
    VariableSpec spec;
    spec.name = "w";
    spec.shape = {2};
    variables.emplace_back(spec, ElementRange{0, 2}, std::as_bytes(std::span(grad)), mode, 3);
  }
  void push(uint32_t worker, Step step, int seconds) {
    variables[0].push(WorkerId(worker), step, {0, 2}, DType::float32,
                      std::as_bytes(std::span(grad)));
    timeouts.pushed(VariableId(0), variables[0], at(seconds));
  }
  // The calls that enforcing at `seconds` leads to.
  std::vector<std::string> enforce(int seconds) {
    actions.calls.clear();
    timeouts.enforce(at(seconds), variables);
    return actions.calls;
  }
};

}  // namespace

TEST_CASE("a step is timed from its first push and fails its polls each time it is overdue") {
  Fixture f(SyncTimeoutAction::fail);
  f.push(0, Step(1), 100);
  f.push(1, Step(1), 103);
  CHECK(f.enforce(109).empty());
  std::vector<std::string> calls = f.enforce(110);
  REQUIRE(calls.size() == 2);
  CHECK(calls[0] == "error step 1 of variable 'w' on shard 0 waited 10.0 s for worker(s) 2");
  CHECK(calls[1] == "fail v0 s1");
  CHECK(f.enforce(119).empty());  // timed afresh from the first timeout
  CHECK(f.enforce(120).back() == "fail v0 s1");
  CHECK(f.timeouts.timeouts() == 2);
  f.push(2, Step(1), 121);  // the step completes: nothing left to time
  CHECK(f.enforce(1000).empty());
}

TEST_CASE("a step that proceeds completes without its missing workers and drops their pushes") {
  Fixture f(SyncTimeoutAction::proceed);
  f.push(0, Step(1), 100);
  f.push(1, Step(1), 100);
  std::vector<std::string> calls = f.enforce(111);
  REQUIRE(calls.size() == 2);
  CHECK(calls[0].find("applied without them") != std::string::npos);
  CHECK(calls[1] == "complete v0 s1");
  CHECK(f.variables[0].applied_step(kAllWorkers) == Step(1));
  CHECK(f.enforce(1000).empty());
  CHECK(f.timeouts.late_push(VariableId(0), WorkerId(2), Step(1)));
  CHECK_FALSE(f.timeouts.late_push(VariableId(0), WorkerId(0), Step(1)));  // a plain retry
  CHECK_FALSE(f.timeouts.late_push(VariableId(0), WorkerId(2), Step(2)));
  CHECK(f.timeouts.late_pushes() == 1);
}

TEST_CASE("nothing times out in async mode") {
  Fixture f(SyncTimeoutAction::fail, Mode::async);
  f.push(0, Step(1), 100);
  CHECK(f.enforce(1000).empty());
  CHECK(f.timeouts.timeouts() == 0);
}
