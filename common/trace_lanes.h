// SPDX-License-Identifier: Apache-2.0
// TraceLanes: places overlapping slices of a Chrome trace (Perfetto, chrome://tracing) on
// tracks, each slice on the first track free at its start, so that none overlaps another on
// its track. Feed slices in order of their start.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <vector>

namespace psched {

class TraceLanes {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  // The index of the first lane free at `start`, which is now taken until `end`; a new lane
  // when none is free.
  size_t take(TimePoint start, TimePoint end) {
    auto free =
        std::find_if(ends_.begin(), ends_.end(), [start](TimePoint e) { return e <= start; });
    if (free == ends_.end()) free = ends_.insert(ends_.end(), end);
    *free = end;
    return static_cast<size_t>(free - ends_.begin());
  }

 private:
  std::vector<TimePoint> ends_;  // when each lane's last slice ends
};

}  // namespace psched
