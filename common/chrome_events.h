// SPDX-License-Identifier: Apache-2.0
// Building blocks of Chrome trace-event JSON (Perfetto, chrome://tracing), shared by the
// workers' trace (client/chrome_trace.h) and the shards' (server/shard_trace.h).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace psched {

using TraceTime = std::chrono::steady_clock::time_point;

// Places overlapping slices on tracks, each slice on the first track free at its start, so
// that none overlaps another on its track. Feed slices in order of their start.
class TraceLanes {
 public:
  // The index of the first lane free at `start`, which is now taken until `end`; a new lane
  // when none is free.
  size_t take(TraceTime start, TraceTime end) {
    auto free =
        std::find_if(ends_.begin(), ends_.end(), [start](TraceTime e) { return e <= start; });
    if (free == ends_.end()) free = ends_.insert(ends_.end(), end);
    *free = end;
    return static_cast<size_t>(free - ends_.begin());
  }

 private:
  std::vector<TraceTime> ends_;  // when each lane's last slice ends
};

// A complete slice ("X") named `name` on track `tid` of process `pid`, from `from` to `to`
// in microseconds since `epoch`, with `args` unless they are null.
inline nlohmann::json trace_slice(const std::string& name, int64_t pid, int64_t tid, TraceTime from,
                                  TraceTime to, TraceTime epoch, nlohmann::json args = nullptr) {
  auto micros = [epoch](TraceTime t) {
    return std::chrono::duration<double, std::micro>(t - epoch).count();
  };
  nlohmann::json slice{{"ph", "X"},          {"name", name},
                       {"pid", pid},         {"tid", tid},
                       {"ts", micros(from)}, {"dur", std::max(0.0, micros(to) - micros(from))}};
  if (!args.is_null()) slice["args"] = std::move(args);
  return slice;
}

}  // namespace psched
