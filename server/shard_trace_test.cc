// SPDX-License-Identifier: Apache-2.0
#include "server/shard_trace.h"

#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

using namespace psched;
using namespace std::chrono_literals;

namespace {

ShardTrace::Request request(ShardTrace::Kind kind, uint32_t worker, int begin_ms, int end_ms) {
  ShardTrace::TimePoint zero{};
  return {kind,
          WorkerId(worker),
          VariableId(4),
          Step(2),
          ElementRange{0, 8},
          kind == ShardTrace::Kind::poll ? 16u : 32u,
          kind == ShardTrace::Kind::poll ? WireFormat::bf16 : WireFormat::none,
          Priority(kind == ShardTrace::Kind::poll ? 1 : 0),
          zero + begin_ms * 1ms,
          zero + (begin_ms + end_ms) / 2 * 1ms,
          zero + end_ms * 1ms};
}

// The name of each track ("thread") of the trace, by its id.
std::map<int, std::string> track_names(const nlohmann::json& events) {
  std::map<int, std::string> names;
  for (const auto& e : events)
    if (e["name"] == "thread_name") names[e["tid"]] = e["args"]["name"];
  return names;
}

}  // namespace

TEST_CASE("a shard trace keeps its first requests and counts the dropped ones") {
  ShardTrace trace(2);
  for (int i = 0; i < 5; ++i) trace.add(request(ShardTrace::Kind::push, 0, i, i + 1));
  CHECK(trace.size() == 2);
  CHECK(trace.dropped() == 3);
  nlohmann::json events = nlohmann::json::array();
  trace.append_events(events, 7, "shard 1");
  CHECK(events[0]["name"] == "process_name");
  CHECK(events[0]["pid"] == 7);
  CHECK(events[0]["args"]["name"] == "shard 1");
  CHECK(events[0]["args"]["dropped_requests"] == 3);
}

TEST_CASE("overlapping requests of a worker go on separate tracks, each worker's apart") {
  ShardTrace trace(10);
  trace.add(request(ShardTrace::Kind::push, 0, 0, 10));
  trace.add(request(ShardTrace::Kind::push, 0, 5, 20));   // overlaps the first
  trace.add(request(ShardTrace::Kind::push, 0, 12, 30));  // fits after the first
  trace.add(request(ShardTrace::Kind::poll, 0, 0, 10));
  trace.add(request(ShardTrace::Kind::push, 1, 0, 10));
  nlohmann::json events = nlohmann::json::array();
  trace.append_events(events, 0, "shard 0");

  std::map<int, std::string> names = track_names(events);
  CHECK(names == std::map<int, std::string>{{0, "worker 0 pushes"},
                                            {1, "worker 0 pushes"},
                                            {2, "worker 0 answers"},
                                            {3, "worker 1 pushes"}});
  std::vector<std::pair<int, double>> pushes;  // (track, start in µs) of worker 0's pushes
  for (const auto& e : events)
    if (e["ph"] == "X" && e["name"].get<std::string>().starts_with("push") && e["tid"] < 2)
      pushes.push_back({e["tid"], e["ts"]});
  CHECK(pushes == std::vector<std::pair<int, double>>{{0, 0.0}, {1, 5000.0}, {0, 12000.0}});
}

TEST_CASE("a request's two phases split its slice at its middle time") {
  ShardTrace trace(1);
  trace.add(request(ShardTrace::Kind::poll, 0, 10, 30));
  nlohmann::json events = nlohmann::json::array();
  trace.append_events(events, 0, "shard 0", ShardTrace::TimePoint{} + 10ms);
  std::vector<std::tuple<std::string, double, double>> slices;
  for (const auto& e : events)
    if (e["ph"] == "X") slices.push_back({e["name"], e["ts"], e["dur"]});
  CHECK(slices ==
        std::vector<std::tuple<std::string, double, double>>{{"poll v4 s2 [0, 8)", 0.0, 20000.0},
                                                             {"wait", 0.0, 10000.0},
                                                             {"answer", 10000.0, 10000.0}});
  CHECK_FALSE(events.back().contains("args"));
  CHECK(events[events.size() - 3]["args"]["priority"] == 1);
  // The bytes as they travelled, and in what form.
  CHECK(events[events.size() - 3]["args"]["bytes"] == 16);
  CHECK(events[events.size() - 3]["args"]["format"] == "bf16");
}
