// SPDX-License-Identifier: Apache-2.0
#include "client/chrome_trace.h"

#include <doctest/doctest.h>

using namespace psched;
using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;

TaskRecord record(uint64_t id, Clock::time_point t0, int queued, int started, int applied,
                  int finished) {
  TaskRecord r;
  r.task_id = id;
  r.priority = static_cast<Priority>(id);
  r.bytes = 64;
  r.range = {0, 16};
  r.queued = t0 + queued * 1ms;
  r.started = t0 + started * 1ms;
  if (applied >= 0) r.applied = t0 + applied * 1ms;
  r.receipt = t0 + started * 1ms + 500us;
  r.finished = t0 + finished * 1ms;
  return r;
}

std::vector<nlohmann::json> named(const nlohmann::json& trace, const std::string& name) {
  std::vector<nlohmann::json> out;
  for (const auto& e : trace["traceEvents"])
    if (e["name"] == name) out.push_back(e);
  return out;
}

}  // namespace

TEST_CASE("overlapping partitions go on separate lanes and a free lane is reused") {
  auto t0 = Clock::now();
  auto trace = chrome_trace(
      {{"w0",
        {record(1, t0, 0, 1, 3, 4), record(2, t0, 2, 3, 5, 6), record(3, t0, 4, 5, 6, 7)},
        t0}});
  std::vector<int> lanes;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "X" && e["name"].get<std::string>().starts_with("p"))
      lanes.push_back(e["tid"].get<int>());
  CHECK(lanes == std::vector<int>{0, 1, 0});  // task 3 starts when task 1's lane is free
}

TEST_CASE("a partition's phases tile its slice in order, in microseconds since the epoch") {
  auto t0 = Clock::now();
  auto trace = chrome_trace({{"w0", {record(1, t0, 1, 2, 4, 7)}, t0}});
  auto queued = named(trace, "queued"), to_applied = named(trace, "to applied"),
       back = named(trace, "value back"), receipt = named(trace, "receipt");
  REQUIRE(queued.size() == 1);
  REQUIRE(to_applied.size() == 1);
  REQUIRE(back.size() == 1);
  REQUIRE(receipt.size() == 1);
  auto partition = named(trace, "p1 s0 [0, 16)");
  REQUIRE(partition.size() == 1);
  CHECK(partition[0]["args"]["priority"] == 1);
  CHECK(queued[0]["ts"].get<double>() == doctest::Approx(1000));
  CHECK(queued[0]["dur"].get<double>() == doctest::Approx(1000));
  CHECK(to_applied[0]["ts"].get<double>() == doctest::Approx(2000));
  CHECK(to_applied[0]["dur"].get<double>() == doctest::Approx(2000));
  CHECK(back[0]["ts"].get<double>() == doctest::Approx(4000));
  CHECK(back[0]["dur"].get<double>() == doctest::Approx(3000));
  CHECK(receipt[0]["ts"].get<double>() == doctest::Approx(2500));
  auto names = named(trace, "process_name");
  REQUIRE(names.size() == 1);
  CHECK(names[0]["args"]["name"] == "w0");
}

TEST_CASE("an unknown or skewed shard time is shown as in flight or clamped into the slice") {
  auto t0 = Clock::now();
  auto trace = chrome_trace({{"w0", {record(1, t0, 0, 1, -1, 3), record(2, t0, 4, 5, 9, 6)}, t0}});
  CHECK(named(trace, "in flight").size() == 1);
  auto back = named(trace, "value back");
  REQUIRE(back.size() == 1);
  CHECK(back[0]["ts"].get<double>() == doctest::Approx(6000));  // clamped to the finish
  CHECK(back[0]["dur"].get<double>() == doctest::Approx(0));
}

TEST_CASE("a partition's slice says the bytes it travelled as and the formats both ways") {
  auto t0 = Clock::now();
  TaskRecord topk = record(1, t0, 0, 1, 2, 3);
  topk.format = WireFormat::topk;
  topk.value_format = WireFormat::bf16;
  topk.bytes = 24;
  auto partition = named(chrome_trace({{"w0", {topk}, t0}}), "p1 s0 [0, 16)");
  REQUIRE(partition.size() == 1);
  CHECK(partition[0]["args"]["bytes"] == 24);
  CHECK(partition[0]["args"]["format"] == "topk");
  CHECK(partition[0]["args"]["value_format"] == "bf16");
}
