// SPDX-License-Identifier: Apache-2.0
// What the worker actors' tests share (worker_actors_test): a transport that keeps each started
// task, so that a test finishes tasks in the order it chooses.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include "actors/worker/partition_task.h"

namespace psched::testing {

// Keeps each started task and its reports, so the test finishes tasks in the order it chooses,
// or finishes them inside start() with `finish_inside_start`.
class HoldingTransport : public PartitionTransport {
 public:
  void start(PartitionTask task, TaskReports& reports) override {
    started.push_back(task);
    if (finish_inside_start)
      reports.finished(task.id, Landed{});
    else
      holding.emplace_back(task.id, &reports);
  }
  // Reports the push of task `id` received (its credit freed in sync mode).
  void receive(uint64_t id) { reports_of(id)->received(id); }
  void finish(uint64_t id, TaskOutcome outcome = Landed{}) {
    TaskReports* reports = reports_of(id);
    std::erase_if(holding, [id](const auto& held) { return held.first == id; });
    reports->finished(id, std::move(outcome));
  }
  std::vector<uint64_t> started_ids() const {
    std::vector<uint64_t> ids;
    for (const auto& t : started) ids.push_back(t.id);
    return ids;
  }

  std::vector<PartitionTask> started;
  std::vector<std::pair<uint64_t, TaskReports*>> holding;  // task id -> where it reports
  bool finish_inside_start = false;

 private:
  TaskReports* reports_of(uint64_t id) {
    auto it = std::find_if(holding.begin(), holding.end(),
                           [id](const auto& held) { return held.first == id; });
    REQUIRE(it != holding.end());
    return it->second;
  }
};

}  // namespace psched::testing
