// SPDX-License-Identifier: Apache-2.0
#include "client/chrome_trace.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/chrome_events.h"

namespace psched {
namespace {

using TimePoint = std::chrono::steady_clock::time_point;

double micros(TimePoint t, TimePoint epoch) {
  return std::chrono::duration<double, std::micro>(t - epoch).count();
}

bool is_set(TimePoint t) {
  return t != TimePoint{};
}

}  // namespace

nlohmann::json chrome_trace(const std::vector<TracedWorker>& workers) {
  nlohmann::json events = nlohmann::json::array();
  for (size_t pid = 0; pid < workers.size(); ++pid) {
    events.push_back({{"ph", "M"},
                      {"name", "process_name"},
                      {"pid", pid},
                      {"args", {{"name", workers[pid].name}}}});
    TimePoint epoch = workers[pid].epoch;
    std::vector<TaskRecord> records = workers[pid].records;
    std::sort(records.begin(), records.end(),
              [](const TaskRecord& a, const TaskRecord& b) { return a.queued < b.queued; });
    TraceLanes lanes;
    for (const TaskRecord& r : records) {
      size_t tid = lanes.take(r.queued, r.finished);
      auto slice = [&](const std::string& name, TimePoint from, TimePoint to, nlohmann::json args) {
        events.push_back(trace_slice(name, pid, tid, from, to, epoch, std::move(args)));
      };
      slice(fmt::format("p{} s{} [{}, {})", r.priority.value, r.shard.value, r.range.begin,
                        r.range.end),
            r.queued, r.finished,
            {{"task", r.task_id},
             {"priority", r.priority.value},
             {"bytes", r.bytes},
             {"format", to_string(r.format)},
             {"value_format", to_string(r.value_format)},
             {"start_index", r.start_index}});
      slice("queued", r.queued, r.started, nullptr);
      if (is_set(r.applied)) {
        TimePoint applied = std::clamp(r.applied, r.started, r.finished);
        slice("to applied", r.started, applied, nullptr);
        slice("value back", applied, r.finished, nullptr);
      } else {
        slice("in flight", r.started, r.finished, nullptr);
      }
      if (is_set(r.receipt))
        events.push_back({{"ph", "i"},
                          {"s", "t"},
                          {"name", "receipt"},
                          {"pid", pid},
                          {"tid", tid},
                          {"ts", micros(r.receipt, epoch)}});
    }
  }
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
}

}  // namespace psched
