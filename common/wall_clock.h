// SPDX-License-Identifier: Apache-2.0
// Wall-clock time in nanoseconds since the Unix epoch, for timestamps that leave the process:
// a poll answer's appliedAtNs (net/psched.capnp), a checkpoint's time of writing. Durations
// inside a process use std::chrono::steady_clock instead.
#pragma once

#include <chrono>
#include <cstdint>

namespace psched {

inline int64_t wall_clock_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace psched
